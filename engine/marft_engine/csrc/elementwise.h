// Element-wise steps of a Llama-shaped layer in fp32 (elementwise.cpp), for the fused decode layer
// (decode_layer.cpp).
#pragma once
#include <cstdint>

namespace marft {
// y[m] = x[m] / rms(x[m]) * w for rows m of x [M, d] (Hugging Face's LlamaRMSNorm in fp32).
void rms_norm_rows(const float* x, const float* w, float* y, int64_t M, int64_t d, float eps);
// g[i] = silu(g[i]) * u[i] for i < n.
void silu_mul_inplace(float* g, const float* u, int64_t n);
}  // namespace marft
