// The schema of the launch-program ops (csrc/launch/program.cu implements them for GPUs). Defined
// in every build, so a CPU wheel names the ops it lacks the kernels of, rather than not knowing them.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY_FRAGMENT(polykernels, m) {
  // A recorded sequence of Triton kernel launches, replayed for later calls of the same class.
  // tensors: the call's tensors (those absent as None); flags: the call's other facts that its
  // launches depend on; outputs: tensors like the ones each call allocates (the first `returned`
  // are returned); program: the launches, encoded by polykernels._programs.
  m.def("program_register(Tensor?[] tensors, int[] flags, Tensor[] outputs, int returned, int[] program) -> ()");
  // The outputs of the program registered for this class of call, or no tensors when none is.
  m.def("program_run(Tensor?[] tensors, int[] flags, float[] scalars) -> Tensor[]");
  m.def("program_clear() -> ()");
}
