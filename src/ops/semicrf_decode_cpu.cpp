// Semi-Markov CRF, CPU: Viterbi decoding (max semiring with backpointers)
// and the score of gold segmentations with its gradient.
//
// Segments encoding (B, T) i64: segments[b, t] = c when a segment of label c
// starts at position t, -1 for every other position (inside a segment, or at
// t >= L[b]). A segment runs to the next start (or to L[b]).
//
// Viterbi stores per position and label the best duration k (int32) and the
// best previous label (int32): O(T·C) backpointers, never T·K. All its
// arithmetic is f64; ties go to the smallest k, then the smallest label.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/graph_impl.hpp"
#include "ops/semicrf_cpu.hpp"
#include "ops/semicrf_math.hpp"

namespace ad::semicrf {

void check_segments(const char* op, const Args& a, const std::int64_t* seg) {
  check_lengths(op, a);
  const std::int64_t T = a.d.T, C = a.d.C, K = a.d.K;
  for (std::int64_t b = 0; b < a.d.B; ++b) {
    const std::int64_t* r = seg + b * T;
    const std::int64_t L = a.L[b];
    for (std::int64_t t = 0; t < T; ++t)
      if (r[t] < -1 || r[t] >= C)
        kernel_fail(op, fmt::format("segments[{}, {}] = {}: a label must be in 0..{} (or -1 inside a segment)", b, t,
                                    r[t], C - 1));
    if (r[0] < 0)
      kernel_fail(op, fmt::format("segments[{}, 0] = -1: no segment starts at position 0 (a gap)", b));
    std::int64_t start = 0;
    for (std::int64_t t = 1; t <= L; ++t) {
      if (t < L && r[t] < 0) continue;
      if (t - start > K)
        kernel_fail(op, fmt::format("segments[{}]: the segment at positions {}..{} has length {} > K = {}", b, start,
                                    t - 1, t - start, K));
      start = t;
    }
    for (std::int64_t t = L; t < T; ++t)
      if (r[t] >= 0)
        kernel_fail(op, fmt::format("segments[{}, {}] = {}: a segment starts at or beyond L[{}] = {}", b, t, r[t], b, L));
  }
}

namespace {

// Calls f(start, length, label, previous label or -1) for each segment of b.
template <class F> void for_segments(const Args& a, const std::int64_t* seg, std::int64_t b, F&& f) {
  for_each_segment(seg + b * a.d.T, a.L[b], f);
}

template <class E> struct Model {
  const Args& a;
  const E *S, *Tr, *D, *P;
  std::int64_t C;
  explicit Model(const Args& x)
      : a(x), S(static_cast<const E*>(x.S)), Tr(static_cast<const E*>(x.Tr)), D(static_cast<const E*>(x.D)),
        P(static_cast<const E*>(x.P)), C(x.d.C) {}
  double tr(std::int64_t k, std::int64_t cp, std::int64_t c) const {
    return static_cast<double>(a.d.general ? Tr[(k - 1) * C * C + cp * C + c] : Tr[cp * C + c]);
  }
  std::int64_t tr_index(std::int64_t k, std::int64_t cp, std::int64_t c) const {
    return a.d.general ? (k - 1) * C * C + cp * C + c : cp * C + c;
  }
};

template <class E> void score_impl(const Args& a, const std::int64_t* seg, E* out) {
  Model<E> m(a);
  const std::int64_t C = a.d.C, T = a.d.T;
  for (std::int64_t b = 0; b < a.d.B; ++b) {
    const E* S = m.S + b * (T + 1) * C;
    double total = 0;
    for_segments(a, seg, b, [&](std::int64_t s, std::int64_t k, std::int64_t c, std::int64_t prev) {
      total += segment_score(S + c, m.D + c, C, s, k);
      total += prev < 0 ? static_cast<double>(m.P[c]) : m.tr(k, prev, c);
    });
    out[b] = static_cast<E>(total);
  }
}

template <class E> void score_backward_impl(const Args& a, const std::int64_t* seg, const E* dscore, E* out) {
  Model<E> m(a);
  const std::int64_t C = a.d.C, T = a.d.T;
  const std::int64_t nS = a.d.B * (T + 1) * C, nTr = a.d.tr_numel(), nD = a.d.K * C;
  std::fill(out, out + nS + nTr + nD + C, E(0));
  E *dTr = out + nS, *dD = dTr + nTr, *dP = dD + nD;
  for (std::int64_t b = 0; b < a.d.B; ++b) {
    E* dS = out + b * (T + 1) * C;
    const E g = dscore[b];
    for_segments(a, seg, b, [&](std::int64_t s, std::int64_t k, std::int64_t c, std::int64_t prev) {
      dS[(s + k) * C + c] += g;
      dS[s * C + c] -= g;
      dD[(k - 1) * C + c] += g;
      if (prev < 0) dP[c] += g;
      else dTr[m.tr_index(k, prev, c)] += g;
    });
  }
}

// Viterbi for one sequence; fills r (T) with the segments encoding.
template <class E>
void viterbi_seq(const Model<E>& m, const detail::Layout& Y, char* lane, const double* Dt, std::int64_t b,
                 std::int64_t* r) {
  const Args& a = m.a;
  const std::int64_t C = a.d.C, T = a.d.T, ke = Y.ke, L = a.L[b];
  const E* S = m.S + b * (T + 1) * C;
  auto Sv = [&](std::int64_t t, std::int64_t c) { return static_cast<double>(S[t * C + c]); };
  double* ring = reinterpret_cast<double*>(lane + Y.ck_ring);
  auto* bk = reinterpret_cast<std::int32_t*>(lane + Y.bk);
  auto* bc = reinterpret_cast<std::int32_t*>(lane + Y.bc);
  double* row = reinterpret_cast<double*>(lane + Y.scr);
  double* tmp = row + C;
  if (!a.d.general) {
    // ring column c, reversed slots: Ã*[s,c] = max_c'(α*[s,c'] + Tr[c',c]) − S[s,c]
    auto slot = [&](std::int64_t s) { return ke - 1 - s % ke; };
    for (std::int64_t c = 0; c < C; ++c) ring[c * ke + slot(0)] = static_cast<double>(m.P[c]) - Sv(0, c);
    for (std::int64_t t = 1; t <= L; ++t) {
      std::int64_t w = std::min(ke, t), rr = (t - 1) % ke, p1 = std::min(w, rr + 1);
      for (std::int64_t c = 0; c < C; ++c) {
        const double* col = ring + c * ke;
        const double* dc = Dt + c * ke;
        double mx1 = detail::win_max(col + (ke - 1 - rr), dc, p1);
        double mx2 = w > p1 ? detail::win_max(col, dc + p1, w - p1) : kNegInf;
        double mx = std::max(mx1, mx2);
        std::int64_t best = 0;
        if (mx != kNegInf) {
          if (mx1 == mx) {
            for (std::int64_t i = 0; i < p1; ++i)
              if (col[ke - 1 - rr + i] + dc[i] == mx) { best = i + 1; break; }
          } else {
            for (std::int64_t i = 0; i < w - p1; ++i)
              if (col[i] + dc[p1 + i] == mx) { best = p1 + i + 1; break; }
          }
        }
        row[c] = mx == kNegInf ? kNegInf : Sv(t, c) + mx;
        bk[t * C + c] = static_cast<std::int32_t>(best);
      }
      if (t == L) break;
      for (std::int64_t c = 0; c < C; ++c) {
        double best = kNegInf;
        std::int32_t arg = 0;
        for (std::int64_t cp = 0; cp < C; ++cp) {
          double v = row[cp] + m.tr(1, cp, c);
          if (v > best) { best = v; arg = static_cast<std::int32_t>(cp); }
        }
        bc[t * C + c] = arg;
        ring[c * ke + slot(t)] = best - Sv(t, c);
      }
    }
  } else {
    // ring row per position: α*[s, ·] at slot s % ke
    for (std::int64_t t = 1; t <= L; ++t) {
      for (std::int64_t c = 0; c < C; ++c) {
        double best = kNegInf;
        std::int32_t bkk = 0, bcc = -1;
        for (std::int64_t k = 1; k <= std::min(ke, t); ++k) {
          std::int64_t s = t - k;
          double base = Sv(t, c) - Sv(s, c) + static_cast<double>(m.D[(k - 1) * C + c]);
          if (s == 0) {
            double v = base + static_cast<double>(m.P[c]);
            if (v > best) { best = v; bkk = static_cast<std::int32_t>(k); bcc = -1; }
            continue;
          }
          const double* pr = ring + (s % ke) * C;
          for (std::int64_t cp = 0; cp < C; ++cp) {
            double v = base + pr[cp] + m.tr(k, cp, c);
            if (v > best) { best = v; bkk = static_cast<std::int32_t>(k); bcc = static_cast<std::int32_t>(cp); }
          }
        }
        tmp[c] = best;
        bk[t * C + c] = bkk;
        bc[t * C + c] = bcc;
      }
      std::memcpy(ring + (t % ke) * C, tmp, static_cast<std::size_t>(C) * sizeof(double));
      std::memcpy(row, tmp, static_cast<std::size_t>(C) * sizeof(double));
    }
  }
  double best = kNegInf;
  std::int64_t c = 0;
  for (std::int64_t cc = 0; cc < C; ++cc)
    if (row[cc] > best) { best = row[cc]; c = cc; }
  std::fill(r, r + T, std::int64_t{-1});
  if (best == kNegInf) return;  // reported by the caller
  for (std::int64_t t = L; t > 0;) {
    std::int64_t k = bk[t * C + c], s = t - k;
    r[s] = c;
    if (s > 0) c = a.d.general ? bc[t * C + c] : bc[s * C + c];
    t = s;
  }
}

template <class E> void viterbi_impl(const Args& a, std::int64_t* out, void* ws, int threads) {
  Model<E> m(a);
  const detail::Layout Y = detail::make_layout(a.d, Pass::viterbi, threads);
  char* base = static_cast<char*>(ws);
  double* Dt = reinterpret_cast<double*>(base + Y.Dt);
  const std::int64_t C = a.d.C, ke = Y.ke, T = a.d.T;
  if (!a.d.general)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t k = 0; k < ke; ++k) Dt[c * ke + k] = static_cast<double>(m.D[k * C + c]);
  std::vector<char> none(static_cast<std::size_t>(a.d.B), 0);
  detail::run_threads(Y.lanes, [&](int lane) {
    char* lb = base + Y.shared_bytes + lane * Y.lane_bytes;
    for (std::int64_t b = lane; b < a.d.B; b += Y.lanes) {
      viterbi_seq(m, Y, lb, Dt, b, out + b * T);
      none[static_cast<std::size_t>(b)] = out[b * T] < 0;
    }
  });
  for (std::int64_t b = 0; b < a.d.B; ++b)
    if (none[static_cast<std::size_t>(b)])
      kernel_fail("semicrf_viterbi", fmt::format("sequence {} (L = {}) has no allowed segmentation (every one scores -inf)", b, a.L[b]));
}

}  // namespace

void score_cpu(const Args& a, const std::int64_t* seg, void* out) {
  check_segments("semicrf_score", a, seg);
  check_scores("semicrf_score", a);
  if (a.dtype == DType::f64) score_impl(a, seg, static_cast<double*>(out));
  else score_impl(a, seg, static_cast<float*>(out));
}
void score_backward_cpu(const Args& a, const std::int64_t* seg, const void* dscore, void* out) {
  check_segments("semicrf_score_backward", a, seg);
  check_scores("semicrf_score_backward", a);
  if (a.dtype == DType::f64) score_backward_impl(a, seg, static_cast<const double*>(dscore), static_cast<double*>(out));
  else score_backward_impl(a, seg, static_cast<const float*>(dscore), static_cast<float*>(out));
}
void viterbi_cpu(const Args& a, std::int64_t* out, void* ws, int threads) {
  check_lengths("semicrf_viterbi", a);
  check_scores("semicrf_viterbi", a);
  if (a.dtype == DType::f64) viterbi_impl<double>(a, out, ws, threads);
  else viterbi_impl<float>(a, out, ws, threads);
}

}  // namespace ad::semicrf
