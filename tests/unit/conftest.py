"""Kernel tests see NaN in every fresh float allocation (fla's conftest does the same).

``torch.empty``, ``torch.empty_like`` and ``Tensor.new_empty`` return NaN-filled floating tensors
while a test runs, so an output element that a kernel (or its launcher) forgets to write reads as
NaN and fails the comparison instead of passing on whatever the allocator left there.
"""

from __future__ import annotations

import pytest
import torch

_REAL = {"empty": torch.empty, "empty_like": torch.empty_like, "new_empty": torch.Tensor.new_empty}


def _poisoned(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.is_floating_point() and tensor.device.type != "meta" and tensor.numel():
        with torch.no_grad():
            tensor.fill_(float("nan"))
    return tensor


@pytest.fixture(autouse=True)
def nan_filled_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "empty", lambda *a, **k: _poisoned(_REAL["empty"](*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: _poisoned(_REAL["empty_like"](*a, **k)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: _poisoned(_REAL["new_empty"](self, *a, **k)))

