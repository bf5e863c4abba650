"""Public FLUX norm ops: argument checks, the guard, the launch; registered as torch custom ops."""

from __future__ import annotations

import torch

from polykernels.norm import guards, reference
from polykernels.norm.guards import MAX_D

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _check_x(x: object, name: str = "x", dims: int = 3) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}); nothing to normalize")
    if x.shape[-1] > MAX_D:
        raise ValueError(f"{name}'s last dimension must be at most {MAX_D}, got {x.shape[-1]}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {x.stride()}); call .contiguous() first")
    return x


def _check_modulation(mod: object, name: str, x: torch.Tensor) -> torch.Tensor:
    """Returns ``mod`` as a [B, 1 or L, D] view; accepts [B, D], [B, 1, D], [B, L, D]."""
    if not isinstance(mod, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mod).__name__}")
    batch, tokens, dim = x.shape
    if mod.dtype not in (x.dtype, torch.float32):
        raise TypeError(f"{name} must be {x.dtype} (like x) or float32, got {mod.dtype}")
    if mod.device != x.device:
        raise ValueError(f"{name} is on {mod.device} but x is on {x.device}")
    view = mod[:, None, :] if mod.dim() == 2 else mod
    if view.dim() != 3 or view.shape[0] != batch or view.shape[2] != dim or view.shape[1] not in (1, tokens):
        raise ValueError(
            f"{name} must be [B, D], [B, 1, D] or [B, L, D] = [{batch}, {tokens}, {dim}] for x of shape "
            f"{tuple(x.shape)}, got {tuple(mod.shape)}"
        )
    if view.stride(2) != 1:
        raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got strides {mod.stride()}")
    return view


def _check_weight(weight: object, name: str, dim: int, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    if weight.shape != (dim,):
        raise ValueError(f"{name} must have shape ({dim},) to match the last dimension, got {tuple(weight.shape)}")
    if weight.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a float tensor, got {weight.dtype}")
    if weight.device != like.device:
        raise ValueError(f"{name} is on {weight.device} but the input is on {like.device}")
    return weight.contiguous()


def _launch_norm(
    x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor, scale: torch.Tensor, eps: float, exact: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs the Triton row kernel; returns (y, mean, rstd) (mean is 0 for RMS)."""
    import triton

    from polykernels.norm.kernels import launch_config, norm_modulate_kernel

    batch, tokens, dim = x.shape

    def strides(mod: torch.Tensor) -> tuple[int, int]:
        view = mod if mod.dim() == 3 else mod[:, None]
        # A per-sample modulation ([B, 1, D]) is read with a token stride of 0.
        return view.stride(0), view.stride(1) if view.shape[1] == tokens and tokens > 1 else 0

    y = torch.empty_like(x)
    rows = batch * tokens
    mean = torch.empty(rows, device=x.device, dtype=torch.float32)
    rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
    block = triton.next_power_of_2(dim)
    norm_modulate_kernel[(rows,)](
        x, y, weight if weight is not None else x, shift, scale, mean, rstd,
        tokens, dim, *strides(shift), *strides(scale), eps,
        BLOCK_D=block, IS_RMS=weight is not None, EXACT_PTX=exact, num_warps=launch_config(block),
    )
    return y, mean, rstd


@torch.library.custom_op("polykernels::layernorm_modulate", mutates_args=())
def _layernorm_modulate_op(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    choice = guards.choose(x.device.type, x.dtype, x.is_contiguous())
    if choice.path == "torch":
        return reference.layernorm_modulate_reference(x, shift, scale, eps)
    return _launch_norm(x, None, shift, scale, eps, exact=choice.path == "ptx")[0]


@_layernorm_modulate_op.register_fake
def _(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("polykernels::rmsnorm_scale_shift", mutates_args=())
def _rmsnorm_scale_shift_op(
    x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float
) -> torch.Tensor:
    choice = guards.choose(x.device.type, x.dtype, x.is_contiguous())
    if choice.path == "torch":
        return reference.rmsnorm_scale_shift_reference(x, weight, shift, scale, eps)
    return _launch_norm(x, weight, shift, scale, eps, exact=choice.path == "ptx")[0]


@_rmsnorm_scale_shift_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("polykernels::qk_rmsnorm", mutates_args=())
def _qk_rmsnorm_op(
    q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    choice = guards.choose(q.device.type, q.dtype, True, exact_epilogue=False)
    if choice.path == "torch":
        return reference.qk_rmsnorm_reference(q, k, weight_q, weight_k, eps)
    return launch_qk_rmsnorm(q, k, weight_q, weight_k, eps)


@_qk_rmsnorm_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float) -> tuple:
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("polykernels::head_rmsnorm", mutates_args=())
def _head_rmsnorm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    choice = guards.choose(x.device.type, x.dtype, True, exact_epilogue=False)
    if choice.path == "torch":
        return reference.rmsnorm_reference(x, weight, eps)
    return launch_qk_rmsnorm(x, x, weight, weight, eps, only_q=True)[0]


@_head_rmsnorm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


def launch_qk_rmsnorm(
    q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float,
    only_q: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    import triton

    from polykernels.norm.kernels import qk_rmsnorm_kernel

    head_dim = q.shape[-1]
    q_out = torch.empty_like(q)
    k_out = q_out if only_q else torch.empty_like(k)
    q_rows, k_rows = q.numel() // head_dim, k.numel() // head_dim
    block = triton.next_power_of_2(head_dim)
    rows_per_program = max(1, min(16, 2048 // block))
    # Axis 1 = 2 normalizes q and k in one launch; 1 normalizes q alone.
    grid = (triton.cdiv(max(q_rows, k_rows), rows_per_program), 1 if only_q else 2)
    qk_rmsnorm_kernel[grid](q, k, weight_q, weight_k, q_out, k_out, q_rows, k_rows, head_dim, eps,
                            ROWS=rows_per_program, BLOCK_D=block, num_warps=4)
    return q_out, k_out


def layernorm_modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm without affine, then ``* (1 + scale) + shift`` (FLUX's AdaLayerNorm), fused.

    Args:
        x: ``[B, L, D]`` bf16/fp16/fp32, contiguous, D <= 16384.
        shift, scale: ``[B, D]`` or ``[B, 1, D]`` (per sample; may be strided views of one
            chunked projection, last dim contiguous) or ``[B, L, D]`` (per token); x's dtype or fp32.
        eps: added to the variance.

    Statistics are fp32; the result is ``[B, L, D]`` in x's dtype, rounded once.
    """
    x = _check_x(x)
    shift, scale = _check_modulation(shift, "shift", x), _check_modulation(scale, "scale", x)
    return _layernorm_modulate_op(x, shift, scale, float(eps))


def rmsnorm_scale_shift(
    x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """``(x * rsqrt(mean(x^2) + eps) * weight) * (1 + scale) + shift``, fused; shapes as layernorm_modulate."""
    x = _check_x(x)
    weight = _check_weight(weight, "weight", x.shape[-1], x)
    shift, scale = _check_modulation(shift, "shift", x), _check_modulation(scale, "scale", x)
    return _rmsnorm_scale_shift_op(x, weight, shift, scale, float(eps))


def head_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-head RMSNorm with weight of one ``[B, L, heads, head_dim]`` tensor (a torch.nn.RMSNorm over head_dim)."""
    x = _check_x(x, "x", dims=4)
    return _head_rmsnorm_op(x, _check_weight(weight, "weight", x.shape[-1], x), float(eps))


def qk_rmsnorm(
    q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm with weight of q and k ``[B, L, heads, head_dim]`` in one launch."""
    q, k = _check_x(q, "q", dims=4), _check_x(k, "k", dims=4)
    if q.shape[-1] != k.shape[-1] or q.dtype != k.dtype or q.device != k.device:
        raise ValueError(
            f"q and k must share head_dim, dtype and device; got {tuple(q.shape)} {q.dtype} {q.device} "
            f"and {tuple(k.shape)} {k.dtype} {k.device}"
        )
    weight_q = _check_weight(weight_q, "weight_q", q.shape[-1], q)
    weight_k = _check_weight(weight_k, "weight_k", k.shape[-1], k)
    return _qk_rmsnorm_op(q, k, weight_q, weight_k, float(eps))
