"""Put polykernels' gated delta rule into transformers' Qwen3-Next and Qwen3.5 (dense and MoE).

The three families call the same op the same way: transformers 5.x calls the module globals
``torch_chunk_gated_delta_rule`` (prefill) and ``torch_recurrent_gated_delta_rule`` (one-token
decode) of each family's modeling module, wrapped by a hub-kernel decorator that silently prefers
FLA when FLA is installed; older versions keep the op as the instance attribute
``linear_attn.chunk_gated_delta_rule``. Both are swapped, and ``Patch.restore()`` puts the
originals back. Each family has its own copy of the globals, so patching one leaves the others alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from polykernels.integrations._patching import Patch

# config.model_type -> the modeling module that holds the op. The ``*_text`` types are the
# configs of the text-only ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``.
SUPPORTED_MODEL_TYPES = {
    "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    "qwen3_5": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_text": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_moe": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "qwen3_5_moe_text": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
}
_OP_GLOBALS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


def polykernels_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' calling convention over `polykernels.gated_delta_rule.chunk_gated_delta_rule`.

    ``**unused`` takes the attention kwargs transformers forwards to every op (position ids,
    flash-attention sequence lengths other than ``cu_seqlens``); the op has no use for them.
    """
    from polykernels.gated_delta_rule import chunk_gated_delta_rule

    if chunk_size != 64:
        raise ValueError(f"polykernels' gated delta rule uses chunk_size 64, the model asked for {chunk_size}")
    value = value.contiguous()
    return chunk_gated_delta_rule(
        query.contiguous(), key.contiguous().to(query.dtype), value.to(query.dtype), g.contiguous(),
        beta.contiguous(), initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )


def _check_model_type(model_type: object) -> str:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model type {model_type!r}; supported: {sorted(SUPPORTED_MODEL_TYPES)}")
    return model_type  # type: ignore[return-value]


def model_module(model_type: str = "qwen3_next") -> Any:
    """The transformers modeling module whose op globals `apply_to_qwen` swaps for ``model_type``."""
    return importlib.import_module(SUPPORTED_MODEL_TYPES[_check_model_type(model_type)])


def reference_implementation(model_type: str = "qwen3_next") -> Callable[..., Any]:
    """The model's own pure-torch op, unwrapped from the hub-kernel decorator (never FLA)."""
    op = model_module(model_type).torch_chunk_gated_delta_rule
    return getattr(op, "__wrapped__", op)


def apply_to_qwen(
    model: torch.nn.Module | None = None,
    *,
    model_type: str | None = None,
    gated_delta_rule: bool = True,
    implementation: Callable[..., Any] | None = None,
) -> Patch:
    """Route a Qwen3-Next or Qwen3.5 model's gated delta rule (prefill and decode) through polykernels.

    Args:
        model: a model instance; its family is read from ``model.config.model_type``, and its layers
            that hold the op as an attribute (older transformers) are patched too.
        model_type: the family to patch before a model exists (one of ``SUPPORTED_MODEL_TYPES``); with
            ``model`` it must agree with the model's own type.
        gated_delta_rule: swap the gated delta rule (the one op this integration covers today).
        implementation: what to install instead of polykernels' op (e.g. the reference, for A/B runs).

    Returns: a `Patch`; call ``.restore()`` (or use it as a context manager) to undo.
    """
    if model is not None:
        found = _check_model_type(getattr(getattr(model, "config", None), "model_type", None))
        if model_type is not None and _check_model_type(model_type) != found:
            raise ValueError(f"model_type={model_type!r} but the model's config says {found!r}")
        model_type = found
    elif model_type is None:
        raise ValueError(f"pass a model or a model_type; supported: {sorted(SUPPORTED_MODEL_TYPES)}")
    module = model_module(model_type)
    patch = Patch(f"polykernels -> transformers {model_type}")
    if not gated_delta_rule:
        return patch
    op = implementation or polykernels_gated_delta_rule
    for name in _OP_GLOBALS:
        if hasattr(module, name):
            patch.set(module, name, op, f"{module.__name__}.{name}")
    if model is not None:
        for layer_name, layer in model.named_modules():
            if "chunk_gated_delta_rule" in vars(layer) or hasattr(type(layer), "chunk_gated_delta_rule"):
                patch.set(layer, "chunk_gated_delta_rule", op, f"{layer_name}.chunk_gated_delta_rule")
    return patch


def apply_to_qwen3_next(
    model: torch.nn.Module | None = None,
    *,
    gated_delta_rule: bool = True,
    implementation: Callable[..., Any] | None = None,
) -> Patch:
    """`apply_to_qwen` for Qwen3-Next: a model of another family is refused."""
    return apply_to_qwen(model, model_type="qwen3_next", gated_delta_rule=gated_delta_rule,
                         implementation=implementation)
