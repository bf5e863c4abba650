// Exact conversions between fp32 and the 16-bit float formats, identical on CPU, CUDA and
// HIP. Written out rather than taken from each vendor's fp16 headers so that every backend
// rounds the same way PyTorch does (round to nearest even, canonical NaN), bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "polykernels/portable.h"

namespace polykernels {

PK_HOST_DEVICE inline uint32_t float_to_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

PK_HOST_DEVICE inline float bits_to_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// Bit tests rather than std::isnan/isfinite: the same on host and device, and immune to
// fast-math flags that let compilers assume no NaN.
PK_HOST_DEVICE inline bool is_nan(float value) {
  return (float_to_bits(value) & 0x7fffffffu) > 0x7f800000u;
}

PK_HOST_DEVICE inline bool is_finite(float value) {
  return (float_to_bits(value) & 0x7f800000u) != 0x7f800000u;
}

PK_HOST_DEVICE inline float bf16_to_float(uint16_t bits) {
  return bits_to_float(static_cast<uint32_t>(bits) << 16);
}

PK_HOST_DEVICE inline uint16_t float_to_bf16(float value) {
  uint32_t bits = float_to_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return 0x7fc0;  // PyTorch's canonical bf16 NaN
  }
  uint32_t rounding_bias = ((bits >> 16) & 1u) + 0x7fffu;
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

PK_HOST_DEVICE inline float half_to_float(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1fu) {
    return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) {
      return bits_to_float(sign);
    }
    // Subnormal half: every one is a normal float; shift until the implicit bit appears.
    uint32_t shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    return bits_to_float(sign | ((113u - shift) << 23) | (mantissa << 13));
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

PK_HOST_DEVICE inline uint16_t float_to_half(float value) {
  uint32_t bits = float_to_bits(value);
  uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint32_t out;
  if (bits >= 0x47800000u) {
    // |x| >= 65536: overflow to infinity, or NaN (PyTorch's canonical 0x7e00).
    out = bits > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (bits < 0x38800000u) {
    // Result is subnormal or zero: let one IEEE addition do the rounding to nearest even.
    const uint32_t magic = 126u << 23;  // 0.5f
    float shifted = bits_to_float(bits) + bits_to_float(magic);
    out = float_to_bits(shifted) - magic;
  } else {
    uint32_t mantissa_odd = (bits >> 13) & 1u;
    bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    bits += mantissa_odd;
    out = bits >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

}  // namespace polykernels
