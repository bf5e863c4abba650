// CUDA and HIP launcher for fake_int4_quant, one source for nvcc and hipcc.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "int4_qat/entry.h"
#include "int4_qat/fake_int4_quant_kernel.cuh"
#include "polykernels/portable.h"
#include "polykernels/stream.h"

namespace polykernels::int4 {
namespace {

using torch::stable::Tensor;

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = (int64_t{1} << 31) - 1;  // CUDA grid.x limit

template <ElementType kType, int kGroupSize, bool kCodes, bool kSymmetric>
void launch(const Tensor& x, Tensor& out, Tensor& scale, Tensor& zero, pk_stream_t stream) {
  constexpr int kPerLane = per_lane<kType, kGroupSize>();
  constexpr int64_t kGroupsPerBlock =
      int64_t{kThreadsPerBlock} / PK_GROUP_LANES * (PK_GROUP_LANES / (kGroupSize / kPerLane)) * kGroupsInFlight;
  const int64_t num_groups = scale.numel();
  // One trip per lane: enough blocks in flight to cover every SM many times for any real tensor.
  const int64_t blocks = (num_groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
  STD_TORCH_CHECK(blocks <= kMaxBlocks, "fake_int4_quant: tensor too large for one launch (", num_groups, " groups)");
  constexpr uintptr_t kXAlign = uintptr_t{ElementBytes<kType>::value} * kPerLane;
  constexpr uintptr_t kOutAlign = kCodes ? uintptr_t{kPerLane} : kXAlign;
  const bool aligned = reinterpret_cast<uintptr_t>(x.data_ptr()) % kXAlign == 0 &&
                       reinterpret_cast<uintptr_t>(out.data_ptr()) % kOutAlign == 0;
  auto* scale_ptr = static_cast<float*>(scale.data_ptr());
  auto* zero_ptr = static_cast<int8_t*>(zero.data_ptr());
  const auto grid = static_cast<unsigned int>(blocks);
  if (aligned) {
    fake_int4_quant_kernel<kType, kGroupSize, kCodes, kSymmetric, true><<<grid, kThreadsPerBlock, 0, stream>>>(
        x.data_ptr(), out.data_ptr(), scale_ptr, zero_ptr, num_groups);
  } else {
    fake_int4_quant_kernel<kType, kGroupSize, kCodes, kSymmetric, false><<<grid, kThreadsPerBlock, 0, stream>>>(
        x.data_ptr(), out.data_ptr(), scale_ptr, zero_ptr, num_groups);
  }
  PK_CHECK_LAUNCH("fake_int4_quant_kernel");
}

template <ElementType kType, int kGroupSize, bool kCodes>
void dispatch_mode(const Tensor& x, Tensor& out, Tensor& scale, Tensor& zero, bool symmetric, pk_stream_t stream) {
  if (symmetric) {
    launch<kType, kGroupSize, kCodes, true>(x, out, scale, zero, stream);
  } else {
    launch<kType, kGroupSize, kCodes, false>(x, out, scale, zero, stream);
  }
}

template <ElementType kType, bool kCodes>
void dispatch_group_size(const Tensor& x, Tensor& out, Tensor& scale, Tensor& zero, int64_t group_size,
                         bool symmetric, pk_stream_t stream) {
  switch (group_size) {
    case 32:
      return dispatch_mode<kType, 32, kCodes>(x, out, scale, zero, symmetric, stream);
    case 64:
      return dispatch_mode<kType, 64, kCodes>(x, out, scale, zero, symmetric, stream);
    case 128:
      return dispatch_mode<kType, 128, kCodes>(x, out, scale, zero, symmetric, stream);
    default:
      return dispatch_mode<kType, 256, kCodes>(x, out, scale, zero, symmetric, stream);
  }
}

template <bool kCodes>
std::tuple<Tensor, Tensor, Tensor> run_gpu(Tensor x, int64_t group_size, bool symmetric) {
  const ElementType type = check_inputs(x, group_size);
  auto [out, scale, zero] = make_outputs(x, group_size, kCodes);
  if (scale.numel() == 0) {
    return {out, scale, zero};
  }
  const int32_t device_index = x.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device_index);
  const pk_stream_t stream = current_stream(device_index);
  switch (type) {
    case ElementType::kFloat32:
      dispatch_group_size<ElementType::kFloat32, kCodes>(x, out, scale, zero, group_size, symmetric, stream);
      break;
    case ElementType::kFloat16:
      dispatch_group_size<ElementType::kFloat16, kCodes>(x, out, scale, zero, group_size, symmetric, stream);
      break;
    case ElementType::kBFloat16:
      dispatch_group_size<ElementType::kBFloat16, kCodes>(x, out, scale, zero, group_size, symmetric, stream);
      break;
  }
  return {out, scale, zero};
}

std::tuple<Tensor, Tensor, Tensor> fake_int4_quant_gpu(Tensor x, int64_t group_size, bool symmetric) {
  return run_gpu<false>(x, group_size, symmetric);
}

std::tuple<Tensor, Tensor, Tensor> int4_quant_codes_gpu(Tensor x, int64_t group_size, bool symmetric) {
  return run_gpu<true>(x, group_size, symmetric);
}

}  // namespace
}  // namespace polykernels::int4

// ROCm tensors report the CUDA device type, so one registration serves both vendors.
STABLE_TORCH_LIBRARY_IMPL(polykernels, CUDA, m) {
  m.impl("fake_int4_quant", TORCH_BOX(&polykernels::int4::fake_int4_quant_gpu));
  m.impl("int4_quant_codes", TORCH_BOX(&polykernels::int4::int4_quant_codes_gpu));
}
