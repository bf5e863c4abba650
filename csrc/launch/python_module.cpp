// polykernels._C as a Python module: the direct launch of a compiled Triton kernel.
//
// Why: Triton's own C launcher took 5.6-7.9 us per launch on the H200's host (it parses a dozen
// fixed arguments, checks launch hooks and attributes), and a torch op call costs about 10 us before
// it does anything. An eager norm is one launch and one allocation: these microseconds are most of
// its host time. polykernels._launch calls launch() below for every plain launch (no scratch memory,
// no clusters, no cooperative or dependent launch) once Triton has compiled the kernel.
//
// Python's limited API (abi3, Python >= 3.10): the one wheel serves every Python, as the torch
// stable ABI lets it serve every torch. The module is the same library torch.ops loaded: importing
// it runs no static initializer twice.
#define Py_LIMITED_API 0x030A0000
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "launch/direct_launch.h"

namespace polykernels {
DirectLaunchFn direct_launch = nullptr;
}  // namespace polykernels

namespace {

constexpr size_t kMaxParameters = 64;
constexpr const char* kKernelCapsule = "polykernels._C.kernel";
constexpr const char* kKinds = "pifdx";
PyObject* data_ptr_name = nullptr;  // interned "data_ptr"

// One compiled kernel as the driver launches it, and how to read each runtime argument.
struct Kernel {
  void* function;
  unsigned threads;
  unsigned shared_bytes;
  // Per runtime argument: 'p' an address (an int, or an object with data_ptr()), 'i' an integer,
  // 'f' fp32, 'd' fp64, 'x' not passed (an integer Triton specialized away).
  std::string kinds;
};

void destroy_kernel(PyObject* capsule) {
  delete static_cast<Kernel*>(PyCapsule_GetPointer(capsule, kKernelCapsule));
}

bool read_unsigned(PyObject* value, const char* name, unsigned long long low, unsigned long long high,
                   unsigned long long& out) {
  out = PyLong_AsUnsignedLongLong(value);
  if (PyErr_Occurred() || out < low || out > high) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s must be an int from %llu to %llu", name, low, high);
    return false;
  }
  return true;
}

// kernel(function, threads, shared_bytes, kinds) -> an opaque kernel for launch().
PyObject* make_kernel(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_Format(PyExc_TypeError, "kernel() takes (function, threads, shared_bytes, kinds), got %zd arguments",
                 nargs);
    return nullptr;
  }
  unsigned long long function = 0, threads = 0, shared_bytes = 0;
  if (!read_unsigned(args[0], "function", 1, UINTPTR_MAX, function) ||
      !read_unsigned(args[1], "threads", 1, 1024, threads) ||
      !read_unsigned(args[2], "shared_bytes", 0, 1u << 30, shared_bytes)) {
    return nullptr;
  }
  char* kinds = nullptr;
  Py_ssize_t length = 0;
  if (!PyBytes_Check(args[3]) || PyBytes_AsStringAndSize(args[3], &kinds, &length) != 0) {
    PyErr_Clear();
    PyErr_SetString(PyExc_TypeError, "kinds must be bytes, one of b'pifdx' per runtime argument");
    return nullptr;
  }
  size_t passed = 0;
  for (Py_ssize_t i = 0; i < length; ++i) {
    if (kinds[i] == '\0' || std::strchr(kKinds, kinds[i]) == nullptr) {
      PyErr_Format(PyExc_ValueError, "kinds[%zd] is byte %d: expected one of b'pifdx'", i, kinds[i]);
      return nullptr;
    }
    passed += kinds[i] != 'x';
  }
  if (passed > kMaxParameters) {
    PyErr_Format(PyExc_ValueError, "a kernel takes at most %zu parameters, got %zu", kMaxParameters, passed);
    return nullptr;
  }
  auto* kernel = new Kernel{reinterpret_cast<void*>(static_cast<uintptr_t>(function)), static_cast<unsigned>(threads),
                            static_cast<unsigned>(shared_bytes), std::string(kinds, static_cast<size_t>(length))};
  PyObject* capsule = PyCapsule_New(kernel, kKernelCapsule, destroy_kernel);
  if (capsule == nullptr) {
    delete kernel;
  }
  return capsule;
}

// One runtime argument into its 8-byte slot; false with a Python error set.
bool read_argument(PyObject* arg, char kind, Py_ssize_t index, uint64_t& slot) {
  switch (kind) {
    case 'p': {
      PyObject* address = PyLong_Check(arg) ? (Py_INCREF(arg), arg)
                                            : PyObject_CallMethodObjArgs(arg, data_ptr_name, nullptr);
      if (address == nullptr) {
        break;
      }
      slot = PyLong_AsUnsignedLongLong(address);
      Py_DECREF(address);
      break;
    }
    case 'i': {
      const long long value = PyLong_AsLongLong(arg);
      if (value == -1 && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();  // an unsigned 64-bit value past int64
        slot = PyLong_AsUnsignedLongLong(arg);
      } else {
        slot = static_cast<uint64_t>(value);
      }
      break;
    }
    case 'f': {
      const float value = static_cast<float>(PyFloat_AsDouble(arg));
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof(bits));
      slot = bits;
      break;
    }
    case 'd': {
      const double value = PyFloat_AsDouble(arg);
      std::memcpy(&slot, &value, sizeof(slot));
      break;
    }
  }
  if (PyErr_Occurred()) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_Format(PyExc_TypeError, "launch: argument %zd (kind '%c') could not be read: %S", index, kind,
                 value != nullptr ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return false;
  }
  return true;
}

// launch(kernel, grid_x, grid_y, grid_z, stream, args): args is a tuple or list of the kernel's
// runtime arguments in signature order.
PyObject* launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_Format(PyExc_TypeError, "launch() takes (kernel, grid_x, grid_y, grid_z, stream, args), got %zd arguments",
                 nargs);
    return nullptr;
  }
  if (!PyCapsule_IsValid(args[0], kKernelCapsule)) {
    PyErr_SetString(PyExc_TypeError, "launch: kernel must be what kernel() returned");
    return nullptr;
  }
  const auto* kernel = static_cast<const Kernel*>(PyCapsule_GetPointer(args[0], kKernelCapsule));
  unsigned grid[3];
  for (int d = 0; d < 3; ++d) {
    const unsigned long value = PyLong_AsUnsignedLong(args[1 + d]);
    if (PyErr_Occurred() || value < 1 || value > 0x7fffffffUL) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "launch: grid dimension %d must be an int from 1 to 2^31 - 1", d);
      return nullptr;
    }
    grid[d] = static_cast<unsigned>(value);
  }
  void* stream = PyLong_AsVoidPtr(args[4]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  PyObject* sequence = args[5];
  const bool is_tuple = PyTuple_Check(sequence);
  if (!is_tuple && !PyList_Check(sequence)) {
    PyErr_SetString(PyExc_TypeError, "launch: args must be a tuple or a list");
    return nullptr;
  }
  const Py_ssize_t count = is_tuple ? PyTuple_Size(sequence) : PyList_Size(sequence);
  if (static_cast<size_t>(count) != kernel->kinds.size()) {
    PyErr_Format(PyExc_TypeError, "launch: the kernel takes %zu runtime arguments, got %zd", kernel->kinds.size(),
                 count);
    return nullptr;
  }
  if (polykernels::direct_launch == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "launch: this build of polykernels has no GPU backend");
    return nullptr;
  }
  uint64_t values[kMaxParameters + 2];
  void* parameters[kMaxParameters + 2];
  size_t n = 0;
  for (Py_ssize_t i = 0; i < count; ++i) {
    const char kind = kernel->kinds[static_cast<size_t>(i)];
    if (kind == 'x') {
      continue;
    }
    PyObject* arg = is_tuple ? PyTuple_GetItem(sequence, i) : PyList_GetItem(sequence, i);
    if (arg == nullptr || !read_argument(arg, kind, i, values[n])) {
      return nullptr;
    }
    ++n;
  }
  int result;
  Py_BEGIN_ALLOW_THREADS
  result = polykernels::direct_launch(kernel->function, grid, kernel->threads, kernel->shared_bytes, stream, values,
                                      parameters, n);
  Py_END_ALLOW_THREADS
  if (result != 0) {
    PyErr_Format(PyExc_RuntimeError, "launch: the driver refused the kernel launch (error %d)", result);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* has_gpu_launch(PyObject*, PyObject*) {
  return PyBool_FromLong(polykernels::direct_launch != nullptr);
}

PyMethodDef methods[] = {
    {"kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&make_kernel)), METH_FASTCALL,
     "kernel(function, threads, shared_bytes, kinds): a compiled kernel for launch()."},
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&launch)), METH_FASTCALL,
     "launch(kernel, grid_x, grid_y, grid_z, stream, args): the kernel on the stream."},
    {"has_gpu_launch", &has_gpu_launch, METH_NOARGS, "Whether this build can launch GPU kernels."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "polykernels._C", "polykernels' compiled extension.", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__C() {
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  if (data_ptr_name == nullptr) {
    return nullptr;
  }
  return PyModule_Create(&module);
}
