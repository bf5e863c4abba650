"""The Triton passes' launches per GPU architecture (launch.ARCH_*): what each arch runs, and that it
compiles there with no spill inside a loop."""

from __future__ import annotations

import json
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
            batch, False, True, False, None, torch.device("cuda"), seen,
            *launch.launch_tables(128, seen.arch, dtype == torch.float32), sms=sms)


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


def test_archs_without_an_entry_take_the_default_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    # The H200's Triton passes (fp32 inputs there), the B200's and AMD's keep the tables measured on the H200.
    for target, dtype in (("cuda:90", torch.float32), ("cuda:100", torch.bfloat16), ("hip:gfx942", torch.float32),
                          ("hip:gfx950", torch.bfloat16)):
        recipe = _recipe_on(monkeypatch, target, 132, 8, 4096, 32, 32, dtype=dtype)
        assert (recipe.recurrence_meta["num_warps"], recipe.recurrence_meta["num_stages"]) == \
            launch.RECURRENCE_LAUNCH[128], target
        assert recipe.recurrence_meta["BV"] == launch.RECURRENCE_BLOCK_V[128][0], target
        assert recipe.prepare_meta["num_warps"] == launch.PREPARE_LAUNCH[128][1], target


def test_fp32_inputs_take_their_own_sequential_launches_where_the_table_has_one(monkeypatch: pytest.MonkeyPatch,
                                                                                ) -> None:
    # gfx950: fp32 tiles of three stages spill inside the chunk loop; 16-bit inputs keep the default's stages.
    fp32 = _recipe_on(monkeypatch, "hip:gfx950", 256, 8, 4096, 32, 32, dtype=torch.float32)
    bf16 = _recipe_on(monkeypatch, "hip:gfx950", 256, 8, 4096, 32, 32)
    assert (fp32.recurrence_meta["num_warps"], fp32.recurrence_meta["num_stages"]) == \
        launch.ARCH_FP32_RECURRENCE_LAUNCH[("gfx950", 128)]
    assert (bf16.recurrence_meta["num_warps"], bf16.recurrence_meta["num_stages"]) == launch.RECURRENCE_LAUNCH[128]
    assert launch.triton_pass_launches("gfx950", 64, fp32_inputs=True)[1] == launch.ARCH_FP32_RECURRENCE_LAUNCH[
        ("gfx950", 64)]
    assert launch.triton_pass_launches("gfx942", 128, fp32_inputs=True) == launch.triton_pass_launches("gfx942", 128)


# The sequential passes of fp32 inputs (both V tiles, both passes) at one K tile, with the launcher's fp32 launches.
_FP32_COMPILE = """
import dataclasses, json, sys
from polykernels import kernel_registry
from polykernels.gated_delta_rule import registry
target, block_k, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
specs = {spec.name: spec for spec in registry.triton_pass_specs(block_k)}
for name in names:
    spec = specs[name]
    fp32 = dataclasses.replace(
        spec, name=name + "_fp32_inputs", signature=registry._fp32(spec.signature),
        platform_constexprs=lambda spec=spec: {**spec.platform_constexprs(), **registry._precision_fp32()},
        platform_options=lambda: registry._recurrence_options(block_k, True))
    kernel_registry.register(fp32)
    print(json.dumps(kernel_registry.compile_here(fp32.name, target)), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "block_k"), sorted(launch.ARCH_FP32_RECURRENCE_LAUNCH))
def test_each_fp32_entry_compiles_without_a_spill_inside_a_loop(arch: str, block_k: int) -> None:
    target = f"hip:{arch}" if arch.startswith("gfx") else f"cuda:{arch.removeprefix('sm_')}"
    suffix = "" if block_k == 128 else f"_k{block_k}"
    names = [f"{name}{suffix}" for name in ("gdn_recurrence", "gdn_recurrence_wide", "gdn_segment_state",
                                            "gdn_segment_state_wide")]
    found = _compiled(target, block_k, names, _FP32_COMPILE)
    assert sorted(found) == sorted(f"{name}_fp32_inputs" for name in names)
    for name, used in found.items():
        assert "registers" in used and not used.get("loop_spill_instructions"), (name, used)


# Compiles Triton pass specs at one K tile for one target in a process of its own (a bad compile can end
# the process), as the compile matrix does: argv = target, K tile, names; prints each result's JSON.
_COMPILE = """
import json, sys
from polykernels import kernel_registry
from polykernels.gated_delta_rule.registry import triton_pass_specs
target, block_k, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
specs = {spec.name: spec for spec in triton_pass_specs(block_k)}
for name in names:
    kernel_registry.register(specs[name])
    print(json.dumps(kernel_registry.compile_here(name, target)), flush=True)
"""


def _compiled(target: str, block_k: int, names: list[str], script: str | None = None) -> dict[str, dict]:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script or _COMPILE, target, str(block_k), *names], capture_output=True,
                          text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["kernel"]: row["resources"] for row in rows}


def _entries() -> dict[str, list[tuple[int, list[str]]]]:
    """Per arch, the K tiles its table entries cover and the passes each entry sets (names at that K)."""
    found: dict[str, dict[int, set[str]]] = {}
    for arch, block_k in (*launch.ARCH_RECURRENCE_BLOCK_V, *launch.ARCH_RECURRENCE_LAUNCH):
        wide, narrow = launch.triton_pass_launches(arch, block_k)[0]
        found.setdefault(arch, {}).setdefault(block_k, set()).update(
            ["gdn_recurrence", "gdn_segment_state", *(["gdn_recurrence_wide", "gdn_segment_state_wide"]
                                                      if wide != narrow else [])])
    for arch, block_k in launch.ARCH_PREPARE_LAUNCH:
        found.setdefault(arch, {}).setdefault(block_k, set()).add("gdn_prepare")
    suffix = {128: ""}
    return {arch: [(block_k, sorted(name + suffix.get(block_k, f"_k{block_k}") for name in names))
                   for block_k, names in sorted(by_k.items())] for arch, by_k in found.items()}


# The archs whose code the cuobjdump Triton ships reads (it places a spill inside a loop or not), and for the
# two it cannot, the arch whose registers and spills they match.
_SIBLINGS = {"sm_103": "sm_100", "sm_121": "sm_120"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(set(_entries()) - set(_SIBLINGS)))
def test_each_arch_entry_compiles_without_a_spill_inside_a_loop(arch: str) -> None:
    # What the per-arch tables were chosen for, checked on this CPU: every pass an entry sets, compiled with the
    # launcher's warps, stages and V tiles on that arch (launch.triton_pass_launches) at the entry's K tile.
    target = f"cuda:{arch.removeprefix('sm_')}"
    entries = _entries()[arch]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda entry: _compiled(target, *entry), entries))
    for (block_k, names), found in zip(entries, results, strict=True):
        assert sorted(found) == names
        for name, used in found.items():
            assert "registers" in used, (name, used)  # cuobjdump read the code
            assert not used.get("loop_spill_instructions"), (block_k, name, used)


@pytest.mark.slow
def test_b200_defaults_compile_without_a_spill_inside_a_loop() -> None:
    # sm_100 has no entry: the default launches spill outside loops only. Its code waits on mbarriers in stubs
    # at the function's end that branch back to where they were entered, and those are no loops
    # (polykernels.loop_spills).
    names = ["gdn_prepare", "gdn_recurrence", "gdn_recurrence_wide", "gdn_segment_state", "gdn_segment_state_wide"]
    found = _compiled("cuda:100", 128, names)
    assert sorted(found) == names
    for name, used in found.items():
        assert "registers" in used and not used.get("loop_spill_instructions"), (name, used)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(_SIBLINGS))
def test_archs_the_tools_cannot_place_spills_for_compile_as_their_siblings(arch: str) -> None:
    # sm_103 and sm_121 take sm_100's and sm_120's launches: at K = 128 their passes compile to the same
    # registers and spill bytes.
    sibling = _SIBLINGS[arch]
    assert {key[1:]: value for key, value in launch.ARCH_RECURRENCE_LAUNCH.items() if key[0] == arch} == \
        {key[1:]: value for key, value in launch.ARCH_RECURRENCE_LAUNCH.items() if key[0] == sibling}
    names = ["gdn_recurrence", "gdn_segment_state", "gdn_prepare"]
    found = {target: _compiled(target, 128, names) for target in (f"cuda:{arch[3:]}", f"cuda:{sibling[3:]}")}
    mine, theirs = found.values()
    for name in names:
        assert (mine[name]["registers"], mine[name]["spill_bytes"]) == \
            (theirs[name]["registers"], theirs[name]["spill_bytes"]), name
