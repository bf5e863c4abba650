from __future__ import annotations

import importlib
import math

import pytest
import torch

FAMILY_MODULES = {
    "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    "qwen3_5": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_moe": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
}
OPS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


def _ops(module_name: str) -> tuple:
    module = importlib.import_module(module_name)
    return tuple(getattr(module, name) for name in OPS)


@pytest.mark.parametrize("model_type", sorted(FAMILY_MODULES))
def test_patch_swaps_one_family_and_restores(model_type: str) -> None:
    from polykernels.integrations.transformers import apply_to_qwen, polykernels_gated_delta_rule

    before = {name: _ops(module) for name, module in FAMILY_MODULES.items()}
    with apply_to_qwen(model_type=model_type) as patch:
        assert _ops(FAMILY_MODULES[model_type]) == (polykernels_gated_delta_rule,) * 2
        assert patch.targets == [f"{FAMILY_MODULES[model_type]}.{name}" for name in OPS]
        for other, module in FAMILY_MODULES.items():
            if other != model_type:
                assert _ops(module) == before[other]  # each family has its own globals
    assert {name: _ops(module) for name, module in FAMILY_MODULES.items()} == before


def test_qwen3_next_alias_patches_qwen3_next_only() -> None:
    from polykernels.integrations.transformers import apply_to_qwen3_next, polykernels_gated_delta_rule

    with apply_to_qwen3_next() as patch:
        assert _ops(FAMILY_MODULES["qwen3_next"]) == (polykernels_gated_delta_rule,) * 2
        assert _ops(FAMILY_MODULES["qwen3_5"])[0] is not polykernels_gated_delta_rule
        assert len(patch.targets) == 2


def _spy(calls: list, implementation):
    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return implementation(*args, **kwargs)

    return spy


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_model_really_calls_the_op(family: str) -> None:
    from polykernels.integrations.transformers import apply_to_qwen, polykernels_gated_delta_rule
    from polykernels.suites.qwen_generation import build_model

    model = build_model(torch.device("cpu"), torch.float32, family)
    calls: list = []
    with apply_to_qwen(model, implementation=_spy(calls, polykernels_gated_delta_rule)), torch.no_grad():
        model(torch.randint(3, 90, (1, 70)))
    assert calls and calls[0][1] == 70  # the prefill went through the swapped op


def test_qwen3_5_moe_model_is_recognised_and_calls_the_op() -> None:
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    from polykernels.integrations.transformers import apply_to_qwen, reference_implementation

    config = Qwen3_5MoeTextConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_conv_kernel_dim=2,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
    )
    model = Qwen3_5MoeForCausalLM(config).eval()
    calls: list = []
    spy = _spy(calls, reference_implementation("qwen3_5_moe"))
    with apply_to_qwen(model, implementation=spy) as patch, torch.no_grad():
        model(torch.randint(3, 60, (1, 9)))
    assert patch.description == "polykernels -> transformers qwen3_5_moe_text"
    assert calls and calls[0][1] == 9


def test_qwen3_5_forward_with_the_patch_matches_the_models_own_op() -> None:
    from polykernels.integrations.transformers import apply_to_qwen, reference_implementation
    from polykernels.suites.qwen_generation import build_model

    model = build_model(torch.device("cpu"), torch.float32, "qwen3_5")
    tokens = torch.randint(3, model.config.vocab_size, (1, 130), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        with apply_to_qwen(model, implementation=reference_implementation("qwen3_5")):
            reference = model(tokens, use_cache=False).logits
        with apply_to_qwen(model):
            ours = model(tokens, use_cache=False).logits

        def no_mixing(query, key, value, *args, **kwargs):
            return torch.zeros_like(value), None

        with apply_to_qwen(model, implementation=no_mixing):
            broken = model(tokens, use_cache=False).logits
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)
    # The comparison can fail: the op's output moves the logits far beyond that tolerance.
    assert (broken - reference).abs().max() > 100 * 1e-4


@pytest.mark.cpu_only
def test_repeated_token_text_through_the_triton_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite's repeated-token case with the model's op on the Triton kernels (in the interpreter here; CPU
    # tensors otherwise take the torch path). The squaring series for (I + A)^-1 put this perplexity 4.5% off.
    from polykernels.gated_delta_rule import chunk
    from polykernels.suites.qwen_generation import SLOW_DECAY, _repeated_token_case, build_model

    model = build_model(torch.device("cpu"), torch.float32, "qwen3_next", slow_decay=True)
    decays = [p.exp() for name, p in model.named_parameters() if name.endswith("A_log")]
    assert decays and all(((a >= SLOW_DECAY[0]) & (a <= SLOW_DECAY[1])).all() for a in decays)
    monkeypatch.setattr(chunk, "_path", lambda *_: "triton")
    case = _repeated_token_case(model, "qwen3_next-float32")
    assert case.passed, case.detail


def test_model_type_is_read_from_the_config_and_checked() -> None:
    from polykernels.integrations.transformers import apply_to_qwen, apply_to_qwen3_next

    def fake(model_type: str) -> torch.nn.Module:
        model = torch.nn.Module()
        model.config = type("Config", (), {"model_type": model_type})()
        return model

    supported = r"\['qwen3_5', 'qwen3_5_moe', 'qwen3_5_moe_text', 'qwen3_5_text', 'qwen3_next'\]"
    with pytest.raises(ValueError, match=rf"unsupported model type 'llama'; supported: {supported}"):
        apply_to_qwen(fake("llama"))
    with pytest.raises(ValueError, match=rf"unsupported model type 'qwen2'; supported: {supported}"):
        apply_to_qwen(model_type="qwen2")
    with pytest.raises(ValueError, match=rf"pass a model or a model_type; supported: {supported}"):
        apply_to_qwen()
    with pytest.raises(ValueError, match="model_type='qwen3_next' but the model's config says 'qwen3_5_text'"):
        apply_to_qwen3_next(fake("qwen3_5_text"))
    with apply_to_qwen(fake("qwen3_5_moe")) as patch:
        assert patch.targets[0].startswith(FAMILY_MODULES["qwen3_5_moe"])


def test_unknown_options_raise_type_error() -> None:
    from polykernels.integrations.transformers import apply_to_qwen, apply_to_qwen3_next

    with pytest.raises(TypeError, match="norms"):
        apply_to_qwen(model_type="qwen3_5", norms=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="norms"):
        apply_to_qwen3_next(norms=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        apply_to_qwen3_next(model_type="qwen3_5")  # type: ignore[call-arg]  # the alias fixes its family


def test_flux_patch_swaps_norms_and_restores() -> None:
    from polykernels.integrations.diffusers import HeadRMSNorm, apply_to_flux
    from polykernels.suites.flux_warmup import build_model

    model = build_model(torch.device("cpu"), torch.float32)
    block = model.transformer_blocks[0]
    norm_q = block.attn.norm_q
    with apply_to_flux(model) as patch:
        assert isinstance(block.attn.norm_q, HeadRMSNorm) and block.attn.norm_q.weight is norm_q.weight
        assert "forward" in vars(block.norm1)
        assert len(patch.targets) >= 5
    assert block.attn.norm_q is norm_q and "forward" not in vars(block.norm1)


def test_flux_rejects_other_models() -> None:
    from polykernels.integrations.diffusers import apply_to_flux

    with pytest.raises(ValueError, match=r"unsupported model Linear; supported: \('FluxTransformer2DModel',\)"):
        apply_to_flux(torch.nn.Linear(2, 2))


def _generation(tokens: list[int], logits: list[list[float]]):
    from polykernels.suites.qwen_generation import Generation

    return Generation(tokens=tokens, logits=[torch.tensor(row) for row in logits])


def test_bf16_divergence_is_forgiven_only_at_a_near_tie() -> None:
    from polykernels.suites.qwen_generation import near_tie

    reference = _generation([0, 1], [[5.0, 1.0, -3.0], [1.99, 2.0, -9.0]])
    flipped = _generation([0, 0], [[5.0, 1.0, -3.0], [2.0, 1.99, -9.0]])  # 0.1% of the range apart
    assert near_tie(flipped, reference, 1) == (True, pytest.approx(0.01 / 9.0))
    wrong = _generation([0, 0], [[5.0, 1.0, -3.0], [6.0, 1.0, -9.0]])  # the logits moved by 44% of the range
    assert near_tie(wrong, reference, 1)[0] is False
    # Logits within the tolerance, but the reference preferred its token by more than it: not a tie.
    sharp = _generation([0, 1], [[5.0, 1.0, -3.0], [1.0, 100.0, 96.0]])
    far = _generation([0, 2], [[5.0, 1.0, -3.0], [1.0, 97.5, 98.5]])
    assert near_tie(far, sharp, 1) == (False, pytest.approx(0.025))


@pytest.mark.parametrize(("ours", "reference", "exact", "passed"), [
    (101.5, 100.0, None, False),  # fp32: 1.5% off the reference fails
    (100.5, 100.0, None, True),
    (101.0, 102.5, 100.0, True),  # bf16, H100's repeated-token case: 1.5% off the reference, closer to fp32
    (104.0, 102.5, 100.0, False),  # farther from fp32 than the reference and 1.5% off it
    (97.0, 102.5, 100.0, False),  # as far the other way
    (float("nan"), 100.0, 100.0, False),
], ids=["fp32-off", "fp32-near", "bf16-closer-to-fp32", "bf16-farther", "bf16-farther-below", "nan"])
def test_perplexity_rule(ours: float, reference: float, exact: float | None, passed: bool) -> None:
    from polykernels.suites.qwen_generation import _perplexity_case

    case = _perplexity_case("case", "", ours, reference, exact)
    assert case.passed is passed, case.detail
    assert ("from fp32's" in case.detail) is (exact is not None)


@pytest.mark.cpu_only
def test_the_fp32_runs_yardstick_is_the_fp32_models_own_perplexity() -> None:
    # The bf16 cases' yardstick: the fp32 run's reference perplexities, the same weights as the bf16 model's in
    # fp32 through the model's own op (on the CPU the model's op is that op).
    from polykernels.suites.qwen_generation import FAMILIES, REPEATED_TOKEN, TEXT_LENGTH, build_model, run_precision

    cpu = torch.device("cpu")
    _, yardstick = run_precision(FAMILIES[0], cpu, torch.float32)
    text = torch.randint(3, 99, (1, TEXT_LENGTH), generator=torch.Generator().manual_seed(7))
    repeated = torch.full((1, TEXT_LENGTH), REPEATED_TOKEN)
    with torch.no_grad():
        fp32, bf16 = (math.exp(float(build_model(cpu, dtype, "qwen3_next")(text, labels=text).loss))
                      for dtype in (torch.float32, torch.bfloat16))
        slow = math.exp(float(build_model(cpu, torch.float32, "qwen3_next", slow_decay=True)(
            repeated, labels=repeated).loss))
    assert yardstick.text == pytest.approx(fp32, rel=1e-6) and yardstick.text != bf16
    assert yardstick.repeated_token == pytest.approx(slow, rel=1e-6)
