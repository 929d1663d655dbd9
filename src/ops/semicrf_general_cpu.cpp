// Semi-Markov CRF, CPU, general path: transitions Tr (K, C, C) depend on the
// duration of the segment they lead into, so the transition logsumexp cannot
// be shared across k and every position costs O(K·C²):
//   α[t,c] = lse_{k} ( S[t,c] − S[t−k,c] + D[k−1,c] + [t−k = 0 ? P[c] : lse_c' (α[t−k,c'] + Tr[k−1,c',c])] )
//   β[s,c'] = lse_{k,c} ( Tr[k−1,c',c] + S[s+k,c] − S[s,c] + D[k−1,c] + β[s+k,c] ),  β[L,·] = 0.
// All arithmetic is f64 (the rings too); the checkpoint scheme is the fast
// path's (α ring every I positions, intervals walked last to first). One
// thread per sequence, sequences in parallel; parameter gradients are added
// in batch order, so results do not depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/graph_impl.hpp"
#include "ops/semicrf_cpu.hpp"
#include "ops/semicrf_math.hpp"

namespace ad::semicrf {

namespace {

template <class E> struct GenSeq {
  const Args& a;
  const detail::Layout& Y;
  char* lane;
  std::int64_t C, ke, I, L = 0;
  const E *S = nullptr, *Tr, *D, *P;
  double g = 1, logz = 0;

  template <class U> U* at(std::int64_t off) const { return reinterpret_cast<U*>(lane + off); }
  double* ck_ring(std::int64_t j) const { return at<double>(Y.ck_ring + j * Y.ck_ring_stride); }
  double* ival() const { return at<double>(Y.ival); }
  double* bring() const { return at<double>(Y.bring); }
  double* gD() const { return at<double>(Y.gD); }
  double* gTr() const { return at<double>(Y.gTr); }
  double* gP() const { return at<double>(Y.gP); }
  double* scr() const { return at<double>(Y.scr); }
  double Sv(std::int64_t t, std::int64_t c) const { return static_cast<double>(S[t * C + c]); }
  double Trv(std::int64_t k, std::int64_t cp, std::int64_t c) const {
    return static_cast<double>(Tr[(k - 1) * C * C + cp * C + c]);
  }

  // α[t, ·] (t >= 1) from the ring holding α[t−ke..t−1] (slot s % ke).
  void alpha_at(const double* ring, std::int64_t t, double* row) const {
    for (std::int64_t c = 0; c < C; ++c) {
      LseAcc acc;
      for (std::int64_t k = 1; k <= std::min(ke, t); ++k) {
        std::int64_t s = t - k;
        double inner;
        if (s == 0) inner = static_cast<double>(P[c]);
        else {
          LseAcc in;
          const double* r = ring + (s % ke) * C;
          for (std::int64_t cp = 0; cp < C; ++cp) in.add(r[cp] + Trv(k, cp, c));
          inner = in.value();
        }
        if (inner == kNegInf) continue;
        acc.add(Sv(t, c) - Sv(s, c) + static_cast<double>(D[(k - 1) * C + c]) + inner);
      }
      row[c] = acc.value();
    }
  }
  double forward(double* ring, bool store, std::int64_t nck, std::int64_t ival_from) {
    double* row = scr();
    if (ival_from == 0) std::fill(ival(), ival() + C, kNegInf);
    for (std::int64_t t = 1; t <= L; ++t) {
      alpha_at(ring, t, row);
      std::memcpy(ring + (t % ke) * C, row, static_cast<std::size_t>(C) * sizeof(double));
      if (store && t % I == 0 && t / I < nck)
        std::memcpy(ck_ring(t / I - 1), ring, static_cast<std::size_t>(ke * C) * sizeof(double));
      if (ival_from >= 0 && t >= ival_from)
        std::memcpy(ival() + (t - ival_from) * C, row, static_cast<std::size_t>(C) * sizeof(double));
    }
    LseAcc z;
    for (std::int64_t c = 0; c < C; ++c) z.add(row[c]);
    return z.value();
  }

  void backward(bool grads, E* dS, E* marg) {
    const std::int64_t nck = checkpoints(L, I), nint = nck + 1;
    double* live = ck_ring(nck >= 1 ? nck - 1 : 0);
    logz = forward(live, true, nck, nck * I);
    if (!std::isfinite(logz) || g == 0) {
      for (std::int64_t s = 0; s <= L; ++s)
        for (std::int64_t c = 0; c < C; ++c) {
          if (dS) dS[s * C + c] = E(0);
          if (marg && s < L) marg[s * C + c] = E(0);
        }
      return;
    }
    double *row = scr(), *sm = scr() + C, *run = scr() + 2 * C;
    LseAcc* bacc = reinterpret_cast<LseAcc*>(scr() + 3 * C);  // C accumulators (2 doubles each)
    std::fill(run, run + C, 0.0);
    for (std::int64_t j = nint - 1; j >= 0; --j) {
      const std::int64_t a0 = j * I, e0 = std::min(a0 + I, L + 1);
      if (j < nint - 1) {
        double* ring = ck_ring(j >= 1 ? j - 1 : 0);
        if (j >= 1) std::memcpy(ival(), ring + (a0 % ke) * C, static_cast<std::size_t>(C) * sizeof(double));
        else std::fill(ival(), ival() + C, kNegInf);
        for (std::int64_t t = a0 + 1; t < e0; ++t) {
          alpha_at(ring, t, row);
          std::memcpy(ring + (t % ke) * C, row, static_cast<std::size_t>(C) * sizeof(double));
          std::memcpy(ival() + (t - a0) * C, row, static_cast<std::size_t>(C) * sizeof(double));
        }
      }
      for (std::int64_t s = e0 - 1; s >= a0; --s) {
        const double* al = ival() + (s - a0) * C;
        double* br = bring() + (s % ke) * C;
        if (s == L) {
          for (std::int64_t c = 0; c < C; ++c) {
            double en = al[c] != kNegInf ? std::exp(al[c] - logz) : 0.0;
            if (dS) dS[L * C + c] = static_cast<E>(g * en);
            run[c] = en;
          }
          std::fill(br, br + C, 0.0);
          continue;
        }
        std::fill(sm, sm + C, 0.0);
        for (std::int64_t c = 0; c < C; ++c) bacc[c] = LseAcc{};
        for (std::int64_t k = 1; k <= std::min(ke, L - s); ++k) {
          const double* be = bring() + ((s + k) % ke) * C;
          for (std::int64_t c = 0; c < C; ++c) {
            double G = Sv(s + k, c) - Sv(s, c) + static_cast<double>(D[(k - 1) * C + c]) + be[c];
            if (G == kNegInf) continue;
            double mu = 0;
            if (s == 0) {
              double x = static_cast<double>(P[c]) + G - logz;
              mu = x == kNegInf ? 0.0 : std::exp(x);
            } else {
              for (std::int64_t cp = 0; cp < C; ++cp) {
                double x = Trv(k, cp, c) + G;
                bacc[cp].add(x);
                if (al[cp] == kNegInf || x == kNegInf) continue;
                double w = std::exp(al[cp] + x - logz);
                if (grads) gTr()[(k - 1) * C * C + cp * C + c] += g * w;
                mu += w;
              }
            }
            sm[c] += mu;
            if (grads) gD()[(k - 1) * C + c] += g * mu;
          }
        }
        for (std::int64_t c = 0; c < C; ++c) {
          if (s == 0) {
            if (marg) marg[c] = static_cast<E>(run[c]);
            if (dS) dS[c] = static_cast<E>(-g * sm[c]);
            if (grads) gP()[c] += g * sm[c];
            continue;
          }
          double beta = bacc[c].value();
          double en = al[c] != kNegInf && beta != kNegInf ? std::exp(al[c] + beta - logz) : 0.0;
          if (dS) dS[s * C + c] = static_cast<E>(g * (en - sm[c]));
          if (marg) marg[s * C + c] = static_cast<E>(run[c]);
          run[c] += en - sm[c];
          br[c] = beta;
        }
      }
    }
  }
};

template <class E> void gen_run(const Args& a, Pass pass, const E* dlogz, E* out, void* ws, int threads) {
  const Dims& d = a.d;
  const detail::Layout Y = detail::make_layout(d, pass, threads);
  const std::int64_t C = d.C, T = d.T, ke = Y.ke;
  const std::int64_t nS = d.B * (T + 1) * C, nTr = d.tr_numel(), nD = d.K * C;
  if (pass == Pass::backward) std::fill(out + nS, out + nS + nTr + nD + C, E(0));
  char* base = static_cast<char*>(ws);
  std::atomic<std::int64_t> ticket{0};
  detail::run_threads(Y.lanes, [&](int lane) {
    char* lb = base + Y.shared_bytes + lane * Y.lane_bytes;
    GenSeq<E> q{a, Y, lb, C, ke, Y.I, 0, nullptr, static_cast<const E*>(a.Tr), static_cast<const E*>(a.D),
                static_cast<const E*>(a.P)};
    if (pass == Pass::backward) {
      std::fill(q.gD(), q.gD() + ke * C, 0.0);
      std::fill(q.gTr(), q.gTr() + ke * C * C, 0.0);
      std::fill(q.gP(), q.gP() + C, 0.0);
    }
    for (std::int64_t b = lane; b < d.B; b += Y.lanes) {
      q.L = a.L[b];
      q.S = static_cast<const E*>(a.S) + b * (T + 1) * C;
      if (pass == Pass::logz) {
        out[b] = static_cast<E>(q.forward(q.ck_ring(0), false, 0, -1));
        continue;
      }
      if (pass == Pass::marginals) {
        E* marg = out + b * T * C;
        std::fill(marg + q.L * C, marg + T * C, E(0));
        q.g = 1;
        q.backward(false, nullptr, marg);
        continue;
      }
      E* dS = out + b * (T + 1) * C;
      std::fill(dS + (q.L + 1) * C, dS + (T + 1) * C, E(0));
      q.g = static_cast<double>(dlogz[b]);
      q.backward(true, dS, nullptr);
      detail::wait_ticket(ticket, b);
      E* oTr = out + nS;
      E* oD = oTr + nTr;
      E* oP = oD + nD;
      for (std::int64_t i = 0; i < ke * C; ++i) { oD[i] += static_cast<E>(q.gD()[i]); q.gD()[i] = 0; }
      for (std::int64_t i = 0; i < ke * C * C; ++i) { oTr[i] += static_cast<E>(q.gTr()[i]); q.gTr()[i] = 0; }
      for (std::int64_t c = 0; c < C; ++c) { oP[c] += static_cast<E>(q.gP()[c]); q.gP()[c] = 0; }
      ticket.store(b + 1, std::memory_order_release);
    }
  });
}

}  // namespace

void detail::general_run(const Args& a, Pass pass, const void* dlogz, void* out, void* ws, int threads) {
  if (a.dtype == DType::f64)
    gen_run<double>(a, pass, static_cast<const double*>(dlogz), static_cast<double*>(out), ws, threads);
  else
    gen_run<float>(a, pass, static_cast<const float*>(dlogz), static_cast<float*>(out), ws, threads);
}

}  // namespace ad::semicrf
