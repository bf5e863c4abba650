"""Public FLUX norm ops: argument checks, the guard, the launch; registered as torch triton ops.

Eager GPU calls launch the kernel directly: the first call of a class (shapes, strides, dtypes,
devices, alignments, eps) runs the checks and the guard and keeps its launch plan; later calls of
the class read those facts once and launch. Under torch.compile the public functions call the
``torch.library.triton_op`` registrations, whose bodies launch through ``wrap_triton`` so the
compiler sees the kernel itself.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import NamedTuple

import torch

from polykernels import platform
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


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < float("inf"):
        raise ValueError(f"eps must be a finite positive number, got {eps!r}")
    return float(eps)


def _check_modulation(mod: object, name: str, x: torch.Tensor) -> tuple[int, int]:
    """Checks a [B, D], [B, 1, D] or [B, L, D] modulation; returns its (batch, token) strides.

    A per-sample modulation is read with a token stride of 0, without making a view.
    """
    if not isinstance(mod, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mod).__name__}")
    batch, tokens, dim = x.shape
    if mod.dtype is not x.dtype and mod.dtype is not torch.float32:
        raise TypeError(f"{name} must be {x.dtype} (like x) or float32, got {mod.dtype}")
    if mod.device != x.device:
        raise ValueError(f"{name} is on {mod.device} but x is on {x.device}")
    shape = mod.shape
    if mod.dim() == 2:
        per_token = False
        ok = shape[0] == batch and shape[1] == dim
    else:
        per_token = mod.dim() == 3 and shape[1] == tokens and tokens > 1
        ok = mod.dim() == 3 and shape[0] == batch and shape[2] == dim and shape[1] in (1, tokens)
    if not ok:
        raise ValueError(
            f"{name} must be [B, D], [B, 1, D] or [B, L, D] = [{batch}, {tokens}, {dim}] for x of shape "
            f"{tuple(x.shape)}, got {tuple(mod.shape)}"
        )
    if mod.stride(-1) != 1 and dim > 1:
        raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got strides {mod.stride()}")
    return mod.stride(0), mod.stride(1) if per_token else 0


def _check_weight(weight: object, name: str, dim: int, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 1 or weight.shape[0] != dim:
        raise ValueError(f"{name} must have shape ({dim},) to match the last dimension, got {tuple(weight.shape)}")
    if weight.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a float tensor, got {weight.dtype}")
    if weight.device != like.device:
        raise ValueError(f"{name} is on {weight.device} but the input is on {like.device}")
    return weight if weight.is_contiguous() else weight.contiguous()


class _Plan(NamedTuple):
    """One launch worked out for a class of call: the grid, the constexprs and options, the
    integer arguments, the launcher's spec_key (``_spec_id``) and the GPU the tensors live on
    (part of the class: the launch goes there whatever GPU is current)."""

    grid: tuple[int, int]
    meta: dict[str, object]
    ints: tuple[int, ...]
    spec: int
    device: int


# A launcher's spec_key as a small number (hashed on every launch): one per distinct key tuple.
_spec_ids: dict[tuple, int] = {}


def _spec_id(spec: tuple) -> int:
    return _spec_ids.setdefault(spec, len(_spec_ids))


# Eager GPU calls by class (``_modulated_class``, ``_heads_class``): the checks passed and this is
# the plan. Bounded: a server sees many sequence lengths. ``forget_plans`` after editing a launch table.
_eager_plans: dict[tuple, _Plan] = {}
_MAX_PLANS = 512


def forget_plans() -> None:
    """Drops every cached launch plan and kept launch (a sweep that edits kernels' launch tables
    calls this): the launchers key their compiled kernels by class of call, not by the tables."""
    _eager_plans.clear()
    _norm_launch.cache_clear()
    _launchers.cache_clear()


def _remember(key: tuple | None, plan: _Plan) -> None:
    if key is None:
        return
    if len(_eager_plans) >= _MAX_PLANS:
        _eager_plans.clear()
    _eager_plans[key] = plan


def _modulated_class(x: object, weight: object, shift: object, scale: object, eps: object) -> tuple | None:
    """Every fact a modulated norm's checks, guard and launch follow from (each tensor's shape,
    strides, dtype, device and 16-byte alignment, eps, the guard's inputs), or None for calls that
    take the checked path every time (not eager on a GPU, or an argument of another type)."""
    if (type(eps) is not float or not isinstance(x, torch.Tensor) or not isinstance(shift, torch.Tensor)
            or not isinstance(scale, torch.Tensor) or not _eager_gpu(x)):
        return None
    key = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15, shift.shape, shift.stride(), shift.dtype,
           shift.device, shift.data_ptr() & 15, scale.shape, scale.stride(), scale.dtype, scale.device,
           scale.data_ptr() & 15, eps, guards.preference(), platform.current())
    if weight is None:
        return key
    if not isinstance(weight, torch.Tensor):
        return None
    return (*key, weight.shape, weight.stride(), weight.dtype, weight.device, weight.data_ptr() & 15)


def _heads_class(op: str, q: object, k: object, weight_q: object, weight_k: object, eps: object) -> tuple | None:
    """``_modulated_class`` of the per-head norms (head_rmsnorm passes x as q and k): a tensor
    passed twice is read once."""
    if (type(eps) is not float or not isinstance(q, torch.Tensor) or not isinstance(weight_q, torch.Tensor)
            or not _eager_gpu(q)):
        return None
    key = (op, q.shape, q.stride(), q.dtype, q.device, q.data_ptr() & 15, weight_q.shape, weight_q.stride(),
           weight_q.dtype, weight_q.device, weight_q.data_ptr() & 15, eps, guards.preference(), platform.current())
    if k is not q:
        if not isinstance(k, torch.Tensor):
            return None
        key = (*key, k.shape, k.stride(), k.dtype, k.device, k.data_ptr() & 15)
    if weight_k is not weight_q:
        if not isinstance(weight_k, torch.Tensor):
            return None
        key = (*key, None, weight_k.shape, weight_k.stride(), weight_k.dtype, weight_k.device, weight_k.data_ptr() & 15)
    return key


@functools.cache
def _launchers() -> SimpleNamespace:
    from polykernels._launch import Launcher
    from polykernels.norm import kernels

    return SimpleNamespace(norm=Launcher(kernels.norm_modulate_kernel), qk=Launcher(kernels.qk_rmsnorm_kernel))


def _norm_meta(x: torch.Tensor, weight: torch.Tensor | None, strides: tuple[int, int, int, int], exact: bool,
               stats: bool) -> tuple[tuple[int, int], dict[str, object]]:
    """The grid and constexprs of the modulated norms: (programs, samples) when the modulation is
    per sample (each program then loads it once), else (programs, 1) over all rows."""
    per_sample = strides[1] == 0 and strides[3] == 0
    return _norm_launch(x.shape, x.device, weight is not None, per_sample, exact, stats)


# Per class of call (computing it costs more host time than the launch); bounded, since a server
# sees many sequence lengths. A sweep that edits the launch tables clears it.
@functools.lru_cache(maxsize=256)
def _norm_launch(shape: torch.Size, device: torch.device, rms: bool, per_sample: bool, exact: bool,
                 stats: bool) -> tuple[tuple[int, int], dict[str, object]]:
    from polykernels.norm.kernels import modulated_launch_config, register_cap

    batch, tokens, dim = shape
    block = _next_power_of_2(dim)
    rows_per_block, num_warps, programs, stages = modulated_launch_config(block, batch * tokens,
                                                                      platform.sm_count(device))
    per_sample = per_sample and batch <= _MAX_GRID_Y
    span = tokens if per_sample else batch * tokens
    blocks = -(-span // rows_per_block)
    if programs:
        blocks = min(blocks, -(-programs // batch) if per_sample else programs)
    return (blocks, batch if per_sample else 1), {
        "BLOCK_D": block, "ROWS": rows_per_block, "IS_RMS": rms, "EXACT_PTX": exact,
        "PER_SAMPLE": per_sample, "STORE_STATS": stats, "STAGES": stages, "num_warps": num_warps, "num_stages": 1,
        **register_cap(num_warps, platform.backend()),
    }


# Grid axis 1 holds the samples of a per-sample modulation (CUDA's limit for that axis).
_MAX_GRID_Y = 65535


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _launch_norm(
    x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor, scale: torch.Tensor, eps: float, exact: bool,
    stats: bool = False, strides: tuple[int, int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Runs the Triton row kernel; returns (y, mean, rstd), the statistics only when asked (mean is 0 for RMS).

    ``strides``: the modulation strides when the caller has checked shift and scale already."""
    if strides is None:
        strides = (*_check_modulation(shift, "shift", x), *_check_modulation(scale, "scale", x))
    if not stats:
        return _run_norm(_norm_plan(x, weight, shift, scale, strides, exact), x, weight, shift, scale, eps), None, None
    grid, meta = _norm_meta(x, weight, strides, exact, stats)
    rows = x.shape[0] * x.shape[1]
    y = torch.empty_like(x)
    mean = torch.empty(rows, device=x.device, dtype=torch.float32)
    rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
    args = (x, y, weight if weight is not None else x, shift, scale, mean, rstd, rows, x.shape[1], x.shape[2],
            *strides, eps)
    _launchers().norm(grid, args, meta, spec_key=_norm_spec_key(x, weight, shift, scale, strides, exact, stats),
                      device=x.get_device())
    return y, mean, rstd


def _norm_plan(x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor, scale: torch.Tensor,
               strides: tuple[int, int, int, int], exact: bool) -> _Plan:
    """The launch of a modulated norm without statistics (what every public call runs)."""
    grid, meta = _norm_meta(x, weight, strides, exact, False)
    return _Plan(grid, meta, (x.shape[0] * x.shape[1], x.shape[1], x.shape[2], *strides),
                 _spec_id(_norm_spec_key(x, weight, shift, scale, strides, exact, False)), x.get_device())


def _run_norm(plan: _Plan, x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor, scale: torch.Tensor,
              eps: float) -> torch.Tensor:
    y = torch.empty_like(x)
    args = (x, y, weight if weight is not None else x, shift, scale, y, y, *plan.ints, eps)
    _launchers().norm(plan.grid, args, plan.meta, spec_key=plan.spec, device=plan.device)
    return y


def _norm_spec_key(x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor, scale: torch.Tensor,
                   strides: tuple[int, int, int, int], exact: bool, stats: bool) -> tuple:
    """What the norm kernel's specialization and launch follow from (the launcher's spec_key): the
    shape and strides give every integer argument, then the dtypes and each input's 16-byte
    alignment (the outputs are fresh allocations, aligned)."""
    if weight is None:
        return (x.shape, strides, x.dtype, shift.dtype, scale.dtype, x.data_ptr() & 15, shift.data_ptr() & 15,
                scale.data_ptr() & 15, exact, stats)
    return (x.shape, strides, x.dtype, shift.dtype, scale.dtype, x.data_ptr() & 15, shift.data_ptr() & 15,
            scale.data_ptr() & 15, exact, stats, weight.dtype, weight.data_ptr() & 15)


# (device index, dtype, exact epilogue wanted, preference) -> path: the guard runs once per class
# of call, not per call (it reads the platform and looks for triton).
_path_cache: dict[tuple, str] = {}


def _gpu_path(x: torch.Tensor, exact_epilogue: bool) -> str:
    key = (x.device.index, x.dtype, exact_epilogue, guards.preference(), platform.current())
    path = _path_cache.get(key)
    if path is None:
        path = _path_cache[key] = guards.choose("cuda", x.dtype, True, exact_epilogue=exact_epilogue).path
    return path


@torch.library.triton_op("polykernels::layernorm_modulate", mutates_args=())
def _layernorm_modulate_op(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return _norm_modulate_traced(x, None, shift, scale, eps)


@torch.library.triton_op("polykernels::rmsnorm_scale_shift", mutates_args=())
def _rmsnorm_scale_shift_op(
    x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float
) -> torch.Tensor:
    return _norm_modulate_traced(x, weight, shift, scale, eps)


def _norm_modulate_traced(
    x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor, scale: torch.Tensor, eps: float
) -> torch.Tensor:
    """The triton_op body: torch.compile sees the kernel launch itself (wrap_triton)."""
    path = guards.choose(x.device.type, x.dtype, True).path
    if path == "torch":
        if weight is None:
            return reference.layernorm_modulate_reference(x, shift, scale, eps)
        return reference.rmsnorm_scale_shift_reference(x, weight, shift, scale, eps)
    from polykernels.norm.kernels import norm_modulate_kernel

    strides = (*_check_modulation(shift, "shift", x), *_check_modulation(scale, "scale", x))
    grid, meta = _norm_meta(x, weight, strides, path == "ptx", False)
    # torch.compile's wrapper of user kernels takes num_warps and num_stages as launch options but
    # would pass maxnreg to the kernel as an argument: the traced launch goes without the cap.
    meta = {name: value for name, value in meta.items() if name != "maxnreg"}
    y = torch.empty_like(x)
    rows = x.shape[0] * x.shape[1]
    torch.library.wrap_triton(norm_modulate_kernel)[grid](
        x, y, weight if weight is not None else x, shift, scale, y, y, rows, x.shape[1], x.shape[2], *strides, eps,
        **meta,
    )
    return y


@torch.library.triton_op("polykernels::qk_rmsnorm", mutates_args=())
def _qk_rmsnorm_op(
    q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if guards.choose(q.device.type, q.dtype, True, exact_epilogue=False).path == "torch":
        return reference.qk_rmsnorm_reference(q, k, weight_q, weight_k, eps)
    return _launch_qk(q, k, weight_q, weight_k, eps, only_q=False, traced=True)


@torch.library.triton_op("polykernels::head_rmsnorm", mutates_args=())
def _head_rmsnorm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if guards.choose(x.device.type, x.dtype, True, exact_epilogue=False).path == "torch":
        return reference.rmsnorm_reference(x, weight, eps)
    return _launch_qk(x, x, weight, weight, eps, only_q=True, traced=True)[0]


def launch_qk_rmsnorm(
    q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float,
    only_q: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_qk(q, k, weight_q, weight_k, eps, only_q=only_q, traced=False)


def _launch_qk(
    q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float, *, only_q: bool,
    traced: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    plan = _qk_plan(q, k, weight_q, weight_k, only_q)
    if not traced:
        return _run_qk(plan, q, k, weight_q, weight_k, eps, only_q)
    from polykernels.norm.kernels import qk_rmsnorm_kernel

    q_out = torch.empty_like(q)
    k_out = q_out if only_q else torch.empty_like(k)
    torch.library.wrap_triton(qk_rmsnorm_kernel)[plan.grid](q, k, weight_q, weight_k, q_out, k_out, *plan.ints, eps,
                                                            **plan.meta)
    return q_out, k_out


def _qk_plan(q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor,
             only_q: bool) -> _Plan:
    from polykernels.norm.kernels import launch_config

    head_dim = q.shape[-1]
    q_rows, k_rows = q.numel() // head_dim, k.numel() // head_dim
    block = _next_power_of_2(head_dim)
    rows_per_program, num_warps = launch_config(block)
    # Axis 1 = 2 normalizes q and k in one launch; 1 normalizes q alone.
    grid = (-(-max(q_rows, k_rows) // rows_per_program), 1 if only_q else 2)
    meta = {"ROWS": rows_per_program, "BLOCK_D": block, "num_warps": num_warps, "num_stages": 1}
    # The shapes give every integer argument; the outputs are fresh allocations (aligned).
    spec = (q.shape, k.shape, q.dtype, k.dtype, weight_q.dtype, weight_k.dtype, q.data_ptr() & 15,
            k.data_ptr() & 15, weight_q.data_ptr() & 15, weight_k.data_ptr() & 15, only_q)
    return _Plan(grid, meta, (q_rows, k_rows, head_dim), _spec_id(spec), q.get_device())


def _run_qk(plan: _Plan, q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor,
            eps: float, only_q: bool) -> tuple[torch.Tensor, torch.Tensor]:
    q_out = torch.empty_like(q)
    k_out = q_out if only_q else torch.empty_like(k)
    _launchers().qk(plan.grid, (q, k, weight_q, weight_k, q_out, k_out, *plan.ints, eps), plan.meta,
                    spec_key=plan.spec, device=plan.device)
    return q_out, k_out


def _eager_gpu(x: torch.Tensor) -> bool:
    """GPU tensors in eager mode go straight to the launch: the op's dispatch costs more than the kernel."""
    return x.is_cuda and not torch.compiler.is_compiling()


def layernorm_modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm without affine, then ``* (1 + scale) + shift`` (FLUX's AdaLayerNorm), fused.

    Args:
        x: ``[B, L, D]`` bf16/fp16/fp32, contiguous, D <= 16384.
        shift, scale: ``[B, D]`` or ``[B, 1, D]`` (per sample; may be strided views of one
            chunked projection, last dim contiguous) or ``[B, L, D]`` (per token); x's dtype or fp32.
        eps: added to the variance; a finite positive number.

    Statistics are fp32; the result is ``[B, L, D]`` in x's dtype, rounded once.
    """
    key = _modulated_class(x, None, shift, scale, eps)
    plan = _eager_plans.get(key)  # never holds None: a call without a class takes the checked path
    if plan is not None:
        return _run_norm(plan, x, None, shift, scale, eps)
    x = _check_x(x)
    return _norm_modulate(x, None, shift, scale, _check_eps(eps), key)


def rmsnorm_scale_shift(
    x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """``(x * rsqrt(mean(x^2) + eps) * weight) * (1 + scale) + shift``, fused; shapes as layernorm_modulate."""
    key = _modulated_class(x, weight, shift, scale, eps)
    plan = _eager_plans.get(key)
    if plan is not None:
        return _run_norm(plan, x, weight, shift, scale, eps)
    x = _check_x(x)
    eps = _check_eps(eps)
    checked = _check_weight(weight, "weight", x.shape[-1], x)
    # A weight that needed a copy is a new tensor on every call: no plan for it.
    return _norm_modulate(x, checked, shift, scale, eps, key if checked is weight else None)


def _norm_modulate(
    x: torch.Tensor, weight: torch.Tensor | None, shift: torch.Tensor, scale: torch.Tensor, eps: float,
    key: tuple | None,
) -> torch.Tensor:
    """The two modulated norms after their own checks: LayerNorm when ``weight`` is None, else RMSNorm.
    ``key``: the call's class, under which an eager GPU call keeps its plan."""
    strides = (*_check_modulation(shift, "shift", x), *_check_modulation(scale, "scale", x))
    if _eager_gpu(x):
        path = _gpu_path(x, exact_epilogue=True)
        if path != "torch":
            plan = _norm_plan(x, weight, shift, scale, strides, exact=path == "ptx")
            _remember(key, plan)
            return _run_norm(plan, x, weight, shift, scale, eps)
    if weight is None:
        return _layernorm_modulate_op(x, shift, scale, eps)
    return _rmsnorm_scale_shift_op(x, weight, shift, scale, eps)


def head_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-head RMSNorm with weight of one ``[B, L, heads, head_dim]`` tensor (a torch.nn.RMSNorm over head_dim)."""
    key = _heads_class("head", x, x, weight, weight, eps)
    plan = _eager_plans.get(key)
    if plan is not None:
        return _run_qk(plan, x, x, weight, weight, eps, only_q=True)[0]
    x = _check_x(x, "x", dims=4)
    eps = _check_eps(eps)
    checked = _check_weight(weight, "weight", x.shape[-1], x)
    if _eager_gpu(x) and _gpu_path(x, exact_epilogue=False) != "torch":
        plan = _qk_plan(x, x, checked, checked, only_q=True)
        _remember(key if checked is weight else None, plan)
        return _run_qk(plan, x, x, checked, checked, eps, only_q=True)[0]
    return _head_rmsnorm_op(x, checked, eps)


def qk_rmsnorm(
    q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm with weight of q and k ``[B, L, heads, head_dim]`` in one launch."""
    key = _heads_class("qk", q, k, weight_q, weight_k, eps)
    plan = _eager_plans.get(key)
    if plan is not None:
        return _run_qk(plan, q, k, weight_q, weight_k, eps, only_q=False)
    q, k = _check_x(q, "q", dims=4), _check_x(k, "k", dims=4)
    eps = _check_eps(eps)
    if q.shape[-1] != k.shape[-1] or q.dtype != k.dtype or q.device != k.device:
        raise ValueError(
            f"q and k must share head_dim, dtype and device; got {tuple(q.shape)} {q.dtype} {q.device} "
            f"and {tuple(k.shape)} {k.dtype} {k.device}"
        )
    checked_q = _check_weight(weight_q, "weight_q", q.shape[-1], q)
    checked_k = _check_weight(weight_k, "weight_k", k.shape[-1], k)
    if _eager_gpu(q) and _gpu_path(q, exact_epilogue=False) != "torch":
        plan = _qk_plan(q, k, checked_q, checked_k, only_q=False)
        _remember(key if checked_q is weight_q and checked_k is weight_k else None, plan)
        return _run_qk(plan, q, k, checked_q, checked_k, eps, only_q=False)
    return _qk_rmsnorm_op(q, k, checked_q, checked_k, eps)
