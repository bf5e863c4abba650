// The one place where CUDA and HIP differ for polykernels' device code.
//
// Everything vendor-specific is a macro or alias here; kernels include this header and
// nothing from <cuda_runtime.h> or <hip/hip_runtime.h> directly. The seed bug this guards
// against: a kernel calling __shfl_xor_sync(0xffffffff, ...) does not compile under hipcc,
// whose _sync shuffles take a 64-bit mask (wavefronts are 64 lanes wide).
#pragma once

#include <cstdint>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define PK_GPU 1
#define PK_HOST_DEVICE __host__ __device__
// 32-lane sub-groups of a 64-lane wavefront: the maskless form with an explicit width.
#define PK_SHFL_XOR32(value, lane_mask) __shfl_xor((value), (lane_mask), 32)
using pk_stream_t = hipStream_t;
using pk_error_t = hipError_t;
#define PK_LAST_ERROR() hipGetLastError()
#define PK_ERROR_STRING(err) hipGetErrorString(err)
#define PK_SUCCESS hipSuccess
#elif defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define PK_GPU 1
#define PK_HOST_DEVICE __host__ __device__
#define PK_SHFL_XOR32(value, lane_mask) __shfl_xor_sync(0xffffffffu, (value), (lane_mask), 32)
using pk_stream_t = cudaStream_t;
using pk_error_t = cudaError_t;
#define PK_LAST_ERROR() cudaGetLastError()
#define PK_ERROR_STRING(err) cudaGetErrorString(err)
#define PK_SUCCESS cudaSuccess
#else
#define PK_HOST_DEVICE
#endif

// Round-to-nearest-even conversion of a FINITE fp32 value to bf16 / fp16 bits. NVIDIA has one
// instruction for each (cvt.rn.bf16.f32, cvt.rn.f16.f32) with the same result as the portable
// bit arithmetic of float_bits.h, which serves everywhere else. NaN is excluded: the instruction's
// NaN bits differ from PyTorch's canonical NaN.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PK_FINITE_TO_BF16(value) __bfloat16_as_ushort(__float2bfloat16_rn(value))
#define PK_FINITE_TO_HALF(value) __half_as_ushort(__float2half_rn(value))
#else
#define PK_FINITE_TO_BF16(value) ::polykernels::float_to_bf16(value)
#define PK_FINITE_TO_HALF(value) ::polykernels::float_to_half(value)
#endif

// 16-byte loads and stores of data touched once (a tensor streamed through the GPU): the cache
// lines are marked first to evict, so they do not push out lines other lanes still need. On the
// H200 this took the INT4 kernel from 77% to 88% of a device copy. CUDA: ld.global.cs/st.global.cs;
// HIP: LLVM's nontemporal access (the slc/nt bits on gfx942 and gfx950).
#if defined(__HIPCC__)
typedef unsigned int pk_vec16_t __attribute__((ext_vector_type(4)));
#define PK_LOAD_STREAMING(pointer) __builtin_nontemporal_load(pointer)
#define PK_STORE_STREAMING(pointer, value) __builtin_nontemporal_store((value), (pointer))
#elif defined(__CUDACC__)
using pk_vec16_t = uint4;
#define PK_LOAD_STREAMING(pointer) __ldcs(pointer)
#define PK_STORE_STREAMING(pointer, value) __stcs((pointer), (value))
#endif

// The smallest and largest of 2 x kWords bf16 values packed in 32-bit words (of their absolute
// values with kAbs), both NaN when any value is NaN. NVIDIA sm_80+ has packed bf16x2 min/max that
// propagate NaN: one instruction for two elements, where the fp32 path needs four (two conversions,
// a comparison and a NaN check); on the H200 that took the asymmetric INT4 kernel from 75% to 78%
// of a device copy. Declared everywhere so kernels can name it; defined, and announced by
// PK_HAS_BF16X2_EXTREMES, only where it exists.
#if defined(PK_GPU)
template <int kWords, bool kAbs>
__device__ float2 pk_bf16x2_extremes(const uint32_t* words);
#endif
#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PK_HAS_BF16X2_EXTREMES 1
template <int kWords, bool kAbs>
__device__ inline float2 pk_bf16x2_extremes(const uint32_t* words) {
  __nv_bfloat162 low = *reinterpret_cast<const __nv_bfloat162*>(&words[0]);
  if constexpr (kAbs) {
    low = __habs2(low);
  }
  __nv_bfloat162 high = low;
#pragma unroll
  for (int i = 1; i < kWords; ++i) {
    __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&words[i]);
    if constexpr (kAbs) {
      pair = __habs2(pair);
    }
    low = __hmin2_nan(low, pair);
    high = __hmax2_nan(high, pair);
  }
  if (__hisnan(high.x) || __hisnan(high.y)) {
    return make_float2(NAN, NAN);
  }
  return make_float2(fminf(__low2float(low), __high2float(low)), fmaxf(__low2float(high), __high2float(high)));
}
#endif

// Lanes that cooperate on one reduction. 32 on both vendors: on AMD's 64-wide wavefronts a
// group is a half-wavefront, which the width argument of the shuffle expresses.
#define PK_GROUP_LANES 32

#if defined(PK_GPU)
#include <torch/headeronly/util/Exception.h>
// Launch errors surface as a torch error naming the kernel, on either vendor.
#define PK_CHECK_LAUNCH(kernel_name)                                                    \
  do {                                                                                  \
    pk_error_t pk_err_ = PK_LAST_ERROR();                                               \
    STD_TORCH_CHECK(pk_err_ == PK_SUCCESS, "polykernels: launching ", kernel_name,      \
                    " failed: ", PK_ERROR_STRING(pk_err_));                             \
  } while (0)
#endif
