// RMSNorm of a few rows on the CPU (a decode step's norms, a DSpark verify block's, a draft block's): per row
// weight · x · (mean(x²) + eps)^(-1/2), the sum of squares in double precision, the product in fp32 as the reference
// computes it, the result in x's dtype (fp32, or bf16 rounded to nearest even as torch rounds). One call in place of
// torch's fused op or the Python path's small ops (engine/speedups/fast_norm.py), whose fixed costs are most of such
// a norm's time.
#include <torch/extension.h>

#include <cmath>
#include <cstring>

namespace {

float from_bf16(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof value);
  return value;
}

uint16_t to_bf16(float value) {  // round to nearest, ties to even; a NaN stays a (quiet) NaN
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// rows × n values, row r at r · n; load(i) and store(i, v) read and write value i
template <typename Load, typename Store>
void normalize(int64_t rows, int64_t n, const float* weight, double eps, Load load, Store store) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t start = r * n;
    double squares = 0.0;
    for (int64_t i = start; i < start + n; ++i) {
      const double v = load(i);
      squares += v * v;
    }
    const float factor = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) store(start + i, load(start + i) * factor * weight[i]);
  }
}

}  // namespace

torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm_rows: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
              "rms_norm_rows: x must be float32 or bfloat16");
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32, "rms_norm_rows: weight must be float32");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "rms_norm_rows: x and weight must be contiguous");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "rms_norm_rows: x must have a non-empty last dimension");
  TORCH_CHECK(weight.dim() == 1 && weight.numel() == x.size(-1), "rms_norm_rows: weight must match x's width");
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const float* w = weight.data_ptr<float>();
  auto out = torch::empty_like(x);
  if (x.scalar_type() == torch::kFloat32) {
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    normalize(rows, n, w, eps, [in](int64_t i) { return in[i]; }, [o](int64_t i, float v) { o[i] = v; });
  } else {
    const auto* in = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    normalize(rows, n, w, eps, [in](int64_t i) { return from_bf16(in[i]); },
              [o](int64_t i, float v) { o[i] = to_bf16(v); });
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of each fp32 or bf16 row of x with an fp32 weight (CPU)");
}
