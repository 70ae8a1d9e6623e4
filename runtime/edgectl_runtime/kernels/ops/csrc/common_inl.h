// Scalar helpers every ISA file includes. Everything here has internal linkage (anonymous
// namespace, see kernels.h for why): each ISA file gets its own copy, compiled with its flags.
#pragma once
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

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


// ---------------------------------------------------------------------------------------------
// Decode attention (kernels.h): the split into (sequence, KV head, block) items and the merge of
// their partials, written once; each level passes its own work on one block.

inline int64_t attn_group(const DecodeAttention& a) { return a.heads / a.kv_heads; }
inline int64_t attn_width(const DecodeAttention& a) { return a.dim + 2; }  // acc[dim], max, sum

// A block's keys and values for KV head h start this many elements into either cache; an int8
// KV's key scales of that block and head this many floats into its scales, the value scales
// block_size further (kernels.h).
inline int64_t kv_offset(const DecodeAttention& a, int64_t block, int64_t h) {
  return block * a.block_stride + h * a.head_stride;
}
inline int64_t kv_scale_offset(const DecodeAttention& a, int64_t block, int64_t h) {
  return (block * a.kv_heads + h) * 2 * a.block_size;
}

// The next item's bytes (decode_attention_by_blocks takes items in memory order: past a block's
// keys and values for one KV head come the next KV head's) are asked for while this item computes,
// a cache line for each one read, at the same offset one item ahead: a single core's hardware
// prefetchers alone left the loads stalled (docs/kernels.md "Decode attention"). Never faults.
template <class T>
inline void prefetch_next_item(const T* p, int64_t item_elements) {
  __builtin_prefetch((const char*)(p + item_elements), 0, 3);
}

// One block in plain C++: the scalar level's, and any level's for a block or head size its vectors do
// not divide. q: the group's first query head; block: the cache block, h: the KV head (kernels.h:
// keys column-major, key (t, d) at k[d * block_size + t]; values row-major); n tokens.
inline void attend_block_scalar(const DecodeAttention& a, const uint16_t* q, int64_t block, int64_t h, int64_t n,
                                float* part) {
  const int64_t dim = a.dim, width = attn_width(a);
  const uint16_t* k = a.k + kv_offset(a, block, h);
  const uint16_t* v = a.v + kv_offset(a, block, h);
  float s[kAttnMaxBlock];
  for (int64_t g = 0; g < attn_group(a); ++g) {
    const uint16_t* qg = q + g * a.q_head_stride;
    float m = -INFINITY;
    for (int64_t t = 0; t < n; ++t) {
      float dot = 0.f;
      for (int64_t d = 0; d < dim; ++d) dot += bf16_to_float(qg[d]) * bf16_to_float(k[d * a.block_size + t]);
      s[t] = dot * a.scale;
      m = fmaxf(m, s[t]);
    }
    float* acc = part + g * width;
    for (int64_t d = 0; d < dim; ++d) acc[d] = 0.f;
    float l = 0.f;
    for (int64_t t = 0; t < n; ++t) {
      const float p = expf(s[t] - m);
      l += p;
      for (int64_t d = 0; d < dim; ++d) acc[d] += p * bf16_to_float(v[t * dim + d]);
    }
    acc[dim] = m;
    acc[dim + 1] = l;
  }
}

// An int8 KV's rows (kernels.h): max|x| of a bf16 row (no NaN handling: a plain comparison, which
// the compiler vectorizes, where fmaxf is a library call), and x * inv rounded half to even into
// -127..127 (nearbyintf is one instruction on the vector levels).
inline float max_abs_bf16(const uint16_t* x, int64_t n) {
  float top = 0.f;
  for (int64_t d = 0; d < n; ++d) {
    const float v = fabsf(bf16_to_float(x[d]));
    top = v > top ? v : top;
  }
  return top;
}

inline int8_t round_to_int8(float x) {
  const float r = nearbyintf(x);
  return (int8_t)(r > 127.f ? 127.f : r < -127.f ? -127.f : r);
}

// An int8 KV's quantization steps for a row or run whose largest magnitude is top (kernels.h): inv =
// 127 / top and step = top / 127, both 0 under kQuantFloor.
struct QuantSteps {
  float inv, step;
};
inline QuantSteps quant_steps(float top) {
  return top >= kQuantFloor ? QuantSteps{127.f / top, top / 127.f} : QuantSteps{0.f, 0.f};
}

// kernels.h KvWrite: each level's kv_write_int8 (plain C++, compiled with the level's flags).
inline void kv_write_int8_rows(const KvWrite& w) {
  for (int64_t i = 0; i < w.tokens; ++i) {
    if (w.slots[i] < 0) continue;
    const int64_t block = w.slots[i] / w.block_size, t = w.slots[i] % w.block_size;
    for (int64_t h = 0; h < w.kv_heads; ++h) {
      const int64_t off = block * w.block_stride + h * w.head_stride;
      float* scale = w.scales + (block * w.kv_heads + h) * 2 * w.block_size;
      const uint16_t* key = w.key + i * w.key_stride + h * w.dim;
      const uint16_t* value = w.value + i * w.value_stride + h * w.dim;
      const float ktop = max_abs_bf16(key, w.dim), vtop = max_abs_bf16(value, w.dim);
      const QuantSteps ks = quant_steps(ktop), vs = quant_steps(vtop);
      scale[t] = ks.step;
      scale[w.block_size + t] = vs.step;
      int8_t* k8 = w.k8 + off + 4 * t;  // key (t, d) at (d / 4) * 4 * block_size + 4 * t + d % 4
      int8_t* v8 = w.v8 + off + (t / 4) * 4 * w.dim + t % 4;  // value (t, d) at (t / 4) * 4 * dim + 4 * d + t % 4
      for (int64_t d = 0; d < w.dim; ++d) {
        k8[(d / 4) * 4 * w.block_size + d % 4] = round_to_int8(bf16_to_float(key[d]) * ks.inv);
        v8[4 * d] = round_to_int8(bf16_to_float(value[d]) * vs.inv);
      }
    }
  }
}

// An int8 KV (kernels.h): every query row quantized as a key row is (kernels.h), once per call: its four consecutive int8 packed into one int32 (the keys' groups of four
// dimensions), qd times the attention's scale, and the sum of its int8 (what an offset of the keys by
// 128, VNNI's unsigned operand, adds to a dot product, over 128).
inline void quantize_queries(const DecodeAttention& a) {
  for (int64_t s = 0; s < a.seqs; ++s)
    for (int64_t i = 0; i < a.heads; ++i) {
      const uint16_t* row = a.q + s * a.q_seq_stride + i * a.q_head_stride;
      const QuantSteps qs = quant_steps(max_abs_bf16(row, a.dim));
      int8_t q8[kAttnMaxDim];
      int32_t sum = 0;
      for (int64_t d = 0; d < a.dim; ++d) {
        q8[d] = round_to_int8(bf16_to_float(row[d]) * qs.inv);
        sum += q8[d];
      }
      const int64_t at = s * a.heads + i;
      memcpy(a.q_packed + at * (a.dim / 4), q8, (size_t)a.dim);
      a.q_scale[at] = qs.step * a.scale;
      a.q_sum[at] = sum;
    }
}

// Where the quantized query of the group's first head is, for a block's query pointer q (the
// drivers pass the query row, decode_attention_by_blocks).
inline int64_t query_index(const DecodeAttention& a, const uint16_t* q) {
  const int64_t off = q - a.q, s = off / a.q_seq_stride;
  return s * a.heads + (off - s * a.q_seq_stride) / a.q_head_stride;
}

// Softmax weights of n scores in place (the scalar loop of attend_block_scalar): the maximum and
// the sum into out[0], out[1].
inline void softmax_in_place_scalar(float* s, int64_t n, float* out) {
  float m = -INFINITY, l = 0.f;
  for (int64_t t = 0; t < n; ++t) m = fmaxf(m, s[t]);
  for (int64_t t = 0; t < n; ++t) {
    s[t] = expf(s[t] - m);
    l += s[t];
  }
  out[0] = m;
  out[1] = l;
}

// An int8 KV's attention weights (kernels.h) for one run of slots: w = p_t * value_scale_t for t < n,
// 0 past it, quantized into w8[0..len) (0..127); returns the run's scale max w / 127.
inline float quantize_weight_run(const float* p, const float* value_scale, int64_t n, int64_t len, uint8_t* w8) {
  float w[kWeightRun], top = 0.f;
  for (int64_t t = 0; t < len; ++t) {
    w[t] = t < n ? p[t] * value_scale[t] : 0.f;
    top = w[t] > top ? w[t] : top;
  }
  const QuantSteps qs = quant_steps(top);
  for (int64_t t = 0; t < len; ++t) {
    const float r = nearbyintf(w[t] * qs.inv);
    w8[t] = (uint8_t)(r > 127.f ? 127.f : r);
  }
  return qs.step;
}

// One block of an int8 KV in plain C++ (the scalar level's, and the fallback of the others).
inline void attend_block_int8_scalar(const DecodeAttention& a, const uint16_t* q, int64_t block, int64_t h,
                                     int64_t n, float* part) {
  const int64_t dim = a.dim, width = attn_width(a), bs = a.block_size;
  const int8_t* k = a.k8 + kv_offset(a, block, h);
  const int8_t* v = a.v8 + kv_offset(a, block, h);
  const float* key_scale = a.scales + kv_scale_offset(a, block, h);
  const float* value_scale = key_scale + bs;
  const int64_t first = query_index(a, q);
  float s[kAttnMaxBlock];
  for (int64_t g = 0; g < attn_group(a); ++g) {
    const int8_t* q8 = (const int8_t*)(a.q_packed + (first + g) * (dim / 4));
    for (int64_t t = 0; t < n; ++t) {
      int32_t dot = 0;
      for (int64_t d = 0; d < dim; ++d) dot += (int32_t)q8[d] * k[(d / 4) * 4 * bs + 4 * t + d % 4];
      s[t] = (float)dot * a.q_scale[first + g] * key_scale[t];
    }
    float* acc = part + g * width;
    softmax_in_place_scalar(s, n, acc + dim);
    for (int64_t d = 0; d < dim; ++d) acc[d] = 0.f;
    for (int64_t r0 = 0; r0 < n; r0 += kWeightRun) {
      uint8_t w8[kWeightRun];
      const int64_t len = std::min(kWeightRun, bs - r0);
      const float wd = quantize_weight_run(s + r0, value_scale + r0, n - r0, len, w8);
      int32_t sum[kAttnMaxDim] = {};
      for (int64_t t = r0; t < std::min(n, r0 + len); ++t)
        for (int64_t d = 0; d < dim; ++d) sum[d] += (int32_t)w8[t - r0] * v[(t / 4) * 4 * dim + 4 * d + t % 4];
      for (int64_t d = 0; d < dim; ++d) acc[d] += (float)sum[d] * wd;
    }
  }
}

// out rows of the group of KV head h of sequence s, from the partials of its blocks.
inline void merge_partials(const DecodeAttention& a, int64_t s, int64_t h) {
  const int64_t group = attn_group(a), width = attn_width(a), dim = a.dim;
  const int64_t blocks = (a.seq_lens[s] + a.block_size - 1) / a.block_size;
  const float* part = a.partials + (s * a.kv_heads + h) * a.max_blocks * group * width;
  float acc[kAttnMaxDim];
  for (int64_t g = 0; g < group; ++g) {
    uint16_t* out = a.out + s * a.out_seq_stride + (h * group + g) * a.out_head_stride;
    float top = -INFINITY, l = 0.f;
    for (int64_t j = 0; j < blocks; ++j) top = fmaxf(top, part[(j * group + g) * width + dim]);
    for (int64_t d = 0; d < dim; ++d) acc[d] = 0.f;
    for (int64_t j = 0; j < blocks; ++j) {
      const float* pj = part + (j * group + g) * width;
      const float w = expf(pj[dim] - top);
      l += w * pj[dim + 1];
      for (int64_t d = 0; d < dim; ++d) acc[d] += w * pj[d];
    }
    for (int64_t d = 0; d < dim; ++d) out[d] = float_to_bf16(blocks > 0 ? acc[d] / l : 0.f);
  }
}

// Items are single blocks so that two threads share even one sequence's attention evenly, taken
// in the cache's memory order (a block's KV heads, then the next block); a context under
// kParallelMinBytes of KV runs on the calling thread.
template <class AttendBlock>
void decode_attention_by_blocks(const DecodeAttention& a, AttendBlock attend_block) {
  const int64_t group = attn_group(a), width = attn_width(a);
  const int64_t items = a.seqs * a.kv_heads * a.max_blocks;
  int64_t tokens = 0;
  for (int64_t s = 0; s < a.seqs; ++s) tokens += a.seq_lens[s];
  const int64_t kv_bytes = tokens * a.kv_heads * a.dim * 2 * (a.k8 ? 1 : 2);
#pragma omp parallel num_threads(threads_for(kv_bytes))
  {
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t s = it / (a.kv_heads * a.max_blocks), j = it / a.kv_heads % a.max_blocks, h = it % a.kv_heads;
      const int64_t first = j * a.block_size, len = a.seq_lens[s];
      if (first >= len) continue;
      const int64_t block = a.block_table[s * a.table_stride + j];
      const int64_t n = len - first < a.block_size ? len - first : a.block_size;
      float* part = a.partials + ((s * a.kv_heads + h) * a.max_blocks + j) * group * width;  // merge_partials' order
      attend_block(a, a.q + s * a.q_seq_stride + h * group * a.q_head_stride, block, h, n, part);
    }
#pragma omp for schedule(static)
    for (int64_t sh = 0; sh < a.seqs * a.kv_heads; ++sh) merge_partials(a, sh / a.kv_heads, sh % a.kv_heads);
  }
}

}  // namespace
}  // namespace edgectl
