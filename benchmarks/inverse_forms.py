"""python -m benchmarks.inverse_forms [--size N]: forms of a chunk's (I + a)^-1 with 16-bit product operands,
emulated in torch, against an fp64 triangular solve.

The prepare passes form (I + a)^-1 for strictly lower a by block doubling (``kernels._unit_lower_inverse``),
its products' operands rounded to bf16. FlashInfer's SM90 forward forms it blockwise: 8 x 8 diagonal
blocks solved in fp32, then merged 8 -> 16 -> ... -> N by inv([A 0; C D]) = [inv(A) 0; -inv(D) C inv(A)
inv(D)] on the off-diagonal blocks only (docs/gdn-performance.md, item 13). This prints each form's
largest error over the inverse's largest entry on the matrices the kernels' tests use
(``strictly_lower``), and each form's multiply-adds, so that a kernel of any form has its rounding to
compare with (BENCHMARKS.md, "2026-12-05, build host only"). "Warp blocks" is the doubling with its
first levels inside each warp's 16-row diagonal block, as the Gluon prepare pass forms it where it runs
alone (``hopper_inverse_kernels``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

KINDS = ("ones", "aligned", "random")
# The blockwise columns' product operands (the forms take None for unrounded fp64 operands).
OPERANDS: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def strictly_lower(kind: str, size: int) -> torch.Tensor:
    """A chunk's strictly lower a in fp64. "ones": every entry below the diagonal 1 (the inverse is I minus
    the subdiagonal); "aligned": beta k k^T Gamma with keys about one direction and slowly decaying gates
    (entries near 1, powers of a up to 1e17 at 64 rows); "random": entries of 0.3 sigma."""
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
    elif kind == "random":
        a = 0.3 * torch.randn(size, size, generator=gen, dtype=torch.float64)
    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return torch.tril(a, -1)


def _product(x: torch.Tensor, y: torch.Tensor, operands: torch.dtype | None) -> torch.Tensor:
    """x @ y with both operands rounded to ``operands``, summed in fp64 (the kernels sum in fp32, whose
    rounding lies far below the 16-bit operands')."""
    if operands is not None:
        x, y = x.to(operands).double(), y.to(operands).double()
    return x @ y


def block_doubling(a: torch.Tensor, operands: torch.dtype | None, first_level: int = 0,
                   inverse: torch.Tensor | None = None) -> torch.Tensor:
    """The prepare passes' form: z = -rest, each level's step the band of z joining blocks in pairs, the
    inverse so far and z times (I + step), never zeroing z inside the blocks joined. From ``first_level``
    on, given the inverse of the diagonal blocks of 2^first_level rows (z = -a times it)."""
    size = a.shape[0]
    r = torch.arange(size)
    if inverse is None:
        z, inverse = -a, torch.eye(size, dtype=a.dtype)
    else:
        z = _product(-a, inverse, operands)
    levels = size.bit_length() - 1
    for level in range(first_level, levels):
        band = (r[:, None] >> level) == ((r[None, :] >> level) ^ 1)
        step = torch.where(band, z, torch.zeros_like(z))
        inverse = inverse + (step if level == 0 else _product(inverse, step, operands))
        if level < levels - 1:
            z = z + _product(z, step, operands)
    return inverse


def warp_blocks(a: torch.Tensor, operands: torch.dtype | None, block: int = 16) -> torch.Tensor:
    """The Gluon prepare pass's form where it runs alone (``hopper_inverse_kernels``): block doubling
    inside each ``block`` x ``block`` diagonal block (a warp's rows of a warpgroup product), then z = -a
    times their inverse and the levels that join blocks of ``block`` rows and more. Inside the blocks it
    takes the kernel's steps: -N is the transpose of a select of z^T, carried beside z (``_block_inverse``)."""
    size = a.shape[0]
    diagonal = torch.zeros_like(a)
    for start in range(0, size, block):
        part = slice(start, start + block)
        diagonal[part, part] = _block_inverse(a[part, part], operands)
    return block_doubling(a, operands, first_level=block.bit_length() - 1, inverse=diagonal)


def _block_inverse(a: torch.Tensor, operands: torch.dtype | None) -> torch.Tensor:
    """``hopper_inverse_kernels.block_inverses`` on one block: a warp-level product takes its right operand
    B as B^T, so z^T goes along ((z (I + step))^T = z^T + step^T z^T, step = -N) and each step is read off it."""
    size = a.shape[0]
    i, j = torch.arange(size)[:, None], torch.arange(size)[None, :]
    z, z_t = -a, -a.T
    levels = size.bit_length() - 1
    inverse = torch.where(i == j, 1.0, torch.where((i >> 1) == (j >> 1), z, 0.0)).to(a.dtype)
    for level in range(levels):
        step_t = torch.where((j >> level) == ((i >> level) ^ 1), z_t, 0.0).to(a.dtype)  # -N^T
        if level > 0:
            inverse = inverse + _product(inverse, step_t.T, operands)
        if level < levels - 1:
            z, z_t = z + _product(z, step_t.T, operands), z_t + _product(step_t, z.T, operands)
    return inverse


def blockwise(a: torch.Tensor, operands: torch.dtype | None, base: int = 8) -> torch.Tensor:
    """FlashInfer's form: ``base`` x ``base`` diagonal blocks by forward substitution in fp32, then each
    level's off-diagonal blocks -inv(D) C inv(A), -inv(D) C rounded before its product with inv(A)."""
    size = a.shape[0]
    inverse = torch.zeros_like(a)
    for start in range(0, size, base):
        block = a[start:start + base, start:start + base].float()
        solved = torch.eye(base, dtype=torch.float32)
        for row in range(1, base):
            solved[row] = solved[row] - block[row, :row] @ solved[:row]
        inverse[start:start + base, start:start + base] = solved.double()
    width = base
    while width < size:
        for start in range(0, size, 2 * width):
            upper, lower = slice(start, start + width), slice(start + width, start + 2 * width)
            joined = -_product(inverse[lower, lower], a[lower, upper], operands)
            inverse[lower, upper] = _product(joined, inverse[upper, upper], operands)
        width *= 2
    return inverse


def multiply_adds(size: int, base: int = 8) -> dict[str, int]:
    """Multiply-adds of each form's products at ``size`` rows (the diagonal solves counted for blockwise)."""
    levels = size.bit_length() - 1
    doubling = (2 * (levels - 1) - 1) * size**3  # two products a level from the second, one at the last
    solves = (size // base) * sum(row * base for row in range(base))
    merges = sum((size // (2 * width)) * 2 * width**3 for width in (base * 2**i for i in range(levels))
                 if width < size)
    # The kernel's 16-row blocks: 8 products of 16^3 each (z^T's beside z's; the last level's z unused),
    # then z = -a times them and the last two levels' three products at the whole size.
    blocks = (size // 16) * 8 * 16**3 + 4 * size**3
    return {"block doubling": doubling, "blockwise": solves + merges, "warp blocks": blocks}


def relative_error(got: torch.Tensor, a: torch.Tensor) -> float:
    """The largest entry of ``got`` minus (I + a)^-1 (an fp64 triangular solve), over the solve's largest."""
    identity = torch.eye(a.shape[0], dtype=torch.float64)
    exact = torch.linalg.solve_triangular(identity + a, identity, upper=False)
    return float((got.cpu().double() - exact).abs().max() / exact.abs().max())


def error(form: Callable[[torch.Tensor, torch.dtype | None], torch.Tensor], kind: str, size: int,
          operands: torch.dtype | None) -> float:
    """``form``'s (``block_doubling``, ``blockwise``) ``relative_error`` on ``strictly_lower(kind, size)``."""
    a = strictly_lower(kind, size)
    return relative_error(form(a, operands), a)


def main(size: int) -> list[dict]:
    rows = []
    for kind in KINDS:
        row: dict = {"matrix": kind, "size": size}
        row["block doubling, bf16"] = error(block_doubling, kind, size, torch.bfloat16)
        row["warp blocks, bf16"] = error(warp_blocks, kind, size, torch.bfloat16)
        for label, operands in OPERANDS.items():
            row[f"blockwise, {label}"] = error(blockwise, kind, size, operands)
        rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inverse_forms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64, help="rows of the chunk (a power of two, at least 16)")
    args = parser.parse_args()
    if args.size < 16 or args.size & (args.size - 1):
        parser.error(f"--size must be a power of two of at least 16, got {args.size}")
    results = main(args.size)
    columns = list(results[0])[2:]
    print("| matrix | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for result in results:
        print(f"| {result['matrix']} | " + " | ".join(f"{result[c]:.1e}" for c in columns) + " |")
    counts = multiply_adds(args.size)
    print("multiply-adds: " + ", ".join(f"{name} {count:,}" for name, count in counts.items()))
