"""`polykernels` console script (also `python -m polykernels`)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polykernels")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="platform, build manifest and the path each op takes here")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument("--gdn", metavar="N,T,H,HV[,K,V]",
                      help="what chunk_gated_delta_rule runs at this shape instead: its segment plan, why, and its "
                           "launches in order")
    info.add_argument("--packed", action="store_true", help="--gdn: N sequences packed into T tokens (cu_seqlens)")
    info.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="--gdn: the inputs' dtype")
    info.add_argument("--target", metavar="cuda:NN|hip:gfxNNN",
                      help="--gdn: plan for this GPU instead of this machine's (with --sms)")
    info.add_argument("--sms", type=int, help="--gdn with --target: its SM (CU) count")
    info.add_argument("--dram-gbps", type=float,
                      help="--gdn with --target: its peak DRAM bandwidth in GB/s (beside the output pass the prepare "
                           "pass's inverse depends on it; not known without it)")
    commands.add_parser("selftest", help="run the pre-publish suites on this machine (python -m polykernels.suites)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "info" and args.gdn:
        return _gdn_plan(info, args)
    if args.command == "info":
        from polykernels.info import main as info_main

        print(info_main(as_json=args.json))
        return 0
    from polykernels.suites.__main__ import main as suites_main

    return suites_main(rest)


def _gdn_plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import json
    import re

    from polykernels import platform
    from polykernels.gated_delta_rule import plan_report

    if args.target is not None and not re.fullmatch(r"cuda:\d+|hip:gfx[0-9a-f]+", args.target):
        parser.error(f"--target expects cuda:NN or hip:gfxNNN (a Triton target, e.g. cuda:90), got {args.target!r}")
    if (args.target is None) != (args.sms is None):
        parser.error("--target and --sms go together: the GPU to plan for and its SM count")
    if args.sms is not None and args.sms < 1:
        parser.error(f"--sms must be a positive SM count, got {args.sms}")
    if args.dram_gbps is not None and (args.target is None or not args.dram_gbps > 0):
        parser.error(f"--dram-gbps goes with --target and must be a positive bandwidth in GB/s, got {args.dram_gbps}")
    try:
        shape = plan_report.GdnShape.parse(args.gdn, packed=args.packed)
        seen = platform.for_triton_target(args.target) if args.target else platform.current()
        with platform.use(seen):
            row = plan_report.report(shape, plan_report.DTYPES[args.dtype], sms=args.sms, dram_gbps=args.dram_gbps)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(row, indent=2) if args.json else plan_report.render(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
