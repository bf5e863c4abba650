from __future__ import annotations

import pytest
import torch
from benchmarks.registry import GDN_GATES, GDN_KEYS, gdn_boundaries, gdn_inputs


def _cosines(k: torch.Tensor) -> torch.Tensor:
    """Pairwise cosines of one head's keys, off the diagonal."""
    keys = torch.nn.functional.normalize(k[0, :, 0].float(), dim=-1)
    cosines = keys @ keys.T
    return cosines[~torch.eye(len(keys), dtype=torch.bool)]


def test_the_bench_keys_are_the_ones_every_earlier_set_timed() -> None:
    # The random family draws what gdn_inputs drew before the families existed: earlier sets stay comparable.
    q, k, v, g, beta = gdn_inputs(2, 96, 2, 4, "cpu")
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(q, torch.randn(2, 96, 2, 128, dtype=torch.bfloat16, generator=gen))
    assert torch.equal(k, torch.nn.functional.normalize(torch.randn(2, 96, 2, 128, generator=gen), dim=-1).bfloat16())
    assert torch.equal(v, torch.randn(2, 96, 4, 128, dtype=torch.bfloat16, generator=gen))
    assert torch.equal(g, torch.nn.functional.logsigmoid(torch.randn(2, 96, 4, generator=gen)))
    assert torch.equal(beta, torch.rand(2, 96, 4, generator=gen).sigmoid().bfloat16())


def test_the_key_families_point_one_way_under_slow_gates() -> None:
    random, aligned, repeated = (gdn_inputs(1, 128, 2, 4, "cpu", keys=keys) for keys in GDN_KEYS)
    assert _cosines(random[1]).abs().mean() < 0.1
    assert 0.85 < _cosines(aligned[1]).mean() < 0.99
    assert torch.equal(repeated[1], repeated[1][:, :1].expand_as(repeated[1]))
    assert random[3].mean() < -0.5  # the bench's gates forget within a few tokens
    for slow in (aligned, repeated):
        assert -0.1 < slow[3].mean() < 0.0


def test_an_unknown_key_family_is_refused() -> None:
    with pytest.raises(ValueError, match=r"keys must be one of \('random', 'aligned', 'repeated'\), got 'same'"):
        gdn_inputs(1, 64, 1, 1, "cpu", keys="same")


def test_the_gate_families_forget_fast_slowly_or_never() -> None:
    fast, slow, mixed = (gdn_inputs(1, 4096, 2, 8, "cpu", gates=gates)[3] for gates in GDN_GATES)
    assert torch.equal(fast, gdn_inputs(1, 4096, 2, 8, "cpu")[3])  # the bench's
    assert fast.mean() < -0.5 and -0.1 < slow.mean() < 0.0
    assert torch.equal(mixed[:, :, :2], torch.zeros_like(mixed[:, :, :2]))  # a quarter of the value heads
    assert torch.equal(mixed[:, :, 2:], fast[:, :, 2:])
    assert torch.equal(gdn_inputs(1, 64, 1, 1, "cpu", gates="mixed")[3], torch.zeros(1, 64, 1))  # at least one
    assert torch.equal(gdn_inputs(1, 64, 1, 2, "cpu", keys="aligned")[3],
                       gdn_inputs(1, 64, 1, 2, "cpu", keys="aligned", gates="slow")[3])


def test_an_unknown_gate_family_is_refused() -> None:
    with pytest.raises(ValueError, match=r"gates must be one of \('fast', 'slow', 'mixed'\), got 'none'"):
        gdn_inputs(1, 64, 1, 1, "cpu", gates="none")


def test_packed_lengths_give_int32_boundaries_and_batch_rows_none() -> None:
    cu = gdn_boundaries([6144, 0, 2048], "cpu")
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 6144, 6144, 8192]
    assert gdn_boundaries(None, "cpu") is None
