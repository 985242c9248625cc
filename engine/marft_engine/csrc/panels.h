// The panel kernel's products as jobs (panel_linear.cpp), for the fused decode layer (decode_layer.cpp).
#pragma once
#include <cstdint>
#include <vector>

namespace marft {
constexpr int64_t NR = 16;  // output columns a panel: two 8-wide vectors

// y[:M, :N] (=, or += where acc) x[:M, :K] times the panels [P, K, 16] of a weight [N, K]; panel p
// starts at panels + p * pstride (pack_panels' layout: pstride = K * 16; a larger one reads the rows
// [k0, k0 + K) of wider panels, from panels = their start + k0 * 16).
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
};

// All the jobs' panels split over torch's threads at once: several small products (a layer's q, k
// and v, their LoRA As) cost one parallel region, not one each.
void panel_jobs(const std::vector<PanelJob>& jobs);
}  // namespace marft
