"""What the compile matrix reads off a compiled kernel on a CPU build host (kernel_registry.resources).

The real compiles run in a fresh Python process without the Triton interpreter: kernels interpreted
earlier in the same test run can leave Triton's language patched for the interpreter, and a compile
in that process then fails inside Triton's code generator (seen in a full CPU run)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import triton.language as tl

from polykernels.kernel_registry import code_fingerprint, instruction_lines, resources, serialized_products


def _carried_product_kernel():
    """A Gluon kernel whose chunk loop issues three wgmma products; ``CARRY`` leaves the last one in
    flight into the next iteration (awaited there, behind the next product), the pattern of a
    sequential-pass variant that ptxas serialized (BENCHMARKS.md, "twelfth set")."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    @gluon.jit
    def carried(X, OUT, N, CARRY: gl.constexpr):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, 64, 16])
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, mma))
        tile = rows[:, None] * 64 + cols[None, :]
        a_s = gl.allocate_shared_memory(gl.bfloat16, [64, 64],
                                        gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16))
        a_s.store(gl.load(X + tile))
        fence_async_shared()
        zero = gl.zeros([64, 64], gl.float32, layout=mma)
        state = zero
        out = zero
        if CARRY:
            out = warpgroup_mma_init(out)
        for i in range(N):
            w = warpgroup_mma(a_s, a_s, zero, use_acc=False, is_async=True)
            if CARRY:
                out = warpgroup_mma_wait(1, deps=(out,))
                gl.store(OUT + tile, out)
            w = warpgroup_mma_wait(0, deps=(w,))
            state = warpgroup_mma(a_s, a_s, state * 0.5 + w, is_async=True)
            out = warpgroup_mma(a_s, a_s, w * (i + 1.0), is_async=True)
            if CARRY:
                state = warpgroup_mma_wait(1, deps=(state,))
            else:
                state, out = warpgroup_mma_wait(0, deps=(state, out))
                gl.store(OUT + tile, out)
        if CARRY:
            out = warpgroup_mma_wait(0, deps=(out,))
        gl.store(OUT + tile, out + state)

    return carried


def _ptx(kernel, **constexprs) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    source = GluonASTSource(kernel, signature={"X": "*bf16", "OUT": "*fp32", "N": "i32", "CARRY": "constexpr"},
                            constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]


def _in_fresh_process(expression: str) -> object:
    """``expression`` evaluated (this module as ``t``) in a new Python process without the interpreter."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    code = f"import json\nimport tests.unit.test_kernel_registry as t\nprint(json.dumps({expression}))"
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=Path(__file__).parents[2], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _serialized(carry: bool) -> bool | None:
    return serialized_products(_ptx(_carried_product_kernel(), CARRY=carry))


@pytest.mark.slow
def test_ptxas_serializing_a_kernels_products_is_seen_on_the_build_host() -> None:
    assert _in_fresh_process("[t._serialized(True), t._serialized(False)]") == [True, False]


def test_ptx_without_tensor_core_products_is_not_judged() -> None:
    assert serialized_products(".version 8.7\n.target sm_90a\n.address_size 64\n") is None


def _accumulate(X, Y, N, BLOCK: tl.constexpr, LOOP: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    total = tl.load(X + offsets)
    if LOOP:
        for i in range(1, N):
            total = total * tl.load(X + i * BLOCK + offsets) + i
    else:
        total = total * tl.load(X + BLOCK + offsets) + 1
    tl.store(Y + offsets, total)


def _accumulating_kernel(moved: bool = False):
    """``_accumulate`` compiled for a GPU even where the CPU tests interpret ``triton.jit`` kernels; ``moved``:
    its source copied into a module of its own a few lines further down (the same code, other line numbers)."""
    from triton.runtime.jit import JITFunction

    if not moved:
        return JITFunction(_accumulate)
    path = Path(tempfile.mkdtemp()) / "moved_accumulate.py"
    path.write_text("import triton.language as tl\n\n\n# moved down\n\n\n" + inspect.getsource(_accumulate))
    spec = importlib.util.spec_from_file_location("moved_accumulate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return JITFunction(module._accumulate)


def _accumulating_compile(loop: bool, amd: bool = False, block: int = 8192, moved: bool = False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"X": "*fp32", "Y": "*fp32", "N": "i32", "BLOCK": "constexpr", "LOOP": "constexpr"}
    source = ASTSource(_accumulating_kernel(moved), signature=signature, constexprs={"BLOCK": block, "LOOP": loop})
    if amd:
        return triton.compile(source, target=GPUTarget("hip", "gfx942", 64), options={"num_warps": 1})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1, "maxnreg": 64})


def _accumulating_resources(loop: bool, amd: bool = False, block: int = 8192) -> dict:
    return resources(_accumulating_compile(loop, amd, block))


def _accumulating_fingerprint(loop: bool, amd: bool, moved: bool) -> str | None:
    return code_fingerprint(_accumulating_compile(loop, amd, 1024, moved))


@pytest.mark.slow
def test_spills_inside_a_loop_are_told_from_spills_outside_on_the_build_host() -> None:
    # 8192 fp32 values per warp capped at 64 registers spill either way; only the loop's spill
    # loads and stores come back every iteration.
    in_loop, outside = _in_fresh_process("[t._accumulating_resources(True), t._accumulating_resources(False)]")
    assert in_loop["spill_bytes"] and in_loop["loop_spill_instructions"] > 0
    assert outside["spill_bytes"] and outside["loop_spill_instructions"] == 0


@pytest.mark.slow
def test_amd_spills_inside_a_loop_are_told_from_spills_outside_on_the_build_host() -> None:
    # One wave of 64 lanes has 512 registers a lane (256 of them accumulation registers, where LLVM spills
    # first). 16384 fp32 values keep the loop's in registers and spill to scratch before it; 32768 spill
    # inside it too. (The loop-free form at 32768 takes LLVM minutes, so both are loops.)
    outside, in_loop = _in_fresh_process("[t._accumulating_resources(True, amd=True, block=16384), "
                                         "t._accumulating_resources(True, amd=True, block=32768)]")
    assert outside["spill_bytes"] and outside["loop_spill_instructions"] == 0
    assert in_loop["spill_bytes"] and in_loop["loop_spill_instructions"] > 0


_SASS = """
	code for sm_90a
		Function : k
	.headerflags	@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                     /* 0x00000a00ff017b82 */
                                                                              /* 0x000e700000000800 */
        //## File "kernels.py", line 10
        /*0010*/                   EXIT ;                                     /* 0x000000000000794d */
                                                                              /* 0x000fea0003800000 */
"""


def test_instruction_lines_keep_the_code_and_drop_what_a_source_edit_moves() -> None:
    lines = instruction_lines(_SASS)
    assert lines == ["LDC R1, c[0x0][0x28] ; /* 0x00000a00ff017b82 */", "/* 0x000e700000000800 */",
                          "EXIT ; /* 0x000000000000794d */", "/* 0x000fea0003800000 */"]
    assert instruction_lines(_SASS.replace("line 10", "line 42").replace("Function : k", "Function : j")) == lines
    assert instruction_lines(_SASS.replace("LDC R1", "LDC R2")) != lines
    assert instruction_lines(_SASS.replace("0x000fea0003800000", "0x000fe20003800000")) != lines  # scheduling bits
    amd = "k:\n  s_load_dword s0, s[0:1], 0x0 ; a comment\n.LBB0_1:\n  .loc 1 10 0\n  s_endpgm\n"
    assert instruction_lines(amd) == ["s_load_dword s0, s[0:1], 0x0", "s_endpgm"]


@pytest.mark.slow
@pytest.mark.parametrize("amd", [False, True], ids=["sm_90", "gfx942"])
def test_a_kernel_moved_in_its_source_keeps_its_code_fingerprint_on_the_build_host(amd: bool) -> None:
    same, moved, other = _in_fresh_process(f"[t._accumulating_fingerprint(True, {amd}, False), "
                                           f"t._accumulating_fingerprint(True, {amd}, True), "
                                           f"t._accumulating_fingerprint(False, {amd}, False)]")
    assert same is not None and same == moved
    assert other != same
