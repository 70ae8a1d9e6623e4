// The AVX-512 VNNI level (Intel Ice Lake / Sapphire Rapids and later, AMD Zen 4+): built with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni (+ AVX2/FMA/F16C). One zmm register holds the 16
// rows of a tile (kernels.h), and vpdpbusd (_mm512_dpbusd_epi32: u8 x s8, four products summed
// straight into s32, no intermediate saturation) replaces AVX2's vpmaddubsw + vpmaddwd pair, as
// in llama.cpp's VNNI path of mul_sum_us8_pairs_float (ggml/src/ggml-cpu/arch/x86/quants.c).
#include <immintrin.h>

#include "common_inl.h"

namespace edgectl {
namespace {

// Activation rows per weight-register reuse: a block's weights are loaded (and a W4 block's nibbles
// split) once for up to eight rows. 32 zmm registers hold the eight accumulators, the eight W4
// (or W8) weight registers and the two sum chains. Eight rather than AVX2's four: at eight decoding
// sequences the W4 tile did its unpacking twice, and the SmolLM2 layers took 11-18% longer
// (docs/kernels.md "Small batches").
constexpr int kMB = 8;
constexpr int64_t kRowsPerPass = 64;    // activation rows per pass over the weights

inline __m512 load16(const void* x, DType t, int64_t i) {
  switch (t) {
    case kF32: return _mm512_loadu_ps((const float*)x + i);
    case kBF16: {
      const __m256i h = _mm256_loadu_si256((const __m256i*)((const uint16_t*)x + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)x + i)));
  }
}

// bfloat16 rounding (nearest even) of 16 floats, kept as floats; NaN stays NaN.
inline __m512 round_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), nan,
                            _mm512_castsi512_ps(_mm512_or_si512(bits, _mm512_set1_epi32(0x400000))));
}

inline __m512 round_to16(DType t, __m512 v) {
  switch (t) {
    case kF32: return v;
    case kBF16: return round_bf16(v);
    default: return _mm512_cvtph_ps(_mm512_maskz_cvtps_ph(0xFFFF, v, _MM_FROUND_TO_NEAREST_INT));
  }
}

inline void store16(void* p, DType t, int64_t i, __m512 v) {
  switch (t) {
    case kF32: _mm512_storeu_ps((float*)p + i, v); return;
    case kBF16: {
      const __m512i b = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(v)), 16);
      _mm256_storeu_si256((__m256i*)((uint16_t*)p + i), _mm512_cvtepi32_epi16(b));
      return;
    }
    default: _mm256_storeu_si256((__m256i*)((uint16_t*)p + i), _mm512_maskz_cvtps_ph(0xFFFF, v, _MM_FROUND_TO_NEAREST_INT)); return;
  }
}

// The rule of kernels.h on one block of 32 floats (two registers); same IEEE operations as
// quantize_block_scalar, so the same bytes.
inline void quantize_block(__m512 v0, __m512 v1, int8_t* q, float* d, float* s) {
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 inv = _mm512_set1_ps(m > 0.f ? 127.f / m : 0.f);
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  // vcvtps2dq rounds to nearest even (MXCSR default), like nearbyintf.
  const __m512i i0 = _mm512_max_epi32(nlim, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv))));
  const __m512i i1 = _mm512_max_epi32(nlim, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv))));
  *s = (float)_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  *d = m / 127.f;
  _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(i0));
  _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtepi32_epi8(i1));
}

void quantize_activations(const void* x, DType dtype, int64_t m, int64_t k, int64_t ldx, int8_t* q, float* d,
                          float* s) {
  const int64_t kb = (k + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (m * k >= (1 << 16))
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t col = b * kBlock;
      __m512 v0, v1;
      if (col + kBlock <= k) {
        v0 = load16(x, dtype, i * ldx + col);
        v1 = load16(x, dtype, i * ldx + col + 16);
      } else {  // the last, partial block: zero padding
        float tmp[kBlock];
        for (int j = 0; j < kBlock; ++j) tmp[j] = col + j < k ? load_as_float(x, dtype, i * ldx + col + j) : 0.f;
        v0 = _mm512_loadu_ps(tmp);
        v1 = _mm512_loadu_ps(tmp + 16);
      }
      quantize_block(v0, v1, q + (i * kb + b) * kBlock, d + i * kb + b, s + i * kb + b);
    }
  }
}

struct ActBlock {
  const int8_t* q;
  __m512 d;   // dx
  __m512 ds;  // dx * sum(qx): the W4 minimum's term
  __m512i offset;  // 128 * sum(qx): the W8 unsigned shift's term
};

template <int MB>
inline void load_acts(const QuantizedActs& a, int64_t i0, int64_t b, ActBlock act[MB]) {
  for (int mi = 0; mi < MB; ++mi) {
    const int64_t j = (i0 + mi) * a.kblocks + b;
    act[mi].q = a.q + j * kBlock;
    act[mi].d = _mm512_set1_ps(a.d[j]);
    act[mi].ds = _mm512_set1_ps(a.d[j] * a.s[j]);
    act[mi].offset = _mm512_set1_epi32(128 * (int32_t)a.s[j]);
  }
}

inline __m512i bcast4(const int8_t* p) { return _mm512_set1_epi32(load_i32(p)); }

// MB activation rows x one 16-row W4 tile -> out[MB][16] (fp32).
template <int MB>
void tile_w4(const uint8_t* recs, int64_t kb, const QuantizedActs& a, int64_t i0, float* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MB];
  for (int mi = 0; mi < MB; ++mi) acc[mi] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = recs + b * kW4Record;
    prefetch_ahead(rec, kW4Record);
    ActBlock act[MB];
    load_acts<MB>(a, i0, b, act);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec + kW4ScaleOffset)));
    const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec + kW4MinOffset)));
    __m512i lo[4], hi[4];
    for (int quad = 0; quad < 4; ++quad) {
      const __m512i raw = _mm512_loadu_si512((const void*)(rec + quad * 64));
      lo[quad] = _mm512_and_si512(raw, low4);
      hi[quad] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
    }
    for (int mi = 0; mi < MB; ++mi) {
      // Two independent chains (low and high nibbles) halve the vpdpbusd latency chain.
      __m512i sl = _mm512_setzero_si512(), sh = _mm512_setzero_si512();
      for (int quad = 0; quad < 4; ++quad) {
        sl = _mm512_dpbusd_epi32(sl, lo[quad], bcast4(act[mi].q + 4 * quad));
        sh = _mm512_dpbusd_epi32(sh, hi[quad], bcast4(act[mi].q + 16 + 4 * quad));
      }
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(sl, sh));
      acc[mi] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, act[mi].d), acc[mi]);
      acc[mi] = _mm512_fmadd_ps(mw, act[mi].ds, acc[mi]);
    }
  }
  for (int mi = 0; mi < MB; ++mi) _mm512_storeu_ps(out + mi * kTileRows, acc[mi]);
}

// MB activation rows x one 16-row W5 tile: W4's nibbles with the fifth bits merged in at bit 4 (kernels.h),
// q in 0..31 unsigned for vpdpbusd, then sum - 16 s per block (w = d (q - 16)).
template <int MB>
void tile_w5(const uint8_t* recs, int64_t kb, const QuantizedActs& a, int64_t i0, float* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  __m512 acc[MB];
  for (int mi = 0; mi < MB; ++mi) acc[mi] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = recs + b * kW5Record;
    prefetch_ahead(rec, kW5Record);
    ActBlock act[MB];
    load_acts<MB>(a, i0, b, act);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec + kW5ScaleOffset)));
    const __m512i high = _mm512_loadu_si512((const void*)(rec + kW5HighOffset));
    __m512i lo[4], hi[4];
    for (int quad = 0; quad < 4; ++quad) {
      const __m512i raw = _mm512_loadu_si512((const void*)(rec + quad * 64));
      // Bit `quad` of each high byte to bit 4 (a 16-bit shift by at most 4 brings nothing across bytes
      // into bit 4), and bit 4 + quad to bit 4.
      lo[quad] = _mm512_or_si512(_mm512_and_si512(raw, low4), _mm512_and_si512(_mm512_slli_epi16(high, 4 - quad), bit4));
      hi[quad] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(raw, 4), low4),
                                 _mm512_and_si512(_mm512_srli_epi16(high, quad), bit4));
    }
    for (int mi = 0; mi < MB; ++mi) {
      __m512i sl = _mm512_setzero_si512(), sh = _mm512_setzero_si512();
      for (int quad = 0; quad < 4; ++quad) {
        sl = _mm512_dpbusd_epi32(sl, lo[quad], bcast4(act[mi].q + 4 * quad));
        sh = _mm512_dpbusd_epi32(sh, hi[quad], bcast4(act[mi].q + 16 + 4 * quad));
      }
      // 16 * sum(qx) = offset / 8 (the W8 tile's 128 * sum(qx)), exact in int32
      static_assert(kW5Zero * 8 == 128, "the W5 zero's term is the W8 offset shifted right by 3");
      const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(sl, sh), _mm512_srai_epi32(act[mi].offset, 3));
      acc[mi] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, act[mi].d), acc[mi]);
    }
  }
  for (int mi = 0; mi < MB; ++mi) _mm512_storeu_ps(out + mi * kTileRows, acc[mi]);
}

// MB activation rows x one 16-row W8 tile. vpdpbusd wants unsigned weights: w ^ 0x80 = w + 128
// as u8, and the extra 128 * sum(qx) per block is subtracted from the s32 sum.
template <int MB>
void tile_w8(const uint8_t* recs, int64_t kb, const QuantizedActs& a, int64_t i0, float* out) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[MB];
  for (int mi = 0; mi < MB; ++mi) acc[mi] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = recs + b * kW8Record;
    prefetch_ahead(rec, kW8Record);
    ActBlock act[MB];
    load_acts<MB>(a, i0, b, act);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rec + kW8ScaleOffset)));
    __m512i u[8];
    for (int quad = 0; quad < 8; ++quad)
      u[quad] = _mm512_xor_si512(_mm512_loadu_si512((const void*)(rec + quad * 64)), flip);
    for (int mi = 0; mi < MB; ++mi) {
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int quad = 0; quad < 8; quad += 2) {
        s0 = _mm512_dpbusd_epi32(s0, u[quad], bcast4(act[mi].q + 4 * quad));
        s1 = _mm512_dpbusd_epi32(s1, u[quad + 1], bcast4(act[mi].q + 4 * quad + 4));
      }
      const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), act[mi].offset);
      acc[mi] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, act[mi].d), acc[mi]);
    }
  }
  for (int mi = 0; mi < MB; ++mi) _mm512_storeu_ps(out + mi * kTileRows, acc[mi]);
}

using TileFn = void (*)(const uint8_t*, int64_t, const QuantizedActs&, int64_t, float*);

template <int kBits>
void linear(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y, DType yd, int64_t ldy) {
  static const TileFn w4[kMB + 1] = {nullptr,    tile_w4<1>, tile_w4<2>, tile_w4<3>, tile_w4<4>,
                                     tile_w4<5>, tile_w4<6>, tile_w4<7>, tile_w4<8>};
  static const TileFn w5[kMB + 1] = {nullptr,    tile_w5<1>, tile_w5<2>, tile_w5<3>, tile_w5<4>,
                                     tile_w5<5>, tile_w5<6>, tile_w5<7>, tile_w5<8>};
  static const TileFn w8[kMB + 1] = {nullptr,    tile_w8<1>, tile_w8<2>, tile_w8<3>, tile_w8<4>,
                                     tile_w8<5>, tile_w8<6>, tile_w8<7>, tile_w8<8>};
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
          if (rows == kTileRows) {
            for (int mi = 0; mi < mb; ++mi) store16(y, yd, (i0 + mi) * ldy + t * kTileRows, _mm512_loadu_ps(out + mi * kTileRows));
          } else {
            for (int mi = 0; mi < mb; ++mi)
              for (int64_t r = 0; r < rows; ++r)
                store_from_float(y, yd, (i0 + mi) * ldy + t * kTileRows + r, out[mi * kTileRows + r]);
          }
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

// One row's 16 bytes of a record: four 4-byte groups, one per quad from quad0 (kernels.h).
inline __m128i row_bytes(const uint8_t* rec, int r, int quad0) {
  return _mm_setr_epi32(load_i32(rec + (quad0 + 0) * 64 + r * 4), load_i32(rec + (quad0 + 1) * 64 + r * 4),
                        load_i32(rec + (quad0 + 2) * 64 + r * 4), load_i32(rec + (quad0 + 3) * 64 + r * 4));
}

// 32 dequantized values of one row and block (v0 = columns 0-15, v1 = 16-31) -> out.
inline void store_block(void* out, DType dt, int64_t base, int64_t col, int64_t k, __m512 v0, __m512 v1) {
  if (col + kBlock <= k) {
    store16(out, dt, base + col, v0);
    store16(out, dt, base + col + 16, v1);
    return;
  }
  float tmp[kBlock];
  _mm512_storeu_ps(tmp, v0);
  _mm512_storeu_ps(tmp + 16, v1);
  for (int64_t c = col; c < k; ++c) store_from_float(out, dt, base + c, tmp[c - col]);
}

void dequantize_w4(const uint8_t* w, int64_t kb, int64_t rows, int64_t k, void* out, DType dt) {
  const __m128i low4 = _mm_set1_epi8(0x0F);
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const int r = (int)(i % kTileRows);
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* rec = w + ((i / kTileRows) * kb + b) * kW4Record;
      const __m512 d = _mm512_set1_ps(half_to_float(load_u16(rec + kW4ScaleOffset + 2 * r)));
      const __m512 m = _mm512_set1_ps(half_to_float(load_u16(rec + kW4MinOffset + 2 * r)));
      const __m128i raw = row_bytes(rec, r, 0);
      const __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
      const __m512 v0 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), d), m);
      const __m512 v1 = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), d), m);  // two roundings, as the reference
      store_block(out, dt, i * k, b * kBlock, k, v0, v1);
    }
  }
}

void dequantize_w5(const uint8_t* w, int64_t kb, int64_t rows, int64_t k, void* out, DType dt) {
  const __m128i low4 = _mm_set1_epi8(0x0F), one = _mm_set1_epi8(0x01), bit4 = _mm_set1_epi8(0x10);
  const __m512 zero = _mm512_set1_ps((float)kW5Zero);
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const int r = (int)(i % kTileRows);
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* rec = w + ((i / kTileRows) * kb + b) * kW5Record;
      const __m512 d = _mm512_set1_ps(half_to_float(load_u16(rec + kW5ScaleOffset + 2 * r)));
      // Lane `quad` of the row's high bytes shifted right by quad: the low value's fifth bit at bit 0 of
      // each byte, the high value's at bit 4 (kernels.h).
      const __m128i raw = row_bytes(rec, r, 0);
      const __m128i high = _mm_srlv_epi32(_mm_set1_epi32(load_i32(rec + kW5HighOffset + r * 4)), _mm_setr_epi32(0, 1, 2, 3));
      const __m128i lo = _mm_or_si128(_mm_and_si128(raw, low4), _mm_slli_epi16(_mm_and_si128(high, one), 4));
      const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(high, bit4));
      const __m512 v0 = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), zero), d);
      const __m512 v1 = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), zero), d);
      store_block(out, dt, i * k, b * kBlock, k, v0, v1);
    }
  }
}

void dequantize_w8(const uint8_t* w, int64_t kb, int64_t rows, int64_t k, void* out, DType dt) {
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const int r = (int)(i % kTileRows);
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* rec = w + ((i / kTileRows) * kb + b) * kW8Record;
      const __m512 d = _mm512_set1_ps(half_to_float(load_u16(rec + kW8ScaleOffset + 2 * r)));
      const __m512 v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(row_bytes(rec, r, 0))), d);
      const __m512 v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(row_bytes(rec, r, 4))), d);
      store_block(out, dt, i * k, b * kBlock, k, v0, v1);
    }
  }
}

// See add_rms_norm in isa_scalar.cpp for the semantics; here 16 columns at a time.
void add_rms_norm(const void* x, void* residual, const void* weight, void* out, DType dt, int64_t rows,
                  int64_t hidden, float eps) {
#pragma omp parallel if (rows * hidden >= (1 << 16))
  {
    float* sum = (float*)malloc(sizeof(float) * (hidden + 16));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t base = i * hidden, vec = hidden & ~(int64_t)15;
      __m512 sq = _mm512_setzero_ps();
      float sqtail = 0.f;
      for (int64_t j = 0; j < vec; j += 16) {
        __m512 v = load16(x, dt, base + j);
        if (residual) {
          v = _mm512_add_ps(v, load16(residual, dt, base + j));
          store16(residual, dt, base + j, v);
        }
        _mm512_storeu_ps(sum + j, v);
        sq = _mm512_fmadd_ps(v, v, sq);
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
      const float inv = 1.f / sqrtf((_mm512_reduce_add_ps(sq) + sqtail) / (float)hidden + eps);
      const __m512 vinv = _mm512_set1_ps(inv);
      for (int64_t j = 0; j < vec; j += 16) {
        const __m512 normed = round_to16(dt, _mm512_mul_ps(_mm512_loadu_ps(sum + j), vinv));
        store16(out, dt, base + j, _mm512_mul_ps(normed, load16(weight, dt, j)));
      }
      for (int64_t j = vec; j < hidden; ++j)
        store_from_float(out, dt, base + j, round_to(dt, sum[j] * inv) * load_as_float(weight, dt, j));
    }
    free(sum);
  }
}


// ---------------------------------------------------------------------------------------------
// Decode attention (kernels.h). A 512-bit load takes 32 bf16; its 16 dwords each hold an even
// element (low half) and the next odd one (high half), so a shift and a mask make two fp32 vectors
// of the even and the odd elements, one instruction each (no unpacking); interleave_even_odd puts
// them back in order where the order matters.
//
// Keys are column-major in the block (kernels.h): a load of row d is dimension d of 32 tokens, so
// the scores of 32 tokens are sums over d of a broadcast q[d] times a vector, with the tokens in the
// lanes: no horizontal sums. Values are row-major: each row widened once, added into every query
// head's sums with its weight.

inline __m512 even_bf16(__m512i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); }
inline __m512 odd_bf16(__m512i x) { return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u))); }

// e^x for x <= 0 (a score minus the block's maximum): Cephes' expf, range reduction by ln 2 (in
// two parts) and a degree-6 polynomial on [-ln2/2, ln2/2], then 2^n by vscalefps. Inputs below
// -87.34 (e^x under FLT_MIN) are clamped there.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3365447505531f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Elements 0..15 and 16..31 of a row (or 32 tokens) from its even and odd halves.
inline void interleave_even_odd(__m512 e, __m512 o, float* out) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  _mm512_storeu_ps(out, _mm512_permutex2var_ps(e, lo, o));
  _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(e, hi, o));
}

// Softmax of one query head's scores within a block: its maximum, p = e^(s - max) in place, their
// sum (tokens < n only), the maximum and the sum into out[0], out[1].
inline void softmax_in_place(float* scores, int64_t n, float* out) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 valid = (__mmask16)(n - t >= 16 ? 0xFFFFu : (1u << (n - t)) - 1);
    top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, scores + t));
  }
  const float m = _mm512_reduce_max_ps(top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 valid = (__mmask16)(n - t >= 16 ? 0xFFFFu : (1u << (n - t)) - 1);
    const __m512 s = _mm512_mask_loadu_ps(_mm512_set1_ps(m), valid, scores + t);
    const __m512 p = exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(m)));
    _mm512_mask_storeu_ps(scores + t, valid, p);
    sum = _mm512_mask_add_ps(sum, valid, sum, p);
  }
  out[0] = m;
  out[1] = _mm512_reduce_add_ps(sum);
}

// One block (common_inl.h decode_attention_by_blocks) for a head size of 32 * C and a block of a
// multiple of 32 tokens.
template <int C>
void attend_block(const DecodeAttention& a, const uint16_t* q, int64_t block, int64_t h, int64_t n, float* part) {
  const uint16_t* k = a.k + kv_offset(a, block, h);
  const uint16_t* v = a.v + kv_offset(a, block, h);
  constexpr int64_t dim = 32 * C;
  const int64_t group = attn_group(a), width = attn_width(a), bs = a.block_size, item = a.head_stride;
  alignas(64) float qs[kAttnMaxGroup][dim];  // the query, times the scale
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < dim; ++d) qs[g][d] = bf16_to_float(q[g * a.q_head_stride + d]) * a.scale;
  // Scores of 32 tokens at a time (past n: computed from whatever the block holds, never used).
  alignas(64) float scores[kAttnMaxGroup][kAttnMaxBlock];
  for (int64_t t0 = 0; t0 < n; t0 += 32) {
    for (int64_t d = 0; d < dim; ++d) prefetch_next_item(k + d * bs + t0, item);
    for (int64_t g = 0; g < group; ++g) {
      __m512 e0 = _mm512_setzero_ps(), o0 = e0, e1 = e0, o1 = e0;  // even / odd tokens, even / odd d
      for (int64_t d = 0; d < dim; d += 2) {
        const __m512i x0 = _mm512_loadu_si512(k + d * bs + t0), x1 = _mm512_loadu_si512(k + (d + 1) * bs + t0);
        const __m512 q0 = _mm512_set1_ps(qs[g][d]), q1 = _mm512_set1_ps(qs[g][d + 1]);
        e0 = _mm512_fmadd_ps(even_bf16(x0), q0, e0);
        o0 = _mm512_fmadd_ps(odd_bf16(x0), q0, o0);
        e1 = _mm512_fmadd_ps(even_bf16(x1), q1, e1);
        o1 = _mm512_fmadd_ps(odd_bf16(x1), q1, o1);
      }
      interleave_even_odd(_mm512_add_ps(e0, e1), _mm512_add_ps(o0, o1), &scores[g][t0]);
    }
  }
  for (int64_t g = 0; g < group; ++g) softmax_in_place(scores[g], n, part + g * width + dim);
  // Values: each row widened once, added into every query head's sums with its weight.
  __m512 acc_e[kAttnMaxGroup][C], acc_o[kAttnMaxGroup][C];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c) acc_e[g][c] = acc_o[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* row = v + t * dim;
    for (int64_t off = 0; off < dim; off += 32) prefetch_next_item(row + off, item);  // a line is 32 bf16
    __m512 ve[C], vo[C];
    for (int c = 0; c < C; ++c) {
      const __m512i x = _mm512_loadu_si512(row + 32 * c);
      ve[c] = even_bf16(x);
      vo[c] = odd_bf16(x);
    }
    for (int64_t g = 0; g < group; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g][t]);
      for (int c = 0; c < C; ++c) {
        acc_e[g][c] = _mm512_fmadd_ps(p, ve[c], acc_e[g][c]);
        acc_o[g][c] = _mm512_fmadd_ps(p, vo[c], acc_o[g][c]);
      }
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c) interleave_even_odd(acc_e[g][c], acc_o[g][c], part + g * width + 32 * c);
}

// An int8 KV's weights for one run of 32 slots (kernels.h; common_inl.h quantize_weight_run in plain
// C++): w = p * value_scale for the slots before n, 0 past it, quantized to 0..127 into w8[0..32);
// returns the run's scale.
inline float quantize_weight_run32(const float* p, const float* value_scale, int64_t n, uint8_t* w8) {
  const __mmask16 m0 = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1);
  const __mmask16 m1 = (__mmask16)(n >= 32 ? 0xFFFFu : n <= 16 ? 0u : (1u << (n - 16)) - 1);
  const __m512 w0 = _mm512_maskz_mul_ps(m0, _mm512_maskz_loadu_ps(m0, p), _mm512_maskz_loadu_ps(m0, value_scale));
  const __m512 w1 = _mm512_maskz_mul_ps(m1, _mm512_maskz_loadu_ps(m1, p + 16),
                                        _mm512_maskz_loadu_ps(m1, value_scale + 16));
  const float top = _mm512_reduce_max_ps(_mm512_max_ps(w0, w1));
  const QuantSteps qs = quant_steps(top);
  const __m512 inv = _mm512_set1_ps(qs.inv);
  // vcvtps2dq rounds half to even (MXCSR's default); vpmovusdb saturates (nothing exceeds 127)
  _mm_storeu_si128((__m128i*)w8, _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(w0, inv))));
  _mm_storeu_si128((__m128i*)(w8 + 16), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(w1, inv))));
  return qs.step;
}

// One block of an int8 KV (kernels.h) for a head size of 16 * C and a block of a multiple of 32
// tokens. Keys: a 64-byte load is 16 tokens x 4 dimensions, one vpdpbusd per query head adds their
// four products into each token's lane (the keys offset by 128 to be its unsigned operand, the
// query's sum x 128 taken off after). Values: a 64-byte load is 16 dimensions x 4 tokens, one vpdpbusd
// per query head adds four tokens' weighted values into each dimension's lane (the weights, 0..127,
// its unsigned operand); a run's int32 sums times its scale into fp32 every 32 tokens.
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
  const __m512i offset = _mm512_set1_epi8((char)0x80);
  alignas(64) float scores[kAttnMaxGroup][kAttnMaxBlock];
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    __m512i x[dim / 4];
    for (int64_t d4 = 0; d4 < dim / 4; ++d4) {
      prefetch_next_item(k + d4 * 4 * bs + 4 * t0, item);
      x[d4] = _mm512_xor_si512(_mm512_loadu_si512(k + d4 * 4 * bs + 4 * t0), offset);
    }
    const __m512 ks = _mm512_loadu_ps(key_scale + t0);
    for (int64_t g = 0; g < group; ++g) {
      // four chains of sums: vpdpbusd's latency is several cycles, one chain of dim / 4 would wait on itself
      __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
      for (int64_t d4 = 0; d4 < dim / 4; ++d4)
        acc[d4 % 4] = _mm512_dpbusd_epi32(acc[d4 % 4], x[d4], _mm512_set1_epi32(q_packed[g * (dim / 4) + d4]));
      const __m512i total = _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(total, _mm512_set1_epi32(128 * a.q_sum[first + g])));
      _mm512_storeu_ps(&scores[g][t0], _mm512_mul_ps(_mm512_mul_ps(dot, _mm512_set1_ps(a.q_scale[first + g])), ks));
    }
  }
  for (int64_t g = 0; g < group; ++g) softmax_in_place(scores[g], n, part + g * width + dim);
  // Values, a run of 32 tokens at a time, one query head at a time (its C sums stay in registers; the
  // run's values, 32 * dim bytes, are read from L1 again for the next head).
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(part + g * width + 16 * c, _mm512_setzero_ps());
  for (int64_t r0 = 0; r0 < n; r0 += kWeightRun) {
    const int64_t end = std::min(n, r0 + kWeightRun);
    for (int64_t off = r0 * dim; off < end * dim; off += 64) prefetch_next_item(v + off, item);  // a line each
    for (int64_t g = 0; g < group; ++g) {
      alignas(64) uint8_t w8[kWeightRun];
      const __m512 d = _mm512_set1_ps(quantize_weight_run32(&scores[g][r0], value_scale + r0, n - r0, w8));
      __m512i sum[C];
      for (int c = 0; c < C; ++c) sum[c] = _mm512_setzero_si512();
      for (int64_t t = r0; t < end; t += 4) {
        const int8_t* rows = v + t * dim;  // four tokens' values, (t / 4) * 4 * dim
        const __m512i w = _mm512_set1_epi32(load_i32(&w8[t - r0]));
        for (int c = 0; c < C; ++c) sum[c] = _mm512_dpbusd_epi32(sum[c], w, _mm512_loadu_si512(rows + 64 * c));
      }
      float* out = part + g * width;
      for (int c = 0; c < C; ++c)
        _mm512_storeu_ps(out + 16 * c, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[c]), d, _mm512_loadu_ps(out + 16 * c)));
    }
  }
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
  if (a.block_size % 32) return decode_attention_by_blocks(a, attend_block_scalar);
  switch (a.dim) {
    case 32: return decode_attention_by_blocks(a, attend_block<1>);
    case 64: return decode_attention_by_blocks(a, attend_block<2>);
    case 96: return decode_attention_by_blocks(a, attend_block<3>);
    case 128: return decode_attention_by_blocks(a, attend_block<4>);
    case 160: return decode_attention_by_blocks(a, attend_block<5>);
    case 192: return decode_attention_by_blocks(a, attend_block<6>);
    case 224: return decode_attention_by_blocks(a, attend_block<7>);
    case 256: return decode_attention_by_blocks(a, attend_block<8>);
    default: return decode_attention_by_blocks(a, attend_block_scalar);  // 80, 112: not a multiple of 32
  }
}

}  // namespace

const KernelTable& kernel_table_avx512vnni() {
  static const KernelTable table = {"avx512vnni",  quantize_activations, linear_w4, linear_w8,
                                    dequantize_w4, dequantize_w8,        add_rms_norm,
                                    decode_attention,    decode_attention_int8,
                                    kv_write_int8_rows,  linear_w5,
                                    dequantize_w5};
  return table;
}

}  // namespace edgectl
