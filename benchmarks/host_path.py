"""python -m benchmarks.host_path [--device cuda]: host time per call of the eager launch paths.

On any CPU (the default): the kernel launches are replaced by no-ops and the GPU-only guards by
their GPU answers, so what is timed is this package's own Python per call (checks, plan,
allocations on the CPU, spec keys), not Triton's launcher or the GPU allocator: the part of the
bench's host column that a build host can measure. Best of 7 rounds of 3000 calls.

With ``--device cuda``: the bench's host column split into its parts at the bench shapes, each
timed as the bench does (calls issued while the GPU is busy): the public op (its launch program
replayed from C++ after the first call), the public op through the checked Python path (its launches
through the extension's launch, then through Triton's launcher), the launch function alone (no
argument checks), the launch function with the kernel launches stubbed (Python and GPU
allocations), and a one-kernel torch op (the launch floor); the FLUX norms at B1 L4608 D3072, public
op (with either launch) and launch stubbed; and one norm call taken apart (its class key, the
output's allocation, the launcher's call, the extension's launch and Triton's C launch alone, each
timed by itself).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace

import torch


class _NoLaunch:
    def __call__(self, grid: tuple[int, ...], args: tuple, meta: dict, *, spec_key: object = None,
                 tensors: object = None, device: int | None = None) -> None:
        pass


@contextlib.contextmanager
def _launches_stubbed(family: ModuleType, *kernels: str) -> Iterator[None]:
    """A family's kernel launches (its ``_launchers()`` namespace) are no-ops inside the block."""
    original, none = family._launchers, _NoLaunch()
    family._launchers = lambda: SimpleNamespace(**dict.fromkeys(kernels, none))
    try:
        yield
    finally:
        family._launchers = original


def _gdn_launches_stubbed() -> contextlib.AbstractContextManager[None]:
    from polykernels.gated_delta_rule import launch

    return _launches_stubbed(launch, "prepare", "recurrence", "combine")


def _norm_launches_stubbed() -> contextlib.AbstractContextManager[None]:
    from polykernels.norm import ops

    return _launches_stubbed(ops, "norm", "qk")


def per_call_us(fn: Callable[[], object], calls: int = 3000, rounds: int = 7) -> float:
    for _ in range(calls // 10):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return round(best, 1)


def gdn_rows() -> dict[str, float]:
    from polykernels.gated_delta_rule import launch

    rows = {}
    with _gdn_launches_stubbed():
        for heads, value_heads in ((32, 32), (2, 8)):
            q = torch.randn(1, 64, heads, 128, dtype=torch.bfloat16)
            v = torch.randn(1, 64, value_heads, 128, dtype=torch.bfloat16)
            g, beta = -torch.rand(1, 64, value_heads), torch.rand(1, 64, value_heads)
            rows[f"gdn B1 T64 {heads}/{value_heads}"] = per_call_us(functools.partial(
                launch.launch_chunk_gated_delta_rule, q, q, v, g, beta, 0.1, None, True, None, True))
        q = torch.randn(1, 128, 2, 128, dtype=torch.bfloat16)
        v = torch.randn(1, 128, 8, 128, dtype=torch.bfloat16)
        g, beta = -torch.rand(1, 128, 8), torch.rand(1, 128, 8)
        cu, h0 = torch.tensor([0, 64, 128], dtype=torch.int32), torch.zeros(2, 8, 128, 128)
        rows["gdn packed 2x64 2/8, initial state, 2 segments"] = per_call_us(
            functools.partial(launch.launch_chunk_gated_delta_rule, q, q, v, g, beta, 0.1, h0, True, cu, True, 2))
    return rows


def norm_rows() -> dict[str, float]:
    from polykernels.norm import ops

    ops._eager_gpu = lambda x: True  # for good: a CPU process times only the GPU paths' Python
    ops._gpu_path = lambda x, exact_epilogue: "triton"
    x = torch.randn(1, 64, 3072, dtype=torch.bfloat16)
    shift, scale = torch.randn(1, 6 * 3072, dtype=torch.bfloat16).chunk(6, dim=1)[:2]
    weight = torch.randn(3072, dtype=torch.bfloat16)
    heads = torch.randn(1, 64, 24, 128, dtype=torch.bfloat16)
    head_weight = torch.randn(128, dtype=torch.bfloat16)
    with _norm_launches_stubbed():
        return {
            "layernorm_modulate B1 L64 D3072": per_call_us(lambda: ops.layernorm_modulate(x, shift, scale)),
            "rmsnorm_scale_shift B1 L64 D3072": per_call_us(lambda: ops.rmsnorm_scale_shift(x, weight, shift, scale)),
            "qk_rmsnorm B1 L64 24x128": per_call_us(lambda: ops.qk_rmsnorm(heads, heads, head_weight, head_weight)),
            "head_rmsnorm B1 L64 24x128": per_call_us(lambda: ops.head_rmsnorm(heads, head_weight)),
        }


def _gdn_gpu_row(heads: int, value_heads: int, lengths: list[int] | None) -> dict[str, float]:
    from benchmarks.registry import gdn_inputs
    from benchmarks.timing import host_us
    from polykernels.gated_delta_rule import chunk_gated_delta_rule, launch

    tokens = 32768 if lengths is None else sum(lengths)
    q, k, v, g, beta = gdn_inputs(1, tokens, heads, value_heads, "cuda")
    cu = None if lengths is None else torch.tensor([0, lengths[0], tokens], dtype=torch.int32, device="cuda")
    public = functools.partial(chunk_gated_delta_rule, q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
    launch_only = functools.partial(launch.launch_chunk_gated_delta_rule, q, k, v, g, beta, 128**-0.5, None, True,
                                    cu, False)
    row = {"public op": host_us(public)}
    with _programs_off():
        row["public op, launch programs off"] = host_us(public)
        with _native_launch_off():
            row["public op, launch programs off, Triton's launcher"] = host_us(public)
    row["launch function"] = host_us(launch_only)
    with _gdn_launches_stubbed():
        row["launch function, launches stubbed"] = host_us(launch_only)
    return {key: round(value, 1) for key, value in row.items()}


@contextlib.contextmanager
def _programs_off() -> Iterator[None]:
    """Every call takes the checked Python path (no launch program is replayed) inside the block."""
    from polykernels import _programs

    original = _programs.enabled
    _programs.enabled = lambda: False
    try:
        yield
    finally:
        _programs.enabled = original


@contextlib.contextmanager
def _native_launch_off() -> Iterator[None]:
    """Every direct launch goes through Triton's C launcher inside the block (the launchers, which
    keep one direct launch per class of call, are made anew on both sides of it)."""
    from polykernels import _launch
    from polykernels.gated_delta_rule import launch
    from polykernels.norm import ops

    def forget() -> None:
        ops.forget_plans()
        launch.forget_launchers()

    original = _launch.native_launch
    _launch.native_launch = lambda: None
    forget()
    try:
        yield
    finally:
        _launch.native_launch = original
        forget()


def _norm_gpu_rows() -> dict[str, dict[str, float]]:
    from benchmarks.timing import host_us
    from polykernels.norm import ops

    x = torch.randn(1, 4608, 3072, dtype=torch.bfloat16, device="cuda")
    shift, scale = torch.randn(1, 6 * 3072, dtype=torch.bfloat16, device="cuda").chunk(6, dim=1)[:2]
    weight = torch.randn(3072, dtype=torch.bfloat16, device="cuda")
    heads = torch.randn(1, 4608, 24, 128, dtype=torch.bfloat16, device="cuda")
    head_weight = torch.randn(128, dtype=torch.bfloat16, device="cuda")
    calls = {
        "layernorm_modulate B1 L4608 D3072": lambda: ops.layernorm_modulate(x, shift, scale),
        "rmsnorm_scale_shift B1 L4608 D3072": lambda: ops.rmsnorm_scale_shift(x, weight, shift, scale),
        "qk_rmsnorm B1 L4608 24x128": lambda: ops.qk_rmsnorm(heads, heads, head_weight, head_weight),
        "head_rmsnorm B1 L4608 24x128": lambda: ops.head_rmsnorm(heads, head_weight),
    }
    rows = {name: {"public op": host_us(call)} for name, call in calls.items()}
    with _native_launch_off():
        for name, call in calls.items():
            rows[name]["public op, Triton's launcher"] = host_us(call)
    with _norm_launches_stubbed():
        for name, call in calls.items():
            rows[name]["launch stubbed"] = host_us(call)
    return {name: {key: round(value, 1) for key, value in row.items()} for name, row in rows.items()}


def _norm_gpu_pieces() -> dict[str, float]:
    """One norm call taken apart: each piece of layernorm_modulate's eager path timed alone."""
    from benchmarks.timing import host_us
    from polykernels import _launch
    from polykernels.norm import ops

    x = torch.randn(1, 4608, 3072, dtype=torch.bfloat16, device="cuda")
    shift, scale = torch.randn(1, 6 * 3072, dtype=torch.bfloat16, device="cuda").chunk(6, dim=1)[:2]
    y = ops.layernorm_modulate(x, shift, scale)
    plan = ops._eager_plans[ops._modulated_class(x, None, shift, scale, 1e-6)]
    launcher = ops._launchers().norm
    args = (x, y, x, shift, scale, y, y, *plan.ints, 1e-6)
    compiled = launcher._kernels[_launch._spec_entry(torch.cuda.current_device(), plan.spec)]
    native = _launch.native_direct_launch(compiled, len(args))
    direct = _launch.triton_direct_launch(compiled, _launch.constexpr_values(launcher.kernel, len(args), plan.meta))
    addresses = tuple(arg.data_ptr() if isinstance(arg, torch.Tensor) else arg for arg in args)
    grid, stream = (*plan.grid, 1, 1), torch.cuda.current_stream().cuda_stream
    pieces = {
        "public op": lambda: ops.layernorm_modulate(x, shift, scale),
        "the call's class key": lambda: ops._modulated_class(x, None, shift, scale, 1e-6),
        "output allocation (empty_like)": lambda: torch.empty_like(x),
        "Launcher call, plan ready": lambda: launcher(plan.grid, args, plan.meta, spec_key=plan.spec),
        "Triton's C launch, addresses ready": lambda: direct(grid[0], grid[1], grid[2], stream, addresses),
    }
    if native is not None:
        pieces["the extension's launch, addresses ready"] = lambda: native(grid[0], grid[1], grid[2], stream,
                                                                           addresses)
        pieces["the extension's launch, tensors"] = lambda: native(grid[0], grid[1], grid[2], stream, args)
    return {name: round(host_us(call), 1) for name, call in pieces.items()}


def _gdn_gpu_pieces() -> dict[str, float]:
    """One replayed gated-delta-rule call taken apart (B1 T32768 32/32: two launches, three allocations)."""
    from benchmarks.registry import gdn_inputs
    from benchmarks.timing import host_us
    from polykernels import _programs
    from polykernels.gated_delta_rule import chunk, chunk_gated_delta_rule

    q, k, v, g, beta = gdn_inputs(1, 32768, 32, 32, "cuda")
    tensors, flags = chunk._replay_class(q, k, v, g, beta, None, True, None, False, None)
    chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)  # records the program
    # Two programs of our own: one that allocates o and launches nothing, one that does neither.
    _programs._ops()[0](tensors, [-1], [v], 1, [0])
    _programs._ops()[0](tensors, [-2], [], 0, [0])
    pieces = {
        "public op": lambda: chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True),
        "the call's class (_replay_class)": lambda: chunk._replay_class(q, k, v, g, beta, None, True, None, False,
                                                                        None),
        "program_run of the call's program": lambda: _programs.run(tensors, flags, [0.1]),
        "program_run, no program for the class": lambda: _programs.run(tensors, [-3], [0.1]),
        "program_run, nothing to allocate or launch": lambda: _programs.run(tensors, [-2], [0.1]),
        "program_run, one allocation and no launch": lambda: _programs.run(tensors, [-1], [0.1]),
    }
    return {name: round(host_us(call), 1) for name, call in pieces.items()}


def gpu_rows() -> dict[str, dict[str, float]]:
    from benchmarks.timing import launch_floor_us

    return {"gdn B1 T32768 32/32": _gdn_gpu_row(32, 32, None), "gdn 1x32768 2/8": _gdn_gpu_row(2, 8, None),
            "gdn varlen 6144+2048 2/8": _gdn_gpu_row(2, 8, [6144, 2048]),
            "gdn B1 T32768 32/32, piece by piece": _gdn_gpu_pieces(), **_norm_gpu_rows(),
            "layernorm_modulate B1 L4608 D3072, piece by piece": _norm_gpu_pieces(),
            "one-kernel torch op (launch floor)": {"public op": round(launch_floor_us(), 1)}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_path")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    if parser.parse_args().device == "cuda":
        print(json.dumps({"host_us_per_call": gpu_rows()}, indent=1))
    else:
        print(json.dumps({"python_us_per_call": {**gdn_rows(), **norm_rows()}}, indent=1))
