"""polykernels._launch: the direct launch path's fallback when a device's shared memory is smaller
than the launch tables assume. The real OutOfResources needs a GPU (the fp32 gated-delta-rule GPU
test meets it on the H200); here a stand-in kernel raises it as Triton does, before launching."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from triton.runtime.errors import OutOfResources

from polykernels._launch import Launcher


class _KernelNeedingStages:
    """Indexes and calls like a JITFunction; raises Triton's error above ``fits`` pipeline stages."""

    def __init__(self, fits: int, resource: str = "shared memory") -> None:
        self.fits, self.resource, self.stages_tried = fits, resource, []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., str]:
        def launch(*args: object, **meta: object) -> str:
            self.stages_tried.append(meta["num_stages"])
            if meta["num_stages"] > self.fits:
                raise OutOfResources(262656, 232448, self.resource)
            return "launched"

        return launch


def test_launch_drops_stages_until_the_shared_memory_fits() -> None:
    kernel = _KernelNeedingStages(fits=1)
    assert Launcher(kernel)._launch_fitting((1,), (), {"BLOCK": 64, "num_stages": 3}) == "launched"
    assert kernel.stages_tried == [3, 2, 1]


@pytest.mark.parametrize(("fits", "resource"), [(0, "shared memory"), (1, "registers")])
def test_launch_reraises_what_fewer_stages_cannot_fix(fits: int, resource: str) -> None:
    kernel = _KernelNeedingStages(fits=fits, resource=resource)
    with pytest.raises(OutOfResources, match=resource):
        Launcher(kernel)._launch_fitting((1,), (), {"num_stages": 2})
