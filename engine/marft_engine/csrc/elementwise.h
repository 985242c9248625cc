// Element-wise steps of a Llama-shaped layer in fp32 (elementwise.cpp), for the fused decode layer
// (decode_layer.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace marft {
// A masked score: exp(MASKED - max) is 0 beside any real score, and finite, as -ffast-math needs
// (as precision.py's MASKED: a row with no key to attend gets a uniform softmax, not NaN).
constexpr float MASKED = -1e30f;

// s[c] = exp(s[c] - mx) for c < n, where mx is the row's largest score; returns their sum. A masked
// column's weight is 0 without its exponential: exp of a score near MASKED leaves the vector exp for
// a scalar path, lane by lane (the floor keeps kept ones off it). A row with nothing kept (mx is
// MASKED) keeps its uniform softmax.
inline float masked_exp(float* s, int64_t n, float mx) {
  const bool none = mx == MASKED;
  float z = 0.f;
#pragma omp simd reduction(+ : z)
  for (int64_t c = 0; c < n; ++c) {
    const float e = std::exp(std::max(s[c] - mx, -80.f));
    s[c] = s[c] == MASKED && !none ? 0.f : e;
    z += s[c];
  }
  return z;
}

// y[m] = x[m] / rms(x[m]) * w for rows m of x [M, d] (Hugging Face's LlamaRMSNorm in fp32).
void rms_norm_rows(const float* x, const float* w, float* y, int64_t M, int64_t d, float eps);
// g[i] = silu(g[i]) * u[i] for i < n.
void silu_mul_inplace(float* g, const float* u, int64_t n);
}  // namespace marft
