// A few rows (a decode step, a DSpark verify or draft block) times a weight kept in the official storage formats, on
// the CPU: y[m, n] = Σ_k x[m, k] · W[n, k] with W decoded from its codes as it is read, never as a whole dequantized
// copy. Plain fp32 and bf16 weights (the head, the router, mHC's projections) take the same loop (float_rows), so
// that every product of a verify block rounds each row as a decode step does. The Python path (engine/quant/modules.py) dequantizes the whole weight for every call, a few billion values a
// decode step at the release's widths; here each code is decoded once per call and used for every row.
//
// FP8: W[n, k] = e4m3(w[n, k]) · e8m0(scale[n / b0, k / b1]); MXFP4: W[n, k] = e2m1(nibble k of row n) ·
// e8m0(scale[n, k / 32]). The code and scale values come in as tables made by torch (value_of_byte[256], and for FP4
// two values per byte, low nibble first), so this file knows nothing of the formats' bits. A scale is a power of two:
// Σ_k x·(c·s) = s · Σ_k x·c exactly (no rounding of a product by a power of two), so each scale block's sum of
// x·code is formed first, then scaled and added: the same value as a dot product with the dequantized row, up to the
// order of the additions. Every row of x takes the same arithmetic whatever the number of rows, so a verify block
// rounds as decode steps do.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t LANES = 8;  // independent partial sums, one vector of eight floats

// Eight floats as one value (GCC/Clang vector extension): on x86 an AVX register where the CPU has AVX2 (see
// FAST_CLONES), else two SSE registers; on ARM two NEON registers. Each lane takes the same multiplies and adds in
// the same order as the scalar loop it replaces (no fused multiply-add: -ffp-contract=off), so every machine, vector
// width and row count gives the same bits.
typedef float Lanes __attribute__((vector_size(LANES * sizeof(float))));

#if defined(__x86_64__) && defined(__linux__) && !defined(__clang__)
#define FAST_CLONES __attribute__((target_clones("avx2", "default")))   // chosen once at load by the CPU's features
#else
#define FAST_CLONES
#endif

// Σ_j values[j] · x[j] for j < n, in LANES interleaved partial sums (lane l takes j ≡ l mod LANES) added pairwise at
// the end
FAST_CLONES float block_dot(const float* values, const float* x, int64_t n) {
  Lanes partial = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) {
    Lanes v, w;
    std::memcpy(&v, values + j, sizeof(Lanes));   // unaligned loads
    std::memcpy(&w, x + j, sizeof(Lanes));
    partial += v * w;
  }
  for (int64_t l = 0; j < n; ++j, ++l) partial[l] += values[j] * x[j];
  return ((partial[0] + partial[4]) + (partial[1] + partial[5])) + ((partial[2] + partial[6]) + (partial[3] + partial[7]));
}

typedef uint16_t Halves __attribute__((vector_size(LANES * sizeof(uint16_t))));
typedef uint32_t Words __attribute__((vector_size(LANES * sizeof(uint32_t))));

// values[j] = the float32 whose top half is bf16[j] (a bfloat16 is the top half of a float32), j < n
FAST_CLONES void widen_bf16(const uint16_t* bf16, float* values, int64_t n) {
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) {
    Halves h;
    std::memcpy(&h, bf16 + j, sizeof(Halves));
    const Words bits = __builtin_convertvector(h, Words) << 16;
    std::memcpy(values + j, &bits, sizeof(Words));
  }
  for (; j < n; ++j) {
    const uint32_t bits = static_cast<uint32_t>(bf16[j]) << 16;
    std::memcpy(values + j, &bits, sizeof(float));
  }
}

void check_rows(const torch::Tensor& x, int64_t k, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2,
              what, ": x must be a contiguous 2-D float32 CPU tensor");
  TORCH_CHECK(x.size(1) == k, what, ": x has ", x.size(1), " columns, the weight ", k);
}

void check_table(const torch::Tensor& t, int64_t n, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() == n,
              name, " must be a contiguous float32 CPU table of ", n, " values");
}

void check_bytes(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kUInt8 && t.is_contiguous() && t.dim() == 2,
              name, " must be a contiguous 2-D uint8 CPU tensor (the stored bytes)");
}

// The shared loop: output column n of every row. decode(n, kb, scratch, scale) gives the values of row n's scale
// block kb (width `width`, the last one possibly shorter): written into scratch, or where they already lie (an fp32
// weight's own row), and sets the block's scale.
template <typename Decode>
torch::Tensor rows_times_weight(const torch::Tensor& x, int64_t n_out, int64_t k, int64_t width, Decode decode) {
  const int64_t m = x.size(0), blocks = (k + width - 1) / width;
  auto out = torch::empty({m, n_out}, x.options());
  const float* xs = x.data_ptr<float>();
  float* ys = out.data_ptr<float>();
  at::parallel_for(0, n_out, 16, [&](int64_t first, int64_t last) {
    std::vector<float> values(width), sums(m);
    for (int64_t n = first; n < last; ++n) {
      std::fill(sums.begin(), sums.end(), 0.0f);
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const int64_t start = kb * width, len = std::min(width, k - start);
        float scale = 1.0f;
        const float* block = decode(n, kb, values.data(), scale);
        for (int64_t r = 0; r < m; ++r) sums[r] += scale * block_dot(block, xs + r * k + start, len);
      }
      for (int64_t r = 0; r < m; ++r) ys[r * n_out + n] = sums[r];
    }
  });
  return out;
}

}  // namespace

// x [M, K] float32 · (FP8 weight [N, K] with E8M0 scales [ceil(N / b0), ceil(K / b1)])ᵀ → [M, N] float32
torch::Tensor fp8_rows(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& scale, int64_t b0,
                       int64_t b1, const torch::Tensor& code_values, const torch::Tensor& scale_values) {
  check_bytes(weight, "fp8_rows: weight");
  check_bytes(scale, "fp8_rows: scale");
  check_table(code_values, 256, "fp8_rows: code_values");
  check_table(scale_values, 256, "fp8_rows: scale_values");
  TORCH_CHECK(b0 > 0 && b1 > 0, "fp8_rows: scale blocks must be positive");
  const int64_t n_out = weight.size(0), k = weight.size(1);
  check_rows(x, k, "fp8_rows");
  TORCH_CHECK(scale.size(0) == (n_out + b0 - 1) / b0 && scale.size(1) == (k + b1 - 1) / b1,
              "fp8_rows: the scale's shape does not match the weight's blocks");
  const uint8_t* w = weight.data_ptr<uint8_t>();
  const uint8_t* s = scale.data_ptr<uint8_t>();
  const float* code = code_values.data_ptr<float>();
  const float* pow2 = scale_values.data_ptr<float>();
  const int64_t scale_cols = scale.size(1);
  return rows_times_weight(x, n_out, k, b1, [=](int64_t n, int64_t kb, float* values, float& scale) {
    const uint8_t* row = w + n * k + kb * b1;
    const int64_t len = std::min(b1, k - kb * b1);
    for (int64_t j = 0; j < len; ++j) values[j] = code[row[j]];
    scale = pow2[s[(n / b0) * scale_cols + kb]];
    return static_cast<const float*>(values);
  });
}

// x [M, K] float32 · (MXFP4 weight [N, K / 2] bytes, two codes a byte, with E8M0 scales [N, ceil(K / 32)])ᵀ → [M, N]
torch::Tensor fp4_rows(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scale,
                       const torch::Tensor& byte_values, const torch::Tensor& scale_values) {
  constexpr int64_t GROUP = 32;
  check_bytes(packed, "fp4_rows: packed");
  check_bytes(scale, "fp4_rows: scale");
  check_table(byte_values, 512, "fp4_rows: byte_values");
  check_table(scale_values, 256, "fp4_rows: scale_values");
  const int64_t n_out = packed.size(0), k = 2 * packed.size(1);
  check_rows(x, k, "fp4_rows");
  TORCH_CHECK(scale.size(0) == n_out && scale.size(1) == (k + GROUP - 1) / GROUP,
              "fp4_rows: the scale's shape does not match the weight's groups of 32");
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const uint8_t* s = scale.data_ptr<uint8_t>();
  const float* pair = byte_values.data_ptr<float>();
  const float* pow2 = scale_values.data_ptr<float>();
  const int64_t scale_cols = scale.size(1), row_bytes = k / 2;
  return rows_times_weight(x, n_out, k, GROUP, [=](int64_t n, int64_t kb, float* values, float& scale) {
    const uint8_t* row = w + n * row_bytes + kb * (GROUP / 2);
    const int64_t bytes = std::min(GROUP, k - kb * GROUP) / 2;
    for (int64_t j = 0; j < bytes; ++j) {
      values[2 * j] = pair[2 * row[j]];
      values[2 * j + 1] = pair[2 * row[j] + 1];
    }
    scale = pow2[s[n * scale_cols + kb]];
    return static_cast<const float*>(values);
  });
}

// x [M, K] float32 · (weight [N, K] float32 or bfloat16)ᵀ → [M, N] float32: torch's matmul adds in an order that
// depends on M (one row is a matrix-vector product, six a matrix product), this loop in the same order at any M
torch::Tensor float_rows(const torch::Tensor& x, const torch::Tensor& weight) {
  constexpr int64_t WIDTH = 256;
  const bool bf16 = weight.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(weight.device().is_cpu() && weight.is_contiguous() && weight.dim() == 2 &&
                  (bf16 || weight.scalar_type() == torch::kFloat32),
              "float_rows: weight must be a contiguous 2-D float32 or bfloat16 CPU tensor");
  const int64_t n_out = weight.size(0), k = weight.size(1);
  check_rows(x, k, "float_rows");
  if (!bf16) {   // the weight's own row is the block: nothing to copy
    const float* w = weight.data_ptr<float>();
    return rows_times_weight(x, n_out, k, WIDTH, [=](int64_t n, int64_t kb, float*, float&) {
      return w + n * k + kb * WIDTH;
    });
  }
  const uint16_t* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  return rows_times_weight(x, n_out, k, WIDTH, [=](int64_t n, int64_t kb, float* values, float&) {
    widen_bf16(w + n * k + kb * WIDTH, values, std::min(WIDTH, k - kb * WIDTH));
    return static_cast<const float*>(values);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fp8_rows", &fp8_rows, "a few float32 rows times an FP8 weight with E8M0 block scales (CPU)");
  m.def("float_rows", &float_rows, "a few float32 rows times an fp32 or bf16 weight, each row's additions fixed");
  m.def("fp4_rows", &fp4_rows, "a few float32 rows times an MXFP4 weight with E8M0 scales per 32 (CPU)");
}
