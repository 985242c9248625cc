// The panel kernel's products as jobs (panel_linear.cpp), for the fused decode layer (decode_layer.cpp).
#pragma once
#include <cstdint>
#include <vector>

namespace marft {
constexpr int64_t NR = 16;  // output columns a panel: two 8-wide vectors
constexpr int64_t NRB = 32;  // output columns a bf16 panel: two 16-wide vectors

// y[:M, :N] (=, or += where acc) x[:M, :K] times the panels [P, K, 16] of a weight [N, K]; panel p
// starts at panels + p * pstride (pack_panels' layout: pstride = K * 16; a larger one reads the rows
// [k0, k0 + K) of wider panels, from panels = their start + k0 * 16).
// A bf16 job (wb set) reads xb and wb instead of x and panels: x rounded to bf16, as pairs of
// consecutive k in 32-bit words [M, ldxb]; the weight as pack_panels_bf16's panels [P, K2, 32] of such
// pairs (K2 = K / 2 rounded up, pstride = K2 * 32 words).
struct PanelJob {
  int64_t M;
  const float* x;
  int64_t ldx;  // x's row stride
  int64_t K;
  const float* panels;
  int64_t pstride;
  int64_t N;
  float* y;
  int64_t ldy;  // y's row stride
  bool acc;
  const uint32_t* xb = nullptr;
  int64_t ldxb = 0;
  const uint32_t* wb = nullptr;
};

// x [M, K] fp32 -> bf16 (rounded to nearest even, as PyTorch casts) pairs [M, ceil(K / 2)] words,
// the last one's high half zero where K is odd.
void to_bf16_pairs(const float* x, int64_t M, int64_t K, int64_t ldx, uint32_t* out);

// All the jobs' panels split over torch's threads at once: several small products (a layer's q, k
// and v, their LoRA As) cost one parallel region, not one each.
void panel_jobs(const std::vector<PanelJob>& jobs);
}  // namespace marft
