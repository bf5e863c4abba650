// Launch programs: a class of call's Triton kernel launches, recorded once from Python and
// replayed from C++ for every later call of that class. One source for nvcc and hipcc.
//
// Why: a Python path that checks its arguments, allocates its outputs and issues two to four
// Triton launches costs tens of microseconds per call, more than the kernels of a short call take.
// Here the class of a call is read from its tensors (dtype, device, sizes, strides, 16-byte
// alignment) and its flags; a registered class was checked once by the Python path, so matching it
// is the check. The outputs are allocated through torch (its caching allocator, so CUDA-graph
// capture works) and the kernels go to the driver on the current stream.
//
// A launch's parameters are what Triton's own launcher passes: the kernel's runtime arguments in
// order (constexprs and integers specialized to 1 left out), then two scratch pointers, null here
// (polykernels._programs registers no kernel that needs scratch memory).
//
// A program may also zero part of an output (ready flags a kernel counts on starting at zero), and
// a launch may be the previous one's programmatic dependent (driver::launch_dependent): two kernels
// that run side by side.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "launch/driver.h"
#include "polykernels/portable.h"
#include "polykernels/stream.h"

namespace polykernels::programs {
namespace {

using torch::stable::Tensor;

// A parameter's source, as polykernels._programs encodes it (kind, a, b).
enum class Source : int64_t {
  kInput = 0,   // tensors[a]'s address + b bytes
  kOutput = 1,  // outputs[a]'s address + b bytes
  kConstant = 2,  // the 8 bytes of a (integers, float bits, addresses of tensors that outlive the process)
  kScalarF32 = 3,  // scalars[a] as fp32
};

struct Parameter {
  Source source;
  int64_t a;
  int64_t b;
};

// A step's kind, as polykernels._programs encodes it.
enum class Op : int64_t {
  kLaunch = 0,  // a kernel launch
  kDependentLaunch = 1,  // a kernel launch, the previous launch's programmatic dependent
  kZero = 2,  // zero `bytes` bytes of outputs[slot] from `offset`
};

struct Launch {
  Op op;
  int64_t slot;  // kZero: the output, its offset and byte count
  int64_t offset;
  int64_t bytes;
  void* function;
  unsigned grid[3];
  unsigned threads;
  unsigned shared_bytes;
  std::vector<Parameter> parameters;
};

struct OutputShape {
  int32_t dtype;  // the ScalarType's value, as the shim takes it
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // contiguous
};

struct Program {
  std::vector<OutputShape> outputs;
  size_t returned;
  std::vector<Launch> launches;
};

constexpr size_t kMaxParameters = 64;
constexpr size_t kMaxPrograms = 512;  // classes of call; past it the table starts over

// The class of a call: its flags, then per tensor slot (dtype, device, rank, sizes, strides,
// 16-byte alignment), or -1 for an absent one.
std::vector<int64_t> class_key(const std::vector<std::optional<Tensor>>& tensors, const std::vector<int64_t>& flags) {
  std::vector<int64_t> key(flags);
  key.reserve(flags.size() + tensors.size() * 12);
  for (const auto& slot : tensors) {
    if (!slot.has_value() || !slot->defined()) {
      key.push_back(-1);
      continue;
    }
    const Tensor& t = *slot;
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(t.is_cuda() ? t.get_device_index() : -2);
    const int64_t rank = t.dim();
    key.push_back(rank);
    const auto sizes = t.sizes();
    const auto strides = t.strides();
    for (int64_t d = 0; d < rank; ++d) {
      key.push_back(sizes[d]);
      key.push_back(strides[d]);
    }
    key.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
  }
  return key;
}

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& key) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : key) {
      h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Program>, KeyHash> programs;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: programs may run during exit
  return *instance;
}

std::vector<Parameter> decode_parameters(const std::vector<int64_t>& code, size_t& at, int64_t count) {
  STD_TORCH_CHECK(count >= 0 && static_cast<size_t>(count) <= kMaxParameters,
                  "program_register: a launch takes at most ", kMaxParameters, " parameters, got ", count);
  std::vector<Parameter> parameters;
  for (int64_t i = 0; i < count; ++i) {
    STD_TORCH_CHECK(at + 3 <= code.size(), "program_register: the program ends inside a parameter");
    const int64_t kind = code[at];
    STD_TORCH_CHECK(kind >= 0 && kind <= 3, "program_register: unknown parameter source ", kind);
    parameters.push_back({static_cast<Source>(kind), code[at + 1], code[at + 2]});
    at += 3;
  }
  return parameters;
}

// code: [steps, then per step: its Op, then for a launch: function, grid x, y, z, threads, shared
// bytes, parameters, (source, a, b) per parameter; for a zero: output slot, offset, bytes].
std::vector<Launch> decode_launches(const std::vector<int64_t>& code, size_t inputs,
                                   const std::vector<int64_t>& output_bytes) {
  const size_t outputs = output_bytes.size();
  STD_TORCH_CHECK(!code.empty(), "program_register: the program is empty");
  size_t at = 0;
  const int64_t count = code[at++];
  std::vector<Launch> launches;
  for (int64_t i = 0; i < count; ++i) {
    STD_TORCH_CHECK(at < code.size(), "program_register: the program ends before step ", i);
    Launch launch{};
    const int64_t op = code[at++];
    STD_TORCH_CHECK(op >= 0 && op <= 2, "program_register: unknown step ", op);
    launch.op = static_cast<Op>(op);
    if (launch.op == Op::kZero) {
      STD_TORCH_CHECK(at + 3 <= code.size(), "program_register: the program ends inside a zero step");
      launch.slot = code[at];
      launch.offset = code[at + 1];
      launch.bytes = code[at + 2];
      at += 3;
      STD_TORCH_CHECK(launch.slot >= 0 && static_cast<size_t>(launch.slot) < outputs && launch.offset >= 0 &&
                          launch.bytes >= 0,
                      "program_register: a zero step names output ", launch.slot, " of ", outputs);
      const int64_t size = output_bytes[static_cast<size_t>(launch.slot)];
      STD_TORCH_CHECK(launch.bytes <= size && launch.offset <= size - launch.bytes, "program_register: a zero step of ",
                      launch.bytes, " bytes from ", launch.offset, " overruns output ", launch.slot, " (", size,
                      " bytes)");
      launches.push_back(std::move(launch));
      continue;
    }
    STD_TORCH_CHECK(launch.op == Op::kLaunch || (!launches.empty() && launches.back().op != Op::kZero),
                    "program_register: a dependent launch must follow a launch");
    STD_TORCH_CHECK(at + 7 <= code.size(), "program_register: the program ends inside a launch");
    launch.function = reinterpret_cast<void*>(static_cast<uintptr_t>(code[at]));
    for (int d = 0; d < 3; ++d) {
      STD_TORCH_CHECK(code[at + 1 + d] >= 1 && code[at + 1 + d] <= 0x7fffffff, "program_register: grid dimension ",
                      d, " is ", code[at + 1 + d]);
      launch.grid[d] = static_cast<unsigned>(code[at + 1 + d]);
    }
    launch.threads = static_cast<unsigned>(code[at + 4]);
    launch.shared_bytes = static_cast<unsigned>(code[at + 5]);
    const int64_t parameter_count = code[at + 6];
    at += 7;
    launch.parameters = decode_parameters(code, at, parameter_count);
    for (const Parameter& p : launch.parameters) {
      const bool bad_input = p.source == Source::kInput && (p.a < 0 || static_cast<size_t>(p.a) >= inputs);
      const bool bad_output = p.source == Source::kOutput && (p.a < 0 || static_cast<size_t>(p.a) >= outputs);
      STD_TORCH_CHECK(!bad_input && !bad_output, "program_register: a parameter names tensor ", p.a,
                      " of a call with ", inputs, " tensors and ", outputs, " outputs");
    }
    launches.push_back(std::move(launch));
  }
  STD_TORCH_CHECK(at == code.size(), "program_register: ", code.size() - at, " values after the last step");
  return launches;
}

void program_register(std::vector<std::optional<Tensor>> tensors, std::vector<int64_t> flags,
                      std::vector<Tensor> outputs, int64_t returned, std::vector<int64_t> code) {
  STD_TORCH_CHECK(!tensors.empty() && tensors[0].has_value() && tensors[0]->is_cuda(),
                  "program_register: the first tensor must be a GPU tensor");
  STD_TORCH_CHECK(returned >= 0 && static_cast<size_t>(returned) <= outputs.size(),
                  "program_register: returned must be between 0 and ", outputs.size(), ", got ", returned);
  auto program = std::make_shared<Program>();
  for (const Tensor& out : outputs) {
    const auto sizes = out.sizes();
    OutputShape shape{static_cast<int32_t>(out.scalar_type()), std::vector<int64_t>(sizes.begin(), sizes.end()),
                      std::vector<int64_t>(sizes.size())};
    int64_t stride = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      shape.strides[d] = stride;
      stride *= std::max<int64_t>(sizes[d], 1);
    }
    program->outputs.push_back(std::move(shape));
  }
  program->returned = static_cast<size_t>(returned);
  std::vector<int64_t> output_bytes;  // replayed calls allocate outputs of these sizes
  for (const Tensor& out : outputs) {
    output_bytes.push_back(out.numel() * static_cast<int64_t>(out.element_size()));
  }
  program->launches = decode_launches(code, tensors.size(), output_bytes);
  std::vector<int64_t> key = class_key(tensors, flags);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.programs.size() >= kMaxPrograms) {
    r.programs.clear();
  }
  r.programs[std::move(key)] = std::move(program);
}

uint64_t pointer_bits(const Tensor& t, int64_t offset) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data_ptr())) + static_cast<uint64_t>(offset);
}

std::vector<Tensor> program_run(std::vector<std::optional<Tensor>> tensors, std::vector<int64_t> flags,
                                std::vector<double> scalars) {
  if (tensors.empty() || !tensors[0].has_value()) {
    return {};
  }
  const std::vector<int64_t> key = class_key(tensors, flags);
  std::shared_ptr<const Program> program;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto found = r.programs.find(key);
    if (found == r.programs.end()) {
      return {};
    }
    program = found->second;
  }
  const int32_t device_index = tensors[0]->get_device_index();
  // The kernels were loaded in this device's context: launch there whatever device is current.
  std::optional<torch::stable::accelerator::DeviceGuard> guard;
  if (torch::stable::accelerator::getCurrentDeviceIndex() != device_index) {
    guard.emplace(device_index);
  }
  std::vector<Tensor> outputs;
  outputs.reserve(program->outputs.size());
  for (const OutputShape& shape : program->outputs) {
    // The shim's allocation, not new_empty: that one goes through the boxed dispatcher, which took
    // about 4 us per tensor on the H200's host against about 1 here.
    AtenTensorHandle handle = nullptr;
    TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(shape.sizes.size()), shape.sizes.data(),
                                                    shape.strides.data(), shape.dtype, aoti_torch_device_type_cuda(),
                                                    device_index, &handle));
    outputs.emplace_back(handle);
  }
  const pk_stream_t stream = current_stream(device_index);
  uint64_t values[kMaxParameters + 2];
  void* parameters[kMaxParameters + 2];
  for (const Launch& launch : program->launches) {
    if (launch.op == Op::kZero) {
      void* const address = reinterpret_cast<void*>(pointer_bits(outputs[launch.slot], launch.offset));
      const int result = driver::zero_bytes(address, static_cast<size_t>(launch.bytes), stream);
      STD_TORCH_CHECK(result == 0, "program_run: zeroing a workspace part failed with error ", result);
      continue;
    }
    size_t n = 0;
    for (const Parameter& p : launch.parameters) {
      uint64_t value = 0;
      switch (p.source) {
        case Source::kInput:
          value = pointer_bits(*tensors[p.a], p.b);
          break;
        case Source::kOutput:
          value = pointer_bits(outputs[p.a], p.b);
          break;
        case Source::kConstant:
          value = static_cast<uint64_t>(p.a);
          break;
        case Source::kScalarF32: {
          STD_TORCH_CHECK(p.a >= 0 && static_cast<size_t>(p.a) < scalars.size(), "program_run: scalar ", p.a,
                          " of ", scalars.size());
          const float f = static_cast<float>(scalars[p.a]);
          uint32_t bits;
          std::memcpy(&bits, &f, sizeof(bits));
          value = bits;
          break;
        }
      }
      values[n++] = value;
    }
    const int result = driver::launch(launch.function, launch.grid, launch.threads, launch.shared_bytes, stream,
                                      values, parameters, n, device_index, launch.op == Op::kDependentLaunch);
    STD_TORCH_CHECK(result != driver::kNoDriverLaunch, "program_run: the driver's kernel launch was not found");
    STD_TORCH_CHECK(result == 0, "program_run: a kernel launch failed with driver error ", result);
  }
  outputs.resize(program->returned);
  return outputs;
}

void program_clear() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.programs.clear();
}

}  // namespace
}  // namespace polykernels::programs

// ROCm tensors report the CUDA device type, so one registration serves both vendors. The autograd
// key too: these ops are forward-only (as the Triton path they replay is), so autograd's fallback
// would only add its own dispatch to every call.
STABLE_TORCH_LIBRARY_IMPL(polykernels, CUDA, m) {
  m.impl("program_register", TORCH_BOX(&polykernels::programs::program_register));
  m.impl("program_run", TORCH_BOX(&polykernels::programs::program_run));
}

STABLE_TORCH_LIBRARY_IMPL(polykernels, AutogradCUDA, m) {
  m.impl("program_run", TORCH_BOX(&polykernels::programs::program_run));
}

STABLE_TORCH_LIBRARY_IMPL(polykernels, CompositeExplicitAutograd, m) {
  m.impl("program_clear", TORCH_BOX(&polykernels::programs::program_clear));
}
