"""Public chunked gated-delta-rule forward: argument checks, the path choice, the custom op (the
launch of the Triton kernels is launch.py's)."""

from __future__ import annotations

import functools
import math
import weakref

import torch

from polykernels import _programs, platform
from polykernels._launch import no_launch_hooks
from polykernels.gated_delta_rule import guards, launch
from polykernels.gated_delta_rule.launch import MAX_HEAD_DIM, MAX_VALUE_HEADS, launch_chunk_gated_delta_rule
from polykernels.gated_delta_rule.reference import chunk_gated_delta_rule_torch

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@torch.library.custom_op("polykernels::chunk_gated_delta_rule", mutates_args=())
def _chunk_gated_delta_rule_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm_in_kernel: bool,
    num_segments: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    o, final = _run(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                    num_segments)
    # A custom op cannot return None: an empty tensor stands for "no final state".
    return o, final if final is not None else q.new_empty(0, dtype=torch.float32)


@_chunk_gated_delta_rule_op.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,  # noqa: ANN001
      num_segments):  # noqa: ANN001
    num_seqs = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    o = v.new_empty(v.shape)
    if not output_final_state:
        return o, q.new_empty(0, dtype=torch.float32)
    return o, q.new_empty(num_seqs, v.shape[2], k.shape[3], v.shape[3], dtype=torch.float32)


def _run(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
    initial_state: torch.Tensor | None, output_final_state: bool, cu_seqlens: torch.Tensor | None,
    use_qk_l2norm_in_kernel: bool, num_segments: int | None, replay: tuple[list, list] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``replay``: the call's launch-program class (``_replay_class``), to record its launches under."""
    if _path(q.device.type, q.dtype, q.shape[-1]) == "triton":
        return launch_chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                             use_qk_l2norm_in_kernel, num_segments, replay=replay)
    return chunk_gated_delta_rule_torch(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                        use_qk_l2norm_in_kernel)


def _path(device_type: str, dtype: torch.dtype, key_dim: int) -> str:
    """guards.choose's path, decided once per (device type, platform, fp32 inputs or not, K)."""
    return _path_on(device_type, platform.current(), dtype == torch.float32, key_dim)


@functools.cache
def _path_on(device_type: str, seen: platform.Platform, fp32_inputs: bool, key_dim: int) -> str:
    return guards.choose(device_type, fp32_inputs, key_dim).path


def _check_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, num_segments: int | None,
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, H, K]; got q {tuple(q.shape)} and k {tuple(k.shape)}")
    batch, tokens, heads, key_dim = q.shape
    if v.dim() != 4 or v.shape[:2] != (batch, tokens):
        raise ValueError(f"v must be [B, T, HV, V] = [{batch}, {tokens}, HV, V], got {tuple(v.shape)}")
    value_heads, value_dim = v.shape[2], v.shape[3]
    if heads == 0 or value_heads % heads:
        raise ValueError(
            f"the value heads of v (HV={value_heads}) must be a multiple of the heads of q/k (H={heads})"
        )
    if not 0 < key_dim <= MAX_HEAD_DIM or not 0 < value_dim <= MAX_HEAD_DIM:
        raise ValueError(f"K ({key_dim}) and V ({value_dim}) must be between 1 and {MAX_HEAD_DIM}")
    if value_heads > MAX_VALUE_HEADS:
        raise ValueError(f"v has {value_heads} value heads (HV); at most {MAX_VALUE_HEADS} are supported")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (batch, tokens, value_heads):
            raise ValueError(f"{name} must be [B, T, HV] = [{batch}, {tokens}, {value_heads}], got {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if q.dtype not in _FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype of bf16/fp16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (got strides {t.stride()}); call .contiguous() first")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    num_seqs = batch
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (
            torch.int32, torch.int64
        ):
            raise TypeError("cu_seqlens must be a 1-D int32/int64 tensor of sequence boundaries")
        if batch != 1:
            raise ValueError(f"cu_seqlens requires B == 1 (sequences packed along T), got B = {batch}")
        if cu_seqlens.device != q.device:
            raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but q is on {q.device}")
        if cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must hold at least 2 boundaries, got {cu_seqlens.shape[0]}")
        _check_boundaries(cu_seqlens, tokens)
        num_seqs = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        expected = (num_seqs, value_heads, key_dim, value_dim)
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != expected:
            got = (tuple(initial_state.shape) if isinstance(initial_state, torch.Tensor)
                   else type(initial_state).__name__)
            raise ValueError(f"initial_state must be [N, HV, K, V] = {list(expected)}, got {got}")
        if initial_state.device != q.device:
            raise ValueError(f"initial_state is on {initial_state.device} but q is on {q.device}")
    if num_segments is not None and (isinstance(num_segments, bool) or not isinstance(num_segments, int)
                                     or num_segments < 1):
        raise ValueError(f"num_segments must be None or a positive int, got {num_segments!r}")


def _check_boundaries(cu_seqlens: torch.Tensor, tokens: int) -> None:
    """The values of cu_seqlens, where reading them is allowed, once per tensor and version.

    Reading them costs a device-to-host copy that waits for the GPU, which a CUDA graph cannot
    capture and torch.compile cannot trace: there the contract is the caller's (as in FLA and vLLM).
    Eagerly, the layers of one forward share one cu_seqlens: a tensor whose values passed and that
    torch has not seen written since (its version counter) is not read again. Inference tensors
    have no version counter and are read on every call.
    """
    if torch.compiler.is_compiling() or (cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    version = None if cu_seqlens.is_inference() else cu_seqlens._version
    seen = _checked_boundaries.get(id(cu_seqlens))
    if seen is not None and seen[0]() is cu_seqlens and seen[1:] == (version, tokens):
        return
    bounds = _boundaries_on_host(cu_seqlens)
    if bounds[0] != 0 or bounds[-1] != tokens:
        raise ValueError(f"cu_seqlens must start at 0 and end at T = {tokens}, got {bounds[:3]}...{bounds[-1:]}")
    if any(b > a for a, b in zip(bounds[1:], bounds[:-1], strict=True)):
        raise ValueError("cu_seqlens must be non-decreasing")
    if version is not None:
        _remember_checked(cu_seqlens, version, tokens)


def _boundaries_on_host(cu_seqlens: torch.Tensor) -> list[int]:
    """The op's one device-to-host read (it waits for the GPU's queue to drain)."""
    return cu_seqlens.tolist()


# id(cu_seqlens) -> (a weak reference to it, the version and T its values passed at). The weak
# reference tells a tensor that reuses a dead one's id from the checked one. A few per forward.
_checked_boundaries: dict[int, tuple[weakref.ref, int, int]] = {}
_MAX_CHECKED = 64


def _remember_checked(cu_seqlens: torch.Tensor, version: int, tokens: int) -> None:
    if len(_checked_boundaries) >= _MAX_CHECKED:
        _checked_boundaries.clear()
    key = id(cu_seqlens)
    _checked_boundaries[key] = (weakref.ref(cu_seqlens, lambda _: _checked_boundaries.pop(key, None)), version,
                                tokens)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    num_segments: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule forward (Qwen3-Next / Qwen3.5 linear attention).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]`` with ``HV % H == 0`` (value head i reads
            key head ``i // (HV // H)``); one dtype of bf16/fp16/fp32; K, V <= 256.
        g: ``[B, T, HV]`` log-space gates, computed in fp32. They must be <= 0 (decays in (0, 1]),
            as Qwen's ``-exp(A) softplus(.)`` gates are; this is not checked on the device (it
            would cost a synchronization per call), and positive gates can overflow.
        beta: ``[B, T, HV]``.
        scale: defaults to ``K ** -0.5``; must be finite.
        initial_state: ``[N, HV, K, V]`` (fp32 state), N = B or ``len(cu_seqlens) - 1``.
        cu_seqlens: ``[N + 1]`` int sequence boundaries of packed sequences (requires B == 1).
            Their values are checked in eager mode, once per tensor until torch sees it written
            (a write torch does not see, through ``.data`` or another library, is trusted); under
            CUDA-graph capture and torch.compile they are trusted.
        use_qk_l2norm_in_kernel: l2-normalize q and k over the head dim first.
        num_segments: segments per sequence for context parallelism (default: chosen from N, HV, T
            and the SM count; ``polykernels info`` shows the rule). For tests and tuning.

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in v's dtype; final_state ``[N, HV, K, V]``
        fp32 when ``output_final_state``, else None. GPU tensors run the Triton kernels (CUDA and
        ROCm), but fp32 inputs with K above 128 (whose Triton tiles do not fit most GPUs' shared memory)
        and CPU tensors run the chunked torch implementation. A NaN/Inf in a token's inputs
        makes that token's output and every later one of its sequence NaN, never an earlier one.
    """
    replay = None
    if scale is None or (type(scale) is float and math.isfinite(scale)):
        replay = _replay_class(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens,
                               use_qk_l2norm_in_kernel, num_segments)
    if replay is not None:
        # A later eager call of a class the checked path has run: its launch program, one call into C++.
        replayed = _programs.run(*replay, [_default_scale(q) if scale is None else scale])
        if replayed is not None:
            return replayed[0], replayed[1] if output_final_state else None
    output_final_state = _check_flag(output_final_state, "output_final_state")
    use_qk_l2norm_in_kernel = _check_flag(use_qk_l2norm_in_kernel, "use_qk_l2norm_in_kernel")
    _check(q, k, v, g, beta, initial_state, cu_seqlens, num_segments)
    if scale is None:
        scale = _default_scale(q)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not float("-inf") < scale < float("inf"):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if torch.compiler.is_compiling():
        o, final = _chunk_gated_delta_rule_op(q, k, v, g, beta, float(scale), initial_state, output_final_state,
                                              cu_seqlens, use_qk_l2norm_in_kernel, num_segments)
        return o, final if output_final_state else None
    # Eager: straight to the launch; the custom op's dispatch costs more host time than the kernels.
    return _run(q, k, v, g, beta, float(scale), initial_state, output_final_state, cu_seqlens,
                use_qk_l2norm_in_kernel, num_segments, replay)


def _default_scale(q: torch.Tensor) -> float:
    return q.shape[-1] ** -0.5


# The first of a launch program's flags: which op the program is of.
_PROGRAM_FAMILY = 1


def _replay_class(
    q: object, k: object, v: object, g: object, beta: object, initial_state: object, output_final_state: object,
    cu_seqlens: object, use_qk_l2norm_in_kernel: object, num_segments: object,
) -> tuple[list, list] | None:
    """(tensors, flags): the class of an eager GPU call as launch programs key it (the tensors'
    dtypes, devices, sizes, strides and alignments; the flags and the launch tables' version), or
    None where no program may serve the call (torch.compile, a profiler's launch hooks, replay
    off). What the class does not capture is checked here: the values of cu_seqlens."""
    tensor = torch.Tensor
    if not (type(q) is tensor and q.is_cuda and type(k) is tensor and type(v) is tensor and type(g) is tensor
            and type(beta) is tensor and (initial_state is None or type(initial_state) is tensor)
            and (cu_seqlens is None or type(cu_seqlens) is tensor) and type(output_final_state) is bool
            and type(use_qk_l2norm_in_kernel) is bool and (num_segments is None or type(num_segments) is int)
            and _programs.enabled() and not torch.compiler.is_compiling() and no_launch_hooks()):
        return None
    if cu_seqlens is not None:
        if not (q.dim() == 4 and q.shape[0] == 1 and cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 2
                and cu_seqlens.dtype in (torch.int32, torch.int64) and cu_seqlens.device == q.device):
            return None  # the checked path says what is wrong
        _check_boundaries(cu_seqlens, q.shape[1])
    flags = [_PROGRAM_FAMILY, launch.configuration_version, int(output_final_state), int(use_qk_l2norm_in_kernel),
             0 if num_segments is None else num_segments]
    return [q, k, v, g, beta, initial_state, cu_seqlens], flags
