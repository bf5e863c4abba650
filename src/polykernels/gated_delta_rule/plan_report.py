"""What `chunk_gated_delta_rule` runs at one shape: the segment plan and its reason, and the launches in order.

`polykernels info --gdn N,T,H,HV[,K,V]` prints it for this machine's GPU; with ``--target cuda:90 --sms 132``
for a GPU that is not here (a build host previewing the H200's plan). The plan and the launches come from the
op's own recipe (``launch._recipe``), so the report is what a call of that shape launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from polykernels import platform
from polykernels.gated_delta_rule import guards, launch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class GdnShape:
    """N sequences of T tokens each (``packed``: N sequences packed into T tokens in all), H qk heads, HV value
    heads, K and V."""

    num_seqs: int
    tokens: int
    heads: int
    value_heads: int
    key_dim: int = 128
    value_dim: int = 128
    packed: bool = False

    @classmethod
    def parse(cls, text: str, packed: bool = False) -> GdnShape:
        """"N,T,H,HV" or "N,T,H,HV,K,V" (positive integers, HV a multiple of H, K and V at most 256)."""
        try:
            numbers = [int(part) for part in text.split(",")]
        except ValueError:
            numbers = []
        if len(numbers) not in (4, 6) or min(numbers) < 1:
            raise ValueError(f"--gdn expects N,T,H,HV or N,T,H,HV,K,V (positive integers), got {text!r}")
        shape = cls(*numbers, packed=packed)
        if shape.value_heads % shape.heads:
            raise ValueError(f"--gdn: HV ({shape.value_heads}) must be a multiple of H ({shape.heads})")
        if max(shape.key_dim, shape.value_dim) > launch.MAX_HEAD_DIM:
            raise ValueError(f"--gdn: K and V must be at most {launch.MAX_HEAD_DIM}, got {shape.key_dim}, "
                             f"{shape.value_dim}")
        if packed and shape.tokens < shape.num_seqs:
            raise ValueError(f"--gdn with --packed: T ({shape.tokens}) counts all the tokens, at least N "
                             f"({shape.num_seqs})")
        return shape


def report(shape: GdnShape, dtype: torch.dtype = torch.bfloat16, sms: int | None = None,
           dram_gbps: float | None = None) -> dict[str, object]:
    """The plan and launches on the current platform (``platform.use`` to ask about another; ``sms`` and
    ``dram_gbps`` then stand for its SM count and its peak DRAM bandwidth, None: not known)."""
    seen = platform.current()
    path = guards.choose("cuda" if seen.is_gpu else "cpu", dtype == torch.float32, shape.key_dim)
    row: dict[str, object] = {"shape": _describe(shape), "platform": f"{seen.backend} {seen.arch}", "path": path.path}
    if path.path != "triton":
        row["reason"] = path.reason
        return row
    if sms is None and not torch.cuda.is_available():
        raise ValueError("no GPU here: give the SM count to plan for (--sms) with --target")
    batch, tokens = (1, shape.tokens) if shape.packed else (shape.num_seqs, shape.tokens)
    q_shape = torch.Size([batch, tokens, shape.heads, shape.key_dim])
    v_shape = torch.Size([batch, tokens, shape.value_heads, shape.value_dim])
    device = torch.device("cuda", torch.cuda.current_device()) if sms is None else torch.device("cuda")
    block_k, fp32 = launch._block(shape.key_dim), dtype == torch.float32
    recipe = launch._recipe(q_shape, v_shape, dtype, torch.int32 if shape.packed else None, shape.num_seqs, False,
                            True, False, None, device, seen, *launch.launch_tables(block_k, seen.arch, fp32),
                            sms=sms, dram_gbps=dram_gbps)
    plan = recipe.plan
    # The Triton passes run (not both Gluon passes) with their arch's own launches, not the default's.
    own = (not (recipe.hopper and recipe.hopper_prepare)
           and launch.triton_pass_launches(seen.arch, block_k, fp32) != launch.triton_pass_launches(None, block_k))
    row.update({
        "segments": plan.segments, "segment_chunks": plan.segment_chunks, "v_tile": plan.block_v * plan.warpgroups,
        "plan": plan.reason,
        **({"launch_table": f"{seen.arch}'s entries in launch.ARCH_* (the default launches spill inside the chunk "
                            "loop there)"} if own else {}),
        "launches": [_launch_line(name, grid, meta)
                     for _, grid, name, meta, _ in launch._launches(recipe, launch._launchers(), ())],
    })
    if recipe.inverse_beside:  # the recipe's own choice and reason (launch.concurrent_warp_blocks)
        form = "per-warp" if recipe.prepare_meta["WARP_BLOCKS"] else "whole"
        row["inverse_beside"] = f"{form} levels beside the output pass: {recipe.inverse_beside}"
    return row


def _describe(shape: GdnShape) -> str:
    sequences = (f"{shape.num_seqs} packed sequences, {shape.tokens} tokens in all" if shape.packed
                 else f"{shape.num_seqs} x {shape.tokens} tokens")
    return f"{sequences}, {shape.heads} qk / {shape.value_heads} v heads, K = {shape.key_dim}, V = {shape.value_dim}"


_PASSES = {"prepare": "prepare pass", "lead": "first segments' output pass (the lead)",
           "segment_state": "segment-state pass", "combine": "combine pass (the scan over segments)",
           "recurrence": "output pass"}


def _launch_line(name: str, grid: tuple[int, ...], meta: dict[str, object]) -> str:
    stages = meta.get("STAGES", meta.get("num_stages"))  # the Gluon passes' copy stages, or Triton's pipeline's
    shape = f", {meta['num_warps']} warps" + (f", {stages} stage{'s' * (stages != 1)}" if stages else "")
    dependent = ", programmatic dependent of the launch before it" if meta.get("launch_pdl") else ""
    waits = ", waits for each chunk's ready flag" if meta.get("AWAIT") else ""
    if name == "prepare" and meta.get("CONCURRENT"):  # kernels._ready_slot
        waits = ", raises each chunk's ready flag, every sequence's chunk c before any sequence's chunk c + 1"
    # The Gluon prepare pass's forms: what it stores for the pairs, and where its inverse's first levels run.
    stores = ", stores T = (I + A)^-1 diag(beta), the passes after it form v_new" if meta.get("STORE_T") else ""
    if meta.get("SCORE_FACTORS"):
        stores += "; the output pass forms the scores P (from two exponents per token stored in P's place)"
    if name != "prepare" and meta.get("FROM_V"):  # FlashInfer's order of the chain (hopper_register_kernels)
        stores = ", v_new from T and v" + (" and P from q and k" if meta.get("SCORES") else "")
        stores += ", T, k, q and v copied by TMA" if meta.get("TMA") else ""
    inverse = ", the inverse's levels joining 1 to 8 rows inside each warp" if meta.get("WARP_BLOCKS") else ""
    scans = (", each program's initial state scanned from the segment states back to the last window (no combine "
             "pass)" if meta.get("AFTER_WINDOWS") else "")
    return f"{_PASSES[name]}: grid {tuple(grid)}{shape}{dependent}{waits}{stores}{inverse}{scans}"


def render(row: dict[str, object]) -> str:
    lines = [f"chunk_gated_delta_rule at {row['shape']} on {row['platform']}: the {row['path']} path"]
    if "reason" in row:
        lines.append(f"  {row['reason']}")
        return "\n".join(lines)
    lines.append(f"  {row['segments']} segment(s) of {row['segment_chunks']} chunks per sequence, "
                 f"{row['v_tile']}-column V tiles")
    lines.append(f"  plan: {row['plan']}")
    if "launch_table" in row:
        lines.append(f"  launches: {row['launch_table']}")
    if "inverse_beside" in row:
        lines.append(f"  the prepare pass's inverse: {row['inverse_beside']}")
    lines.extend(f"  {i}. {line}" for i, line in enumerate(row["launches"], start=1))
    return "\n".join(lines)
