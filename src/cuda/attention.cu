// CUDA kernels of attention (flash-style, fused). COMPILED, NOT YET RUN ON A
// GPU: the session that wrote them had none; tests/cuda.cpp compares them
// with the CPU kernels whenever a GPU is lent.
//
// Layouts as on the CPU (ops/attention_cpu.hpp): q, o [B, H, Nq, d]; k, v
// [B, Hkv, Nk, d]; lse [B, H, Nq] in the accumulate type A (f64 for f64
// inputs, f32 otherwise). Masks and the online softmax are the AD_HD math of
// ops/attention_math.hpp. Head sizes d <= 128 run; d is zero-padded in shared
// memory up to DP in {32, 64, 128} (zero columns change no dot product), so
// d = 32, 64, 128 waste nothing and other d work too. d > 128 is rejected.
//
// Three kernels per dtype, no atomics (deterministic):
//   forward: one block per (query tile of BR rows, (b, h)). Q tile stays in
//     shared memory; the loop walks key tiles of BC keys up to the last key
//     the tile's last row sees (causal tiles stop early), S = scale Q K^T,
//     online softmax per row, O += P V. Writes O / l and lse = m + log l.
//   backward dK, dV: one block per (key tile of BC keys, (b, kv head)); loops
//     over the G query heads sharing the kv head and their query tiles,
//     recomputing P = e^{S - lse}, dP = dO V^T, dS = P (dP - D):
//     dV += P^T dO, dK += scale dS^T Q.
//   backward dQ: one block per (query tile, (b, h)); loops over key tiles:
//     dQ += scale dS K (S, dP recomputed: two more tile products than a
//     kernel with atomics, in exchange for fixed summation orders).
//   D = rowsum(dO o O) - dlse is one small kernel before them.
//
// f32 / f64: CUDA cores ("SIMT"). 256 threads as 16 x 16 (tx, ty); a thread
// owns register micro-tiles of rows ty + 16 a and columns tx + 16 b. Shared
// rows are padded by one element so the column-strided reads hit distinct
// banks. Row reductions of the softmax are half-warp shuffles (the 16 lanes of
// one ty hold one row).
// bf16 / f16: tensor cores via wmma (16x16x16, f32 accumulation; sm_80+).
// 4 warps, BR = BC = 64; each warp owns 16 rows of every tile. S and dP are
// accumulated in f32 and staged in shared memory; P and dS are rounded to the
// input type for the products with V, dO, Q, K (as in FlashAttention); the
// running output lives in shared memory in f32 (its rows are rescaled by the
// online softmax, which an opaque wmma fragment cannot do). O is rounded to the
// input type once at the end; lse, D and all sums stay f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "cuda/launch.hpp"
#include "cuda/util.cuh"
#include "ops/attention_math.hpp"

namespace ad::cuda_k {

namespace {
using i64 = std::int64_t;

struct Geo {
  i64 B, H, Hkv, Nq, Nk, d, G;
  bool causal;
  double scale;
  const i64* lens;  // device, [B], or nullptr
};
__device__ __forceinline__ i64 key_len(const Geo& g, i64 b) { return g.lens ? g.lens[b] : g.Nk; }
__device__ __forceinline__ i64 row_end(const Geo& g, i64 i, i64 len) {
  return attn::key_end(i, g.Nq, g.Nk, len, g.causal);
}
template <class A> __device__ __forceinline__ A neg_inf() { return -std::numeric_limits<A>::infinity(); }

// Half-warp (16 lanes) and warp butterfly reductions: every lane ends with the result.
template <class A> __device__ __forceinline__ A hw_max(A x) {
  for (int o = 8; o > 0; o >>= 1) {
    A y = __shfl_xor_sync(0xffffffffu, x, o);
    x = y > x ? y : x;
  }
  return x;
}
template <class A> __device__ __forceinline__ A hw_sum(A x) {
  for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float w_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float w_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// tile[r][c] (row stride ld) = src row (row0 + r), column c, for r < rows, c < DP; zero
// outside [0, nrows) x [0, d).
template <class T, int DP>
// Rows at or past nrows are zeros: callers pass the end of what any query of
// the block sees (the key length, the causal bound), so a NaN or inf in
// masked keys and values never meets a zero probability (0 * NaN = NaN).
__device__ __forceinline__ void load_tile(T* tile, int ld, int rows, const T* src, i64 row0, i64 nrows, i64 d) {
  for (int e = threadIdx.x; e < rows * DP; e += blockDim.x) {
    const int r = e / DP, c = e % DP;
    const i64 i = row0 + r;
    tile[r * ld + c] = (i < nrows && c < d) ? src[i * d + c] : T(0);
  }
}

// ================================ f32 / f64 ================================
// S micro-tile: s[a][b] = sum_c X[ra(a)][c] Y[cb(b)][c] over padded rows of stride DP + 1.
template <class A, int RM, int CM, int DP>
__device__ __forceinline__ void tile_dot(A (&s)[RM][CM], const A* X, int r0, const A* Y, int c0) {
#pragma unroll
  for (int a = 0; a < RM; ++a)
#pragma unroll
    for (int b = 0; b < CM; ++b) s[a][b] = A(0);
#pragma unroll 4
  for (int c = 0; c < DP; ++c) {
    A x[RM], y[CM];
#pragma unroll
    for (int a = 0; a < RM; ++a) x[a] = X[(r0 + 16 * a) * (DP + 1) + c];
#pragma unroll
    for (int b = 0; b < CM; ++b) y[b] = Y[(c0 + 16 * b) * (DP + 1) + c];
#pragma unroll
    for (int a = 0; a < RM; ++a)
#pragma unroll
      for (int b = 0; b < CM; ++b) s[a][b] += x[a] * y[b];
  }
}

// acc[a][m] += sum_{c < n} P[(r0 + 16 a) * ldp + c] * Y[c * ldy + tx + 16 m]
template <class A, int RM, int DM>
__device__ __forceinline__ void tile_acc(A (&acc)[RM][DM], const A* P, int ldp, int r0, int n, const A* Y, int ldy,
                                         int tx) {
#pragma unroll 4
  for (int c = 0; c < n; ++c) {
    A p[RM];
#pragma unroll
    for (int a = 0; a < RM; ++a) p[a] = P[(r0 + 16 * a) * ldp + c];
#pragma unroll
    for (int m = 0; m < DM; ++m) {
      const A y = Y[c * ldy + tx + 16 * m];
#pragma unroll
      for (int a = 0; a < RM; ++a) acc[a][m] += p[a] * y;
    }
  }
}

// Forward. Shared: Qs [BR][DP+1], Ks [BC][DP+1], Vs [BC][DP+1], Ps [BR][BC+1].
template <class A, int BR, int BC, int DP>
__global__ void __launch_bounds__(256) fwd_simt(Geo g, const A* q, const A* k, const A* v, A* o, A* lse) {
  constexpr int RM = BR / 16, CM = BC / 16, DM = DP / 16, LD = DP + 1, LP = BC + 1;
  extern __shared__ __align__(16) unsigned char smem[];
  A* Qs = reinterpret_cast<A*>(smem);
  A* Ks = Qs + BR * LD;
  A* Vs = Ks + BC * LD;
  A* Ps = Vs + BC * LD;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const i64 u = blockIdx.x, b = u / g.H, h = u % g.H, kvh = b * g.Hkv + h / g.G;
  const i64 i0 = static_cast<i64>(blockIdx.y) * BR;
  const A *Q = q + u * g.Nq * g.d, *K = k + kvh * g.Nk * g.d, *V = v + kvh * g.Nk * g.d;
  const i64 len = key_len(g, b);
  const A scale = static_cast<A>(g.scale);
  load_tile<A, DP>(Qs, LD, BR, Q, i0, g.Nq, g.d);

  A m[RM], l[RM], acc[RM][DM];
  i64 end[RM];
#pragma unroll
  for (int a = 0; a < RM; ++a) {
    m[a] = neg_inf<A>();
    l[a] = A(0);
    end[a] = row_end(g, i0 + ty + 16 * a, len);
#pragma unroll
    for (int x = 0; x < DM; ++x) acc[a][x] = A(0);
  }
  const i64 last = (i0 + BR < g.Nq ? i0 + BR : g.Nq) - 1;
  const i64 e_hi = row_end(g, last, len);  // key_end is nondecreasing: no row of the tile sees past it
  for (i64 j0 = 0; j0 < e_hi; j0 += BC) {
    __syncthreads();  // the previous tile's Ks, Vs, Ps are consumed
    load_tile<A, DP>(Ks, LD, BC, K, j0, e_hi, g.d);
    load_tile<A, DP>(Vs, LD, BC, V, j0, e_hi, g.d);
    __syncthreads();
    A s[RM][CM];
    tile_dot<A, RM, CM, DP>(s, Qs, ty, Ks, tx);  // s[a][b] = Q[ty + 16a] . K[tx + 16b]
#pragma unroll
    for (int a = 0; a < RM; ++a) {
      A mx = neg_inf<A>();
#pragma unroll
      for (int c = 0; c < CM; ++c) {
        s[a][c] = j0 + tx + 16 * c < end[a] ? s[a][c] * scale : neg_inf<A>();
        mx = s[a][c] > mx ? s[a][c] : mx;
      }
      const A mn = attn::online_max(m[a], hw_max(mx));
      const bool none = mn == neg_inf<A>();  // nothing visible yet in this row
      const A alpha = none ? A(1) : attn::online_rescale(m[a], mn);
      A rs = A(0);
#pragma unroll
      for (int c = 0; c < CM; ++c) {
        const A p = none ? A(0) : math::exp_(s[a][c] - mn);  // masked: e^{-inf} = 0
        rs += p;
        Ps[(ty + 16 * a) * LP + tx + 16 * c] = p;
      }
      l[a] = l[a] * alpha + hw_sum(rs);
      m[a] = mn;
#pragma unroll
      for (int x = 0; x < DM; ++x) acc[a][x] *= alpha;
    }
    __syncthreads();
    tile_acc<A, RM, DM>(acc, Ps, LP, ty, BC, Vs, LD, tx);  // O += P V
  }
#pragma unroll
  for (int a = 0; a < RM; ++a) {
    const i64 i = i0 + ty + 16 * a;
    if (i >= g.Nq) continue;
    const A inv = attn::finish_inv(l[a]);
#pragma unroll
    for (int x = 0; x < DM; ++x) {
      const int c = tx + 16 * x;
      if (c < g.d) o[(u * g.Nq + i) * g.d + c] = acc[a][x] * inv;
    }
    if (tx == 0) lse[u * g.Nq + i] = attn::finish_lse(m[a], l[a]);
  }
}

// D[r] = rowsum(dO o O) - dlse[r] over B H Nq rows, in the accumulate type A.
template <class T, class A> struct RowD {
  const T *o, *dout;
  const A* dlse;
  A* D;
  i64 d;
  __device__ void operator()(i64 r) const {
    A s = A(0);
    for (i64 c = 0; c < d; ++c) s += static_cast<A>(dout[r * d + c]) * static_cast<A>(o[r * d + c]);
    D[r] = s - (dlse ? dlse[r] : A(0));
  }
};
template <class H> struct RowDHalf {
  const H *o, *dout;
  const float* dlse;
  float* D;
  i64 d;
  __device__ void operator()(i64 r) const {
    float s = 0.f;
    for (i64 c = 0; c < d; ++c) s += static_cast<float>(dout[r * d + c]) * static_cast<float>(o[r * d + c]);
    D[r] = s - (dlse ? dlse[r] : 0.f);
  }
};

// Backward, dK and dV of one key tile. Shared: Ks, Vs [BC][DP+1], Qs, dOs
// [BR][DP+1], Ps, dSs [BR][BC+1], Ls, Ds [BR].
template <class A, int BR, int BC, int DP>
__global__ void __launch_bounds__(256) bwd_kv_simt(Geo g, const A* q, const A* k, const A* v, const A* dout,
                                                   const A* lse, const A* Dg, A* dk, A* dv) {
  constexpr int RM = BR / 16, CM = BC / 16, DM = DP / 16, LD = DP + 1, LP = BC + 1;
  extern __shared__ __align__(16) unsigned char smem[];
  A* Ks = reinterpret_cast<A*>(smem);
  A* Vs = Ks + BC * LD;
  A* Qs = Vs + BC * LD;
  A* dOs = Qs + BR * LD;
  A* Ps = dOs + BR * LD;
  A* dSs = Ps + BR * LP;
  A* Ls = dSs + BR * LP;
  A* Ds = Ls + BR;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const i64 u = blockIdx.x, b = u / g.Hkv, kh = u % g.Hkv;
  const i64 j0 = static_cast<i64>(blockIdx.y) * BC;
  const i64 len = key_len(g, b);
  const A scale = static_cast<A>(g.scale);
  load_tile<A, DP>(Ks, LD, BC, k + u * g.Nk * g.d, j0, len, g.d);
  load_tile<A, DP>(Vs, LD, BC, v + u * g.Nk * g.d, j0, len, g.d);
  A gk[CM][DM], gv[CM][DM];  // key rows ty + 16 a, columns tx + 16 x
#pragma unroll
  for (int a = 0; a < CM; ++a)
#pragma unroll
    for (int x = 0; x < DM; ++x) gk[a][x] = gv[a][x] = A(0);
  // rows before i_first see no key of this tile (causal: key_end(i) <= j0)
  i64 i_first = g.causal ? j0 - (g.Nk - g.Nq) : 0;
  i_first = i_first < 0 ? 0 : i_first;
  const i64 i_stop = j0 < len ? g.Nq : 0;  // a tile past the key length is all masked
  for (i64 gh = 0; gh < g.G; ++gh) {
    const i64 hu = b * g.H + kh * g.G + gh;
    const A *Q = q + hu * g.Nq * g.d, *dO = dout + hu * g.Nq * g.d;
    for (i64 i0 = i_first; i0 < i_stop; i0 += BR) {
      __syncthreads();
      load_tile<A, DP>(Qs, LD, BR, Q, i0, g.Nq, g.d);
      load_tile<A, DP>(dOs, LD, BR, dO, i0, g.Nq, g.d);
      for (int r = threadIdx.x; r < BR; r += blockDim.x) {
        const bool in = i0 + r < g.Nq;
        Ls[r] = in ? lse[hu * g.Nq + i0 + r] : A(0);
        Ds[r] = in ? Dg[hu * g.Nq + i0 + r] : A(0);
      }
      __syncthreads();
      // query rows tx + 16 a, keys ty + 16 c
      A s[RM][CM], dp[RM][CM];
      tile_dot<A, RM, CM, DP>(s, Qs, tx, Ks, ty);
      tile_dot<A, RM, CM, DP>(dp, dOs, tx, Vs, ty);
#pragma unroll
      for (int a = 0; a < RM; ++a) {
        const int r = tx + 16 * a;
        const i64 i = i0 + r;
        const i64 e = i < g.Nq ? row_end(g, i, len) : 0;
#pragma unroll
        for (int c = 0; c < CM; ++c) {
          const int cc = ty + 16 * c;
          const A p = j0 + cc < e ? attn::prob(s[a][c] * scale, Ls[r]) : A(0);
          Ps[r * LP + cc] = p;
          dSs[r * LP + cc] = attn::dscore(p, dp[a][c], Ds[r]);
        }
      }
      __syncthreads();
      const int nr = static_cast<int>(g.Nq - i0 < BR ? g.Nq - i0 : BR);
      // dV[c] += sum_r P[r][c] dO[r], dK[c] += sum_r dS[r][c] Q[r]  (P^T, dS^T: column reads)
#pragma unroll 2
      for (int r = 0; r < nr; ++r) {
#pragma unroll
        for (int x = 0; x < DM; ++x) {
          const A o = dOs[r * LD + tx + 16 * x], qq = Qs[r * LD + tx + 16 * x];
#pragma unroll
          for (int a = 0; a < CM; ++a) {
            gv[a][x] += Ps[r * LP + ty + 16 * a] * o;
            gk[a][x] += dSs[r * LP + ty + 16 * a] * qq;
          }
        }
      }
    }
  }
#pragma unroll
  for (int a = 0; a < CM; ++a) {
    const i64 j = j0 + ty + 16 * a;
    if (j >= g.Nk) continue;
#pragma unroll
    for (int x = 0; x < DM; ++x) {
      const int c = tx + 16 * x;
      if (c >= g.d) continue;
      dk[(u * g.Nk + j) * g.d + c] = gk[a][x] * scale;
      dv[(u * g.Nk + j) * g.d + c] = gv[a][x];
    }
  }
}

// Backward, dQ of one query tile. Shared: Qs, dOs [BR][DP+1], Ks, Vs [BC][DP+1], dSs [BR][BC+1].
template <class A, int BR, int BC, int DP>
__global__ void __launch_bounds__(256) bwd_q_simt(Geo g, const A* q, const A* k, const A* v, const A* dout,
                                                  const A* lse, const A* Dg, A* dq) {
  constexpr int RM = BR / 16, CM = BC / 16, DM = DP / 16, LD = DP + 1, LP = BC + 1;
  extern __shared__ __align__(16) unsigned char smem[];
  A* Qs = reinterpret_cast<A*>(smem);
  A* dOs = Qs + BR * LD;
  A* Ks = dOs + BR * LD;
  A* Vs = Ks + BC * LD;
  A* dSs = Vs + BC * LD;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const i64 u = blockIdx.x, b = u / g.H, h = u % g.H, kvh = b * g.Hkv + h / g.G;
  const i64 i0 = static_cast<i64>(blockIdx.y) * BR;
  const i64 len = key_len(g, b);
  const A scale = static_cast<A>(g.scale);
  const A *K = k + kvh * g.Nk * g.d, *V = v + kvh * g.Nk * g.d;
  load_tile<A, DP>(Qs, LD, BR, q + u * g.Nq * g.d, i0, g.Nq, g.d);
  load_tile<A, DP>(dOs, LD, BR, dout + u * g.Nq * g.d, i0, g.Nq, g.d);
  A L[RM], Dr[RM], acc[RM][DM];
  i64 end[RM];
#pragma unroll
  for (int a = 0; a < RM; ++a) {
    const i64 i = i0 + ty + 16 * a;
    const bool in = i < g.Nq;
    L[a] = in ? lse[u * g.Nq + i] : A(0);
    Dr[a] = in ? Dg[u * g.Nq + i] : A(0);
    end[a] = in ? row_end(g, i, len) : 0;
#pragma unroll
    for (int x = 0; x < DM; ++x) acc[a][x] = A(0);
  }
  const i64 last = (i0 + BR < g.Nq ? i0 + BR : g.Nq) - 1;
  const i64 e_hi = row_end(g, last, len);
  for (i64 j0 = 0; j0 < e_hi; j0 += BC) {
    __syncthreads();
    load_tile<A, DP>(Ks, LD, BC, K, j0, e_hi, g.d);
    load_tile<A, DP>(Vs, LD, BC, V, j0, e_hi, g.d);
    __syncthreads();
    A s[RM][CM], dp[RM][CM];
    tile_dot<A, RM, CM, DP>(s, Qs, ty, Ks, tx);
    tile_dot<A, RM, CM, DP>(dp, dOs, ty, Vs, tx);
#pragma unroll
    for (int a = 0; a < RM; ++a)
#pragma unroll
      for (int c = 0; c < CM; ++c) {
        const A p = j0 + tx + 16 * c < end[a] ? attn::prob(s[a][c] * scale, L[a]) : A(0);
        dSs[(ty + 16 * a) * LP + tx + 16 * c] = attn::dscore(p, dp[a][c], Dr[a]);
      }
    __syncthreads();
    tile_acc<A, RM, DM>(acc, dSs, LP, ty, BC, Ks, LD, tx);  // dQ += dS K
  }
#pragma unroll
  for (int a = 0; a < RM; ++a) {
    const i64 i = i0 + ty + 16 * a;
    if (i >= g.Nq) continue;
#pragma unroll
    for (int x = 0; x < DM; ++x) {
      const int c = tx + 16 * x;
      if (c < g.d) dq[(u * g.Nq + i) * g.d + c] = acc[a][x] * scale;
    }
  }
}

// ============================ bf16 / f16 (wmma) ============================
namespace wm = nvcuda::wmma;
constexpr int kTB = 64;  // rows of every tile (queries and keys)

template <class H> __device__ __forceinline__ H to_h(float x);
template <> __device__ __forceinline__ __nv_bfloat16 to_h<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half to_h<__half>(float x) { return __float2half_rn(x); }

// Shared-memory carving, every region 128-byte aligned (wmma needs 32).
struct Carve {
  unsigned char* p;
  template <class T> __device__ T* take(int n) {
    T* r = reinterpret_cast<T*>(p);
    p += (static_cast<std::size_t>(n) * sizeof(T) + 127) / 128 * 128;
    return r;
  }
};
__host__ __device__ constexpr std::size_t carve_bytes(std::size_t n, std::size_t es) {
  return (n * es + 127) / 128 * 128;
}

template <class H> using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, H, wm::row_major>;
template <class H> using FragBr = wm::fragment<wm::matrix_b, 16, 16, 16, H, wm::row_major>;
template <class H> using FragBc = wm::fragment<wm::matrix_b, 16, 16, 16, H, wm::col_major>;
using FragC = wm::fragment<wm::accumulator, 16, 16, 16, float>;

// out (16 x 64, f32, stride ldo) = X[16 rows at x] . Y[64 rows]^T over DP columns:
// X, Y row-major 16-bit tiles of stride ldh (Y^T read as a col-major B operand).
template <class H, int DP>
__device__ __forceinline__ void strip_xyT(const H* x, const H* Y, int ldh, float* out, int ldo) {
#pragma unroll
  for (int n = 0; n < kTB / 16; ++n) {
    FragC c;
    wm::fill_fragment(c, 0.f);
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      FragA<H> fa;
      FragBc<H> fb;
      wm::load_matrix_sync(fa, x + kk * 16, ldh);
      wm::load_matrix_sync(fb, Y + n * 16 * ldh + kk * 16, ldh);
      wm::mma_sync(c, fa, fb, c);
    }
    wm::store_matrix_sync(out + n * 16, c, ldo, wm::mem_row_major);
  }
}
// acc[n] += P[16 x 64 at p, stride ldp] . Y[64 x DP, stride ldh] (16-bit, row-major).
template <class H, int DP>
__device__ __forceinline__ void strip_acc(FragC (&acc)[DP / 16], const H* p, int ldp, const H* Y, int ldh) {
#pragma unroll
  for (int kk = 0; kk < kTB / 16; ++kk) {
    FragA<H> fa;
    wm::load_matrix_sync(fa, p + kk * 16, ldp);
#pragma unroll
    for (int n = 0; n < DP / 16; ++n) {
      FragBr<H> fb;
      wm::load_matrix_sync(fb, Y + kk * 16 * ldh + n * 16, ldh);
      wm::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

template <int DP> struct TcLd {
  static constexpr int H = DP + 8;      // 16-bit tiles [64][DP + 8]
  static constexpr int S = kTB + 4;     // f32 score tiles [64][68]
  static constexpr int P = kTB + 8;     // 16-bit probability tiles [64][72]
  static constexpr int O = DP + 4;      // f32 output/staging tiles [64][DP + 4]
};
template <int DP> constexpr std::size_t tc_fwd_smem(std::size_t hs) {
  using L = TcLd<DP>;
  return 3 * carve_bytes(kTB * L::H, hs) + carve_bytes(kTB * L::S, 4) + carve_bytes(kTB * L::P, hs) +
         carve_bytes(kTB * L::O, 4) + 2 * carve_bytes(kTB, 4);
}
template <int DP> constexpr std::size_t tc_bwd_smem(std::size_t hs) {
  using L = TcLd<DP>;
  // four 16-bit input tiles, two f32 score tiles (also the staging area at the
  // end: 2 * 64 * 68 >= 64 * (DP + 4) for DP <= 128), two 16-bit P/dS tiles, lse and D
  return 4 * carve_bytes(kTB * L::H, hs) + 2 * carve_bytes(kTB * L::S, 4) + 2 * carve_bytes(kTB * L::P, hs) +
         2 * carve_bytes(kTB, 4);
}

// Forward, bf16/f16. Block = 4 warps; warp w owns query rows 16 w .. 16 w + 15.
template <class H, int DP>
__global__ void __launch_bounds__(128) fwd_tc(Geo g, const H* q, const H* k, const H* v, H* o, float* lse) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using L = TcLd<DP>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  H* Qs = cv.take<H>(kTB * L::H);
  H* Ks = cv.take<H>(kTB * L::H);
  H* Vs = cv.take<H>(kTB * L::H);
  float* Ss = cv.take<float>(kTB * L::S);
  H* Ps = cv.take<H>(kTB * L::P);
  float* Os = cv.take<float>(kTB * L::O);
  float* Ms = cv.take<float>(kTB);
  float* Ls = cv.take<float>(kTB);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const i64 u = blockIdx.x, b = u / g.H, h = u % g.H, kvh = b * g.Hkv + h / g.G;
  const i64 i0 = static_cast<i64>(blockIdx.y) * kTB;
  const H *K = k + kvh * g.Nk * g.d, *V = v + kvh * g.Nk * g.d;
  const i64 len = key_len(g, b);
  const float scale = static_cast<float>(g.scale);
  load_tile<H, DP>(Qs, L::H, kTB, q + u * g.Nq * g.d, i0, g.Nq, g.d);
  for (int e = threadIdx.x; e < kTB * L::O; e += blockDim.x) Os[e] = 0.f;
  for (int r = threadIdx.x; r < kTB; r += blockDim.x) {
    Ms[r] = neg_inf<float>();
    Ls[r] = 0.f;
  }
  const i64 last = (i0 + kTB < g.Nq ? i0 + kTB : g.Nq) - 1;
  const i64 e_hi = row_end(g, last, len);
  for (i64 j0 = 0; j0 < e_hi; j0 += kTB) {
    __syncthreads();
    load_tile<H, DP>(Ks, L::H, kTB, K, j0, e_hi, g.d);
    load_tile<H, DP>(Vs, L::H, kTB, V, j0, e_hi, g.d);
    __syncthreads();
    strip_xyT<H, DP>(Qs + w * 16 * L::H, Ks, L::H, Ss + w * 16 * L::S, L::S);  // S = Q K^T (f32)
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {  // online softmax of the warp's rows, lanes over keys
      const int r = w * 16 + rr;
      const i64 e = row_end(g, i0 + r, len);
      const float s0 = j0 + lane < e ? Ss[r * L::S + lane] * scale : neg_inf<float>();
      const float s1 = j0 + lane + 32 < e ? Ss[r * L::S + lane + 32] * scale : neg_inf<float>();
      const float mold = Ms[r];
      const float mn = attn::online_max(mold, w_max(s0 > s1 ? s0 : s1));
      const bool none = mn == neg_inf<float>();
      const float alpha = none ? 1.f : attn::online_rescale(mold, mn);
      const float p0 = none ? 0.f : math::exp_(s0 - mn), p1 = none ? 0.f : math::exp_(s1 - mn);
      const float rs = w_sum(p0 + p1);
      Ps[r * L::P + lane] = to_h<H>(p0);
      Ps[r * L::P + lane + 32] = to_h<H>(p1);
      for (int c = lane; c < DP; c += 32) Os[r * L::O + c] *= alpha;
      __syncwarp();  // every lane has read Ms[r], Ls[r]
      if (lane == 0) {
        Ls[r] = Ls[r] * alpha + rs;
        Ms[r] = mn;
      }
    }
    __syncwarp();
    FragC acc[DP / 16];  // O strip (f32, from shared) += P V
#pragma unroll
    for (int n = 0; n < DP / 16; ++n) wm::load_matrix_sync(acc[n], Os + w * 16 * L::O + n * 16, L::O, wm::mem_row_major);
    strip_acc<H, DP>(acc, Ps + w * 16 * L::P, L::P, Vs, L::H);
#pragma unroll
    for (int n = 0; n < DP / 16; ++n) wm::store_matrix_sync(Os + w * 16 * L::O + n * 16, acc[n], L::O, wm::mem_row_major);
    __syncwarp();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTB * DP; e += blockDim.x) {
    const int r = e / DP, c = e % DP;
    const i64 i = i0 + r;
    if (i < g.Nq && c < g.d) o[(u * g.Nq + i) * g.d + c] = to_h<H>(Os[r * L::O + c] * attn::finish_inv(Ls[r]));
  }
  for (int r = threadIdx.x; r < kTB; r += blockDim.x)
    if (i0 + r < g.Nq) lse[u * g.Nq + i0 + r] = attn::finish_lse(Ms[r], Ls[r]);
#else
  __trap();  // bf16/f16 tensor-core attention needs sm_80
#endif
}

// Writes a warp's 16 x DP accumulator strip through shared staging (f32, stride
// TcLd::O) to dst rows row0.. (global, stride d), times `mul`, rounded to H.
template <class H, int DP>
__device__ __forceinline__ void store_strip(FragC (&acc)[DP / 16], float* stage, H* dst, i64 row0, i64 nrows, i64 d,
                                            float mul) {
  using L = TcLd<DP>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < DP / 16; ++n) wm::store_matrix_sync(stage + n * 16, acc[n], L::O, wm::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * DP; e += 32) {
    const int r = e / DP, c = e % DP;
    if (row0 + r < nrows && c < d) dst[(row0 + r) * d + c] = to_h<H>(stage[r * L::O + c] * mul);
  }
  __syncwarp();
}

// Backward dK, dV, bf16/f16. Block = 64 keys; warp w owns keys 16 w .. 16 w + 15.
// Per query tile: S^T = K Q^T, dP^T = V dO^T (f32), P^T, dS^T rounded to H,
// dV += P^T dO, dK += dS^T Q in f32 fragments.
template <class H, int DP>
__global__ void __launch_bounds__(128) bwd_kv_tc(Geo g, const H* q, const H* k, const H* v, const H* dout,
                                                 const float* lse, const float* Dg, H* dk, H* dv) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using L = TcLd<DP>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  H* Ks = cv.take<H>(kTB * L::H);
  H* Vs = cv.take<H>(kTB * L::H);
  H* Qs = cv.take<H>(kTB * L::H);
  H* dOs = cv.take<H>(kTB * L::H);
  float* St = cv.take<float>(2 * kTB * L::S);  // S^T then dP^T; staging at the end
  float* dPt = St + kTB * L::S;
  H* Pt = cv.take<H>(kTB * L::P);
  H* dSt = cv.take<H>(kTB * L::P);
  float* Lq = cv.take<float>(kTB);
  float* Dq = cv.take<float>(kTB);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const i64 u = blockIdx.x, b = u / g.Hkv, kh = u % g.Hkv;
  const i64 j0 = static_cast<i64>(blockIdx.y) * kTB;
  const i64 len = key_len(g, b);
  const float scale = static_cast<float>(g.scale);
  load_tile<H, DP>(Ks, L::H, kTB, k + u * g.Nk * g.d, j0, len, g.d);
  load_tile<H, DP>(Vs, L::H, kTB, v + u * g.Nk * g.d, j0, len, g.d);
  FragC gk[DP / 16], gv[DP / 16];
#pragma unroll
  for (int n = 0; n < DP / 16; ++n) {
    wm::fill_fragment(gk[n], 0.f);
    wm::fill_fragment(gv[n], 0.f);
  }
  i64 i_first = g.causal ? j0 - (g.Nk - g.Nq) : 0;
  i_first = i_first < 0 ? 0 : i_first;
  const i64 i_stop = j0 < len ? g.Nq : 0;
  for (i64 gh = 0; gh < g.G; ++gh) {
    const i64 hu = b * g.H + kh * g.G + gh;
    const H *Q = q + hu * g.Nq * g.d, *dO = dout + hu * g.Nq * g.d;
    for (i64 i0 = i_first; i0 < i_stop; i0 += kTB) {
      __syncthreads();
      load_tile<H, DP>(Qs, L::H, kTB, Q, i0, g.Nq, g.d);
      load_tile<H, DP>(dOs, L::H, kTB, dO, i0, g.Nq, g.d);
      for (int r = threadIdx.x; r < kTB; r += blockDim.x) {
        const bool in = i0 + r < g.Nq;
        Lq[r] = in ? lse[hu * g.Nq + i0 + r] : 0.f;
        Dq[r] = in ? Dg[hu * g.Nq + i0 + r] : 0.f;
      }
      __syncthreads();
      strip_xyT<H, DP>(Ks + w * 16 * L::H, Qs, L::H, St + w * 16 * L::S, L::S);    // S^T
      strip_xyT<H, DP>(Vs + w * 16 * L::H, dOs, L::H, dPt + w * 16 * L::S, L::S);  // dP^T
      __syncwarp();
      for (int rr = 0; rr < 16; ++rr) {  // key row c, lanes over query columns r
        const int c = w * 16 + rr;
        const i64 j = j0 + c;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = lane + 32 * half;
          const i64 i = i0 + r;
          const bool vis = i < g.Nq && j < row_end(g, i, len);
          const float p = vis ? attn::prob(St[c * L::S + r] * scale, Lq[r]) : 0.f;
          Pt[c * L::P + r] = to_h<H>(p);
          dSt[c * L::P + r] = to_h<H>(attn::dscore(p, dPt[c * L::S + r], Dq[r]));
        }
      }
      __syncwarp();
      strip_acc<H, DP>(gv, Pt + w * 16 * L::P, L::P, dOs, L::H);   // dV += P^T dO
      strip_acc<H, DP>(gk, dSt + w * 16 * L::P, L::P, Qs, L::H);   // dK += dS^T Q
    }
  }
  __syncthreads();  // St is reused as staging: every warp is done with it
  float* stage = St + w * 16 * L::O;
  const i64 kv0 = u * g.Nk;
  store_strip<H, DP>(gv, stage, dv + kv0 * g.d, j0 + w * 16, g.Nk, g.d, 1.f);
  store_strip<H, DP>(gk, stage, dk + kv0 * g.d, j0 + w * 16, g.Nk, g.d, scale);
#else
  __trap();
#endif
}

// Backward dQ, bf16/f16. Block = 64 query rows; warp w owns rows 16 w .. 16 w + 15.
template <class H, int DP>
__global__ void __launch_bounds__(128) bwd_q_tc(Geo g, const H* q, const H* k, const H* v, const H* dout,
                                                const float* lse, const float* Dg, H* dq) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  using L = TcLd<DP>;
  extern __shared__ __align__(128) unsigned char smem[];
  Carve cv{smem};
  H* Qs = cv.take<H>(kTB * L::H);
  H* dOs = cv.take<H>(kTB * L::H);
  H* Ks = cv.take<H>(kTB * L::H);
  H* Vs = cv.take<H>(kTB * L::H);
  float* Ss = cv.take<float>(2 * kTB * L::S);  // S then dP; staging at the end
  float* dPs = Ss + kTB * L::S;
  H* dSs = cv.take<H>(kTB * L::P);
  cv.take<H>(kTB * L::P);  // (the kv kernel's second tile; same footprint for one size formula)
  float* Lq = cv.take<float>(kTB);
  float* Dq = cv.take<float>(kTB);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const i64 u = blockIdx.x, b = u / g.H, h = u % g.H, kvh = b * g.Hkv + h / g.G;
  const i64 i0 = static_cast<i64>(blockIdx.y) * kTB;
  const i64 len = key_len(g, b);
  const float scale = static_cast<float>(g.scale);
  const H *K = k + kvh * g.Nk * g.d, *V = v + kvh * g.Nk * g.d;
  load_tile<H, DP>(Qs, L::H, kTB, q + u * g.Nq * g.d, i0, g.Nq, g.d);
  load_tile<H, DP>(dOs, L::H, kTB, dout + u * g.Nq * g.d, i0, g.Nq, g.d);
  for (int r = threadIdx.x; r < kTB; r += blockDim.x) {
    const bool in = i0 + r < g.Nq;
    Lq[r] = in ? lse[u * g.Nq + i0 + r] : 0.f;
    Dq[r] = in ? Dg[u * g.Nq + i0 + r] : 0.f;
  }
  FragC acc[DP / 16];
#pragma unroll
  for (int n = 0; n < DP / 16; ++n) wm::fill_fragment(acc[n], 0.f);
  const i64 last = (i0 + kTB < g.Nq ? i0 + kTB : g.Nq) - 1;
  const i64 e_hi = row_end(g, last, len);
  for (i64 j0 = 0; j0 < e_hi; j0 += kTB) {
    __syncthreads();
    load_tile<H, DP>(Ks, L::H, kTB, K, j0, e_hi, g.d);
    load_tile<H, DP>(Vs, L::H, kTB, V, j0, e_hi, g.d);
    __syncthreads();
    strip_xyT<H, DP>(Qs + w * 16 * L::H, Ks, L::H, Ss + w * 16 * L::S, L::S);    // S
    strip_xyT<H, DP>(dOs + w * 16 * L::H, Vs, L::H, dPs + w * 16 * L::S, L::S);  // dP
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const int r = w * 16 + rr;
      const i64 i = i0 + r;
      const i64 e = i < g.Nq ? row_end(g, i, len) : 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = lane + 32 * half;
        const float p = j0 + c < e ? attn::prob(Ss[r * L::S + c] * scale, Lq[r]) : 0.f;
        dSs[r * L::P + c] = to_h<H>(attn::dscore(p, dPs[r * L::S + c], Dq[r]));
      }
    }
    __syncwarp();
    strip_acc<H, DP>(acc, dSs + w * 16 * L::P, L::P, Ks, L::H);  // dQ += dS K
  }
  __syncthreads();
  store_strip<H, DP>(acc, Ss + w * 16 * L::O, dq + u * g.Nq * g.d, i0 + w * 16, g.Nq, g.d, scale);
#else
  __trap();
#endif
}

// ================================ launchers ================================
Geo geo_of(const attn::Dims& dm, const std::int64_t* lens) {
  return Geo{dm.B, dm.H, dm.Hkv, dm.Nq, dm.Nk, dm.d, dm.group(), dm.causal, dm.scale, lens};
}
unsigned tiles(i64 n, int t) { return static_cast<unsigned>((n + t - 1) / t); }

// Runs f(std::integral_constant DP) for the padded head size.
template <class F> void by_dp(i64 d, F f) {
  if (d <= 32) f(std::integral_constant<int, 32>{});
  else if (d <= 64) f(std::integral_constant<int, 64>{});
  else if (d <= 128) f(std::integral_constant<int, 128>{});
  else throw Error("attention: no CUDA kernel for head size d = " + std::to_string(d) + " (the CUDA kernels take d <= 128)");
}
template <class K> void launch(K kernel, dim3 grid, int threads, std::size_t smem, Geo g, const char* what, auto... args) {
  if (grid.x == 0 || grid.y == 0) return;
  // the tiles along the sequence are the grid's y: at most 65,535 (about 4 million
  // rows of f32, 2 million of f64); say so rather than fail to launch
  if (grid.y > 65535u)
    throw Error(std::string(what) + ": the sequence needs " + std::to_string(grid.y) +
                " tiles, over the CUDA grid's limit of 65535 (Nq or Nk too long for these kernels)");
  int dev = 0, optin = 0;
  check_call(cudaGetDevice(&dev), "cudaGetDevice");
  check_call(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
  if (smem > static_cast<std::size_t>(optin))  // e.g. 99 KB on sm_86 / sm_89 parts, against 227 KB on an H100
    throw Error(std::string(what) + ": needs " + std::to_string(smem) + " bytes of shared memory per block, this GPU allows " +
                std::to_string(optin) + " (head size d = " + std::to_string(g.d) +
                "; a smaller head size needs less)");
  check_call(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
             "cudaFuncSetAttribute (attention shared memory)");
  kernel<<<grid, threads, smem>>>(g, args...);
  check_launch(what);
}

// SIMT tile shapes: f32 64 x 64 (dK/dV: 64 keys x 32 queries, dQ: 64 queries x
// 32 keys, to stay within shared memory at DP = 128); f64 half of each.
template <class A> struct Simt {
  static constexpr int F = sizeof(A) == 4 ? 64 : 32, S = F / 2;
};
template <class A> constexpr std::size_t simt_fwd_smem(int DP) {
  constexpr int F = Simt<A>::F;
  return sizeof(A) * (static_cast<std::size_t>(3 * F) * (DP + 1) + F * (F + 1));
}
template <class A> constexpr std::size_t simt_kv_smem(int DP) {  // BC = F keys, BR = S queries
  constexpr int F = Simt<A>::F, S = Simt<A>::S;
  return sizeof(A) * (static_cast<std::size_t>(2 * F + 2 * S) * (DP + 1) + 2 * S * (F + 1) + 2 * S);
}
template <class A> constexpr std::size_t simt_q_smem(int DP) {  // BR = F queries, BC = S keys
  constexpr int F = Simt<A>::F, S = Simt<A>::S;
  return sizeof(A) * (static_cast<std::size_t>(2 * F + 2 * S) * (DP + 1) + F * (S + 1));
}

}  // namespace

void attention_forward(DType t, const attn::Dims& dm, const void* q, const void* k, const void* v,
                       const std::int64_t* lens, void* o, void* lse) {
  const Geo g = geo_of(dm, lens);
  const i64 units = dm.B * dm.H;
  if (units == 0 || dm.Nq == 0) return;
  by_dp(dm.d, [&](auto dpc) {
    constexpr int DP = decltype(dpc)::value;
    auto simt = [&](auto z) {
      using A = decltype(z);
      constexpr int F = Simt<A>::F;
      launch(fwd_simt<A, F, F, DP>, dim3(static_cast<unsigned>(units), tiles(dm.Nq, F)), 256, simt_fwd_smem<A>(DP), g,
             "attention (forward)", static_cast<const A*>(q), static_cast<const A*>(k), static_cast<const A*>(v),
             static_cast<A*>(o), static_cast<A*>(lse));
    };
    auto tc = [&](auto z) {
      using H = decltype(z);
      launch(fwd_tc<H, DP>, dim3(static_cast<unsigned>(units), tiles(dm.Nq, kTB)), 128, tc_fwd_smem<DP>(2), g,
             "attention (forward, tensor cores)", static_cast<const H*>(q), static_cast<const H*>(k),
             static_cast<const H*>(v), static_cast<H*>(o), static_cast<float*>(lse));
    };
    switch (t) {
      case DType::f32: simt(float{}); break;
      case DType::f64: simt(double{}); break;
      case DType::bf16: tc(__nv_bfloat16{}); break;
      case DType::f16: tc(__half{}); break;
      default: throw Error(std::string("attention: no CUDA kernel for dtype ") + dtype_name(t));
    }
  });
}

void attention_backward(DType t, const attn::Dims& dm, const void* q, const void* k, const void* v, const void* o,
                        const void* lse, const void* dout, const void* dlse, const std::int64_t* lens, void* dq,
                        void* dk, void* dv, void* ws) {
  const Geo g = geo_of(dm, lens);
  const i64 rows = dm.B * dm.H * dm.Nq;
  by_dp(dm.d, [&](auto dpc) {
    constexpr int DP = decltype(dpc)::value;
    auto simt = [&](auto z) {
      using A = decltype(z);
      constexpr int F = Simt<A>::F, S = Simt<A>::S;
      A* D = static_cast<A*>(ws);
      for_each_index(RowD<A, A>{static_cast<const A*>(o), static_cast<const A*>(dout), static_cast<const A*>(dlse), D,
                                dm.d},
                     rows, "attention_backward (D)");
      const A *Q = static_cast<const A*>(q), *K = static_cast<const A*>(k), *V = static_cast<const A*>(v),
              *dO = static_cast<const A*>(dout), *L = static_cast<const A*>(lse);
      launch(bwd_kv_simt<A, S, F, DP>, dim3(static_cast<unsigned>(dm.B * dm.Hkv), tiles(dm.Nk, F)), 256,
             simt_kv_smem<A>(DP), g, "attention_backward (dk, dv)", Q, K, V, dO, L, static_cast<const A*>(D),
             static_cast<A*>(dk), static_cast<A*>(dv));
      launch(bwd_q_simt<A, F, S, DP>, dim3(static_cast<unsigned>(dm.B * dm.H), tiles(dm.Nq, F)), 256,
             simt_q_smem<A>(DP), g, "attention_backward (dq)", Q, K, V, dO, L, static_cast<const A*>(D),
             static_cast<A*>(dq));
    };
    auto tc = [&](auto z) {
      using H = decltype(z);
      float* D = static_cast<float*>(ws);
      for_each_index(RowDHalf<H>{static_cast<const H*>(o), static_cast<const H*>(dout), static_cast<const float*>(dlse),
                                 D, dm.d},
                     rows, "attention_backward (D)");
      const H *Q = static_cast<const H*>(q), *K = static_cast<const H*>(k), *V = static_cast<const H*>(v),
              *dO = static_cast<const H*>(dout);
      const float* L = static_cast<const float*>(lse);
      launch(bwd_kv_tc<H, DP>, dim3(static_cast<unsigned>(dm.B * dm.Hkv), tiles(dm.Nk, kTB)), 128,
             tc_bwd_smem<DP>(2), g, "attention_backward (dk, dv, tensor cores)", Q, K, V, dO, L,
             static_cast<const float*>(D), static_cast<H*>(dk), static_cast<H*>(dv));
      launch(bwd_q_tc<H, DP>, dim3(static_cast<unsigned>(dm.B * dm.H), tiles(dm.Nq, kTB)), 128, tc_bwd_smem<DP>(2), g,
             "attention_backward (dq, tensor cores)", Q, K, V, dO, L, static_cast<const float*>(D),
             static_cast<H*>(dq));
    };
    switch (t) {
      case DType::f32: simt(float{}); break;
      case DType::f64: simt(double{}); break;
      case DType::bf16: tc(__nv_bfloat16{}); break;
      case DType::f16: tc(__half{}); break;
      default: throw Error(std::string("attention_backward: no CUDA kernel for dtype ") + dtype_name(t));
    }
  });
}

}  // namespace ad::cuda_k
