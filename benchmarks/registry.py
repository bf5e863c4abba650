"""Benchmark rows: each op at the shapes the issues name, side by side with its peers.

A row is (family, case, implementation) -> eager and CUDA-graph times; bytes and flops come from
the case so GB/s and TFLOP/s are computed the same way for ours and the peers'.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, kw_only=True)
class Case:
    family: str
    name: str
    bytes_moved: int  # what a perfect kernel must read + write
    flops: int
    implementations: dict[str, Callable[[], object]]
    peer: str | None = None  # the implementation "ours vs peer" is computed against
    notes: dict[str, object] = field(default_factory=dict)


def _compiled(fn: Callable[..., object]) -> Callable[..., object]:
    return torch.compile(fn, dynamic=False)


def int4_cases(device: str) -> Iterator[Case]:
    from polykernels.quant import fake_int4_quant, fake_int4_quant_reference

    shapes = [((8192, 8192), 128, True), ((32768, 8192), 128, True), ((8192, 8192), 128, False),
              ((32768, 8192), 128, False), ((8192, 8192), 32, True)]
    for (rows, cols), group, symmetric in shapes:
        x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
        groups = x.numel() // group
        compiled = _compiled(lambda x, g=group, s=symmetric: fake_int4_quant_reference(x, g, s))
        mode = "sym" if symmetric else "asym"
        yield Case(
            family="fake_int4_quant",
            name=f"{rows}x{cols} bf16 g{group} {mode}",
            bytes_moved=2 * x.numel() * 2 + groups * 5,
            flops=0,
            peer="torch.compile",
            implementations={
                "polykernels": lambda x=x, g=group, s=symmetric: fake_int4_quant(x, g, s),
                "torch eager": lambda x=x, g=group, s=symmetric: fake_int4_quant_reference(x, g, s),
                "torch.compile": lambda x=x, c=compiled: c(x),
            },
        )


def _liger() -> tuple[Callable | None, Callable | None]:
    """Liger's plain LayerNorm / RMSNorm functions, as a bandwidth reference, when installed."""
    if importlib.util.find_spec("liger_kernel") is None:
        return None, None
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerLayerNormFunction.apply, LigerRMSNormFunction.apply


def norm_cases(device: str) -> Iterator[Case]:
    from polykernels.norm import head_rmsnorm, layernorm_modulate, prefer, qk_rmsnorm, rmsnorm_scale_shift
    from polykernels.norm.reference import (
        layernorm_modulate_reference,
        qk_rmsnorm_reference,
        rmsnorm_reference,
        rmsnorm_scale_shift_reference,
    )

    ln_compiled = _compiled(layernorm_modulate_reference)
    rms_compiled = _compiled(rmsnorm_scale_shift_reference)
    liger_ln, liger_rms = _liger()

    def portable(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with prefer("portable"):
                return fn()

        return run

    dim = 3072
    for batch, tokens in ((1, 4608), (4, 4608), (1, 1024), (2, 4096)):
        x = torch.randn(batch, tokens, dim, device=device, dtype=torch.bfloat16)
        emb = torch.randn(batch, 6 * dim, device=device, dtype=torch.bfloat16)
        shift, scale = emb.chunk(6, dim=1)[:2]  # strided views, as AdaLayerNormZero makes them
        weight = torch.randn(dim, device=device, dtype=torch.bfloat16)
        bias = torch.zeros(dim, device=device, dtype=torch.bfloat16)
        moved = 2 * x.numel() * 2  # the spec's convention: one read of x, one write
        name = f"B{batch} L{tokens} D{dim} bf16"
        ln = {
            "polykernels": lambda x=x, s=shift, c=scale: layernorm_modulate(x, s, c),
            "polykernels portable": portable(lambda x=x, s=shift, c=scale: layernorm_modulate(x, s, c)),
            "torch eager": lambda x=x, s=shift, c=scale: layernorm_modulate_reference(x, s, c),
            "torch.compile": lambda x=x, s=shift, c=scale: ln_compiled(x, s, c),
        }
        rms = {
            "polykernels": lambda x=x, w=weight, s=shift, c=scale: rmsnorm_scale_shift(x, w, s, c),
            "polykernels portable": portable(lambda x=x, w=weight, s=shift, c=scale: rmsnorm_scale_shift(x, w, s, c)),
            "torch eager": lambda x=x, w=weight, s=shift, c=scale: rmsnorm_scale_shift_reference(x, w, s, c),
            "torch.compile": lambda x=x, w=weight, s=shift, c=scale: rms_compiled(x, w, s, c),
        }
        if liger_ln is not None:
            ln["Liger LayerNorm (no modulation)"] = lambda x=x, w=weight, b=bias: liger_ln(x, w, b, 1e-6)
            rms["Liger RMSNorm (no modulation)"] = lambda x=x, w=weight: liger_rms(x, w, 1e-6)
        yield Case(family="layernorm_modulate", name=name, bytes_moved=moved, flops=0, peer="torch.compile",
                   implementations=ln)
        yield Case(family="rmsnorm_scale_shift", name=name, bytes_moved=moved, flops=0, peer="torch.compile",
                   implementations=rms)

    heads, head_dim = 24, 128
    q = torch.randn(1, 4608, heads, head_dim, device=device, dtype=torch.bfloat16)
    k = torch.randn_like(q)
    wq, wk = torch.randn(head_dim, device=device, dtype=torch.bfloat16), torch.randn_like(q[0, 0, 0])
    qk_compiled = _compiled(qk_rmsnorm_reference)
    head_compiled = _compiled(rmsnorm_reference)
    qk = {
        "polykernels": lambda: qk_rmsnorm(q, k, wq, wk),
        "torch eager": lambda: qk_rmsnorm_reference(q, k, wq, wk),
        "torch.compile": lambda: qk_compiled(q, k, wq, wk),
    }
    head = {
        "polykernels": lambda: head_rmsnorm(q, wq),
        "torch eager": lambda: rmsnorm_reference(q, wq),
        "torch.compile": lambda: head_compiled(q, wq),
    }
    if liger_rms is not None:
        head["Liger RMSNorm"] = lambda: liger_rms(q, wq, 1e-6)
    name = f"B1 L4608 H{heads} D{head_dim} bf16"
    yield Case(family="qk_rmsnorm", name=name, bytes_moved=2 * 2 * q.numel() * 2, flops=0, peer="torch.compile",
               implementations=qk)
    yield Case(family="head_rmsnorm", name=name, bytes_moved=2 * q.numel() * 2, flops=0, peer="torch.compile",
               implementations=head)


def gdn_flops(tokens: int, heads: int, key_dim: int, value_dim: int, chunk: int = 64) -> int:
    """Matmul flops of the chunked algorithm (2 per multiply-add), per token and head."""
    per_token = (
        2 * chunk * key_dim  # gated K K^T
        + 10 * 2 * chunk * chunk  # the (I + A)^-1 products
        + 2 * chunk * (key_dim + value_dim)  # w and u
        + 2 * 2 * key_dim * value_dim  # v_new = u - w h, and the state update
        + 2 * key_dim * value_dim + 2 * chunk * (key_dim + value_dim)  # output: q h, q k^T, A v
    )
    return per_token * tokens * heads


# (name, batch, tokens, qk heads, v heads, packed sequence lengths or None). Qwen3-Next / Qwen3.5 shapes.
GDN_SHAPES: list[tuple[str, int, int, int, int, list[int] | None]] = [
    ("B1 T32768 H32/32", 1, 32768, 32, 32, None),
    ("B1 T32768 H16/32", 1, 32768, 16, 32, None),
    ("B1 T131072 H32/32", 1, 131072, 32, 32, None),
    ("B8 T4096 H32/32", 8, 4096, 32, 32, None),
    ("1x32768 H2/8", 1, 32768, 2, 8, None),
    ("1x65536 H2/8", 1, 65536, 2, 8, None),
    ("1x32768 H4/16", 1, 32768, 4, 16, None),
    ("1x8192 H16/64", 1, 8192, 16, 64, None),
    ("varlen 6144+2048 H2/8", 1, 8192, 2, 8, [6144, 2048]),
    ("varlen 8x1024 H2/8", 1, 8192, 2, 8, [1024] * 8),
]


def gdn_shape(spec: str) -> tuple[str, int, int, int, int, list[int] | None]:
    """A GDN_SHAPES row from ``B,T,H,HV`` (batch rows of T tokens) or ``L1+L2+...,H,HV`` (packed sequences
    of those lengths): shapes outside the bench for an A/B (benchmarks.gdn_ab's --shape)."""
    parts = spec.split(",")
    try:
        if len(parts) == 4:
            batch, tokens, heads, value_heads = (int(part) for part in parts)
            lengths = None
            name = f"B{batch} T{tokens} H{heads}/{value_heads}"
        elif len(parts) == 3 and "+" in parts[0]:
            lengths = [int(length) for length in parts[0].split("+")]
            batch, tokens, heads, value_heads = 1, sum(lengths), int(parts[1]), int(parts[2])
            name = f"varlen {parts[0]} H{heads}/{value_heads}"
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"a GDN shape is B,T,H,HV or L1+L2+...,H,HV (packed lengths), got {spec!r}") from None
    if min(batch, tokens, heads, value_heads, *(lengths or [1])) < 0 or min(batch, tokens, heads) < 1 or (
            value_heads % heads):
        raise ValueError(f"GDN shape {spec!r}: sizes must be positive (lengths at least 0) and HV a multiple of H")
    return name, batch, tokens, heads, value_heads, lengths


# gdn_inputs' key families: "random" keys are about orthogonal at K = 128 and the gates decay fast (about
# -0.8 per token): what the bench times. "aligned" keys share one direction per head (cosine about 0.94) and
# "repeated" ones are one key per head (a repeated token, padding), both under slowly decaying gates
# (about -0.02 per token, as many trained heads): within a chunk A's powers reach 1e4-1e17 there, which is
# what an unstable (I + A)^-1 gets wrong.
GDN_KEYS = ("random", "aligned", "repeated")
# gdn_inputs' gate families, for timing what depends on how fast the gates forget (a segment's past,
# launch.SEGMENT_WINDOWS): "fast", the bench's (about -0.8 per token); "slow" (about -0.02 per token, as many
# trained heads); "mixed", the fast ones but on a quarter of the value heads (at least one) g = 0, heads that
# never forget. The default is the key family's: fast for random keys, slow for the others.
GDN_GATES = ("fast", "slow", "mixed")


def gdn_boundaries(lengths: list[int] | None, device: str) -> torch.Tensor | None:
    """Packed sequences' int32 ``cu_seqlens`` from their lengths (None for batch rows): what FLA takes too."""
    if lengths is None:
        return None
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device, dtype=torch.int32)


def gdn_inputs(batch: int, tokens: int, heads: int, value_heads: int, device: str, dim: int = 128,
               keys: str = "random", gates: str | None = None) -> tuple:
    if keys not in GDN_KEYS:
        raise ValueError(f"keys must be one of {GDN_KEYS}, got {keys!r}")
    if gates is None:
        gates = "fast" if keys == "random" else "slow"
    if gates not in GDN_GATES:
        raise ValueError(f"gates must be one of {GDN_GATES}, got {gates!r}")
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, tokens, heads, dim, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, tokens, heads, dim, device=device, generator=gen)
    if keys != "random":
        shared = torch.randn(batch, 1, heads, dim, device=device, generator=gen)
        k = 0.8 * shared + 0.2 * k if keys == "aligned" else shared.expand_as(k)
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(batch, tokens, value_heads, dim, device=device, dtype=torch.bfloat16, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(batch, tokens, value_heads, device=device, generator=gen)
                                       + (4.0 if gates == "slow" else 0.0))
    if gates == "mixed":
        g[:, :, :max(1, value_heads // 4)] = 0.0
    beta = torch.rand(batch, tokens, value_heads, device=device, generator=gen).sigmoid().bfloat16()
    return q, k.bfloat16(), v, g, beta


def gdn_cases(device: str) -> Iterator[Case]:
    from polykernels.gated_delta_rule import chunk_gated_delta_rule

    fla = None
    if importlib.util.find_spec("fla") is not None:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla

    for name, batch, tokens, heads, value_heads, lengths in GDN_SHAPES:
        q, k, v, g, beta = gdn_inputs(batch, tokens, heads, value_heads, device)
        cu = gdn_boundaries(lengths, device)
        moved = 2 * (q.numel() + k.numel() + 2 * v.numel()) + g.numel() * 4 + beta.numel() * 2  # q,k,v in; o out
        impls: dict[str, Callable[[], object]] = {
            "polykernels": lambda a=(q, k, v, g, beta), cu=cu: chunk_gated_delta_rule(
                *a, output_final_state=True, cu_seqlens=cu),
        }
        if fla is not None:
            # FLA wants g in fp32 and, for packed sequences, int32 boundaries: the same inputs.
            impls["FLA"] = lambda a=(q, k, v, g, beta), cu=cu: fla(*a, output_final_state=True, cu_seqlens=cu)
        yield Case(
            family="chunk_gated_delta_rule",
            name=f"{name} K=V=128 bf16",
            bytes_moved=moved,
            flops=gdn_flops(batch * tokens, value_heads, 128, 128),
            peer="FLA",
            implementations=impls,
        )


FAMILIES = {"int4": int4_cases, "norm": norm_cases, "gdn": gdn_cases}
