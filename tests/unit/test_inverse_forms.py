from __future__ import annotations

import pytest
import torch
from benchmarks.inverse_forms import (
    KINDS,
    block_doubling,
    blockwise,
    error,
    main,
    multiply_adds,
    strictly_lower,
    warp_blocks,
)


@pytest.mark.parametrize("size", [16, 32, 64])
@pytest.mark.parametrize("kind", KINDS)
def test_every_form_is_the_inverse_in_exact_arithmetic(kind: str, size: int) -> None:
    # Unrounded operands (fp64 throughout but blockwise's fp32 diagonal solves): any slip in a level's band
    # or a merge's blocks is off by the size of an entry, not by rounding.
    assert error(block_doubling, kind, size, None) < 1e-12
    assert error(warp_blocks, kind, size, None) < 1e-12
    assert error(blockwise, kind, size, None) < 1e-5


def test_the_16_bit_operands_round_and_stay_bounded() -> None:
    # The columns BENCHMARKS.md quotes: rounding shows (not a form that skipped it), bf16 near the kept
    # pass's, fp16 several times closer.
    for kind in ("aligned", "random"):
        doubling = error(block_doubling, kind, 64, torch.bfloat16)
        bf16, fp16 = error(blockwise, kind, 64, torch.bfloat16), error(blockwise, kind, 64, torch.float16)
        assert 1e-3 < doubling < 1e-2 and 1e-3 < bf16 < 1e-2, (kind, doubling, bf16)
        assert fp16 < bf16 / 4, (kind, fp16, bf16)
        # The Gluon pass's per-warp levels round where the whole-tile levels did: as close as the doubling.
        blocks = error(warp_blocks, kind, 64, torch.bfloat16)
        assert 1e-3 < blocks < 1.25 * doubling, (kind, blocks, doubling)
    rows = main(32)
    assert [row["matrix"] for row in rows] == list(KINDS)
    assert rows[0]["blockwise, bf16"] == 0.0  # ones: every operand is exact in bf16


def test_multiply_adds_count_each_forms_products() -> None:
    # Nine 64 x 64 x 64 products for the doubling; the blockwise form's 8 x 8 solves and its merges of
    # 8-, 16- and 32-row blocks (two products each).
    diagonal = 8 * sum(row * 8 for row in range(8))
    merges = 4 * 2 * 8**3 + 2 * 2 * 16**3 + 1 * 2 * 32**3
    blocks = 4 * 8 * 16**3 + 4 * 64**3  # per warp 8 products of 16 x 16 blocks, then four of 64 x 64
    assert multiply_adds(64) == {"block doubling": 9 * 64**3, "blockwise": diagonal + merges, "warp blocks": blocks}


def test_an_unknown_matrix_kind_names_the_kinds() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        strictly_lower("diagonal", 64)
