"""The first four levels of (I + A)^-1 inside each warp, for the Gluon prepare pass (sm_90).

A 64 x 64 product of one warpgroup (``hopper_kernels._mma_layout``) leaves rows 16w to 16w + 15 in
warp w, and warp w holds its 16 x 16 diagonal block in the very registers and lanes that a warp-level
``mma.sync`` product (m16n8k16) takes and gives. So the levels of the block doubling that join blocks
of 1, 2, 4 and 8 rows (``kernels._unit_lower_inverse``) run per warp on 16 x 16 blocks: no shared
memory, fence or barrier between them, and each product 1/64 of a 64 x 64 x 64 one. Only the two
levels that join blocks of 16 and 32 rows need products across warps (``warpgroup_mma``).

An ``mma.sync`` takes its right operand B in the layout of B^T's accumulator (a register permutation,
no data moved). Each level's -N, the band of z = -rest, is the right operand of both products, so z^T
is carried beside z, updated by z^T + (-N^T) z^T (the transpose of z's update): -N^T is a select of
it, and z itself gives z^T's product its right operand. Every operand is still a block of the inverse
or of A times one (the property that made block doubling the fix; ``kernels._unit_lower_inverse``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

BLOCK = gl.constexpr(16)  # rows of a warp's diagonal block: the rows a warpgroup product leaves in one warp
BLOCK_LEVELS = gl.constexpr(4)  # the levels inside it: blocks of 1, 2, 4 and 8 rows joined


@gluon.constexpr_function
def _blocks_view():
    """A 64 x 64 warpgroup product's layout (4 warps) seen as [row block, row, column block, column]:
    the row block is the warp, the column block two register bits (``to_linear_layout`` of
    ``hopper_kernels._mma_layout(64)``, its row and column bits split in two)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 8, 0, 0], [0, 0, 0, 8], [0, 0, 1, 0], [0, 0, 2, 0]],
        lane_bases=[[0, 0, 0, 2], [0, 0, 0, 4], [0, 1, 0, 0], [0, 2, 0, 0], [0, 4, 0, 0]],
        warp_bases=[[1, 0, 0, 0], [2, 0, 0, 0]], block_bases=[], shape=[4, 16, 4, 16])


@gluon.constexpr_function
def _warp_blocks():
    """The [warp, row, column] layout of ``mma.sync`` products, one 16 x 16 block per warp."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8])


@gluon.jit
def _block_indices():
    """Row and column indices inside the blocks, shaped to broadcast over [warp, row, column]."""
    blocks: gl.constexpr = _warp_blocks()
    i = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, gl.SliceLayout(2, blocks)))[None, :, None]
    j = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, gl.SliceLayout(1, blocks)))[None, None, :]
    return i, j


@gluon.jit
def _on_own_block():
    """True where ``_blocks_view``'s column block is the row block (the warp's own diagonal block)."""
    view: gl.constexpr = _blocks_view()
    row_block = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, view))))
    col_block = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, view))))
    return row_block[:, None, None, None] == col_block[None, None, :, None]


@gluon.jit
def _own_blocks(product):
    """[4, 16, 16]: the diagonal 16 x 16 block of a 64 x 64 warpgroup product that each warp holds."""
    view: gl.constexpr = _blocks_view()
    parts = gl.convert_layout(gl.reshape(product, [4, BLOCK, 4, BLOCK]), view, assert_trivial=True)
    own = gl.sum(gl.where(_on_own_block(), parts, 0.0), axis=2)
    return gl.convert_layout(own, _warp_blocks(), assert_trivial=True)


@gluon.jit
def block_diagonal(blocks, layout: gl.constexpr):
    """The 64 x 64 block-diagonal matrix of each warp's 16 x 16 block, in the warpgroup product ``layout``."""
    view: gl.constexpr = _blocks_view()
    parts = gl.expand_dims(gl.convert_layout(blocks, gl.SliceLayout(2, view), assert_trivial=True), 2)
    whole = gl.where(_on_own_block(), parts, 0.0)
    return gl.convert_layout(gl.reshape(whole, [4 * BLOCK, 4 * BLOCK]), layout, assert_trivial=True)


@gluon.jit
def _right_operand(transposed):
    """B for ``mma_v2`` from B^T held in the products' layout (a register permutation, no data moved)."""
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=_warp_blocks(), k_width=2)
    return gl.convert_layout(gl.permute(transposed.to(gl.bfloat16), (0, 2, 1)), operand, assert_trivial=True)


@gluon.jit
def _left_operand(x):
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=_warp_blocks(), k_width=2)
    return gl.convert_layout(x.to(gl.bfloat16), operand, assert_trivial=True)


@gluon.jit
def block_inverses(z, z_t):
    """(I + a)^-1 of each warp's 16 x 16 unit lower block, from z = -a and z^T (fp32, ``_warp_blocks``),
    by the block doubling of ``kernels._unit_lower_inverse`` with 16-bit operands."""
    i, j = _block_indices()
    inverse = gl.where(i == j, 1.0, gl.where((i >> 1) == (j >> 1), z, 0.0))  # blocks of 2 rows: I - N, no product
    for level in gl.static_range(BLOCK_LEVELS):
        step_t = gl.where((j >> level) == ((i >> level) ^ 1), z_t, 0.0)  # -N^T
        minus_n = _right_operand(step_t)
        if level > 0:
            inverse = mma_v2(_left_operand(inverse), minus_n, inverse)
        if level < BLOCK_LEVELS - 1:
            z_as_right = _right_operand(z)  # z^T's right operand, before z moves on
            z = mma_v2(_left_operand(z), minus_n, z)
            z_t = mma_v2(_left_operand(step_t), z_as_right, z_t)
    return inverse


@gluon.jit
def minus_a_blocks(kk, a_r, b_r, exp2):
    """z = -A and z^T on each warp's diagonal block, A_rc = kk_rc 2^(a_r - b_c) below the diagonal (kk
    symmetric: A^T_rc = kk_rc 2^(a_c - b_r)); a_r and b_r per row of the products. Each warp's block takes
    its columns' scales from its own rows' (a shuffle within the warp, no barrier)."""
    gl.static_assert((kk.shape[0] == 4 * BLOCK) & (kk.shape[1] == 4 * BLOCK) & (gl.num_warps() == 4),
                     "the per-warp levels take a 64 x 64 product of one warpgroup")
    blocks: gl.constexpr = _warp_blocks()
    rows: gl.constexpr = gl.SliceLayout(2, blocks)
    a_rows = gl.convert_layout(gl.reshape(a_r, [4, BLOCK]), rows, assert_trivial=True)[:, :, None]
    b_rows = gl.convert_layout(gl.reshape(b_r, [4, BLOCK]), rows, assert_trivial=True)[:, :, None]
    a_cols = gl.convert_layout(gl.reshape(a_r, [4, BLOCK]), gl.SliceLayout(1, blocks))[:, None, :]
    b_cols = gl.convert_layout(gl.reshape(b_r, [4, BLOCK]), gl.SliceLayout(1, blocks))[:, None, :]
    kk_blocks = _own_blocks(kk)
    i, j = _block_indices()
    z = gl.where(i > j, kk_blocks * -exp2(a_rows - b_cols), 0.0)
    z_t = gl.where(i < j, kk_blocks * -exp2(a_cols - b_rows), 0.0)
    return z, z_t
