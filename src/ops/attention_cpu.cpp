// CPU kernels of attention: tiles of br query rows x bc keys, score and
// output products through OpenBLAS (sgemm/dgemm on tiles), the online
// softmax and the backward's dS as vectorisable row loops over the math of
// attention_math.hpp. Parallel over independent (batch, head) units with
// std::thread; every unit is computed by one thread in a fixed order, so the
// results are the same bits for any thread count.
#include "ops/attention_cpu.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/vec.hpp"
#include "ad/dtype.hpp"
#include "ops/attention_math.hpp"
#include "ops/parallel.hpp"

namespace ad::attn {

namespace {

// C = alpha op(A) op(B) + beta C, row-major, leading dimensions given.
template <class T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  auto i = [](std::int64_t x) { return static_cast<int>(x); };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, TA, TB, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  else
    cblas_dgemm(CblasRowMajor, TA, TB, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
}

// The row loops below (the O(N^2) non-GEMM work) are compiled twice on
// x86-64, for AVX2 and for the baseline, and picked at load time. Without
// -ffp-contract (ISO C++ mode) both do the same IEEE operations in the same
// order: identical bits whichever runs.
#define AD_ATTN_CLONES AD_VEC __attribute__((flatten))

// Row reductions in 16 fixed lanes: vectorisable without reassociating
// (-ffast-math is not used), and the same order on every run.
constexpr int kLanes = 16;

template <class T> AD_HD T max_of(T a, T b) { return a > b ? a : b; }
AD_HD float max_of(float a, float b) { return math::select(a > b, a, b); }  // branch-free: vectorises

template <class T> T row_max_t(const T* x, std::int64_t n) {
  T acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = -std::numeric_limits<T>::infinity();
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = max_of(x[i + l], acc[l]);
  for (; i < n; ++i) acc[0] = max_of(x[i], acc[0]);
  T m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = max_of(acc[l], m);
  return m;
}

template <class T> T lane_sum(const T* x, std::int64_t n) {
  T acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l];
  for (; i < n; ++i) acc[0] += x[i];
  T s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

template <class T> T lane_dot(const T* x, const T* y, std::int64_t n) {
  T acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l] * y[i + l];
  for (; i < n; ++i) acc[0] += x[i] * y[i];
  T s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// Forward row step: s[0..n) <- e^{s - m}, s[n..cb) <- 0; returns the sum of s[0..n).
template <class T> T exp_shift_t(T* s, std::int64_t n, std::int64_t cb, T m) {
  for (std::int64_t c = 0; c < n; ++c) s[c] = math::exp_(s[c] - m);
  for (std::int64_t c = n; c < cb; ++c) s[c] = T(0);
  return lane_sum(s, n);
}
// Backward row step: s[0..n) <- P = e^{s - lse}, s[n..cb) <- 0.
template <class T> void probs_t(T* s, std::int64_t n, std::int64_t cb, T lse) {
  for (std::int64_t c = 0; c < n; ++c) s[c] = prob(s[c], lse);
  for (std::int64_t c = n; c < cb; ++c) s[c] = T(0);
}
template <class T> void dscores_t(T* p, const T* dp, std::int64_t cb, T dd) {
  for (std::int64_t c = 0; c < cb; ++c) p[c] = dscore(p[c], dp[c], dd);
}

// f32: the multi-versioned entry points; f64: the templates as they are.
#if defined(__GNUC__) && !defined(__clang__)
// The max over 16 lanes written with GCC vector types: the auto-vectoriser
// leaves the branch-free select scalar here. Max is exact, so any lane
// order gives the same value.
typedef float F32x8 __attribute__((vector_size(32)));
AD_ATTN_CLONES float row_max(const float* x, std::int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  F32x8 a = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf}, b = a;
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    F32x8 u, w;
    std::memcpy(&u, x + i, sizeof u);
    std::memcpy(&w, x + i + 8, sizeof w);
    a = u > a ? u : a;
    b = w > b ? w : b;
  }
  a = b > a ? b : a;
  float m = ninf;
  for (int l = 0; l < 8; ++l) m = a[l] > m ? a[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}
#else
float row_max(const float* x, std::int64_t n) { return row_max_t(x, n); }
#endif
AD_ATTN_CLONES float exp_shift(float* s, std::int64_t n, std::int64_t cb, float m) { return exp_shift_t(s, n, cb, m); }
AD_ATTN_CLONES void probs(float* s, std::int64_t n, std::int64_t cb, float lse) { probs_t(s, n, cb, lse); }
AD_ATTN_CLONES void dscores(float* p, const float* dp, std::int64_t cb, float dd) { dscores_t(p, dp, cb, dd); }
double row_max(const double* x, std::int64_t n) { return row_max_t(x, n); }
double exp_shift(double* s, std::int64_t n, std::int64_t cb, double m) { return exp_shift_t(s, n, cb, m); }
void probs(double* s, std::int64_t n, std::int64_t cb, double lse) { probs_t(s, n, cb, lse); }
void dscores(double* p, const double* dp, std::int64_t cb, double dd) { dscores_t(p, dp, cb, dd); }

template <class T> void scale_row(T* x, std::int64_t n, T a) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= a;
}

// Runs f(unit, thread) for unit in [0, units) on `threads` threads (the
// caller's included), handing units out in order.
template <class F> void run_units(std::int64_t units, int threads, F&& f) {
  if (threads <= 1 || units <= 1) {
    for (std::int64_t u = 0; u < units; ++u) f(u, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  parallel::team(threads, [&](int t) {
    for (std::int64_t u = next.fetch_add(1); u < units; u = next.fetch_add(1)) f(u, t);
  });
}

// Per-thread scratch, in elements, rounded up to 64 bytes.
std::int64_t round_up(std::int64_t elems, std::size_t elem) {
  std::int64_t per_line = 64 / static_cast<std::int64_t>(elem);
  return (elems + per_line - 1) / per_line * per_line;
}
std::int64_t fwd_scratch(const Dims& dm, std::size_t elem) {
  Tiles t = tiles_for(dm.d);
  return round_up(t.br * t.bc + 2 * t.br, elem);
}
std::int64_t bwd_scratch(const Dims& dm, std::size_t elem) {
  Tiles t = tiles_for(dm.d);
  return round_up(2 * t.br * t.bc + dm.Nq, elem);
}

}  // namespace

Tiles tiles_for(std::int64_t d) {
  // br x bc x d <= 64 x 64 x 64: OpenBLAS runs such products on the calling
  // thread (its threshold for threading is m n k > 2^18).
  const std::int64_t br = 64;
  std::int64_t bc = d > 0 ? 4096 / d : 64;
  bc = std::clamp<std::int64_t>(bc, 16, 64);
  return {br, bc};
}

double visible_pairs(const Dims& dm) {
  if (!dm.causal) return static_cast<double>(dm.Nq) * static_cast<double>(dm.Nk);
  double s = 0;  // sum over rows of key_end(i) with len = Nk
  const std::int64_t off = dm.Nk - dm.Nq;
  // rows with i + off + 1 <= 0 see nothing; rows with i + off + 1 >= Nk see all
  std::int64_t first = std::max<std::int64_t>(0, -off);                       // first row seeing >= 1 key
  std::int64_t full = std::clamp<std::int64_t>(dm.Nk - off - 1, 0, dm.Nq);   // first row seeing all keys
  first = std::min(first, full);
  // rows [first, full): key_end = i + off + 1, an arithmetic series
  double a = static_cast<double>(first + off + 1), b = static_cast<double>(full - 1 + off + 1);
  s += static_cast<double>(full - first) * (a + b) / 2;
  s += static_cast<double>(dm.Nq - full) * static_cast<double>(dm.Nk);
  return s;
}

int threads_for(const Dims& dm, bool backward) {
  if (dm.threads > 0) return dm.threads;
  std::int64_t units = backward ? dm.B * dm.Hkv : dm.B * dm.H;
  double work = visible_pairs(dm) * static_cast<double>(dm.B * dm.H * dm.d);
  if (work < double(1 << 20) || units <= 1) return 1;  // a thread costs more than it saves
  unsigned hw = std::thread::hardware_concurrency();
  std::int64_t t = std::min<std::int64_t>(hw ? hw : 1, units);
  return static_cast<int>(std::clamp<std::int64_t>(t, 1, 256));
}

namespace {
// f32 elements of the half entry points' copies, each rounded up to 64 bytes:
// forward q, k, v, o; backward q, k, v, o, dout, dq, dk, dv.
std::int64_t half_copies(const Dims& dm, bool backward) {
  const std::int64_t nq = round_up(dm.B * dm.H * dm.Nq * dm.d, 4), nk = round_up(dm.B * dm.Hkv * dm.Nk * dm.d, 4);
  return backward ? 4 * nq + 4 * nk : 2 * nq + 2 * nk;
}
}  // namespace

std::int64_t forward_workspace_bytes(const Dims& dm, std::size_t elem) {
  if (elem == 2) return half_copies(dm, false) * 4 + forward_workspace_bytes(dm, 4);
  return threads_for(dm, false) * fwd_scratch(dm, elem) * static_cast<std::int64_t>(elem);
}
std::int64_t backward_workspace_bytes(const Dims& dm, std::size_t elem) {
  if (elem == 2)  // the copies, the recomputed output's log-sum-exp, then either f32 kernel's scratch
    return (half_copies(dm, true) + round_up(dm.B * dm.H * dm.Nq, 4)) * 4 +
           std::max(backward_workspace_bytes(dm, 4), forward_workspace_bytes(dm, 4));
  return threads_for(dm, true) * bwd_scratch(dm, elem) * static_cast<std::int64_t>(elem);
}

template <class T>
void forward_cpu(const Dims& dm, const T* q, const T* k, const T* v, const std::int64_t* lens, T* o, T* lse, void* ws) {
  const Tiles t = tiles_for(dm.d);
  const std::int64_t d = dm.d, Nq = dm.Nq, Nk = dm.Nk, G = dm.group(), per = fwd_scratch(dm, sizeof(T));
  const T scale = static_cast<T>(dm.scale);
  run_units(dm.B * dm.H, threads_for(dm, false), [&](std::int64_t u, int th) {
    T* S = static_cast<T*>(ws) + th * per;  // [br, bc] scores, then probabilities
    T* m = S + t.br * t.bc;                 // running max per row
    T* l = m + t.br;                        // running sum per row
    const std::int64_t b = u / dm.H, h = u % dm.H, kv = b * dm.Hkv + h / G;
    const T *Q = q + u * Nq * d, *K = k + kv * Nk * d, *V = v + kv * Nk * d;
    T *O = o + u * Nq * d, *L = lse + u * Nq;
    const std::int64_t len = lens ? lens[b] : Nk;
    for (std::int64_t i0 = 0; i0 < Nq; i0 += t.br) {
      const std::int64_t rb = std::min(t.br, Nq - i0);
      T* Oi = O + i0 * d;
      std::fill(Oi, Oi + rb * d, T(0));
      std::fill(m, m + rb, -std::numeric_limits<T>::infinity());
      std::fill(l, l + rb, T(0));
      const std::int64_t e_lo = key_end(i0, Nq, Nk, len, dm.causal), e_hi = key_end(i0 + rb - 1, Nq, Nk, len, dm.causal);
      for (std::int64_t j0 = 0; j0 < e_hi; j0 += t.bc) {
        // no key at or past e_hi (what the block's last row sees) is read: a NaN
        // or inf in padding past the key length never meets a zero probability
        // (0 * NaN = NaN). Inside a tile that the causal bound cuts, a row still
        // multiplies the keys only later rows see by 0, as a dense masked
        // softmax would (attention.hpp)
        const std::int64_t cb = std::min(t.bc, e_hi - j0);
        gemm(false, true, rb, cb, d, scale, Q + i0 * d, d, K + j0 * d, d, T(0), S, cb);  // S = scale Q_i K_j^T
        const bool full = j0 + cb <= e_lo;
        for (std::int64_t r = 0; r < rb; ++r) {
          T* s = S + r * cb;
          const std::int64_t n = full ? cb : visible_in_tile(key_end(i0 + r, Nq, Nk, len, dm.causal), j0, cb);
          if (n == 0) { std::fill(s, s + cb, T(0)); continue; }
          const T mn = online_max(m[r], row_max(s, n));
          const T a = online_rescale(m[r], mn);
          l[r] = l[r] * a + exp_shift(s, n, cb, mn);
          m[r] = mn;
          if (a != T(1)) scale_row(Oi + r * d, d, a);
        }
        gemm(false, false, rb, d, cb, T(1), S, cb, V + j0 * d, d, T(1), Oi, d);  // O_i += P V_j
      }
      for (std::int64_t r = 0; r < rb; ++r) {
        scale_row(Oi + r * d, d, finish_inv(l[r]));
        L[i0 + r] = finish_lse(m[r], l[r]);
      }
    }
  });
}

template <class T>
void backward_cpu(const Dims& dm, const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
                  const T* dlse, const std::int64_t* lens, T* dq, T* dk, T* dv, void* ws) {
  const Tiles t = tiles_for(dm.d);
  const std::int64_t d = dm.d, Nq = dm.Nq, Nk = dm.Nk, G = dm.group(), per = bwd_scratch(dm, sizeof(T));
  const T scale = static_cast<T>(dm.scale);
  run_units(dm.B * dm.Hkv, threads_for(dm, true), [&](std::int64_t u, int th) {
    T* S = static_cast<T*>(ws) + th * per;  // [br, bc] scores -> P -> dS
    T* dP = S + t.br * t.bc;                // [br, bc]
    T* D = dP + t.br * t.bc;                // [Nq] rowsum(dO o O) - dlse
    const std::int64_t b = u / dm.Hkv;
    const T *K = k + u * Nk * d, *V = v + u * Nk * d;
    T *dK = dk + u * Nk * d, *dV = dv + u * Nk * d;
    std::fill(dK, dK + Nk * d, T(0));
    std::fill(dV, dV + Nk * d, T(0));
    const std::int64_t len = lens ? lens[b] : Nk;
    const std::int64_t e_max = Nq > 0 ? key_end(Nq - 1, Nq, Nk, len, dm.causal) : 0;
    for (std::int64_t g = 0; g < G; ++g) {  // the query heads sharing this key/value head, in order
      const std::int64_t hu = b * dm.H + (u % dm.Hkv) * G + g;
      const T *Q = q + hu * Nq * d, *O = o + hu * Nq * d, *dO = dout + hu * Nq * d, *L = lse + hu * Nq;
      T* dQ = dq + hu * Nq * d;
      std::fill(dQ, dQ + Nq * d, T(0));
      for (std::int64_t r = 0; r < Nq; ++r)
        D[r] = lane_dot(dO + r * d, O + r * d, d) - (dlse ? dlse[hu * Nq + r] : T(0));
      for (std::int64_t j0 = 0; j0 < e_max; j0 += t.bc) {
        const std::int64_t cb_all = std::min(t.bc, e_max - j0);
        // rows before i_first see no key of this tile (causal: key_end(i) <= j0)
        const std::int64_t i_first = dm.causal ? std::clamp<std::int64_t>(j0 - (Nk - Nq), 0, Nq) : 0;
        for (std::int64_t i0 = i_first; i0 < Nq; i0 += t.br) {
          const std::int64_t rb = std::min(t.br, Nq - i0);
          // columns no row of this block sees are left out (as in the forward)
          const std::int64_t cb = std::min(cb_all, key_end(i0 + rb - 1, Nq, Nk, len, dm.causal) - j0);
          if (cb <= 0) continue;
          const bool full = j0 + cb <= key_end(i0, Nq, Nk, len, dm.causal);
          gemm(false, true, rb, cb, d, scale, Q + i0 * d, d, K + j0 * d, d, T(0), S, cb);  // S = scale Q_i K_j^T
          for (std::int64_t r = 0; r < rb; ++r) {
            const std::int64_t n = full ? cb : visible_in_tile(key_end(i0 + r, Nq, Nk, len, dm.causal), j0, cb);
            probs(S + r * cb, n, cb, L[i0 + r]);
          }
          gemm(true, false, cb, d, rb, T(1), S, cb, dO + i0 * d, d, T(1), dV + j0 * d, d);  // dV_j += P^T dO_i
          gemm(false, true, rb, cb, d, T(1), dO + i0 * d, d, V + j0 * d, d, T(0), dP, cb);   // dP = dO_i V_j^T
          for (std::int64_t r = 0; r < rb; ++r) dscores(S + r * cb, dP + r * cb, cb, D[i0 + r]);
          gemm(false, false, rb, d, cb, scale, S, cb, K + j0 * d, d, T(1), dQ + i0 * d, d);  // dQ_i += s dS K_j
          gemm(true, false, cb, d, rb, scale, S, cb, Q + i0 * d, d, T(1), dK + j0 * d, d);   // dK_j += s dS^T Q_i
        }
      }
    }
  });
}

namespace {
void widen(bool bf16, const std::uint16_t* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16 ? bf16_to_f32(x[i]) : f16_to_f32(x[i]);
}
void narrow(bool bf16, const float* x, std::uint16_t* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
}
// Takes f32 regions of n elements, each rounded up to 64 bytes, from a workspace.
struct Take {
  float* p;
  float* operator()(std::int64_t n) {
    float* r = p;
    p += round_up(n, 4);
    return r;
  }
};
}  // namespace

void forward_cpu_half(const Dims& dm, bool bf16, const std::uint16_t* q, const std::uint16_t* k,
                      const std::uint16_t* v, const std::int64_t* lens, std::uint16_t* o, float* lse, void* ws) {
  const std::int64_t nq = dm.B * dm.H * dm.Nq * dm.d, nk = dm.B * dm.Hkv * dm.Nk * dm.d;
  Take take{static_cast<float*>(ws)};
  float *q32 = take(nq), *k32 = take(nk), *v32 = take(nk), *o32 = take(nq);
  widen(bf16, q, q32, nq);
  widen(bf16, k, k32, nk);
  widen(bf16, v, v32, nk);
  forward_cpu<float>(dm, q32, k32, v32, lens, o32, lse, take.p);
  narrow(bf16, o32, o, nq);
}

void backward_cpu_half(const Dims& dm, bool bf16, const std::uint16_t* q, const std::uint16_t* k,
                       const std::uint16_t* v, const std::uint16_t* o, const float* lse, const std::uint16_t* dout,
                       const float* dlse, const std::int64_t* lens, std::uint16_t* dq, std::uint16_t* dk,
                       std::uint16_t* dv, void* ws) {
  const std::int64_t nq = dm.B * dm.H * dm.Nq * dm.d, nk = dm.B * dm.Hkv * dm.Nk * dm.d;
  Take take{static_cast<float*>(ws)};
  float *q32 = take(nq), *k32 = take(nk), *v32 = take(nk), *o32 = take(nq), *do32 = take(nq);
  float *dq32 = take(nq), *dk32 = take(nk), *dv32 = take(nk), *lse32 = take(dm.B * dm.H * dm.Nq);
  widen(bf16, q, q32, nq);
  widen(bf16, k, k32, nk);
  widen(bf16, v, v32, nk);
  // the output in f32 again, not o widened: the backward's D = dO . O cancels
  // against dP where the softmax is peaked, and o's rounding (u |O|) would
  // swamp the gradients there (tens of u of bf16 in dq and dk). Same kernel,
  // same inputs: the same bits as the forward's f32 output (and lse).
  (void)o;
  forward_cpu<float>(dm, q32, k32, v32, lens, o32, lse32, take.p);
  widen(bf16, dout, do32, nq);
  backward_cpu<float>(dm, q32, k32, v32, o32, lse, do32, dlse, lens, dq32, dk32, dv32, take.p);
  narrow(bf16, dq32, dq, nq);
  narrow(bf16, dk32, dk, nk);
  narrow(bf16, dv32, dv, nk);
}

template void forward_cpu<float>(const Dims&, const float*, const float*, const float*, const std::int64_t*, float*,
                                 float*, void*);
template void forward_cpu<double>(const Dims&, const double*, const double*, const double*, const std::int64_t*,
                                  double*, double*, void*);
template void backward_cpu<float>(const Dims&, const float*, const float*, const float*, const float*, const float*,
                                  const float*, const float*, const std::int64_t*, float*, float*, float*, void*);
template void backward_cpu<double>(const Dims&, const double*, const double*, const double*, const double*,
                                   const double*, const double*, const double*, const std::int64_t*, double*, double*,
                                   double*, void*);

}  // namespace ad::attn
