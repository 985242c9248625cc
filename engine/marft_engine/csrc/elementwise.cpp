// Element-wise steps of a Llama-shaped layer in fp32 on a CPU (elementwise.h): an RMS norm and
// silu(gate) * up, each one pass (PyTorch makes five and two), split over torch's threads where large.
// `rms_norm` and `silu_mul` expose them to the tests.
#include "elementwise.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <cmath>

void marft::rms_norm_rows(const float* x, const float* w, float* y, int64_t M, int64_t d, float eps) {
  at::parallel_for(0, M, std::max<int64_t>(1, 32768 / std::max<int64_t>(d, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      const float* xr = x + m * d;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
      float* yr = y + m * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) yr[i] = w[i] * (xr[i] * inv);
    }
  });
}

void marft::silu_mul_inplace(float* g, const float* u, int64_t n) {
  at::parallel_for(0, n, 32768, [&](int64_t lo, int64_t hi) {
    // exp's argument capped: -ffast-math assumes no infinities, and g / (1 + inf) came out NaN; past
    // the cap silu(g) is within 1e-33 of 0 either way
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) g[i] = g[i] / (1.f + std::exp(std::min(-g[i], 80.f))) * u[i];
  });
}

// x [..., d] fp32 -> the RMS norm of each row times w [d].
at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 1 &&
                  x.size(-1) == w.size(0),
              "rms_norm: fp32 x [..., d] and w [d]");
  x = x.contiguous();
  w = w.contiguous();
  auto y = at::empty_like(x);
  const int64_t d = w.size(0);
  marft::rms_norm_rows(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), d ? x.numel() / d : 0, d,
                       static_cast<float>(eps));
  return y;
}

// silu(g) * u for fp32 g, u of one shape, as a new tensor.
at::Tensor silu_mul(at::Tensor g, at::Tensor u) {
  TORCH_CHECK(g.scalar_type() == at::kFloat && u.scalar_type() == at::kFloat && g.sizes() == u.sizes(),
              "silu_mul: fp32 g and u of one shape");
  auto y = g.contiguous().clone();
  u = u.contiguous();
  marft::silu_mul_inplace(y.data_ptr<float>(), u.data_ptr<float>(), y.numel());
  return y;
}
