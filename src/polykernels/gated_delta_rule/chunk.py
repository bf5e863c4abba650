"""Public chunked gated-delta-rule forward: checks, the launch of the Triton kernels, the custom op."""

from __future__ import annotations

import itertools

import torch

from polykernels.gated_delta_rule import guards
from polykernels.gated_delta_rule.reference import chunk_gated_delta_rule_torch

CHUNK = 64
MAX_HEAD_DIM = 256
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _block(dim: int) -> int:
    return max(16, 1 << (dim - 1).bit_length())


def chunk_table(seq_bounds: list[int]) -> tuple[list[int], list[int]]:
    """Per chunk (start token, valid length), flattened; and each sequence's first chunk index."""
    chunks: list[int] = []
    starts: list[int] = []
    for start, end in itertools.pairwise(seq_bounds):
        starts.append(len(chunks) // 2)
        for chunk_start in range(start, end, CHUNK):
            chunks += [chunk_start, min(CHUNK, end - chunk_start)]
    return chunks, starts


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    from polykernels.gated_delta_rule.kernels import gdn_output_kernel, gdn_prepare_kernel, gdn_scan_kernel

    batch, tokens, heads, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    # B sequences of T tokens are packed sequences of equal length.
    bounds = [b * tokens for b in range(batch + 1)] if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]
    num_seqs = len(bounds) - 1
    chunks, chunk_starts = chunk_table(bounds)
    num_chunks = len(chunks) // 2
    device = q.device
    chunk_tensor = torch.tensor(chunks or [0, 0], dtype=torch.int64, device=device)
    seq_tensor = torch.tensor(bounds, dtype=torch.int64, device=device)
    starts_tensor = torch.tensor(chunk_starts, dtype=torch.int64, device=device)

    total = batch * tokens
    dtype = q.dtype
    block_k, block_v = _block(key_dim), _block(value_dim)
    precision = guards.dot_precision(fp32_inputs=dtype == torch.float32)
    o = torch.empty(batch, tokens, value_heads, value_dim, dtype=v.dtype, device=device)
    final = torch.empty(num_seqs, value_heads, key_dim, value_dim, dtype=torch.float32, device=device)
    if num_chunks == 0:
        if output_final_state:
            final.copy_(initial_state if initial_state is not None else torch.zeros_like(final))
        return o, final if output_final_state else None

    g = g.float().contiguous()
    gate_cumsum = torch.empty(total, value_heads, dtype=torch.float32, device=device)
    w = torch.empty(total, value_heads, key_dim, dtype=dtype, device=device)
    u = torch.empty(total, value_heads, value_dim, dtype=dtype, device=device)
    v_new = torch.empty_like(u)
    states = torch.empty(num_chunks, value_heads, key_dim, value_dim, dtype=dtype, device=device)
    shape = {"H": heads, "HV": value_heads, "K": key_dim, "V": value_dim, "BT": CHUNK, "BK": block_k}
    prepare_bv = min(block_v, 64)
    gdn_prepare_kernel[(num_chunks, value_heads)](
        k, v, g, beta, w, u, gate_cumsum, chunk_tensor, **shape, BV=prepare_bv,
        NV=-(-value_dim // prepare_bv), L2NORM=use_qk_l2norm_in_kernel, DOT_PRECISION=precision, num_warps=4,
    )
    # Thin parallelism (N x HV x V/BV programs) is what limits the scan: narrow V tiles.
    scan_bv = min(block_v, 16 if block_k > 128 else 32)
    initial = initial_state.float().contiguous() if initial_state is not None else final
    gdn_scan_kernel[(-(-value_dim // scan_bv), num_seqs, value_heads)](
        k, w, u, gate_cumsum, initial, final, states, v_new, seq_tensor, starts_tensor, **shape, BV=scan_bv,
        L2NORM=use_qk_l2norm_in_kernel, HAS_INITIAL=initial_state is not None, STORE_FINAL=output_final_state,
        DOT_PRECISION=precision, num_warps=4,
    )
    # One V tile per program when V <= 128: the q.k^T scores are then computed once per chunk.
    output_bv = min(block_v, 128)
    gdn_output_kernel[(num_chunks, -(-value_dim // output_bv), value_heads)](
        q, k, gate_cumsum, states, v_new, o, chunk_tensor, scale, **shape, BV=output_bv,
        L2NORM=use_qk_l2norm_in_kernel, DOT_PRECISION=precision, num_warps=4,
    )
    return o, final if output_final_state else None


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
) -> tuple[torch.Tensor, torch.Tensor]:
    args = (q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel)
    if guards.choose(q.device.type).path == "triton":
        o, final = launch_chunk_gated_delta_rule(*args)
    else:
        o, final = chunk_gated_delta_rule_torch(*args)
    # A custom op cannot return None: an empty tensor stands for "no final state".
    return o, final if final is not None else q.new_empty(0, dtype=torch.float32)


@_chunk_gated_delta_rule_op.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel):  # noqa: ANN001
    num_seqs = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    o = v.new_empty(v.shape)
    if not output_final_state:
        return o, q.new_empty(0, dtype=torch.float32)
    return o, q.new_empty(num_seqs, v.shape[2], k.shape[3], v.shape[3], dtype=torch.float32)


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
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
        bounds = cu_seqlens.tolist()
        if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != tokens:
            raise ValueError(f"cu_seqlens must start at 0 and end at T = {tokens}, got {bounds[:3]}...{bounds[-1:]}")
        if any(b > a for a, b in zip(bounds[1:], bounds[:-1], strict=True)):
            raise ValueError("cu_seqlens must be non-decreasing")
        num_seqs = len(bounds) - 1
    if initial_state is not None:
        expected = (num_seqs, value_heads, key_dim, value_dim)
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != expected:
            got = (tuple(initial_state.shape) if isinstance(initial_state, torch.Tensor)
                   else type(initial_state).__name__)
            raise ValueError(f"initial_state must be [N, HV, K, V] = {list(expected)}, got {got}")
        if initial_state.device != q.device:
            raise ValueError(f"initial_state is on {initial_state.device} but q is on {q.device}")


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule forward (Qwen3-Next / Qwen3.5 linear attention).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]`` with ``HV % H == 0`` (value head i reads
            key head ``i // (HV // H)``); one dtype of bf16/fp16/fp32; K, V <= 256.
        g: ``[B, T, HV]`` log-space gates (<= 0), computed in fp32. beta: ``[B, T, HV]``.
        scale: defaults to ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (fp32 state), N = B or ``len(cu_seqlens) - 1``.
        cu_seqlens: ``[N + 1]`` int sequence boundaries of packed sequences (requires B == 1).
        use_qk_l2norm_in_kernel: l2-normalize q and k over the head dim first.

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in v's dtype; final_state ``[N, HV, K, V]``
        fp32 when ``output_final_state``, else None. GPU tensors run the Triton kernels (CUDA and
        ROCm); CPU tensors run the chunked torch implementation.
    """
    _check(q, k, v, g, beta, initial_state, cu_seqlens)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    o, final = _chunk_gated_delta_rule_op(
        q, k, v, g, beta, scale, initial_state, bool(output_final_state), cu_seqlens, bool(use_qk_l2norm_in_kernel)
    )
    return o, final if output_final_state else None
