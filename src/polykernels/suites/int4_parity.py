"""INT4 parity: the compiled kernel's (out, scale, zero) are bit-equal to the torch reference.

144 cases: 3 dtypes x 4 group sizes x 2 modes x 6 shapes, on the suite's device, with the
reference computed on the same device.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import torch

from polykernels.suites.report import CaseResult, SuiteResult

NAME = "int4_parity"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
GROUP_SIZES = (32, 64, 128, 256)
MODES = (True, False)


def _one_row(g: torch.Generator) -> torch.Tensor:
    return torch.randn(1, 4096, generator=g)


def _three_rows(g: torch.Generator) -> torch.Tensor:
    return torch.randn(3, 4096, generator=g) * 4


def _three_leading_dims(g: torch.Generator) -> torch.Tensor:
    return torch.randn(2, 7, 64, 256, generator=g)


def _square(g: torch.Generator) -> torch.Tensor:
    return torch.randn(4096, 4096, generator=g) * 0.02


def _all_equal(g: torch.Generator) -> torch.Tensor:
    return torch.full((1, 1024), 0.3)


def _huge_and_tiny(g: torch.Generator) -> torch.Tensor:
    magnitude = torch.where(torch.arange(2048) % 2 == 0, torch.tensor(3.0e4), torch.tensor(1.0e-6))
    return magnitude * torch.randn(1, 2048, generator=g).sign()


SHAPES: dict[str, Callable[[torch.Generator], torch.Tensor]] = {
    "one_row": _one_row,
    "rows3x4096": _three_rows,
    "lead3": _three_leading_dims,
    "square4096": _square,
    "all_equal": _all_equal,
    "huge_and_tiny": _huge_and_tiny,
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16) if t.element_size() == 2 else t


def _first_difference(kernel: torch.Tensor, reference: torch.Tensor) -> str:
    diff = (_bits(kernel) != _bits(reference)).nonzero()
    index = tuple(diff[0].tolist())
    return f"{int(diff.shape[0])} differing, first at {index}: {kernel[index].item()!r} vs {reference[index].item()!r}"


def run_case(x: torch.Tensor, group_size: int, symmetric: bool) -> tuple[bool, str]:
    from polykernels.quant import fake_int4_quant, fake_int4_quant_reference

    got = fake_int4_quant(x, group_size, symmetric)
    want = fake_int4_quant_reference(x, group_size, symmetric)
    for label, kernel, reference in zip(("out", "scale", "zero"), got, want, strict=True):
        if kernel.dtype != reference.dtype or kernel.shape != reference.shape:
            return False, f"{label}: {kernel.dtype}{tuple(kernel.shape)} vs {reference.dtype}{tuple(reference.shape)}"
        if not torch.equal(_bits(kernel), _bits(reference)):
            return False, f"{label}: {_first_difference(kernel, reference)}"
    return True, "bit-equal"


def run(device: torch.device) -> SuiteResult:
    start = time.perf_counter()
    cases = []
    generator = torch.Generator().manual_seed(0)
    inputs = {name: make(generator) for name, make in SHAPES.items()}
    for dtype, group_size, symmetric, shape in itertools.product(DTYPES, GROUP_SIZES, MODES, SHAPES):
        name = f"{str(dtype).removeprefix('torch.')}-g{group_size}-{'sym' if symmetric else 'asym'}-{shape}"
        case_start = time.perf_counter()
        x = inputs[shape].to(device=device, dtype=dtype)
        try:
            passed, detail = run_case(x, group_size, symmetric)
        except Exception as exc:  # a crash in one case is that case's failure, not the suite's
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        cases.append(CaseResult(name=name, passed=passed, detail=detail, seconds=time.perf_counter() - case_start))
    return SuiteResult.from_cases(NAME, cases, time.perf_counter() - start)
