// Scalar helpers every ISA file includes. Everything here has internal linkage (anonymous
// namespace, see kernels.h for why): each ISA file gets its own copy, compiled with its flags.
#pragma once
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

namespace edgectl {
namespace {

// IEEE half -> float, exact (subnormals, infinities and NaN included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: normalize
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3FFu) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// float -> IEEE half, round to nearest even (what F16C's vcvtps2ph does with imm 0).
inline uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u : 0));
  if (absx >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // rounds to >= 65520: infinity
  if (absx < 0x38800000u) {                                    // below the smallest normal half
    if (absx < 0x33000000u) return (uint16_t)sign;             // below half the smallest subnormal
    const uint32_t exp = absx >> 23;
    const uint32_t man = (absx & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t half = man >> shift;
    const uint32_t rest = man & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return (uint16_t)(sign | half);
  }
  uint32_t half = ((absx >> 13) - (112u << 10));
  const uint32_t rest = absx & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1))) ++half;
  return (uint16_t)(sign | half);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// float -> bfloat16, round to nearest even (PyTorch's c10::BFloat16 rounding).
inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

inline float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case kF32: return ((const float*)p)[i];
    case kBF16: return bf16_to_float(((const uint16_t*)p)[i]);
    default: return half_to_float(((const uint16_t*)p)[i]);
  }
}

inline void store_from_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case kF32: ((float*)p)[i] = v; break;
    case kBF16: ((uint16_t*)p)[i] = float_to_bf16(v); break;
    default: ((uint16_t*)p)[i] = float_to_half(v); break;
  }
}

// v rounded to the element type (as `.to(dtype)` would), returned as a float.
inline float round_to(DType t, float v) {
  switch (t) {
    case kF32: return v;
    case kBF16: return bf16_to_float(float_to_bf16(v));
    default: return half_to_float(float_to_half(v));
  }
}

inline uint16_t load_u16(const void* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

inline int32_t load_i32(const void* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

// [begin, end) of `items` for thread `t` of `nthreads`: contiguous, sizes differ by at most one.
inline void split_range(int64_t items, int t, int nthreads, int64_t* begin, int64_t* end) {
  const int64_t base = items / nthreads, extra = items % nthreads;
  *begin = t * base + (t < extra ? t : extra);
  *end = *begin + base + (t < extra ? 1 : 0);
}

// Records prefetched ahead of the one being multiplied. A single core's hardware prefetchers
// alone leave it short of memory bandwidth at batch 1 (measured: docs/kernels.md).
#ifndef EDGECTL_PREFETCH_RECORDS
#define EDGECTL_PREFETCH_RECORDS 8
#endif

inline void prefetch_ahead(const uint8_t* rec, int64_t record) {
  if (EDGECTL_PREFETCH_RECORDS == 0) return;
  const uint8_t* p = rec + EDGECTL_PREFETCH_RECORDS * record;
  for (int64_t off = 0; off < record; off += 64) __builtin_prefetch(p + off, 0, 3);
}

// Work below this many weight bytes runs on the calling thread: waking the OpenMP team costs
// a few microseconds, as much as streaming ~50 KB.
constexpr int64_t kParallelMinBytes = 64 * 1024;

inline int threads_for(int64_t bytes) {
  return bytes < kParallelMinBytes ? 1 : omp_get_max_threads();
}

// The activation quantizer's per-block rule, written once for the scalar paths
// (the vector paths compute the same with the same IEEE operations): see kernels.h.
inline void quantize_block_scalar(const float* v, int8_t* q, float* d, float* s) {
  float amax = 0.f;
  for (int j = 0; j < kBlock; ++j) amax = fmaxf(amax, fabsf(v[j]));
  const float scale = amax / 127.f;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  int32_t sum = 0;
  for (int j = 0; j < kBlock; ++j) {
    float r = nearbyintf(v[j] * inv);  // ties to even in the default rounding mode
    r = fminf(127.f, fmaxf(-127.f, r));
    q[j] = (int8_t)r;
    sum += q[j];
  }
  *d = scale;
  *s = (float)sum;
}

}  // namespace
}  // namespace edgectl
