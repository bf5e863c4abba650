"""Eager calls whose tensors live on a GPU that is not the current one: a model split over GPUs in one
process (as ``device_map`` does) with no ``torch.cuda.set_device``. Each op must compile for, launch on
and replay on the tensors' GPU, with the bits it gives there when that GPU is current.

Needs two GPUs (``two_gpus``); the first call of each class (its compile and, for the gated delta rule,
its launch program's recording) is made with the other GPU current."""

from __future__ import annotations

import pytest
import torch

from polykernels import _programs
from polykernels.gated_delta_rule import chunk_gated_delta_rule
from polykernels.norm import layernorm_modulate, qk_rmsnorm, rmsnorm_scale_shift

pytestmark = [pytest.mark.gpu, pytest.mark.two_gpus]


def _on_the_other_gpu(call: object) -> tuple:
    """The call three times with GPU 0 current (a compile, then the kept launch), then with GPU 1 current."""
    torch.cuda.set_device(0)
    results = [call() for _ in range(3)]
    with torch.cuda.device(1):
        expected = call()
    torch.cuda.synchronize(1)
    return results, expected


def _same(got: object, want: object) -> None:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want, strict=True):
        if b is None:
            assert a is None
            continue
        assert a.device == torch.device("cuda", 1)
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_gpu_norms_run_on_the_tensors_gpu(gpu_device: str) -> None:
    gen = torch.Generator(device="cuda:1").manual_seed(3)
    x = torch.randn(2, 333, 768, device="cuda:1", dtype=torch.bfloat16, generator=gen)
    shift, scale, weight = torch.randn(3, 2, 768, device="cuda:1", dtype=torch.bfloat16, generator=gen)
    heads = torch.randn(1, 77, 6, 128, device="cuda:1", dtype=torch.bfloat16, generator=gen)
    head_weight = torch.randn(128, device="cuda:1", dtype=torch.bfloat16, generator=gen)
    calls = [lambda: layernorm_modulate(x, shift, scale), lambda: rmsnorm_scale_shift(x, weight[0], shift, scale),
             lambda: qk_rmsnorm(heads, heads * 0.5, head_weight, head_weight)]
    for call in calls:
        results, expected = _on_the_other_gpu(call)
        for got in results:
            _same(got, expected)


def test_gpu_the_gated_delta_rule_runs_and_replays_on_the_tensors_gpu(gpu_device: str) -> None:
    _programs.clear()
    gen = torch.Generator(device="cuda:1").manual_seed(5)
    q = torch.randn(1, 700, 2, 128, device="cuda:1", dtype=torch.bfloat16, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(1, 700, 2, 128, device="cuda:1", generator=gen), dim=-1)
    v = torch.randn(1, 700, 4, 128, device="cuda:1", dtype=torch.bfloat16, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 700, 4, device="cuda:1", generator=gen))
    beta = torch.rand(1, 700, 4, device="cuda:1", generator=gen)
    results, expected = _on_the_other_gpu(
        lambda: chunk_gated_delta_rule(q, k.bfloat16(), v, g, beta, output_final_state=True))
    for got in results:
        _same(got, expected)
