// edgectl's CPU kernels: the interface between the dispatcher (dispatch.cpp, built with no ISA
// flags, the only file that includes PyTorch) and one implementation per ISA level
// (isa_scalar.cpp, isa_avx2.cpp, isa_avx512vnni.cpp, each built with its own -m flags).
//
// This header is plain C++ with no includes beyond <stdint.h> on purpose: an ISA file must not
// instantiate any inline function it shares with another translation unit (a libstdc++ or
// PyTorch template compiled with -mavx512f could be the copy the linker keeps for everyone,
// and an AVX2 CPU would then die with SIGILL outside the kernels). Every helper in an ISA file
// lives in an anonymous namespace; only its `kernel_table_*()` function is exported.
//
// Weight layout (docs/kernels.md has the drawing). A matrix W [N, K] is stored as
// uint8 [tiles = ceil(N / 16)][kblocks = ceil(K / 32)][record], one record per 16 rows x 32
// columns, records of a row tile contiguous, so a thread streams its tiles front to back.
// Rows past N and columns past K are zero padding (their scale and minimum are 0).
//
// W4 record (320 bytes), GGUF Q4_1 arithmetic w = d * q + m, q in 0..15:
//   bytes [0, 256):   nibbles; byte (quad, row, j) at quad * 64 + row * 4 + j (quad 0..3,
//                     row 0..15, j 0..3) holds q[row][4 quad + j] in its low nibble and
//                     q[row][16 + 4 quad + j] in its high nibble;
//   bytes [256, 288): d[16] fp16; bytes [288, 320): m[16] fp16.
// W8 record (544 bytes), GGUF Q8_0 arithmetic w = d * q, q in -127..127:
//   bytes [0, 512):   byte (quad, row, j) at quad * 64 + row * 4 + j (quad 0..7) holds q[row][4 quad + j];
//   bytes [512, 544): d[16] fp16.
// W5 record (352 bytes), GGUF Q5_0 arithmetic w = d * (q - 16), q in 0..31 (a Q5_0 or Q4_0 block as it is):
//   bytes [0, 256):   the low four bits of q, as W4's nibbles;
//   bytes [256, 320): the fifth bits. Byte p of this plane goes with byte p of every quad (p = row * 4 + j):
//                     its bit `quad` is the fifth bit of that quad's low-nibble value (q[row][4 quad + j]),
//                     its bit 4 + quad that of its high-nibble value (q[row][16 + 4 quad + j]);
//   bytes [320, 352): d[16] fp16.
// 5.5 bits a weight, Q5_0's own size (W8 would be 8.5).
//
// Why rows interleaved by 4 bytes: one 32-bit lane of a vector register then holds four
// weights of one row, and a broadcast of four activation bytes multiplies all 16 (AVX-512) or
// 8 (AVX2) rows at once. Lanes are rows, so the int32 sums need no horizontal reduction and the
// per-row scales apply as one vector multiply (the same idea as llama.cpp's repacked Q4_0x8
// layouts, ggml/src/ggml-cpu/repack.cpp; the dot product itself follows the Q4_1 x Q8_1 one of
// ggml/src/ggml-cpu/arch/x86/quants.c).
//
// Activations are quantized once per call (quantize_activations): per row of x and per block
// of 32 columns, d = max|x| / 127, q = round_half_even(x * (127 / max|x|)) in -127..127 (0 for
// an all-zero block), s = sum(q). Columns past K are 0. Then
//   y[i][n] = sum_b dw[n][b] * dx[i][b] * sum_j qw * qx  (+ mw[n][b] * dx[i][b] * s[i][b] for W4;
//             for W5 the integer sum is sum_j qw * qx - 16 s[i][b], exact in int32)
// accumulated in fp32. runtime/edgectl_runtime/kernels/ops/reference.py is the same in plain PyTorch.
#pragma once
#include <stdint.h>

namespace edgectl {

constexpr int64_t kBlock = 32;      // columns per block (one scale, one minimum)
constexpr int64_t kTileRows = 16;   // rows per tile
constexpr int64_t kW4Record = 320;  // bytes per (tile, block), 4-bit
constexpr int64_t kW8Record = 544;  // bytes per (tile, block), 8-bit
constexpr int64_t kW4ScaleOffset = 256;
constexpr int64_t kW4MinOffset = 288;
constexpr int64_t kW8ScaleOffset = 512;
constexpr int64_t kW5Record = 352;  // bytes per (tile, block), 5-bit
constexpr int64_t kW5HighOffset = 256;
constexpr int64_t kW5ScaleOffset = 320;
constexpr int32_t kW5Zero = 16;  // w = d * (q - kW5Zero)

// Element types of activations and outputs (the dispatcher maps torch dtypes to these).
enum DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Activations after quantize_activations: q [m][kblocks * 32] int8, d and s [m][kblocks] fp32.
struct QuantizedActs {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t m;
  int64_t kblocks;
};

// x [m][k] with row stride ldx (elements) -> q, d, s as above (q rows are kblocks * 32 long).
using QuantizeActsFn = void (*)(const void* x, DType dtype, int64_t m, int64_t k, int64_t ldx,
                                int8_t* q, float* d, float* s);
// y [m][n] (row stride ldy, elements) = acts x W^T for a packed W of `tiles` row tiles.
using LinearFn = void (*)(const QuantizedActs& acts, const uint8_t* w, int64_t tiles, int64_t n,
                          void* y, DType ydtype, int64_t ldy);
// Rows `ids` of a packed matrix, dequantized: out [count][k] (row stride k).
using GatherRowsFn = void (*)(const uint8_t* w, int64_t kblocks, const int64_t* ids, int64_t count,
                              int64_t k, void* out, DType dtype);
// Rows [0, rows) of a packed matrix (starting at tile 0 of `w`), dequantized into out [rows][k]
// (row stride k) in `dtype`: the weight of a dense GEMM for large batches.
using DequantizeFn = void (*)(const uint8_t* w, int64_t kblocks, int64_t rows, int64_t k, void* out, DType dtype);
// out = rms_norm(x + residual) * weight, residual <- x + residual (vLLM's fused_add_rms_norm),
// or out = rms_norm(x) * weight when residual is null. Rows of `hidden` elements, contiguous.
using AddRmsNormFn = void (*)(const void* x, void* residual, const void* weight, void* out,
                              DType dtype, int64_t rows, int64_t hidden, float eps);

// Decode attention over vLLM's paged KV cache as its CPU "vec" attention writes it (vLLM's
// csrc/cpu/cpu_attn_vec.hpp reshape_and_cache; the cache tensor [blocks, kv_heads, 2 * block_size, dim]
// that vllm/v1/attention/backends/cpu_attn.py splits into key and value halves): per block and KV
// head, the KEYS COLUMN-MAJOR, key (t, d) at d * block_size + t, then the VALUES ROW-MAJOR, value
// (t, d) at t * dim + d. (vLLM's AMX attention packs both otherwise: not this op's input.) One query
// token per sequence, the last position: it attends to every one of
// the sequence's `seq_lens[s]` cached tokens (no mask needed). Query head i reads KV head
// i / (heads / kv_heads). All tensors bf16; strides in elements; query and out rows of `dim` contiguous.
//
// The work is split by (sequence, KV head, block): each item writes a partial result for the
// `group` query heads of its KV head, over its block only (flash-decoding: acc[dim] = sum_t p_t v_t,
// then max and sum, p_t = exp(s_t - max), s_t = scale * q . k_t), into
// partials[item][group][dim + 2]; a second pass merges the partials of a (sequence, KV head):
// out = sum_j exp(m_j - M) acc_j / sum_j exp(m_j - M) l_j. Every query row is read once per
// block it meets, every key and value once: the KV streams from memory front to back.
// ops/reference.py decode_attention is the same in plain PyTorch.
//
// An int8 KV (edgectl's, EDGECTL_KV_INT8; `k8`/`v8` set, `k`/`v` null): the same cache tensor with
// int8 elements (vLLM allocates it as its one-byte fp8 KV; edgectl writes it, kv_write_int8) and a
// float32 scale per token, KV head and half: scales [blocks][kv_heads][2][block_size], the key's at
// [b][h][0][t], the value's at [b][h][1][t]. A token's K (and its V) for one KV head: scale =
// max|x| / 127, q = round_half_even(x * (127 / max|x|)) in -127..127 (all 0 and scale 0 for a row
// whose max|x| is below kQuantFloor, an all-zero one; the activations' arithmetic above):
// llama.cpp's q8_0 KV arithmetic, one scale per head row instead of per 32 values. Within a block
// (its size a multiple of 4) the KEYS IN GROUPS OF FOUR DIMENSIONS: key (t, d) at
// (d / 4) * 4 * block_size + 4 * t + d % 4, and the VALUES IN GROUPS OF FOUR TOKENS: value (t, d) at
// (t / 4) * 4 * dim + 4 * d + t % 4, so that one 32-bit lane holds four dimensions of one key, or one
// dimension of four values, and both products are integer dot products (VNNI's vpdpbusd, AVX2's
// vpmaddubsw). The query row is quantized as a key row is, per head (qd, q8), and
// s_t = scale * qd * key_scale_t * (q8 . k8_t), exact in int32. The weights p_t = exp(s_t - max) times
// the token's value scale are quantized in runs of 32 slots of a block (fewer at its end when the block
// size is not a multiple of 32): d = max w / 127, w8 = round_half_even(w * (127 / max w)) in 0..127 (0 for a
// run whose maximum is below kQuantFloor);
// out = sum over runs of d * sum_t w8_t * v8_t, the inner sums exact in int32. (llama.cpp's CPU flash
// attention widens a q8_0 V row to fp32 and keeps its weights in fp32; quantizing the weights too makes
// the value side integer dot products, docs/kernels.md "Decode attention over an int8 KV".)
// ops/reference.py kv_write_int8 and decode_attention_int8 are the same in plain PyTorch.
struct DecodeAttention {
  const uint16_t* q;
  int64_t q_seq_stride, q_head_stride;
  const uint16_t* k;
  const uint16_t* v;
  int64_t block_stride, head_stride;  // of both caches: block b, KV head h at b * block_stride + h * head_stride
  const int32_t* seq_lens;            // [seqs]
  const int32_t* block_table;         // [seqs][table_stride]: cache block of each block of a sequence
  int64_t table_stride;
  uint16_t* out;
  int64_t out_seq_stride, out_head_stride;
  int64_t seqs, heads, kv_heads, dim, block_size, max_blocks;  // max_blocks: of the longest sequence
  float scale;
  float* partials;  // [seqs][kv_heads][max_blocks][group][dim + 2], scratch
  const int8_t* k8 = nullptr;  // an int8 KV: its caches (same strides) and scales, else null
  const int8_t* v8 = nullptr;
  const float* scales = nullptr;  // [blocks][kv_heads][2][block_size]
  // The query quantized once per call (each level's decode_attention_int8, common_inl.h
  // quantize_queries): per sequence and query head, its int8 four to an int32 [seqs][heads][dim / 4],
  // qd * scale and the sum of its int8 [seqs][heads].
  int32_t* q_packed = nullptr;
  float* q_scale = nullptr;
  int32_t* q_sum = nullptr;
};

constexpr int64_t kAttnMaxGroup = 16;     // query heads per KV head
constexpr int64_t kAttnMaxBlock = 512;    // tokens per KV block
constexpr int64_t kAttnMaxDim = 256;      // a multiple of 16
constexpr int64_t kWeightRun = 32;        // an int8 KV's attention weights: slots per scale
// An int8 KV row (key, value, query) or run of weights whose largest magnitude is below kQuantFloor quantizes to
// zeros, scale 0: 127 / max would overflow float32 below ~3.7e-37 (an all-zero row is the case that occurs).
constexpr float kQuantFloor = 1e-30f;
using DecodeAttentionFn = void (*)(const DecodeAttention& a);

// An int8 KV's write (DecodeAttention above): token i's key and value rows [kv_heads][dim] (bf16, at
// key + i * key_stride, value + i * value_stride) quantized into slot slots[i] = block * block_size + t
// (a negative slot is padding: skipped), keys in groups of four dimensions, values in groups of four tokens.
struct KvWrite {
  const uint16_t* key;
  int64_t key_stride;
  const uint16_t* value;
  int64_t value_stride;
  const int64_t* slots;
  int64_t tokens;
  int8_t* k8;
  int8_t* v8;
  float* scales;
  int64_t block_stride, head_stride, kv_heads, dim, block_size;
};
using KvWriteFn = void (*)(const KvWrite& w);

struct KernelTable {
  const char* name;  // "scalar", "avx2", "avxvnni", "avx512vnni"
  QuantizeActsFn quantize_activations;
  LinearFn linear_w4;
  LinearFn linear_w8;
  DequantizeFn dequantize_w4;
  DequantizeFn dequantize_w8;
  AddRmsNormFn add_rms_norm;
  DecodeAttentionFn decode_attention;
  DecodeAttentionFn decode_attention_int8;
  KvWriteFn kv_write_int8;
  LinearFn linear_w5;
  DequantizeFn dequantize_w5;
};

// One per ISA file. The dispatcher calls only those the CPU and the OS support.
const KernelTable& kernel_table_scalar();
// Embedding lookups touch a few rows per token: plain C++ is enough on every CPU (isa_scalar.cpp).
void gather_rows_w4(const uint8_t* w, int64_t kblocks, const int64_t* ids, int64_t count, int64_t k,
                    void* out, DType dtype);
void gather_rows_w8(const uint8_t* w, int64_t kblocks, const int64_t* ids, int64_t count, int64_t k,
                    void* out, DType dtype);
#if defined(__x86_64__)
const KernelTable& kernel_table_avx2();
const KernelTable& kernel_table_avxvnni();
const KernelTable& kernel_table_avx512vnni();
#endif

}  // namespace edgectl
