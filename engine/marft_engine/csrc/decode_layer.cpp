// One decoder layer of a Llama-shaped model (Llama, Qwen2) for a CPU decode step, in one call
// (fused_decode.py). Why: at a decode step's few rows the layer's arithmetic is small, and Hugging
// Face's forward spends as long again in Python and in about 280 small tensor operations a layer
// (norms, rotary, LoRA masks, views), each dispatched on its own (docs/MEASUREMENTS.md). Here the
// same steps run in order on the panel kernel's products, with each group of products that read the
// same input (q, k, v and their LoRA As; gate and up and theirs) in one parallel region.
// The residual stream, norms, LoRA and attention are fp32 (the cache's keys and values fp32, or bf16).
// The base weights' products are fp32, or, where the weights are pack_panels_bf16's (a bf16 base),
// bf16 products with fp32 sums.
#include <ATen/Parallel.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "elementwise.h"
#include "panels.h"

torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& keep, double scale);

namespace {
using marft::PanelJob;

const float* ptr_or_null(const torch::Tensor& t) { return t.numel() ? t.data_ptr<float>() : nullptr; }

bool is_bf16_panels(const torch::Tensor& p) { return p.scalar_type() == torch::kInt32; }

// f(m) for the rows m in [0, M), over torch's threads where there are many (a prefill's tokens);
// a decode step's few rows run on the calling thread.
template <typename F>
void rows_parallel(int64_t M, const F& f) {
  at::parallel_for(0, M, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) f(m);
  });
}

void check_panels(const torch::Tensor& p, int64_t K, int64_t N, const char* what) {
  if (is_bf16_panels(p)) {
    TORCH_CHECK(p.dim() == 3 && p.is_contiguous() && p.size(1) == (K + 1) / 2 && p.size(2) == marft::NRB &&
                    p.size(0) == (N + marft::NRB - 1) / marft::NRB,
                "DecodeLayer: ", what, " must be pack_panels_bf16's [ceil(N / 32), ceil(K / 2), 32] for N = ", N,
                ", K = ", K);
    return;
  }
  TORCH_CHECK(p.dim() == 3 && p.scalar_type() == torch::kFloat32 && p.is_contiguous() && p.size(1) == K &&
                  p.size(2) == marft::NR && p.size(0) == (N + marft::NR - 1) / marft::NR,
              "DecodeLayer: ", what, " must be pack_panels' [ceil(N / 16), K, 16] for N = ", N, ", K = ", K);
}
}  // namespace

// Attention of a prefill's queries over its bf16 cache on the bf16 panels (panels.h). PyTorch's flash
// kernel went through MKL's bf16 product, which on the AMD CPUs measured took MKL's generic path: a
// few percent of a prefill's FLOPs took a seventh of its time (docs/MEASUREMENTS.md). Per prompt p
// and key/value head h, the rows are the queries of the G heads that share h at the prompt's real
// positions: scores = q k^T over the columns from the prompt's first kept one, a masked softmax in
// fp32, then p v with p rounded to bf16 (as the flash kernel rounds it); each in blocks of QB query
// positions over the columns up to the block's last one (the causal mask leaves out the rest).
// q [N, H, D] fp32: the pass's tokens; tok[p S + t]: the token of prompt p at query position t, for t
// from real[p] (prompt p's first real one); kbuf, vbuf [P, Hk, L, D] bf16; keep [P, 1, S, L]. Writes
// out [N, H, D] fp32.
void prefill_attention_bf16(const float* q, const std::vector<int64_t>& tok, const at::BFloat16* kbuf,
                            const at::BFloat16* vbuf, const bool* keep, int64_t P, int64_t S, int64_t H, int64_t Hk,
                            int64_t L, int64_t D, float scale, const std::vector<int64_t>& real, float* out) {
  constexpr int64_t QB = 64;
  constexpr int64_t SCORE_BYTES = 4 << 20;  // a chunk of blocks' scores at most (but one block)
  const int64_t G = H / Hk, D2 = D / 2;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t t_lo = real[p];
    if (t_lo >= S) continue;
    const bool* kp = keep + p * S * L;
    int64_t first = L;
    for (int64_t t = t_lo; t < S; ++t) {
      const bool* kt = kp + t * L;
      first = std::min<int64_t>(first, std::find(kt, kt + L, true) - kt);
    }
    if (first == L) first = 0;
    const int64_t N = L - first, N2 = (N + 1) / 2;
    // keys as the panels of a weight [N, D]: a pair of k is two consecutive bf16 of a key row
    auto kpan = torch::zeros({(N + marft::NRB - 1) / marft::NRB, D2, marft::NRB}, torch::kInt32);
    // values as the panels of V^T [D, N]: a pair of k is one element of two consecutive value rows
    auto vpan = torch::zeros({(D + marft::NRB - 1) / marft::NRB, N2, marft::NRB}, torch::kInt32);
    for (int64_t h = 0; h < Hk; ++h) {
      const uint16_t* K = reinterpret_cast<const uint16_t*>(kbuf + ((p * Hk + h) * L + first) * D);
      const uint16_t* V = reinterpret_cast<const uint16_t*>(vbuf + ((p * Hk + h) * L + first) * D);
      uint32_t* kw = reinterpret_cast<uint32_t*>(kpan.data_ptr<int32_t>());
      uint32_t* vw = reinterpret_cast<uint32_t*>(vpan.data_ptr<int32_t>());
      at::parallel_for(0, N2, 64, [&](int64_t lo, int64_t hi) {
        for (int64_t c2 = lo; c2 < hi; ++c2) {
          for (int64_t c = 2 * c2; c < std::min(N, 2 * c2 + 2); ++c) {
            uint32_t* kr = kw + (c / marft::NRB) * D2 * marft::NRB + c % marft::NRB;
            const uint32_t* pairs = reinterpret_cast<const uint32_t*>(K + c * D);  // D even
            for (int64_t k2 = 0; k2 < D2; ++k2) kr[k2 * marft::NRB] = pairs[k2];
          }
          const uint16_t* v0 = V + 2 * c2 * D;
          for (int64_t d = 0; d < D; ++d) {
            const uint32_t hi16 = 2 * c2 + 1 < N ? static_cast<uint32_t>(v0[D + d]) << 16 : 0;
            vw[((d / marft::NRB) * N2 + c2) * marft::NRB + d % marft::NRB] = static_cast<uint32_t>(v0[d]) | hi16;
          }
        }
      });
      // rows (t, j): query head h G + j at position t, for t from t_lo; in chunks of whole blocks
      for (int64_t c0 = t_lo; c0 < S;) {
        int64_t c1 = c0;
        do {
          c1 = std::min(c1 + QB, S);
        } while (c1 < S && (std::min(c1 + QB, S) - c0) * G * N * 4 <= SCORE_BYTES);
        const int64_t R = (c1 - c0) * G;
        auto qx = torch::empty({R, D2}, torch::kInt32);
        auto sc = torch::empty({R, N}, torch::kFloat32);
        auto px = torch::empty({R, N2}, torch::kInt32);
        auto ob = torch::empty({R, D}, torch::kFloat32);
        std::vector<float> inv(R);
        uint32_t* qxp = reinterpret_cast<uint32_t*>(qx.data_ptr<int32_t>());
        uint32_t* pxp = reinterpret_cast<uint32_t*>(px.data_ptr<int32_t>());
        float* scp = sc.data_ptr<float>();
        float* obp = ob.data_ptr<float>();
        at::parallel_for(0, R, 64, [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            const int64_t t = c0 + r / G, j = r % G;
            marft::to_bf16_pairs(q + (tok[p * S + t] * H + h * G + j) * D, 1, D, D, qxp + r * D2);
          }
        });
        auto cols = [&](int64_t t0) { return L - S + std::min(t0 + QB, S) - first; };  // a block's columns
        // one bf16 product a block of rows: x (pairs, ldx words a row) times panels (pstride words
        // apart), into y (ldy a row); depth and width D or the block's columns, as `scores` says
        auto blocks = [&](bool scores, const uint32_t* x, int64_t ldx, const torch::Tensor& panels, int64_t pstride,
                          float* y, int64_t ldy) {
          std::vector<marft::PanelJob> jobs;
          for (int64_t t0 = c0; t0 < c1; t0 += QB) {
            const int64_t r0 = (t0 - c0) * G, m = (std::min(t0 + QB, c1) - t0) * G;
            const int64_t depth = scores ? D : cols(t0), width = scores ? cols(t0) : D;
            marft::PanelJob j{m, nullptr, 0, depth, nullptr, pstride, width, y + r0 * ldy, ldy, false};
            j.xb = x + r0 * ldx;
            j.ldxb = ldx;
            j.wb = reinterpret_cast<const uint32_t*>(panels.data_ptr<int32_t>());
            jobs.push_back(j);
          }
          marft::panel_jobs(jobs);
        };
        blocks(true, qxp, D2, kpan, D2 * marft::NRB, scp, N);  // the scores [R, N]
        at::parallel_for(0, R, 16, [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            const int64_t t = c0 + r / G, n = cols(c0 + (t - c0) / QB * QB);
            float* sr = scp + r * N;
            const bool* kr = kp + t * L + first;
            float mx = marft::MASKED;
            for (int64_t c = 0; c < n; ++c) {
              sr[c] = kr[c] ? sr[c] * scale : marft::MASKED;
              mx = std::max(mx, sr[c]);
            }
            inv[r] = 1.f / marft::masked_exp(sr, n, mx);  // a real query keeps its own column
            marft::to_bf16_pairs(sr, 1, n, n, pxp + r * N2);
          }
        });
        blocks(false, pxp, N2, vpan, N2 * marft::NRB, obp, D);  // the weights times the values [R, D]
        at::parallel_for(0, R, 64, [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            const int64_t t = c0 + r / G, j = r % G;
            float* o = out + (tok[p * S + t] * H + h * G + j) * D;
            for (int64_t d = 0; d < D; ++d) o[d] = obp[r * D + d] * inv[r];
          }
        });
        c0 = c1;
      }
    }
  }
}

// A projection x W^T + bias + B (s A x) with each row through its own adapter's LoRA (lora_batch.py's
// per-row path): A holds the adapters' A side by side ([n r, d_in], slot j in rows j r .. j r + r - 1),
// B theirs ([d_out, n r], scaling folded in); row i keeps only its slot's block of A x (slot -1: none).
struct Proj {
  torch::Tensor w, bias, a, b;  // panels of W [N, K] (fp32 or bf16), bias [N] or empty, fp32 panels of A and B or empty
  int64_t K, N, AN, r;          // in, out, A's outputs (n r), rank r
  torch::Tensor slot;           // [M] int64: each row's LoRA slot, -1 for none; empty without LoRA

  Proj(torch::Tensor w_, int64_t K_, int64_t N_, torch::Tensor bias_, torch::Tensor a_, int64_t AN_,
       torch::Tensor b_, int64_t r_, torch::Tensor slot_)
      : w(w_), bias(bias_), a(a_), b(b_), K(K_), N(N_), AN(AN_), r(r_), slot(slot_) {
    check_panels(w, K, N, "a weight");
    TORCH_CHECK(!bias.numel() || (bias.is_contiguous() && bias.numel() == N && bias.scalar_type() == torch::kFloat32),
                "DecodeLayer: a bias must be [N] fp32");
    if (lora()) {
      TORCH_CHECK(!is_bf16_panels(a) && !is_bf16_panels(b), "DecodeLayer: LoRA stacks must be fp32 panels");
      check_panels(a, K, AN, "a LoRA A stack");
      check_panels(b, AN, N, "a LoRA B stack");
      TORCH_CHECK(r > 0 && AN % r == 0 && slot.scalar_type() == torch::kInt64 && slot.is_contiguous(),
                  "DecodeLayer: LoRA rank and slots");
    }
  }
  bool lora() const { return a.numel() > 0; }
  bool bf16() const { return is_bf16_panels(w); }
};

class DecodeLayer {
  static constexpr int64_t QUERY_BLOCK = 64;  // a prefill's query positions an attention call

 public:
  // ln1, ln2 [d]: the RMS norms before attention and before the MLP; projections q, k, v, o, gate, up,
  // down; D the head size, scale the attention's.
  DecodeLayer(torch::Tensor ln1, torch::Tensor ln2, double eps, std::vector<Proj> proj, int64_t D, double scale)
      : ln1_(ln1.contiguous()), ln2_(ln2.contiguous()), eps_(eps), p_(std::move(proj)), D_(D), scale_(scale) {
    TORCH_CHECK(p_.size() == 7, "DecodeLayer: 7 projections (q, k, v, o, gate, up, down)");
    d_ = ln1_.numel();
    TORCH_CHECK(p_[0].K == d_ && p_[1].K == d_ && p_[2].K == d_ && p_[4].K == d_ && p_[5].K == d_ &&
                    p_[3].N == d_ && p_[6].N == d_ && p_[3].K == p_[0].N && p_[6].K == p_[4].N &&
                    p_[4].N == p_[5].N && p_[1].N == p_[2].N && p_[0].N % D == 0 && p_[1].N % D == 0 &&
                    (p_[0].N / D) % (p_[1].N / D) == 0 && D % 2 == 0,
                "DecodeLayer: projection shapes do not fit one decoder layer");
  }

  // Each projection's LoRA slot of each row of the next calls ([M] int64; ignored for a projection
  // without LoRA): rows that join or leave keep the layer, its panels and stacks.
  void set_slots(const std::vector<torch::Tensor>& slots) {
    TORCH_CHECK(slots.size() == p_.size(), "DecodeLayer.set_slots: one tensor a projection");
    for (size_t j = 0; j < p_.size(); ++j) {
      if (!p_[j].lora()) continue;
      TORCH_CHECK(slots[j].dim() == 1 && slots[j].scalar_type() == torch::kInt64 && slots[j].is_contiguous(),
                  "DecodeLayer.set_slots: a LoRA projection's slots must be [M] int64, contiguous");
      p_[j].slot = slots[j];
    }
  }

  // x [M, d]: the rows' residual stream; cos, sin [M, D] the rotary embedding of their positions;
  // kbuf, vbuf [S, Hk, C, D] the slot cache (kv_cache.py): the step's keys and values go to column
  // `end` of slots [0, M), and attention reads columns [start, end] with keep [M, 1, end + 1 - start].
  // Returns the layer's output [M, d].
  torch::Tensor forward(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, torch::Tensor kbuf,
                        torch::Tensor vbuf, int64_t start, int64_t end, torch::Tensor keep) const {
    const int64_t M = check_rows(x, cos, sin, kbuf, vbuf);
    TORCH_CHECK(kbuf.size(0) >= M && 0 <= start && start <= end && end < kbuf.size(2),
                "DecodeLayer: the cache must be [S >= M, Hk, C > end, D]");
    const int64_t D = D_, H = p_[0].N / D;
    torch::Tensor q, k, v;
    qkv(x, cos, sin, q, k, v);
    std::vector<int64_t> rows(M), cols(M, end);
    for (int64_t m = 0; m < M; ++m) rows[m] = m;
    to_cache(k, v, kbuf, vbuf, rows.data(), cols.data());
    const int64_t L = end + 1 - start;
    auto attn = decode_attention(q.view({M, H, 1, D}), kbuf.narrow(0, 0, M).narrow(2, start, L),
                                 vbuf.narrow(0, 0, M).narrow(2, start, L), keep.view({M, 1, L}), scale_);
    return rest(x, attn.view({M, H * D}));
  }

  // A prefill's new tokens (fused_decode.prefill): x [N, d] their residual stream, cos, sin [N, D] the
  // rotary embedding of their positions; kbuf, vbuf [P, Hk, L, D] the pass's cache, with the prompts'
  // cached prefixes in place. Token n is prompt row[n]'s, at column col[n] in [L - S, L): its key and
  // value go there, and its query to position col[n] - (L - S) of the prompts' [P, S] queries, which
  // attend the columns keep [P, 1, S, L] marks (a causal mask over each prompt's columns).
  // Returns the layer's output [N, d].
  torch::Tensor prefill(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, torch::Tensor kbuf,
                        torch::Tensor vbuf, torch::Tensor row, torch::Tensor col, torch::Tensor keep) const {
    const int64_t N = check_rows(x, cos, sin, kbuf, vbuf);
    const int64_t P = kbuf.size(0), L = kbuf.size(2), S = keep.size(2), D = D_, H = p_[0].N / D;
    TORCH_CHECK(row.scalar_type() == torch::kInt64 && col.scalar_type() == torch::kInt64 && row.is_contiguous() &&
                    col.is_contiguous() && row.numel() == N && col.numel() == N,
                "DecodeLayer.prefill: row and col must be [N] int64");
    TORCH_CHECK(keep.scalar_type() == torch::kBool && keep.sizes() == torch::IntArrayRef({P, 1, S, L}) && S <= L,
                "DecodeLayer.prefill: keep must be [P, 1, S <= L, L] bool");
    const int64_t* rp = row.data_ptr<int64_t>();
    const int64_t* cp = col.data_ptr<int64_t>();
    for (int64_t n = 0; n < N; ++n) {
      TORCH_CHECK(0 <= rp[n] && rp[n] < P && L - S <= cp[n] && cp[n] < L, "DecodeLayer.prefill: token ", n,
                  " at row ", rp[n], ", column ", cp[n], ", outside the cache");
    }
    torch::Tensor q, k, v;
    qkv(x, cos, sin, q, k, v);
    to_cache(k, v, kbuf, vbuf, rp, cp);
    auto attn = torch::empty({N, H * D}, x.options());
    if (kbuf.scalar_type() == torch::kBFloat16) {  // the bf16 panels read and write the tokens' own rows
      std::vector<int64_t> tok(P * S, -1), real(P, S);  // each query position's token; each prompt's first
      for (int64_t n = 0; n < N; ++n) {
        const int64_t t = cp[n] - (L - S);
        TORCH_CHECK(tok[rp[n] * S + t] < 0, "DecodeLayer.prefill: two tokens at row ", rp[n], ", column ", cp[n]);
        tok[rp[n] * S + t] = n;
        real[rp[n]] = std::min(real[rp[n]], t);
      }
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t t = real[p]; t < S; ++t) {
          TORCH_CHECK(tok[p * S + t] >= 0, "DecodeLayer.prefill: row ", p, "'s new tokens must fill its last columns");
        }
      }
      prefill_attention_bf16(q.data_ptr<float>(), tok, kbuf.data_ptr<at::BFloat16>(), vbuf.data_ptr<at::BFloat16>(),
                             keep.data_ptr<bool>(), P, S, H, kbuf.size(1), L, D, static_cast<float>(scale_), real,
                             attn.data_ptr<float>());
      return rest(x, attn);
    }
    // PyTorch's attention (its flash kernel on a CPU) over the queries padded to [P, S, H, D] (a padding
    // position's output is never read), in blocks of query positions, each over the columns up to its
    // last one's: the causal mask leaves the later columns out of every query of the block, which the
    // kernel would otherwise score.
    auto qp = torch::zeros({P, S, H * D}, x.options());
    float* qd = qp.data_ptr<float>();
    const float* qs = q.data_ptr<float>();
    auto at = [&](int64_t n) { return (rp[n] * S + cp[n] - (L - S)) * H * D; };  // token n's query in qp
    rows_parallel(N, [&](int64_t n) { std::copy_n(qs + n * H * D, H * D, qd + at(n)); });
    auto qh = qp.view({P, S, H, D}).transpose(1, 2);  // [P, H, S, D]
    std::vector<torch::Tensor> parts;
    for (int64_t t0 = 0; t0 < S; t0 += QUERY_BLOCK) {
      const int64_t T = std::min(QUERY_BLOCK, S - t0), Lb = L - S + t0 + T;
      parts.push_back(at::scaled_dot_product_attention(qh.narrow(2, t0, T), kbuf.narrow(2, 0, Lb),
                                                       vbuf.narrow(2, 0, Lb), keep.narrow(2, t0, T).narrow(3, 0, Lb),
                                                       0.0, false, scale_, true));
    }
    auto a = parts.size() == 1 ? parts[0] : at::cat(parts, 2);  // [P, H, S, D]
    auto ap = a.transpose(1, 2).contiguous();                   // [P, S, H, D]
    const float* as = ap.data_ptr<float>();
    float* ad = attn.data_ptr<float>();
    rows_parallel(N, [&](int64_t n) { std::copy_n(as + at(n), H * D, ad + n * H * D); });
    return rest(x, attn);
  }

 private:
  // Checks what forward and prefill share; returns the rows M of x.
  int64_t check_rows(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     const torch::Tensor& kbuf, const torch::Tensor& vbuf) const {
    TORCH_CHECK(x.dim() == 2 && x.size(1) == d_ && x.is_contiguous() && x.scalar_type() == torch::kFloat32,
                "DecodeLayer: x must be [M, d] fp32, contiguous");
    const int64_t M = x.size(0), D = D_, Hk = p_[1].N / D;
    TORCH_CHECK(cos.sizes() == torch::IntArrayRef({M, D}) && sin.sizes() == cos.sizes() && cos.is_contiguous() &&
                    sin.is_contiguous(),
                "DecodeLayer: cos and sin must be [M, D], contiguous");
    TORCH_CHECK(kbuf.dim() == 4 && kbuf.is_contiguous() && vbuf.is_contiguous() && kbuf.sizes() == vbuf.sizes() &&
                    kbuf.size(1) == Hk && kbuf.size(3) == D && vbuf.scalar_type() == kbuf.scalar_type() &&
                    (kbuf.scalar_type() == torch::kFloat32 || kbuf.scalar_type() == torch::kBFloat16),
                "DecodeLayer: the cache must be fp32 or bf16 [rows, Hk, columns, D], contiguous");
    for (const Proj& p : p_) {
      TORCH_CHECK(!p.lora() || p.slot.numel() == M, "DecodeLayer: LoRA slots for ", M, " rows");
    }
    return M;
  }

  // The attention's input: q, k [M, heads * D] rotated, v [M, Hk * D], from the residual stream x.
  void qkv(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& q,
           torch::Tensor& k, torch::Tensor& v) const {
    const int64_t M = x.size(0);
    auto opt = x.options();
    auto h = torch::empty({M, d_}, opt);
    rms_norm(x, ln1_, h);
    q = torch::empty({M, p_[0].N}, opt), k = torch::empty({M, p_[1].N}, opt), v = torch::empty({M, p_[2].N}, opt);
    project({0, 1, 2}, h, {&q, &k, &v});
    rotary(q, cos, sin, p_[0].N / D_);
    rotary(k, cos, sin, p_[1].N / D_);
  }

  // The layer after attention: x + o(attn), then its MLP and residual.
  torch::Tensor rest(const torch::Tensor& x, const torch::Tensor& attn) const {
    const int64_t M = x.size(0);
    auto opt = x.options();
    auto o = torch::empty({M, d_}, opt);
    project({3}, attn, {&o});
    auto x1 = x + o;  // the residual first, as Hugging Face adds it
    auto h = torch::empty({M, d_}, opt);
    rms_norm(x1, ln2_, h);
    auto gate = torch::empty({M, p_[4].N}, opt), up = torch::empty({M, p_[4].N}, opt);
    project({4, 5}, h, {&gate, &up});
    marft::silu_mul_inplace(gate.data_ptr<float>(), up.data_ptr<float>(), gate.numel());
    auto down = torch::empty({M, d_}, opt);
    project({6}, gate, {&down});
    return x1 + down;
  }

  // Keys and values k, v [M, Hk * D] into the cache: row m's to column cols[m] of slot rows[m], in the
  // cache's dtype.
  void to_cache(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& kbuf, torch::Tensor& vbuf,
                const int64_t* rows, const int64_t* cols) const {
    if (kbuf.scalar_type() == torch::kBFloat16) {
      to_cache_as<at::BFloat16>(k, v, kbuf, vbuf, rows, cols);
    } else {
      to_cache_as<float>(k, v, kbuf, vbuf, rows, cols);
    }
  }

  // y [M, d] = x / rms(x) * w (Hugging Face's LlamaRMSNorm in fp32).
  void rms_norm(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y) const {
    marft::rms_norm_rows(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), x.size(0), d_,
                         static_cast<float>(eps_));
  }

  // to_cache in the cache's element type KV (bf16: rounded to nearest even, as PyTorch's copy into a
  // bf16 cache rounds).
  template <typename KV>
  void to_cache_as(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& kbuf, torch::Tensor& vbuf,
                const int64_t* rows, const int64_t* cols) const {
    const int64_t M = k.size(0), Hk = kbuf.size(1), C = kbuf.size(2), D = D_;
    KV* kb = kbuf.data_ptr<KV>();
    KV* vb = vbuf.data_ptr<KV>();
    const float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    rows_parallel(M, [&](int64_t m) {
      for (int64_t g = 0; g < Hk; ++g) {
        const int64_t at = ((rows[m] * Hk + g) * C + cols[m]) * D, from = (m * Hk + g) * D;
        for (int64_t d = 0; d < D; ++d) {
          kb[at + d] = static_cast<KV>(kp[from + d]);
          vb[at + d] = static_cast<KV>(vp[from + d]);
        }
      }
    });
  }

  // t [M, heads * D] rotated in place: t cos + rotate_half(t) sin per head, rotate_half(a, b) = (-b, a).
  void rotary(torch::Tensor& t, const torch::Tensor& cos, const torch::Tensor& sin, int64_t heads) const {
    const int64_t M = t.size(0), D = D_, half = D / 2;
    float* tp = t.data_ptr<float>();
    const float* c = cos.data_ptr<float>();
    const float* s = sin.data_ptr<float>();
    rows_parallel(M, [&](int64_t m) {
      for (int64_t hd = 0; hd < heads; ++hd) {
        float* a = tp + (m * heads + hd) * D;
        const float* cm = c + m * D;
        const float* sm = s + m * D;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = a[i], x2 = a[i + half];
          a[i] = x1 * cm[i] - x2 * sm[i];
          a[i + half] = x2 * cm[i + half] + x1 * sm[i + half];
        }
      }
    });
  }

  // out[j] = in W_j^T + bias_j + LoRA_j for the projections `which`, which all read `in` [M, K]. The
  // base products and the LoRA As in one parallel region, then the Bs in another. Each adapter's rows
  // go through its own block of A and B only (gathered, then added back; consecutive rows, as a
  // prefill's, read and added in place), not through every adapter's with the others' outputs
  // zeroed: the same sums, as the zeros add nothing, for 1 / n of the work.
  void project(std::initializer_list<int> which, const torch::Tensor& in, std::vector<torch::Tensor*> out) const {
    struct Group {  // one adapter's rows of one projection
      const Proj* p;
      float* y;
      std::vector<int64_t> rows;
      int64_t lo;     // its block's first column in xa (the A panels from the one holding column s r)
      const float* x;  // its rows of `in` (in `scratch`, or in place)
      float *xa, *yb;  // their A products, their B products (in `scratch`)
      bool run;            // its rows are consecutive (a prefill's, ordered by adapter): read and added in place
      int64_t s, first, width;  // its slot; the first A panel it reads, and the columns from there
    };
    const int64_t M = in.size(0), K = in.size(1);
    const float* X = in.data_ptr<float>();
    torch::Tensor xb;  // `in` as bf16 pairs, for the projections with bf16 weights
    for (int j : which) {
      if (p_[j].bf16() && !xb.defined()) {
        xb = torch::empty({M, (K + 1) / 2}, in.options().dtype(torch::kInt32));
        marft::to_bf16_pairs(X, M, K, K, reinterpret_cast<uint32_t*>(xb.data_ptr<int32_t>()));
      }
    }
    std::vector<PanelJob> jobs;
    std::vector<Group> groups;
    size_t n = 0;
    for (int j : which) {
      const Proj& p = p_[j];
      float* y = out[n++]->data_ptr<float>();
      if (p.bf16()) {
        PanelJob job{M, nullptr, 0, K, nullptr, (K + 1) / 2 * marft::NRB, p.N, y, p.N, false};
        job.xb = reinterpret_cast<const uint32_t*>(xb.data_ptr<int32_t>());
        job.ldxb = (K + 1) / 2;
        job.wb = reinterpret_cast<const uint32_t*>(p.w.data_ptr<int32_t>());
        jobs.push_back(job);
      } else {
        jobs.push_back({M, X, K, K, p.w.data_ptr<float>(), K * marft::NR, p.N, y, p.N, false});
      }
      if (!p.lora()) continue;
      const int64_t* slot = p.slot.data_ptr<int64_t>();
      for (int64_t s = 0; s < p.AN / p.r; ++s) {
        Group g{&p, y, {}, 0, nullptr, nullptr, nullptr, false, s, 0, 0};
        for (int64_t m = 0; m < M; ++m)
          if (slot[m] == s) g.rows.push_back(m);
        if (!g.rows.empty()) groups.push_back(std::move(g));
      }
    }
    // every group's rows, A products and B products in one buffer: one allocation, not three a group
    int64_t floats = 0;
    for (Group& g : groups) {
      const Proj& p = *g.p;
      const int64_t last = (g.s * p.r + p.r - 1) / marft::NR;
      g.first = g.s * p.r / marft::NR;
      g.width = std::min(p.AN, (last + 1) * marft::NR) - g.first * marft::NR;
      g.lo = g.s * p.r - g.first * marft::NR;
      g.run = g.rows.back() - g.rows.front() + 1 == static_cast<int64_t>(g.rows.size());
      floats += static_cast<int64_t>(g.rows.size()) * (g.run ? g.width : K + g.width + p.N);
    }
    auto scratch = torch::empty({floats}, in.options());
    float* at = scratch.data_ptr<float>();
    for (Group& g : groups) {
      const Proj& p = *g.p;
      const int64_t m = g.rows.size();
      if (g.run) {  // its rows of `in` in place; its B products added to y in place
        g.x = X + g.rows.front() * K;
        g.xa = at;
        at = g.xa + m * g.width;
      } else {
        float* x = at;
        g.x = x;
        g.xa = x + m * K;
        g.yb = g.xa + m * g.width;
        at = g.yb + m * p.N;
        for (int64_t i = 0; i < m; ++i) std::copy_n(X + g.rows[i] * K, K, x + i * K);
      }
      jobs.push_back({m, g.x, K, K, p.a.data_ptr<float>() + g.first * K * marft::NR, K * marft::NR, g.width, g.xa,
                      g.width, false});
    }
    marft::panel_jobs(jobs);
    jobs.clear();
    n = 0;
    for (int j : which) {
      const Proj& p = p_[j];
      float* y = out[n++]->data_ptr<float>();
      if (const float* bias = ptr_or_null(p.bias)) {
        rows_parallel(M, [&](int64_t m) {
          for (int64_t c = 0; c < p.N; ++c) y[m * p.N + c] += bias[c];
        });
      }
    }
    for (Group& g : groups) {  // the B product over the group's own r columns of A x
      const Proj& p = *g.p;
      const int64_t m = g.rows.size();
      float* y = g.run ? g.y + g.rows.front() * p.N : g.yb;
      jobs.push_back({m, g.xa + g.lo, g.width, p.r, p.b.data_ptr<float>() + g.s * p.r * marft::NR, p.AN * marft::NR,
                      p.N, y, p.N, g.run});
    }
    if (jobs.empty()) return;
    marft::panel_jobs(jobs);
    for (Group& g : groups) {
      if (g.run) continue;
      const int64_t N = g.p->N;
      const float* yb = g.yb;
      for (size_t i = 0; i < g.rows.size(); ++i) {
        float* yr = g.y + g.rows[i] * N;
        for (int64_t c = 0; c < N; ++c) yr[c] += yb[i * N + c];
      }
    }
  }

  torch::Tensor ln1_, ln2_;
  double eps_;
  std::vector<Proj> p_;
  int64_t D_, d_;
  double scale_;
};

void bind_decode_layer(pybind11::module& m) {
  pybind11::class_<Proj>(m, "Proj", "a projection's panels, bias and per-row LoRA (decode_layer.cpp)")
      .def(pybind11::init<torch::Tensor, int64_t, int64_t, torch::Tensor, torch::Tensor, int64_t, torch::Tensor,
                          int64_t, torch::Tensor>());
  pybind11::class_<DecodeLayer>(m, "DecodeLayer", "one Llama-shaped decoder layer for a CPU decode step")
      .def(pybind11::init<torch::Tensor, torch::Tensor, double, std::vector<Proj>, int64_t, double>())
      .def("set_slots", &DecodeLayer::set_slots)
      .def("forward", &DecodeLayer::forward)
      .def("prefill", &DecodeLayer::prefill);
}
