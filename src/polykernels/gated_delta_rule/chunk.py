"""Public chunked gated-delta-rule forward: checks, the launch of the Triton kernels, the custom op."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from polykernels.gated_delta_rule import guards
from polykernels.gated_delta_rule.reference import chunk_gated_delta_rule_torch

CHUNK = 64
MAX_HEAD_DIM = 256
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# Context parallelism (plan_segments): about PROGRAMS_PER_SM fused programs per SM, at least
# MIN_SEGMENT_CHUNKS chunks per segment (a segment costs a state and a K x K transition pass).
# From the H200 sweep (BENCHMARKS.md, "segments"): the best split gave 200-500 programs at every
# thin shape.
PROGRAMS_PER_SM = 2
MIN_SEGMENT_CHUNKS = 8


def _block(dim: int) -> int:
    return max(16, 1 << (dim - 1).bit_length())


@dataclass(frozen=True, kw_only=True)
class SegmentPlan:
    """How each sequence is cut for context parallelism (``segments == 1``: not cut)."""

    segments: int  # per sequence of average length
    segment_chunks: int  # chunks per segment
    reason: str


def plan_segments(
    num_seqs: int, total_tokens: int, value_heads: int, sm_count: int, num_segments: int | None = None,
    *, key_dim: int = 128, value_dim: int = 128,
) -> SegmentPlan:
    """Which path and how many segments per sequence, from (N, HV, T, K, V, SMs).

    The scan path's sequential programs (N x HV x V / scan BV) fill at least half the SMs: no split.
    Fewer (one sequence with a few heads): the fused path, cut into segments until about
    PROGRAMS_PER_SM fused programs (N x HV x V / fused BV) run per SM.
    """
    chunks = max(1, -(-total_tokens // num_seqs // CHUNK))
    block_k, block_v = _block(key_dim), _block(value_dim)
    scan_programs = num_seqs * value_heads * -(-value_dim // min(block_v, SCAN_BLOCK_V[block_k][1]))
    fused_programs = num_seqs * value_heads * -(-value_dim // min(block_v, FUSED_LAUNCH[block_k][0]))
    if num_segments is not None:
        segments, why = num_segments, f"{num_segments} segments per sequence requested"
    elif 2 * scan_programs >= sm_count:
        segments, why = 1, f"{scan_programs} scan programs (N x HV x V tiles) for {sm_count} SMs: scan path"
    else:
        wanted = -(-PROGRAMS_PER_SM * sm_count // fused_programs)
        segments = max(1, min(wanted, chunks // MIN_SEGMENT_CHUNKS))
        why = (f"{scan_programs} scan programs for {sm_count} SMs: fused path, {segments} segments of "
               f">= {MIN_SEGMENT_CHUNKS} chunks per sequence")
    segments = max(1, min(segments, chunks))
    return SegmentPlan(segments=segments, segment_chunks=-(-chunks // segments), reason=why)


def _sm_count(device: torch.device) -> int:
    # The Triton interpreter (CPU tensors) has no SMs to fill: one, so only explicit splits happen.
    return _cuda_sm_count(device) if device.type == "cuda" else 1


@functools.cache
def _cuda_sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _launchers() -> SimpleNamespace:
    from polykernels._launch import Launcher
    from polykernels.gated_delta_rule import kernels, scan_kernels

    return SimpleNamespace(
        plan=Launcher(kernels.gdn_plan_kernel),
        prepare=Launcher(kernels.gdn_prepare_kernel),
        segment_state=Launcher(kernels.gdn_segment_state_kernel),
        combine=Launcher(kernels.gdn_combine_kernel),
        fused=Launcher(kernels.gdn_fused_kernel),
        wu=Launcher(scan_kernels.gdn_wu_kernel),
        scan=Launcher(scan_kernels.gdn_scan_kernel),
        output=Launcher(scan_kernels.gdn_output_kernel),
    )


@functools.cache
def _unused_offsets(device: torch.device) -> torch.Tensor:
    """Stands for the offset tables of packed sequences in launches that do not read them."""
    return torch.zeros(1, dtype=torch.int64, device=device)


# (BV, num_warps, num_stages) of the fused and segment kernels per padded K: a K x BV fp32 state
# tile and the chunk's tiles live in registers. Chosen on the H200 (BENCHMARKS.md, "GDN launch").
FUSED_LAUNCH: dict[int, tuple[int, int, int]] = {16: (64, 4, 1), 32: (64, 4, 1), 64: (64, 4, 1), 128: (64, 4, 1),
                                                 256: (32, 8, 1)}


# V tiles of the scan path's (wu, scan, output) kernels per padded K: narrow scan tiles, since the
# sequential scan's parallelism is N x HV x V / BV programs; one V tile per output program, so the
# q.k^T scores are computed once per chunk (measured on the H200 before this table was a table).
SCAN_BLOCK_V: dict[int, tuple[int, int, int]] = {16: (64, 32, 128), 32: (64, 32, 128), 64: (64, 32, 128),
                                                 128: (64, 32, 128), 256: (64, 16, 64)}


def launch_config(key_dim: int, value_dim: int) -> tuple[int, int, int, int]:
    """(BK, BV, num_warps, num_stages) of the fused and segment kernels."""
    block_k = _block(key_dim)
    block_v, num_warps, num_stages = FUSED_LAUNCH[block_k]
    return block_k, min(_block(value_dim), block_v), num_warps, num_stages


def launch_chunk_gated_delta_rule(
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
    num_segments: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Runs the Triton kernels. No host synchronization and no host-built tables: capturable in a CUDA graph."""
    batch, tokens, _, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    varlen = cu_seqlens is not None
    num_seqs = cu_seqlens.shape[0] - 1 if varlen else batch
    total = batch * tokens
    device = q.device
    o = torch.empty_like(v)
    final = torch.empty(num_seqs, value_heads, key_dim, value_dim, dtype=torch.float32, device=device)
    if total == 0 or num_seqs == 0:
        if output_final_state:
            final.copy_(initial_state if initial_state is not None else torch.zeros_like(final))
        return o, final if output_final_state else None

    plan = plan_segments(num_seqs, total, value_heads, _sm_count(device), num_segments, key_dim=key_dim,
                         value_dim=value_dim)
    split = plan.segments > 1
    precision = guards.dot_precision(fp32_inputs=q.dtype == torch.float32)
    log_n = max(1, num_seqs.bit_length())
    # Unsplit (the scan path), a segment is a whole sequence: longer than any sequence can be.
    segment_chunks = plan.segment_chunks if split else 2**34
    if varlen:
        # Chunk and segment counts per sequence are computed on the GPU: no host round trip.
        offsets = torch.empty(2, num_seqs + 1, dtype=torch.int64, device=device)
        chunk_offsets, seg_offsets = offsets[0], offsets[1]
        max_chunks = -(-total // CHUNK) + num_seqs
        _launchers().plan((1,), (cu_seqlens, chunk_offsets, seg_offsets, num_seqs, segment_chunks), BT=CHUNK,
                          BLOCK=1024, num_warps=4, num_stages=1)
    else:
        chunk_offsets = seg_offsets = _unused_offsets(device)
        max_chunks = num_seqs * -(-tokens // CHUNK)
    tables = _Tables(cu=cu_seqlens if varlen else chunk_offsets, chunk_offsets=chunk_offsets,
                     seg_offsets=seg_offsets, max_chunks=max_chunks, num_seqs=num_seqs, varlen=varlen, log_n=log_n)
    initial = initial_state.float().contiguous() if initial_state is not None else final
    flags = {"has_initial": initial_state is not None, "output_final_state": output_final_state,
             "l2norm": use_qk_l2norm_in_kernel, "precision": precision}
    if split:
        _launch_fused_path(q, k, v, g, beta, scale, initial, o, final, tables, segment_chunks, **flags)
    else:
        _launch_scan_path(q, k, v, g, beta, scale, initial, o, final, tables, **flags)
    return o, final if output_final_state else None


@dataclass(frozen=True, kw_only=True)
class _Tables:
    """Where the sequences and chunks are: packed boundaries and running counts (on the GPU), or none."""

    cu: torch.Tensor
    chunk_offsets: torch.Tensor
    seg_offsets: torch.Tensor
    max_chunks: int  # programs of the per-chunk kernels: an upper bound for packed sequences
    num_seqs: int
    varlen: bool
    log_n: int


def _launch_fused_path(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
    initial: torch.Tensor, o: torch.Tensor, final: torch.Tensor, tables: _Tables, segment_chunks: int, *,
    has_initial: bool, output_final_state: bool, l2norm: bool, precision: str,
) -> None:
    """Few sequences x heads: each sequence in segments; states stay on chip in the fused pass."""
    run = _launchers()
    batch, tokens, heads, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    total, device = batch * tokens, q.device
    block_k, block_v, num_warps, num_stages = launch_config(key_dim, value_dim)
    value_tiles = -(-value_dim // block_v)
    num_seqs = tables.num_seqs
    if tables.varlen:
        segments_per_seq = 1
        max_segments = -(-tables.max_chunks // segment_chunks) + num_seqs
    else:
        chunks_per_seq = -(-tokens // CHUNK)
        segments_per_seq = -(-chunks_per_seq // segment_chunks)
        max_segments = num_seqs * segments_per_seq
    segment_tokens = segment_chunks * CHUNK
    where = {"L2NORM": l2norm, "VARLEN": tables.varlen, "LOG_N": tables.log_n, "DOT_PRECISION": precision}
    shape = {"H": heads, "HV": value_heads, "K": key_dim}

    ai = torch.empty(total, value_heads, CHUNK, dtype=q.dtype, device=device)
    run.prepare(
        (tables.max_chunks, value_heads),
        (k, g, beta, ai, tables.cu, tables.chunk_offsets, tokens, num_seqs, -(-tokens // CHUNK)),
        **shape, BT=CHUNK, BK=block_k, **where, num_warps=4, num_stages=1,
    )
    segment_shape = {**shape, "V": value_dim, "BT": CHUNK, "BK": block_k, "BV": block_v}
    h_local = torch.empty(max_segments, value_heads, key_dim, value_dim, dtype=torch.float32, device=device)
    transitions = torch.empty(max_segments, value_heads, key_dim, key_dim, dtype=torch.float32, device=device)
    h_init = torch.empty_like(h_local)
    segments = (tables.cu, tables.seg_offsets, tokens, num_seqs, segments_per_seq, segment_tokens)
    run.segment_state(
        (value_tiles + -(-key_dim // block_v), max_segments, value_heads),
        (k, v, g, beta, ai, h_local, transitions, *segments),
        **segment_shape, NV=value_tiles, **where, num_warps=num_warps, num_stages=num_stages,
    )
    run.combine(
        (value_tiles, num_seqs, value_heads),
        (initial, h_local, transitions, h_init, tables.cu, tables.seg_offsets, num_seqs, segments_per_seq),
        HV=value_heads, K=key_dim, V=value_dim, BK=block_k, BV=block_v, KB=32, HAS_INITIAL=has_initial,
        VARLEN=tables.varlen, DOT_PRECISION=precision, num_warps=4, num_stages=1,
    )
    run.fused(
        (value_tiles, max_segments, value_heads),
        (q, k, v, g, beta, ai, h_init, final, o, *segments, scale),
        **segment_shape, **where, STORE_FINAL=output_final_state, num_warps=num_warps, num_stages=num_stages,
    )


def _launch_scan_path(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
    initial: torch.Tensor, o: torch.Tensor, final: torch.Tensor, tables: _Tables, *,
    has_initial: bool, output_final_state: bool, l2norm: bool, precision: str,
) -> None:
    """Many sequences x heads: chunk states through HBM, two products per chunk on the sequential path."""
    run = _launchers()
    batch, tokens, heads, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    total, device, dtype = batch * tokens, q.device, q.dtype
    block_k, block_v = _block(key_dim), _block(value_dim)
    chunks_per_seq = -(-tokens // CHUNK)
    cu, chunk_offsets, max_chunks, num_seqs = tables.cu, tables.chunk_offsets, tables.max_chunks, tables.num_seqs
    varlen, log_n = tables.varlen, tables.log_n
    gate_cumsum = torch.empty(total, value_heads, dtype=torch.float32, device=device)
    w = torch.empty(total, value_heads, key_dim, dtype=dtype, device=device)
    u = torch.empty(total, value_heads, value_dim, dtype=dtype, device=device)
    v_new = torch.empty_like(u)
    first_bad = torch.empty(max_chunks, value_heads, dtype=torch.int32, device=device)
    states = torch.empty(max_chunks, value_heads, key_dim, value_dim, dtype=dtype, device=device)
    shape = {"H": heads, "HV": value_heads, "K": key_dim, "V": value_dim, "BT": CHUNK, "BK": block_k}
    wu_bv, scan_bv, output_bv = SCAN_BLOCK_V[block_k]
    wu_bv, scan_bv, output_bv = min(block_v, wu_bv), min(block_v, scan_bv), min(block_v, output_bv)
    common = {"L2NORM": l2norm, "VARLEN": varlen, "DOT_PRECISION": precision}
    run.wu(
        (max_chunks, value_heads),
        (k, v, g, beta, w, u, gate_cumsum, first_bad, cu, chunk_offsets, tokens, num_seqs, chunks_per_seq),
        **shape, BV=wu_bv, NV=-(-value_dim // wu_bv), LOG_N=log_n, **common, num_warps=4, num_stages=1,
    )
    run.scan(
        (-(-value_dim // scan_bv), num_seqs, value_heads),
        (k, w, u, gate_cumsum, first_bad, initial, final, states, v_new, cu, chunk_offsets, tokens, num_seqs,
         chunks_per_seq),
        **shape, BV=scan_bv, HAS_INITIAL=has_initial, STORE_FINAL=output_final_state, **common, num_warps=4,
        num_stages=1,
    )
    run.output(
        (max_chunks, -(-value_dim // output_bv), value_heads),
        (q, k, gate_cumsum, first_bad, states, v_new, o, cu, chunk_offsets, tokens, num_seqs, chunks_per_seq, scale),
        **shape, BV=output_bv, LOG_N=log_n, **common, num_warps=4, num_stages=1,
    )


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
    use_qk_l2norm_in_kernel: bool, num_segments: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if guards.choose(q.device.type).path == "triton":
        return launch_chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                             use_qk_l2norm_in_kernel, num_segments)
    return chunk_gated_delta_rule_torch(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                        use_qk_l2norm_in_kernel)


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
    """The values of cu_seqlens, where reading them is allowed.

    Reading them costs a device-to-host copy, which a CUDA graph cannot capture and torch.compile
    cannot trace: there the contract is the caller's (as in FLA and vLLM).
    """
    if torch.compiler.is_compiling() or (cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != tokens:
        raise ValueError(f"cu_seqlens must start at 0 and end at T = {tokens}, got {bounds[:3]}...{bounds[-1:]}")
    if any(b > a for a, b in zip(bounds[1:], bounds[:-1], strict=True)):
        raise ValueError("cu_seqlens must be non-decreasing")


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
            Their values are checked in eager mode; under CUDA-graph capture and torch.compile
            they are trusted.
        use_qk_l2norm_in_kernel: l2-normalize q and k over the head dim first.
        num_segments: segments per sequence for context parallelism (default: chosen from N, HV, T
            and the SM count; ``polykernels info`` shows the rule). For tests and tuning.

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in v's dtype; final_state ``[N, HV, K, V]``
        fp32 when ``output_final_state``, else None. GPU tensors run the Triton kernels (CUDA and
        ROCm); CPU tensors run the chunked torch implementation. A NaN/Inf in a token's inputs
        makes that token's output and every later one of its sequence NaN, never an earlier one.
    """
    output_final_state = _check_flag(output_final_state, "output_final_state")
    use_qk_l2norm_in_kernel = _check_flag(use_qk_l2norm_in_kernel, "use_qk_l2norm_in_kernel")
    _check(q, k, v, g, beta, initial_state, cu_seqlens, num_segments)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not float("-inf") < scale < float("inf"):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if torch.compiler.is_compiling():
        o, final = _chunk_gated_delta_rule_op(q, k, v, g, beta, float(scale), initial_state, output_final_state,
                                              cu_seqlens, use_qk_l2norm_in_kernel, num_segments)
        return o, final if output_final_state else None
    # Eager: straight to the launch; the custom op's dispatch costs more host time than the kernels.
    return _run(q, k, v, g, beta, float(scale), initial_state, output_final_state, cu_seqlens,
                use_qk_l2norm_in_kernel, num_segments)
