// Device kernel: a 32-lane group handles kGroupsInFlight quantization groups per loop trip.
// Each lane owns a contiguous run of group_size / 32 elements of every group (one vector load
// when aligned); all the loads of a trip are issued before any reduction, so enough bytes are
// in flight to keep HBM busy. The lanes then reduce min / max / max|x| / non-finite with XOR
// butterflies, and every lane writes its own outputs.
#pragma once

#include <type_traits>

#include "int4_qat/int4_math.h"
#include "polykernels/portable.h"

namespace polykernels::int4 {

// Quantization groups a 32-lane group keeps in flight (loads issued back to back).
constexpr int kGroupsInFlight = 4;

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

template <typename T, int kPerLane, bool kAligned>
__device__ inline void load_run(const T* __restrict__ source, T (&raw)[kPerLane]) {
  if constexpr (kAligned) {
    *reinterpret_cast<Pack<T, kPerLane>*>(raw) = *reinterpret_cast<const Pack<T, kPerLane>*>(source);
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      raw[i] = source[i];
    }
  }
}

template <typename T, int kPerLane, bool kAligned>
__device__ inline void store_run(T* __restrict__ target, const Pack<T, kPerLane>& values) {
  if constexpr (kAligned) {
    *reinterpret_cast<Pack<T, kPerLane>*>(target) = values;
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      target[i] = values.values[i];
    }
  }
}

// kPerLane = group_size / 32. kAligned: x and out allow one vector access per lane.
template <ElementType kType, int kPerLane, bool kCodes, bool kAligned>
__global__ void fake_int4_quant_kernel(const void* __restrict__ x, void* __restrict__ out,
                                       float* __restrict__ scale, int8_t* __restrict__ zero,
                                       int64_t num_groups, bool symmetric) {
  using Storage = std::conditional_t<kType == ElementType::kFloat32, float, uint16_t>;
  constexpr int64_t kGroupSize = int64_t{kPerLane} * PK_GROUP_LANES;
  const int lane = static_cast<int>(threadIdx.x) % PK_GROUP_LANES;
  const int64_t lane_groups_per_block = blockDim.x / PK_GROUP_LANES;
  const int64_t trip_stride = static_cast<int64_t>(gridDim.x) * lane_groups_per_block * kGroupsInFlight;
  int64_t first_group =
      (static_cast<int64_t>(blockIdx.x) * lane_groups_per_block + threadIdx.x / PK_GROUP_LANES) * kGroupsInFlight;

  for (; first_group < num_groups; first_group += trip_stride) {
    // Group indices are uniform across the 32 lanes, so every branch below is lane-uniform.
    Storage raw[kGroupsInFlight][kPerLane];
#pragma unroll
    for (int g = 0; g < kGroupsInFlight; ++g) {
      const int64_t group = first_group + g;
      if (group < num_groups) {
        load_run<Storage, kPerLane, kAligned>(static_cast<const Storage*>(x) + group * kGroupSize +
                                                  int64_t{lane} * kPerLane,
                                              raw[g]);
      }
    }
#pragma unroll
    for (int g = 0; g < kGroupsInFlight; ++g) {
      const int64_t group = first_group + g;
      if (group >= num_groups) {
        break;
      }
      float values[kPerLane];
      GroupStats stats = empty_stats();
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        values[i] = load_element<kType>(raw[g], i);
        accumulate(stats, values[i]);
      }
      stats = reduce_group(stats);
      const GroupParams params = group_params(stats, symmetric);
      if (lane == 0) {
        scale[group] = params.scale;
        zero[group] = static_cast<int8_t>(params.zero);
      }
      const int64_t first = group * kGroupSize + int64_t{lane} * kPerLane;
      if constexpr (kCodes) {
        Pack<int8_t, kPerLane> codes;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          codes.values[i] = is_nan(params.scale) ? 0 : static_cast<int8_t>(quant_code(values[i], params, symmetric));
        }
        store_run<int8_t, kPerLane, kAligned>(static_cast<int8_t*>(out) + first, codes);
      } else {
        Pack<Storage, kPerLane> result;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          store_element<kType>(result.values, i, fake_quant(values[i], params, symmetric));
        }
        store_run<Storage, kPerLane, kAligned>(static_cast<Storage*>(out) + first, result);
      }
    }
  }
}

}  // namespace polykernels::int4
