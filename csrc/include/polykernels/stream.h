// The current GPU stream of a device, for CUDA and HIP launches alike.
#pragma once

#include <torch/csrc/stable/accelerator.h>

#include <cstdint>

#include "polykernels/portable.h"

// Spelled as a number: headers older than 2.13 do not define TORCH_VERSION_2_13_0, and an
// undefined macro in #if silently reads as 0.
#define PK_STABLE_2_13 0x020d000000000000ULL
#if TORCH_FEATURE_VERSION < PK_STABLE_2_13
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#endif

namespace polykernels {

inline pk_stream_t current_stream(int32_t device_index) {
#if TORCH_FEATURE_VERSION >= PK_STABLE_2_13
  return static_cast<pk_stream_t>(torch::stable::accelerator::getCurrentStream(device_index).nativeHandle());
#else
  // Before 2.13 the stable ABI offers only the CUDA-named shim (CUDA builds target 2.11).
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream));
  return static_cast<pk_stream_t>(stream);
#endif
}

}  // namespace polykernels
