// Device kernel: every lane loads 16 bytes of a quantization group per access, so a group
// spans group_bytes / 16 lanes (4 to 32) and a 32-lane set works on several groups at once;
// kGroupsInFlight such sets of loads are issued before any reduction, so each lane keeps
// 64 bytes in flight. The loads and stores are streaming (portable.h): x and out are touched
// once. The lanes of a group reduce with XOR butterflies over their own span
// (masks below the span keep the exchange inside it), one value per step in symmetric mode
// (max|x|, with non-finite groups raised to +inf) and two in asymmetric mode (min, max).
//
// x / scale, rounded to an integer, is int4_math.h's rounded_quotient: a multiply by the group's
// reciprocal, the IEEE division only near a tie, one compare per element against the group's
// tie_threshold. Bits stay equal to the CPU kernel's, which runs the same functions.
#pragma once

#include <type_traits>

#include "int4_qat/int4_math.h"
#include "polykernels/portable.h"

namespace polykernels::int4 {

#if defined(PK_HAS_BF16X2_EXTREMES)
constexpr bool kBf16x2Extremes = true;
#else
constexpr bool kBf16x2Extremes = false;
#endif

// Sets of 32 lanes' loads issued back to back before the first reduction.
constexpr int kGroupsInFlight = 4;
constexpr int kLaneBytes = 16;

template <typename T, int kCount>
struct alignas(sizeof(T) * kCount) Pack {
  T values[kCount];
};

// Elements per lane: one 16-byte access, or more where a group would need more than 32 lanes.
template <ElementType kType, int kGroupSize>
PK_HOST_DEVICE constexpr int per_lane() {
  constexpr int vector = kLaneBytes / ElementBytes<kType>::value;
  return kGroupSize / vector > PK_GROUP_LANES ? kGroupSize / PK_GROUP_LANES : vector;
}

template <int kSpan>
__device__ inline float reduce_max(float value) {
#pragma unroll
  for (int lane_mask = kSpan / 2; lane_mask > 0; lane_mask /= 2) {
    value = fmaxf(value, PK_SHFL_XOR32(value, lane_mask));
  }
  return value;
}

template <int kSpan>
__device__ inline float reduce_min(float value) {
#pragma unroll
  for (int lane_mask = kSpan / 2; lane_mask > 0; lane_mask /= 2) {
    value = fminf(value, PK_SHFL_XOR32(value, lane_mask));
  }
  return value;
}

// Each element is read and written exactly once: 16-byte runs go through the streaming access.
template <typename T, int kPerLane>
constexpr bool kStreamed = sizeof(T) * kPerLane == sizeof(pk_vec16_t);

template <typename T, int kPerLane, bool kAligned>
__device__ inline void load_run(const T* __restrict__ source, T (&raw)[kPerLane]) {
  if constexpr (kAligned && kStreamed<T, kPerLane>) {
    *reinterpret_cast<pk_vec16_t*>(raw) = PK_LOAD_STREAMING(reinterpret_cast<const pk_vec16_t*>(source));
  } else if constexpr (kAligned) {
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
  if constexpr (kAligned && kStreamed<T, kPerLane>) {
    PK_STORE_STREAMING(reinterpret_cast<pk_vec16_t*>(target), *reinterpret_cast<const pk_vec16_t*>(values.values));
  } else if constexpr (kAligned) {
    *reinterpret_cast<Pack<T, kPerLane>*>(target) = values;
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      target[i] = values.values[i];
    }
  }
}

template <ElementType kType, int kGroupSize, bool kCodes, bool kSymmetric, bool kAligned>
__global__ void fake_int4_quant_kernel(const void* __restrict__ x, void* __restrict__ out,
                                       float* __restrict__ scale, int8_t* __restrict__ zero, int64_t num_groups) {
  using Storage = std::conditional_t<kType == ElementType::kFloat32, float, uint16_t>;
  constexpr int kPerLane = per_lane<kType, kGroupSize>();
  constexpr int kSpan = kGroupSize / kPerLane;  // lanes per group
  constexpr int kGroupsPerSet = PK_GROUP_LANES / kSpan;
  const int lane = static_cast<int>(threadIdx.x) % PK_GROUP_LANES;
  const int set_in_block = static_cast<int>(threadIdx.x) / PK_GROUP_LANES;
  const int64_t sets_per_block = blockDim.x / PK_GROUP_LANES;
  const int64_t first_group =
      (static_cast<int64_t>(blockIdx.x) * sets_per_block + set_in_block) * kGroupsPerSet * kGroupsInFlight +
      lane / kSpan;
  const int64_t lane_offset = int64_t{lane % kSpan} * kPerLane;

  Storage raw[kGroupsInFlight][kPerLane];
#pragma unroll
  for (int g = 0; g < kGroupsInFlight; ++g) {
    const int64_t group = first_group + int64_t{g} * kGroupsPerSet;
    if (group < num_groups) {
      load_run<Storage, kPerLane, kAligned>(static_cast<const Storage*>(x) + group * kGroupSize + lane_offset,
                                            raw[g]);
    } else {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        raw[g][i] = 0;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kGroupsInFlight; ++g) {
    // Every lane takes part in the shuffles, also past the last group (it only skips stores).
    const int64_t group = first_group + int64_t{g} * kGroupsPerSet;
    float values[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      values[i] = load_element<kType>(raw[g], i);
    }
    // This lane's extremes; a non-finite group's high becomes +inf (no finite group has one).
    float low = INFINITY;
    float high = -INFINITY;
    if constexpr (kType == ElementType::kBFloat16 && kBf16x2Extremes && kPerLane % 2 == 0) {
      const float2 extremes = pk_bf16x2_extremes<kPerLane / 2, kSymmetric>(reinterpret_cast<const uint32_t*>(raw[g]));
      low = extremes.x;
      high = is_finite(extremes.x) && is_finite(extremes.y) ? extremes.y : INFINITY;
    } else {
      // x * 0 is 0 for every finite x and NaN for NaN and +-Inf: one fused multiply-add per
      // element tracks non-finite values (fmaxf/fminf would drop a NaN).
      float poison = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        poison = fmaf(values[i], 0.0f, poison);
        if constexpr (kSymmetric) {
          high = fmaxf(high, fabsf(values[i]));
        } else {
          low = fminf(low, values[i]);
          high = fmaxf(high, values[i]);
        }
      }
      high = poison == 0.0f ? high : INFINITY;
    }
    GroupStats stats = empty_stats();
    if constexpr (kSymmetric) {
      stats.max_abs = reduce_max<kSpan>(high);
      stats.non_finite = !is_finite(stats.max_abs);
    } else {
      stats.max_value = reduce_max<kSpan>(high);
      stats.min_value = reduce_min<kSpan>(low);
      stats.non_finite = !is_finite(stats.max_value);
    }
    const GroupParams params = group_params(stats, kSymmetric);
    if (group >= num_groups) {
      continue;
    }
    if (lane % kSpan == 0) {
      scale[group] = params.scale;
      zero[group] = static_cast<int8_t>(params.zero);
    }
    const int64_t first = group * kGroupSize + lane_offset;
    const float reciprocal = 1.0f / params.scale;
    const float threshold = tie_threshold(group_max_abs(stats, kSymmetric), reciprocal);
    const float zero_point = static_cast<float>(params.zero);
    const bool nan_group = is_nan(params.scale);
    if constexpr (kCodes) {
      Pack<int8_t, kPerLane> codes;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const float q = rounded_quotient(values[i], params.scale, reciprocal, threshold);
        codes.values[i] = nan_group ? 0 : static_cast<int8_t>(code_of(q, params, kSymmetric));
      }
      store_run<int8_t, kPerLane, kAligned>(static_cast<int8_t*>(out) + first, codes);
    } else {
      Pack<Storage, kPerLane> result;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const float q = rounded_quotient(values[i], params.scale, reciprocal, threshold);
        if (nan_group) {
          store_element<kType>(result.values, i, NAN);  // the canonical NaN of PyTorch
        } else if constexpr (kSymmetric) {
          store_finite_element<kType>(result.values, i, dequant(code_of(q, params, true), params));
        } else {
          // dequant(clamp(q + z, 0, 15)) in two instructions fewer, with the same bits: for the
          // integers q and z, clamp(q + z, 0, 15) - z is clamp(q, -z, 15 - z) (exact below 2^24;
          // beyond, both saturate), and the fma's +0 turns a -0 into +0 as (code - z) does.
          store_finite_element<kType>(result.values, i,
                                      fmaf(clampf(q, -zero_point, 15.0f - zero_point), params.scale, 0.0f));
        }
      }
      store_run<Storage, kPerLane, kAligned>(static_cast<Storage*>(out) + first, result);
    }
  }
}

}  // namespace polykernels::int4
