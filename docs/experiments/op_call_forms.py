"""Host time of a torch op call by the form of its schema, on any CPU (``python docs/experiments/op_call_forms.py``).

Whether ``program_run`` (``csrc/launch/program.cu``) would cost less host time with another schema: the same
empty C++ body, built against torch's stable ABI as the extension is, registered for CPU under three forms of
its tensors. What is timed is the call from Python (argument parsing, the dispatcher, the stable ABI's boxing),
nothing inside it. The forms take turns, 20 rounds of 5000 calls each; the least and the median round.
Needs a C++ compiler (the extension's build needs one too). BENCHMARKS.md, forty-second set, has what it showed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch.utils.cpp_extension import load_inline

_SOURCE = r"""
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <optional>
#include <vector>
using torch::stable::Tensor;
using Slot = std::optional<Tensor>;

std::vector<Tensor> slots(std::vector<Slot> tensors, std::vector<int64_t> flags, std::vector<double> scalars) {
  return {};
}
std::vector<Tensor> present(std::vector<Tensor> tensors, std::vector<int64_t> flags, std::vector<double> scalars) {
  return {};
}
std::vector<Tensor> arguments(Tensor t0, Slot t1, Slot t2, Slot t3, Slot t4, Slot t5, Slot t6,
                              std::vector<int64_t> flags, std::vector<double> scalars) {
  return {};
}
void nothing() {}

STABLE_TORCH_LIBRARY(op_call_forms, m) {
  m.def("slots(Tensor?[] tensors, int[] flags, float[] scalars) -> Tensor[]");
  m.def("present(Tensor[] tensors, int[] flags, float[] scalars) -> Tensor[]");
  m.def("arguments(Tensor t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, Tensor? t5, Tensor? t6, "
        "int[] flags, float[] scalars) -> Tensor[]");
  m.def("nothing() -> ()");
}
STABLE_TORCH_LIBRARY_IMPL(op_call_forms, CPU, m) {
  m.impl("slots", TORCH_BOX(&slots));
  m.impl("present", TORCH_BOX(&present));
  m.impl("arguments", TORCH_BOX(&arguments));
}
STABLE_TORCH_LIBRARY_IMPL(op_call_forms, CompositeExplicitAutograd, m) {
  m.impl("nothing", TORCH_BOX(&nothing));
}
"""


def _us_per_call(call: Callable[[], object], calls: int = 5000) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    load_inline("op_call_forms", cpp_sources=[_SOURCE], is_python_module=False, extra_cflags=["-O2"])
    ops = torch.ops.op_call_forms
    q, k, v, g, beta = (torch.empty(8) for _ in range(5))
    # A gated delta rule call's tensors: no initial state, no cu_seqlens.
    slots, present = [q, k, v, g, beta, None, None], [q, k, v, g, beta]
    flags, scalars = [1, 2, 1, 0, 0], [0.1]
    forms = {
        "an op with no arguments, through OpOverload": ops.nothing.default,
        "Tensor?[] (program_run's form), through OpOverload": lambda: ops.slots.default(slots, flags, scalars),
        "Tensor?[], the overload's _op": lambda: ops.slots.default._op(slots, flags, scalars),
        "Tensor[] of the present tensors, the overload's _op": lambda: ops.present.default._op(present, flags,
                                                                                              scalars),
        "each tensor an argument, the overload's _op": lambda: ops.arguments.default._op(*slots, flags, scalars),
        "torch.neg of one tensor (an aten op, for scale)": lambda: torch.neg(q),
    }
    rounds: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(20):
        for name, call in forms.items():
            rounds[name].append(_us_per_call(call))
    print(f"torch {torch.__version__}, us per call (least / median round):")
    for name, times in rounds.items():
        print(f"  {min(times):5.2f} / {statistics.median(times):5.2f}  {name}")


if __name__ == "__main__":
    main()
