"""Qwen generation: a tiny random-weight Qwen3-Next generates and scores text the same way with
polykernels' gated delta rule as with the model's own pure-torch op.

fp32: the greedy tokens must be identical and perplexity within 1%. bf16: perplexity within 1%
and the first divergence (if any) late: after half of the generated tokens. Nothing is downloaded.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from polykernels.suites.report import CaseResult, SuiteResult

NAME = "qwen_generation"
NEW_TOKENS = 32
PROMPT_LENGTHS = (65, 130)  # across chunk boundaries


def tiny_config(on_gpu: bool) -> Any:
    from transformers import Qwen3NextConfig

    if on_gpu:  # the real head dims the kernels are tuned for
        sizes = {"hidden_size": 512, "head_dim": 64, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                 "linear_num_key_heads": 2, "linear_num_value_heads": 4, "intermediate_size": 512,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}
    else:
        sizes = {"hidden_size": 32, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                 "linear_num_key_heads": 4, "linear_num_value_heads": 8, "intermediate_size": 48,
                 "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 99}
    return Qwen3NextConfig(
        num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"],
        hidden_act="silu", linear_conv_kernel_dim=2, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2, **sizes,
    )


def build_model(device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import Qwen3NextForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # optional-kernel fallback notices are not results

    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(tiny_config(device.type == "cuda")).eval()
    # Sharper logits than the default init: greedy choices are then decided by the model, not by ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.to(device=device, dtype=dtype)


def _prompts(vocab: int, device: torch.device) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (1, n), generator=gen).to(device) for n in PROMPT_LENGTHS]


@torch.no_grad()
def _generate_and_score(model: Any, prompts: list[torch.Tensor], text: torch.Tensor) -> tuple[list[list[int]], float]:
    generated = []
    for prompt in prompts:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        generated.append(out[0, prompt.shape[1]:].tolist())
    loss = model(text, labels=text).loss
    return generated, math.exp(float(loss))


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def run_precision(device: torch.device, dtype: torch.dtype) -> list[CaseResult]:
    from polykernels.integrations.transformers import apply_to_qwen3_next, reference_implementation

    model = build_model(device, dtype)
    prompts = _prompts(model.config.vocab_size, device)
    text = torch.randint(3, model.config.vocab_size, (1, 200), generator=torch.Generator().manual_seed(7)).to(device)
    start = time.perf_counter()
    with apply_to_qwen3_next(model, implementation=reference_implementation()):
        ref_tokens, ref_ppl = _generate_and_score(model, prompts, text)
    ref_seconds = time.perf_counter() - start
    start = time.perf_counter()
    with apply_to_qwen3_next(model) as patch:
        if not patch.targets:
            raise RuntimeError("apply_to_qwen3_next patched nothing: the model no longer calls the op we swap")
        our_tokens, our_ppl = _generate_and_score(model, prompts, text)
    our_seconds = time.perf_counter() - start

    label = str(dtype).removeprefix("torch.")
    cases = []
    relative = abs(our_ppl - ref_ppl) / ref_ppl
    cases.append(CaseResult(name=f"{label}-perplexity", passed=relative < 0.01,
                            detail=f"polykernels {our_ppl:.4f} vs reference {ref_ppl:.4f} ({100 * relative:.3f}%)",
                            metrics={"ours": our_ppl, "reference": ref_ppl}))
    for length, ours, ref in zip(PROMPT_LENGTHS, our_tokens, ref_tokens, strict=True):
        diverged = _first_divergence(ours, ref)
        if dtype == torch.float32:
            passed = diverged is None
            rule = "identical tokens"
        else:
            passed = diverged is None or diverged >= NEW_TOKENS // 2
            rule = f"first divergence at or after token {NEW_TOKENS // 2}"
        cases.append(CaseResult(
            name=f"{label}-generate-prompt{length}", passed=passed,
            detail=f"{rule}: first divergence {diverged if diverged is not None else 'none'} of {NEW_TOKENS}",
            metrics={"ours": ours, "reference": ref, "seconds_ours": our_seconds, "seconds_reference": ref_seconds},
        ))
    return cases


def run(device: torch.device) -> SuiteResult:
    start = time.perf_counter()
    cases = run_precision(device, torch.float32) + run_precision(device, torch.bfloat16)
    return SuiteResult.from_cases(NAME, cases, time.perf_counter() - start)
