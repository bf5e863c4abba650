"""`polykernels` console script (also `python -m polykernels`)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polykernels")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="platform, build manifest and the path each op takes here")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    commands.add_parser("selftest", help="run the pre-publish suites on this machine (python -m polykernels.suites)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "info":
        from polykernels.info import main as info_main

        print(info_main(as_json=args.json))
        return 0
    from polykernels.suites.__main__ import main as suites_main

    return suites_main(rest)


if __name__ == "__main__":
    sys.exit(main())
