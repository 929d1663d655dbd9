#pragma once
// Independent f64 references for the semi-Markov CRF tests: brute-force
// enumeration of every segmentation (small T), and a naive dynamic program
// that keeps the full α and β tables (larger T). Written from the model's
// definition, sharing no code with the kernels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace ad::test::crf {

inline constexpr double kNInf = -std::numeric_limits<double>::infinity();

// One model in f64, flat row-major arrays as the ops take them.
struct Model {
  std::int64_t B = 1, T = 1, K = 1, C = 1;
  bool general = false;  // Tr (K, C, C)
  std::vector<double> S, Tr, D, P;  // S (B, T+1, C)
  std::vector<std::int64_t> L;
  double s(std::int64_t b, std::int64_t t, std::int64_t c) const { return S[static_cast<std::size_t>((b * (T + 1) + t) * C + c)]; }
  double tr(std::int64_t k, std::int64_t cp, std::int64_t c) const {
    return general ? Tr[static_cast<std::size_t>((k - 1) * C * C + cp * C + c)] : Tr[static_cast<std::size_t>(cp * C + c)];
  }
  std::size_t tr_index(std::int64_t k, std::int64_t cp, std::int64_t c) const {
    return static_cast<std::size_t>(general ? (k - 1) * C * C + cp * C + c : cp * C + c);
  }
  double d(std::int64_t k, std::int64_t c) const { return D[static_cast<std::size_t>((k - 1) * C + c)]; }
  double seg(std::int64_t b, std::int64_t s0, std::int64_t k, std::int64_t c, std::int64_t prev) const {
    return this->s(b, s0 + k, c) - this->s(b, s0, c) + d(k, c) + (prev < 0 ? P[static_cast<std::size_t>(c)] : tr(k, prev, c));
  }
};

struct Seg {
  std::int64_t s, k, c;
};

// Calls f(segments, score) for every segmentation of sequence b.
inline void enumerate(const Model& m, std::int64_t b, const std::function<void(const std::vector<Seg>&, double)>& f) {
  std::vector<Seg> cur;
  const std::int64_t L = m.L[static_cast<std::size_t>(b)];
  std::function<void(std::int64_t, std::int64_t, double)> rec = [&](std::int64_t pos, std::int64_t prev, double sc) {
    if (pos == L) { f(cur, sc); return; }
    for (std::int64_t k = 1; k <= std::min(m.K, L - pos); ++k)
      for (std::int64_t c = 0; c < m.C; ++c) {
        cur.push_back({pos, k, c});
        rec(pos + k, c, sc + m.seg(b, pos, k, c, prev));
        cur.pop_back();
      }
  };
  rec(0, -1, 0.0);
}

inline double lse(const std::vector<double>& v) {
  double mx = kNInf;
  for (double x : v) mx = std::max(mx, x);
  if (mx == kNInf) return kNInf;
  double s = 0;
  for (double x : v) s += std::exp(x - mx);
  return mx + std::log(s);
}

// Everything the ops compute, for all sequences.
struct Result {
  std::vector<double> logz, best;           // (B)
  std::vector<std::vector<Seg>> argmax;     // best segmentation per sequence
  std::vector<double> marg;                 // (B, T, C)
  std::vector<double> dS, dTr, dD, dP;      // gradients of sum_b w[b] logz[b]
};

inline Result brute(const Model& m, const std::vector<double>& w) {
  Result r;
  const auto B = static_cast<std::size_t>(m.B);
  r.logz.assign(B, kNInf);
  r.best.assign(B, kNInf);
  r.argmax.resize(B);
  r.marg.assign(static_cast<std::size_t>(m.B * m.T * m.C), 0.0);
  r.dS.assign(m.S.size(), 0.0);
  r.dTr.assign(m.Tr.size(), 0.0);
  r.dD.assign(m.D.size(), 0.0);
  r.dP.assign(m.P.size(), 0.0);
  for (std::int64_t b = 0; b < m.B; ++b) {
    std::vector<double> scores;
    enumerate(m, b, [&](const std::vector<Seg>& segs, double sc) {
      scores.push_back(sc);
      if (sc > r.best[static_cast<std::size_t>(b)]) { r.best[static_cast<std::size_t>(b)] = sc; r.argmax[static_cast<std::size_t>(b)] = segs; }
    });
    double z = lse(scores);
    r.logz[static_cast<std::size_t>(b)] = z;
    if (z == kNInf) continue;
    double wb = w[static_cast<std::size_t>(b)];
    enumerate(m, b, [&](const std::vector<Seg>& segs, double sc) {
      if (sc == kNInf) return;
      double p = std::exp(sc - z);
      std::int64_t prev = -1;
      for (const Seg& g : segs) {
        for (std::int64_t t = g.s; t < g.s + g.k; ++t) r.marg[static_cast<std::size_t>((b * m.T + t) * m.C + g.c)] += p;
        r.dS[static_cast<std::size_t>((b * (m.T + 1) + g.s + g.k) * m.C + g.c)] += wb * p;
        r.dS[static_cast<std::size_t>((b * (m.T + 1) + g.s) * m.C + g.c)] -= wb * p;
        r.dD[static_cast<std::size_t>((g.k - 1) * m.C + g.c)] += wb * p;
        if (prev < 0) r.dP[static_cast<std::size_t>(g.c)] += wb * p;
        else r.dTr[m.tr_index(g.k, prev, g.c)] += wb * p;
        prev = g.c;
      }
    });
  }
  return r;
}

// Naive DP with full α / β tables, f64, O(T·K·C²): logZ, marginals, gradients.
inline Result naive(const Model& m, const std::vector<double>& w) {
  Result r;
  const std::int64_t T = m.T, C = m.C;
  r.logz.assign(static_cast<std::size_t>(m.B), kNInf);
  r.marg.assign(static_cast<std::size_t>(m.B * T * C), 0.0);
  r.dS.assign(m.S.size(), 0.0);
  r.dTr.assign(m.Tr.size(), 0.0);
  r.dD.assign(m.D.size(), 0.0);
  r.dP.assign(m.P.size(), 0.0);
  for (std::int64_t b = 0; b < m.B; ++b) {
    const std::int64_t L = m.L[static_cast<std::size_t>(b)];
    std::vector<std::vector<double>> al(static_cast<std::size_t>(L + 1), std::vector<double>(static_cast<std::size_t>(C), kNInf)),
        be = al;
    // incoming score of a segment (s, k, c): P at s = 0, else lse_c' α[s,c'] + Tr
    auto in = [&](std::int64_t s, std::int64_t k, std::int64_t c) {
      if (s == 0) return m.P[static_cast<std::size_t>(c)];
      std::vector<double> v;
      for (std::int64_t cp = 0; cp < C; ++cp) v.push_back(al[static_cast<std::size_t>(s)][static_cast<std::size_t>(cp)] + m.tr(k, cp, c));
      return lse(v);
    };
    for (std::int64_t t = 1; t <= L; ++t)
      for (std::int64_t c = 0; c < C; ++c) {
        std::vector<double> v;
        for (std::int64_t k = 1; k <= std::min(m.K, t); ++k)
          v.push_back(m.s(b, t, c) - m.s(b, t - k, c) + m.d(k, c) + in(t - k, k, c));
        al[static_cast<std::size_t>(t)][static_cast<std::size_t>(c)] = lse(v);
      }
    double z = lse(al[static_cast<std::size_t>(L)]);
    r.logz[static_cast<std::size_t>(b)] = z;
    if (z == kNInf) continue;
    for (std::int64_t c = 0; c < C; ++c) be[static_cast<std::size_t>(L)][static_cast<std::size_t>(c)] = 0;
    for (std::int64_t s = L - 1; s >= 1; --s)
      for (std::int64_t cp = 0; cp < C; ++cp) {
        std::vector<double> v;
        for (std::int64_t k = 1; k <= std::min(m.K, L - s); ++k)
          for (std::int64_t c = 0; c < C; ++c)
            v.push_back(m.tr(k, cp, c) + m.s(b, s + k, c) - m.s(b, s, c) + m.d(k, c) + be[static_cast<std::size_t>(s + k)][static_cast<std::size_t>(c)]);
        be[static_cast<std::size_t>(s)][static_cast<std::size_t>(cp)] = lse(v);
      }
    double wb = w[static_cast<std::size_t>(b)];
    for (std::int64_t s = 0; s < L; ++s)
      for (std::int64_t k = 1; k <= std::min(m.K, L - s); ++k)
        for (std::int64_t c = 0; c < C; ++c) {
          double tail = m.s(b, s + k, c) - m.s(b, s, c) + m.d(k, c) + be[static_cast<std::size_t>(s + k)][static_cast<std::size_t>(c)] - z;
          double mu = 0;
          if (s == 0) {
            double x = m.P[static_cast<std::size_t>(c)] + tail;
            mu = x == kNInf ? 0 : std::exp(x);
            r.dP[static_cast<std::size_t>(c)] += wb * mu;
          } else {
            for (std::int64_t cp = 0; cp < C; ++cp) {
              double x = al[static_cast<std::size_t>(s)][static_cast<std::size_t>(cp)] + m.tr(k, cp, c) + tail;
              double p = x == kNInf ? 0 : std::exp(x);
              r.dTr[m.tr_index(k, cp, c)] += wb * p;
              mu += p;
            }
          }
          r.dD[static_cast<std::size_t>((k - 1) * C + c)] += wb * mu;
          r.dS[static_cast<std::size_t>((b * (T + 1) + s + k) * C + c)] += wb * mu;
          r.dS[static_cast<std::size_t>((b * (T + 1) + s) * C + c)] -= wb * mu;
          for (std::int64_t t = s; t < s + k; ++t) r.marg[static_cast<std::size_t>((b * T + t) * C + c)] += mu;
        }
  }
  return r;
}

}  // namespace ad::test::crf
