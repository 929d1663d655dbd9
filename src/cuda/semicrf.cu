// CUDA kernels of the semi-Markov CRF ops (src/ops/semicrf.cpp). Written
// without a GPU; the tests in tests/cuda.cpp compare them with the CPU
// wherever a GPU is present (they passed on an H200 and an H100, docs/gpu.md).
//
// Files: this one (logZ, its gradients, the marginals), semicrf_decode.cu
// (Viterbi, the gold score and its gradient, the cumulative helper) and
// semicrf_common.cuh (reductions, the per-lane context), as on the CPU.
//
// Design: the CPU's algorithm (ops/semicrf_cpu.hpp, semicrf_cpu.cpp,
// semicrf_general_cpu.cpp, semicrf_decode_cpu.cpp), kept simple on purpose.
//  - One block of kThreads threads per sequence ("lane"): block l runs the
//    sequences l, l + lanes, ... in turn, with its own part of the workspace
//    (ops/semicrf_gpu.hpp: the layout, shared with the op's workspace size).
//  - Positions are walked in order inside the block; __syncthreads between
//    the phases of a position. Warp w owns labels c = w, w + kWarps, ...;
//    its 32 lanes split a window over durations k (lane k-1 mod 32), or a sum
//    over labels. Warp reductions are xor butterflies (every lane ends with
//    the same bits), so results never depend on timing: no atomics anywhere.
//  - Memory is the CPU's: a Ke-slot α ring, a copy of it every I positions
//    (I = max(Ke, ⌊√(T·Ke)⌋)), the α rows of one interval, a Ke-slot β ring;
//    the backward pass walks the intervals last to first, restoring the ring
//    and recomputing α. Nothing is sized T·K.
//  - Fast path (Tr (C, C)): ring of Ã = A − S in the input dtype, relative to
//    an f64 base per label and lap of Ke positions (the CPU's rule; f32 slots
//    keep their rounding error as a bf16 low part, as the CPU's); the
//    interval rows relative to their f64 row maximum. Window terms are formed
//    in f64, exp'd by semicrf::exp_win in the input dtype (as the CPU) and
//    summed in f64. Per-position logsumexps over labels (A, β) are f64 with
//    std::exp. dD (Ke, C), dTr, dP are f64 partial sums per lane, each entry
//    owned by one thread; a last kernel adds the lanes in order.
//  - General path (Tr (K, C, C)): all f64, O(Ke·C²) per position, lanes over
//    k with LseAcc accumulators merged by butterfly (semicrf::LseAcc::merge).
//  - Viterbi: f64 max-plus with the CPU's expressions in the CPU's order, so
//    values and ties (shortest k, then lowest label) are the CPU's bit for
//    bit; O(T·C) int32 backpointers per lane, one thread backtracks.
//  - Score / its gradient: one thread per sequence walks the segments
//    (semicrf::for_each_segment); parameter gradients by one thread in batch
//    order (the CPU's order: the same bits). Lengths and segments are checked
//    on the host by the op glue (copies of L and segments) with the CPU's
//    messages; a Viterbi sequence without an allowed segmentation is found
//    from its output row (-1 at position 0) and reported by the op.
//  - Cumulative scores: one block per sequence, the mean by a fixed-order
//    block reduction, then one thread per label runs the f64 prefix sum.
// Performance: one block per sequence uses one SM for B = 1; splitting a
// sequence's labels over several blocks (grid-wide sync per position) is
// the next step if the timings need it.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/semicrf_common.cuh"

namespace ad::cuda_k {

namespace {
// One lane (block) of either path: zero its parameter-gradient partials
// (tr_size entries of dTr), then run its sequences b = lane, lane + lanes, ...
// for the pass (logZ, marginals, or the backward with dS).
template <class Q, class E> __device__ void run_lanes(Q& q, const Ctx<E>& X, i64 tr_size) {
  const i64 lane_id = blockIdx.x, lanes = gridDim.x;
  const i64 C = X.C, T = X.T;
  if (X.pass == kBackward) {
    for (i64 i = q.tid; i < X.ke * C; i += kThreads) q.gD()[i] = 0;
    for (i64 i = q.tid; i < tr_size; i += kThreads) q.gTr()[i] = 0;
    for (i64 i = q.tid; i < C; i += kThreads) q.gP()[i] = 0;
  }
  for (i64 b = lane_id; b < X.B; b += lanes) {
    __syncthreads();
    q.L = X.L[b];
    q.Sb = X.S + b * (T + 1) * C;
    if (X.pass == kLogz) {
      const double z = q.forward(q.ck(0), false, 0, -1);
      if (q.tid == 0) X.out[b] = static_cast<E>(z);
      continue;
    }
    if (X.pass == kMarginals) {
      E* marg = X.out + b * T * C;
      for (i64 i = q.L * C + q.tid; i < T * C; i += kThreads) marg[i] = E(0);
      q.g = 1;
      q.backward(false, nullptr, marg);
      continue;
    }
    E* dS = X.out + b * (T + 1) * C;
    for (i64 i = (q.L + 1) * C + q.tid; i < (T + 1) * C; i += kThreads) dS[i] = E(0);
    q.g = static_cast<double>(X.dlogz[b]);
    q.backward(true, dS, nullptr);
  }
}

// ---- fast path: one sequence in one block ----
template <class E> struct Fast {
  const Ctx<E>& X;
  char* lb;
  double* red;
  i64 L = 0;
  const E* Sb = nullptr;
  double g = 1, logz = 0;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int tid = static_cast<int>(threadIdx.x);

  __device__ Fast(const Ctx<E>& x, char* l, double* r) : X(x), lb(l), red(r) {}
  template <class U> __device__ U* at(i64 off) const { return reinterpret_cast<U*>(lb + off); }
  __device__ double* rows(int r) const { return at<double>(X.Y.rows) + r * X.C; }
  __device__ double* arow() const { return rows(0); }  // α[t] or α[s]
  __device__ double* Arow() const { return rows(1); }  // A[s]
  __device__ double* gam() const { return rows(2); }   // γ[s]
  __device__ double* sm() const { return rows(3); }    // start marginals
  __device__ double* run() const { return rows(4); }   // marginals running sum
  __device__ double* abase() const { return at<double>(X.Y.abase); }
  __device__ E* ck(i64 j) const { return at<E>(X.Y.ck_ring + j * X.Y.ck_stride); }
  __device__ double* meta(i64 j) const { return at<double>(X.Y.ck_meta + j * X.Y.meta_stride); }
  __device__ E* ival() const { return at<E>(X.Y.ival); }
  __device__ double* nu() const { return at<double>(X.Y.nu); }
  __device__ E* bring() const { return at<E>(X.Y.bring); }
  __device__ double* bbase() const { return at<double>(X.Y.bbase); }
  __device__ double* gD() const { return at<double>(X.Y.gD); }
  __device__ double* gTr() const { return at<double>(X.Y.gTr); }
  __device__ double* gP() const { return at<double>(X.Y.gP); }
  __device__ double Sv(i64 t, i64 c) const { return static_cast<double>(Sb[t * X.C + c]); }
  __device__ double Dv(i64 k, i64 c) const { return static_cast<double>(X.D[(k - 1) * X.C + c]); }
  __device__ double Trv(i64 cp, i64 c) const { return static_cast<double>(X.Tr[cp * X.C + c]); }

  // ---- rings: a lap's values relative to its base (semicrf::lap_base) ----
  // A ring column per label, as the CPU's (semicrf::detail::ring_column): ke
  // slots of E, and for f32 each slot's rounding error in bf16 after them
  // (hi + lo), which the window adds back in f64.
  __device__ i64 rke() const { return semicrf::detail::ring_column<E>(X.ke); }
  __device__ double get(const E* col, i64 i) const { return semicrf::ring_get(col, X.ke, i); }
  __device__ void put(E* col, i64 i, double x) const { semicrf::ring_put(col, X.ke, i, x); }
  // v into the first slot of a lap (one thread)
  __device__ void start_lap(E* col, i64 slot, double& base, double v) const {
    double bs = 0;
    semicrf::lap_base(bs, true, v, 0, true);
    base = bs;
    put(col, slot, semicrf::to_lap(v, bs));
  }
  // v into slot `slot` of column col, whose lap so far holds slots [from, to);
  // moving the lap's base up moves those slots with it. All 32 lanes of a warp
  // call it with the same arguments.
  __device__ void put_warp(E* col, double& base, bool lap_start, i64 from, i64 to, i64 slot, double v) const {
    double bs = base;
    // cheap: a move of the lap's to − from slots costs less than this position's window (min(Ke, t) or
    // min(Ke, L − s) terms, never skipped on the GPU), so the base may always follow at kRebaseAbove
    const double sh = semicrf::lap_base(bs, lap_start, v, to - from, true);
    __syncwarp();
    if (sh != 0)
      for (i64 i = from + lane; i < to; i += 32) put(col, i, semicrf::to_lap(get(col, i), sh));
    __syncwarp();
    if (lane == 0) {
      base = bs;
      put(col, slot, semicrf::to_lap(v, bs));
    }
    __syncwarp();
  }

  // ---- α ring: column c, slot s % ke, value Ã[s,c] − base[lap parity][c] ----
  __device__ double aval(const E* ring, i64 s, i64 c) const {
    return semicrf::from_lap(get(ring + c * rke(), s % X.ke), abase()[((s / X.ke) & 1) * X.C + c]);
  }
  // the lap's slots so far: positions lap·ke .. t−1, slots 0 .. t % ke − 1 (one warp per label)
  __device__ void write_aring(E* ring, i64 t, i64 c, double v) const {
    const i64 r = t % X.ke;
    put_warp(ring + c * rke(), abase()[((t / X.ke) & 1) * X.C + c], r == 0, 0, r, r, v);
  }
  __device__ void init_aring(E* ring) const {
    for (i64 c = tid; c < X.C; c += kThreads) {
      start_lap(ring + c * rke(), 0, abase()[c], static_cast<double>(X.P[c]) - Sv(0, c));
      abase()[X.C + c] = 0.0;
    }
  }
  // row[c] = α[t,c] = S[t,c] + lse_k (Ã[t−k,c] + D[k−1,c]), t >= 1
  __device__ void alpha_step(const E* ring, i64 t, double* row) const {
    const i64 m = t < X.ke ? t : X.ke;
    for (i64 c = warp; c < X.C; c += kWarps) {
      double mx = kNegInf;
      for (i64 k = lane + 1; k <= m; k += 32) mx = fmax(mx, aval(ring, t - k, c) + Dv(k, c));
      const double M = warp_max(mx);
      double r = kNegInf;
      if (M != kNegInf) {
        double s = 0;
        for (i64 k = lane + 1; k <= m; k += 32)
          s += static_cast<double>(semicrf::exp_win(static_cast<E>(aval(ring, t - k, c) + Dv(k, c) - M)));
        s = warp_sum(s);
        r = Sv(t, c) + M + std::log(s);
      }
      if (lane == 0) row[c] = r;
    }
  }
  // A[t,c] = lse_c' (row[c'] + Tr[c',c]); into Aout and/or the ring (as Ã)
  __device__ void trans_in(const double* row, i64 t, E* ring, double* Aout) const {
    for (i64 c = warp; c < X.C; c += kWarps) {
      double mx = kNegInf;
      for (i64 cp = lane; cp < X.C; cp += 32) mx = fmax(mx, row[cp] + Trv(cp, c));
      const double M = warp_max(mx);
      double A = kNegInf;
      if (M != kNegInf) {
        double s = 0;
        for (i64 cp = lane; cp < X.C; cp += 32) s += semicrf::exp_or_zero(row[cp] + Trv(cp, c) - M);
        s = warp_sum(s);
        A = M + std::log(s);
      }
      if (lane == 0 && Aout) Aout[c] = A;
      if (ring) write_aring(ring, t, c, A - Sv(t, c));  // A: the same bits on every lane
    }
  }
  // interval row i = row − its maximum (f64), in E
  __device__ void store_ival(i64 i, const double* row) const {
    double mx = kNegInf;
    for (i64 c = tid; c < X.C; c += kThreads) mx = fmax(mx, row[c]);
    double nv = block_max(mx, red);
    if (nv == kNegInf) nv = 0;
    if (tid == 0) nu()[i] = nv;
    for (i64 c = tid; c < X.C; c += kThreads) ival()[i * X.C + c] = static_cast<E>(row[c] - nv);
  }
  __device__ void load_ival(i64 i, double* row) const {
    const double nv = nu()[i];
    for (i64 c = tid; c < X.C; c += kThreads) row[c] = static_cast<double>(ival()[i * X.C + c]) + nv;
  }

  // The forward sweep over 0..L; checkpoints j = 1..nck-1 (position j·I) go to
  // slot j−1, the α rows from ival_from on (-1: none) to the interval buffer.
  __device__ double forward(E* ring, bool store_ck, i64 nck, i64 ival_from) {
    double* row = arow();
    init_aring(ring);
    if (ival_from == 0)
      for (i64 c = tid; c < X.C; c += kThreads) row[c] = kNegInf;
    __syncthreads();
    if (ival_from == 0) store_ival(0, row);
    for (i64 t = 1; t <= L; ++t) {
      alpha_step(ring, t, row);
      __syncthreads();
      if (store_ck && t % X.I == 0 && t / X.I < nck) {
        const i64 j = t / X.I;
        E* dst = ck(j - 1);
        for (i64 i = tid; i < X.C * rke(); i += kThreads) dst[i] = ring[i];
        double* mt = meta(j - 1);
        for (i64 c = tid; c < X.C; c += kThreads) {
          mt[c] = abase()[c];
          mt[X.C + c] = abase()[X.C + c];
          mt[2 * X.C + c] = row[c];
        }
        __syncthreads();
      }
      if (ival_from >= 0 && t >= ival_from) store_ival(t - ival_from, row);
      if (t < L) trans_in(row, t, ring, nullptr);
      __syncthreads();
    }
    LseAcc z;
    for (i64 c = 0; c < X.C; ++c) z.add(row[c]);
    return z.value();
  }

  // ---- β ring: column c, slot e % ke, value B̃[e,c] − base (B̃ = β + S) ----
  __device__ double bval(i64 e, i64 c) const {
    return semicrf::from_lap(get(bring() + c * rke(), e % X.ke), bbase()[((e / X.ke) & 1) * X.C + c]);
  }
  // s < L, one warp per label; the lap's slots so far: positions s+1 .. min(L, its last), slots s % ke + 1 ..
  __device__ void write_bring(i64 s, i64 c, double v) const {
    const i64 r = s % X.ke, last = (s / X.ke + 1) * X.ke - 1;
    put_warp(bring() + c * rke(), bbase()[((s / X.ke) & 1) * X.C + c], r == X.ke - 1, r + 1,
             (L < last ? L : last) % X.ke + 1, r, v);
  }
  // γ[s,c] = −S[s,c] + lse_k (B̃[s+k,c] + D[k−1,c]), the start marginal, and
  // dD[k−1,c] += g μ(s,k,c) (s < L)
  __device__ void gamma_step(i64 s, bool grads) const {
    const i64 m = L - s < X.ke ? L - s : X.ke;
    for (i64 c = warp; c < X.C; c += kWarps) {
      double mx = kNegInf;
      for (i64 k = lane + 1; k <= m; k += 32) mx = fmax(mx, bval(s + k, c) + Dv(k, c));
      const double M = warp_max(mx);
      const double Ac = Arow()[c], Ssc = Sv(s, c);
      if (M == kNegInf) {
        if (lane == 0) { gam()[c] = kNegInf; sm()[c] = 0; }
        continue;
      }
      // μ(s,k,c) = e^{A − S[s] + x_k − logZ} = f/g · e^{x_k − M}
      const double f = grads && Ac != kNegInf ? g * std::exp(M - Ssc + Ac - logz) : 0.0;
      double sum = 0;
      for (i64 k = lane + 1; k <= m; k += 32) {
        const double e = static_cast<double>(semicrf::exp_win(static_cast<E>(bval(s + k, c) + Dv(k, c) - M)));
        sum += e;
        if (f != 0) gD()[(k - 1) * X.C + c] += f * e;
      }
      sum = warp_sum(sum);
      const double gr = M - Ssc + std::log(sum);
      if (lane == 0) {
        gam()[c] = gr;
        sm()[c] = Ac != kNegInf ? std::exp(Ac + gr - logz) : 0.0;
      }
    }
  }
  // dTr[c',c] += g start[s,c] e^{α[s,c'] + Tr[c',c] − A[s,c]} (s >= 1); one thread per (c', c)
  __device__ void dtr_step() const {
    const double* row = arow();
    for (i64 p = tid; p < X.C * X.C; p += kThreads) {
      const i64 cp = p / X.C, c = p % X.C;
      const double st = sm()[c];
      if (st == 0) continue;
      const double x = row[cp] + Trv(cp, c) - Arow()[c];
      if (x != kNegInf) gTr()[p] += std::exp(x) * (g * st);
    }
  }
  // β[s,c'] = lse_c (Tr[c',c] + γ[s,c]); end marginals, dS, marginals; β ring (s >= 1)
  __device__ void beta_step(i64 s, E* dS, E* marg) const {
    const double* row = arow();
    for (i64 cp = warp; cp < X.C; cp += kWarps) {
      double mx = kNegInf;
      for (i64 c = lane; c < X.C; c += 32) mx = fmax(mx, Trv(cp, c) + gam()[c]);
      const double M = warp_max(mx);
      double beta = kNegInf;
      if (M != kNegInf) {
        double s2 = 0;
        for (i64 c = lane; c < X.C; c += 32) s2 += semicrf::exp_or_zero(Trv(cp, c) + gam()[c] - M);
        s2 = warp_sum(s2);
        beta = M + std::log(s2);
      }
      if (lane == 0) {
        const double en = row[cp] != kNegInf && beta != kNegInf ? std::exp(row[cp] + beta - logz) : 0.0;
        if (dS) dS[s * X.C + cp] = static_cast<E>(g * (en - sm()[cp]));
        if (marg) marg[s * X.C + cp] = static_cast<E>(run()[cp]);
        run()[cp] += en - sm()[cp];
      }
      write_bring(s, cp, beta + Sv(s, cp));  // beta: the same bits on every lane
    }
  }

  // The backward pass of one sequence: gradients (grads) or marginals.
  __device__ void backward(bool grads, E* dS, E* marg) {
    const i64 C = X.C, I = X.I;
    const i64 nck = semicrf::checkpoint_count(L, I), nint = nck + 1;
    logz = forward(ck(nck >= 1 ? nck - 1 : 0), true, nck, nck * I);
    if (!isfinite(logz) || g == 0) {
      for (i64 i = tid; i < (L + 1) * C; i += kThreads) {
        if (dS) dS[i] = E(0);
        if (marg && i < L * C) marg[i] = E(0);
      }
      __syncthreads();
      return;
    }
    for (i64 c = tid; c < C; c += kThreads) {
      run()[c] = 0;
      bbase()[c] = 0;
      bbase()[C + c] = 0;
    }
    double* row = arow();
    __syncthreads();
    for (i64 j = nint - 1; j >= 0; --j) {
      const i64 a = j * I, e = a + I < L + 1 ? a + I : L + 1;
      if (j < nint - 1) {  // restore the ring and recompute α over the interval
        E* ring = ck(j >= 1 ? j - 1 : 0);
        if (j >= 1) {
          const double* mt = meta(j - 1);
          for (i64 c = tid; c < C; c += kThreads) {
            abase()[c] = mt[c];
            abase()[C + c] = mt[C + c];
            row[c] = mt[2 * C + c];
          }
        } else {
          init_aring(ring);
          for (i64 c = tid; c < C; c += kThreads) row[c] = kNegInf;
        }
        __syncthreads();
        store_ival(0, row);
        if (j >= 1) trans_in(row, a, ring, nullptr);  // a < L here
        __syncthreads();
        for (i64 t = a + 1; t < e; ++t) {
          alpha_step(ring, t, row);
          __syncthreads();
          store_ival(t - a, row);
          if (t < L) trans_in(row, t, ring, nullptr);
          __syncthreads();
        }
      }
      for (i64 s = e - 1; s >= a; --s) {
        load_ival(s - a, row);
        __syncthreads();
        if (s == L) {
          for (i64 c = tid; c < C; c += kThreads) {
            start_lap(bring() + c * rke(), L % X.ke, bbase()[((L / X.ke) & 1) * X.C + c], Sv(L, c));
            const double en = row[c] != kNegInf ? std::exp(row[c] - logz) : 0.0;
            if (dS) dS[L * C + c] = static_cast<E>(g * en);
            run()[c] = en;
          }
          __syncthreads();
          continue;
        }
        if (s == 0) {
          for (i64 c = tid; c < C; c += kThreads) Arow()[c] = static_cast<double>(X.P[c]);
        } else {
          trans_in(row, s, nullptr, Arow());
        }
        __syncthreads();
        gamma_step(s, grads);
        __syncthreads();
        if (s == 0) {
          for (i64 c = tid; c < C; c += kThreads) {
            if (marg) marg[c] = static_cast<E>(run()[c]);
            if (dS) dS[c] = static_cast<E>(-g * sm()[c]);
            if (grads) gP()[c] += g * sm()[c];
          }
          __syncthreads();
          continue;
        }
        if (grads) dtr_step();
        beta_step(s, dS, marg);
        __syncthreads();
      }
    }
  }
};

template <class E> __global__ void __launch_bounds__(kThreads) fast_kernel(Ctx<E> X) {
  __shared__ double red[kWarps];
  Fast<E> q(X, X.ws + static_cast<i64>(blockIdx.x) * X.Y.lane_bytes, red);
  run_lanes(q, X, X.C * X.C);
}

// ---- general path (Tr (K, C, C)): f64 rings, row per slot ----
template <class E> struct Gen {
  const Ctx<E>& X;
  char* lb;
  i64 L = 0;
  const E* Sb = nullptr;
  double g = 1, logz = 0;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int tid = static_cast<int>(threadIdx.x);

  __device__ Gen(const Ctx<E>& x, char* l) : X(x), lb(l) {}
  template <class U> __device__ U* at(i64 off) const { return reinterpret_cast<U*>(lb + off); }
  __device__ double* rows(int r) const { return at<double>(X.Y.rows) + r * X.C; }
  __device__ double* ck(i64 j) const { return at<double>(X.Y.ck_ring + j * X.Y.ck_stride); }
  __device__ double* ival() const { return at<double>(X.Y.ival); }
  __device__ double* bring() const { return at<double>(X.Y.bring); }
  __device__ double* gD() const { return at<double>(X.Y.gD); }
  __device__ double* gTr() const { return at<double>(X.Y.gTr); }
  __device__ double* gP() const { return at<double>(X.Y.gP); }
  __device__ double Sv(i64 t, i64 c) const { return static_cast<double>(Sb[t * X.C + c]); }
  __device__ double Dv(i64 k, i64 c) const { return static_cast<double>(X.D[(k - 1) * X.C + c]); }
  __device__ double Trv(i64 k, i64 cp, i64 c) const {
    return static_cast<double>(X.Tr[(k - 1) * X.C * X.C + cp * X.C + c]);
  }

  // row[c] = α[t,c] from the ring holding α[t−ke..t−1] (slot s % ke), t >= 1
  __device__ void alpha_step(const double* ring, i64 t, double* row) const {
    const i64 m = t < X.ke ? t : X.ke;
    for (i64 c = warp; c < X.C; c += kWarps) {
      LseAcc acc;
      for (i64 k = lane + 1; k <= m; k += 32) {
        const i64 s = t - k;
        double inner;
        if (s == 0) {
          inner = static_cast<double>(X.P[c]);
        } else {
          LseAcc in;
          const double* r = ring + (s % X.ke) * X.C;
          for (i64 cp = 0; cp < X.C; ++cp) in.add(r[cp] + Trv(k, cp, c));
          inner = in.value();
        }
        if (inner == kNegInf) continue;
        acc.add(Sv(t, c) - Sv(s, c) + Dv(k, c) + inner);
      }
      acc = warp_lse(acc);
      if (lane == 0) row[c] = acc.value();
    }
  }
  __device__ double forward(double* ring, bool store, i64 nck, i64 ival_from) {
    double* row = rows(0);
    if (ival_from == 0)
      for (i64 c = tid; c < X.C; c += kThreads) ival()[c] = kNegInf;
    for (i64 t = 1; t <= L; ++t) {
      alpha_step(ring, t, row);
      __syncthreads();
      for (i64 c = tid; c < X.C; c += kThreads) ring[(t % X.ke) * X.C + c] = row[c];
      __syncthreads();
      if (store && t % X.I == 0 && t / X.I < nck) {
        double* dst = ck(t / X.I - 1);
        for (i64 i = tid; i < X.ke * X.C; i += kThreads) dst[i] = ring[i];
      }
      if (ival_from >= 0 && t >= ival_from)
        for (i64 c = tid; c < X.C; c += kThreads) ival()[(t - ival_from) * X.C + c] = row[c];
      __syncthreads();
    }
    LseAcc z;
    for (i64 c = 0; c < X.C; ++c) z.add(row[c]);
    return z.value();
  }
  // μ(s,k,c) summed over k into sm[c]; dD, dTr (s < L). Warp per c, lanes over k.
  __device__ void mu_step(i64 s, const double* al, bool grads) const {
    const i64 m = L - s < X.ke ? L - s : X.ke;
    double* sm = rows(1);
    for (i64 c = warp; c < X.C; c += kWarps) {
      double acc = 0;
      for (i64 k = lane + 1; k <= m; k += 32) {
        const double* be = bring() + ((s + k) % X.ke) * X.C;
        const double G = Sv(s + k, c) - Sv(s, c) + Dv(k, c) + be[c];
        if (G == kNegInf) continue;
        double mu = 0;
        if (s == 0) {
          mu = semicrf::exp_or_zero(static_cast<double>(X.P[c]) + G - logz);
        } else {
          for (i64 cp = 0; cp < X.C; ++cp) {
            const double x = Trv(k, cp, c) + G;
            if (al[cp] == kNegInf || x == kNegInf) continue;
            const double w = std::exp(al[cp] + x - logz);
            if (grads) gTr()[(k - 1) * X.C * X.C + cp * X.C + c] += g * w;
            mu += w;
          }
        }
        acc += mu;
        if (grads) gD()[(k - 1) * X.C + c] += g * mu;
      }
      acc = warp_sum(acc);
      if (lane == 0) sm[c] = acc;
    }
  }
  // β[s,c'] = lse_{k,c} (Tr[k−1,c',c] + G(s,k,c)) into rows(3); dS, marginals (s >= 1)
  __device__ void beta_step(i64 s, const double* al, E* dS, E* marg) const {
    const i64 m = L - s < X.ke ? L - s : X.ke;
    double *sm = rows(1), *run = rows(2), *bet = rows(3);
    for (i64 cp = warp; cp < X.C; cp += kWarps) {
      LseAcc acc;
      for (i64 j = lane; j < m * X.C; j += 32) {
        const i64 k = j / X.C + 1, c = j % X.C;
        const double* be = bring() + ((s + k) % X.ke) * X.C;
        const double G = Sv(s + k, c) - Sv(s, c) + Dv(k, c) + be[c];
        if (G == kNegInf) continue;
        acc.add(Trv(k, cp, c) + G);
      }
      acc = warp_lse(acc);
      if (lane == 0) {
        const double beta = acc.value();
        const double en = al[cp] != kNegInf && beta != kNegInf ? std::exp(al[cp] + beta - logz) : 0.0;
        if (dS) dS[s * X.C + cp] = static_cast<E>(g * (en - sm[cp]));
        if (marg) marg[s * X.C + cp] = static_cast<E>(run[cp]);
        run[cp] += en - sm[cp];
        bet[cp] = beta;
      }
    }
  }
  __device__ void backward(bool grads, E* dS, E* marg) {
    const i64 C = X.C, I = X.I, ke = X.ke;
    const i64 nck = semicrf::checkpoint_count(L, I), nint = nck + 1;
    logz = forward(ck(nck >= 1 ? nck - 1 : 0), true, nck, nck * I);
    if (!isfinite(logz) || g == 0) {
      for (i64 i = tid; i < (L + 1) * C; i += kThreads) {
        if (dS) dS[i] = E(0);
        if (marg && i < L * C) marg[i] = E(0);
      }
      __syncthreads();
      return;
    }
    double *sm = rows(1), *run = rows(2), *bet = rows(3);
    for (i64 c = tid; c < C; c += kThreads) run[c] = 0;
    __syncthreads();
    for (i64 j = nint - 1; j >= 0; --j) {
      const i64 a0 = j * I, e0 = a0 + I < L + 1 ? a0 + I : L + 1;
      if (j < nint - 1) {
        double* ring = ck(j >= 1 ? j - 1 : 0);
        for (i64 c = tid; c < C; c += kThreads) ival()[c] = j >= 1 ? ring[(a0 % ke) * C + c] : kNegInf;
        __syncthreads();
        for (i64 t = a0 + 1; t < e0; ++t) {
          alpha_step(ring, t, rows(0));
          __syncthreads();
          for (i64 c = tid; c < C; c += kThreads) {
            ring[(t % ke) * C + c] = rows(0)[c];
            ival()[(t - a0) * C + c] = rows(0)[c];
          }
          __syncthreads();
        }
      }
      for (i64 s = e0 - 1; s >= a0; --s) {
        const double* al = ival() + (s - a0) * C;
        double* br = bring() + (s % ke) * C;
        if (s == L) {
          for (i64 c = tid; c < C; c += kThreads) {
            const double en = al[c] != kNegInf ? std::exp(al[c] - logz) : 0.0;
            if (dS) dS[L * C + c] = static_cast<E>(g * en);
            run[c] = en;
            br[c] = 0.0;
          }
          __syncthreads();
          continue;
        }
        mu_step(s, al, grads);
        __syncthreads();
        if (s == 0) {
          for (i64 c = tid; c < C; c += kThreads) {
            if (marg) marg[c] = static_cast<E>(run[c]);
            if (dS) dS[c] = static_cast<E>(-g * sm[c]);
            if (grads) gP()[c] += g * sm[c];
          }
          __syncthreads();
          continue;
        }
        beta_step(s, al, dS, marg);
        __syncthreads();  // the β ring slot of s (position s + ke) is no longer read
        for (i64 c = tid; c < C; c += kThreads) br[c] = bet[c];
        __syncthreads();
      }
    }
  }
};

template <class E> __global__ void __launch_bounds__(kThreads) gen_kernel(Ctx<E> X) {
  Gen<E> q(X, X.ws + static_cast<i64>(blockIdx.x) * X.Y.lane_bytes);
  run_lanes(q, X, X.ke * X.C * X.C);
}

// Parameter gradients: the lanes' f64 partial sums added in lane order, one
// thread per entry of [dTr | dD (K, C) | dP]; rows k >= ke of dD (and of a
// (K, C, C) dTr) are 0.
template <class E> __global__ void param_grads_kernel(Ctx<E> X, bool general) {
  const i64 C = X.C, nTr = general ? X.K * C * C : C * C, nD = X.K * C, n = nTr + nD + C;
  E* o = X.out + X.B * (X.T + 1) * C;
  const i64 lanes = X.Y.lanes;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    i64 off = -1, idx = 0;
    if (i < nTr) {
      if (!general || i < X.ke * C * C) { off = X.Y.gTr; idx = i; }
    } else if (i < nTr + nD) {
      if (i - nTr < X.ke * C) { off = X.Y.gD; idx = i - nTr; }
    } else {
      off = X.Y.gP;
      idx = i - nTr - nD;
    }
    double s = 0;
    if (off >= 0)
      for (i64 l = 0; l < lanes; ++l) s += reinterpret_cast<const double*>(X.ws + l * X.Y.lane_bytes + off)[idx];
    o[i] = static_cast<E>(s);
  }
}

void run_pass(DType t, const SemicrfArgs& a, semicrf::Pass pass, int pid, const void* dlogz, void* out, void* ws,
              const char* what) {
  if (a.B <= 0) {  // no sequence: the parameter gradients (all of the output) are zero, as on the CPU
    if (pass == semicrf::Pass::backward)
      by_type(t, [&](auto z) {
        const i64 n = (a.general ? a.K * a.C * a.C : a.C * a.C) + a.K * a.C + a.C;
        check_call(cudaMemsetAsync(out, 0, static_cast<std::size_t>(n) * sizeof(decltype(z)), 0), what);
      });
    return;
  }
  by_type(t, [&](auto z) {
    using E = decltype(z);
    Ctx<E> X = ctx_of<E>(t, a, pass, pid, dlogz, out, ws);
    const auto lanes = static_cast<unsigned>(X.Y.lanes);
    if (a.general) gen_kernel<E><<<lanes, kThreads>>>(X);
    else fast_kernel<E><<<lanes, kThreads>>>(X);
    check_launch(what);
    if (pass == semicrf::Pass::backward) {
      const i64 n = (a.general ? a.K * a.C * a.C : a.C * a.C) + a.K * a.C + a.C;
      param_grads_kernel<E><<<grid_for(n, 256), 256>>>(X, a.general);
      check_launch("semicrf_logz_backward (parameter gradients)");
    }
  });
}
}  // namespace

void semicrf_logz(DType t, const SemicrfArgs& a, void* out, void* ws) {
  run_pass(t, a, semicrf::Pass::logz, kLogz, nullptr, out, ws, "semicrf_logz");
}
void semicrf_logz_backward(DType t, const SemicrfArgs& a, const void* dlogz, void* out, void* ws) {
  run_pass(t, a, semicrf::Pass::backward, kBackward, dlogz, out, ws, "semicrf_logz_backward");
}
void semicrf_marginals(DType t, const SemicrfArgs& a, void* out, void* ws) {
  run_pass(t, a, semicrf::Pass::marginals, kMarginals, nullptr, out, ws, "semicrf_marginals");
}

}  // namespace ad::cuda_k
