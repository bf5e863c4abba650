"""(I + a)^-1 by block doubling (kernels._unit_lower_inverse), alone, against a triangular solve in fp64."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from benchmarks.inverse_forms import relative_error, strictly_lower

from polykernels.gated_delta_rule.kernels import _unit_lower_inverse


@triton.jit
def _inverse_kernel(A, OUT, N: tl.constexpr, LEVELS: tl.constexpr, PRECISION: tl.constexpr):
    r = tl.arange(0, N)
    tile = r[:, None] * N + r[None, :]
    tl.store(OUT + tile, _unit_lower_inverse(-tl.load(A + tile), N, LEVELS, PRECISION))


def _error(kind: str, size: int, device: str, precision: str) -> float:
    """The largest entry of the kernel's inverse minus the fp64 solve's, over the solve's largest entry."""
    a = strictly_lower(kind, size)
    got = torch.empty(size, size, device=device)
    _inverse_kernel[(1,)](a.float().to(device).contiguous(), got, N=size, LEVELS=size.bit_length() - 1,
                          PRECISION=precision)
    return relative_error(got, a)


@pytest.mark.cpu_only
@pytest.mark.parametrize("size", [32, 64])
@pytest.mark.parametrize("kind", ["ones", "aligned", "random"])
def test_block_doubling_inverse_matches_a_solve(kind: str, size: int) -> None:
    # The doubling carries z = -rest with entries inside the blocks it has joined, never zeroed: were one
    # read by a later level's band, the inverse would be off by about its size (10-500x), not by fp32 rounding.
    error = _error(kind, size, "cpu", "ieee")
    assert error < 1e-5, f"{kind} {size}: error {error:.2e} of the inverse's largest entry"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ones", "aligned", "random"])
def test_gpu_block_doubling_inverse_with_bf16_products(gpu_device: str, kind: str) -> None:
    # The compiled form with the prepare pass's bf16 operands (fp32 accumulation): rounding only, where
    # the squaring series it replaced gave NaN for aligned keys. A torch emulation of these roundings on
    # these matrices gives 0, 5.4e-3 and 5.2e-3 of the largest entry (python -m benchmarks.inverse_forms).
    error = _error(kind, 64, gpu_device, "bf16")
    assert error < 2e-2, f"{kind}: error {error:.2e} of the inverse's largest entry"
