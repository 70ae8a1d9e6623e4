// The op library's front: PyTorch registration (TORCH_LIBRARY(edgectl, m)), input checks, and
// the choice of one ISA level per process. Built with no ISA flags (only the baseline of the
// target, x86-64 = SSE2), so the library loads and this code runs on any CPU of the family;
// the vector code is reached only through the table of a level the CPU and the OS support.
#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels.h"

namespace edgectl {
namespace {

// ---------------------------------------------------------------------------------------------
// What this CPU and OS can run. The same checks as edgectl's probe (edgectl/probe/cpuid.py):
// cpuid says the instructions exist, XCR0 (xgetbv) says the OS saves the registers they use.

struct Levels {
  bool avx2 = false;
  bool avxvnni = false;  // AVX-VNNI: vpdpbusd on ymm, VEX-encoded (CPUID.(7,1):EAX[4])
  bool avx512vnni = false;
  bool bf16_gemm = false;  // AVX512-BF16 (CPUID.(7,1):EAX[5]) or AMX-BF16 (CPUID.(7,0):EDX[22])
};

#if defined(__x86_64__)
uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));  // only after CPUID.1:ECX.OSXSAVE
  return ((uint64_t)edx << 32) | eax;
}

Levels detect_levels() {
  Levels out;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return out;
  const bool fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1, f16c = c >> 29 & 1;
  if (!osxsave || !avx) return out;
  const uint64_t xcr0 = read_xcr0();
  // Intel SDM vol. 1, 13.1: bit 1 SSE, 2 AVX (YMM upper halves), 5 opmask, 6 ZMM_Hi256, 7 Hi16_ZMM.
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;
  if (__get_cpuid_max(0, nullptr) < 7) return out;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b >> 5 & 1, avx512f = b >> 16 & 1, avx512bw = b >> 30 & 1, avx512vl = b >> 31 & 1;
  const bool vnni = c >> 11 & 1;
  out.avx2 = os_avx && avx2 && fma && f16c;
  out.avx512vnni = out.avx2 && os_avx512 && avx512f && avx512bw && avx512vl && vnni;
  const bool amx_bf16 = d >> 22 & 1;
  __cpuid_count(7, 1, a, b, c, d);
  out.avxvnni = out.avx2 && (a >> 4 & 1);
  out.bf16_gemm = out.avx512vnni && (amx_bf16 || (a >> 5 & 1));
  return out;
}
#else
Levels detect_levels() { return Levels{}; }
#endif

const Levels& levels() {
  static const Levels l = detect_levels();
  return l;
}

std::vector<std::string> supported_names() {
  std::vector<std::string> out{"scalar"};
#if defined(__x86_64__)
  if (levels().avx2) out.push_back("avx2");
  if (levels().avxvnni) out.push_back("avxvnni");
  if (levels().avx512vnni) out.push_back("avx512vnni");
#endif
  return out;
}

const KernelTable* table_named(const std::string& name) {
  if (name == "scalar") return &kernel_table_scalar();
#if defined(__x86_64__)
  if (name == "avx2" && levels().avx2) return &kernel_table_avx2();
  if (name == "avxvnni" && levels().avxvnni) return &kernel_table_avxvnni();
  if (name == "avx512vnni" && levels().avx512vnni) return &kernel_table_avx512vnni();
#endif
  return nullptr;
}

std::atomic<const KernelTable*> g_active{nullptr};

const KernelTable& active() {
  const KernelTable* t = g_active.load(std::memory_order_acquire);
  if (t == nullptr) {  // never selected explicitly: the best level this machine runs
    t = table_named(supported_names().back());
    g_active.store(t, std::memory_order_release);
  }
  return *t;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "auto" = the best supported level. Anything else must be a level this CPU and OS can run.
std::string set_kernel_isa(const std::string& level) {
  const auto names = supported_names();
  const std::string want = level == "auto" ? names.back() : level;
  const KernelTable* t = table_named(want);
  TORCH_CHECK(want == "scalar" || want == "avx2" || want == "avxvnni" || want == "avx512vnni",
              "edgectl kernels: unknown ISA level '", level, "' (use auto, scalar, avx2, avxvnni or avx512vnni)");
  TORCH_CHECK(t != nullptr, "edgectl kernels: this CPU cannot run the ", want,
              " kernels (cpuid and XCR0 allow: ", join(names), ")");
  g_active.store(t, std::memory_order_release);
  return want;
}

std::string kernel_isa() { return active().name; }

// ---------------------------------------------------------------------------------------------
// Argument checks and tensor plumbing

DType dtype_of(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kHalf: return kF16;
    default:
      TORCH_CHECK(false, "edgectl kernels: ", what, " must be float32, bfloat16 or float16, got ",
                  t.scalar_type());
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_packed(const at::Tensor& w, int64_t n, int64_t k, int64_t record, const char* op) {
  TORCH_CHECK(w.device().is_cpu(), op, ": the packed weight must be on the CPU");
  TORCH_CHECK(w.scalar_type() == at::kByte, op, ": the packed weight must be uint8, got ", w.scalar_type());
  TORCH_CHECK(n > 0 && k > 0, op, ": n and k must be positive, got n=", n, " k=", k);
  TORCH_CHECK(w.dim() == 3 && w.size(0) == ceil_div(n, kTileRows) && w.size(1) == ceil_div(k, kBlock) &&
                  w.size(2) == record,
              op, ": the packed weight for n=", n, " k=", k, " must have shape [", ceil_div(n, kTileRows),
              ", ", ceil_div(k, kBlock), ", ", record, "], got ", w.sizes());
  TORCH_CHECK(w.is_contiguous(), op, ": the packed weight must be contiguous");
}

// x [..., k] -> a 2-D view [m, k] whose rows may be strided but whose columns are contiguous.
at::Tensor rows_of(const at::Tensor& x, int64_t k, const char* op) {
  TORCH_CHECK(x.device().is_cpu(), op, ": x must be on the CPU");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == k, op, ": x must have ", k, " columns (the weight's k), got shape ",
              x.sizes());
  at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, k});
  if (x2.stride(1) != 1 || (x2.size(0) > 1 && x2.stride(0) < k)) x2 = x2.contiguous();
  return x2;
}

struct ActBuffers {
  at::Tensor storage;  // keeps q, d, s alive
  QuantizedActs acts;
};

ActBuffers quantize(const at::Tensor& x2, int64_t k) {
  const int64_t m = x2.size(0), kb = ceil_div(k, kBlock);
  ActBuffers out;
  // One allocation: q [m][kb * 32] int8, then d and s [m][kb] fp32 (4-byte aligned: kb * 32 is).
  out.storage = at::empty({m * kb * kBlock + 2 * m * kb * 4}, x2.options().dtype(at::kByte));
  auto* base = out.storage.data_ptr<uint8_t>();
  auto* q = reinterpret_cast<int8_t*>(base);
  auto* d = reinterpret_cast<float*>(base + m * kb * kBlock);
  float* s = d + m * kb;
  if (m > 0) active().quantize_activations(x2.data_ptr(), dtype_of(x2, "x"), m, k, x2.stride(0), q, d, s);
  out.acts = QuantizedActs{q, d, s, m, kb};
  return out;
}

// ---------------------------------------------------------------------------------------------
// Large batches (prefill): from `dense_from_m` activation rows on, the weight is dequantized a
// chunk of rows at a time into a scratch matrix and multiplied by PyTorch's dense GEMM (oneDNN /
// MKL; AMX or AVX512-BF16 for bf16 where the CPU has them), instead of the integer kernel. The
// crossover per level is measured (docs/kernels.md); set_dense_from_m overrides it (0 = never).

// Read from the CPUID results detect_levels() took once: every linear call asks (through
// dense_from_m), and CPUID is not cheap everywhere — in a KVM guest each one exits to the
// hypervisor; asked per call it was 9% of a SmolLM2 decode's CPU samples (`perf record`,
// docs/kernels.md "Per-token overhead").
bool has_bf16_gemm() { return levels().bf16_gemm; }

// Measured on the 1B-class layer shapes (docs/kernels.md, "Large batches"): with AMX / AVX512-BF16
// the bf16 GEMM overtakes the integer kernel between 64 and 128 rows (equal at 128, 1.3-2x at
// 512); with fp32 as the only fast dense type (AVX2, AVX-512 without BF16) the integer kernel is
// faster at every size up to 512 (MKL's AVX2 sgemm: 88-123 GFLOP/s vs 118-176); AVX-VNNI's integer
// kernel only faster than AVX2's, so it never switches either.
int64_t default_dense_from_m(const std::string& level) {
  if (level == "avx512vnni") return has_bf16_gemm() ? 128 : 0;
  if (level == "avx2" || level == "avxvnni") return 0;
  return 16;  // scalar: plain C++ integer products; a BLAS GEMM wins from small batches
}

std::atomic<int64_t> g_dense_from_m{-1};  // -1: the active level's default

int64_t dense_from_m() {
  const int64_t v = g_dense_from_m.load();
  return v >= 0 ? v : default_dense_from_m(active().name);
}

int64_t set_dense_from_m(int64_t m) {
  TORCH_CHECK(m >= -1, "edgectl::set_dense_from_m: m must be -1 (the level's default), 0 (never) or a row count");
  const int64_t before = dense_from_m();
  g_dense_from_m.store(m);
  return before;
}

// The dtype of the dense GEMM: bf16 where the level has bf16 arithmetic (a bf16 x then needs no
// conversion), fp32 otherwise (AVX2 has no bf16 arithmetic; MKL's sgemm is its fastest GEMM).
at::ScalarType dense_dtype(const at::Tensor& x) {
  if (x.scalar_type() == at::kFloat) return at::kFloat;
  const bool bf16 = x.scalar_type() == at::kBFloat16 && std::string(active().name) == "avx512vnni" && has_bf16_gemm();
  return bf16 ? at::kBFloat16 : at::kFloat;
}

// The row count the dense GEMM is called with for m activation rows: m rounded up to one of four
// sizes per octave (16 -> 16, 17 -> 20, 129 -> 160, 300 -> 320, 512 -> 512). oneDNN compiles a
// primitive per GEMM shape and keeps it in its primitive cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY,
// 1024 by default; oneDNN's docs, "Primitive Cache"); with the exact row count, every new prompt
// length added primitives until the cache was full, ~0.6 GB of the worker's malloc on SmolLM2
// (docs/memory.md, "Prompts of every length"). Rounded, the shapes a plan can meet are few and
// are all seen soon after start; the zero rows cost at most 25% more GEMM work (~12% on average).
int64_t dense_rows(int64_t m) {
  if (m <= 16) return m;
  int64_t octave = 16;
  while (octave * 2 <= m) octave *= 2;  // the largest power of two <= m
  const int64_t step = octave / 4;
  return ceil_div(m, step) * step;
}

// The record of a packed W4, W5 or W8 matrix (kernels.h).
int64_t record_bytes(int64_t bits) {
  return bits == 4 ? kW4Record : bits == 5 ? kW5Record : kW8Record;
}

DequantizeFn dequantizer(int64_t bits) {
  const KernelTable& t = active();
  return bits == 4 ? t.dequantize_w4 : bits == 5 ? t.dequantize_w5 : t.dequantize_w8;
}

void dense_linear(const at::Tensor& x2, const at::Tensor& w, int64_t n, int64_t k, int64_t bits, at::Tensor& y) {
  const at::ScalarType ct = dense_dtype(x2);
  const int64_t m = x2.size(0), mp = dense_rows(m);
  at::Tensor xc = x2.scalar_type() == ct ? x2 : x2.to(ct);
  if (mp != m) {
    at::Tensor padded = at::empty({mp, k}, xc.options());
    padded.narrow(0, 0, m).copy_(xc);
    padded.narrow(0, m, mp - m).zero_();  // only the padding rows: the rest is overwritten
    xc = padded;
  }
  const int64_t kb = w.size(1), record = w.size(2);
  // Scratch of ~2 MB (L2-sized): a chunk of whole tiles.
  const int64_t elem = ct == at::kFloat ? 4 : 2;
  const int64_t chunk = std::max<int64_t>(kTileRows, ((2 << 20) / (k * elem)) / kTileRows * kTileRows);
  at::Tensor scratch = at::empty({std::min(chunk, n), k}, xc.options());
  const DType st = dtype_of(scratch, "scratch");
  const DequantizeFn dequantize = dequantizer(bits);
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rows = std::min(chunk, n - r0);
    dequantize(w.data_ptr<uint8_t>() + (r0 / kTileRows) * kb * record, kb, rows, k, scratch.data_ptr(), st);
    const at::Tensor part = at::mm(xc, scratch.narrow(0, 0, rows).t());  // [mp, rows]
    y.narrow(1, r0, rows).copy_(part.narrow(0, 0, m));
  }
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, int64_t n, int64_t k, int64_t bits, const char* op) {
  check_packed(w, n, k, record_bytes(bits), op);
  const at::Tensor x2 = rows_of(x, k, op);
  const DType dt = dtype_of(x2, "x");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor y = at::empty({x2.size(0), n}, x2.options());
  const int64_t m = x2.size(0), from = dense_from_m();
  if (m > 0 && from > 0 && m >= from) {
    dense_linear(x2, w, n, k, bits, y);
  } else if (m > 0) {
    const ActBuffers a = quantize(x2, k);
    const KernelTable& t = active();
    const LinearFn fn = bits == 4 ? t.linear_w4 : bits == 5 ? t.linear_w5 : t.linear_w8;
    fn(a.acts, w.data_ptr<uint8_t>(), w.size(0), n, y.data_ptr(), dt, n);
  }
  return y.view(shape);
}

at::Tensor dequantize(const at::Tensor& w, int64_t n, int64_t k, int64_t bits, at::ScalarType dtype) {
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 8, "edgectl::dequantize: bits must be 4, 5 or 8, got ", bits);
  check_packed(w, n, k, record_bytes(bits), "edgectl::dequantize");
  at::Tensor out = at::empty({n, k}, w.options().dtype(dtype));
  dequantizer(bits)(w.data_ptr<uint8_t>(), w.size(1), n, k, out.data_ptr(), dtype_of(out, "dtype"));
  return out;
}

at::Tensor linear_w4a8(const at::Tensor& x, const at::Tensor& w, int64_t n, int64_t k) {
  return linear(x, w, n, k, 4, "edgectl::linear_w4a8");
}

at::Tensor linear_w5a8(const at::Tensor& x, const at::Tensor& w, int64_t n, int64_t k) {
  return linear(x, w, n, k, 5, "edgectl::linear_w5a8");
}

at::Tensor linear_w8a8(const at::Tensor& x, const at::Tensor& w, int64_t n, int64_t k) {
  return linear(x, w, n, k, 8, "edgectl::linear_w8a8");
}

at::Tensor embedding(const at::Tensor& ids, const at::Tensor& w, int64_t n, int64_t k, at::ScalarType dtype,
                     bool w4, const char* op) {
  check_packed(w, n, k, w4 ? kW4Record : kW8Record, op);
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt, op,
              ": ids must be int64 or int32, got ", ids.scalar_type());
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  if (flat.numel() > 0) {
    const int64_t lo = flat.min().item<int64_t>(), hi = flat.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < n, op, ": ids must be in [0, ", n, "), got values in [", lo, ", ", hi, "]");
  }
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(k);
  at::Tensor out = at::empty({flat.numel(), k}, w.options().dtype(dtype));
  const DType dt = dtype_of(out, "dtype");
  (w4 ? gather_rows_w4 : gather_rows_w8)(w.data_ptr<uint8_t>(), w.size(1), flat.data_ptr<int64_t>(),
                                         flat.numel(), k, out.data_ptr(), dt);
  return out.view(shape);
}

at::Tensor embedding_w4(const at::Tensor& ids, const at::Tensor& w, int64_t n, int64_t k, at::ScalarType dtype) {
  return embedding(ids, w, n, k, dtype, true, "edgectl::embedding_w4");
}

at::Tensor embedding_w8(const at::Tensor& ids, const at::Tensor& w, int64_t n, int64_t k, at::ScalarType dtype) {
  return embedding(ids, w, n, k, dtype, false, "edgectl::embedding_w8");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, "edgectl::quantize_activations: x must have at least one dimension");
  const int64_t k = x.size(-1);
  TORCH_CHECK(k > 0, "edgectl::quantize_activations: x has no columns");
  const at::Tensor x2 = rows_of(x, k, "edgectl::quantize_activations");
  const ActBuffers a = quantize(x2, k);
  const int64_t m = x2.size(0), kb = ceil_div(k, kBlock);
  const auto i8 = x2.options().dtype(at::kChar), f32 = x2.options().dtype(at::kFloat);
  at::Tensor q = at::empty({m, kb, kBlock}, i8), d = at::empty({m, kb}, f32), s = at::empty({m, kb}, f32);
  if (m > 0) {
    std::memcpy(q.data_ptr(), a.acts.q, m * kb * kBlock);
    std::memcpy(d.data_ptr(), a.acts.d, m * kb * 4);
    std::memcpy(s.data_ptr(), a.acts.s, m * kb * 4);
  }
  return {q, d, s};
}

void check_norm(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), op, ": tensors must be on the CPU");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1), op,
              ": weight must be [hidden] with hidden = x's last size; got x ", x.sizes(), " and weight ",
              weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": weight must have x's dtype (", x.scalar_type(),
              "), got ", weight.scalar_type());
  dtype_of(x, "x");
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  const char* op = "edgectl::add_rms_norm";
  check_norm(x, weight, op);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(), op,
              ": residual must match x (", x.sizes(), " ", x.scalar_type(), "), got ", residual.sizes(), " ",
              residual.scalar_type());
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor res = residual.clone(at::MemoryFormat::Contiguous);  // becomes x + residual
  at::Tensor out = at::empty_like(xc);
  const int64_t hidden = x.size(-1), rows = hidden ? x.numel() / hidden : 0;
  if (rows > 0)
    active().add_rms_norm(xc.data_ptr(), res.data_ptr(), wc.data_ptr(), out.data_ptr(), dtype_of(xc, "x"), rows,
                          hidden, (float)eps);
  return {out, res};
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_norm(x, weight, "edgectl::rms_norm");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t hidden = x.size(-1), rows = hidden ? x.numel() / hidden : 0;
  if (rows > 0)
    active().add_rms_norm(xc.data_ptr(), nullptr, wc.data_ptr(), out.data_ptr(), dtype_of(xc, "x"), rows, hidden,
                          (float)eps);
  return out;
}


// vLLM's CPU_ATTN cache: [blocks, kv_heads, 2 * block_size, dim] viewed as key and value halves of
// [blocks, kv_heads, block_size, dim] (vllm/v1/attention/backends/cpu_attn.py, forward): rows of
// dim contiguous, the two halves with the same strides. `element`: bf16, or int8 for edgectl's
// int8 KV (kernels.h), whose float32 scales [blocks, kv_heads, 2, block_size] come in `scales`.
void check_decode_attention(const char* op, const at::Tensor& query, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const at::Tensor* scales, const at::Tensor& out,
                            const at::Tensor& seq_lens, const at::Tensor& block_table) {
  const at::ScalarType element = scales ? at::kChar : at::kBFloat16;
  for (const at::Tensor* t : {&query, static_cast<const at::Tensor*>(&out)})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kBFloat16, op,
                ": query and out must be bfloat16 CPU tensors, got ", t->scalar_type());
  for (const at::Tensor* t : {&key_cache, &value_cache})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == element, op, ": the caches must be ", element,
                " CPU tensors, got ", t->scalar_type());
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes(), op, ": query and out must be [tokens, heads, dim] "
              "of one shape, got ", query.sizes(), " and ", out.sizes());
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes() &&
              value_cache.strides() == key_cache.strides(), op, ": key and value caches must be "
              "[blocks, kv_heads, block_size, dim] with the same strides, got ", key_cache.sizes(), " and ",
              value_cache.sizes());
  const int64_t seqs = query.size(0), heads = query.size(1), dim = query.size(2);
  const int64_t blocks = key_cache.size(0), kv_heads = key_cache.size(1), block_size = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == dim && kv_heads > 0 && heads % kv_heads == 0 &&
              heads / kv_heads <= kAttnMaxGroup, op, ": query heads must be a multiple (at most ", kAttnMaxGroup,
              ") of the caches' KV heads and the head sizes equal, got query ", query.sizes(), " and caches ",
              key_cache.sizes());
  TORCH_CHECK(dim % 16 == 0 && dim <= kAttnMaxDim && block_size >= 1 && block_size <= kAttnMaxBlock, op,
              ": head size must be a multiple of 16 up to ", kAttnMaxDim, " and the block at most ", kAttnMaxBlock,
              " tokens, got ", dim, " and ", block_size);
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1 && key_cache.stride(3) == 1 && key_cache.stride(2) == dim,
              op, ": rows of dim must be contiguous (query ", query.strides(), ", caches ", key_cache.strides(), ")");
  if (scales) {
    TORCH_CHECK(block_size % 4 == 0, op, ": an int8 KV's block size must be a multiple of 4 (its values are in "
                "groups of four tokens), got ", block_size);
    TORCH_CHECK(scales->scalar_type() == at::kFloat && scales->is_contiguous() &&
                scales->sizes() == at::IntArrayRef({blocks, kv_heads, 2, block_size}), op,
                ": scales must be contiguous float32 [blocks, kv_heads, 2, block_size] = [", blocks, ", ", kv_heads,
                ", 2, ", block_size, "], got ", scales->sizes(), " ", scales->scalar_type());
  }
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.dim() == 1 && seq_lens.size(0) == seqs &&
              seq_lens.is_contiguous(), op, ": seq_lens must be int32 [tokens], got ", seq_lens.sizes(), " ",
              seq_lens.scalar_type());
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.size(0) >= seqs &&
              block_table.stride(1) == 1, op, ": block_table must be int32 [>= tokens, blocks] with contiguous rows, "
              "got ", block_table.sizes(), " ", block_table.scalar_type());
}

void decode_attention_into(const char* op, const at::Tensor& query, const at::Tensor& key_cache,
                           const at::Tensor& value_cache, const at::Tensor* scales, at::Tensor& out,
                           const at::Tensor& seq_lens, const at::Tensor& block_table, double scale) {
  check_decode_attention(op, query, key_cache, value_cache, scales, out, seq_lens, block_table);
  const int64_t seqs = query.size(0), heads = query.size(1), dim = query.size(2);
  const int64_t kv_heads = key_cache.size(1), block_size = key_cache.size(2);
  if (seqs == 0) return;
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  int64_t max_blocks = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    TORCH_CHECK(lens[s] >= 0, op, ": seq_lens[", s, "] is negative");
    max_blocks = std::max(max_blocks, ceil_div(lens[s], block_size));
  }
  TORCH_CHECK(max_blocks <= block_table.size(1), op, ": a sequence of ", max_blocks, " blocks in a block table of ",
              block_table.size(1));
  const int64_t group = heads / kv_heads;
  at::Tensor partials = at::empty({seqs * kv_heads * std::max<int64_t>(max_blocks, 1) * group * (dim + 2)},
                                  query.options().dtype(at::kFloat));
  const auto* q = reinterpret_cast<const uint16_t*>(query.data_ptr());
  const bool int8 = scales != nullptr;
  DecodeAttention a{q, query.stride(0), query.stride(1),
                    int8 ? nullptr : reinterpret_cast<const uint16_t*>(key_cache.data_ptr()),
                    int8 ? nullptr : reinterpret_cast<const uint16_t*>(value_cache.data_ptr()),
                    key_cache.stride(0), key_cache.stride(1),
                    lens, block_table.data_ptr<int32_t>(), block_table.stride(0),
                    reinterpret_cast<uint16_t*>(out.data_ptr()), out.stride(0), out.stride(1),
                    seqs, heads, kv_heads, dim, block_size, max_blocks, (float)scale, partials.data_ptr<float>(),
                    int8 ? reinterpret_cast<const int8_t*>(key_cache.data_ptr()) : nullptr,
                    int8 ? reinterpret_cast<const int8_t*>(value_cache.data_ptr()) : nullptr,
                    int8 ? scales->data_ptr<float>() : nullptr};
  if (int8) {
    at::Tensor quantized = at::empty({seqs * heads * (dim / 4 + 2)}, query.options().dtype(at::kInt));
    a.q_packed = quantized.data_ptr<int32_t>();
    a.q_sum = a.q_packed + seqs * heads * (dim / 4);
    a.q_scale = reinterpret_cast<float*>(a.q_sum + seqs * heads);
    active().decode_attention_int8(a);
  }
  else
    active().decode_attention(a);
}

void decode_attention(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                      at::Tensor& out, const at::Tensor& seq_lens, const at::Tensor& block_table, double scale) {
  decode_attention_into("edgectl::decode_attention", query, key_cache, value_cache, nullptr, out, seq_lens,
                        block_table, scale);
}

void decode_attention_int8(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const at::Tensor& scales, at::Tensor& out, const at::Tensor& seq_lens,
                           const at::Tensor& block_table, double scale) {
  decode_attention_into("edgectl::decode_attention_int8", query, key_cache, value_cache, &scales, out, seq_lens,
                        block_table, scale);
}

// An int8 KV's write (kernels.h): key and value [tokens, kv_heads, dim] bf16 (rows of kv_heads * dim
// contiguous) into the int8 halves and the scales at slot_mapping (int64 [>= tokens]; -1 skips).
void kv_write_int8_op(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache, at::Tensor& value_cache,
                      at::Tensor& scales, const at::Tensor& slot_mapping) {
  const char* op = "edgectl::kv_write_int8";
  TORCH_CHECK(key.scalar_type() == at::kBFloat16 && value.scalar_type() == at::kBFloat16 && key.dim() == 3 &&
              value.sizes() == key.sizes(), op, ": key and value must be bfloat16 [tokens, kv_heads, dim] of one "
              "shape, got ", key.sizes(), " ", key.scalar_type(), " and ", value.sizes(), " ", value.scalar_type());
  TORCH_CHECK(key_cache.scalar_type() == at::kChar && value_cache.scalar_type() == at::kChar &&
              key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes() &&
              value_cache.strides() == key_cache.strides(), op, ": the caches must be int8 [blocks, kv_heads, "
              "block_size, dim] with the same strides, got ", key_cache.sizes(), " ", key_cache.scalar_type());
  const int64_t tokens = key.size(0), kv_heads = key.size(1), dim = key.size(2);
  const int64_t blocks = key_cache.size(0), block_size = key_cache.size(2);
  TORCH_CHECK(key_cache.size(1) == kv_heads && key_cache.size(3) == dim && key_cache.stride(3) == 1 &&
              key_cache.stride(2) == dim, op, ": caches ", key_cache.sizes(), " for keys ", key.sizes());
  TORCH_CHECK(block_size % 4 == 0, op, ": the block size must be a multiple of 4 (values are in groups of four "
              "tokens), got ", block_size);
  for (const at::Tensor* t : {&key, &value})
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == dim, op, ": a token's rows must be contiguous, got strides ",
                t->strides());
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
              scales.sizes() == at::IntArrayRef({blocks, kv_heads, 2, block_size}), op,
              ": scales must be contiguous float32 [", blocks, ", ", kv_heads, ", 2, ", block_size, "], got ",
              scales.sizes());
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 && slot_mapping.is_contiguous() &&
              slot_mapping.size(0) >= tokens, op, ": slot_mapping must be int64 [>= tokens], got ",
              slot_mapping.sizes(), " ", slot_mapping.scalar_type());
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t i = 0; i < tokens; ++i)
    TORCH_CHECK(slots[i] < blocks * block_size, op, ": slot ", slots[i], " past the cache's ", blocks * block_size);
  active().kv_write_int8({reinterpret_cast<const uint16_t*>(key.data_ptr()), key.stride(0),
                          reinterpret_cast<const uint16_t*>(value.data_ptr()), value.stride(0), slots, tokens,
                          reinterpret_cast<int8_t*>(key_cache.data_ptr()),
                          reinterpret_cast<int8_t*>(value_cache.data_ptr()), scales.data_ptr<float>(),
                          key_cache.stride(0), key_cache.stride(1), kv_heads, dim, block_size});
}

std::vector<std::string> supported_isas() { return supported_names(); }

}  // namespace
}  // namespace edgectl

// Schemas: every op but the attention's (decode_attention, decode_attention_int8, kv_write_int8) is functional (returns new tensors), so torch.compile can treat each call as
// one opaque node once the fake implementations (ops/_library.py) are registered.
TORCH_LIBRARY(edgectl, m) {
  m.def("kernel_isa() -> str");
  m.def("supported_isas() -> str[]");
  m.def("set_kernel_isa(str level) -> str");
  m.def("quantize_activations(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("linear_w4a8(Tensor x, Tensor w, int n, int k) -> Tensor");
  m.def("linear_w5a8(Tensor x, Tensor w, int n, int k) -> Tensor");
  m.def("linear_w8a8(Tensor x, Tensor w, int n, int k) -> Tensor");
  m.def("embedding_w4(Tensor ids, Tensor w, int n, int k, ScalarType dtype) -> Tensor");
  m.def("embedding_w8(Tensor ids, Tensor w, int n, int k, ScalarType dtype) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("dequantize(Tensor w, int n, int k, int bits, ScalarType dtype) -> Tensor");
  m.def("set_dense_from_m(int m) -> int");
  m.def("dense_rows(int m) -> int");
  // The ops that write into their arguments: vLLM's attention hands the output buffer and the KV cache in.
  m.def("decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor(a!) out, Tensor seq_lens, "
        "Tensor block_table, float scale) -> ()");
  m.def("decode_attention_int8(Tensor query, Tensor key_cache, Tensor value_cache, Tensor scales, Tensor(a!) out, "
        "Tensor seq_lens, Tensor block_table, float scale) -> ()");
  m.def("kv_write_int8(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor(c!) scales, "
        "Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(edgectl, CPU, m) {
  m.impl("quantize_activations", edgectl::quantize_activations);
  m.impl("linear_w4a8", edgectl::linear_w4a8);
  m.impl("linear_w5a8", edgectl::linear_w5a8);
  m.impl("linear_w8a8", edgectl::linear_w8a8);
  m.impl("embedding_w4", edgectl::embedding_w4);
  m.impl("embedding_w8", edgectl::embedding_w8);
  m.impl("add_rms_norm", edgectl::add_rms_norm);
  m.impl("rms_norm", edgectl::rms_norm);
  m.impl("dequantize", edgectl::dequantize);
  m.impl("decode_attention", edgectl::decode_attention);
  m.impl("decode_attention_int8", edgectl::decode_attention_int8);
  m.impl("kv_write_int8", edgectl::kv_write_int8_op);
}

// Ops without tensor arguments have no dispatch key: registered as CompositeExplicitAutograd
// (backend-independent).
TORCH_LIBRARY_IMPL(edgectl, CompositeExplicitAutograd, m) {
  m.impl("kernel_isa", edgectl::kernel_isa);
  m.impl("supported_isas", edgectl::supported_isas);
  m.impl("set_kernel_isa", edgectl::set_kernel_isa);
  m.impl("set_dense_from_m", edgectl::set_dense_from_m);
  m.impl("dense_rows", edgectl::dense_rows);
}
