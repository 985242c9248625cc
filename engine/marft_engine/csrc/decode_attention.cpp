// Attention of a decode step on a CPU (decode_attention.py): a few query positions a row over the
// rows' KV cache, softmax(q k^T * scale, masked) v, with each key/value head shared by its group of
// query heads. Why a kernel of our own: a decode step's attention is bound by reading the cache, and
// PyTorch's CPU flash kernel read it at half the rate of a plain sum over it (docs/MEASUREMENTS.md);
// this reads every row's keys and values once, for all the query heads that share them.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "elementwise.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MARFT_AVX2 1
#endif

namespace {
using marft::MASKED;

// A cached key or value element as fp32: the cache holds fp32, or bf16 (a bf16 base's, half the bytes
// to read), whose bits are the top half of an fp32's.
inline float to_f(float x) { return x; }
inline float to_f(at::BFloat16 x) { return static_cast<float>(x); }

#ifdef MARFT_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The sums of 8 vectors' lanes, as one vector: [sum(a0), ..., sum(a7)]. One reduction for 8 dot
// products, where reducing each on its own costs as much as a third of its multiply-adds (D = 64).
inline __m256 sums8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));  // per 128-bit half
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// Scaled, masked scores of query qr [D] against keys l0 .. l0+7 (kr: key l0, rows kl apart), into
// pr[l0 ..]; returns them. D a multiple of 8.
template <typename KV>
inline __m256 scores8(const float* qr, const KV* kr, int64_t kl, int64_t D, const bool* m, float s,
                      float* pr) {
  __m256 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 q = _mm256_loadu_ps(qr + d);
    for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(q, load8(kr + i * kl + d), a[i]);
  }
  const __m256 sc = _mm256_mul_ps(sums8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), _mm256_set1_ps(s));
  // the 8 mask bytes (0 or 1) widened to lanes: all ones where kept
  const __m256i keep = _mm256_cmpgt_epi32(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m))), _mm256_setzero_si256());
  const __m256 out = _mm256_blendv_ps(_mm256_set1_ps(MASKED), sc, _mm256_castsi256_ps(keep));
  _mm256_storeu_ps(pr, out);
  return out;
}

// acc [D] = sum over l of p[l] v[l] (v: value 0, rows vl apart), D a multiple of 64: 64 columns at a
// time, their sums in 8 named registers (with a run-time count of vectors, GCC kept them on the stack
// and stored every one at every l: the values' loop ran at a third of its rate).
template <typename KV>
inline void weighted64(const float* p, const KV* v, int64_t vl, int64_t L, int64_t D, float* acc) {
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t l = 0; l < L; ++l) {
      const __m256 w = _mm256_set1_ps(p[l]);
      const KV* vr = v + l * vl + d0;
      a0 = _mm256_fmadd_ps(w, load8(vr), a0);
      a1 = _mm256_fmadd_ps(w, load8(vr + 8), a1);
      a2 = _mm256_fmadd_ps(w, load8(vr + 16), a2);
      a3 = _mm256_fmadd_ps(w, load8(vr + 24), a3);
      a4 = _mm256_fmadd_ps(w, load8(vr + 32), a4);
      a5 = _mm256_fmadd_ps(w, load8(vr + 40), a5);
      a6 = _mm256_fmadd_ps(w, load8(vr + 48), a6);
      a7 = _mm256_fmadd_ps(w, load8(vr + 56), a7);
    }
    float* o = acc + d0;
    _mm256_storeu_ps(o, a0);
    _mm256_storeu_ps(o + 8, a1);
    _mm256_storeu_ps(o + 16, a2);
    _mm256_storeu_ps(o + 24, a3);
    _mm256_storeu_ps(o + 32, a4);
    _mm256_storeu_ps(o + 40, a5);
    _mm256_storeu_ps(o + 48, a6);
    _mm256_storeu_ps(o + 56, a7);
  }
}
#endif

template <typename KV>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keep,
            double scale, at::Tensor& out);
}  // namespace

// q [B, H, T, D] fp32, contiguous; k, v [B, Hk, L, D] fp32 or both bf16, with D contiguous (views of
// the slot cache); keep [B, T, L] bool, contiguous (true: attend). Returns [B, T, H, D] fp32.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keep,
                            double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && keep.dim() == 3, "decode_attention: ranks");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == v.scalar_type() &&
                  (k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16),
              "decode_attention: fp32 q; fp32 or bf16 k and v");
  TORCH_CHECK(keep.scalar_type() == at::kBool && keep.is_contiguous() && q.is_contiguous(),
              "decode_attention: contiguous q and bool keep");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "decode_attention: k, v with contiguous rows");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hk = k.size(1), L = k.size(2);
  TORCH_CHECK(H % Hk == 0 && k.sizes() == v.sizes() && k.size(0) == B && k.size(3) == D,
              "decode_attention: shapes");
  TORCH_CHECK(keep.size(0) == B && keep.size(1) == T && keep.size(2) == L, "decode_attention: keep shape");
  auto out = at::empty({B, T, H, D}, q.options());
  if (k.scalar_type() == at::kBFloat16) {
    attend<at::BFloat16>(q, k, v, keep, scale, out);
  } else {
    attend<float>(q, k, v, keep, scale, out);
  }
  return out;
}

namespace {
template <typename KV>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keep,
            double scale, at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hk = k.size(1), L = k.size(2);
  const int64_t G = H / Hk;  // query heads per key/value head: heads h*G .. h*G+G-1 read head h
  const int64_t R = G * T;   // query rows per (row, key/value head)
  const float* qp = q.data_ptr<float>();
  const KV* kp = k.data_ptr<KV>();
  const KV* vp = v.data_ptr<KV>();
  const bool* mp = keep.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  // strides read once here: a Tensor's stride() in the loops below is a call, not a constant
  const int64_t kb_ = k.stride(0), kh_ = k.stride(1), kl_ = k.stride(2);
  const int64_t vb_ = v.stride(0), vh_ = v.stride(1), vl_ = v.stride(2);
  at::parallel_for(0, B * Hk, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> p(R * L), acc(R * D), mx(R), sum(R);
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / Hk, h = bh % Hk;
      const KV* kb = kp + b * kb_ + h * kh_;
      const KV* vb = vp + b * vb_ + h * vh_;
      const bool* m = mp + b * T * L;
      std::fill(mx.begin(), mx.end(), MASKED);
      // The row's masked columns before its first kept one are neither read nor scored: in a batch
      // whose rows joined with contexts of different lengths, the shorter rows' left padding is much
      // of the columns. From a multiple of 8, so that the scores' lanes, and the exponentials' sums
      // over the whole row (the skipped ones are exactly 0), are the same as reading every column.
      int64_t first = L;
      for (int64_t t = 0; t < T; ++t) {
        const bool* mt = m + t * L;
        first = std::min<int64_t>(first, std::find(mt, mt + L, true) - mt);
      }
      first = first == L ? 0 : first - first % 8;  // nothing kept: the uniform softmax over all L
      for (int64_t r = 0; r < R; ++r) std::fill(p.begin() + r * L, p.begin() + r * L + first, MASKED);
      int64_t l_done = first;  // keys scored by the vector path
#ifdef MARFT_AVX2
      if (D % 8 == 0) {
        // 8 keys at a time, each block of keys scored against all R query rows while it is in L1
        std::vector<float> top(R * 8, MASKED);  // each query row's largest score, per lane
        for (; l_done + 8 <= L; l_done += 8) {
          const KV* kr = kb + l_done * kl_;
          for (int64_t j = 0; j < G; ++j) {
            for (int64_t t = 0; t < T; ++t) {
              const int64_t r = j * T + t;
              const float* qr = qp + ((b * H + h * G + j) * T + t) * D;
              const __m256 sc = scores8(qr, kr, kl_, D, m + t * L + l_done, s, p.data() + r * L + l_done);
              _mm256_storeu_ps(&top[r * 8], _mm256_max_ps(_mm256_loadu_ps(&top[r * 8]), sc));
            }
          }
        }
        for (int64_t r = 0; r < R; ++r) mx[r] = *std::max_element(&top[r * 8], &top[r * 8] + 8);
      }
#endif
      // scores (the keys the vector path left): each key is read once, for all R query rows of its
      // group; row r = j * T + t
      for (int64_t l = l_done; l < L; ++l) {
        const KV* kr = kb + l * kl_;
        for (int64_t j = 0; j < G; ++j) {
          for (int64_t t = 0; t < T; ++t) {
            const int64_t r = j * T + t;
            const float* qr = qp + ((b * H + h * G + j) * T + t) * D;
            float a = 0.f;
#pragma omp simd reduction(+ : a)
            for (int64_t d = 0; d < D; ++d) a += qr[d] * to_f(kr[d]);
            a = m[t * L + l] ? a * s : MASKED;  // a select, not a branch: masks have holes anywhere
            p[r * L + l] = a;
            mx[r] = std::max(mx[r], a);
          }
        }
      }
      for (int64_t r = 0; r < R; ++r) sum[r] = marft::masked_exp(p.data() + r * L, L, mx[r]);
#ifdef MARFT_AVX2
      if (D % 64 == 0) {
        // weighted values, one query row at a time with its sums in registers (the row's values
        // stay in L2 between rows)
        for (int64_t r = 0; r < R; ++r)
          weighted64(p.data() + r * L + first, vb + first * vl_, vl_, L - first, D, acc.data() + r * D);
      } else
#endif
      {
        // weighted values: each value is read once, for all R rows
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t l = first; l < L; ++l) {
          const KV* vr = vb + l * vl_;
          for (int64_t r = 0; r < R; ++r) {
            const float w = p[r * L + l];
            float* ar = acc.data() + r * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) ar[d] += w * to_f(vr[d]);
          }
        }
      }
      for (int64_t j = 0; j < G; ++j) {
        for (int64_t t = 0; t < T; ++t) {
          const int64_t r = j * T + t;
          float* o = op + ((b * T + t) * H + h * G + j) * D;
          const float inv = 1.f / sum[r];
          for (int64_t d = 0; d < D; ++d) o[d] = acc[r * D + d] * inv;
        }
      }
    }
  });
}
}  // namespace
