#pragma once
// Internal: what the semi-CRF CUDA kernels share (src/cuda/semicrf.cu: logZ,
// its gradients and the marginals; src/cuda/semicrf_decode.cu: Viterbi, the
// gold score and the cumulative helper) — the block layout, the fixed-order
// warp and block reductions, the per-lane context. See semicrf.cu for the design.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch.hpp"
#include "cuda/util.cuh"
#include "ops/semicrf_gpu.hpp"
#include "ops/semicrf_math.hpp"

namespace ad::cuda_k {


namespace {
using i64 = std::int64_t;
using semicrf::kNegInf;
using semicrf::LseAcc;
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kAll = 0xffffffffu;

// ---- warp and block reductions (fixed order; the same result in every lane) ----
__device__ inline double warp_max(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(kAll, v, o));
  return v;
}
__device__ inline double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kAll, v, o);
  return v;
}
__device__ inline LseAcc warp_lse(LseAcc a) {
  for (int o = 16; o > 0; o >>= 1) {
    LseAcc b;
    b.m = __shfl_xor_sync(kAll, a.m, o);
    b.s = __shfl_xor_sync(kAll, a.s, o);
    a.merge(b);
  }
  return a;
}
// max over v of every thread of the block; red: kWarps doubles of shared memory
__device__ inline double block_max(double v, double* red) {
  v = warp_max(v);
  __syncthreads();  // red is free
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = kNegInf;
  for (int w = 0; w < kWarps; ++w) r = fmax(r, red[w]);
  return r;
}
// sum over v of every thread of the block, tree order; red: kThreads doubles
__device__ inline double block_sum(double v, double* red) {
  __syncthreads();
  red[threadIdx.x] = v;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h >>= 1) {
    if (static_cast<int>(threadIdx.x) < h) red[threadIdx.x] += red[threadIdx.x + h];
    __syncthreads();
  }
  return red[0];
}

enum PassId : int { kLogz = 0, kBackward = 1, kMarginals = 2 };

// Everything a lane needs; passed by value to the kernels.
template <class E> struct Ctx {
  i64 B, T, K, C, ke, I;
  const E *S, *Tr, *D, *P;
  const i64* L;
  semicrf::gpu::Layout Y;
  int pass;
  const E* dlogz;
  E* out;
  char* ws;
};


// f(T{}) for f32 / f64
template <class F> void by_type(DType t, F f) {
  if (t == DType::f32) f(float{});
  else f(double{});
}

inline semicrf::Dims dims_of(DType t, const SemicrfArgs& a) {
  semicrf::Dims d;
  d.B = a.B;
  d.T = a.T;
  d.K = a.K;
  d.C = a.C;
  d.general = a.general;
  d.esize = t == DType::f64 ? 8 : 4;
  return d;
}
template <class E> Ctx<E> ctx_of(DType t, const SemicrfArgs& a, semicrf::Pass pass, int pid, const void* dlogz,
                                 void* out, void* ws) {
  const semicrf::Dims d = dims_of(t, a);
  Ctx<E> X{};
  X.B = a.B;
  X.T = a.T;
  X.K = a.K;
  X.C = a.C;
  X.Y = semicrf::gpu::layout(d, pass);
  X.ke = X.Y.ke;
  X.I = X.Y.I;
  X.S = static_cast<const E*>(a.S);
  X.Tr = static_cast<const E*>(a.Tr);
  X.D = static_cast<const E*>(a.D);
  X.P = static_cast<const E*>(a.P);
  X.L = a.L;
  X.pass = pid;
  X.dlogz = static_cast<const E*>(dlogz);
  X.out = static_cast<E*>(out);
  X.ws = static_cast<char*>(ws);
  return X;
}
}  // namespace

}  // namespace ad::cuda_k
