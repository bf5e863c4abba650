// Group-wise INT4 fake quantization: the arithmetic, shared verbatim by the CPU and GPU
// kernels so that every backend produces the same bits (see the spec: fp32 throughout,
// constants multiplied rather than divided, IEEE division, round half to even).
#pragma once

#include <cmath>
#include <cstdint>

#include "polykernels/float_bits.h"
#include "polykernels/portable.h"

namespace polykernels::int4 {

// fp32(1/7), fp32(1/15) and fp32(1e-5), spelled as bits so no compiler folds them differently.
constexpr uint32_t kInv7Bits = 0x3e124925u;
constexpr uint32_t kInv15Bits = 0x3d888889u;
constexpr uint32_t kMinScaleBits = 0x3727c5acu;

enum class ElementType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Running statistics of one group: the symmetric mode needs max|x|, the asymmetric min and
// max; non-finite values are tracked apart because fmaxf/fminf silently drop NaN.
struct GroupStats {
  float min_value;
  float max_value;
  float max_abs;
  bool non_finite;
};

PK_HOST_DEVICE inline GroupStats empty_stats() {
  return GroupStats{INFINITY, -INFINITY, 0.0f, false};
}

PK_HOST_DEVICE inline void accumulate(GroupStats& stats, float value) {
  stats.non_finite = stats.non_finite || !is_finite(value);
  stats.min_value = fminf(stats.min_value, value);
  stats.max_value = fmaxf(stats.max_value, value);
  stats.max_abs = fmaxf(stats.max_abs, fabsf(value));
}

PK_HOST_DEVICE inline void merge(GroupStats& stats, const GroupStats& other) {
  stats.non_finite = stats.non_finite || other.non_finite;
  stats.min_value = fminf(stats.min_value, other.min_value);
  stats.max_value = fmaxf(stats.max_value, other.max_value);
  stats.max_abs = fmaxf(stats.max_abs, other.max_abs);
}

struct GroupParams {
  float scale;   // NaN when the group holds a non-finite value
  int32_t zero;  // 0 in symmetric mode and for non-finite groups
};

PK_HOST_DEVICE inline float clampf(float value, float low, float high) {
  return fminf(fmaxf(value, low), high);
}

PK_HOST_DEVICE inline GroupParams group_params(const GroupStats& stats, bool symmetric) {
  if (stats.non_finite) {
    return GroupParams{NAN, 0};
  }
  const float min_scale = bits_to_float(kMinScaleBits);
  if (symmetric) {
    return GroupParams{fmaxf(stats.max_abs * bits_to_float(kInv7Bits), min_scale), 0};
  }
  float scale = fmaxf((stats.max_value - stats.min_value) * bits_to_float(kInv15Bits), min_scale);
  float zero = clampf(rintf(-stats.min_value / scale), 0.0f, 15.0f);
  return GroupParams{scale, static_cast<int32_t>(zero)};
}

// x / scale, rounded to an integer, is the only per-element division of the spec. It is taken as
// x * (1 / scale): two roundings of 2^-24 each put that product within a quarter of
// kQuotientSlack |x / scale| of the correctly rounded quotient, so both round to the same integer
// wherever the product lies farther than that from a half-integer; there, and only there (and for
// non-finite values), the IEEE division is done. Bits stay equal to the division's.
constexpr float kQuotientSlack = 9.5367431640625e-07f;  // 2^-20

// The largest |x| of a group: the symmetric statistics hold it, the asymmetric ones its extremes.
PK_HOST_DEVICE inline float group_max_abs(const GroupStats& stats, bool symmetric) {
  return symmetric ? stats.max_abs : fmaxf(fabsf(stats.min_value), fabsf(stats.max_value));
}

// How close to its nearest integer x * (1 / scale) must lie for every x of the group: 0.5 less the
// group's largest slack (one bound per group, so each element needs one compare, no multiply).
PK_HOST_DEVICE inline float tie_threshold(float max_abs, float reciprocal) {
  return 0.5f - max_abs * reciprocal * kQuotientSlack;
}

// rint(value / scale), bit-equal to the IEEE division's (see kQuotientSlack).
PK_HOST_DEVICE inline float rounded_quotient(float value, float scale, float reciprocal, float threshold) {
  const float approx = value * reciprocal;
  const float nearest = rintf(approx);
  if (fabsf(approx - nearest) < threshold) {
    return nearest;
  }
  return rintf(value / scale);  // near a tie (or non-finite): the spec's division itself
}

// The INT4 code of a rounded quotient: [-7, 7] symmetric, [0, 15] asymmetric.
PK_HOST_DEVICE inline float code_of(float quotient, const GroupParams& params, bool symmetric) {
  if (symmetric) {
    return clampf(quotient, -7.0f, 7.0f);
  }
  return clampf(quotient + static_cast<float>(params.zero), 0.0f, 15.0f);
}

PK_HOST_DEVICE inline float dequant(float code, const GroupParams& params) {
  return (code - static_cast<float>(params.zero)) * params.scale;
}

template <ElementType kType>
PK_HOST_DEVICE inline float load_element(const void* base, int64_t index) {
  if constexpr (kType == ElementType::kFloat32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kType == ElementType::kFloat16) {
    return half_to_float(static_cast<const uint16_t*>(base)[index]);
  } else {
    return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
}

template <ElementType kType>
PK_HOST_DEVICE inline void store_element(void* base, int64_t index, float value) {
  if constexpr (kType == ElementType::kFloat32) {
    static_cast<float*>(base)[index] = value;
  } else if constexpr (kType == ElementType::kFloat16) {
    static_cast<uint16_t*>(base)[index] = float_to_half(value);
  } else {
    static_cast<uint16_t*>(base)[index] = float_to_bf16(value);
  }
}

// store_element for a value known to be finite: the vendor's one-instruction round-to-nearest-even
// conversion where there is one (portable.h); the same bits as float_to_bf16 / float_to_half.
template <ElementType kType>
PK_HOST_DEVICE inline void store_finite_element(void* base, int64_t index, float value) {
  if constexpr (kType == ElementType::kFloat32) {
    static_cast<float*>(base)[index] = value;
  } else if constexpr (kType == ElementType::kFloat16) {
    static_cast<uint16_t*>(base)[index] = PK_FINITE_TO_HALF(value);
  } else {
    static_cast<uint16_t*>(base)[index] = PK_FINITE_TO_BF16(value);
  }
}

template <ElementType kType>
struct ElementBytes {
  static constexpr int value = kType == ElementType::kFloat32 ? 4 : 2;
};

}  // namespace polykernels::int4
