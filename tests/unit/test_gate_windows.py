"""benchmarks.gate_windows: the windows a cut sequence's segments find under each gate family, on this CPU."""

from __future__ import annotations

import math

import torch
from benchmarks.gate_windows import chunk_log2_bounds, windowed_difference, windows
from benchmarks.registry import gdn_inputs


def test_fast_gates_give_one_chunk_windows_and_still_ones_none() -> None:
    _, k, _, g, beta = gdn_inputs(1, 1024, 2, 4, "cpu", dim=16, gates="mixed")  # value head 0: g = 0
    found = windows(chunk_log2_bounds(k, g, beta), 4, 32, -30.0)
    assert found.shape == (1, 3, 4)
    assert torch.equal(found[..., 0], torch.zeros(1, 3, dtype=torch.long))
    assert torch.equal(found[..., 1:], torch.ones(1, 3, 3, dtype=torch.long))


def test_a_window_is_the_fewest_last_chunks_within_the_bound() -> None:
    # Gates of -0.1 a token: a chunk takes 6.4 / ln 2 = 9.2 off log2, so 2^-30 needs four chunks.
    g = torch.full((1, 512, 1), -0.1)
    k = torch.nn.functional.normalize(torch.randn(1, 512, 1, 8), dim=-1)
    bounds = chunk_log2_bounds(k, g, torch.full((1, 512, 1), 0.5))
    assert torch.allclose(bounds, torch.full((1, 8, 1), -6.4 / math.log(2), dtype=torch.float64))
    assert windows(bounds, 8, 32, -30.0).numel() == 0  # one segment: no state handed on
    assert torch.equal(windows(bounds, 4, 32, -30.0), torch.full((1, 1, 1), 4))
    assert torch.equal(windows(bounds, 4, 3, -30.0), torch.zeros(1, 1, 1, dtype=torch.long))  # past the longest


def test_beta_that_grows_the_state_counts_against_the_gates() -> None:
    # beta = 2.5 with ||k|| = 1: |1 - 2.5| = 1.5 a token, more than gates of -0.05 take off: no window. beta = 1.5
    # grows nothing (|1 - 1.5| < 1): the gates alone, 3.2 / ln 2 = 4.6 off log2 a chunk, 2^-30 in seven chunks.
    g = torch.full((1, 1024, 1), -0.05)
    k = torch.nn.functional.normalize(torch.randn(1, 1024, 1, 8), dim=-1)
    assert torch.equal(windows(chunk_log2_bounds(k, g, torch.full((1, 1024, 1), 2.5)), 8, 32, -30.0),
                       torch.zeros(1, 1, 1, dtype=torch.long))
    assert int(windows(chunk_log2_bounds(k, g, torch.full((1, 1024, 1), 1.5)), 8, 32, -30.0)) == 7


def test_dropping_the_past_before_each_window_changes_nothing_an_fp64_run_shows() -> None:
    for gates in ("fast", "slow"):
        inputs = gdn_inputs(1, 768, 1, 2, "cpu", dim=16, gates=gates)
        assert windowed_difference(inputs, 3, 32, -30.0) < 1e-9
