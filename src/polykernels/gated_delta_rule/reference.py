"""Pure-torch references for the gated delta rule forward.

``naive_recurrent_gated_delta_rule`` is the oracle: the per-token recurrence of the spec,
in fp32 (or fp64 when given fp64 inputs, as the tests do). ``chunk_gated_delta_rule_torch``
is the chunked algorithm in torch: what the public op runs on CPU. Both take the op's
arguments in the op's order.
"""

from __future__ import annotations

import torch

CHUNK = 64


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _sequences(batch: int, tokens: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(batch index, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, tokens) for b in range(batch)]
    bounds = cu_seqlens.tolist()
    return [(0, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def _fold_batch(t: torch.Tensor) -> torch.Tensor:
    """[B, T, heads, ...] -> [1, T, B * heads, ...], batch-major within the new head axis."""
    return t.transpose(0, 1).reshape(1, t.shape[1], t.shape[0] * t.shape[2], *t.shape[3:])


def naive_recurrent_gated_delta_rule(
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
    batch, tokens, heads, key_dim = q.shape
    if cu_seqlens is None and batch > 1:
        # Sequences of one length run side by side as more heads: value head b * HV + i still
        # reads key head b * H + i // (HV // H), and each head's arithmetic is unchanged.
        o, final = naive_recurrent_gated_delta_rule(
            *(_fold_batch(t) for t in (q, k, v, g, beta)), scale,
            None if initial_state is None else initial_state.reshape(1, -1, *initial_state.shape[2:]),
            output_final_state, None, use_qk_l2norm_in_kernel)
        o = o.reshape(tokens, batch, *v.shape[2:]).transpose(0, 1).contiguous()
        return o, None if final is None else final.reshape(batch, -1, *final.shape[2:])
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    value_heads, value_dim = v.shape[2], v.shape[3]
    group = value_heads // heads
    scale = key_dim**-0.5 if scale is None else scale
    q, k, v = (t.to(compute) for t in (q, k, v))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    g, beta = g.to(compute), beta.to(compute)
    # Per-token views made once (unbind), shaped for batched products over the value heads: each
    # token is then five tensor ops, which is what the GPU accuracy check at 10^5 tokens waits on.
    rows_q = (q * scale).unsqueeze(-2)  # [B, T, HV, 1, K]
    rows_k, cols_k = k.unsqueeze(-2), k.unsqueeze(-1)  # [B, T, HV, 1, K], [B, T, HV, K, 1]
    rows_v, decay, gate = v.unsqueeze(-2), g.exp()[..., None, None], beta[..., None, None]
    out = torch.zeros(batch, tokens, value_heads, value_dim, dtype=compute, device=q.device)
    sequences = _sequences(batch, tokens, cu_seqlens)
    finals = []
    for n, (b, start, end) in enumerate(sequences):
        state = torch.zeros(value_heads, key_dim, value_dim, dtype=compute, device=q.device)
        if initial_state is not None:
            state = initial_state[n].to(compute).clone()
        outs = []
        steps = zip(*(t[b, start:end].unbind(0) for t in (decay, rows_k, cols_k, rows_v, gate, rows_q)), strict=True)
        for decay_t, row_k, col_k, row_v, beta_t, row_q in steps:
            state = state * decay_t
            delta = beta_t * (row_v - torch.matmul(row_k, state))  # beta (v - S^T k), [HV, 1, V]
            state = torch.baddbmm(state, col_k, delta)  # S + k delta^T
            outs.append(torch.matmul(row_q, state))
        if outs:
            out[b, start:end] = torch.cat(outs, dim=1).transpose(0, 1)
        finals.append(state)
    final = torch.stack(finals).float() if output_final_state else None
    return out, final


def chunk_gated_delta_rule_torch(
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
    """The chunked algorithm of the spec in fp32 torch ops (chunks restart at sequence starts)."""
    batch, tokens, heads, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    group = value_heads // heads
    scale = key_dim**-0.5 if scale is None else scale
    qf, kf, vf = q.float(), k.float(), v.float()
    if use_qk_l2norm_in_kernel:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf, kf = qf.repeat_interleave(group, dim=2), kf.repeat_interleave(group, dim=2)
    gf, betaf = g.float(), beta.float()
    out = torch.zeros(batch, tokens, value_heads, value_dim, dtype=torch.float32, device=q.device)
    finals = []
    for n, (b, start, end) in enumerate(_sequences(batch, tokens, cu_seqlens)):
        state = torch.zeros(value_heads, key_dim, value_dim, device=q.device)
        if initial_state is not None:
            state = initial_state[n].float().clone()
        length = end - start
        if length:
            padded = -(-length // CHUNK) * CHUNK

            def chunks(x: torch.Tensor, b: int = b, start: int = start, end: int = end, padded: int = padded):
                x = x[b, start:end].transpose(0, 1)  # [HV, length, ...]
                pad = [0, 0] * (x.dim() - 2) + [0, padded - (end - start)]
                return torch.nn.functional.pad(x, pad).unflatten(1, (-1, CHUNK))  # [HV, NT, C, ...]

            qc, kc, vc = chunks(qf), chunks(kf), chunks(vf)
            gc, bc = chunks(gf), chunks(betaf)
            # A token with a non-finite k, v, g or beta, and the rest of its chunk, take no part in
            # the products (0 x NaN = NaN would reach earlier tokens); their outputs become NaN below.
            bad = ~(kc.isfinite().all(-1) & vc.isfinite().all(-1) & gc.isfinite() & bc.isfinite())
            poisoned = bad.cummax(-1).values
            kc, vc = (torch.where(poisoned[..., None], 0.0, x) for x in (kc, vc))
            gc, bc = (torch.where(poisoned, 0.0, x) for x in (gc, bc))
            gate = gc.cumsum(-1)
            decay = (gate[..., :, None] - gate[..., None, :]).tril().exp().tril()
            lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril(-1)
            attn = (bc[..., None] * kc @ kc.transpose(-1, -2)) * decay * lower
            eye = torch.eye(CHUNK, device=q.device)
            inverse = torch.linalg.solve_triangular(eye + attn, eye.expand_as(attn), upper=False)
            u = inverse @ (bc[..., None] * vc)
            w = inverse @ (bc[..., None] * gate.exp()[..., None] * kc)
            causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
            outputs = []
            for c in range(padded // CHUNK):
                v_new = u[:, c] - w[:, c] @ state
                scores = torch.where(causal, (qc[:, c] @ kc[:, c].transpose(-1, -2)) * decay[:, c], 0.0)
                chunk_out = scale * (gate[:, c].exp()[..., None] * (qc[:, c] @ state) + scores @ v_new)
                outputs.append(torch.where(poisoned[:, c, :, None], float("nan"), chunk_out))
                valid = min(CHUNK, length - c * CHUNK)
                last = gate[:, c, valid - 1]
                tail = (last[:, None] - gate[:, c]).exp()
                tail[:, valid:] = 0
                state = state * last.exp()[:, None, None] + kc[:, c].transpose(-1, -2) @ (v_new * tail[..., None])
                state = torch.where(poisoned[:, c].any(-1)[:, None, None], float("nan"), state)
            out[b, start:end] = torch.cat(outputs, dim=1)[:, :length].transpose(0, 1)
        finals.append(state)
    final = torch.stack(finals) if output_final_state else None
    return out.to(v.dtype), final
