"""What the compile matrix reads off a compiled kernel on a CPU build host (kernel_registry.resources)."""

from __future__ import annotations

import pytest

from polykernels.kernel_registry import serialized_products


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


@pytest.mark.slow
def test_ptxas_serializing_a_kernels_products_is_seen_on_the_build_host() -> None:
    kernel = _carried_product_kernel()
    assert serialized_products(_ptx(kernel, CARRY=True)) is True
    assert serialized_products(_ptx(kernel, CARRY=False)) is False


def test_ptx_without_tensor_core_products_is_not_judged() -> None:
    assert serialized_products(".version 8.7\n.target sm_90a\n.address_size 64\n") is None
