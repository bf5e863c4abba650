"""The Triton passes' launches per GPU architecture (launch.ARCH_*): what each arch runs, and that it
compiles there with no spill inside a loop."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from polykernels import platform
from polykernels.gated_delta_rule import launch


def _recipe_on(monkeypatch: pytest.MonkeyPatch, target: str, sms: int, batch: int, tokens: int, heads: int,
               value_heads: int, dtype: torch.dtype = torch.bfloat16) -> launch._Recipe:
    """launch._recipe for K = V = 128 inputs on the GPU of a Triton ``target``, with ``sms`` SMs."""
    monkeypatch.setattr(launch, "_triton_release", lambda: "3.6")
    seen = platform.for_triton_target(target)
    with platform.use(seen):
        return launch._recipe(
            torch.Size([batch, tokens, heads, 128]), torch.Size([batch, tokens, value_heads, 128]), dtype, None,
            batch, False, True, False, None, torch.device("cuda"), seen, *launch.launch_tables(128, seen.arch),
            sms=sms)


@pytest.mark.parametrize(("target", "sms"), [("cuda:80", 108), ("cuda:86", 84), ("cuda:89", 142), ("cuda:120", 84)])
def test_archs_whose_wide_tile_spills_in_its_loop_run_the_narrow_tile(monkeypatch: pytest.MonkeyPatch, target: str,
                                                                       sms: int) -> None:
    # Qwen3.5's 2 / 8 heads (cut into segments) and B8 T4096 32 / 32 took 64-column tiles with the default tables;
    # there the output pass spills inside its chunk loop on these archs, so both take 32-column tiles, with the
    # arch's warps and stages for both sequential passes.
    warps, stages = launch.ARCH_RECURRENCE_LAUNCH[(platform.for_triton_target(target).arch or "", 128)]
    for shape in ((1, 32768, 2, 8), (8, 4096, 32, 32)):
        recipe = _recipe_on(monkeypatch, target, sms, *shape)
        assert not (recipe.hopper or recipe.hopper_prepare)
        assert recipe.recurrence_meta["BV"] == 32, shape
        assert (recipe.recurrence_meta["num_warps"], recipe.recurrence_meta["num_stages"]) == (warps, stages)
        if recipe.segment_chunks:
            assert recipe.segment_state_meta["BV"] == 32
            assert recipe.segment_state_meta["num_warps"] == warps


def test_b200_keeps_the_wide_tile_at_eight_warps_and_splits_the_prepare_pass_v(monkeypatch: pytest.MonkeyPatch) -> None:
    # sm_100: at 8 warps both tiles compile without a spill, and the prepare pass takes 64-column V tiles at 4
    # warps (at 128 it spilled inside its loop).
    recipe = _recipe_on(monkeypatch, "cuda:100", 148, 8, 4096, 32, 32)
    assert (recipe.recurrence_meta["BV"], recipe.recurrence_meta["num_warps"]) == (64, 8)
    assert (recipe.prepare_meta["BV"], recipe.prepare_meta["NV"], recipe.prepare_meta["num_warps"]) == (64, 2, 4)


def test_archs_without_an_entry_take_the_default_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    # The H200's Triton passes (fp32 inputs there) and AMD's keep the tables measured on the H200.
    for target in ("cuda:90", "hip:gfx942", "hip:gfx950"):
        recipe = _recipe_on(monkeypatch, target, 132, 8, 4096, 32, 32, dtype=torch.float32)
        assert (recipe.recurrence_meta["num_warps"], recipe.recurrence_meta["num_stages"]) == \
            launch.RECURRENCE_LAUNCH[128], target
        assert recipe.recurrence_meta["BV"] == launch.RECURRENCE_BLOCK_V[128][0], target
        assert recipe.prepare_meta["num_warps"] == launch.PREPARE_LAUNCH[128][1], target


def _arch_targets() -> list[str]:
    archs = {arch for arch, _ in (*launch.ARCH_RECURRENCE_BLOCK_V, *launch.ARCH_RECURRENCE_LAUNCH,
                                  *launch.ARCH_PREPARE_LAUNCH)}
    return sorted(f"cuda:{arch.removeprefix('sm_')}" for arch in archs)


@pytest.mark.slow
@pytest.mark.parametrize("target", _arch_targets())
def test_each_arch_entry_compiles_without_a_spill_inside_a_loop(target: str) -> None:
    # What the per-arch tables were chosen for, checked on this CPU as the compile matrix compiles them: the
    # launcher's warps, stages and V tiles on that arch (the registry asks launch.triton_pass_launches).
    from polykernels.kernel_registry import probe

    block_vs = launch.triton_pass_launches(platform.for_triton_target(target).arch, 128)[0]
    names = ["gdn_prepare", "gdn_recurrence", "gdn_segment_state"]
    if block_vs[0] != block_vs[1]:
        names += ["gdn_recurrence_wide", "gdn_segment_state_wide"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda name: probe(name, target), names))
    for result in results:
        assert result.compiled, result.detail
        assert not result.resources.get("loop_spill_instructions"), result.detail
