from __future__ import annotations

import pytest
import torch


def test_qwen3_next_patch_swaps_and_restores() -> None:
    from transformers.models.qwen3_next import modeling_qwen3_next as modeling

    from polykernels.integrations.transformers import apply_to_qwen3_next, polykernels_gated_delta_rule

    original = modeling.torch_chunk_gated_delta_rule
    with apply_to_qwen3_next() as patch:
        assert modeling.torch_chunk_gated_delta_rule is polykernels_gated_delta_rule
        assert modeling.torch_recurrent_gated_delta_rule is polykernels_gated_delta_rule
        assert len(patch.targets) == 2
    assert modeling.torch_chunk_gated_delta_rule is original


def test_qwen3_next_model_really_calls_the_op() -> None:
    from polykernels.integrations.transformers import apply_to_qwen3_next
    from polykernels.suites.qwen_generation import build_model

    model = build_model(torch.device("cpu"), torch.float32)
    calls = []

    def spy(*args, **kwargs):
        from polykernels.integrations.transformers import polykernels_gated_delta_rule

        calls.append(args[0].shape)
        return polykernels_gated_delta_rule(*args, **kwargs)

    with apply_to_qwen3_next(model, implementation=spy), torch.no_grad():
        model(torch.randint(3, 90, (1, 70)))
    assert calls and calls[0][1] == 70  # the prefill went through the swapped op


def test_qwen3_next_rejects_other_models_and_unknown_options() -> None:
    from polykernels.integrations.transformers import apply_to_qwen3_next

    class NotQwen(torch.nn.Module):
        config = type("Config", (), {"model_type": "llama"})()

    with pytest.raises(ValueError, match=r"unsupported model type 'llama'; supported: \['qwen3_next'\]"):
        apply_to_qwen3_next(NotQwen())
    with pytest.raises(TypeError):
        apply_to_qwen3_next(norms=True)  # type: ignore[call-arg]


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
