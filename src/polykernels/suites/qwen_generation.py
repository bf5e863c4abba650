"""Qwen generation: tiny random-weight Qwen3-Next and Qwen3.5 models generate and score text the
same way with polykernels' gated delta rule as with each model's own pure-torch op.

fp32: the greedy tokens must be identical and perplexity within 1%. bf16: perplexity within 1%, or no
farther from the fp32 reference's than the bf16 reference's is (the reference rounds in bf16 too, and
its own error can pass 1%: 2.3% at the repeated-token text on an H100); and the greedy tokens
identical up to half of the generated tokens or up to a near-tie: a step where both runs saw the same
prefix, their logits agree within TIE_TOLERANCE of the logits' range, and the two best tokens are
closer than that (bf16 rounding can flip such a choice; a wrong kernel moves the logits far more).
Nothing is downloaded: the configs are built here.

Also perplexity by the same rule on a text of one repeated token (padding, a run of spaces) through the same
model with its linear-attention heads decaying slowly (as many trained heads do; the default init
forgets within a few tokens): there a chunk's keys point one way, where an unstable (I + A)^-1 returned
NaN (BENCHMARKS.md, "(I + A)^-1 by block doubling").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from polykernels.suites.report import CaseResult, SuiteResult

NAME = "qwen_generation"
NEW_TOKENS = 32
TEXT_LENGTH = 200  # the perplexity text: three full chunks of 64 and a partial one
TIE_TOLERANCE = 0.03  # bf16: largest logit difference, as a fraction of max |logit|, at a forgiven flip
REPEATED_TOKEN = 5
SLOW_DECAY = (0.005, 0.1)  # the range of A (g = -A softplus(...), about -0.007 to -0.13 per token) for that text


@dataclass(frozen=True, kw_only=True)
class Family:
    """One model family under test: how to build its tiny config and model, and its prompt lengths."""

    name: str
    config: Callable[[bool], Any]
    model_class: str
    prompt_lengths: tuple[int, ...]
    cpu_prompt_lengths: tuple[int, ...] | None = None  # fewer, where the CPU run must stay short

    def lengths(self, device: torch.device) -> tuple[int, ...]:
        return self.prompt_lengths if device.type == "cuda" else self.cpu_prompt_lengths or self.prompt_lengths


def _qwen3_next_config(on_gpu: bool) -> Any:
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


def _qwen3_5_config(on_gpu: bool) -> Any:
    from transformers import Qwen3_5TextConfig

    if on_gpu:  # 2 qk / 8 v heads of 128: a Qwen3.5 layer split 8 ways, the shape issue benchmarks use
        sizes = {"hidden_size": 512, "head_dim": 64, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                 "linear_num_key_heads": 2, "linear_num_value_heads": 8, "intermediate_size": 512,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}
        layer_types = ["linear_attention", "full_attention", "linear_attention"]
    else:  # the fewest programs that still exercise GVA: the Triton interpreter's time goes per program
        sizes = {"hidden_size": 32, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                 "linear_num_key_heads": 1, "linear_num_value_heads": 2, "intermediate_size": 48,
                 "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 99}
        layer_types = ["linear_attention", "full_attention"]
    return Qwen3_5TextConfig(
        num_hidden_layers=len(layer_types), layer_types=layer_types, hidden_act="silu", linear_conv_kernel_dim=2,
        max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2, **sizes,
    )


FAMILIES = (
    Family(name="qwen3_next", config=_qwen3_next_config, model_class="Qwen3NextForCausalLM",
           prompt_lengths=(65, 130)),  # across one and two chunk boundaries
    Family(name="qwen3_5", config=_qwen3_5_config, model_class="Qwen3_5ForCausalLM",
           prompt_lengths=(65, 130), cpu_prompt_lengths=(130,)),  # 130: two boundaries and a partial chunk
)


def tiny_config(on_gpu: bool, family: str = "qwen3_next") -> Any:
    return _family(family).config(on_gpu)


def _family(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"unknown family {name!r}; known: {[f.name for f in FAMILIES]}")


def build_model(device: torch.device, dtype: torch.dtype, family: str = "qwen3_next", *,
                slow_decay: bool = False) -> Any:
    """slow_decay: every linear-attention head's A drawn from SLOW_DECAY instead of the init's (0, 16)."""
    import transformers
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # optional-kernel fallback notices are not results

    spec = _family(family)
    torch.manual_seed(0)
    model = getattr(transformers, spec.model_class)(spec.config(device.type == "cuda")).eval()
    # Sharper logits than the default init: greedy choices are then decided by the model, not by ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        if slow_decay:
            decays = [p for name, p in model.named_parameters() if name.endswith("linear_attn.A_log")]
            if not decays:
                raise RuntimeError(f"{spec.model_class} has no linear_attn.A_log: the slow-decay model needs one")
            gen = torch.Generator().manual_seed(5)
            for a_log in decays:
                a_log.copy_(torch.empty(a_log.shape).uniform_(*SLOW_DECAY, generator=gen).log())
    return model.to(device=device, dtype=dtype)


def _prompts(vocab: int, lengths: tuple[int, ...], device: torch.device) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (1, n), generator=gen).to(device) for n in lengths]


@dataclass(frozen=True)
class Generation:
    tokens: list[int]
    logits: list[torch.Tensor]  # per generated token, fp32 on the CPU


@torch.no_grad()
def _generate_and_score(model: Any, prompts: list[torch.Tensor], text: torch.Tensor) -> tuple[list[Generation], float]:
    generated = []
    for prompt in prompts:
        out = model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        generated.append(Generation(tokens=out.sequences[0, prompt.shape[1]:].tolist(),
                                    logits=[step[0].float().cpu() for step in out.logits]))
    loss = model(text, labels=text).loss
    return generated, math.exp(float(loss))


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def logit_deviation(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """max |ours - reference| over the vocabulary, as a fraction of max |reference|."""
    return float((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def near_tie(ours: Generation, reference: Generation, step: int) -> tuple[bool, float]:
    """Whether the runs' different choices at ``step`` (same prefix before it) were a near-tie."""
    deviation = logit_deviation(ours.logits[step], reference.logits[step])
    ref_logits = reference.logits[step]
    margin = float(ref_logits[reference.tokens[step]] - ref_logits[ours.tokens[step]]) / float(
        ref_logits.abs().max().clamp_min(1e-30))
    return deviation <= TIE_TOLERANCE and margin <= TIE_TOLERANCE, deviation


@dataclass(frozen=True)
class Yardstick:
    """The fp32 run's reference perplexities (the model's own op in fp32): what a bf16 run's are estimates of."""

    text: float
    repeated_token: float


def run_precision(family: Family, device: torch.device, dtype: torch.dtype,
                  fp32: Yardstick | None = None) -> tuple[list[CaseResult], Yardstick]:
    """The cases of one precision, and the run's reference perplexities (an fp32 run's are the yardstick
    its bf16 run takes as ``fp32``)."""
    from polykernels.integrations.transformers import apply_to_qwen, reference_implementation

    model = build_model(device, dtype, family.name)
    model_type = model.config.model_type
    vocab = model.config.vocab_size
    lengths = family.lengths(device)
    prompts = _prompts(vocab, lengths, device)
    text = torch.randint(3, vocab, (1, TEXT_LENGTH), generator=torch.Generator().manual_seed(7)).to(device)
    start = time.perf_counter()
    with apply_to_qwen(model, implementation=reference_implementation(model_type)):
        ref_tokens, ref_ppl = _generate_and_score(model, prompts, text)
    ref_seconds = time.perf_counter() - start
    start = time.perf_counter()
    with apply_to_qwen(model) as patch:
        if not patch.targets:
            raise RuntimeError(f"apply_to_qwen patched nothing in {model_type}: the model no longer calls the op")
        our_tokens, our_ppl = _generate_and_score(model, prompts, text)
    our_seconds = time.perf_counter() - start

    label = f"{family.name}-{str(dtype).removeprefix('torch.')}"
    cases = [_perplexity_case(f"{label}-perplexity", "", our_ppl, ref_ppl, fp32.text if fp32 else None)]
    for length, ours, ref in zip(lengths, our_tokens, ref_tokens, strict=True):
        diverged = _first_divergence(ours.tokens, ref.tokens)
        detail = f"first divergence {diverged if diverged is not None else 'none'} of {NEW_TOKENS}"
        if dtype == torch.float32:
            passed = diverged is None
            rule = "identical tokens"
        else:
            passed = diverged is None or diverged >= NEW_TOKENS // 2
            rule = f"identical tokens before token {NEW_TOKENS // 2} or a near-tie"
            if not passed:
                passed, deviation = near_tie(ours, ref, diverged)
                detail += f", where the logits differ by {100 * deviation:.2f}% of their range"
        cases.append(CaseResult(
            name=f"{label}-generate-prompt{length}", passed=passed, detail=f"{rule}: {detail}",
            metrics={"ours": ours.tokens, "reference": ref.tokens, "seconds_ours": our_seconds,
                     "seconds_reference": ref_seconds},
        ))
    repeated = _repeated_token_case(build_model(device, dtype, family.name, slow_decay=True), label,
                                    fp32.repeated_token if fp32 else None)
    cases.append(repeated)
    return cases, Yardstick(text=ref_ppl, repeated_token=repeated.metrics["reference"])


def _perplexity_case(name: str, what: str, ours: float, reference: float, exact: float | None = None) -> CaseResult:
    """Passes where our perplexity is within 1% of the reference's, or (``exact``: the fp32 reference's, for
    a bf16 run) no farther from ``exact`` than the reference's is. ``what`` opens the detail."""
    relative = abs(ours - reference) / reference
    detail = f"{what}polykernels {ours:.4f} vs reference {reference:.4f} ({100 * relative:.3f}%)"
    metrics = {"ours": ours, "reference": reference}
    passed = relative < 0.01
    if exact is not None:
        ours_off, reference_off = abs(ours - exact) / exact, abs(reference - exact) / exact
        detail += f"; from fp32's {exact:.4f}: ours {100 * ours_off:.3f}%, the reference {100 * reference_off:.3f}%"
        metrics["fp32_reference"] = exact
        passed = passed or ours_off <= reference_off
    return CaseResult(name=name, passed=passed, detail=detail, metrics=metrics)


@torch.no_grad()
def _repeated_token_case(model: torch.nn.Module, label: str, exact: float | None = None) -> CaseResult:
    """The perplexity of one token repeated, through a model with slowly decaying heads (``build_model``'s
    ``slow_decay``): its chunks' keys point one way. ``exact``: the fp32 reference's (``_perplexity_case``)."""
    from polykernels.integrations.transformers import apply_to_qwen, reference_implementation

    text = torch.full((1, TEXT_LENGTH), REPEATED_TOKEN, device=next(model.parameters()).device)
    with apply_to_qwen(model, implementation=reference_implementation(model.config.model_type)):
        ref_ppl = math.exp(float(model(text, labels=text).loss))
    with apply_to_qwen(model):
        our_ppl = math.exp(float(model(text, labels=text).loss))
    return _perplexity_case(f"{label}-repeated-token-perplexity",
                            f"slowly decaying heads, one token {TEXT_LENGTH} times: ", our_ppl, ref_ppl, exact)


def run(device: torch.device) -> SuiteResult:
    start = time.perf_counter()
    cases: list[CaseResult] = []
    for family in FAMILIES:
        fp32_cases, yardstick = run_precision(family, device, torch.float32)
        cases += fp32_cases + run_precision(family, device, torch.bfloat16, yardstick)[0]
    return SuiteResult.from_cases(NAME, cases, time.perf_counter() - start)
