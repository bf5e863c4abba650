// The driver's kernel launch of a compiled Triton kernel, shared by the launch programs
// (program.cu) and the direct launch Python calls (direct_launch.cu). One source for nvcc and hipcc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "polykernels/portable.h"

#if !defined(__HIPCC__)
#include <cuda.h>  // the driver's types only (CUlaunchConfig): its functions come through the runtime
#endif

namespace polykernels::driver {

// cuLaunchKernel and hipModuleLaunchKernel take the same arguments.
using LaunchKernelFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               pk_stream_t, void**, void**);

// CUDA_ERROR_INVALID_CONTEXT: a thread that has not touched the device through the runtime yet.
constexpr int kInvalidContext = 201;
// Returned by launch() when the driver has no kernel launch to give (not a driver error code).
constexpr int kNoDriverLaunch = -1;

#if defined(__HIPCC__)
inline LaunchKernelFn launch_kernel_fn() {
  return reinterpret_cast<LaunchKernelFn>(&hipModuleLaunchKernel);
}
#else
using LaunchKernelExFn = int (*)(const CUlaunchConfig*, void*, void**, void**);

// A driver function through the runtime's entry-point query (the extension links libcudart only, not
// libcuda); nullptr when the driver does not have it.
template <typename Fn>
Fn driver_function(const char* name) {
  void* symbol = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t error = cudaGetDriverEntryPointByVersion(name, &symbol, 12000, cudaEnableDefault, &found);
  const bool ok = error == cudaSuccess && found == cudaDriverEntryPointSuccess && symbol != nullptr;
  return ok ? reinterpret_cast<Fn>(symbol) : nullptr;
}

inline LaunchKernelFn launch_kernel_fn() {
  static const LaunchKernelFn fn = driver_function<LaunchKernelFn>("cuLaunchKernel");
  return fn;
}

// cuLaunchKernelEx, for programmatic-dependent launches.
inline LaunchKernelExFn launch_kernel_ex_fn() {
  static const LaunchKernelExFn fn = driver_function<LaunchKernelExFn>("cuLaunchKernelEx");
  return fn;
}
#endif

inline void bind_device_context(int32_t device_index) {
#if !defined(__HIPCC__)
  cudaSetDevice(device_index);
  cudaFree(nullptr);  // makes the device's primary context current on this thread
#else
  (void)device_index;
#endif
}

// The device the runtime has current on this thread (the one torch.cuda.set_device chose).
inline int32_t current_device() {
  int device = 0;
#if defined(__HIPCC__)
  (void)hipGetDevice(&device);
#else
  (void)cudaGetDevice(&device);
#endif
  return device;
}

// A programmatic-dependent launch: the kernel may start once every program of the launch before it
// on the stream has executed griddepcontrol.launch_dependents (or exited), and runs beside it.
// NVIDIA only: kNoDriverLaunch elsewhere (no ROCm kernel is launched this way).
inline int launch_dependent(void* function, const unsigned grid[3], unsigned threads, unsigned shared_bytes,
                            pk_stream_t stream, void** parameters) {
#if defined(__HIPCC__)
  (void)function, (void)grid, (void)threads, (void)shared_bytes, (void)stream, (void)parameters;
  return kNoDriverLaunch;
#else
  const LaunchKernelExFn launch_kernel_ex = launch_kernel_ex_fn();
  if (launch_kernel_ex == nullptr) {
    return kNoDriverLaunch;
  }
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = grid[0];
  config.gridDimY = grid[1];
  config.gridDimZ = grid[2];
  config.blockDimX = threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = shared_bytes;
  config.hStream = reinterpret_cast<CUstream>(stream);
  config.attrs = &attribute;
  config.numAttrs = 1;
  return launch_kernel_ex(&config, function, parameters, nullptr);
#endif
}

// Zeroes `bytes` bytes at `address` on `stream`; the runtime's error code (0: done).
inline int zero_bytes(void* address, size_t bytes, pk_stream_t stream) {
#if defined(__HIPCC__)
  return static_cast<int>(hipMemsetAsync(address, 0, bytes, stream));
#else
  return static_cast<int>(cudaMemsetAsync(address, 0, bytes, stream));
#endif
}

// Launches `function` with the `count` parameters in values[0..count) (8-byte little-endian slots:
// the driver reads each parameter's own size from its start), then the two scratch pointers every
// Triton kernel takes after its own (null: no kernel that needs scratch memory comes here). values
// and parameters have room for count + 2. device_index: the device whose context loaded the kernel
// (-1: the runtime's current one), made current when this thread has none. dependent: a
// programmatic-dependent launch (launch_dependent). Returns the driver's error code (0: launched).
inline int launch(void* function, const unsigned grid[3], unsigned threads, unsigned shared_bytes, pk_stream_t stream,
                  uint64_t* values, void** parameters, size_t count, int32_t device_index, bool dependent = false) {
  const LaunchKernelFn launch_kernel = launch_kernel_fn();
  if (launch_kernel == nullptr) {
    return kNoDriverLaunch;
  }
  for (size_t i = 0; i < count; ++i) {
    parameters[i] = &values[i];
  }
  values[count] = 0;  // global scratch
  values[count + 1] = 0;  // profile scratch
  parameters[count] = &values[count];
  parameters[count + 1] = &values[count + 1];
  const auto once = [&] {
    return dependent ? launch_dependent(function, grid, threads, shared_bytes, stream, parameters)
                     : launch_kernel(function, grid[0], grid[1], grid[2], threads, 1, 1, shared_bytes, stream,
                                     parameters, nullptr);
  };
  int result = once();
  if (result == kInvalidContext) {
    bind_device_context(device_index >= 0 ? device_index : current_device());
    result = once();
  }
  return result;
}

}  // namespace polykernels::driver
