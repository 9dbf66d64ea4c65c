// An mHC seam's mixes for a few tokens on the CPU, after the projection: the RMS factor, the pre and post gates and
// the Sinkhorn projection of the comb logits, token by token in double precision. The same arithmetic in the same
// order as engine/speedups/fast_mhc.py's Python-float path (which this replaces when it builds), so the results
// are bit-identical to it; one call instead of over a thousand interpreted float operations per token.
#include <torch/extension.h>

#include <cmath>
#include <vector>

namespace {

double sigmoid(double v) {
  if (v >= 0) return 1.0 / (1.0 + std::exp(-v));
  const double e = std::exp(v);  // never overflows for v < 0
  return e / (1.0 + e);
}

// c [hc, hc] row-major, C[a][b] at a * hc + b: the reference's Sinkhorn (engine/model/mhc.py) in place: row
// softmax + eps, one column normalisation, then (iters - 1) x (row, column) normalisations. Sums run left to right.
void sinkhorn(double* c, int64_t hc, int64_t iters, double eps) {
  auto normalise_rows = [&](bool softmax) {
    for (int64_t a = 0; a < hc; ++a) {
      double* row = c + a * hc;
      if (softmax) {
        double top = row[0];
        for (int64_t b = 1; b < hc; ++b) top = row[b] > top ? row[b] : top;
        for (int64_t b = 0; b < hc; ++b) row[b] = std::exp(row[b] - top);
      }
      double s = row[0];
      for (int64_t b = 1; b < hc; ++b) s += row[b];
      if (softmax) {
        for (int64_t b = 0; b < hc; ++b) row[b] = row[b] / s + eps;
      } else {
        s += eps;
        for (int64_t b = 0; b < hc; ++b) row[b] /= s;
      }
    }
  };
  auto normalise_columns = [&]() {
    for (int64_t b = 0; b < hc; ++b) {
      double s = c[b];
      for (int64_t a = 1; a < hc; ++a) s += c[a * hc + b];
      s += eps;
      for (int64_t a = 0; a < hc; ++a) c[a * hc + b] /= s;
    }
  };
  normalise_rows(true);
  normalise_columns();
  for (int64_t i = 1; i < iters; ++i) {
    normalise_rows(false);
    normalise_columns();
  }
}

// mixes [n, 2hc + hc^2] and norms [n] (‖x‖ of each token's flattened streams) → out: every token's pre [hc], then
// every token's mix [hc, hc + 1], whose row e is column e of comb followed by post_e.
template <typename T>
void seam(const T* mixes, const T* norms, T* out, int64_t n, int64_t hc, double width, const double* scale,
          const double* base, int64_t iters, double hc_eps, double norm_eps) {
  const int64_t per_token = 2 * hc + hc * hc;
  std::vector<double> comb(hc * hc);
  T* pre = out;
  T* mix = out + n * hc;
  for (int64_t t = 0; t < n; ++t) {
    const T* m = mixes + t * per_token;
    const double norm = norms[t];
    const double r = 1.0 / std::sqrt(norm * norm / width + norm_eps);  // rsqrt(mean(x²) + eps)
    for (int64_t i = 0; i < hc; ++i) {
      pre[t * hc + i] = static_cast<T>(sigmoid(static_cast<double>(m[i]) * r * scale[0] + base[i]) + hc_eps);
    }
    for (int64_t i = 0; i < hc * hc; ++i) {
      comb[i] = static_cast<double>(m[2 * hc + i]) * r * scale[2] + base[2 * hc + i];
    }
    sinkhorn(comb.data(), hc, iters, hc_eps);
    T* rows = mix + t * hc * (hc + 1);
    for (int64_t e = 0; e < hc; ++e) {
      for (int64_t a = 0; a < hc; ++a) rows[e * (hc + 1) + a] = static_cast<T>(comb[a * hc + e]);
      const double post = 2 * sigmoid(static_cast<double>(m[hc + e]) * r * scale[1] + base[hc + e]);
      rows[e * (hc + 1) + hc] = static_cast<T>(post);
    }
  }
}

}  // namespace

torch::Tensor seam_mixes(const torch::Tensor& mixes, const torch::Tensor& norms, const torch::Tensor& scale,
                         const torch::Tensor& base, int64_t hc, int64_t width, int64_t iters, double hc_eps,
                         double norm_eps) {
  TORCH_CHECK(hc >= 1 && width >= 1 && iters >= 1, "seam_mixes: hc, width and iters must be at least 1");
  TORCH_CHECK(mixes.device().is_cpu() && norms.device().is_cpu(), "seam_mixes: CPU tensors only");
  TORCH_CHECK(mixes.scalar_type() == torch::kFloat32 || mixes.scalar_type() == torch::kFloat64,
              "seam_mixes: mixes must be float32 or float64");
  TORCH_CHECK(norms.scalar_type() == mixes.scalar_type(), "seam_mixes: norms must have the dtype of mixes");
  TORCH_CHECK(mixes.dim() == 2 && mixes.size(1) == 2 * hc + hc * hc && mixes.is_contiguous(),
              "seam_mixes: mixes must be contiguous [n, 2hc + hc^2]");
  TORCH_CHECK(norms.dim() == 1 && norms.size(0) == mixes.size(0) && norms.is_contiguous(),
              "seam_mixes: norms must be contiguous [n]");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat64 && scale.numel() == 3 && scale.is_contiguous(),
              "seam_mixes: scale must be 3 contiguous float64 values");
  TORCH_CHECK(base.scalar_type() == torch::kFloat64 && base.numel() == 2 * hc + hc * hc && base.is_contiguous(),
              "seam_mixes: base must be 2hc + hc^2 contiguous float64 values");
  const int64_t n = mixes.size(0);
  auto out = torch::empty({n * hc + n * hc * (hc + 1)}, mixes.options());
  if (mixes.scalar_type() == torch::kFloat64) {
    seam<double>(mixes.data_ptr<double>(), norms.data_ptr<double>(), out.data_ptr<double>(), n, hc,
                 static_cast<double>(width), scale.data_ptr<double>(), base.data_ptr<double>(), iters, hc_eps,
                 norm_eps);
  } else {
    seam<float>(mixes.data_ptr<float>(), norms.data_ptr<float>(), out.data_ptr<float>(), n, hc,
                static_cast<double>(width), scale.data_ptr<double>(), base.data_ptr<double>(), iters, hc_eps,
                norm_eps);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("seam_mixes", &seam_mixes, "An mHC seam's pre and [comb^T | post] mixes for a few tokens (CPU)");
}
