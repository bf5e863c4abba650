"""FLUX warmup: a random-weight FluxTransformer2DModel with polykernels' norms swapped in runs a
warmup of several denoising steps at two resolutions, and matches the model with its own norms.

On CPU the smallest config; on a GPU FLUX's real width (D = 3072, 24 heads x 128) with one
double and one single block, so the kernels see the contract shapes. Records the first-call
latency (compilation) and the steady step time. Nothing is downloaded.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch

from polykernels.suites.report import CaseResult, SuiteResult

NAME = "flux_warmup"
STEPS = 4
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def build_model(device: torch.device, dtype: torch.dtype) -> Any:
    from diffusers import FluxTransformer2DModel
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # its dtype-cast advice is for pretrained weights

    torch.manual_seed(0)
    if device.type == "cuda":
        config = {"patch_size": 1, "in_channels": 64, "num_layers": 1, "num_single_layers": 1,
                  "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 512,
                  "pooled_projection_dim": 256, "axes_dims_rope": [16, 56, 56]}
    else:
        config = {"patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 1,
                  "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32,
                  "pooled_projection_dim": 32, "axes_dims_rope": [4, 4, 8]}
    return FluxTransformer2DModel(**config).eval().to(device=device, dtype=dtype)


def _resolutions(device: torch.device) -> list[tuple[int, int, int]]:
    """(height, width, text tokens) in latent patches."""
    return [(32, 32, 128), (64, 64, 128)] if device.type == "cuda" else [(4, 4, 48), (6, 6, 48)]


def _inputs(model: Any, height: int, width: int, text: int, device: torch.device, dtype: torch.dtype) -> dict:
    gen = torch.Generator().manual_seed(height * 1000 + width)
    cfg = model.config
    image_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(height).float(), torch.arange(width).float(),
                                           indexing="ij"), dim=-1).reshape(-1, 3)
    return {
        "hidden_states": torch.randn(1, height * width, cfg.in_channels, generator=gen).to(device, dtype),
        "encoder_hidden_states": torch.randn(1, text, cfg.joint_attention_dim, generator=gen).to(device, dtype),
        "pooled_projections": torch.randn(1, cfg.pooled_projection_dim, generator=gen).to(device, dtype),
        "img_ids": image_ids.to(device),
        "txt_ids": torch.zeros(text, 3, device=device),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def denoise(model: Any, inputs: dict, device: torch.device) -> tuple[torch.Tensor, list[float]]:
    """A few Euler steps of the flow: x <- x + (t_next - t) * v(x, t). Returns final x and step times."""
    latents = inputs["hidden_states"]
    times = torch.linspace(1.0, 0.0, STEPS + 1)
    step_seconds = []
    for t, t_next in itertools.pairwise(times):
        _sync(device)
        start = time.perf_counter()
        timestep = torch.full((latents.shape[0],), float(t), device=device, dtype=latents.dtype)
        velocity = model(**{**inputs, "hidden_states": latents}, timestep=timestep).sample
        latents = latents + (t_next - t).item() * velocity
        _sync(device)
        step_seconds.append(time.perf_counter() - start)
    return latents, step_seconds


def run_precision(device: torch.device, dtype: torch.dtype) -> list[CaseResult]:
    from polykernels.integrations.diffusers import apply_to_flux
    from polykernels.norm import choose

    model = build_model(device, dtype)
    label = str(dtype).removeprefix("torch.")
    path = choose(device.type, dtype, True)
    cases = []
    for height, width, text in _resolutions(device):
        inputs = _inputs(model, height, width, text, device, dtype)
        start = time.perf_counter()
        reference, _ = denoise(model, inputs, device)
        with apply_to_flux(model) as patch:
            ours, steps = denoise(model, inputs, device)
            swapped = len(patch.targets)
        error = float((ours.double() - reference.double()).pow(2).mean().sqrt()
                      / reference.double().pow(2).mean().sqrt())
        finite = bool(torch.isfinite(ours).all())
        steady = sorted(steps[1:])[len(steps[1:]) // 2]
        cases.append(CaseResult(
            name=f"{label}-{height}x{width}",
            passed=finite and swapped > 0 and error < TOLERANCE[dtype],
            detail=f"{STEPS} steps, relative RMS error {error:.2e} (bound {TOLERANCE[dtype]:.0e}), "
                   f"{swapped} norms swapped, path {path.path}",
            seconds=time.perf_counter() - start,
            metrics={"first_step_seconds": steps[0], "steady_step_seconds": steady, "relative_error": error,
                     "norm_path": path.path, "norm_path_reason": path.reason, "swapped": swapped,
                     "image_tokens": height * width, "text_tokens": text},
        ))
    return cases


def run(device: torch.device) -> SuiteResult:
    start = time.perf_counter()
    cases = run_precision(device, torch.float32) + run_precision(device, torch.bfloat16)
    return SuiteResult.from_cases(NAME, cases, time.perf_counter() - start)
