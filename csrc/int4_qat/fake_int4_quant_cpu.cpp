// CPU kernel and the op schema. The CPU path is the reference implementation compiled from
// the same int4_math.h as the GPU kernels, so CPU and GPU agree bit for bit.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "int4_qat/entry.h"
#include "int4_qat/int4_math.h"

namespace polykernels::int4 {
namespace {

using torch::stable::Tensor;

template <ElementType kType, bool kCodes>
void quantize_groups(const void* x, void* out, float* scale, int8_t* zero, int64_t group_size,
                     bool symmetric, int64_t first_group, int64_t end_group) {
  for (int64_t group = first_group; group < end_group; ++group) {
    const int64_t base = group * group_size;
    GroupStats stats = empty_stats();
    for (int64_t i = 0; i < group_size; ++i) {
      accumulate(stats, load_element<kType>(x, base + i));
    }
    const GroupParams params = group_params(stats, symmetric);
    scale[group] = params.scale;
    zero[group] = static_cast<int8_t>(params.zero);
    const bool nan_group = is_nan(params.scale);
    const float reciprocal = 1.0f / params.scale;
    const float threshold = tie_threshold(group_max_abs(stats, symmetric), reciprocal);
    for (int64_t i = 0; i < group_size; ++i) {
      const float value = load_element<kType>(x, base + i);
      const float code = code_of(rounded_quotient(value, params.scale, reciprocal, threshold), params, symmetric);
      if constexpr (kCodes) {
        static_cast<int8_t*>(out)[base + i] = nan_group ? 0 : static_cast<int8_t>(code);
      } else {
        store_element<kType>(out, base + i, nan_group ? NAN : dequant(code, params));
      }
    }
  }
}

template <bool kCodes>
std::tuple<Tensor, Tensor, Tensor> run_cpu(Tensor x, int64_t group_size, bool symmetric) {
  const ElementType type = check_inputs(x, group_size);
  auto [out, scale, zero] = make_outputs(x, group_size, kCodes);
  const int64_t num_groups = x.numel() / group_size;
  if (num_groups == 0) {
    return {out, scale, zero};
  }
  const void* x_ptr = x.data_ptr();
  void* out_ptr = out.data_ptr();
  auto* scale_ptr = static_cast<float*>(scale.data_ptr());
  auto* zero_ptr = static_cast<int8_t*>(zero.data_ptr());
  const int64_t grain = 16384 / group_size;
  torch::stable::parallel_for(0, num_groups, grain, [&](int64_t begin, int64_t end) {
    switch (type) {
      case ElementType::kFloat32:
        quantize_groups<ElementType::kFloat32, kCodes>(x_ptr, out_ptr, scale_ptr, zero_ptr, group_size,
                                                        symmetric, begin, end);
        break;
      case ElementType::kFloat16:
        quantize_groups<ElementType::kFloat16, kCodes>(x_ptr, out_ptr, scale_ptr, zero_ptr, group_size,
                                                        symmetric, begin, end);
        break;
      case ElementType::kBFloat16:
        quantize_groups<ElementType::kBFloat16, kCodes>(x_ptr, out_ptr, scale_ptr, zero_ptr, group_size,
                                                         symmetric, begin, end);
        break;
    }
  });
  return {out, scale, zero};
}

std::tuple<Tensor, Tensor, Tensor> fake_int4_quant_cpu(Tensor x, int64_t group_size, bool symmetric) {
  return run_cpu<false>(x, group_size, symmetric);
}

std::tuple<Tensor, Tensor, Tensor> int4_quant_codes_cpu(Tensor x, int64_t group_size, bool symmetric) {
  return run_cpu<true>(x, group_size, symmetric);
}

}  // namespace
}  // namespace polykernels::int4

STABLE_TORCH_LIBRARY(polykernels, m) {
  m.def("fake_int4_quant(Tensor x, int group_size, bool symmetric) -> (Tensor, Tensor, Tensor)");
  m.def("int4_quant_codes(Tensor x, int group_size, bool symmetric) -> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(polykernels, CPU, m) {
  m.impl("fake_int4_quant", TORCH_BOX(&polykernels::int4::fake_int4_quant_cpu));
  m.impl("int4_quant_codes", TORCH_BOX(&polykernels::int4::int4_quant_codes_cpu));
}
