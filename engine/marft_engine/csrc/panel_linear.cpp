// x W^T on a CPU for a few rows (precision.py: the fp32 products of decode steps), with W laid out
// once in panels of 16 output columns. Why a kernel of our own: at a decode step's 1 to 64 rows, MKL's
// sgemm re-lays W out on every call and oneDNN's prepacked product has a high fixed cost, so both ran
// at well under half of this CPU's multiply-add rate (docs/MEASUREMENTS.md). Here each panel of W is
// read once per call and multiplies up to 6 rows at a time, their 12 sums held in registers.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>

#include "panels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MARFT_AVX2 1
#endif
#if defined(MARFT_AVX2) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define MARFT_BF16 1
#endif

namespace {
using marft::NR;

#ifdef MARFT_AVX2
// y[r, :cols] = (or += where acc) x[r, :] . panel for MR rows r of x [MR, K] (row stride ldx) and one
// panel [K, 16]; with PF, the K cache lines from `next` on are fetched into L2 meanwhile. Named
// accumulators, not an array: GCC keeps an array of vectors on the stack, stored every k. The k loop
// unrolled by 4: one k's loads and multiply-adds are few enough that its address and loop arithmetic
// held the loop below the multiply-add rate (docs/MEASUREMENTS.md).
template <int MR, bool PF>
inline void rows_times_panel(const float* x, int64_t ldx, int64_t K, const float* panel, float* y, int64_t ldy,
                             int64_t cols, bool acc, const float* next) {
  const __m256 z = _mm256_setzero_ps();
  __m256 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z,
         c50 = z, c51 = z;
#define MARFT_ROW(r)                                     \
  if constexpr (MR > r) {                                \
    const __m256 b = _mm256_broadcast_ss(x + r * ldx + k); \
    c##r##0 = _mm256_fmadd_ps(b, w0, c##r##0);           \
    c##r##1 = _mm256_fmadd_ps(b, w1, c##r##1);           \
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_load_ps(panel + k * NR), w1 = _mm256_load_ps(panel + k * NR + 8);
    if constexpr (PF) _mm_prefetch(reinterpret_cast<const char*>(next + k * NR), _MM_HINT_T1);
    MARFT_ROW(0) MARFT_ROW(1) MARFT_ROW(2) MARFT_ROW(3) MARFT_ROW(4) MARFT_ROW(5)
  }
#undef MARFT_ROW
  alignas(32) float out[6][NR];
  const __m256 sums[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < MR; ++r) {
    float* yr = y + r * ldy;
    if (cols == NR) {  // a whole panel's columns: straight from the registers (over a LoRA B product's
                       // few k, a scalar pass through `out` cost as much as the multiply-adds)
      const __m256 lo = acc ? _mm256_add_ps(_mm256_loadu_ps(yr), sums[r][0]) : sums[r][0];
      const __m256 hi = acc ? _mm256_add_ps(_mm256_loadu_ps(yr + 8), sums[r][1]) : sums[r][1];
      _mm256_storeu_ps(yr, lo);
      _mm256_storeu_ps(yr + 8, hi);
      continue;
    }
    _mm256_store_ps(out[r], sums[r][0]);
    _mm256_store_ps(out[r] + 8, sums[r][1]);
    if (acc) {
      for (int64_t c = 0; c < cols; ++c) yr[c] += out[r][c];
    } else {
      std::copy(out[r], out[r] + cols, yr);
    }
  }
}

// Rows [0, j.M) of job j times its panel p. Blocks of 6 rows, the last few as 4 + 3 or 4 + 4 rather than
// 6 + 1 or 6 + 2: a block of 1 or 2 rows has too few independent sums to keep both multiply-add units busy.
// With PF, the thread's next panel (`next`, a cache line a k; a prefetch past an array's end is
// harmless) is fetched into L2 meanwhile: only the first block reads the panel from memory, the others
// from L2, so memory would otherwise idle during them.
template <bool PF>
inline void job_panel(const marft::PanelJob& j, int64_t p, const float* next) {
  const int64_t M = j.M;
  int64_t sixes = M / 6;
  if (sixes > 0 && M % 6 != 0 && M % 6 <= 2) --sixes;
  const float* panel = j.panels + p * j.pstride;
  const int64_t cols = std::min(NR, j.N - p * NR);
  float* yp = j.y + p * NR;
  int64_t m = 0;
  for (; m < sixes * 6; m += 6)
    rows_times_panel<6, PF>(j.x + m * j.ldx, j.ldx, j.K, panel, yp + m * j.ldy, j.ldy, cols, j.acc, next);
  while (m < M) {
    const int64_t r = std::min<int64_t>(4, M - m);
    const float* x = j.x + m * j.ldx;
    float* y = yp + m * j.ldy;
    if (r == 4) rows_times_panel<4, PF>(x, j.ldx, j.K, panel, y, j.ldy, cols, j.acc, next);
    else if (r == 3) rows_times_panel<3, PF>(x, j.ldx, j.K, panel, y, j.ldy, cols, j.acc, next);
    else if (r == 2) rows_times_panel<2, PF>(x, j.ldx, j.K, panel, y, j.ldy, cols, j.acc, next);
    else rows_times_panel<1, PF>(x, j.ldx, j.K, panel, y, j.ldy, cols, j.acc, next);
    m += r;
  }
}
#endif

#ifdef MARFT_BF16
using marft::NRB;
constexpr int MRB = 6;  // rows a block of the bf16 kernel: 12 sums of 16 in registers, as the fp32 one

// The bf16 counterpart of rows_times_panel: y[r, :cols] = (or += where acc) x[r, :] . panel for MR
// rows of x as bf16 pairs [MR, K2] (row stride ldx words) and one panel [K2, 32] of weight pairs. Each
// vdpbf16ps multiplies a pair of k for 16 columns and adds both products to fp32 sums, so each step
// of k covers two of the fp32 kernel's at twice its columns.
template <int MR>
inline void rows_times_panel_bf16(const uint32_t* x, int64_t ldx, int64_t K2, const uint32_t* panel, float* y,
                                  int64_t ldy, int64_t cols, bool acc) {
  const __m512 z = _mm512_setzero_ps();
  __m512 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z,
         c50 = z, c51 = z;
#define MARFT_ROW(r)                                                                   \
  if constexpr (MR > r) {                                                              \
    const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * ldx + k])); \
    c##r##0 = _mm512_dpbf16_ps(c##r##0, b, w0);                                        \
    c##r##1 = _mm512_dpbf16_ps(c##r##1, b, w1);                                        \
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < K2; ++k) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + k * NRB);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + k * NRB + 16);
    MARFT_ROW(0) MARFT_ROW(1) MARFT_ROW(2) MARFT_ROW(3) MARFT_ROW(4) MARFT_ROW(5)
  }
#undef MARFT_ROW
  const __m512 sums[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int r = 0; r < MR; ++r) {
    float* yr = y + r * ldy;
    if (cols == NRB) {
      _mm512_storeu_ps(yr, acc ? _mm512_add_ps(_mm512_loadu_ps(yr), sums[r][0]) : sums[r][0]);
      _mm512_storeu_ps(yr + 16, acc ? _mm512_add_ps(_mm512_loadu_ps(yr + 16), sums[r][1]) : sums[r][1]);
      continue;
    }
    alignas(64) float out[NRB];
    _mm512_store_ps(out, sums[r][0]);
    _mm512_store_ps(out + 16, sums[r][1]);
    if (acc) {
      for (int64_t c = 0; c < cols; ++c) yr[c] += out[c];
    } else {
      std::copy(out, out + cols, yr);
    }
  }
}

// Rows [0, j.M) of the bf16 job j times its panel p, in blocks as job_panel's.
inline void job_panel_bf16(const marft::PanelJob& j, int64_t p) {
  const int64_t M = j.M, K2 = (j.K + 1) / 2;
  int64_t sixes = M / MRB;
  if (sixes > 0 && M % MRB != 0 && M % MRB <= 2) --sixes;
  const uint32_t* panel = j.wb + p * j.pstride;
  const int64_t cols = std::min(NRB, j.N - p * NRB);
  float* yp = j.y + p * NRB;
  int64_t m = 0;
  for (; m < sixes * MRB; m += MRB)
    rows_times_panel_bf16<MRB>(j.xb + m * j.ldxb, j.ldxb, K2, panel, yp + m * j.ldy, j.ldy, cols, j.acc);
  while (m < M) {
    const int64_t r = std::min<int64_t>(4, M - m);
    const uint32_t* x = j.xb + m * j.ldxb;
    float* y = yp + m * j.ldy;
    if (r == 4) rows_times_panel_bf16<4>(x, j.ldxb, K2, panel, y, j.ldy, cols, j.acc);
    else if (r == 3) rows_times_panel_bf16<3>(x, j.ldxb, K2, panel, y, j.ldy, cols, j.acc);
    else if (r == 2) rows_times_panel_bf16<2>(x, j.ldxb, K2, panel, y, j.ldy, cols, j.acc);
    else rows_times_panel_bf16<1>(x, j.ldxb, K2, panel, y, j.ldy, cols, j.acc);
    m += r;
  }
}
#endif
}  // namespace

bool panels_available() {
#ifdef MARFT_AVX2
  return true;
#else
  return false;
#endif
}

bool panels_bf16_available() {
#ifdef MARFT_BF16
  return true;
#else
  return false;
#endif
}

void marft::to_bf16_pairs(const float* x, int64_t M, int64_t K, int64_t ldx, uint32_t* out) {
  // A row of pairs is the row's bf16 values in order (low half first), so one loop over k that the
  // compiler vectorizes; an odd K's last high half is zero.
  const int64_t K2 = (K + 1) / 2;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    uint16_t* o = reinterpret_cast<uint16_t*>(out + m * K2);
    for (int64_t k = 0; k < K; ++k) o[k] = c10::detail::round_to_nearest_even(xr[k]);
    if (K % 2) o[K] = 0;
  }
}

// w [N, K] (fp32 or bf16) -> bf16 panels [ceil(N / 32), ceil(K / 2), 32] of 32-bit words: panel p,
// row k holds the pairs (w[c, 2k], w[c, 2k + 1]) for c in [32 p, 32 p + 32), low half first, zero
// past N and K. Stored as int32 (PyTorch has no bf16-pair dtype).
at::Tensor pack_panels_bf16(at::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "pack_panels_bf16: w must be [N, K] fp32 or bf16");
  const int64_t N = w.size(0), K = w.size(1), P = (N + marft::NRB - 1) / marft::NRB, K2 = (K + 1) / 2;
  auto padded = at::zeros({P * marft::NRB, 2 * K2}, w.options().dtype(at::kBFloat16));
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(w);
  // [P, 32, K2, 2] -> [P, K2, 32, 2], then each pair as one word
  return padded.view({P, marft::NRB, K2, 2}).transpose(1, 2).contiguous().view(at::kInt).view({P, K2, marft::NRB});
}

// x [M, K] fp32 (rounded to bf16) times pack_panels_bf16's panels of w [N, K] -> [M, N] fp32, the sums
// in fp32. A row's result does not depend on the other rows of the call.
at::Tensor panel_linear_bf16(at::Tensor x, at::Tensor panels, int64_t N) {
#ifdef MARFT_BF16
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "panel_linear_bf16: x must be [M, K] fp32");
  const int64_t M = x.size(0), K = x.size(1), K2 = (K + 1) / 2;
  TORCH_CHECK(panels.dim() == 3 && panels.scalar_type() == at::kInt && panels.size(1) == K2 &&
                  panels.size(2) == marft::NRB && panels.is_contiguous() &&
                  panels.size(0) == (N + marft::NRB - 1) / marft::NRB,
              "panel_linear_bf16: panels must be pack_panels_bf16's [ceil(N / 32), ceil(K / 2), 32] for x's K");
  x = x.contiguous();
  auto xb = at::empty({M, K2}, x.options().dtype(at::kInt));
  auto* xbp = reinterpret_cast<uint32_t*>(xb.data_ptr<int32_t>());
  marft::to_bf16_pairs(x.data_ptr<float>(), M, K, K, xbp);
  auto y = at::empty({M, N}, x.options());
  marft::PanelJob job{M, nullptr, 0, K, nullptr, K2 * marft::NRB, N, y.data_ptr<float>(), N, false};
  job.xb = xbp;
  job.ldxb = K2;
  job.wb = reinterpret_cast<const uint32_t*>(panels.data_ptr<int32_t>());
  marft::panel_jobs({job});
  return y;
#else
  TORCH_CHECK(false, "panel_linear_bf16: built without AVX512_BF16");
  return x;
#endif
}

// w [N, K] fp32 -> panels [ceil(N / 16), K, 16]: panel p, row k holds w[16 p : 16 p + 16, k], zero past N.
at::Tensor pack_panels(at::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "pack_panels: w must be [N, K] fp32");
  const int64_t N = w.size(0), K = w.size(1), P = (N + NR - 1) / NR;
  auto padded = at::zeros({P * NR, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({P, NR, K}).transpose(1, 2).contiguous();  // [P, K, 16]
}

// x [M, K] fp32 times the panels of w [N, K] -> [M, N]. Every row's sums run over k in order, so a
// row's result does not depend on the other rows of the call.
at::Tensor panel_linear(at::Tensor x, at::Tensor panels, int64_t N) {
#ifdef MARFT_AVX2
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "panel_linear: x must be [M, K] fp32");
  TORCH_CHECK(panels.dim() == 3 && panels.size(1) == x.size(1) && panels.size(2) == NR && panels.is_contiguous(),
              "panel_linear: panels must be pack_panels' [P, K, 16] for x's K");
  TORCH_CHECK((N + NR - 1) / NR == panels.size(0), "panel_linear: N does not match the panels");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  auto y = at::empty({M, N}, x.options());
  marft::panel_jobs(
      {{M, x.data_ptr<float>(), K, K, panels.data_ptr<float>(), K * NR, N, y.data_ptr<float>(), N, false}});
  return y;
#else
  TORCH_CHECK(false, "panel_linear: built without AVX2 and FMA");
  return x;
#endif
}

// A job's rows in blocks whose x takes at most this many bytes, each block a job of its own: over
// many rows (a long prefill) a thread would otherwise read all of x from memory again for each panel,
// where a block's x stays in L2 while the thread runs the panels over it.
constexpr int64_t X_BLOCK_BYTES = 256 * 1024;
// A job of at most this depth (a LoRA B product: K = the rank) is split by rows, not by panels: an
// item is SHALLOW_ROWS rows through every panel. By panels, each item read and wrote one cache line
// of y in each of the job's rows, a stride of a whole row apart; over a prefill's hundreds of rows
// those lines missed the caches, and the adds into y cost several times the multiply-adds.
constexpr int64_t SHALLOW_K = 64;
constexpr int64_t SHALLOW_ROWS = 12;

void marft::panel_jobs(const std::vector<PanelJob>& whole) {
#ifdef MARFT_AVX2
  std::vector<PanelJob> jobs;
  for (const PanelJob& j : whole) {
    const int64_t row_bytes = j.wb ? j.ldxb * 4 : j.K * 4;
    const int64_t rows = std::max<int64_t>(6, X_BLOCK_BYTES / row_bytes / 6 * 6);
    for (int64_t m0 = 0; m0 < j.M || m0 == 0; m0 += rows) {
      PanelJob b = j;
      b.M = std::min(rows, j.M - m0);
      if (b.x) b.x += m0 * j.ldx;
      if (b.xb) b.xb += m0 * j.ldxb;
      b.y += m0 * j.ldy;
      jobs.push_back(b);
    }
  }
  auto shallow = [](const PanelJob& j) { return !j.wb && j.K <= SHALLOW_K; };
  auto panels = [](const PanelJob& j) { return (j.N + (j.wb ? marft::NRB : NR) - 1) / (j.wb ? marft::NRB : NR); };
  std::vector<int64_t> first(jobs.size() + 1, 0);  // job j's items are [first[j], first[j + 1])
  for (size_t j = 0; j < jobs.size(); ++j) {
#ifndef MARFT_BF16
    TORCH_CHECK(!jobs[j].wb, "panel_jobs: a bf16 job, built without AVX512_BF16");
#endif
    const int64_t n = shallow(jobs[j]) ? (jobs[j].M + SHALLOW_ROWS - 1) / SHALLOW_ROWS : panels(jobs[j]);
    first[j + 1] = first[j] + n;
  }
  const int64_t items = first.back();
  auto run = [&](int64_t lo, int64_t hi) {
    size_t j = 0;
    for (int64_t item = lo; item < hi; ++item) {
      while (item >= first[j + 1]) ++j;
      const marft::PanelJob& job = jobs[j];
      const int64_t i = item - first[j];
      if (shallow(job)) {  // rows [i * SHALLOW_ROWS, ...) through every panel
        PanelJob part = job;
        part.M = std::min(SHALLOW_ROWS, job.M - i * SHALLOW_ROWS);
        part.x += i * SHALLOW_ROWS * job.ldx;
        part.y += i * SHALLOW_ROWS * job.ldy;
        for (int64_t p = 0, P = panels(job); p < P; ++p) job_panel<false>(part, p, nullptr);
        continue;
      }
#ifdef MARFT_BF16
      if (job.wb) {
        job_panel_bf16(job, i);
        continue;
      }
#endif
      if (job.M <= 6) {  // one block of rows streams its panel from memory as it goes: no prefetch
        job_panel<false>(job, i, nullptr);
        continue;
      }
      // the thread's next item: this job's next panel, or the next job's first
      const float* next = i + 1 < first[j + 1] - first[j] ? job.panels + (i + 1) * job.pstride
                          : j + 1 < jobs.size() && !jobs[j + 1].wb ? jobs[j + 1].panels
                                                                 : job.panels;
      job_panel<true>(job, i, next);
    }
  };
  // Each thread takes a run of items of about equal work (rows x columns x (depth + the stores); a
  // bf16 panel's depth counts half, two products an instruction), not of equal count: the items of
  // one call differ several-fold (a bf16 panel of a base weight over all rows, an fp32 panel of one
  // adapter's LoRA A over its rows), and a split by count left a thread waiting on the other.
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), items);
  if (threads <= 1 || at::in_parallel_region()) {
    run(0, items);
    return;
  }
  std::vector<double> work(items + 1, 0.0);  // work[i]: the work of items [0, i)
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PanelJob& job = jobs[j];
    for (int64_t i = first[j]; i < first[j + 1]; ++i) {
      const double w = job.wb ? static_cast<double>(job.M) * marft::NRB * ((job.K + 1) / 2 + 4)
                       : shallow(job)
                           ? static_cast<double>(std::min(SHALLOW_ROWS, job.M - (i - first[j]) * SHALLOW_ROWS)) *
                                 NR * (job.K + 8) * panels(job)
                           : static_cast<double>(job.M) * NR * (job.K + 8);
      work[i + 1] = work[i] + w;
    }
  }
  auto bound = [&](int64_t t) -> int64_t {  // thread t's first item
    if (t >= threads) return items;
    return std::lower_bound(work.begin(), work.begin() + items, work[items] * t / threads) - work.begin();
  };
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) run(bound(t), bound(t + 1));
  });
#else
  TORCH_CHECK(false, "panel_jobs: built without AVX2 and FMA");
#endif
}
