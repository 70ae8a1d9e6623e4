// The scalar level: plain C++ for every CPU (x86-64 without AVX2, ARM, ...), built with no ISA
// flags. It is also the readable statement of the layout in kernels.h: the vector files compute
// exactly this, 8 or 16 rows at a time.
#include "common_inl.h"

namespace edgectl {
namespace {

void quantize_activations(const void* x, DType dtype, int64_t m, int64_t k, int64_t ldx, int8_t* q,
                          float* d, float* s) {
  const int64_t kblocks = (k + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (m * k >= (1 << 16))
  for (int64_t i = 0; i < m; ++i) {
    float v[kBlock];
    for (int64_t b = 0; b < kblocks; ++b) {
      for (int j = 0; j < kBlock; ++j) {
        const int64_t col = b * kBlock + j;
        v[j] = col < k ? load_as_float(x, dtype, i * ldx + col) : 0.f;
      }
      quantize_block_scalar(v, q + (i * kblocks + b) * kBlock, d + i * kblocks + b, s + i * kblocks + b);
    }
  }
}

// Integer dot product of row `r` of a W4 record with one quantized activation block.
int32_t dot_w4(const uint8_t* rec, int r, const int8_t* xq) {
  int32_t acc = 0;
  for (int quad = 0; quad < 4; ++quad) {
    for (int j = 0; j < 4; ++j) {
      const uint8_t byte = rec[quad * 64 + r * 4 + j];
      acc += (int32_t)(byte & 0x0F) * xq[4 * quad + j];
      acc += (int32_t)(byte >> 4) * xq[16 + 4 * quad + j];
    }
  }
  return acc;
}

// The two 5-bit values of nibble byte (quad, r, j) of a W5 record: q[r][4 quad + j], q[r][16 + 4 quad + j].
inline void w5_pair(const uint8_t* rec, int quad, int r, int j, int32_t* lo, int32_t* hi) {
  const uint8_t byte = rec[quad * 64 + r * 4 + j], high = rec[kW5HighOffset + r * 4 + j];
  *lo = (byte & 0x0F) | (((high >> quad) & 1) << 4);
  *hi = (byte >> 4) | (((high >> (4 + quad)) & 1) << 4);
}

// sum_j q * xq over one block (q in 0..31, before the -16 of w = d * (q - 16)).
int32_t dot_w5(const uint8_t* rec, int r, const int8_t* xq) {
  int32_t acc = 0;
  for (int quad = 0; quad < 4; ++quad) {
    for (int j = 0; j < 4; ++j) {
      int32_t lo, hi;
      w5_pair(rec, quad, r, j, &lo, &hi);
      acc += lo * xq[4 * quad + j] + hi * xq[16 + 4 * quad + j];
    }
  }
  return acc;
}

int32_t dot_w8(const uint8_t* rec, int r, const int8_t* xq) {
  int32_t acc = 0;
  for (int quad = 0; quad < 8; ++quad)
    for (int j = 0; j < 4; ++j) acc += (int32_t)(int8_t)rec[quad * 64 + r * 4 + j] * xq[4 * quad + j];
  return acc;
}

template <int kBits>
void linear_rows(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y,
                 DType ydtype, int64_t ldy) {
  const int64_t record = kBits == 4 ? kW4Record : kBits == 5 ? kW5Record : kW8Record;
  const int64_t kb = a.kblocks;
  const int nthreads = threads_for(tiles * kb * record);
#pragma omp parallel num_threads(nthreads)
  {
    int64_t t0, t1;
    split_range(tiles, omp_get_thread_num(), omp_get_num_threads(), &t0, &t1);
    for (int64_t t = t0; t < t1; ++t) {
      const int rows = (int)((n - t * kTileRows) < kTileRows ? n - t * kTileRows : kTileRows);
      for (int64_t i = 0; i < a.m; ++i) {
        float acc[kTileRows] = {0};
        for (int64_t b = 0; b < kb; ++b) {
          const uint8_t* rec = w + (t * kb + b) * record;
          const int8_t* xq = a.q + (i * kb + b) * kBlock;
          const float dx = a.d[i * kb + b];
          for (int r = 0; r < rows; ++r) {
            if (kBits == 4) {
              const float dw = half_to_float(load_u16(rec + kW4ScaleOffset + 2 * r));
              const float mw = half_to_float(load_u16(rec + kW4MinOffset + 2 * r));
              acc[r] += (dw * dx) * (float)dot_w4(rec, r, xq) + mw * (dx * a.s[i * kb + b]);
            } else if (kBits == 5) {
              const float dw = half_to_float(load_u16(rec + kW5ScaleOffset + 2 * r));
              const int32_t dot = dot_w5(rec, r, xq) - kW5Zero * (int32_t)a.s[i * kb + b];
              acc[r] += (dw * dx) * (float)dot;
            } else {
              const float dw = half_to_float(load_u16(rec + kW8ScaleOffset + 2 * r));
              acc[r] += (dw * dx) * (float)dot_w8(rec, r, xq);
            }
          }
        }
        for (int r = 0; r < rows; ++r) store_from_float(y, ydtype, i * ldy + t * kTileRows + r, acc[r]);
      }
    }
  }
}

void linear_w4(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y, DType yd,
               int64_t ldy) {
  linear_rows<4>(a, w, tiles, n, y, yd, ldy);
}

void linear_w8(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y, DType yd,
               int64_t ldy) {
  linear_rows<8>(a, w, tiles, n, y, yd, ldy);
}

void linear_w5(const QuantizedActs& a, const uint8_t* w, int64_t tiles, int64_t n, void* y, DType yd,
               int64_t ldy) {
  linear_rows<5>(a, w, tiles, n, y, yd, ldy);
}

// vLLM's fused_add_rms_norm and rms_norm (vllm/ir/ops/layernorm.py), weight in the dtype of x:
// the sum x + residual in fp32, rounded to the dtype for the new residual; the mean square of
// the fp32 sum; the normalized value rounded to the dtype, then times the weight, rounded again.
void add_rms_norm(const void* x, void* residual, const void* weight, void* out, DType dt, int64_t rows,
                  int64_t hidden, float eps) {
#pragma omp parallel if (rows * hidden >= (1 << 16))
  {
    float* sum = (float*)malloc(sizeof(float) * hidden);  // one fp32 row per thread
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      float sumsq = 0.f;
      for (int64_t j = 0; j < hidden; ++j) {
        float v = load_as_float(x, dt, i * hidden + j);
        if (residual) {
          v += load_as_float(residual, dt, i * hidden + j);
          store_from_float(residual, dt, i * hidden + j, v);
        }
        sum[j] = v;
        sumsq += v * v;
      }
      const float inv = 1.f / sqrtf(sumsq / (float)hidden + eps);
      for (int64_t j = 0; j < hidden; ++j) {
        const float normed = round_to(dt, sum[j] * inv);
        store_from_float(out, dt, i * hidden + j, normed * load_as_float(weight, dt, j));
      }
    }
    free(sum);
  }
}

}  // namespace
}  // namespace edgectl

// ---------------------------------------------------------------------------------------------
// Rows of a packed matrix, dequantized: embedding lookups (every ISA uses these: a lookup reads a
// few rows per token) and the scalar level's dequantization for large-batch GEMMs.

namespace edgectl {
namespace {

void dequant_row_w4(const uint8_t* w, int64_t kblocks, int64_t row, int64_t k, void* out, int64_t out_row,
                    DType dtype) {
  const int64_t tile = row / kTileRows;
  const int r = (int)(row % kTileRows);
  for (int64_t b = 0; b < kblocks; ++b) {
    const uint8_t* rec = w + (tile * kblocks + b) * kW4Record;
    const float d = half_to_float(load_u16(rec + kW4ScaleOffset + 2 * r));
    const float m = half_to_float(load_u16(rec + kW4MinOffset + 2 * r));
    for (int quad = 0; quad < 4; ++quad) {
      for (int j = 0; j < 4; ++j) {
        const uint8_t byte = rec[quad * 64 + r * 4 + j];
        const int64_t lo = b * kBlock + 4 * quad + j, hi = lo + 16;
        if (lo < k) store_from_float(out, dtype, out_row * k + lo, d * (float)(byte & 0x0F) + m);
        if (hi < k) store_from_float(out, dtype, out_row * k + hi, d * (float)(byte >> 4) + m);
      }
    }
  }
}

void dequant_row_w8(const uint8_t* w, int64_t kblocks, int64_t row, int64_t k, void* out, int64_t out_row,
                    DType dtype) {
  const int64_t tile = row / kTileRows;
  const int r = (int)(row % kTileRows);
  for (int64_t b = 0; b < kblocks; ++b) {
    const uint8_t* rec = w + (tile * kblocks + b) * kW8Record;
    const float d = half_to_float(load_u16(rec + kW8ScaleOffset + 2 * r));
    for (int quad = 0; quad < 8; ++quad) {
      for (int j = 0; j < 4; ++j) {
        const int64_t col = b * kBlock + 4 * quad + j;
        if (col < k) store_from_float(out, dtype, out_row * k + col, d * (float)(int8_t)rec[quad * 64 + r * 4 + j]);
      }
    }
  }
}

void dequant_row_w5(const uint8_t* w, int64_t kblocks, int64_t row, int64_t k, void* out, int64_t out_row,
                    DType dtype) {
  const int64_t tile = row / kTileRows;
  const int r = (int)(row % kTileRows);
  for (int64_t b = 0; b < kblocks; ++b) {
    const uint8_t* rec = w + (tile * kblocks + b) * kW5Record;
    const float d = half_to_float(load_u16(rec + kW5ScaleOffset + 2 * r));
    for (int quad = 0; quad < 4; ++quad) {
      for (int j = 0; j < 4; ++j) {
        int32_t qlo, qhi;
        w5_pair(rec, quad, r, j, &qlo, &qhi);
        const int64_t lo = b * kBlock + 4 * quad + j, hi = lo + 16;
        if (lo < k) store_from_float(out, dtype, out_row * k + lo, d * (float)(qlo - kW5Zero));
        if (hi < k) store_from_float(out, dtype, out_row * k + hi, d * (float)(qhi - kW5Zero));
      }
    }
  }
}

void dequantize_w4(const uint8_t* w, int64_t kblocks, int64_t rows, int64_t k, void* out, DType dtype) {
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) dequant_row_w4(w, kblocks, i, k, out, i, dtype);
}

void dequantize_w8(const uint8_t* w, int64_t kblocks, int64_t rows, int64_t k, void* out, DType dtype) {
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) dequant_row_w8(w, kblocks, i, k, out, i, dtype);
}

void dequantize_w5(const uint8_t* w, int64_t kblocks, int64_t rows, int64_t k, void* out, DType dtype) {
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t i = 0; i < rows; ++i) dequant_row_w5(w, kblocks, i, k, out, i, dtype);
}

void decode_attention(const DecodeAttention& a) { decode_attention_by_blocks(a, attend_block_scalar); }
void decode_attention_int8(const DecodeAttention& a) {
  quantize_queries(a);
  decode_attention_by_blocks(a, attend_block_int8_scalar);
}

}  // namespace

void gather_rows_w4(const uint8_t* w, int64_t kblocks, const int64_t* ids, int64_t count, int64_t k,
                    void* out, DType dtype) {
  for (int64_t i = 0; i < count; ++i) dequant_row_w4(w, kblocks, ids[i], k, out, i, dtype);
}

void gather_rows_w8(const uint8_t* w, int64_t kblocks, const int64_t* ids, int64_t count, int64_t k,
                    void* out, DType dtype) {
  for (int64_t i = 0; i < count; ++i) dequant_row_w8(w, kblocks, ids[i], k, out, i, dtype);
}

const KernelTable& kernel_table_scalar() {
  static const KernelTable table = {"scalar",      quantize_activations, linear_w4, linear_w8,
                                    dequantize_w4, dequantize_w8,        add_rms_norm,
                                    decode_attention,    decode_attention_int8,
                                    kv_write_int8_rows,  linear_w5,
                                    dequantize_w5};
  return table;
}

}  // namespace edgectl
