// The code of two levels on 256-bit vectors, included by isa_avx2.cpp (built with -mavx2 -mfma
// -mf16c) and isa_avxvnni.cpp (the same and -mavxvnni). Integer dot products with vpmaddubsw (u8
// weights x s8 activations -> s16 pairs) and vpmaddwd against ones (-> s32), as llama.cpp's Q4_1 x
// Q8_1 (ggml/src/ggml-cpu/arch/x86/quants.c, mul_sum_us8_pairs_float); here the lanes are 8 rows of
// the tile instead of one row's columns (kernels.h). A tile of 16 rows is two halves of 8. Where the
// compiler was given AVX-VNNI (__AVXVNNI__), the linear tiles take vpdpbusd instead (u8 x s8, four
// products summed into s32 in one instruction): the same exact integer sums in fewer instructions.
// Everything lives in an anonymous namespace, so each level's file gets its own copy (kernels.h).
#pragma once
#include <immintrin.h>

#include "common_inl.h"

namespace edgectl {
namespace {

// Activation rows handled together: each weight register is reused MB times. Four
// accumulators per half keep the 16 ymm registers from spilling in the W4 loop.
constexpr int kMB = 4;
// Activation rows per pass over the weights: their int8 copy (64 x K bytes) stays in L2 while
// the weights stream by once per pass.
constexpr int64_t kRowsPerPass = 64;

inline __m256 load8(const void* x, DType t, int64_t i) {
  switch (t) {
    case kF32: return _mm256_loadu_ps((const float*)x + i);
    case kBF16: {
      const __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)x + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    default: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)x + i)));
  }
}

// bfloat16 rounding (nearest even) of 8 floats, kept as floats; NaN stays NaN.
inline __m256 round_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x400000))), nan);
}

inline __m256 round_to8(DType t, __m256 v) {
  switch (t) {
    case kF32: return v;
    case kBF16: return round_bf16(v);
    default: return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
}

inline void store8(void* p, DType t, int64_t i, __m256 v) {
  switch (t) {
    case kF32: _mm256_storeu_ps((float*)p + i, v); return;
    case kBF16: {
      const __m256i b = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(v)), 16);
      // 8 x u32 -> 8 x u16: pack within 128-bit lanes, then gather the two lanes' low halves.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08);
      _mm_storeu_si128((__m128i*)((uint16_t*)p + i), _mm256_castsi256_si128(packed));
      return;
    }
    default: _mm_storeu_si128((__m128i*)((uint16_t*)p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); return;
  }
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// One block of 32 floats -> 32 int8, its scale and the sum of its int8 values (the rule of
// kernels.h; the same IEEE operations as quantize_block_scalar, so the same bytes).
inline void quantize_block(const __m256 v[4], int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 amax = _mm256_andnot_ps(sign, v[0]);
  for (int j = 1; j < 4; ++j) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
  const float m = hmax8(amax);
  const __m256 inv = _mm256_set1_ps(m > 0.f ? 127.f / m : 0.f);
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  __m256i i[4];
  for (int j = 0; j < 4; ++j)  // vcvtps2dq rounds to nearest even (MXCSR default)
    i[j] = _mm256_max_epi32(nlim, _mm256_min_epi32(lim, _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv))));
  *s = (float)hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
  *d = m / 127.f;
  // s32 -> s8; the packs work per 128-bit lane, the permute puts the 4-byte groups back in order.
  const __m256i p16a = _mm256_packs_epi32(i[0], i[1]), p16b = _mm256_packs_epi32(i[2], i[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  _mm256_storeu_si256((__m256i*)q, _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

void quantize_activations(const void* x, DType dtype, int64_t m, int64_t k, int64_t ldx, int8_t* q, float* d,
                          float* s) {
  const int64_t kb = (k + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (m * k >= (1 << 16))
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < kb; ++b) {
      __m256 v[4];
      const int64_t col = b * kBlock;
      if (col + kBlock <= k) {
        for (int j = 0; j < 4; ++j) v[j] = load8(x, dtype, i * ldx + col + 8 * j);
      } else {  // the last, partial block: zero padding
        float tmp[kBlock];
        for (int j = 0; j < kBlock; ++j) tmp[j] = col + j < k ? load_as_float(x, dtype, i * ldx + col + j) : 0.f;
        for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(tmp + 8 * j);
      }
      quantize_block(v, q + (i * kb + b) * kBlock, d + i * kb + b, s + i * kb + b);
    }
  }
}

struct ActBlock {  // one activation row's view of block b
  const int8_t* q;
  __m256 d;   // dx broadcast
  __m256 ds;  // dx * sum(qx) broadcast (the W4 minimum's term)
  int32_t sum;
};

template <int MB>
inline void load_acts(const QuantizedActs& a, int64_t i0, int64_t b, ActBlock act[MB]) {
  for (int mi = 0; mi < MB; ++mi) {
    const int64_t j = (i0 + mi) * a.kblocks + b;
    act[mi].q = a.q + j * kBlock;
    act[mi].d = _mm256_set1_ps(a.d[j]);
    act[mi].ds = _mm256_set1_ps(a.d[j] * a.s[j]);
    act[mi].sum = (int32_t)a.s[j];
  }
}

// MB activation rows x one 16-row W4 tile -> out[MB][16] (fp32).
template <int MB>
void tile_w4(const uint8_t* recs, int64_t kb, const QuantizedActs& a, int64_t i0, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);  // not with AVX-VNNI
  __m256 acc[MB][2];
  for (int mi = 0; mi < MB; ++mi) acc[mi][0] = acc[mi][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = recs + b * kW4Record;
    prefetch_ahead(rec, kW4Record);
    ActBlock act[MB];
    load_acts<MB>(a, i0, b, act);
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + kW4ScaleOffset + 16 * h)));
      const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + kW4MinOffset + 16 * h)));
      __m256i lo[4], hi[4];
      for (int quad = 0; quad < 4; ++quad) {
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(rec + quad * 64 + h * 32));
        lo[quad] = _mm256_and_si256(raw, low4);
        hi[quad] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
      for (int mi = 0; mi < MB; ++mi) {
#if defined(__AVXVNNI__)
        // Two independent chains (low and high nibbles), as on the AVX-512 level.
        __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();
        for (int quad = 0; quad < 4; ++quad) {
          sl = _mm256_dpbusd_avx_epi32(sl, lo[quad], _mm256_set1_epi32(load_i32(act[mi].q + 4 * quad)));
          sh = _mm256_dpbusd_avx_epi32(sh, hi[quad], _mm256_set1_epi32(load_i32(act[mi].q + 16 + 4 * quad)));
        }
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_add_epi32(sl, sh));
#else
        // Eight u4 x s8 products summed in s16: at most 8 * 2 * 15 * 127 = 30480, no saturation.
        __m256i s16 = _mm256_setzero_si256();
        for (int quad = 0; quad < 4; ++quad) {
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[quad], _mm256_set1_epi32(load_i32(act[mi].q + 4 * quad))));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[quad], _mm256_set1_epi32(load_i32(act[mi].q + 16 + 4 * quad))));
        }
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
#endif
        acc[mi][h] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dw, act[mi].d), acc[mi][h]);
        acc[mi][h] = _mm256_fmadd_ps(mw, act[mi].ds, acc[mi][h]);
      }
    }
  }
  for (int mi = 0; mi < MB; ++mi)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + mi * kTileRows + 8 * h, acc[mi][h]);
}

// MB activation rows x one 16-row W5 tile: W4's nibbles with the fifth bits merged in at bit 4 (kernels.h),
// q in 0..31 unsigned against the s8 activations, then sum - 16 s per block (w = d (q - 16)).
template <int MB>
void tile_w5(const uint8_t* recs, int64_t kb, const QuantizedActs& a, int64_t i0, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);  // not with AVX-VNNI
  __m256 acc[MB][2];
  for (int mi = 0; mi < MB; ++mi) acc[mi][0] = acc[mi][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = recs + b * kW5Record;
    prefetch_ahead(rec, kW5Record);
    ActBlock act[MB];
    load_acts<MB>(a, i0, b, act);
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + kW5ScaleOffset + 16 * h)));
      const __m256i high = _mm256_loadu_si256((const __m256i*)(rec + kW5HighOffset + h * 32));
      __m256i lo[4], hi[4];
      for (int quad = 0; quad < 4; ++quad) {
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(rec + quad * 64 + h * 32));
        // Bit `quad` of each high byte to bit 4 (a 16-bit shift by at most 4 brings nothing across
        // bytes into bit 4), and bit 4 + quad to bit 4.
        lo[quad] = _mm256_or_si256(_mm256_and_si256(raw, low4),
                                   _mm256_and_si256(_mm256_slli_epi16(high, 4 - quad), bit4));
        hi[quad] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4),
                                   _mm256_and_si256(_mm256_srli_epi16(high, quad), bit4));
      }
      for (int mi = 0; mi < MB; ++mi) {
#if defined(__AVXVNNI__)
        __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();
        for (int quad = 0; quad < 4; ++quad) {
          sl = _mm256_dpbusd_avx_epi32(sl, lo[quad], _mm256_set1_epi32(load_i32(act[mi].q + 4 * quad)));
          sh = _mm256_dpbusd_avx_epi32(sh, hi[quad], _mm256_set1_epi32(load_i32(act[mi].q + 16 + 4 * quad)));
        }
        const __m256i sum = _mm256_add_epi32(sl, sh);
#else
        // Four u5 x s8 pairs summed in s16 per chain: at most 4 * 2 * 31 * 127 = 31496, no saturation
        // (eight, as W4 sums, could reach 62992).
        __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();
        for (int quad = 0; quad < 4; ++quad) {
          sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[quad], _mm256_set1_epi32(load_i32(act[mi].q + 4 * quad))));
          sh = _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[quad], _mm256_set1_epi32(load_i32(act[mi].q + 16 + 4 * quad))));
        }
        const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(sl, ones), _mm256_madd_epi16(sh, ones));
#endif
        const __m256i dot = _mm256_sub_epi32(sum, _mm256_set1_epi32(kW5Zero * act[mi].sum));
        acc[mi][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, act[mi].d), acc[mi][h]);
      }
    }
  }
  for (int mi = 0; mi < MB; ++mi)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + mi * kTileRows + 8 * h, acc[mi][h]);
}

// MB activation rows x one 16-row W8 tile. s8 x s8 through vpmaddubsw needs an unsigned side:
// |w| and sign(w) * x (vpsignb), llama.cpp's mul_sum_i8_pairs_float. Pairs reach 2 * 127 * 127
// = 32258, so each vpmaddubsw result goes to s32 at once.
template <int MB>
void tile_w8(const uint8_t* recs, int64_t kb, const QuantizedActs& a, int64_t i0, float* out) {
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);  // not with AVX-VNNI
  __m256 acc[MB][2];
  for (int mi = 0; mi < MB; ++mi) acc[mi][0] = acc[mi][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = recs + b * kW8Record;
    prefetch_ahead(rec, kW8Record);
    ActBlock act[MB];
    load_acts<MB>(a, i0, b, act);
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rec + kW8ScaleOffset + 16 * h)));
      for (int mi = 0; mi < MB; ++mi) {
        __m256i s32 = _mm256_setzero_si256();
        for (int quad = 0; quad < 8; ++quad) {
          const __m256i w = _mm256_loadu_si256((const __m256i*)(rec + quad * 64 + h * 32));
          const __m256i x = _mm256_set1_epi32(load_i32(act[mi].q + 4 * quad));
#if defined(__AVXVNNI__)
          // |w| x (x with w's sign) into s32 directly: the products are those of the pair below.
          s32 = _mm256_dpbusd_avx_epi32(s32, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
#else
          const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
          s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(p, ones));
#endif
        }
        acc[mi][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(dw, act[mi].d), acc[mi][h]);
      }
    }
  }
  for (int mi = 0; mi < MB; ++mi)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + mi * kTileRows + 8 * h, acc[mi][h]);
}

using TileFn = void (*)(const uint8_t*, int64_t, const QuantizedActs&, int64_t, float*);

template <int kBits>
void linear(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y, DType yd, int64_t ldy) {
  static const TileFn w4[kMB + 1] = {nullptr, tile_w4<1>, tile_w4<2>, tile_w4<3>, tile_w4<4>};
  static const TileFn w5[kMB + 1] = {nullptr, tile_w5<1>, tile_w5<2>, tile_w5<3>, tile_w5<4>};
  static const TileFn w8[kMB + 1] = {nullptr, tile_w8<1>, tile_w8<2>, tile_w8<3>, tile_w8<4>};
  const TileFn* fns = kBits == 4 ? w4 : kBits == 5 ? w5 : w8;
  const int64_t record = kBits == 4 ? kW4Record : kBits == 5 ? kW5Record : kW8Record, kb = a.kblocks;
#pragma omp parallel num_threads(threads_for(tiles * kb * record))
  {
    int64_t t0, t1;
    split_range(tiles, omp_get_thread_num(), omp_get_num_threads(), &t0, &t1);
    float out[kMB * kTileRows];
    for (int64_t p0 = 0; p0 < a.m; p0 += kRowsPerPass) {
      const int64_t p1 = p0 + kRowsPerPass < a.m ? p0 + kRowsPerPass : a.m;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t rows = n - t * kTileRows < kTileRows ? n - t * kTileRows : kTileRows;
        for (int64_t i0 = p0; i0 < p1; i0 += kMB) {
          const int mb = (int)(p1 - i0 < kMB ? p1 - i0 : kMB);
          fns[mb](w + t * kb * record, kb, a, i0, out);
          for (int mi = 0; mi < mb; ++mi)
            for (int64_t r = 0; r < rows; ++r)
              store_from_float(y, yd, (i0 + mi) * ldy + t * kTileRows + r, out[mi * kTileRows + r]);
        }
      }
    }
  }
}

void linear_w4(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y, DType yd, int64_t ldy) {
  linear<4>(a, w, tiles, n, y, yd, ldy);
}

void linear_w5(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y, DType yd, int64_t ldy) {
  linear<5>(a, w, tiles, n, y, yd, ldy);
}

void linear_w8(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y, DType yd, int64_t ldy) {
  linear<8>(a, w, tiles, n, y, yd, ldy);
}

// One row's 16 nibble bytes of a W4 record: four 4-byte groups, one per quad (kernels.h).
inline __m128i row_bytes(const uint8_t* rec, int r, int quad0) {
  return _mm_setr_epi32(load_i32(rec + (quad0 + 0) * 64 + r * 4), load_i32(rec + (quad0 + 1) * 64 + r * 4),
                        load_i32(rec + (quad0 + 2) * 64 + r * 4), load_i32(rec + (quad0 + 3) * 64 + r * 4));
}

// The low 8 bytes (u8 or s8) of v, as floats.
inline __m256 bytes_to_ps(__m128i v, bool is_signed) {
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

// 32 dequantized values of one row and block (v[0..3] = columns 0-7, 8-15, 16-23, 24-31) -> out.
inline void store_block(void* out, DType dt, int64_t base, int64_t col, int64_t k, const __m256 v[4]) {
  if (col + kBlock <= k) {
    for (int j = 0; j < 4; ++j) store8(out, dt, base + col + 8 * j, v[j]);
    return;
  }
  float tmp[kBlock];
  for (int j = 0; j < 4; ++j) _mm256_storeu_ps(tmp + 8 * j, v[j]);
  for (int64_t c = col; c < k; ++c) store_from_float(out, dt, base + c, tmp[c - col]);
}

void dequantize_w4(const uint8_t* w, int64_t kb, int64_t rows, int64_t k, void* out, DType dt) {
  const __m128i low4 = _mm_set1_epi8(0x0F);
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const int r = (int)(i % kTileRows);
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* rec = w + ((i / kTileRows) * kb + b) * kW4Record;
      const __m256 d = _mm256_set1_ps(half_to_float(load_u16(rec + kW4ScaleOffset + 2 * r)));
      const __m256 m = _mm256_set1_ps(half_to_float(load_u16(rec + kW4MinOffset + 2 * r)));
      const __m128i raw = row_bytes(rec, r, 0);
      const __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
      __m256 v[4] = {bytes_to_ps(lo, false), bytes_to_ps(_mm_srli_si128(lo, 8), false), bytes_to_ps(hi, false),
                     bytes_to_ps(_mm_srli_si128(hi, 8), false)};
      for (int j = 0; j < 4; ++j) v[j] = _mm256_add_ps(_mm256_mul_ps(v[j], d), m);  // d*q, then + m: the reference's two roundings
      store_block(out, dt, i * k, b * kBlock, k, v);
    }
  }
}

// One row's 32 values of a W5 record as bytes 0..31: (columns 0-3, 4-7, 8-11, 12-15; columns 16-19, ...).
// Lane `quad` of the high plane's row, shifted right by quad, has the low value's fifth bit at bit 0 and the
// high value's at bit 4 of each byte (kernels.h).
inline void w5_row(const uint8_t* rec, int r, __m128i* lo, __m128i* hi) {
  const __m128i low4 = _mm_set1_epi8(0x0F), one = _mm_set1_epi8(0x01), bit4 = _mm_set1_epi8(0x10);
  const __m128i raw = row_bytes(rec, r, 0);
  const __m128i high = _mm_srlv_epi32(_mm_set1_epi32(load_i32(rec + kW5HighOffset + r * 4)), _mm_setr_epi32(0, 1, 2, 3));
  *lo = _mm_or_si128(_mm_and_si128(raw, low4), _mm_slli_epi16(_mm_and_si128(high, one), 4));
  *hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(high, bit4));
}

void dequantize_w5(const uint8_t* w, int64_t kb, int64_t rows, int64_t k, void* out, DType dt) {
  const __m256 zero = _mm256_set1_ps((float)kW5Zero);
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const int r = (int)(i % kTileRows);
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* rec = w + ((i / kTileRows) * kb + b) * kW5Record;
      const __m256 d = _mm256_set1_ps(half_to_float(load_u16(rec + kW5ScaleOffset + 2 * r)));
      __m128i lo, hi;
      w5_row(rec, r, &lo, &hi);
      __m256 v[4] = {bytes_to_ps(lo, false), bytes_to_ps(_mm_srli_si128(lo, 8), false), bytes_to_ps(hi, false),
                     bytes_to_ps(_mm_srli_si128(hi, 8), false)};
      for (int j = 0; j < 4; ++j) v[j] = _mm256_mul_ps(_mm256_sub_ps(v[j], zero), d);  // (q - 16) exact, one rounding
      store_block(out, dt, i * k, b * kBlock, k, v);
    }
  }
}

void dequantize_w8(const uint8_t* w, int64_t kb, int64_t rows, int64_t k, void* out, DType dt) {
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const int r = (int)(i % kTileRows);
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* rec = w + ((i / kTileRows) * kb + b) * kW8Record;
      const __m256 d = _mm256_set1_ps(half_to_float(load_u16(rec + kW8ScaleOffset + 2 * r)));
      const __m128i a = row_bytes(rec, r, 0), c = row_bytes(rec, r, 4);  // columns 0-15, 16-31
      __m256 v[4] = {bytes_to_ps(a, true), bytes_to_ps(_mm_srli_si128(a, 8), true), bytes_to_ps(c, true),
                     bytes_to_ps(_mm_srli_si128(c, 8), true)};
      for (int j = 0; j < 4; ++j) v[j] = _mm256_mul_ps(v[j], d);
      store_block(out, dt, i * k, b * kBlock, k, v);
    }
  }
}

// See add_rms_norm in isa_scalar.cpp for the semantics; here 8 columns at a time.
void add_rms_norm(const void* x, void* residual, const void* weight, void* out, DType dt, int64_t rows,
                  int64_t hidden, float eps) {
#pragma omp parallel if (rows * hidden >= (1 << 16))
  {
    float* sum = (float*)malloc(sizeof(float) * (hidden + 8));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t base = i * hidden, vec = hidden & ~(int64_t)7;
      __m256 sq = _mm256_setzero_ps();
      float sqtail = 0.f;
      for (int64_t j = 0; j < vec; j += 8) {
        __m256 v = load8(x, dt, base + j);
        if (residual) {
          v = _mm256_add_ps(v, load8(residual, dt, base + j));
          store8(residual, dt, base + j, v);
        }
        _mm256_storeu_ps(sum + j, v);
        sq = _mm256_fmadd_ps(v, v, sq);
      }
      for (int64_t j = vec; j < hidden; ++j) {
        float v = load_as_float(x, dt, base + j);
        if (residual) {
          v += load_as_float(residual, dt, base + j);
          store_from_float(residual, dt, base + j, v);
        }
        sum[j] = v;
        sqtail += v * v;
      }
      const float inv = 1.f / sqrtf((hsum8(sq) + sqtail) / (float)hidden + eps);
      const __m256 vinv = _mm256_set1_ps(inv);
      for (int64_t j = 0; j < vec; j += 8) {
        const __m256 normed = round_to8(dt, _mm256_mul_ps(_mm256_loadu_ps(sum + j), vinv));
        store8(out, dt, base + j, _mm256_mul_ps(normed, load8(weight, dt, j)));
      }
      for (int64_t j = vec; j < hidden; ++j)
        store_from_float(out, dt, base + j, round_to(dt, sum[j] * inv) * load_as_float(weight, dt, j));
    }
    free(sum);
  }
}


// ---------------------------------------------------------------------------------------------
// Decode attention (kernels.h), as isa_avx512vnni.cpp does it with 256-bit vectors: a load takes
// 16 bf16, a shift and a mask make the 8 even and the 8 odd elements as fp32; keys (column-major
// in the block) give the scores of 16 tokens per pass with the tokens in the lanes.

inline __m256 even_bf16(__m256i x) { return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)); }
inline __m256 odd_bf16(__m256i x) { return _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u))); }

// Lanes [0, count) set, as a blend mask.
inline __m256 first_lanes(int64_t count) {
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

// e^x for x <= 0: the polynomial of isa_avx512vnni.cpp's exp_nonpositive; 2^n built in the
// exponent field (n >= -126 after the clamp, so always a normal float).
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447505531f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Elements 0..7 and 8..15 of a row (or 16 tokens) from its even and odd halves.
inline void interleave_even_odd(__m256 e, __m256 o, float* out) {
  const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);  // {e0 o0 e1 o1 | e4 o4 e5 o5}, ...
  _mm256_storeu_ps(out, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

// Softmax of one query head's scores within a block: its maximum, p = e^(s - max) in place, their
// sum (tokens < n only), the maximum and the sum into out[0], out[1]. Scores are written up to a
// multiple of 16 tokens, so the 8-lane loads past n stay inside them.
inline void softmax_in_place(float* scores, int64_t n, float* out) {
  __m256 top = _mm256_set1_ps(-INFINITY);
  for (int64_t t = 0; t < n; t += 8)
    top = _mm256_max_ps(top, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(scores + t), first_lanes(n - t)));
  const float m = hmax8(top);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; t += 8) {
    const __m256 valid = first_lanes(n - t);
    const __m256 s = _mm256_blendv_ps(_mm256_set1_ps(m), _mm256_loadu_ps(scores + t), valid);
    const __m256 p = exp_nonpositive(_mm256_sub_ps(s, _mm256_set1_ps(m)));
    _mm256_storeu_ps(scores + t, p);  // lanes past n: e^0, never read
    sum = _mm256_add_ps(sum, _mm256_and_ps(p, valid));
  }
  out[0] = m;
  out[1] = hsum8(sum);
}

// One block (common_inl.h decode_attention_by_blocks) for a head size of 16 * C and a block of a
// multiple of 16 tokens.
template <int C>
void attend_block(const DecodeAttention& a, const uint16_t* q, int64_t block, int64_t h, int64_t n, float* part) {
  const uint16_t* k = a.k + kv_offset(a, block, h);
  const uint16_t* v = a.v + kv_offset(a, block, h);
  constexpr int64_t dim = 16 * C;
  const int64_t group = attn_group(a), width = attn_width(a), bs = a.block_size, item = a.head_stride;
  alignas(32) float qs[kAttnMaxGroup][dim];  // the query, times the scale
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < dim; ++d) qs[g][d] = bf16_to_float(q[g * a.q_head_stride + d]) * a.scale;
  // Scores of 16 tokens at a time (past n: computed from whatever the block holds, never used).
  alignas(32) float scores[kAttnMaxGroup][kAttnMaxBlock];
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    if (t0 % 32 == 0)
      for (int64_t d = 0; d < dim; ++d) prefetch_next_item(k + d * bs + t0, item);
    for (int64_t g = 0; g < group; ++g) {
      __m256 e0 = _mm256_setzero_ps(), o0 = e0, e1 = e0, o1 = e0;  // even / odd tokens, even / odd d
      for (int64_t d = 0; d < dim; d += 2) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i*)(k + d * bs + t0));
        const __m256i x1 = _mm256_loadu_si256((const __m256i*)(k + (d + 1) * bs + t0));
        const __m256 q0 = _mm256_set1_ps(qs[g][d]), q1 = _mm256_set1_ps(qs[g][d + 1]);
        e0 = _mm256_fmadd_ps(even_bf16(x0), q0, e0);
        o0 = _mm256_fmadd_ps(odd_bf16(x0), q0, o0);
        e1 = _mm256_fmadd_ps(even_bf16(x1), q1, e1);
        o1 = _mm256_fmadd_ps(odd_bf16(x1), q1, o1);
      }
      interleave_even_odd(_mm256_add_ps(e0, e1), _mm256_add_ps(o0, o1), &scores[g][t0]);
    }
  }
  for (int64_t g = 0; g < group; ++g) softmax_in_place(scores[g], n, part + g * width + dim);
  // Values: each row widened once, added into every query head's sums with its weight.
  __m256 acc_e[kAttnMaxGroup][C], acc_o[kAttnMaxGroup][C];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c) acc_e[g][c] = acc_o[g][c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* row = v + t * dim;
    for (int64_t off = 0; off < dim; off += 32) prefetch_next_item(row + off, item);  // a line is 32 bf16
    __m256 ve[C], vo[C];
    for (int c = 0; c < C; ++c) {
      const __m256i x = _mm256_loadu_si256((const __m256i*)(row + 16 * c));
      ve[c] = even_bf16(x);
      vo[c] = odd_bf16(x);
    }
    for (int64_t g = 0; g < group; ++g) {
      const __m256 p = _mm256_set1_ps(scores[g][t]);
      for (int c = 0; c < C; ++c) {
        acc_e[g][c] = _mm256_fmadd_ps(p, ve[c], acc_e[g][c]);
        acc_o[g][c] = _mm256_fmadd_ps(p, vo[c], acc_o[g][c]);
      }
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c) interleave_even_odd(acc_e[g][c], acc_o[g][c], part + g * width + 16 * c);
}

// An int8 KV's weights for one run of 32 slots, as isa_avx512vnni.cpp's quantize_weight_run32: four
// vectors of 8, their int32 packed to bytes (vpackusdw, vpackuswb interleave the 128-bit lanes; a
// permutation of 32-bit groups restores token order).
inline float quantize_weight_run32(const float* p, const float* value_scale, int64_t n, uint8_t* w8) {
  __m256 w[4];
  __m256 top = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    const int64_t left = n - 8 * i;
    const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)std::min<int64_t>(std::max<int64_t>(left, 0), 8)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 x = _mm256_mul_ps(_mm256_maskload_ps(p + 8 * i, valid), _mm256_maskload_ps(value_scale + 8 * i, valid));
    w[i] = _mm256_and_ps(x, _mm256_castsi256_ps(valid));
    top = _mm256_max_ps(top, w[i]);
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  const float t = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
  const QuantSteps qs = quant_steps(t);
  const __m256 inv = _mm256_set1_ps(qs.inv);
  __m256i r[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(w[i], inv));  // half to even (MXCSR)
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(r[0], r[1]), _mm256_packus_epi32(r[2], r[3]));
  _mm256_storeu_si256((__m256i*)w8, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return qs.step;
}

// One block of an int8 KV (kernels.h), as isa_avx512vnni.cpp's attend_block_int8 with 256-bit
// vectors and no VNNI. Keys: a 32-byte load is 8 tokens x 4 dimensions; vpmaddubsw multiplies |key| by
// the query byte carrying the key's sign (both within 127, so a pair's sum cannot saturate int16) and
// vpmaddwd with ones adds each token's four products. Values: a 32-byte load is 8 dimensions x 4
// tokens; vpmaddubsw multiplies the weights (0..127, its unsigned operand) by the values (within 127:
// no saturation either), vpmaddwd adds each dimension's four products.
template <int C>
void attend_block_int8(const DecodeAttention& a, const uint16_t* q, int64_t block, int64_t h, int64_t n,
                       float* part) {
  constexpr int64_t dim = 16 * C;
  const int64_t group = attn_group(a), width = attn_width(a), bs = a.block_size, item = a.head_stride;
  const int8_t* k = a.k8 + kv_offset(a, block, h);
  const int8_t* v = a.v8 + kv_offset(a, block, h);
  const float* key_scale = a.scales + kv_scale_offset(a, block, h);
  const float* value_scale = key_scale + bs;
  const int64_t first = query_index(a, q);
  const int32_t* q_packed = a.q_packed + first * (dim / 4);
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float scores[kAttnMaxGroup][kAttnMaxBlock];
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    if (t0 % 16 == 0)
      for (int64_t d4 = 0; d4 < dim / 4; ++d4) prefetch_next_item(k + d4 * 4 * bs + 4 * t0, item);
    const __m256 ks = _mm256_loadu_ps(key_scale + t0);
    for (int64_t g = 0; g < group; ++g) {
      __m256i acc = _mm256_setzero_si256();
      for (int64_t d4 = 0; d4 < dim / 4; ++d4) {
        const __m256i x = _mm256_loadu_si256((const __m256i*)(k + d4 * 4 * bs + 4 * t0));
        const __m256i qs = _mm256_sign_epi8(_mm256_set1_epi32(q_packed[g * (dim / 4) + d4]), x);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(x), qs), ones));
      }
      const __m256 dot = _mm256_cvtepi32_ps(acc);
      _mm256_storeu_ps(&scores[g][t0], _mm256_mul_ps(_mm256_mul_ps(dot, _mm256_set1_ps(a.q_scale[first + g])), ks));
    }
  }
  for (int64_t g = 0; g < group; ++g) softmax_in_place(scores[g], n, part + g * width + dim);
  __m256 acc[kAttnMaxGroup][2 * C];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < 2 * C; ++c) acc[g][c] = _mm256_setzero_ps();
  alignas(32) uint8_t w8[kAttnMaxGroup][kWeightRun];
  for (int64_t r0 = 0; r0 < n; r0 += kWeightRun) {
    float wd[kAttnMaxGroup];
    for (int64_t g = 0; g < group; ++g) wd[g] = quantize_weight_run32(&scores[g][r0], value_scale + r0, n - r0, w8[g]);
    __m256i sum[kAttnMaxGroup][2 * C];
    for (int64_t g = 0; g < group; ++g)
      for (int c = 0; c < 2 * C; ++c) sum[g][c] = _mm256_setzero_si256();
    const int64_t end = std::min(n, r0 + kWeightRun);
    for (int64_t t = r0; t < end; t += 4) {
      const int8_t* rows = v + t * dim;  // four tokens' values, (t / 4) * 4 * dim
      __m256i x[2 * C];
      for (int c = 0; c < 2 * C; ++c) {
        if (c % 2 == 0) prefetch_next_item(rows + 32 * c, item);
        x[c] = _mm256_loadu_si256((const __m256i*)(rows + 32 * c));
      }
      for (int64_t g = 0; g < group; ++g) {
        const __m256i w = _mm256_set1_epi32(load_i32(&w8[g][t - r0]));
        for (int c = 0; c < 2 * C; ++c)
          sum[g][c] = _mm256_add_epi32(sum[g][c], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x[c]), ones));
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const __m256 d = _mm256_set1_ps(wd[g]);
      for (int c = 0; c < 2 * C; ++c) acc[g][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[g][c]), d, acc[g][c]);
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < 2 * C; ++c) _mm256_storeu_ps(part + g * width + 8 * c, acc[g][c]);
}

void decode_attention_int8(const DecodeAttention& a) {
  quantize_queries(a);
  if (a.block_size % kWeightRun) return decode_attention_by_blocks(a, attend_block_int8_scalar);
  switch (a.dim) {
    case 32: return decode_attention_by_blocks(a, attend_block_int8<2>);
    case 64: return decode_attention_by_blocks(a, attend_block_int8<4>);
    case 96: return decode_attention_by_blocks(a, attend_block_int8<6>);
    case 128: return decode_attention_by_blocks(a, attend_block_int8<8>);
    case 160: return decode_attention_by_blocks(a, attend_block_int8<10>);
    case 192: return decode_attention_by_blocks(a, attend_block_int8<12>);
    case 224: return decode_attention_by_blocks(a, attend_block_int8<14>);
    case 256: return decode_attention_by_blocks(a, attend_block_int8<16>);
    default: return decode_attention_by_blocks(a, attend_block_int8_scalar);
  }
}

void decode_attention(const DecodeAttention& a) {
  if (a.block_size % 16) return decode_attention_by_blocks(a, attend_block_scalar);
  switch (a.dim) {
    case 32: return decode_attention_by_blocks(a, attend_block<2>);
    case 64: return decode_attention_by_blocks(a, attend_block<4>);
    case 80: return decode_attention_by_blocks(a, attend_block<5>);
    case 96: return decode_attention_by_blocks(a, attend_block<6>);
    case 112: return decode_attention_by_blocks(a, attend_block<7>);
    case 128: return decode_attention_by_blocks(a, attend_block<8>);
    case 160: return decode_attention_by_blocks(a, attend_block<10>);
    case 192: return decode_attention_by_blocks(a, attend_block<12>);
    case 224: return decode_attention_by_blocks(a, attend_block<14>);
    case 256: return decode_attention_by_blocks(a, attend_block<16>);
    default: return decode_attention_by_blocks(a, attend_block_scalar);
  }
}

// The level's table under the name its file gives it.
KernelTable level_table(const char* name) {
  return {name,          quantize_activations, linear_w4,        linear_w8,
          dequantize_w4, dequantize_w8,        add_rms_norm,     decode_attention,
          decode_attention_int8,               kv_write_int8_rows, linear_w5,
          dequantize_w5};
}

}  // namespace
}  // namespace edgectl
