// Device kernel: one 32-lane group per quantization group. Each lane owns a contiguous run
// of group_size / 32 elements (one vector load when aligned), the lanes reduce min / max /
// max|x| / non-finite with XOR butterflies, and every lane then writes its own outputs.
#pragma once

#include "int4_qat/int4_math.h"
#include "polykernels/portable.h"

namespace polykernels::int4 {

template <typename T, int kCount>
struct alignas(sizeof(T) * kCount) Pack {
  T values[kCount];
};

__device__ inline GroupStats reduce_group(GroupStats stats) {
#pragma unroll
  for (int lane_mask = PK_GROUP_LANES / 2; lane_mask > 0; lane_mask /= 2) {
    GroupStats other;
    other.min_value = PK_SHFL_XOR32(stats.min_value, lane_mask);
    other.max_value = PK_SHFL_XOR32(stats.max_value, lane_mask);
    other.max_abs = PK_SHFL_XOR32(stats.max_abs, lane_mask);
    other.non_finite = PK_SHFL_XOR32(static_cast<int>(stats.non_finite), lane_mask) != 0;
    merge(stats, other);
  }
  return stats;
}

// kPerLane = group_size / 32. kAligned: x and out allow one vector access per lane.
template <ElementType kType, int kPerLane, bool kCodes, bool kAligned>
__global__ void fake_int4_quant_kernel(const void* __restrict__ x, void* __restrict__ out,
                                       float* __restrict__ scale, int8_t* __restrict__ zero,
                                       int64_t num_groups, bool symmetric) {
  using Storage = std::conditional_t<kType == ElementType::kFloat32, float, uint16_t>;
  constexpr int64_t kGroupSize = int64_t{kPerLane} * PK_GROUP_LANES;
  const int lane = static_cast<int>(threadIdx.x) % PK_GROUP_LANES;
  const int64_t groups_per_block = blockDim.x / PK_GROUP_LANES;
  const int64_t group_stride = static_cast<int64_t>(gridDim.x) * groups_per_block;
  int64_t group = static_cast<int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / PK_GROUP_LANES;

  for (; group < num_groups; group += group_stride) {
    const int64_t first = group * kGroupSize + int64_t{lane} * kPerLane;
    Storage raw[kPerLane];
    if constexpr (kAligned) {
      *reinterpret_cast<Pack<Storage, kPerLane>*>(raw) =
          *reinterpret_cast<const Pack<Storage, kPerLane>*>(static_cast<const Storage*>(x) + first);
    } else {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        raw[i] = static_cast<const Storage*>(x)[first + i];
      }
    }
    float values[kPerLane];
    GroupStats stats = empty_stats();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      values[i] = load_element<kType>(raw, i);
      accumulate(stats, values[i]);
    }
    stats = reduce_group(stats);
    const GroupParams params = group_params(stats, symmetric);
    if (lane == 0) {
      scale[group] = params.scale;
      zero[group] = static_cast<int8_t>(params.zero);
    }
    if constexpr (kCodes) {
      Pack<int8_t, kPerLane> codes;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        codes.values[i] = is_nan(params.scale) ? 0 : static_cast<int8_t>(quant_code(values[i], params, symmetric));
      }
      if constexpr (kAligned) {
        *reinterpret_cast<Pack<int8_t, kPerLane>*>(static_cast<int8_t*>(out) + first) = codes;
      } else {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          static_cast<int8_t*>(out)[first + i] = codes.values[i];
        }
      }
    } else {
      Pack<Storage, kPerLane> result;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        store_element<kType>(result.values, i, fake_quant(values[i], params, symmetric));
      }
      if constexpr (kAligned) {
        *reinterpret_cast<Pack<Storage, kPerLane>*>(static_cast<Storage*>(out) + first) = result;
      } else {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          static_cast<Storage*>(out)[first + i] = result.values[i];
        }
      }
    }
  }
}

}  // namespace polykernels::int4
