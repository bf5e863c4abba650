// The driver's kernel launch of a compiled Triton kernel, shared by the launch programs
// (program.cu) and the direct launch Python calls (direct_launch.cu). One source for nvcc and hipcc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "polykernels/portable.h"

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
// Through the runtime's entry-point query: the extension links libcudart only, not libcuda.
// nullptr when the driver does not have it.
inline LaunchKernelFn launch_kernel_fn() {
  static const LaunchKernelFn fn = [] {
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t error =
        cudaGetDriverEntryPointByVersion("cuLaunchKernel", &symbol, 12000, cudaEnableDefault, &found);
    const bool ok = error == cudaSuccess && found == cudaDriverEntryPointSuccess && symbol != nullptr;
    return ok ? reinterpret_cast<LaunchKernelFn>(symbol) : nullptr;
  }();
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

// Launches `function` with the `count` parameters in values[0..count) (8-byte little-endian slots:
// the driver reads each parameter's own size from its start), then the two scratch pointers every
// Triton kernel takes after its own (null: no kernel that needs scratch memory comes here). values
// and parameters have room for count + 2. device_index: the device whose context loaded the kernel
// (-1: the runtime's current one), made current when this thread has none. Returns the driver's
// error code (0: launched).
inline int launch(void* function, const unsigned grid[3], unsigned threads, unsigned shared_bytes, pk_stream_t stream,
                  uint64_t* values, void** parameters, size_t count, int32_t device_index) {
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
  int result = launch_kernel(function, grid[0], grid[1], grid[2], threads, 1, 1, shared_bytes, stream, parameters,
                             nullptr);
  if (result == kInvalidContext) {
    bind_device_context(device_index >= 0 ? device_index : current_device());
    result = launch_kernel(function, grid[0], grid[1], grid[2], threads, 1, 1, shared_bytes, stream, parameters,
                           nullptr);
  }
  return result;
}

}  // namespace polykernels::driver
