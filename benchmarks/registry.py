"""Benchmark rows: each op at the shapes the issues name, side by side with its peers.

A row is (family, case, implementation) -> time; bytes and flops come from the case so
GB/s and TFLOP/s are computed the same way for ours and the peers'.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class Case:
    family: str
    name: str
    bytes_moved: int  # what a perfect kernel must read + write
    flops: int
    implementations: dict[str, Callable[[], object]]


def _compiled(fn: Callable[..., object]) -> Callable[..., object]:
    return torch.compile(fn, dynamic=False)


def int4_cases(device: str) -> Iterator[Case]:
    from polykernels.quant import fake_int4_quant, fake_int4_quant_reference

    compiled = _compiled(lambda x: fake_int4_quant_reference(x, 128, True))
    for rows, cols in ((8192, 8192), (32768, 8192)):
        x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
        groups = x.numel() // 128
        yield Case(
            family="fake_int4_quant",
            name=f"{rows}x{cols} bf16 g128",
            bytes_moved=2 * x.numel() * 2 + groups * 5,
            flops=0,
            implementations={
                "polykernels": lambda x=x: fake_int4_quant(x, 128, True),
                "torch eager": lambda x=x: fake_int4_quant_reference(x, 128, True),
                "torch.compile": lambda x=x: compiled(x),
            },
        )


def norm_cases(device: str) -> Iterator[Case]:
    from polykernels.norm import layernorm_modulate, prefer, rmsnorm_scale_shift
    from polykernels.norm.reference import layernorm_modulate_reference, rmsnorm_scale_shift_reference

    ln_compiled = _compiled(layernorm_modulate_reference)
    rms_compiled = _compiled(rmsnorm_scale_shift_reference)

    def portable(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with prefer("portable"):
                return fn()

        return run

    for batch in (1, 4):
        tokens, dim = 4608, 3072
        x = torch.randn(batch, tokens, dim, device=device, dtype=torch.bfloat16)
        emb = torch.randn(batch, 6 * dim, device=device, dtype=torch.bfloat16)
        shift, scale = emb.chunk(6, dim=1)[:2]
        weight = torch.randn(dim, device=device, dtype=torch.bfloat16)
        moved = 2 * x.numel() * 2  # the spec's convention: one read of x, one write
        yield Case(
            family="layernorm_modulate",
            name=f"B{batch} L{tokens} D{dim} bf16",
            bytes_moved=moved,
            flops=0,
            implementations={
                "polykernels": lambda x=x, s=shift, c=scale: layernorm_modulate(x, s, c),
                "polykernels portable": portable(lambda x=x, s=shift, c=scale: layernorm_modulate(x, s, c)),
                "torch eager": lambda x=x, s=shift, c=scale: layernorm_modulate_reference(x, s, c),
                "torch.compile": lambda x=x, s=shift, c=scale: ln_compiled(x, s, c),
            },
        )
        yield Case(
            family="rmsnorm_scale_shift",
            name=f"B{batch} L{tokens} D{dim} bf16",
            bytes_moved=moved,
            flops=0,
            implementations={
                "polykernels": lambda x=x, w=weight, s=shift, c=scale: rmsnorm_scale_shift(x, w, s, c),
                "polykernels portable": portable(
                    lambda x=x, w=weight, s=shift, c=scale: rmsnorm_scale_shift(x, w, s, c)
                ),
                "torch eager": lambda x=x, w=weight, s=shift, c=scale: rmsnorm_scale_shift_reference(x, w, s, c),
                "torch.compile": lambda x=x, w=weight, s=shift, c=scale: rms_compiled(x, w, s, c),
            },
        )


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


def gdn_cases(device: str) -> Iterator[Case]:
    from polykernels.gated_delta_rule import chunk_gated_delta_rule

    fla = None
    if importlib.util.find_spec("fla") is not None:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla

    heads, dim = 32, 128
    for batch, tokens in ((1, 32768), (1, 131072), (8, 4096)):
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (batch, tokens, heads, dim)
        q = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
        k = torch.nn.functional.normalize(torch.randn(shape, device=device, generator=gen), dim=-1).bfloat16()
        v = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
        g = torch.nn.functional.logsigmoid(torch.randn(batch, tokens, heads, device=device, generator=gen))
        beta = torch.rand(batch, tokens, heads, device=device, generator=gen).sigmoid().bfloat16()
        moved = 4 * q.numel() * 2 + g.numel() * 4 + beta.numel() * 2  # q, k, v read; o written
        impls: dict[str, Callable[[], object]] = {
            "polykernels": lambda a=(q, k, v, g, beta): chunk_gated_delta_rule(*a, output_final_state=True),
        }
        if fla is not None:
            impls["FLA 0.6.0"] = lambda a=(q, k, v, g, beta): fla(*a, output_final_state=True)
        yield Case(
            family="chunk_gated_delta_rule",
            name=f"B{batch} T{tokens} H{heads} K=V={dim} bf16",
            bytes_moved=moved,
            flops=gdn_flops(batch * tokens, heads, dim, dim),
            implementations=impls,
        )


FAMILIES = {"int4": int4_cases, "norm": norm_cases, "gdn": gdn_cases}
