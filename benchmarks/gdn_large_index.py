"""The >2^31-element check on a GPU: one long run vs the same tokens in chained pieces.

HV = 32, K = V = 128: q, k, v and o [1, T, 32, 128] pass 2^31 elements beyond 524,288 tokens.
An int32 offset there reads out of bounds or wraps. The long run is made six times: on the
whole-sequence path, on the context-parallel (segmented) one, whole with 64-column V tiles (on
sm_90 the sequential pass with the state in registers), as the plan would run it (on sm_90: the
sequence cut into segments of two-tile programs), as the plan would run it on a GPU of 100 SMs (on
sm_90: two tiles per sequential program beside the prepare pass, which stores (I + A)^-1
diag(beta)), and as one packed sequence (``cu_seqlens``) planned for 200 SMs (on sm_90 the packed
sequences' segments of two-tile programs); each piece of the chained run is below 2^31 elements, so
it is a reference that needs no dense fp64 recurrence.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def _wide_tiles() -> Iterator[None]:
    """The sequential pass at 64-column V tiles whatever the plan would pick."""
    from polykernels.gated_delta_rule import launch

    saved = launch.RECURRENCE_BLOCK_V
    launch.RECURRENCE_BLOCK_V = {**saved, 128: (64, 64)}
    try:
        yield
    finally:
        launch.RECURRENCE_BLOCK_V = saved


@contextlib.contextmanager
def _planned_for_sms(count: int) -> Iterator[None]:
    """The plan made for a GPU of ``count`` SMs: 32 value heads' 64 one-tile programs then take over half
    of 100, their 32 pairs do not (launch.HOPPER_CONCURRENT_PAIRS). The recipes and launch programs made for
    the GPU's own count are dropped before and after."""
    from polykernels import _programs, platform
    from polykernels.gated_delta_rule import launch

    saved = platform.sm_count
    launch._recipe.cache_clear()
    _programs.clear()
    platform.sm_count = lambda device=None: count
    try:
        yield
    finally:
        platform.sm_count = saved
        launch._recipe.cache_clear()
        _programs.clear()


def run_large_index_check(tokens: int = 2**31 // (32 * 128) + 4096, device: str = "cuda", segments: int = 4) -> dict:
    from polykernels.gated_delta_rule import chunk_gated_delta_rule

    heads, dim = 32, 128
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (1, tokens, heads, dim)
    q = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(shape, device=device, generator=gen), dim=-1).bfloat16()
    v = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, tokens, heads, device=device, generator=gen)) * 0.1
    beta = torch.rand(1, tokens, heads, device=device, generator=gen).sigmoid().bfloat16()
    # Six paths over the same tokens: whole (one program per V tile and head walks every chunk),
    # forced context parallelism (segment states, combine, recurrence per segment), whole at the
    # wide V tile, the plan's own choice (no num_segments: on an sm_90 of 132 SMs four segments of the pairs,
    # launch.HOPPER_WINDOWED_PAIRS), the plan's choice for 100 SMs (three segments would be too few: the
    # pairs beside the prepare pass on sm_90), and the tokens as one packed sequence (cu_seqlens) as planned for
    # 200 SMs (on sm_90 five segments of the pairs, launch.HOPPER_WINDOWED_PACKED_PAIRS: 132 SMs leave room for
    # three). Each is held to the chained pieces run as the plan runs them on the same GPU: the 100 SMs path's
    # pieces are planned for 100 SMs too (the pairs' prepare pass rounds (I + A)^-1 diag(beta) where the one-tile
    # paths' rounds w and u).
    same, hundred_sms = contextlib.nullcontext, functools.partial(_planned_for_sms, 100)
    packed = torch.tensor([0, tokens], device=device, dtype=torch.int32)
    paths = (("whole", 1, same, same, None), ("segmented", segments, same, same, None),
             ("whole_wide", 1, _wide_tiles, same, None), ("planned", None, same, same, None),
             ("planned_100_sms", None, hundred_sms, hundred_sms, None),
             ("packed_planned_200_sms", None, functools.partial(_planned_for_sms, 200), same, packed))
    full = {}
    for label, forced, form, _, cu_seqlens in paths:
        start = time.perf_counter()
        try:
            with form():
                full[label] = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, num_segments=forced,
                                                     cu_seqlens=cu_seqlens)
            torch.cuda.synchronize()
        except RuntimeError as error:  # a fault surfaces at the synchronize: say which path made it
            raise RuntimeError(f"the {label} path of the >2^31-element check failed: {error}") from error
        full[label] += (round(time.perf_counter() - start, 3),)
    step = -(-tokens // segments // 64) * 64
    errors, chained_states = dict.fromkeys(full, 0.0), {}
    for reference in dict.fromkeys(ref for *_, ref, _ in paths):  # each reference form once, in order
        labels = [label for label, *_, ref, _ in paths if ref is reference]
        state, sq_ref = None, 0.0
        with reference():
            for begin in range(0, tokens, step):
                end = min(tokens, begin + step)
                o, state = chunk_gated_delta_rule(q[:, begin:end], k[:, begin:end], v[:, begin:end],
                                                  g[:, begin:end], beta[:, begin:end], initial_state=state,
                                                  output_final_state=True)
                for label in labels:
                    errors[label] += float((o.double() - full[label][0][:, begin:end].double()).pow(2).sum())
                sq_ref += float(o.double().pow(2).sum())
        for label in labels:
            errors[label] = (errors[label] / sq_ref) ** 0.5
            chained_states[label] = state
    result = {"tokens": tokens, "elements": tokens * heads * dim, "segments": segments,
              "device": torch.cuda.get_device_name(0)}
    for label, (_, full_state, seconds) in full.items():
        result[f"{label}_o_error"] = errors[label]
        state = chained_states[label]
        result[f"{label}_state_error"] = float((state - full_state).pow(2).mean().sqrt()
                                               / full_state.pow(2).mean().sqrt())
        result[f"{label}_seconds"] = seconds
    result["o_error"] = max(result[f"{label}_o_error"] for label in full)
    result["state_error"] = max(result[f"{label}_state_error"] for label in full)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2**31 // (32 * 128) + 4096)
    print(json.dumps(run_large_index_check(parser.parse_args().tokens)))
