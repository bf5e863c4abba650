// Input validation and output allocation shared by the CPU and GPU entry points. The Python wrapper checks the
// same contract first with friendlier messages; these checks keep direct torch.ops callers
// from reaching a kernel with a shape it cannot handle.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "int4_qat/int4_math.h"

namespace polykernels::int4 {

inline ElementType check_inputs(const torch::stable::Tensor& x, int64_t group_size) {
  using torch::headeronly::ScalarType;
  STD_TORCH_CHECK(group_size == 32 || group_size == 64 || group_size == 128 || group_size == 256,
                  "fake_int4_quant: group_size must be one of 32, 64, 128, 256, got ", group_size);
  STD_TORCH_CHECK(x.dim() >= 1, "fake_int4_quant: x must have at least one dimension");
  STD_TORCH_CHECK(x.is_contiguous(), "fake_int4_quant: x must be contiguous");
  int64_t last = x.size(x.dim() - 1);
  STD_TORCH_CHECK(last % group_size == 0, "fake_int4_quant: the last dimension of x (", last,
                  ") must be divisible by group_size (", group_size, ")");
  switch (x.scalar_type()) {
    case ScalarType::Float:
      return ElementType::kFloat32;
    case ScalarType::Half:
      return ElementType::kFloat16;
    case ScalarType::BFloat16:
      return ElementType::kBFloat16;
    default:
      STD_TORCH_CHECK(false, "fake_int4_quant: x must be float32, float16 or bfloat16");
  }
  return ElementType::kFloat32;
}

// A contiguous tensor on x's device, through the shim's allocation: stable new_empty goes through the
// boxed dispatcher, which took about 4 us per tensor on the H200's host against about 1 here.
inline torch::stable::Tensor empty_on(const torch::stable::Tensor& x, const std::vector<int64_t>& sizes,
                                      torch::headeronly::ScalarType dtype) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  const int32_t device_type = x.is_cuda() ? aoti_torch_device_type_cuda() : aoti_torch_device_type_cpu();
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(),
                                                  static_cast<int32_t>(dtype), device_type, x.get_device_index(),
                                                  &handle));
  return torch::stable::Tensor(handle);
}

// (out or codes, scale, zero): out keeps x's dtype, codes are int8; scale is fp32 and zero
// int8 with one entry per group. Both kernels write every group's scale and zero (0 in symmetric
// mode), so none starts filled.
inline std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor> make_outputs(
    const torch::stable::Tensor& x, int64_t group_size, bool codes) {
  using torch::headeronly::ScalarType;
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    shape.push_back(x.size(d));
  }
  std::vector<int64_t> group_shape(shape);
  group_shape.back() /= group_size;
  return {empty_on(x, shape, codes ? ScalarType::Char : x.scalar_type()), empty_on(x, group_shape, ScalarType::Float),
          empty_on(x, group_shape, ScalarType::Char)};
}

}  // namespace polykernels::int4
