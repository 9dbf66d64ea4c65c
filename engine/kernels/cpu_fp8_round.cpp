// FP8 quant-dequant of activations on the CPU, per block of `block` values along the last dim: scale = the power
// of two ≥ amax / 448 (amax = max |x|, at least 1e-4), each value divided by it, clamped to ±448, rounded to E4M3
// (c10's conversion, the one torch's .to(torch.float8_e4m3fn) uses) and multiplied back. One call for what the torch
// ops of engine/speedups/fast_quant.py (fp8_qdq) do in a dozen, with the same bits, NaN and infinity included: a
// decode step rounds every linear's input and every KV row this way, a few hundred small calls whose fixed costs
// are most of their time.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <cstring>

namespace {

constexpr float FP8_MAX = 448.0f;
constexpr float MIN_AMAX = 1e-4f;

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

float float_of(uint32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// torch.clamp's value: NaN stays NaN
float clamp(float v, float lo, float hi) { return std::isnan(v) ? v : std::min(std::max(v, lo), hi); }

}  // namespace

// x [..., n] float32, n a multiple of block → the same shape, float32; recip_max is fp32(1 / 448) as the Python
// path computes it
torch::Tensor fp8_round(const torch::Tensor& x, int64_t block, double recip_max) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() >= 1,
              "fp8_round: x must be a contiguous float32 CPU tensor");
  TORCH_CHECK(block > 0 && x.size(-1) % block == 0, "fp8_round: the last dim (", x.size(-1),
              ") must be a multiple of the block (", block, ")");
  auto out = torch::empty_like(x);
  const float* xs = x.data_ptr<float>();
  float* ys = out.data_ptr<float>();
  const float recip = static_cast<float>(recip_max);
  const int64_t blocks = x.numel() / block;   // block > 0: checked above
  at::parallel_for(0, blocks, 256, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const float* v = xs + b * block;
      float* y = ys + b * block;
      float amax = 0.0f;              // torch.linalg.vector_norm(·, inf): max |v|, NaN when any is NaN
      bool nan = false;
      for (int64_t j = 0; j < block; ++j) {
        const float a = std::fabs(v[j]);
        if (std::isnan(a)) nan = true;
        else if (a > amax) amax = a;
      }
      amax = nan ? std::nanf("") : std::max(amax, MIN_AMAX);
      // the power of two ≥ amax · recip: an all-ones mantissa added carries into the exponent unless it is zero
      // (int32 wrap-around as torch's int32 add), then the mantissa cleared
      const float scale = float_of((bits_of(amax * recip) + 0x7FFFFFu) & 0x7F800000u);
      for (int64_t j = 0; j < block; ++j) {
        const c10::Float8_e4m3fn code(clamp(v[j] / scale, -FP8_MAX, FP8_MAX));
        y[j] = static_cast<float>(code) * scale;
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fp8_round", &fp8_round, "FP8 (E4M3, power-of-two block scales) quant-dequant of float32 activations (CPU)");
}
