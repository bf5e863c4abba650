"""Timing and the memory-bandwidth roofline, measured in the same run as every row.

Three clocks per implementation: ``eager_ms`` is what eager code sees (``do_bench``: host overhead
included whenever the Python path is slower than the kernel), ``graph_ms`` is GPU time alone
(``do_bench_cudagraph``: the call captured once in a CUDA graph and replayed) and ``host_us`` is the
host time of one call (issued while the GPU is busy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], warmup: int = 10, rep: int = 50) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def graph_ms(fn: Callable[[], object], rep: int = 50) -> float:
    import triton.testing

    fn()  # compile and autotune outside the capture
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def host_us(fn: Callable[[], object], calls: int = 50, rounds: int = 3) -> float:
    """Host time per call: the GPU is kept busy by a sleep kernel while the calls are issued, so
    the wall time of the loop is Python and launch cost alone (a call that synchronizes shows it).
    The best of ``rounds`` rounds, each behind its own sleep: one round of 50 calls varied by about
    30% between runs on the same host (BENCHMARKS.md, eighth set)."""
    import time

    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time ahead of the calls
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
        torch.cuda.synchronize()
    return best / calls * 1e6


def copy_bandwidth_gbs(device: str = "cuda", gib: float = 1.0) -> float:
    """Device-to-device copy, bytes read plus bytes written: the roofline every row is compared to."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    # do_bench, not a graph replay: a 1 GiB uint8 copy replayed from a CUDA graph ran at 64% of the
    # eager copy's bandwidth on the H200 (2716 vs 4251 GB/s), below what the norm kernels reach.
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def launch_floor_us(device: str = "cuda") -> float:
    """Host time of a one-kernel torch op (an in-place add on one element): what any op's host
    column stands on, since launch costs differ between machines (a virtualized GPU's are higher)."""
    one = torch.zeros(1, device=device)
    return host_us(lambda: one.add_(1.0), calls=200)
