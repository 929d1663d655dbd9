// CUDA kernels of the semi-CRF's decoding ops: Viterbi, the score of gold
// segmentations (and its gradient) and the cumulative-scores helper; tested
// against the CPU as semicrf.cu's are. The design and the shared pieces:
// semicrf.cu, semicrf_common.cuh.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/semicrf_common.cuh"

namespace ad::cuda_k {

namespace {
// ---- Viterbi: f64 max-plus, the CPU's expressions and tie rules ----
// (v, k, c') pairs: the larger v wins; ties go to the smaller k (lanes own
// distinct k, so the order is total and every lane ends with the same pair).
__device__ void warp_argmax(double& v, int& k, int& cp) {
  for (int o = 16; o > 0; o >>= 1) {
    const double ov = __shfl_xor_sync(kAll, v, o);
    const int ok = __shfl_xor_sync(kAll, k, o), oc = __shfl_xor_sync(kAll, cp, o);
    if (ov > v || (ov == v && ok < k)) { v = ov; k = ok; cp = oc; }
  }
}

template <class E> __global__ void __launch_bounds__(kThreads) viterbi_kernel(Ctx<E> X, bool general, i64* out) {
  const i64 lane_id = blockIdx.x, lanes = gridDim.x;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int tid = static_cast<int>(threadIdx.x);
  char* lb = X.ws + lane_id * X.Y.lane_bytes;
  const i64 C = X.C, T = X.T, ke = X.ke;
  double* ring = reinterpret_cast<double*>(lb + X.Y.ck_ring);
  auto* bk = reinterpret_cast<std::int32_t*>(lb + X.Y.bk);
  auto* bc = reinterpret_cast<std::int32_t*>(lb + X.Y.bc);
  double* row = reinterpret_cast<double*>(lb + X.Y.rows);
  double* tmp = row + C;
  for (i64 b = lane_id; b < X.B; b += lanes) {
    __syncthreads();
    const i64 L = X.L[b];
    const E* S = X.S + b * (T + 1) * C;
    auto Sv = [&](i64 t, i64 c) { return static_cast<double>(S[t * C + c]); };
    auto Dv = [&](i64 k, i64 c) { return static_cast<double>(X.D[(k - 1) * C + c]); };
    i64* r = out + b * T;
    if (!general) {
      // ring column c, slot s % ke: Ã*[s,c] = max_c'(α*[s,c'] + Tr[c',c]) − S[s,c]
      for (i64 c = tid; c < C; c += kThreads) ring[c * ke] = static_cast<double>(X.P[c]) - Sv(0, c);
      __syncthreads();
      for (i64 t = 1; t <= L; ++t) {
        const i64 w = t < ke ? t : ke;
        for (i64 c = warp; c < C; c += kWarps) {
          double best = kNegInf;
          int bkk = 0, none = -1;
          for (i64 k = lane + 1; k <= w; k += 32) {
            const double v = ring[c * ke + (t - k) % ke] + Dv(k, c);
            if (v > best) { best = v; bkk = static_cast<int>(k); }
          }
          warp_argmax(best, bkk, none);
          if (lane == 0) {
            row[c] = best == kNegInf ? kNegInf : Sv(t, c) + best;
            bk[t * C + c] = best == kNegInf ? 0 : bkk;
          }
        }
        __syncthreads();
        if (t == L) break;
        for (i64 c = tid; c < C; c += kThreads) {
          double best = kNegInf;
          std::int32_t arg = 0;
          for (i64 cp = 0; cp < C; ++cp) {
            const double v = row[cp] + static_cast<double>(X.Tr[cp * C + c]);
            if (v > best) { best = v; arg = static_cast<std::int32_t>(cp); }
          }
          bc[t * C + c] = arg;
          ring[c * ke + t % ke] = best - Sv(t, c);
        }
        __syncthreads();
      }
    } else {
      // ring row per position: α*[s, ·] at slot s % ke
      for (i64 t = 1; t <= L; ++t) {
        const i64 w = t < ke ? t : ke;
        for (i64 c = warp; c < C; c += kWarps) {
          double best = kNegInf;
          int bkk = 0, bcc = -1;
          for (i64 k = lane + 1; k <= w; k += 32) {
            const i64 s = t - k;
            const double base = Sv(t, c) - Sv(s, c) + Dv(k, c);
            if (s == 0) {
              const double v = base + static_cast<double>(X.P[c]);
              if (v > best) { best = v; bkk = static_cast<int>(k); bcc = -1; }
              continue;
            }
            const double* pr = ring + (s % ke) * C;
            for (i64 cp = 0; cp < C; ++cp) {
              const double v = base + pr[cp] + static_cast<double>(X.Tr[(k - 1) * C * C + cp * C + c]);
              if (v > best) { best = v; bkk = static_cast<int>(k); bcc = static_cast<int>(cp); }
            }
          }
          warp_argmax(best, bkk, bcc);
          if (lane == 0) {
            tmp[c] = best;
            bk[t * C + c] = bkk;
            bc[t * C + c] = bcc;
          }
        }
        __syncthreads();
        for (i64 c = tid; c < C; c += kThreads) {
          ring[(t % ke) * C + c] = tmp[c];
          row[c] = tmp[c];
        }
        __syncthreads();
      }
    }
    for (i64 t = tid; t < T; t += kThreads) r[t] = -1;
    __syncthreads();
    if (tid == 0) {
      double best = kNegInf;
      i64 c = 0;
      for (i64 cc = 0; cc < C; ++cc)
        if (row[cc] > best) { best = row[cc]; c = cc; }
      if (best != kNegInf) {  // else r[0] stays -1: reported by the caller
        for (i64 t = L; t > 0;) {
          const i64 k = bk[t * C + c], s = t - k;
          r[s] = c;
          if (s > 0) c = general ? bc[t * C + c] : bc[s * C + c];
          t = s;
        }
      }
    }
  }
}

// ---- score of gold segmentations and its gradient ----
template <class E> __device__ double tr_at(const Ctx<E>& X, bool general, i64 k, i64 cp, i64 c) {
  return static_cast<double>(general ? X.Tr[(k - 1) * X.C * X.C + cp * X.C + c] : X.Tr[cp * X.C + c]);
}
template <class E> __global__ void score_kernel(Ctx<E> X, bool general, const i64* seg) {
  for (i64 b = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; b < X.B;
       b += static_cast<i64>(gridDim.x) * blockDim.x) {
    const E* S = X.S + b * (X.T + 1) * X.C;
    double total = 0;
    semicrf::for_each_segment(seg + b * X.T, X.L[b], [&](i64 s, i64 k, i64 c, i64 prev) {
      total += semicrf::segment_score(S + c, X.D + c, X.C, s, k);
      total += prev < 0 ? static_cast<double>(X.P[c]) : tr_at(X, general, k, prev, c);
    });
    X.out[b] = static_cast<E>(total);
  }
}
// dS, one thread per sequence (rows of b only); the output was zeroed
template <class E> __global__ void score_ds_kernel(Ctx<E> X, const i64* seg) {
  for (i64 b = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; b < X.B;
       b += static_cast<i64>(gridDim.x) * blockDim.x) {
    E* dS = X.out + b * (X.T + 1) * X.C;
    const E g = X.dlogz[b];
    semicrf::for_each_segment(seg + b * X.T, X.L[b], [&](i64 s, i64 k, i64 c, i64) {
      dS[(s + k) * X.C + c] += g;
      dS[s * X.C + c] -= g;
    });
  }
}
// dTr, dD, dP: one thread, sequences in batch order (the CPU's order)
template <class E> __global__ void score_params_kernel(Ctx<E> X, bool general, const i64* seg) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const i64 C = X.C, nTr = general ? X.K * C * C : C * C;
  E* dTr = X.out + X.B * (X.T + 1) * C;
  E* dD = dTr + nTr;
  E* dP = dD + X.K * C;
  for (i64 b = 0; b < X.B; ++b) {
    const E g = X.dlogz[b];
    semicrf::for_each_segment(seg + b * X.T, X.L[b], [&](i64, i64 k, i64 c, i64 prev) {
      dD[(k - 1) * C + c] += g;
      if (prev < 0) dP[c] += g;
      else dTr[general ? (k - 1) * C * C + prev * C + c : prev * C + c] += g;
    });
  }
}

// ---- cumulative scores: one block per sequence ----
// (positions n = L[b] .. T-1 are padding: S keeps its row n there)
// *bad = the smallest b with a non-finite S value (an overflow anywhere, or a non-finite score)
template <class E>
__global__ void __launch_bounds__(kThreads)
    cumulative_kernel(i64 T, i64 C, const E* x, const i64* L, E* S, unsigned long long* bad) {
  __shared__ double red[kThreads];
  const i64 b = blockIdx.x;
  const i64 n = L ? L[b] : T;
  const E* xb = x + b * T * C;
  E* Sb = S + b * (T + 1) * C;
  double part = 0;
  for (i64 i = threadIdx.x; i < n * C; i += kThreads) part += static_cast<double>(xb[i]);
  const double total = block_sum(part, red);
  const double m = n * C > 0 ? total / static_cast<double>(n * C) : 0.0;
  bool finite = true;
  for (i64 c = threadIdx.x; c < C; c += kThreads) {
    double acc = 0;
    Sb[c] = E(0);
    for (i64 u = 0; u < T; ++u) {
      if (u < n) acc += static_cast<double>(xb[u * C + c]) - m;
      const E s = static_cast<E>(acc);
      Sb[(u + 1) * C + c] = s;
      finite &= static_cast<bool>(isfinite(static_cast<double>(s)));
    }
  }
  if (!finite) atomicMin(bad, static_cast<unsigned long long>(b));
}
// dy[t,c] = Σ_{u>t} dS[u,c], dx = dy − mean(dy) over t < n = L[b] and 0 at
// the padding t >= n: the suffix sums twice (once for the mean), no T-sized
// temporary
template <class E>
__global__ void __launch_bounds__(kThreads) cumulative_backward_kernel(i64 T, i64 C, const E* dS, const i64* L, E* dx) {
  __shared__ double red[kThreads];
  const i64 b = blockIdx.x;
  const i64 n = L ? L[b] : T;
  const E* g = dS + b * (T + 1) * C;
  E* o = dx + b * T * C;
  double part = 0;
  for (i64 c = threadIdx.x; c < C; c += kThreads) {
    double acc = 0;
    for (i64 u = T - 1; u >= 0; --u) {
      acc += static_cast<double>(g[(u + 1) * C + c]);
      if (u < n) part += acc;
    }
  }
  const double total = block_sum(part, red);
  const double m = n * C > 0 ? total / static_cast<double>(n * C) : 0.0;
  for (i64 c = threadIdx.x; c < C; c += kThreads) {
    double acc = 0;
    for (i64 u = T - 1; u >= 0; --u) {
      acc += static_cast<double>(g[(u + 1) * C + c]);
      o[u * C + c] = u < n ? static_cast<E>(acc - m) : E(0);
    }
  }
}

}  // namespace

std::int64_t semicrf_viterbi(DType t, const SemicrfArgs& a, std::int64_t* out, void* ws) {
  if (a.B <= 0) return -1;
  by_type(t, [&](auto z) {
    using E = decltype(z);
    Ctx<E> X = ctx_of<E>(t, a, semicrf::Pass::viterbi, 0, nullptr, nullptr, ws);
    viterbi_kernel<E><<<static_cast<unsigned>(X.Y.lanes), kThreads>>>(X, a.general, out);
  });
  check_launch("semicrf_viterbi");
  // segments[b, 0] of every b (-1: no allowed segmentation); the copy waits for the kernel
  std::vector<std::int64_t> first(static_cast<std::size_t>(a.B));
  check_call(cudaMemcpy2D(first.data(), sizeof(std::int64_t), out, static_cast<std::size_t>(a.T) * sizeof(std::int64_t),
                          sizeof(std::int64_t), static_cast<std::size_t>(a.B), cudaMemcpyDeviceToHost),
             "cudaMemcpy2D (semicrf_viterbi check)");
  for (std::int64_t b = 0; b < a.B; ++b)
    if (first[static_cast<std::size_t>(b)] < 0) return b;
  return -1;
}

void semicrf_score(DType t, const SemicrfArgs& a, const std::int64_t* seg, void* out) {
  if (a.B <= 0) return;
  by_type(t, [&](auto z) {
    using E = decltype(z);
    Ctx<E> X = ctx_of<E>(t, a, semicrf::Pass::logz, 0, nullptr, out, nullptr);
    score_kernel<E><<<grid_for(a.B, 128), 128>>>(X, a.general, seg);
  });
  check_launch("semicrf_score");
}

void semicrf_score_backward(DType t, const SemicrfArgs& a, const std::int64_t* seg, const void* dscore, void* out) {
  const std::int64_t n = a.B * (a.T + 1) * a.C + (a.general ? a.K * a.C * a.C : a.C * a.C) + a.K * a.C + a.C;
  by_type(t, [&](auto z) {
    using E = decltype(z);
    check_call(cudaMemsetAsync(out, 0, static_cast<std::size_t>(n) * sizeof(E), 0), "cudaMemsetAsync");
    if (a.B <= 0) return;
    Ctx<E> X = ctx_of<E>(t, a, semicrf::Pass::logz, 0, dscore, out, nullptr);
    score_ds_kernel<E><<<grid_for(a.B, 128), 128>>>(X, seg);
    check_launch("semicrf_score_backward (dS)");
    score_params_kernel<E><<<1, 1>>>(X, a.general, seg);
    check_launch("semicrf_score_backward (parameters)");
  });
}

namespace {
template <class E>
__global__ void first_bad_s_kernel(i64 B, i64 T, i64 C, const E* S, const i64* L, unsigned long long* first) {
  const i64 n = B * (T + 1) * C;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n; i += static_cast<i64>(gridDim.x) * blockDim.x)
    if (i / C % (T + 1) <= L[i / ((T + 1) * C)] && !isfinite(static_cast<double>(S[i])))
      atomicMin(first, static_cast<unsigned long long>(i));
}
}  // namespace
std::int64_t semicrf_first_non_finite_s(DType t, const SemicrfArgs& a, double* v) {
  const std::int64_t n = a.B * (a.T + 1) * a.C;
  if (n <= 0) return -1;
  unsigned long long first = ~0ull;
  Flag flag;  // this call's own (~0: none)
  by_type(t, [&](auto z) {
    using E = decltype(z);
    first_bad_s_kernel<E><<<grid_for(n, kThreads), kThreads>>>(a.B, a.T, a.C, static_cast<const E*>(a.S), a.L, flag.p);
    check_launch("semicrf S check");
    first = flag.get();
    if (first == ~0ull) return;
    E e{};
    check_call(cudaMemcpy(&e, static_cast<const E*>(a.S) + first, sizeof(E), cudaMemcpyDeviceToHost),
               "cudaMemcpy (semicrf S check)");
    *v = static_cast<double>(e);
  });
  return first == ~0ull ? -1 : static_cast<std::int64_t>(first);
}

std::int64_t semicrf_cumulative(DType t, std::int64_t B, std::int64_t T, std::int64_t C, const void* x,
                                const std::int64_t* L, void* S) {
  if (B <= 0 || C <= 0) return -1;
  Flag bad;  // this call's own (~0: every S finite)
  by_type(t, [&](auto z) {
    using E = decltype(z);
    cumulative_kernel<E><<<static_cast<unsigned>(B), kThreads>>>(T, C, static_cast<const E*>(x), L,
                                                                 static_cast<E*>(S), bad.p);
    check_launch("semicrf_cumulative");
  });
  const unsigned long long b = bad.get();
  return b == ~0ull ? -1 : static_cast<std::int64_t>(b);
}

void semicrf_cumulative_backward(DType t, std::int64_t B, std::int64_t T, std::int64_t C, const void* dS,
                                 const std::int64_t* L, void* dx) {
  if (B <= 0 || C <= 0 || T <= 0) return;
  by_type(t, [&](auto z) {
    using E = decltype(z);
    cumulative_backward_kernel<E><<<static_cast<unsigned>(B), kThreads>>>(T, C, static_cast<const E*>(dS), L,
                                                                          static_cast<E*>(dx));
  });
  check_launch("semicrf_cumulative_backward");
}

}  // namespace ad::cuda_k
