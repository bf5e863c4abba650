"""(I + a)^-1 by block doubling (kernels._unit_lower_inverse), alone, against a triangular solve in fp64."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from polykernels.gated_delta_rule.kernels import _unit_lower_inverse


@triton.jit
def _inverse_kernel(A, OUT, N: tl.constexpr, LEVELS: tl.constexpr):
    r = tl.arange(0, N)
    tile = r[:, None] * N + r[None, :]
    tl.store(OUT + tile, _unit_lower_inverse(-tl.load(A + tile), N, LEVELS, "ieee"))


def _strictly_lower(kind: str, size: int) -> torch.Tensor:
    """"ones": every entry below the diagonal 1 (the inverse is I minus the subdiagonal); "aligned": a chunk's
    beta k k^T Gamma with keys about one direction and slowly decaying gates (entries near 1, powers of a up
    to 1e17 at 64 rows); "random": entries of 0.3 sigma."""
    gen = torch.Generator().manual_seed(size)
    if kind == "ones":
        a = torch.ones(size, size, dtype=torch.float64)
    elif kind == "aligned":
        keys = torch.randn(1, 128, generator=gen, dtype=torch.float64) + 0.1 * torch.randn(
            size, 128, generator=gen, dtype=torch.float64)
        keys = keys / keys.norm(dim=1, keepdim=True)
        beta = 0.5 + 0.5 * torch.rand(size, generator=gen, dtype=torch.float64)
        gates = torch.cumsum(-0.02 * torch.rand(size, generator=gen, dtype=torch.float64), 0)
        a = beta[:, None] * (keys @ keys.T) * torch.exp(gates[:, None] - gates[None, :])
    else:
        a = 0.3 * torch.randn(size, size, generator=gen, dtype=torch.float64)
    return torch.tril(a, -1)


@pytest.mark.cpu_only
@pytest.mark.parametrize("size", [32, 64])
@pytest.mark.parametrize("kind", ["ones", "aligned", "random"])
def test_block_doubling_inverse_matches_a_solve(kind: str, size: int) -> None:
    # The doubling carries z = -rest with entries inside the blocks it has joined, never zeroed: were one
    # read by a later level's band, the inverse would be off by about its size, not by fp32 rounding.
    a = _strictly_lower(kind, size)
    identity = torch.eye(size, dtype=torch.float64)
    exact = torch.linalg.solve_triangular(identity + a, identity, upper=False)
    got = torch.empty(size, size)
    _inverse_kernel[(1,)](a.float().contiguous(), got, N=size, LEVELS=size.bit_length() - 1)
    error = (got.double() - exact).abs().max() / exact.abs().max()
    assert error < 1e-5, f"{kind} {size}: error {error:.2e} of the inverse's largest entry"
