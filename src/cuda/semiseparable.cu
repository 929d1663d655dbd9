// CUDA kernels of the semiseparable and tridiagonal ops (compiled, not yet run
// on a GPU). The structure mirrors the CPU kernels (src/ops/semiseparable_cpu.cpp,
// tridiag_cpu.cpp): rows are cut into the same chunks of L rows; sums over rows
// are formed per chunk in the compute type, then combined over chunks in order
// in double (total, exclusive prefix or exclusive suffix), so every result has
// a fixed order: no atomics anywhere. The non-causal products V^T x, U^T dy,
// U W and V G are strided-batched cuBLAS GEMMs instead.
//
// One generic "sweep" kernel covers every O(N r D) loop: a thread owns one
// column e of a K x C state M (K rows in registers, kKB at a time) and walks
// the rows of its chunk, in order or reversed:
//   update: M[k][e] += A(b,i)[k] * X(b,i)[e]
//   output: O(b,i)[e] += sum_k Bv(b,i)[k] * M[k][e]
// With sum_b, the thread walks every batch in order and O has no batch stride
// (the parameter gradients du, dv: sums over b without atomics).
//
// The Woodbury solve (semiseparable_solve; tests/cuda.cpp against the CPU) composes
// the Thomas launchers, cuBLAS, the sweep and a one-thread LU of the r x r
// capacitance matrix with the CPU's own code (semisep::lu_factor / lu_solve).
#include <cooperative_groups.h>
#include <cuda_pipeline_primitives.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/device.hpp"
#include "cuda/launch.hpp"
#include "cuda/semisep_plan.hpp"
#include "cuda/util.cuh"
#include "ops/semiseparable_cpu.hpp"
#include "ops/semiseparable_math.hpp"

namespace ad::cuda_k {

namespace {
using i64 = std::int64_t;
constexpr int kThreads = 128;
constexpr int kKB = 16;  // state rows held in registers per pass

template <class T> struct Src {
  const T* p;
  i64 bs, rs;  // element (b, i, j) at p[b * bs + i * rs + j]
  __device__ T at(i64 b, i64 i, i64 j) const { return p[b * bs + i * rs + j]; }
};
template <class T> struct SweepArgs {
  i64 B, N, L, nc;  // batches, rows, rows per chunk, chunks
  i64 K, C;         // state K x C
  T* S;             // state of (b, c), element (k, e): S[b * sb + c * sc + k * sk + e * se]
  i64 sb, sc, sk, se;
  Src<T> A, X, Bv;
  T* O;
  i64 obs, ors;     // O(b, i)[e] at O[b * obs + i * ors + e]
  bool reverse, sum_b;
};

// kStore: M starts at 0 and is written back to S (chunk sums); otherwise M
// starts from S (read only).
template <class T, bool kUpdate, bool kOut, bool kStore> __global__ void sweep_kernel(SweepArgs<T> s) {
  const i64 nb = s.sum_b ? 1 : s.B, total = nb * s.nc * s.C;
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 e = t % s.C, c = (t / s.C) % s.nc, bb = t / (s.C * s.nc);
    const i64 i0 = c * s.L, i1 = (i0 + s.L < s.N) ? i0 + s.L : s.N, n = i1 - i0;
    const i64 b0 = s.sum_b ? 0 : bb, b1 = s.sum_b ? s.B : bb + 1;
    for (i64 b = b0; b < b1; ++b) {
      T* st = s.S + b * s.sb + c * s.sc + e * s.se;
      for (i64 k0 = 0; k0 < s.K; k0 += kKB) {
        T m[kKB];
#pragma unroll
        for (int q = 0; q < kKB; ++q) m[q] = (!kStore && k0 + q < s.K) ? st[(k0 + q) * s.sk] : T(0);
        for (i64 j = 0; j < n; ++j) {
          const i64 i = s.reverse ? i1 - 1 - j : i0 + j;
          if constexpr (kUpdate) {
            const T xv = s.X.at(b, i, e);
#pragma unroll
            for (int q = 0; q < kKB; ++q)
              if (k0 + q < s.K) m[q] += s.A.at(b, i, k0 + q) * xv;
          }
          if constexpr (kOut) {
            T* o = s.O + b * s.obs + i * s.ors + e;
            T acc = *o;
#pragma unroll
            for (int q = 0; q < kKB; ++q)
              if (k0 + q < s.K) acc += s.Bv.at(b, i, k0 + q) * m[q];
            *o = acc;
          }
        }
        if constexpr (kStore) {
#pragma unroll
          for (int q = 0; q < kKB; ++q)
            if (k0 + q < s.K) st[(k0 + q) * s.sk] = m[q];
        }
      }
    }
  }
}
enum class Mode { sums, mix, scan };
template <class T> void sweep(Mode mode, const SweepArgs<T>& s, const char* what) {
  const i64 total = (s.sum_b ? 1 : s.B) * s.nc * s.C;
  if (total <= 0 || s.K <= 0 || s.N <= 0) return;
  const unsigned g = grid_for(total, kThreads);
  switch (mode) {
    case Mode::sums: sweep_kernel<T, true, false, true><<<g, kThreads>>>(s); break;
    case Mode::mix: sweep_kernel<T, false, true, false><<<g, kThreads>>>(s); break;
    case Mode::scan: sweep_kernel<T, true, true, false><<<g, kThreads>>>(s); break;
  }
  check_launch(what);
}

// Per b, over the chunk slots (width elements each, slot c of b at S + (b * nc + c) * width),
// in double: kind 0 total (into slot 0), 1 exclusive prefix in chunk order, 2
// exclusive suffix. A block takes 32 elements of one b (a lane each, loads
// coalesced) and cuts the chunks into kGroups runs, a warp each: run totals,
// an exclusive scan over the runs, then each warp rewrites its run, loading
// kBatch slots ahead. The order depends on nc only (deterministic); it is not
// the CPU's strictly sequential order, so the doubles may differ in the last
// bits before they are rounded to T.
constexpr int kGroups = 32, kBatch = 8;
template <class T> __global__ void __launch_bounds__(32 * kGroups) combine_kernel(T* S, i64 B, i64 nc, i64 width, int kind) {
  __shared__ double run[kGroups][32];
  const int lane = threadIdx.x, w = threadIdx.y;
  const i64 jt = (width + 31) / 32;
  for (i64 blk = blockIdx.x; blk < B * jt; blk += gridDim.x) {
    const i64 b = blk / jt, j = (blk % jt) * 32 + lane;
    const bool on = j < width;
    T* base = S + b * nc * width + j;
    const i64 per = (nc + kGroups - 1) / kGroups, q0 = w * per, q1 = q0 + per < nc ? q0 + per : nc;
    // slot of the q-th chunk in scan order
    auto slot = [&](i64 q) { return base + (kind == 2 ? nc - 1 - q : q) * width; };
    double acc = 0;
    if (on)
      for (i64 q = q0; q < q1; q += kBatch) {
        T v[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) v[k] = q + k < q1 ? *slot(q + k) : T(0);
#pragma unroll
        for (int k = 0; k < kBatch; ++k) acc += static_cast<double>(v[k]);
      }
    run[w][lane] = acc;
    __syncthreads();
    if (w == 0) {
      double total = 0;
      for (int g = 0; g < kGroups; ++g) {
        const double t = run[g][lane];
        run[g][lane] = total;
        total += t;
      }
      if (kind == 0 && on) *base = static_cast<T>(total);
    }
    __syncthreads();
    if (kind != 0 && on) {
      double p = run[w][lane];
      for (i64 q = q0; q < q1; q += kBatch) {
        T v[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) v[k] = q + k < q1 ? *slot(q + k) : T(0);
#pragma unroll
        for (int k = 0; k < kBatch; ++k)
          if (q + k < q1) {
            *slot(q + k) = static_cast<T>(p);
            p += static_cast<double>(v[k]);
          }
      }
    }
    __syncthreads();  // run is rewritten for the next block of elements
  }
}
template <class T> void combine(T* S, i64 B, i64 nc, i64 width, int kind) {
  if (B * width <= 0 || nc <= 0) return;
  const i64 blocks = B * ((width + 31) / 32);
  combine_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), dim3(32, kGroups)>>>(S, B, nc, width, kind);
  check_launch("semiseparable (combine chunk sums)");
}

// out[b,i,e] (= or +=) p[i-1] in[b,i-1,e] + d[i] in[b,i,e] + q[i] in[b,i+1,e]
// (p or q nullptr: that neighbour left out), the CPU's order of terms.
template <class T>
__global__ void band_kernel(const T* in, const T* d, const T* p, const T* q, T* out, i64 B, i64 N, i64 D, bool add) {
  const i64 total = B * N * D;
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 i = (t / D) % N;
    T v = d[i] * in[t];
    if (p && i > 0) v = p[i - 1] * in[t - D] + v;
    if (q && i + 1 < N) v = v + q[i] * in[t + D];
    out[t] = add ? out[t] + v : v;
  }
}
template <class T> void band(const T* in, const T* d, const T* p, const T* q, T* out, i64 B, i64 N, i64 D, bool add) {
  if (B * N * D <= 0) return;
  band_kernel<<<grid_for(B * N * D, kThreads), kThreads>>>(in, d, p, q, out, B, N, D, add);
  check_launch("semiseparable (tridiagonal band)");
}

// The band's gradients, one thread per row i, sums over b in order:
// dd_i = sum dy_i . x_i, dup_i = sum dy_i . x_{i+1} (0 when causal), dlo_i = sum dy_{i+1} . x_i.
template <class T>
__global__ void band_grads_kernel(const T* x, const T* dy, T* dd, T* dup, T* dlo, i64 B, i64 N, i64 D, bool causal) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    T sd = T(0), su = T(0), sl = T(0);
    for (i64 b = 0; b < B; ++b) {
      const T *xi = x + (b * N + i) * D, *gi = dy + (b * N + i) * D;
      T pd = T(0), pu = T(0), pl = T(0);
      for (i64 e = 0; e < D; ++e) pd += gi[e] * xi[e];
      sd += pd;
      if (i + 1 < N) {
        if (!causal)
          for (i64 e = 0; e < D; ++e) pu += gi[e] * xi[D + e];
        for (i64 e = 0; e < D; ++e) pl += gi[D + e] * xi[e];
        su += pu;
        sl += pl;
      }
    }
    if (dd) dd[i] = sd;
    if (i + 1 < N) {
      if (dup) dup[i] = su;
      if (dlo) dlo[i] = sl;
    }
  }
}

// ---- the forward product, tiled (f32 / f64; r <= 32, D <= 256) ----
// Three kernels over shared-memory tiles, each FMA's operands in registers:
//   chunk sums  S_c = sum_{i in chunk c} v_i (x) x_i (r x D): a block per
//               chunk, a thread per 4 x 4 tile of S and row lane, the lanes
//               added in order at the end;
//   full rows   y_i = T x + u_i . W, W = sum_c S_c: a thread per 2 rows x 4
//               columns, W and the block's rows of u in shared memory;
//   causal scan y_i = lo x_{i-1} + d x_i + u_i . P_i, P_i = P_{i-1} + v_i (x) x_i
//               from the chunk's exclusive prefix: a thread per chunk and
//               column holds P (KB registers), the
//               block's rows of u and v staged in shared memory.
// Rows of u and v are staged with zeros past r (KB or kp: r rounded up to 4),
// x with zeros past D (Dp), so the tiles need no bounds inside.
constexpr int kTileThreads = 256;
constexpr int kSmemBytes = 32768;  // per block, under the default 48 KB
template <class T> struct Four {
  T a[4];
};
__device__ inline Four<float> ld4(const float* p) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  return {{q.x, q.y, q.z, q.w}};
}
__device__ inline Four<double> ld4(const double* p) {
  const double2 q0 = reinterpret_cast<const double2*>(p)[0], q1 = reinterpret_cast<const double2*>(p)[1];
  return {{q0.x, q0.y, q1.x, q1.y}};
}
inline int round4(i64 n) { return static_cast<int>((n + 3) / 4 * 4); }

template <class T>
__global__ void chunk_sums_kernel(const T* x, const T* v, T* S, i64 B, i64 N, i64 D, i64 r, i64 L, i64 nc, int kp,
                                  int Dp, int RB) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const sm = reinterpret_cast<T*>(smem_raw);
  T* const vs = sm;            // RB x kp
  T* const xs = sm + RB * kp;  // RB x Dp
  const int nthr = static_cast<int>(blockDim.x), me = static_cast<int>(threadIdx.x);
  const int ne = Dp / 4, ntiles = (kp / 4) * ne;
  for (i64 bc = blockIdx.x; bc < B * nc; bc += gridDim.x) {
    const i64 b = bc / nc, i0 = (bc % nc) * L, n = (i0 + L < N ? L : N - i0);
    for (int tbase = 0; tbase < ntiles; tbase += nthr) {
      const int tcount = ntiles - tbase < nthr ? ntiles - tbase : nthr, G = nthr / tcount;
      const bool active = me < G * tcount;
      const int tl = me % tcount, g = me / tcount, kq = (tbase + tl) / ne, eq = (tbase + tl) % ne;
      T acc[4][4] = {};
      for (i64 t0 = 0; t0 < n; t0 += RB) {
        const int m = static_cast<int>(n - t0 < RB ? n - t0 : RB);
        __syncthreads();  // the last tile is consumed
        for (int t = me; t < m * kp; t += nthr) {
          const int j = t / kp, k = t % kp;
          vs[t] = k < r ? v[(i0 + t0 + j) * r + k] : T(0);
        }
        for (int t = me; t < m * Dp; t += nthr) {
          const int j = t / Dp, e = t % Dp;
          xs[t] = e < D ? x[(b * N + i0 + t0 + j) * D + e] : T(0);
        }
        __syncthreads();
        if (active)
          for (int j = g; j < m; j += G) {
            const Four<T> vv = ld4(vs + j * kp + 4 * kq), xx = ld4(xs + j * Dp + 4 * eq);
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
              for (int q = 0; q < 4; ++q) acc[a][q] += vv.a[a] * xx.a[q];
          }
      }
      __syncthreads();  // sm now holds the lanes' partial tiles: (g, tl) at (g * tcount + tl) * 16
      if (active)
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int q = 0; q < 4; ++q) sm[(g * tcount + tl) * 16 + a * 4 + q] = acc[a][q];
      __syncthreads();
      for (int o = me; o < tcount * 16; o += nthr) {
        const int t = o / 16, aq = o % 16, k = ((tbase + t) / ne) * 4 + aq / 4, e = ((tbase + t) % ne) * 4 + aq % 4;
        T sum = T(0);
        for (int gg = 0; gg < G; ++gg) sum += sm[(gg * tcount + t) * 16 + aq];
        if (k < r && e < D) S[(bc * r + k) * D + e] = sum;
      }
    }
  }
}

template <class T>
__global__ void full_rows_kernel(const T* x, const T* d, const T* up, const T* lo, const T* u, const T* S, T* y, i64 B,
                                 i64 N, i64 D, i64 r, i64 nc, int kp, int Dp, int rows) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const Ws = reinterpret_cast<T*>(smem_raw);  // kp x Dp
  T* const us = Ws + kp * Dp;                      // rows x kp
  const int nthr = static_cast<int>(blockDim.x), me = static_cast<int>(threadIdx.x), ne = Dp / 4;
  const int eq = me % ne, j0 = 2 * (me / ne), j1 = j0 + 1;
  const i64 tiles = (N + rows - 1) / rows;
  i64 staged = -1;
  for (i64 bt = blockIdx.x; bt < B * tiles; bt += gridDim.x) {
    const i64 rt = B * tiles - 1 - bt;  // last rows first: the chunk sums read them last
    const i64 b = rt / tiles, i0 = (rt % tiles) * rows;
    const int m = static_cast<int>(N - i0 < rows ? N - i0 : rows);
    __syncthreads();
    if (b != staged) {
      for (int t = me; t < kp * Dp; t += nthr) {
        const int k = t / Dp, e = t % Dp;
        Ws[t] = k < r && e < D ? S[(b * nc * r + k) * D + e] : T(0);
      }
      staged = b;
    }
    for (int t = me; t < m * kp; t += nthr) {
      const int j = t / kp, k = t % kp;
      us[t] = k < r ? u[(i0 + j) * r + k] : T(0);
    }
    __syncthreads();
    if (j0 >= m) continue;
    const bool two = j1 < m;
    T acc[2][4] = {};
    for (int k = 0; k < kp; k += 4) {
      const Four<T> ua = ld4(us + j0 * kp + k), ub = ld4(us + (two ? j1 : j0) * kp + k);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const Four<T> w = ld4(Ws + (k + a) * Dp + 4 * eq);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc[0][q] += ua.a[a] * w.a[q];
          acc[1][q] += ub.a[a] * w.a[q];
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h == 1 && !two) break;
      const i64 i = i0 + j0 + h;
      const T di = d[i], li = i > 0 ? lo[i - 1] : T(0), ui = i + 1 < N ? up[i] : T(0);
      const T* xi = x + (b * N + i) * D;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const i64 e = 4 * eq + q;
        if (e >= D) break;
        T band = di * xi[e];
        if (i > 0) band = li * xi[e - D] + band;
        if (i + 1 < N) band = band + ui * xi[e + D];
        y[(b * N + i) * D + e] = band + acc[h][q];
      }
    }
  }
}

template <class T, int KB, int EC>
__global__ void causal_scan_kernel(const T* x, const T* d, const T* lo, const T* u, const T* v, const T* S, T* y, i64 B,
                                   i64 N, i64 D, i64 r, i64 L, i64 nc, int CPB, int RB) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const us = reinterpret_cast<T*>(smem_raw);  // CPB x RB x KB
  T* const vs = us + CPB * RB * KB;
  const int nthr = static_cast<int>(blockDim.x), me = static_cast<int>(threadIdx.x);
  const int tpc = static_cast<int>((D + EC - 1) / EC), cl = me / tpc, e0 = (me % tpc) * EC;
  const i64 nblk = (nc + CPB - 1) / CPB;
  for (i64 bb = blockIdx.x; bb < B * nblk; bb += gridDim.x) {
    const i64 rb = B * nblk - 1 - bb;  // last chunks first: the chunk sums read their x last
    const i64 b = rb / nblk, c0 = (rb % nblk) * CPB, c = c0 + cl, i0 = c * L;
    const bool on = cl < CPB && c < nc;
    const i64 n = on ? (i0 + L < N ? L : N - i0) : 0;
    T P[KB][EC], xp[EC], xv[EC];
#pragma unroll
    for (int q = 0; q < EC; ++q) {
      const i64 e = e0 + q;
      const bool col = on && e < D;
#pragma unroll
      for (int k = 0; k < KB; ++k) P[k][q] = col && k < r ? S[((b * nc + c) * r + k) * D + e] : T(0);
      xp[q] = col && i0 > 0 ? x[(b * N + i0 - 1) * D + e] : T(0);
      xv[q] = col && n > 0 ? x[(b * N + i0) * D + e] : T(0);
    }
    for (i64 t0 = 0; t0 < L; t0 += RB) {  // the same trip count in every thread (barriers)
      const int m = static_cast<int>(L - t0 < RB ? L - t0 : RB);
      __syncthreads();
      for (int t = me; t < CPB * m * KB; t += nthr) {
        const int cc = t / (m * KB), j = (t / KB) % m, k = t % KB;
        const i64 ii = (c0 + cc) * L + t0 + j;
        const bool ok = k < r && c0 + cc < nc && ii < N;
        const int at = (cc * RB + j) * KB + k;
        us[at] = ok ? u[ii * r + k] : T(0);
        vs[at] = ok ? v[ii * r + k] : T(0);
      }
      __syncthreads();
      const int mm = static_cast<int>(n - t0 < m ? (n - t0 > 0 ? n - t0 : 0) : m);
      for (int j = 0; j < mm; ++j) {
        const i64 i = i0 + t0 + j;
        T xn[EC];  // the next row's x, loaded ahead
#pragma unroll
        for (int q = 0; q < EC; ++q) xn[q] = e0 + q < D && t0 + j + 1 < n ? x[(b * N + i + 1) * D + e0 + q] : T(0);
        const T di = d[i], li = i > 0 ? lo[i - 1] : T(0);
        const T* vr = vs + (cl * RB + j) * KB;
        const T* ur = us + (cl * RB + j) * KB;
#pragma unroll
        for (int k = 0; k < KB; k += 4) {
          const Four<T> vv = ld4(vr + k);
#pragma unroll
          for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int q = 0; q < EC; ++q) P[k + a][q] += vv.a[a] * xv[q];
        }
        T o[4][EC] = {};
#pragma unroll
        for (int k = 0; k < KB; k += 4) {
          const Four<T> uu = ld4(ur + k);
#pragma unroll
          for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int q = 0; q < EC; ++q) o[a][q] += uu.a[a] * P[k + a][q];
        }
#pragma unroll
        for (int q = 0; q < EC; ++q) {
          const i64 e = e0 + q;
          if (e < D) {
            T band = di * xv[q];
            if (i > 0) band = li * xp[q] + band;
            y[(b * N + i) * D + e] = band + ((o[0][q] + o[1][q]) + (o[2][q] + o[3][q]));
          }
          xp[q] = xv[q];
          xv[q] = xn[q];
        }
      }
    }
  }
}

// Whether the tiled kernels take this product (else the generic sweeps).
// (and W with two rows of u fits kSmemBytes)
bool tiled(const SemisepDims& dm, std::size_t es) {
  return dm.r >= 1 && dm.r <= 32 && dm.D >= 1 && dm.D <= 256 &&
         static_cast<std::size_t>(round4(dm.r)) * (round4(dm.D) + 2) * es <= static_cast<std::size_t>(kSmemBytes);
}
// rows per block of the full product: 2 per thread, W (kp x Dp) and the rows
// of u (rows x kp) within kSmemBytes (tiled() leaves room for 2)
template <class T> int full_rows_per_block(int kp, int Dp) {
  const int ne = Dp / 4, by_threads = 2 * std::max(1, kTileThreads / ne);
  const int fit = (kSmemBytes / static_cast<int>(sizeof(T)) - kp * Dp) / kp;
  return std::max(2, std::min(by_threads, fit / 2 * 2));
}
unsigned capped(i64 blocks) { return static_cast<unsigned>(blocks < 4096 ? blocks : 4096); }

template <class T> void chunk_sums(const SemisepDims& dm, const T* x, const T* v, T* S) {
  const i64 nc = (dm.N + dm.L - 1) / dm.L;
  const int kp = round4(dm.r), Dp = round4(dm.D);
  int RB = kSmemBytes / ((kp + Dp) * static_cast<int>(sizeof(T)));
  RB = RB < 1 ? 1 : (RB > 64 ? 64 : RB);
  const int red = kTileThreads * 16;  // the lanes' partial tiles
  const std::size_t smem = static_cast<std::size_t>(std::max(RB * (kp + Dp), red)) * sizeof(T);
  chunk_sums_kernel<T><<<capped(dm.B * nc), kTileThreads, smem>>>(x, v, S, dm.B, dm.N, dm.D, dm.r, dm.L, nc, kp, Dp, RB);
  check_launch("semiseparable_matvec (chunk sums)");
}

template <class T, int KB, int EC>
void causal_scan(const SemisepDims& dm, const T* x, const T* d, const T* lo, const T* u, const T* v, const T* S, T* y) {
  const i64 nc = (dm.N + dm.L - 1) / dm.L;
  const int tpc = static_cast<int>((dm.D + EC - 1) / EC);
  const int CPB = std::min(tpc >= 128 ? 1 : 128 / tpc, kSmemBytes / (KB * 2 * static_cast<int>(sizeof(T))));
  int RB = kSmemBytes / (CPB * KB * 2 * static_cast<int>(sizeof(T)));
  RB = RB < 1 ? 1 : (RB > 32 ? 32 : RB);
  const std::size_t smem = static_cast<std::size_t>(CPB) * RB * KB * 2 * sizeof(T);
  causal_scan_kernel<T, KB, EC><<<capped(dm.B * ((nc + CPB - 1) / CPB)), CPB * tpc, smem>>>(
      x, d, lo, u, v, S, y, dm.B, dm.N, dm.D, dm.r, dm.L, nc, CPB, RB);
  check_launch("semiseparable_matvec (causal scan)");
}
template <class T, int EC>
void causal_scan_kb(const SemisepDims& dm, const T* x, const T* d, const T* lo, const T* u, const T* v, const T* S,
                    T* y) {
  if (dm.r <= 4) causal_scan<T, 4, EC>(dm, x, d, lo, u, v, S, y);
  else if (dm.r <= 8) causal_scan<T, 8, EC>(dm, x, d, lo, u, v, S, y);
  else if (dm.r <= 16) causal_scan<T, 16, EC>(dm, x, d, lo, u, v, S, y);
  else if (dm.r <= 24) causal_scan<T, 24, EC>(dm, x, d, lo, u, v, S, y);
  else causal_scan<T, 32, EC>(dm, x, d, lo, u, v, S, y);
}

// ---- the forward product, second generation (warp-level) ----
// The first tiled kernels (above) spent most of their instructions staging
// rows into shared memory with a division per element, and held too few
// loads in flight (H200, N = 2^22, r = 22, D = 16: full 1.44 ms, causal
// 2.45 ms against a 0.135 ms copy). These keep each warp's lanes on the same
// rows, so a row of u or v is one broadcast, and move data without index
// division:
//   chunk sums  8 warps per chunk (rows strided by 8), lane = a 4 x 4 tile of
//               S (r/4 x D/4 <= 32 tiles), loads straight from memory (16-byte
//               x, 8-byte v where aligned), 4 rows in flight; the warps added
//               in order at the end;
//   full rows   lane = (row slot, 4 columns); W in shared memory per block,
//               each warp's rows of u copied in (odd stride: no bank
//               conflicts), the band's x rows loaded first;
//   causal scan a warp takes 32 / D chunks (D <= 32), lane = (chunk, column)
//               with P[KB] in registers; rows of u, v, x, d and lo are copied
//               to shared memory RB rows at a time with cp.async, the next
//               tile in flight while the current one is scanned.
template <bool kVec> __device__ inline void ld_x4(const float* p, int avail, float* o) {
  if constexpr (kVec) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    o[0] = q.x, o[1] = q.y, o[2] = q.z, o[3] = q.w;
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) o[q] = q < avail ? p[q] : 0.f;
  }
}
template <bool kVec> __device__ inline void ld_x4(const double* p, int avail, double* o) {
#pragma unroll
  for (int q = 0; q < 4; ++q) o[q] = q < avail ? p[q] : 0.0;
}
// 4 values of a row of v from p (avail of them exist): two 8-byte loads when r is even
template <bool kVec> __device__ inline void ld_v4(const float* p, int avail, float* o) {
  if constexpr (kVec) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    const float2 b = avail > 2 ? *reinterpret_cast<const float2*>(p + 2) : float2{0.f, 0.f};
    o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y;
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) o[q] = q < avail ? p[q] : 0.f;
  }
}
template <bool kVec> __device__ inline void ld_v4(const double* p, int avail, double* o) {
#pragma unroll
  for (int q = 0; q < 4; ++q) o[q] = q < avail ? p[q] : 0.0;
}
inline bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

template <class T, bool kVX, bool kVV>
__global__ void __launch_bounds__(256) chunk_sums2_kernel(const T* x, const T* v, T* S, i64 B, i64 N, i64 D, i64 r,
                                                          i64 L, i64 nc, int ne, int ntiles) {
  __shared__ T red[8][32 * 16];
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5;
  const bool on = lane < ntiles;
  const int k0 = on ? 4 * (lane / ne) : 0, e0 = on ? 4 * (lane % ne) : 0;
  const int kav = static_cast<int>(r) - k0, eav = static_cast<int>(D) - e0;
  for (i64 bc = blockIdx.x; bc < B * nc; bc += gridDim.x) {
    const i64 b = bc / nc, i0 = (bc % nc) * L, n = (i0 + L < N ? L : N - i0);
    T acc[4][4] = {};
    if (on) {
      const T* xr = x + (b * N + i0) * D + e0;
      const T* vr = v + i0 * r + k0;
#pragma unroll 8
      for (i64 j = w; j < n; j += 8) {
        T xx[4], vv[4];
        ld_x4<kVX>(xr + j * D, eav, xx);
        ld_v4<kVV>(vr + j * r, kav, vv);
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[a][q] += vv[a] * xx[q];
      }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[w][lane * 16 + a * 4 + q] = acc[a][q];
    __syncthreads();
    for (int o = static_cast<int>(threadIdx.x); o < ntiles * 16; o += static_cast<int>(blockDim.x)) {
      const int t = o >> 4, aq = o & 15, k = (t / ne) * 4 + (aq >> 2), e = (t % ne) * 4 + (aq & 3);
      T sum = red[0][o];
#pragma unroll
      for (int g = 1; g < 8; ++g) sum += red[g][o];
      if (k < r && e < D) S[(bc * r + k) * D + e] = sum;
    }
    __syncthreads();
  }
}

// One row's 4 columns of the full product: y = band + u_i . W[:, e0..e0+4)
template <class T, bool kVX>
__device__ inline void full_row_out(const T* ur, const T* Ws, int r, int Dp, int e0, int eav, i64 i, i64 N,
                                    const T* xc, const T* xm, const T* xn, T di, T li, T ui, T* yi) {
  T acc[4] = {};
  for (int k = 0; k < r; ++k) {
    const T uk = ur[k];
    const Four<T> wk = ld4(Ws + k * Dp + e0);
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] += uk * wk.a[q];
  }
  T out[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    T band = di * xc[q];
    if (i > 0) band = li * xm[q] + band;
    if (i + 1 < N) band = band + ui * xn[q];
    out[q] = band + acc[q];
  }
  if constexpr (kVX && sizeof(T) == 4) {
    *reinterpret_cast<float4*>(yi) = float4{out[0], out[1], out[2], out[3]};
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (q < eav) yi[q] = out[q];
  }
}

template <class T, bool kVX>
__global__ void __launch_bounds__(256) full_rows2_kernel(const T* x, const T* d, const T* up, const T* lo, const T* u,
                                                         const T* S, T* y, i64 B, i64 N, i64 D, i64 r, i64 nc, int Dp,
                                                         int ne, int rpw, int rs) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5;
  T* const Ws = reinterpret_cast<T*>(smem_raw);  // r x Dp (columns past D zero)
  T* const uw = Ws + r * Dp + w * rpw * rs;      // this warp's rows of u, stride rs (odd)
  const int sl = lane / ne, e0 = 4 * (lane % ne);
  const i64 rows_pb = 8 * static_cast<i64>(rpw), tiles = (N + rows_pb - 1) / rows_pb;
  i64 wb = -1;
  for (i64 bt = blockIdx.x; bt < B * tiles; bt += gridDim.x) {
    const i64 rt = B * tiles - 1 - bt;  // last rows first: the chunk sums read them last
    const i64 b = rt / tiles, ifirst = (rt % tiles) * rows_pb + w * rpw;
    if (b != wb) {
      __syncthreads();
      for (int t = static_cast<int>(threadIdx.x); t < r * Dp; t += static_cast<int>(blockDim.x)) {
        const int k = t / Dp, e = t % Dp;
        Ws[t] = e < D ? S[(b * nc * r + k) * D + e] : T(0);
      }
      __syncthreads();
      wb = b;
    }
    const int mw = static_cast<int>(N - ifirst < rpw ? (N - ifirst > 0 ? N - ifirst : 0) : rpw);
    const i64 i = ifirst + sl;
    const bool on = sl < mw;
    const int eav = static_cast<int>(D) - e0;
    T xc[4] = {}, xm[4] = {}, xn[4] = {}, di = T(0), li = T(0), ui = T(0);
    if (on) {  // the band's loads first: they fly while u is copied in
      const T* xi = x + (b * N + i) * D + e0;
      ld_x4<kVX>(xi, eav, xc);
      if (i > 0) ld_x4<kVX>(xi - D, eav, xm), li = lo[i - 1];
      if (i + 1 < N) ld_x4<kVX>(xi + D, eav, xn), ui = up[i];
      di = d[i];
    }
    // this warp's rows of u (mw r values, contiguous) into uw at stride rs: 8 loads in flight per lane
    // before their stores
    const int tot = mw * static_cast<int>(r);
    const T* ug = u + ifirst * r;
    __syncwarp();  // the last rows' reads of uw are done
    for (int t0 = 0; t0 < tot; t0 += 256) {
      T tmp[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int t = t0 + q * 32 + lane;
        tmp[q] = t < tot ? ug[t] : T(0);
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int t = t0 + q * 32 + lane, row = t / static_cast<int>(r);
        if (t < tot) uw[row * rs + (t - row * static_cast<int>(r))] = tmp[q];
      }
    }
    __syncwarp();
    if (on) full_row_out<T, kVX>(uw + sl * rs, Ws, static_cast<int>(r), Dp, e0, eav, i, N, xc, xm, xn, di, li, ui,
                                 y + (b * N + i) * D + e0);
  }
}

template <class T, int KB>
__global__ void causal_scan2_kernel(const T* x, const T* d, const T* lo, const T* u, const T* v, const T* S, T* y,
                                    i64 B, i64 N, i64 D, i64 r, i64 L, i64 nc, int CPW, int RB, int ROW, int CH,
                                    int WPB) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5;
  T* const buf = reinterpret_cast<T*>(smem_raw) + static_cast<std::size_t>(w) * 2 * CPW * CH;
  const int h = lane / static_cast<int>(D), e = lane % static_cast<int>(D);
  // row layout (ROW values): u [0, KB), v [KB, 2 KB), x [2 KB, 2 KB + D), d, lo; rows of a chunk
  // RB apart, chunks CH apart (CH = RB ROW + 4: no bank conflict between chunks), two buffers
  const int ox = 2 * KB, od = 2 * KB + static_cast<int>(D);
  for (int q = lane; q < 2 * CPW * CH; q += 32) buf[q] = T(0);  // u, v past r stay 0
  __syncwarp();
  const i64 per_b = (nc + CPW - 1) / CPW, groups = B * per_b, tiles = (L + RB - 1) / RB;
  for (i64 gi = static_cast<i64>(blockIdx.x) * WPB + w; gi < groups; gi += static_cast<i64>(gridDim.x) * WPB) {
    const i64 rg = groups - 1 - gi;  // last chunks first: the chunk sums read their x last
    const i64 b = rg / per_b, c0 = (rg % per_b) * CPW, c = c0 + h;
    const bool on = h < CPW && c < nc;
    const i64 i0 = c * L, n = on ? (i0 + L < N ? L : N - i0) : 0;
    T P[KB];
#pragma unroll
    for (int k = 0; k < KB; ++k) P[k] = on && k < r ? S[((b * nc + c) * r + k) * D + e] : T(0);
    T xp = on && i0 > 0 ? x[(b * N + i0 - 1) * D + e] : T(0);
    auto issue = [&](i64 t) {
      T* bt = buf + (t & 1) * CPW * CH;
      const i64 t0 = t * RB;
      for (int hh = 0; hh < CPW; ++hh) {
        const i64 cc = c0 + hh;
        if (cc >= nc) break;
        const i64 ci0 = cc * L, nn = (ci0 + L < N ? L : N - ci0);
        const int m = static_cast<int>(nn - t0 < RB ? (nn - t0 > 0 ? nn - t0 : 0) : RB);
        for (int j = 0; j < m; ++j) {
          const i64 i = ci0 + t0 + j;
          T* row = bt + hh * CH + j * ROW;
          if (lane < r) {
            __pipeline_memcpy_async(row + lane, u + i * r + lane, sizeof(T));
            __pipeline_memcpy_async(row + KB + lane, v + i * r + lane, sizeof(T));
          }
          if (lane < D) __pipeline_memcpy_async(row + ox + lane, x + (b * N + i) * D + lane, sizeof(T));
          if (lane == 0) __pipeline_memcpy_async(row + od, d + i, sizeof(T));
          if (lane == 1) {
            if (i > 0) __pipeline_memcpy_async(row + od + 1, lo + i - 1, sizeof(T));
            else row[od + 1] = T(0);
          }
        }
      }
      __pipeline_commit();
    };
    issue(0);
    for (i64 t = 0; t < tiles; ++t) {
      if (t + 1 < tiles) issue(t + 1);
      else __pipeline_commit();  // an empty group: one group per step
      __pipeline_wait_prior(1);  // tile t's copies (this lane's) are done
      __syncwarp();              // and every lane's are visible
      const T* base = buf + (t & 1) * CPW * CH + h * CH;
      const i64 t0 = t * RB;
      const int mm = on ? static_cast<int>(n - t0 < RB ? (n - t0 > 0 ? n - t0 : 0) : RB) : 0;
      for (int j = 0; j < mm; ++j) {
        const T* row = base + j * ROW;
        const T xv = row[ox + e], di = row[od], li = row[od + 1];
#pragma unroll
        for (int k = 0; k < KB; k += 4) {
          const Four<T> vv = ld4(row + KB + k);
#pragma unroll
          for (int a = 0; a < 4; ++a) P[k + a] += vv.a[a] * xv;
        }
        T o[4] = {};
#pragma unroll
        for (int k = 0; k < KB; k += 4) {
          const Four<T> uu = ld4(row + k);
#pragma unroll
          for (int a = 0; a < 4; ++a) o[a] += uu.a[a] * P[k + a];
        }
        const i64 i = i0 + t0 + j;
        T band = di * xv;
        if (i > 0) band = li * xp + band;
        y[(b * N + i) * D + e] = band + ((o[0] + o[1]) + (o[2] + o[3]));
        xp = xv;
      }
      __syncwarp();  // buffer t & 1 is read before issue(t + 2) refills it
    }
  }
}

template <class T> bool sums2_applies(const SemisepDims& dm) { return semisep_plan::sums_tiles(dm.r, dm.D) <= 32; }
template <class T> void chunk_sums2(const SemisepDims& dm, const T* x, const T* v, T* S) {
  const i64 nc = (dm.N + dm.L - 1) / dm.L;
  const int ne = round4(dm.D) / 4, ntiles = (round4(dm.r) / 4) * ne;
  const bool vx = sizeof(T) == 4 && dm.D % 4 == 0 && aligned(x, 16), vv = sizeof(T) == 4 && dm.r % 2 == 0 && aligned(v, 8);
  const unsigned g = capped(dm.B * nc);
  if (vx && vv) chunk_sums2_kernel<T, true, true><<<g, 256>>>(x, v, S, dm.B, dm.N, dm.D, dm.r, dm.L, nc, ne, ntiles);
  else if (vx) chunk_sums2_kernel<T, true, false><<<g, 256>>>(x, v, S, dm.B, dm.N, dm.D, dm.r, dm.L, nc, ne, ntiles);
  else if (vv) chunk_sums2_kernel<T, false, true><<<g, 256>>>(x, v, S, dm.B, dm.N, dm.D, dm.r, dm.L, nc, ne, ntiles);
  else chunk_sums2_kernel<T, false, false><<<g, 256>>>(x, v, S, dm.B, dm.N, dm.D, dm.r, dm.L, nc, ne, ntiles);
  check_launch("semiseparable_matvec (chunk sums)");
}
template <class T>
void full_rows2(const SemisepDims& dm, const T* x, const T* d, const T* up, const T* lo, const T* u, const T* S,
                T* y) {
  const i64 nc = (dm.N + dm.L - 1) / dm.L;
  const semisep_plan::Rows p = semisep_plan::rows(dm.r, dm.D, static_cast<int>(sizeof(T)));
  const int Dp = p.Dp, ne = p.ne, rpw = p.rpw, rs = p.rs;
  const auto smem = static_cast<std::size_t>(p.smem_bytes);
  const i64 tiles = (dm.N + 8 * rpw - 1) / (8 * rpw);
  const unsigned g = static_cast<unsigned>(std::min<i64>(dm.B * tiles, 132 * 8));
  const bool vx = sizeof(T) == 4 && dm.D % 4 == 0 && aligned(x, 16) && aligned(y, 16);
  if (vx)
    full_rows2_kernel<T, true><<<g, 256, smem>>>(x, d, up, lo, u, S, y, dm.B, dm.N, dm.D, dm.r, nc, Dp, ne, rpw, rs);
  else
    full_rows2_kernel<T, false><<<g, 256, smem>>>(x, d, up, lo, u, S, y, dm.B, dm.N, dm.D, dm.r, nc, Dp, ne, rpw, rs);
  check_launch("semiseparable_matvec (rows)");
}
template <class T, int KB>
void causal_scan2(const SemisepDims& dm, const T* x, const T* d, const T* lo, const T* u, const T* v, const T* S,
                  T* y) {
  const i64 nc = (dm.N + dm.L - 1) / dm.L;
  const semisep_plan::Scan p = semisep_plan::scan(dm.D, KB, static_cast<int>(sizeof(T)));
  const int CPW = p.CPW, RB = p.RB, ROW = p.ROW, CH = p.CH, WPB = p.WPB;
  const auto smem = static_cast<std::size_t>(p.smem_bytes);
  const i64 groups = dm.B * ((nc + CPW - 1) / CPW);
  const unsigned g = static_cast<unsigned>(std::min<i64>((groups + WPB - 1) / WPB, 65535));
  causal_scan2_kernel<T, KB><<<g, 32 * WPB, smem>>>(x, d, lo, u, v, S, y, dm.B, dm.N, dm.D, dm.r, dm.L, nc, CPW, RB,
                                                    ROW, CH, WPB);
  check_launch("semiseparable_matvec (causal scan)");
}
template <class T>
void causal_scan2_kb(const SemisepDims& dm, const T* x, const T* d, const T* lo, const T* u, const T* v, const T* S,
                     T* y) {
  if (dm.r <= 4) causal_scan2<T, 4>(dm, x, d, lo, u, v, S, y);
  else if (dm.r <= 8) causal_scan2<T, 8>(dm, x, d, lo, u, v, S, y);
  else if (dm.r <= 16) causal_scan2<T, 16>(dm, x, d, lo, u, v, S, y);
  else if (dm.r <= 24) causal_scan2<T, 24>(dm, x, d, lo, u, v, S, y);
  else causal_scan2<T, 32>(dm, x, d, lo, u, v, S, y);
}

// ---- the forward product, third generation (staged; f32, D % 4 == 0) ----
// The warp-level kernels above reached half the copy rate in both stages
// (H200, N = 2^22, r = 22, D = 16: sums 1.94 TB/s, rows 1.97 TB/s): each warp
// held a few rows' loads in registers, and registers capped the bytes in
// flight. These copy contiguous spans of rows (x, v, u, d, up, lo: each tile
// of rows is one span per array) to shared memory with cp.async, 16 bytes a
// piece where both ends are 16-byte aligned, ST tiles in flight per block,
// and read only shared memory in the arithmetic (plans in semisep_plan.hpp).

// cnt elements g[0, cnt) -> s[0, cnt), spread over the block's threads, by
// cp(s + q, g + q, bytes) of 16 bytes where both ends are 16-byte aligned, else
// of 4 (the caller commits the group)
template <class Cp> __device__ inline void stage_span_by(float* s, const float* g, int cnt, Cp cp) {
  const int t = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  int q0 = 0;
  if (((reinterpret_cast<std::uintptr_t>(s) | reinterpret_cast<std::uintptr_t>(g)) & 15) == 0) {
    const int nv = cnt / 4;
    for (int q = t; q < nv; q += nt) cp(s + 4 * q, g + 4 * q, 16);
    q0 = 4 * nv;
  }
  for (int q = q0 + t; q < cnt; q += nt) cp(s + q, g + q, 4);
}
__device__ inline void stage_span(float* s, const float* g, int cnt) {
  stage_span_by(s, g, cnt, [](float* d, const float* src, int bytes) { __pipeline_memcpy_async(d, src, bytes); });
}

// Bulk copies (sm_90): one thread moves a whole span, 16-byte aligned at both
// ends and a multiple of 16 bytes long, and the copy engine counts the bytes
// in on an mbarrier that the block waits on. Elsewhere (sm_80) the launchers
// never ask for them, and these compile to nothing.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define AD_SEMISEP_BULK 1
#else
#define AD_SEMISEP_BULK 0
#endif
#if AD_SEMISEP_BULK
__device__ inline std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
#endif
__device__ inline void mbar_init(std::uint64_t* b) {
#if AD_SEMISEP_BULK
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(b)) : "memory");
#else
  (void)b;
#endif
}
__device__ inline void mbar_init_fence() {
#if AD_SEMISEP_BULK
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// the issuing thread: the stage's reads are done (a barrier before), the bytes to expect, then the copies
__device__ inline void mbar_expect(std::uint64_t* b, std::uint32_t bytes) {
#if AD_SEMISEP_BULK
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
#else
  (void)b, (void)bytes;
#endif
}
__device__ inline void bulk_copy(float* dst, const float* src, std::uint32_t bytes, std::uint64_t* b) {
#if AD_SEMISEP_BULK
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(b))
               : "memory");
#else
  (void)dst, (void)src, (void)bytes, (void)b;
#endif
}
__device__ inline void mbar_wait(std::uint64_t* b, std::uint32_t parity) {
#if AD_SEMISEP_BULK
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
#else
  (void)b, (void)parity;
#endif
}

// Chunk sums S_c = sum_{i in c} v_i (x) x_i: a block per chunk; lane = a 4 x TE
// tile of S in one of G groups, group g taking rows g, g + G, ... of each tile.
// kBulk: whole tiles by bulk copy (the chunk's last tile, if short, by cp.async).
template <bool kV2, bool kBulk, int ST, int TE>
__global__ void __launch_bounds__(256) chunk_sums3_kernel(const float* x, const float* v, float* S, i64 N, int D, int r,
                                                          i64 L, i64 nc, int R, int stage, int ne, int ntiles, int tpg,
                                                          int G) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ __align__(8) std::uint64_t bar[ST];
  float* const sm = reinterpret_cast<float*>(smem_raw);
  const int t = static_cast<int>(threadIdx.x), g = t / tpg, tl = t % tpg;
  const bool on = tl < ntiles;
  const int k0 = on ? 4 * (tl / ne) : 0, e0 = on ? TE * (tl % ne) : 0;
  const i64 bc = blockIdx.x, b = bc / nc, i0 = (bc % nc) * L;
  const int n = static_cast<int>(i0 + L < N ? L : N - i0), ntl = (n + R - 1) / R;
  const float* const xc = x + (b * N + i0) * D;
  const float* const vc = v + i0 * r;
  if constexpr (kBulk) {
    if (t == 0) {
      for (int q = 0; q < ST; ++q) mbar_init(&bar[q]);
      mbar_init_fence();
    }
    __syncthreads();
  }
  // whole tiles go in bulk when their v span is 16-byte aligned and long (x's always is: D % 4 == 0)
  auto bulk = [&](int tt) { return kBulk && (tt + 1) * R <= n && ((i0 + tt * R) * r) % 4 == 0 && ((R * r) & 3) == 0; };
  auto issue = [&](int tt) {
    float* st = sm + (tt % ST) * stage;
    const int m = min(R, n - tt * R);
    if (bulk(tt)) {
      if (t == 0) {
        mbar_expect(&bar[tt % ST], static_cast<std::uint32_t>(m * (D + r) * 4));
        bulk_copy(st, xc + tt * R * D, static_cast<std::uint32_t>(m * D * 4), &bar[tt % ST]);
        bulk_copy(st + R * D, vc + tt * R * r, static_cast<std::uint32_t>(m * r * 4), &bar[tt % ST]);
      }
    } else {
      stage_span(st, xc + tt * R * D, m * D);
      stage_span(st + R * D, vc + tt * R * r, m * r);
    }
  };
  for (int tt = 0; tt < ST - 1; ++tt) {
    if (tt < ntl) issue(tt);
    __pipeline_commit();
  }
  float acc[4][TE] = {};
  for (int tt = 0; tt < ntl; ++tt) {
    __pipeline_wait_prior(ST - 2);  // tile tt's copies (this thread's) are done
    if (bulk(tt)) mbar_wait(&bar[tt % ST], (tt / ST) & 1);  // a stage's uses before tt were all bulk
    __syncthreads();  // every thread's copies are in, and tile tt - 1 is no longer read
    if (tt + ST - 1 < ntl) issue(tt + ST - 1);
    __pipeline_commit();
    const float* st = sm + (tt % ST) * stage;
    const int m = min(R, n - tt * R);
    if (on) {
      const float* xs = st + e0;
      const float* vs = st + R * D + k0;
#pragma unroll 4
      for (int j = g; j < m; j += G) {
        float xx[TE];
#pragma unroll
        for (int q = 0; q < TE; q += 4) {
          const Four<float> f = ld4(xs + j * D + q);
          xx[q] = f.a[0], xx[q + 1] = f.a[1], xx[q + 2] = f.a[2], xx[q + 3] = f.a[3];
        }
        float vv[4];
        if constexpr (kV2) {
          const float2 a = *reinterpret_cast<const float2*>(vs + j * r), c = *reinterpret_cast<const float2*>(vs + j * r + 2);
          vv[0] = a.x, vv[1] = a.y, vv[2] = c.x, vv[3] = c.y;
        } else {
#pragma unroll
          for (int a = 0; a < 4; ++a) vv[a] = vs[j * r + a];
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int q = 0; q < TE; ++q) acc[a][q] += vv[a] * xx[q];
      }
    }
  }
  __pipeline_wait_prior(0);
  __syncthreads();  // the stages are free: the groups' partials go there
  constexpr int TS = 4 * TE;  // elements of a lane's tile
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int q = 0; q < TE; ++q) sm[(g * tpg + tl) * TS + a * TE + q] = acc[a][q];
  __syncthreads();
  for (int o = t; o < ntiles * TS; o += static_cast<int>(blockDim.x)) {
    const int tile = o / TS, aq = o % TS, k = (tile / ne) * 4 + aq / TE, e = (tile % ne) * TE + aq % TE;
    float sum = sm[o];
    for (int gg = 1; gg < G; ++gg) sum += sm[gg * tpg * TS + o];
    if (k < r) S[(bc * r + k) * D + e] = sum;
  }
}

// Full rows y_i = d_i x_i + lo_{i-1} x_{i-1} + up_i x_{i+1} + u_i . W, W = V^T x
// (slot 0 of b's chunk sums, combined): persistent blocks walk tiles of R rows,
// last tiles first (the chunk sums read them last); thread = (row pair p,
// column quad q) takes rows p and p + R / 2. A stage: x rows [t0 - 1, t0 + R
// + 1), u, d, up, and lo from t0 - 4 (16-byte aligned; from 0 when t0 = 0), so
// that every span but the last tile's goes in bulk (kBulk).
template <bool kV2, bool kBulk, int ST>
__global__ void __launch_bounds__(256) full_rows3_kernel(const float* x, const float* d, const float* up,
                                                         const float* lo, const float* u, const float* S, float* y,
                                                         i64 B, i64 N, int D, int r, i64 nc, int R, int stage) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ __align__(8) std::uint64_t bar[ST];
  float* const sm = reinterpret_cast<float*>(smem_raw);
  float* const W = sm + ST * stage;  // r x D
  const int t = static_cast<int>(threadIdx.x), Dq = D / 4, q = t % Dq, p = t / Dq;
  const int e0 = 4 * q, half = R / 2;
  const bool on = p < half;
  const int ox = 0, ou = (R + 2) * D, od = ou + (R * r + 3) / 4 * 4, oup = od + R, olo = oup + R;
  // tiles counted in 32 bits (the launcher checks B * tiles < 2^31): a 64-bit division per tile cost
  // more instructions than the tile's arithmetic
  const int tiles = static_cast<int>((N + R - 1) / R), total = static_cast<int>(B) * tiles;
  // the block's k-th tile: tiles from the last
  auto tile_of = [&](int k) { return total - 1 - (static_cast<int>(blockIdx.x) + k * static_cast<int>(gridDim.x)); };
  const int mine = total > static_cast<int>(blockIdx.x)
                       ? (total - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1
                       : 0;
  if constexpr (kBulk) {
    if (t == 0) {
      for (int s = 0; s < ST; ++s) mbar_init(&bar[s]);
      mbar_init_fence();
    }
    __syncthreads();
  }
  // a tile goes in bulk unless it is a batch's last (short, or with up and lo one short)
  auto bulk = [&](i64 t0) { return kBulk && t0 + R < N; };
  auto issue = [&](int k) {
    float* st = sm + (k % ST) * stage;
    const int tt = tile_of(k);
    const i64 b = tt / tiles, t0 = static_cast<i64>(tt % tiles) * R;
    const int m = static_cast<int>(N - t0 < R ? N - t0 : R);
    const i64 xa = t0 > 0 ? t0 - 1 : 0, xb = (t0 + m + 1 < N ? t0 + m + 1 : N);
    const i64 la = t0 > 0 ? t0 - 4 : 0;  // lo_{i-1} at olo + (i - 1 - la)
    if (bulk(t0)) {
      if (t == 0) {
        const int nx = static_cast<int>(xb - xa) * D, nl = static_cast<int>(t0 + m - la);
        std::uint64_t* br = &bar[k % ST];
        mbar_expect(br, static_cast<std::uint32_t>((nx + m * r + 2 * m + nl) * 4));
        bulk_copy(st + ox + (xa - t0 + 1) * D, x + (b * N + xa) * D, static_cast<std::uint32_t>(nx * 4), br);
        bulk_copy(st + ou, u + t0 * r, static_cast<std::uint32_t>(m * r * 4), br);
        bulk_copy(st + od, d + t0, static_cast<std::uint32_t>(m * 4), br);
        bulk_copy(st + oup, up + t0, static_cast<std::uint32_t>(m * 4), br);
        bulk_copy(st + olo, lo + la, static_cast<std::uint32_t>(nl * 4), br);
      }
    } else {
      stage_span(st + ox + (xa - t0 + 1) * D, x + (b * N + xa) * D, static_cast<int>(xb - xa) * D);
      stage_span(st + ou, u + t0 * r, m * r);
      stage_span(st + od, d + t0, m);
      stage_span(st + oup, up + t0, t0 + m < N ? m : m - 1);  // up has N - 1 elements
      stage_span(st + olo, lo + la, static_cast<int>(t0 + m - 1 - la));
    }
  };
  for (int k = 0; k < ST - 1; ++k) {
    if (k < mine) issue(k);
    __pipeline_commit();
  }
  std::uint32_t phase = 0;  // bit s: the parity stage s's next bulk fill completes
  i64 wb = -1;
  for (int k = 0; k < mine; ++k) {
    const int tt = tile_of(k);
    const i64 b = tt / tiles, t0 = static_cast<i64>(tt % tiles) * R;
    const int m = static_cast<int>(N - t0 < R ? N - t0 : R), s = k % ST;
    __pipeline_wait_prior(ST - 2);
    if (bulk(t0)) {
      mbar_wait(&bar[s], (phase >> s) & 1u);
      phase ^= 1u << s;
    }
    __syncthreads();
    if (k + ST - 1 < mine) issue(k + ST - 1);
    __pipeline_commit();
    if (b != wb) {  // uniform over the block
      for (int e = t; e < r * D; e += static_cast<int>(blockDim.x)) W[e] = S[b * nc * r * D + e];
      __syncthreads();
      wb = b;
    }
    if (!on) continue;
    const float* st = sm + s * stage;
    const int j0 = p, j1 = p + half, lofs = t0 > 0 ? 3 : -1;
    const bool h0 = j0 < m, h1 = j1 < m;
    float a0[4] = {}, a1[4] = {};
    if (h0) {
      const float* u0 = st + ou + j0 * r;
      const float* u1 = st + ou + (h1 ? j1 : j0) * r;
      const float* wq = W + e0;
      int kk = 0;
      if constexpr (kV2) {
#pragma unroll 2
        for (; kk + 1 < r; kk += 2) {
          const float2 p0 = *reinterpret_cast<const float2*>(u0 + kk), p1 = *reinterpret_cast<const float2*>(u1 + kk);
          const Four<float> w0 = ld4(wq + kk * D), w1 = ld4(wq + (kk + 1) * D);
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            a0[c] += p0.x * w0.a[c];
            a1[c] += p1.x * w0.a[c];
          }
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            a0[c] += p0.y * w1.a[c];
            a1[c] += p1.y * w1.a[c];
          }
        }
      }
      for (; kk < r; ++kk) {
        const float s0 = u0[kk], s1 = u1[kk];
        const Four<float> w0 = ld4(wq + kk * D);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          a0[c] += s0 * w0.a[c];
          a1[c] += s1 * w0.a[c];
        }
      }
    }
    auto out = [&](int j, const float* acc) {
      const i64 i = t0 + j;
      const float* xc = st + ox + (j + 1) * D + e0;
      const Four<float> c = ld4(xc);
      const float di = st[od + j];
      float o[4];
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) o[cc] = di * c.a[cc];
      if (i > 0) {
        const Four<float> mm = ld4(xc - D);
        const float li = st[olo + j + lofs];
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) o[cc] = li * mm.a[cc] + o[cc];
      }
      if (i + 1 < N) {
        const Four<float> nn = ld4(xc + D);
        const float ui = st[oup + j];
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) o[cc] = o[cc] + ui * nn.a[cc];
      }
      *reinterpret_cast<float4*>(y + (b * N + i) * D + e0) =
          float4{o[0] + acc[0], o[1] + acc[1], o[2] + acc[2], o[3] + acc[3]};
    };
    if (h0) out(j0, a0);
    if (h1) out(j1, a1);
  }
  __pipeline_wait_prior(0);
}

// The shared memory one block may take on this device after opting in (227 KB on an H100 or H200,
// 163 KB on an A100, 99 KB on sm_86 / sm_89 parts): plans over it fall back to other kernels.
i64 block_smem_optin() {
  int dev = 0, bytes = 0;
  check_call(cudaGetDevice(&dev), "cudaGetDevice");
  check_call(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
  return bytes;
}
// 16-byte aligned x and y (the rows' float4 stores); the other arrays need only their elements'
// alignment (bulk copies check theirs: bulk_copies)
bool staged_applies(const SemisepDims& dm, std::size_t es, const void* x, const void* y) {
  if (!semisep_plan::staged_applies(dm.r, dm.D, static_cast<int>(es)) || !aligned(x, 16) || !aligned(y, 16) ||
      dm.B * ((dm.N + 7) / 8) >= (i64{1} << 31))  // the rows kernel counts its tiles (of 8 rows or more) in int
    return false;
  const i64 smem = std::max(semisep_plan::staged_sums(dm.r, dm.D).smem_bytes,
                            semisep_plan::staged_rows(dm.r, dm.D).smem_bytes);
  return smem <= block_smem_optin();
}
// blocks of a persistent grid: as many as fit on the device at once
template <class K> unsigned resident_blocks(K kernel, std::size_t smem) {
  int dev = 0, sms = 0, per = 0;
  check_call(cudaGetDevice(&dev), "cudaGetDevice");
  check_call(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  check_call(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, 256, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return static_cast<unsigned>(std::max(1, sms * std::max(1, per)));
}
template <class K> void allow_smem(K kernel, std::size_t smem) {
  if (smem > 48 * 1024)
    check_call(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
               "cudaFuncSetAttribute (semiseparable_matvec)");
}
// Bulk copies where the device has them (sm_90 and later) and every array the
// kernels copy from starts 16-byte aligned.
bool bulk_copies(std::initializer_list<const void*> ptrs) {
  int dev = 0, major = 0;
  check_call(cudaGetDevice(&dev), "cudaGetDevice");
  check_call(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  if (major < 9) return false;
  for (const void* q : ptrs)
    if (!aligned(q, 16)) return false;
  return true;
}
void chunk_sums3(const SemisepDims& dm, const float* x, const float* v, float* S, bool bulk) {
  const i64 nc = (dm.N + dm.L - 1) / dm.L;
  const semisep_plan::StagedSums p = semisep_plan::staged_sums(dm.r, dm.D);
  const auto smem = static_cast<std::size_t>(p.smem_bytes);
  const auto g = static_cast<unsigned>(dm.B * nc);
  constexpr int ST = semisep_plan::kSumsStages;
  auto launch = [&](auto kernel) {
    allow_smem(kernel, smem);
    kernel<<<g, 256, smem>>>(x, v, S, dm.N, static_cast<int>(dm.D), static_cast<int>(dm.r), dm.L, nc, p.R, p.stage,
                             p.ne, p.ntiles, p.tpg, p.G);
  };
  bulk = bulk && bulk_copies({x, v});
  constexpr int TE = 4;  // semisep_plan::staged_sums
  if (dm.r % 2 == 0) bulk ? launch(chunk_sums3_kernel<true, true, ST, TE>) : launch(chunk_sums3_kernel<true, false, ST, TE>);
  else bulk ? launch(chunk_sums3_kernel<false, true, ST, TE>) : launch(chunk_sums3_kernel<false, false, ST, TE>);
  check_launch("semiseparable_matvec (chunk sums)");
}
void full_rows3(const SemisepDims& dm, const float* x, const float* d, const float* up, const float* lo, const float* u,
                const float* S, float* y, bool bulk) {
  const i64 nc = (dm.N + dm.L - 1) / dm.L;
  const semisep_plan::StagedRows p = semisep_plan::staged_rows(dm.r, dm.D);
  const auto smem = static_cast<std::size_t>(p.smem_bytes);
  const i64 total = dm.B * ((dm.N + p.R - 1) / p.R);  // < 2^31 (staged_applies)
  constexpr int ST = semisep_plan::kRowsStages;
  auto launch = [&](auto kernel) {
    allow_smem(kernel, smem);
    const unsigned g = static_cast<unsigned>(std::min<i64>(total, resident_blocks(kernel, smem)));
    kernel<<<g, 256, smem>>>(x, d, up, lo, u, S, y, dm.B, dm.N, static_cast<int>(dm.D), static_cast<int>(dm.r), nc, p.R,
                             p.stage);
  };
  bulk = bulk && bulk_copies({x, d, up, lo, u});
  if (dm.r % 2 == 0) bulk ? launch(full_rows3_kernel<true, true, ST>) : launch(full_rows3_kernel<true, false, ST>);
  else bulk ? launch(full_rows3_kernel<false, true, ST>) : launch(full_rows3_kernel<false, false, ST>);
  check_launch("semiseparable_matvec (rows)");
}

// ---- the causal product in one pass (staged; f32, D in {8, 16, 32, 64}) ----
// Two passes (chunk sums, then the scan re-reading x and v) move 1.91 GB at
// the issue's size, 1.4 times the bytes the product needs. Here a block takes
// a chunk in counter order and copies its x, v, u, d and lo to shared memory
// once: phase 1 forms the sums of its H sub-chunks (a thread per sub-chunk
// and 2 columns, the same walk as the scan without outputs) as soon as x and
// v are in, scans them across the block (warp shuffles, then the 8 warps'
// totals), publishes the chunk's sum and finds its exclusive prefix by a
// decoupled look-back (a warp polls the flags of the 32 chunks before it;
// sums in f32, added and published as prefixes in f64); phase 2 walks the
// sub-chunks again from their prefixes with outputs, reading shared memory
// only (plan: semisep_plan::staged_scan).
// polls read relaxed (an acquire load invalidates L1 on every poll: a tenth of the kernel's stall samples
// on an H200); one fence follows the poll that finds the flags set
__device__ inline int ld_relaxed(const int* f) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
  return v;
}
__device__ inline void st_release(int* f, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(f), "r"(v) : "memory");
}
// acquire-release at device scope: what release and acquire patterns need
// (__threadfence() is sequentially consistent, a heavier MEMBAR.SC)
__device__ inline void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// ranks k, k + 1 of a row of u or v in shared memory. kExact: KB == r (r
// even: 8-byte loads, nothing past r); else (r odd, KB = r rounded up to 4)
// the last pairs read up to 3 elements into the next row, zeroed here
template <int KB, bool kExact>
__device__ inline float2 scan3_pair(const float* row, int k, int r) {
  if constexpr (kExact) {
    return *reinterpret_cast<const float2*>(row + k);
  } else {
    float2 a{row[k], row[k + 1]};
    if (k + 2 > KB - 4) {
      a.x = k < r ? a.x : 0.f;
      a.y = k + 1 < r ? a.y : 0.f;
    }
    return a;
  }
}
// one row of the walk: P += v_j (x) x_j[e, e + 1]
template <int KB, bool kExact>
__device__ inline void scan3_update(float (&P)[2][KB], const float* vrow, float2 xv, int r) {
#pragma unroll
  for (int k = 0; k < KB; k += 2) {
    const float2 vv = scan3_pair<KB, kExact>(vrow, k, r);
    P[0][k] += vv.x * xv.x;
    P[1][k] += vv.x * xv.y;
    P[0][k + 1] += vv.y * xv.x;
    P[1][k + 1] += vv.y * xv.y;
  }
}

// The chunk's rows to shared memory: group 0 is x from the row before the
// chunk (zeros before the first row), lo (lo_{i-1} at olo + (i - i0), 0
// before the first row), v and d; group 1 is u.
__device__ inline void scan3_copy(const semisep_plan::StagedScan& p, float* sm, const float* x, const float* d,
                                  const float* lo, const float* u, const float* v, i64 b, i64 N, i64 D, i64 r, i64 i0,
                                  int n) {
  const int t = static_cast<int>(threadIdx.x), Di = static_cast<int>(D), ri = static_cast<int>(r);
  if (i0 > 0) {
    stage_span(sm + p.ox, x + (b * N + i0 - 1) * D, static_cast<int>((n + 1) * D));
    stage_span(sm + p.olo, lo + i0 - 1, n);
  } else {
    for (int q = t; q < Di; q += 256) sm[p.ox + q] = 0.f;
    if (t == 0) sm[p.olo] = 0.f;
    stage_span(sm + p.ox + Di, x + b * N * D, n * Di);
    stage_span(sm + p.olo + 1, lo, n - 1);
  }
  stage_span(sm + p.ov, v + i0 * r, n * ri);
  stage_span(sm + p.od, d + i0, n);
  __pipeline_commit();
  stage_span(sm + p.ou, u + i0 * r, n * ri);
  __pipeline_commit();
}

// After every warp has written its total to wt ([8][r][D] floats, this
// barrier inside): a[q] the chunk's sum (f64) at elements 2 (t + 256 q) and
// + 1, and wt the warps' exclusive prefix (f32), in place.
__device__ inline void scan3_block_totals(float* wt, int rD, double2 (&a)[2]) {
  const int t = static_cast<int>(threadIdx.x);
  __syncthreads();
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int el = 2 * (t + 256 * q);
    a[q] = double2{0, 0};
    if (el < rD) {
      float2 run{0.f, 0.f};
      for (int ww = 0; ww < 8; ++ww) {
        const float2 v_ = *reinterpret_cast<const float2*>(wt + ww * rD + el);
        *reinterpret_cast<float2*>(wt + ww * rD + el) = run;
        run.x += v_.x, run.y += v_.y;
        a[q].x += static_cast<double>(v_.x), a[q].y += static_cast<double>(v_.y);
      }
    }
  }
}

// Phase 1, once x and v are in (group 0): this thread's sub-chunk sum, scanned
// across the block. On return P holds the sum of the sub-chunks before this
// one in its warp, wt ([8][r][D] at owt) the warps' exclusive prefix (f32),
// and a[q] the chunk's sum (f64) at elements 2 (t + 256 q) and + 1.
// `later`: copy groups committed after this chunk's two (a next chunk's).
template <int KB, bool kExact>
__device__ inline void scan3_phase1(const semisep_plan::StagedScan& p, float* sm, int n, int ri, int Di,
                                    float (&P)[2][KB], double2 (&a)[2], int later = 0) {
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, w = t >> 5;
  const int h = t / p.Dh, hw = lane / p.Dh, e = 2 * (t % p.Dh), rD = ri * Di;
  const int j_begin = min(h * p.SR, n), j_end = min(j_begin + p.SR, n);
  __pipeline_wait_prior(1 + later);
  __syncthreads();
#pragma unroll
  for (int k = 0; k < KB; ++k) P[0][k] = P[1][k] = 0.f;
  {
    const float* xr = sm + p.ox + (j_begin + 1) * Di + e;
    const float* vr = sm + p.ov + j_begin * ri;
    for (int j = j_begin; j < j_end; ++j, xr += Di, vr += ri)
      scan3_update<KB, kExact>(P, vr, *reinterpret_cast<const float2*>(xr), ri);
  }
  // inclusive scan over the warp's sub-chunks, the warp's total to wt, then exclusive
  for (int s = 1; s < p.HW; s <<= 1) {
#pragma unroll
    for (int k = 0; k < KB; ++k) {
      const float a0 = __shfl_up_sync(0xffffffffu, P[0][k], s * p.Dh), a1 = __shfl_up_sync(0xffffffffu, P[1][k], s * p.Dh);
      if (hw >= s) P[0][k] += a0, P[1][k] += a1;
    }
  }
  float* const wt = sm + p.owt;
  if (hw == p.HW - 1)
#pragma unroll
    for (int k = 0; k < KB; ++k)
      if (k < ri) wt[(w * ri + k) * Di + e] = P[0][k], wt[(w * ri + k) * Di + e + 1] = P[1][k];
#pragma unroll
  for (int k = 0; k < KB; ++k) {
    const float a0 = __shfl_up_sync(0xffffffffu, P[0][k], p.Dh), a1 = __shfl_up_sync(0xffffffffu, P[1][k], p.Dh);
    P[0][k] = hw > 0 ? a0 : 0.f;
    P[1][k] = hw > 0 ? a1 : 0.f;
  }
  scan3_block_totals(wt, rD, a);
}

// Phase 2, once u is in (group 1) and the chunk's exclusive prefix is in E
// (shared, r x D doubles; written before the barrier here): the scan with
// outputs, y_i = d_i x_i + lo_{i-1} x_{i-1} + u_i . P_i, from shared memory.
template <int KB, bool kExact>
__device__ inline void scan3_phase2(const semisep_plan::StagedScan& p, const float* sm, const double* E, float (&P)[2][KB],
                                    float* y, i64 b, i64 N, i64 i0, int n, int ri, int Di, int later = 0) {
  const int t = static_cast<int>(threadIdx.x), w = t >> 5;
  const int h = t / p.Dh, e = 2 * (t % p.Dh), rD = ri * Di;
  const int j_begin = min(h * p.SR, n), j_end = min(j_begin + p.SR, n);
  const float* const wt = sm + p.owt;
  __pipeline_wait_prior(later);  // u
  __syncthreads();
  // this sub-chunk's start: the chunk's prefix, the warps before (wt), the sub-chunks before in the warp
#pragma unroll
  for (int k = 0; k < KB; ++k) {
    if (k >= ri) {
      P[0][k] = P[1][k] = 0.f;
      continue;
    }
    const int el = k * Di + e;
    const float2 wp = *reinterpret_cast<const float2*>(wt + w * rD + el);
    P[0][k] = static_cast<float>(E[el] + static_cast<double>(wp.x) + static_cast<double>(P[0][k]));
    P[1][k] = static_cast<float>(E[el + 1] + static_cast<double>(wp.y) + static_cast<double>(P[1][k]));
  }
  const float* xr = sm + p.ox + (j_begin + 1) * Di + e;
  const float* vr = sm + p.ov + j_begin * ri;
  const float* ur = sm + p.ou + j_begin * ri;
  float* yr = y + (b * N + i0 + j_begin) * Di + e;
  for (int j = j_begin; j < j_end; ++j, xr += Di, vr += ri, ur += ri, yr += Di) {
    const float2 xv = *reinterpret_cast<const float2*>(xr);
    scan3_update<KB, kExact>(P, vr, xv, ri);
    float o0a = 0.f, o0b = 0.f, o1a = 0.f, o1b = 0.f;
#pragma unroll
    for (int k = 0; k < KB; k += 2) {
      const float2 uu = scan3_pair<KB, kExact>(ur, k, ri);
      o0a += uu.x * P[0][k];
      o1a += uu.x * P[1][k];
      o0b += uu.y * P[0][k + 1];
      o1b += uu.y * P[1][k + 1];
    }
    const float2 xm = *reinterpret_cast<const float2*>(xr - Di);
    const float di = sm[p.od + j], li = sm[p.olo + j];
    const float b0 = fmaf(li, xm.x, di * xv.x), b1 = fmaf(li, xm.y, di * xv.y);  // lo x_{i-1} + d x_i, as before
    *reinterpret_cast<float2*>(yr) = float2{b0 + (o0a + o0b), b1 + (o1a + o1b)};
  }
}

// stores of the block (element pairs, as TO: double2 or float2), then `flag`
// released at f (after every thread's fence)
template <class TO, class E>
__device__ inline void publish_sums(E* to, const double2 (&val)[2], int nP, int* f, int flag) {
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int q = 0; q < 2; ++q)
    if (t + 256 * q < nP) reinterpret_cast<TO*>(to)[t + 256 * q] = TO{static_cast<E>(val[q].x), static_cast<E>(val[q].y)};
  fence_acq_rel_gpu();
  __syncthreads();
  if (t == 0) st_release(f, flag);
}

// The exclusive prefix of unit c >= 1 of a sequence of units (chunks, or
// clusters of chunks), added into ex: f, ag and in are the sequence's flags
// (1: the unit's sum is published, 2: its inclusive prefix), sums (f32
// pairs) and inclusive prefixes (f64 pairs). Warp 0 polls the flags of the 32
// units before the nearest one not yet added until all of them back to the
// first with a prefix have their sums; then each thread adds its element
// pairs (pe = t + 256 q) of those sums, kLB in flight (a window of 32 units in
// one round trip; 16 at r > 28, for registers), and of the prefix found.
// Every thread of the block calls it (barriers inside); s_n and s_use are the
// block's shared scratch.
template <int KB>
__device__ inline void scan3_lookback(const int* f, const float2* ag, const double2* in, i64 c, int nP,
                                      double2 (&ex)[2], int& s_n, int& s_use) {
  constexpr int kPr = 2, kLB = KB > 28 ? 16 : 32;  // pairs of r x D per thread (r D <= 1024)
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, w = t >> 5;
  i64 pp = c - 1;  // the nearest unit not yet added
  for (;;) {
    if (w == 0) {
      int st = 0, fi = 32;
      for (;;) {
        const i64 cc = pp - lane;
        st = cc >= 0 ? ld_relaxed(f + cc) : 3;  // 3: before the sequence's first unit
        const unsigned stop = __ballot_sync(0xffffffffu, st >= 2), zero = __ballot_sync(0xffffffffu, st == 0);
        fi = stop ? __ffs(stop) - 1 : 32;
        const unsigned before = fi == 32 ? 0xffffffffu : ((1u << fi) - 1u);
        if ((zero & before) == 0) break;  // units pp .. pp - fi + 1 have their sums, pp - fi its prefix
      }
      const int stf = __shfl_sync(0xffffffffu, st, fi & 31);
      fence_acq_rel_gpu();  // the sums and prefixes behind the flags seen are read after this
      if (lane == 0) s_n = fi, s_use = fi < 32 && stf == 2;
    }
    __syncthreads();
    const int na = s_n, use = s_use;
#pragma unroll
    for (int q = 0; q < kPr; ++q) {
      const int pe = t + 256 * q;
      if (pe >= nP) continue;
      const float2* src = ag + pp * nP + pe;  // unit pp - m at src - m nP
      double2 s2 = use ? __ldcg(in + (pp - na) * nP + pe) : double2{0, 0};
      for (int m0 = 0; m0 < na; m0 += kLB) {
        float2 l[kLB];
#pragma unroll
        for (int k = 0; k < kLB; ++k) l[k] = m0 + k < na ? __ldcg(src - static_cast<i64>(m0 + k) * nP) : float2{0.f, 0.f};
#pragma unroll
        for (int k = 0; k < kLB; ++k) s2.x += static_cast<double>(l[k].x), s2.y += static_cast<double>(l[k].y);
      }
      ex[q].x += s2.x, ex[q].y += s2.y;
    }
    __syncthreads();  // s_n, s_use are read before warp 0 writes them again
    if (na < 32) break;
    pp -= 32;
  }
}

// Unit id (index c >= 0 in its batch, whose units start at id - c) publishes
// its sum and, past the batch's first unit, looks back for its exclusive
// prefix (added into ex) and publishes its inclusive prefix.
template <int KB>
__device__ inline void scan3_unit_prefix(int* flags, float* agg, double* inc, i64 id, i64 c, int nP,
                                         const double2 (&sum)[2], double2 (&ex)[2], int& s_n, int& s_use) {
  const i64 rD = 2 * static_cast<i64>(nP), base = id - c;
  if (c == 0) {
    publish_sums<double2>(inc + id * rD, sum, nP, flags + id, 2);
    return;
  }
  publish_sums<float2>(agg + id * rD, sum, nP, flags + id, 1);
  scan3_lookback<KB>(flags + base, reinterpret_cast<const float2*>(agg) + base * nP,
                     reinterpret_cast<const double2*>(inc) + base * nP, c, nP, ex, s_n, s_use);
  double2 incl[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) incl[q] = double2{ex[q].x + sum[q].x, ex[q].y + sum[q].y};
  publish_sums<double2>(inc + id * rD, incl, nP, flags + id, 2);
}

template <int KB, bool kExact>
__global__ void __launch_bounds__(256, 2) causal_scan3_kernel(const float* x, const float* d, const float* lo,
                                                              const float* u, const float* v, float* y, int* flags,
                                                              int* counter, float* agg, double* inc, i64 N, i64 D, i64 r, i64 nc,
                                                              semisep_plan::StagedScan p, int skip) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const sm = reinterpret_cast<float*>(smem_raw);
  double* const E = reinterpret_cast<double*>(sm + p.oE);  // the chunk's exclusive prefix (r x D)
  __shared__ long long s_id;
  __shared__ int s_n, s_use;
  const int t = static_cast<int>(threadIdx.x);
  const int rD = static_cast<int>(r * D), Di = static_cast<int>(D), ri = static_cast<int>(r);
  if (t == 0) s_id = atomicAdd(counter, 1);  // chunks start in this order: the ones a block waits for run
  __syncthreads();
  const i64 id = s_id, b = id / nc, c = id % nc, i0 = c * p.Lg;
  const int n = static_cast<int>(N - i0 < p.Lg ? N - i0 : p.Lg);
  scan3_copy(p, sm, x, d, lo, u, v, b, N, D, r, i0, n);
  float P[2][KB];  // the walks' sub-chunk prefixes
  double2 a[2], ex[2] = {double2{0, 0}, double2{0, 0}};
  // skip, timing only (bench variants 15 to 17; y is then not the product): bit 0 no walks (zero sums
  // published, y written as zeros), bit 1 no look-back (nothing published or waited for, a zero prefix)
  if (skip & 1) {
    __pipeline_wait_prior(1);  // x and v, as phase 1
    __syncthreads();
    a[0] = a[1] = double2{0, 0};
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int kk = 0; kk < KB; ++kk) P[h][kk] = 0.f;
  } else {
    scan3_phase1<KB, kExact>(p, sm, n, ri, Di, P, a);
  }
  // the chunk's sum, published (rounded to f32: the walks summed it in f32);
  // then the look-back for its exclusive prefix, added in f64 (inclusive
  // prefixes are published in f64). A thread takes element pairs (2 pe,
  // 2 pe + 1), pe = t + 256 q: the look-back reads 8 bytes per chunk and pair.
  constexpr int kPr = 2;  // pairs of r x D per thread (r D <= 1024)
  const int nP = rD / 2;  // D is even
  if (!(skip & 2)) scan3_unit_prefix<KB>(flags, agg, inc, id, c, nP, a, ex, s_n, s_use);
#pragma unroll
  for (int q = 0; q < kPr; ++q)
    if (t + 256 * q < nP) reinterpret_cast<double2*>(E)[t + 256 * q] = ex[q];
  if (skip & 1) {
    __pipeline_wait_prior(0);  // u, as phase 2
    __syncthreads();
    // D is 8, 16, 32 or 64 here (staged_scan): float4 stores
    float4* const y4 = reinterpret_cast<float4*>(y + (b * N + i0) * D);
    for (int e = t; e < n * Di / 4; e += 256) y4[e] = float4{0.f, 0.f, 0.f, 0.f};
  } else {
    scan3_phase2<KB, kExact>(p, sm, E, P, y, b, N, i0, n, ri, Di);
  }
}

bool scan3_applies(const SemisepDims& dm) {
  const semisep_plan::StagedScan p = semisep_plan::staged_scan(dm.r, dm.D);
  return p.fits && p.smem_bytes <= block_smem_optin();
}
template <int KB, bool kExact>
void causal_scan3_kb(const SemisepDims& dm, const float* x, const float* d, const float* lo, const float* u,
                     const float* v, float* y, void* ws, int skip = 0) {
  auto kernel = causal_scan3_kernel<KB, kExact>;
  const semisep_plan::StagedScan p = semisep_plan::staged_scan(dm.r, dm.D);
  const i64 nc = (dm.N + p.Lg - 1) / p.Lg, blocks = dm.B * nc, rD = dm.r * dm.D;
  // flags for the chunks and the counter; then the chunks' sums (f32) and inclusive prefixes (f64)
  int* flags = static_cast<int*>(ws);
  float* agg = reinterpret_cast<float*>(static_cast<char*>(ws) + semisep_plan::staged_scan_flag_bytes(dm.B, dm.N, dm.D, dm.r));
  double* inc = reinterpret_cast<double*>(agg + blocks * rD);  // 16-byte aligned: r D is a multiple of 8
  check_call(cudaMemsetAsync(flags, 0, static_cast<std::size_t>(blocks + 1) * sizeof(int)),
             "cudaMemsetAsync (semiseparable_matvec)");
  const auto smem = static_cast<std::size_t>(p.smem_bytes);
  allow_smem(kernel, smem);
  kernel<<<static_cast<unsigned>(blocks), 256, smem>>>(x, d, lo, u, v, y, flags, flags + blocks, agg, inc, dm.N, dm.D,
                                                       dm.r, nc, p, skip);
  check_launch("semiseparable_matvec (causal, one pass)");
}
// f(kb, exact) with kb = std::integral_constant<int, KB>: even r, a kernel for
// that rank exactly; odd r, r rounded up to 4, masked
template <class F> void scan3_by_rank(i64 r, F f) {
  using std::integral_constant;
  switch (r) {
#define AD_SCAN3_EVEN(R) \
  case R: f(integral_constant<int, R>{}, std::true_type{}); break;
    AD_SCAN3_EVEN(2) AD_SCAN3_EVEN(4) AD_SCAN3_EVEN(6) AD_SCAN3_EVEN(8) AD_SCAN3_EVEN(10) AD_SCAN3_EVEN(12)
    AD_SCAN3_EVEN(14) AD_SCAN3_EVEN(16) AD_SCAN3_EVEN(18) AD_SCAN3_EVEN(20) AD_SCAN3_EVEN(22) AD_SCAN3_EVEN(24)
    AD_SCAN3_EVEN(26) AD_SCAN3_EVEN(28) AD_SCAN3_EVEN(30) AD_SCAN3_EVEN(32)
#undef AD_SCAN3_EVEN
    default:
      switch ((r + 3) / 4) {
        case 1: f(integral_constant<int, 4>{}, std::false_type{}); break;
        case 2: f(integral_constant<int, 8>{}, std::false_type{}); break;
        case 3: f(integral_constant<int, 12>{}, std::false_type{}); break;
        case 4: f(integral_constant<int, 16>{}, std::false_type{}); break;
        case 5: f(integral_constant<int, 20>{}, std::false_type{}); break;
        case 6: f(integral_constant<int, 24>{}, std::false_type{}); break;
        case 7: f(integral_constant<int, 28>{}, std::false_type{}); break;
        default: f(integral_constant<int, 32>{}, std::false_type{}); break;
      }
  }
}
void causal_scan3(const SemisepDims& dm, const float* x, const float* d, const float* lo, const float* u,
                  const float* v, float* y, void* ws, int skip = 0) {
  scan3_by_rank(dm.r, [&](auto kb, auto exact) {
    causal_scan3_kb<decltype(kb)::value, decltype(exact)::value>(dm, x, d, lo, u, v, y, ws, skip);
  });
}

// ---- the causal product in rounds, x and v kept in L2 (variants 7 to 10) ----
// The one-pass kernel waits in its look-back: a chunk needs the prefix of the
// chunks before it while they are still running, and the later the look-back
// runs, the more chunks it finds without one (docs/benchmarks.md). Here each
// chunk is two tasks, taken from one ticket counter: A (copy x and v, phase 1,
// write the chunk's sum) and, many tickets later, B (copy x, v, u, d and lo,
// phase 1 again, phase 2 from the chunk's exclusive prefix). Chunks form
// rounds of Rc consecutive chunks of a batch; the block that finishes a
// round's last A adds the round's sums (f64), finds the round's exclusive
// prefix by the one-pass kernel's look-back, over rounds (scan3_unit_prefix),
// and writes each chunk's exclusive prefix. By the time a B task starts, its
// round's prefixes are normally written, and the x and v it copies are still
// in L2 from its A (copied with an evict-last hint, then evict-first by B; u,
// d and lo evict-first): about the one-pass kernel's bytes from memory, phase 1
// twice. Tickets: the first M = lag Rc are A tasks in chunk order, then B and
// A alternate (B of chunk j, A of chunk M + j), then the remaining B. Every A
// of a B's round has a lower ticket (M >= Rc), and a round's look-back waits
// only for rounds before it: every wait is on a task already running or done.
__device__ inline std::uint64_t l2_policy(bool keep) {  // evict-last, else evict-first
  std::uint64_t pol;
  if (keep) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  else asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// stage_span with an L2 eviction policy on every copy
__device__ inline void stage_span_hint(float* s, const float* g, int cnt, std::uint64_t pol) {
  stage_span_by(s, g, cnt, [pol](float* d, const float* src, int bytes) {
    const auto sd = static_cast<std::uint32_t>(__cvta_generic_to_shared(d));
    if (bytes == 16)
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(sd), "l"(src), "l"(pol)
                   : "memory");
    else
      asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;" ::"r"(sd), "l"(src), "l"(pol)
                   : "memory");
  });
}
// scan3_copy's two groups with L2 policies: x and v (px), the rest (pr); an A
// task (all = false) copies x and v only (its second group empty)
__device__ inline void rounds_copy(const semisep_plan::StagedScan& p, float* sm, const float* x, const float* d,
                                   const float* lo, const float* u, const float* v, i64 b, i64 N, i64 D, i64 r, i64 i0,
                                   int n, bool all, std::uint64_t px, std::uint64_t pr) {
  const int t = static_cast<int>(threadIdx.x), Di = static_cast<int>(D), ri = static_cast<int>(r);
  if (i0 > 0) {
    stage_span_hint(sm + p.ox, x + (b * N + i0 - 1) * D, static_cast<int>((n + 1) * D), px);
    if (all) stage_span_hint(sm + p.olo, lo + i0 - 1, n, pr);
  } else {
    for (int q = t; q < Di; q += 256) sm[p.ox + q] = 0.f;
    if (all && t == 0) sm[p.olo] = 0.f;
    stage_span_hint(sm + p.ox + Di, x + b * N * D, n * Di, px);
    if (all) stage_span_hint(sm + p.olo + 1, lo, n - 1, pr);
  }
  stage_span_hint(sm + p.ov, v + i0 * r, n * ri, px);
  if (all) stage_span_hint(sm + p.od, d + i0, n, pr);
  __pipeline_commit();
  if (all) stage_span_hint(sm + p.ou, u + i0 * r, n * ri, pr);
  __pipeline_commit();
}
struct RoundsArgs {
  int* flags;  // [0] the ticket counter; then per round: A tasks done, prefixes written, look-back flag
  float2* agg;
  double2* E;
  float* rag;
  double* rin;
  i64 N, D, r, nc, total, rounds;  // rounds per batch
  int Rc, lag;
  // timing only (bench variants 11 to 14; y is then not the product): bit 0 skips A's walk (its sums are
  // zeros), bit 1 B's phase 1 (its warps start from garbage), bit 2 B's phase 2 (y written as zeros)
  int skip;
};
// the sums of chunks c0 .. c0 + cnt - 1 at element pair pe, in f64
__device__ inline double2 rounds_total(const float2* agg, i64 c0, int cnt, int nP, int pe) {
  constexpr int kLB = 16;
  double2 s{0, 0};
  for (int m0 = 0; m0 < cnt; m0 += kLB) {
    float2 l[kLB];
#pragma unroll
    for (int k = 0; k < kLB; ++k) l[k] = m0 + k < cnt ? __ldcg(agg + (c0 + m0 + k) * nP + pe) : float2{0.f, 0.f};
#pragma unroll
    for (int k = 0; k < kLB; ++k) s.x += static_cast<double>(l[k].x), s.y += static_cast<double>(l[k].y);
  }
  return s;
}
__device__ inline void rounds_wait(const int* f) {  // thread 0 polls, then every thread may read what f guards
  if (threadIdx.x == 0) {
    while (ld_relaxed(f) == 0) {
    }
    fence_acq_rel_gpu();
  }
  __syncthreads();
}
// The block that finished the last A of round t of batch b: the round's sum,
// its exclusive prefix by a look-back over the batch's rounds (which also
// publishes the round's sum and inclusive prefix), then each chunk's
// exclusive prefix. Thread = element pairs pe = tid + 256 q of r x D.
template <int KB>
__device__ inline void rounds_scan(const RoundsArgs& a, i64 b, i64 t, int nP, int& s_n, int& s_use) {
  constexpr int kPr = 2;  // r D <= 1024
  const int tid = static_cast<int>(threadIdx.x);
  const i64 BR = a.total / a.nc * a.rounds, gr = b * a.rounds + t;
  int* const f_pre = a.flags + 1 + BR;  // each round's chunk prefixes written
  int* const f_look = f_pre + BR;       // the look-back's flags over rounds
  const i64 c0 = b * a.nc + t * a.Rc;   // the round's first chunk
  const int cnt = static_cast<int>(a.nc - t * a.Rc < a.Rc ? a.nc - t * a.Rc : a.Rc);
  double2 tot[kPr], ex[kPr];
#pragma unroll
  for (int q = 0; q < kPr; ++q) {
    const int pe = tid + 256 * q;
    tot[q] = pe < nP ? rounds_total(a.agg, c0, cnt, nP, pe) : double2{0, 0};
    ex[q] = double2{0, 0};
  }
  scan3_unit_prefix<KB>(f_look, a.rag, a.rin, gr, t, nP, tot, ex, s_n, s_use);
  // each chunk's exclusive prefix: the round's plus the sums before it in the round (f64)
  constexpr int kLB = 16;
#pragma unroll
  for (int q = 0; q < kPr; ++q) {
    const int pe = tid + 256 * q;
    if (pe >= nP) continue;
    double2 run = ex[q];
    for (int m0 = 0; m0 < cnt; m0 += kLB) {
      float2 l[kLB];
#pragma unroll
      for (int k = 0; k < kLB; ++k) l[k] = m0 + k < cnt ? __ldcg(a.agg + (c0 + m0 + k) * nP + pe) : float2{0.f, 0.f};
#pragma unroll
      for (int k = 0; k < kLB; ++k) {
        if (m0 + k < cnt) a.E[(c0 + m0 + k) * nP + pe] = run;
        run.x += static_cast<double>(l[k].x), run.y += static_cast<double>(l[k].y);
      }
    }
  }
  fence_acq_rel_gpu();
  __syncthreads();
  if (tid == 0) st_release(f_pre + gr, 1);
}

template <int KB, bool kExact>
__global__ void __launch_bounds__(256, 2) causal_rounds_kernel(const float* x, const float* d, const float* lo,
                                                               const float* u, const float* v, float* y, RoundsArgs a,
                                                               semisep_plan::StagedScan p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const sm = reinterpret_cast<float*>(smem_raw);
  double* const E = reinterpret_cast<double*>(sm + p.oE);  // the chunk's exclusive prefix (r x D)
  __shared__ long long s_k;
  __shared__ int s_last, s_n, s_use;
  constexpr int kPr = 2;  // element pairs of r x D per thread (r D <= 1024)
  const int tid = static_cast<int>(threadIdx.x);
  const int ri = static_cast<int>(a.r), Di = static_cast<int>(a.D), nP = ri * Di / 2;
  if (tid == 0) s_k = atomicAdd(a.flags, 1);  // tickets in this order: every task waited for has a lower one
  __syncthreads();
  const i64 k = s_k, M = a.total < static_cast<i64>(a.lag) * a.Rc ? a.total : static_cast<i64>(a.lag) * a.Rc,
            pairs = a.total - M;
  bool isA;
  i64 id;
  if (k < M) isA = true, id = k;
  else if (k - M < 2 * pairs) isA = ((k - M) & 1) != 0, id = isA ? M + (k - M) / 2 : (k - M) / 2;
  else isA = false, id = pairs + (k - M - 2 * pairs);
  const i64 b = id / a.nc, c = id % a.nc, t = c / a.Rc, i0 = c * p.Lg, BR = a.total / a.nc * a.rounds;
  const int n = static_cast<int>(a.N - i0 < p.Lg ? a.N - i0 : p.Lg);
  const std::uint64_t pkeep = l2_policy(true), pdrop = l2_policy(false);
  rounds_copy(p, sm, x, d, lo, u, v, b, a.N, a.D, a.r, i0, n, !isA, isA ? pkeep : pdrop, pdrop);
  double2 s[kPr];
  if (isA) {
    if (a.skip & 1) {
      __pipeline_wait_prior(0);
      __syncthreads();
#pragma unroll
      for (int q = 0; q < kPr; ++q) s[q] = double2{0.0, 0.0};
    } else {
      float P[2][KB];
      scan3_phase1<KB, kExact>(p, sm, n, ri, Di, P, s);
    }
    __pipeline_wait_prior(0);  // the empty group
#pragma unroll
    for (int q = 0; q < kPr; ++q)
      if (tid + 256 * q < nP)
        a.agg[id * nP + tid + 256 * q] =
            float2{static_cast<float>(s[q].x), static_cast<float>(s[q].y)};
    fence_acq_rel_gpu();
    __syncthreads();
    if (tid == 0) {
      const int cnt = static_cast<int>(a.nc - t * a.Rc < a.Rc ? a.nc - t * a.Rc : a.Rc);
      // after the barrier: the count (a relaxed atomic) is released behind every thread's sums
      fence_acq_rel_gpu();
      s_last = atomicAdd(a.flags + 1 + b * a.rounds + t, 1) == cnt - 1;
      if (s_last) fence_acq_rel_gpu();  // the round's other sums are read after this
    }
    __syncthreads();
    if (s_last) rounds_scan<KB>(a, b, t, nP, s_n, s_use);
    return;
  }
  // B: the chunk's exclusive prefix, once its round's are written (normally long before)
  rounds_wait(a.flags + 1 + BR + b * a.rounds + t);
#pragma unroll
  for (int q = 0; q < kPr; ++q)
    if (tid + 256 * q < nP) reinterpret_cast<double2*>(E)[tid + 256 * q] = __ldcg(a.E + id * nP + tid + 256 * q);
  float P[2][KB];
  if (a.skip & 2) {  // timing only
    __pipeline_wait_prior(1);
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int kk = 0; kk < KB; ++kk) P[h][kk] = 0.f;
  } else {
    scan3_phase1<KB, kExact>(p, sm, n, ri, Di, P, s);  // the warps' prefixes again
  }
  if (a.skip & 4) {  // timing only: y's bytes written, no products
    __pipeline_wait_prior(0);
    __syncthreads();
    // D is 8, 16, 32 or 64 here (staged_scan): float4 stores
    float4* const y4 = reinterpret_cast<float4*>(y + (b * a.N + i0) * a.D);
    for (int e = tid; e < n * Di / 4; e += 256) y4[e] = float4{0.f, 0.f, 0.f, 0.f};
  } else {
    scan3_phase2<KB, kExact>(p, sm, E, P, y, b, a.N, i0, n, ri, Di);
  }
}

// false where the workspace does not hold the layout (the launcher runs the
// one-pass kernel then)
template <int KB, bool kExact>
bool causal_rounds_kb(const SemisepDims& dm, const float* x, const float* d, const float* lo, const float* u,
                      const float* v, float* y, void* ws, int Rc, int lag, int skip = 0) {
  auto kernel = causal_rounds_kernel<KB, kExact>;
  const semisep_plan::StagedScan p = semisep_plan::staged_scan(dm.r, dm.D);
  const semisep_plan::RoundsLayout L = semisep_plan::staged_rounds_layout(dm.B, dm.N, dm.D, dm.r, Rc);
  if (!p.fits || Rc < 1 || lag < 1 || L.bytes == 0 ||  // lag >= 1: every wait is on a lower ticket
      L.bytes > semisep_plan::staged_scan_ws_bytes(dm.B, dm.N, dm.D, dm.r))
    return false;
  const i64 nc = (dm.N + p.Lg - 1) / p.Lg, total = dm.B * nc;
  char* const w = static_cast<char*>(ws);
  RoundsArgs a{static_cast<int*>(ws),
               reinterpret_cast<float2*>(w + L.agg),
               reinterpret_cast<double2*>(w + L.E),
               reinterpret_cast<float*>(w + L.rag),
               reinterpret_cast<double*>(w + L.rin),
               dm.N, dm.D, dm.r, nc, total, L.rounds, Rc, lag, skip};
  check_call(cudaMemsetAsync(ws, 0, static_cast<std::size_t>(L.agg)), "cudaMemsetAsync (semiseparable_matvec)");
  const auto smem = static_cast<std::size_t>(p.smem_bytes);
  allow_smem(kernel, smem);
  kernel<<<static_cast<unsigned>(2 * total), 256, smem>>>(x, d, lo, u, v, y, a, p);
  check_launch("semiseparable_matvec (causal, rounds)");
  return true;
}
void causal_rounds(const SemisepDims& dm, const float* x, const float* d, const float* lo, const float* u,
                   const float* v, float* y, void* ws, int variant) {
  // 7: rounds of 32 chunks, a B 7 rounds of tickets after its round's last A
  // (M = 256 chunks of x and v, 15 MB at r = 22, D = 16, held in L2); 8: 64
  // and 4; 9: 16 and 16; 10: 32 and 16 (30 MB); 11 to 14, timing only (y is
  // not the product): as 7 without any walk, without A's, B's phase 1, B's
  // phase 2
  const int Rc = variant == 8 ? 64 : variant == 9 ? 16 : 32,
            lag = variant == 8 ? 4 : variant == 9 || variant == 10 ? 16 : 8,
            skip = variant == 11 ? 7 : variant == 12 ? 1 : variant == 13 ? 2 : variant == 14 ? 4 : 0;
  scan3_by_rank(dm.r, [&](auto kb, auto exact) {
    constexpr int KB = decltype(kb)::value;
    constexpr bool kExact = decltype(exact)::value;
    if (!causal_rounds_kb<KB, kExact>(dm, x, d, lo, u, v, y, ws, Rc, lag, skip))
      causal_scan3_kb<KB, kExact>(dm, x, d, lo, u, v, y, ws);
  });
}

// ---- the causal product in one pass, chunks in clusters (sm_90; variants 5 and 6) ----
// The look-back above is the kernel's largest wait: chunks finish phase 1
// every ~90 ns, and a look-back reads the sum of every chunk before it that
// has no prefix yet, so the later it runs, the more it reads (docs/
// benchmarks.md, "GPU: where the one-pass causal kernel's time goes"). Here
// a cluster of CS blocks takes CS consecutive chunks on one ticket; the
// blocks exchange their chunk sums through distributed shared memory, and
// only the cluster's first block publishes the cluster's sum and looks back
// over clusters: CS times fewer look-backs, CS times further apart. Phases 1
// and 2 are the one-pass kernel's. A batch's chunks are padded to a multiple
// of CS with empty ones (no rows, zero sums), so no cluster spans two
// batches. The workspace: flags, sums and prefixes per cluster, in the
// one-pass kernel's workspace (fewer units, and the flag bytes of its chunks).
template <int KB, bool kExact>
__global__ void __launch_bounds__(256, 2) causal_cluster_kernel(const float* x, const float* d, const float* lo,
                                                                const float* u, const float* v, float* y, int* flags,
                                                                int* counter, float* agg, double* inc, i64 N, i64 D,
                                                                i64 r, i64 nc, i64 ncl, semisep_plan::StagedScan p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  const int CS = static_cast<int>(cl.num_blocks()), rank = static_cast<int>(cl.block_rank());
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const sm = reinterpret_cast<float*>(smem_raw);
  double2* const E = reinterpret_cast<double2*>(sm + p.oE);  // the chunk's sum, then its exclusive prefix
  double2* const G = reinterpret_cast<double2*>(sm + p.oG);  // rank 0: the cluster's exclusive prefix
  __shared__ long long s_tk;
  __shared__ int s_n, s_use;
  const int t = static_cast<int>(threadIdx.x);
  const int rD = static_cast<int>(r * D), Di = static_cast<int>(D), ri = static_cast<int>(r), nP = rD / 2;
  constexpr int kPr = 2;  // element pairs of r x D per thread (r D <= 1024)
  if (rank == 0 && t == 0) s_tk = atomicAdd(counter, 1);  // clusters start in this order
  cl.sync();  // every block of the cluster has started, and rank 0's ticket is in
  const i64 unit = *cl.map_shared_rank(&s_tk, 0);  // b * ncl + the cluster's index k in batch b
  const i64 b = unit / ncl, k = unit % ncl, c = k * CS + rank, i0 = c * p.Lg;
  const int n = c < nc ? static_cast<int>(N - i0 < p.Lg ? N - i0 : p.Lg) : 0;
  if (n > 0) {
    scan3_copy(p, sm, x, d, lo, u, v, b, N, D, r, i0, n);
  } else {  // the two copy groups phases 1 and 2 wait for, empty
    __pipeline_commit();
    __pipeline_commit();
  }
  float P[2][KB];
  double2 a[kPr], pre[kPr] = {double2{0, 0}, double2{0, 0}}, tot[kPr] = {double2{0, 0}, double2{0, 0}};
  scan3_phase1<KB, kExact>(p, sm, n, ri, Di, P, a);
#pragma unroll
  for (int q = 0; q < kPr; ++q)
    if (t + 256 * q < nP) E[t + 256 * q] = a[q];
  cl.sync();  // the cluster's chunk sums are in
  // the sums of the ranks before this one, in rank order; rank 0 adds all of them (the cluster's sum)
  const int upto = rank == 0 ? CS : rank;
  for (int rk = 0; rk < upto; ++rk) {
    const double2* Er = cl.map_shared_rank(E, rk);
#pragma unroll
    for (int q = 0; q < kPr; ++q) {
      if (t + 256 * q >= nP) continue;
      const double2 e = Er[t + 256 * q];
      tot[q].x += e.x, tot[q].y += e.y;
    }
  }
  if (rank != 0) {
#pragma unroll
    for (int q = 0; q < kPr; ++q) pre[q] = tot[q];
  } else {
    double2 ex[kPr] = {double2{0, 0}, double2{0, 0}};
    scan3_unit_prefix<KB>(flags, agg, inc, unit, k, nP, tot, ex, s_n, s_use);
#pragma unroll
    for (int q = 0; q < kPr; ++q)
      if (t + 256 * q < nP) G[t + 256 * q] = ex[q];
  }
  cl.sync();  // rank 0's G is in, and no rank reads another's E any more
  const double2* G0 = cl.map_shared_rank(G, 0);
#pragma unroll
  for (int q = 0; q < kPr; ++q) {
    if (t + 256 * q >= nP) continue;
    const double2 g = G0[t + 256 * q];
    E[t + 256 * q] = double2{g.x + pre[q].x, g.y + pre[q].y};
  }
  auto done = cl.barrier_arrive();  // this block reads rank 0's shared memory no more
  scan3_phase2<KB, kExact>(p, sm, reinterpret_cast<const double*>(E), P, y, b, N, i0, n, ri, Di);
  cl.barrier_wait(std::move(done));  // rank 0 leaves only when no block of its cluster can read its G
#else
  (void)x, (void)d, (void)lo, (void)u, (void)v, (void)y, (void)flags, (void)counter, (void)agg, (void)inc, (void)N,
      (void)D, (void)r, (void)nc, (void)ncl, (void)p;
  __trap();  // never launched from code built before sm_90 (causal_cluster_kb checks the loaded code's version)
#endif
}

// false where it cannot run (before sm_90, the plan does not fit, no cluster of CS such blocks fits)
template <int KB, bool kExact>
bool causal_cluster_kb(const SemisepDims& dm, const float* x, const float* d, const float* lo, const float* u,
                       const float* v, float* y, void* ws, int CS) {
  const semisep_plan::StagedScan p = semisep_plan::staged_scan(dm.r, dm.D, true);
  if (!p.fits) return false;
  const i64 nc = (dm.N + p.Lg - 1) / p.Lg, ncl = (nc + CS - 1) / CS, units = dm.B * ncl, rD = dm.r * dm.D;
  // the one-pass kernel's workspace holds the clusters' flags, sums and prefixes (units <= its chunks)
  const i64 fb = semisep_plan::staged_scan_flag_bytes(dm.B, dm.N, dm.D, dm.r);
  if ((units + 1) * 4 > fb || fb + units * rD * 12 > semisep_plan::staged_scan_ws_bytes(dm.B, dm.N, dm.D, dm.r))
    throw Error("semiseparable_matvec (causal, clusters): the workspace is too small (a launcher's bug)");
  const auto smem = static_cast<std::size_t>(p.smem_bytes);
  auto kernel = causal_cluster_kernel<KB, kExact>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(units * CS));  // a multiple of the cluster
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = nullptr;
  cudaLaunchAttribute at[1] = {};
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = static_cast<unsigned>(CS);
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  // Whether clusters of CS such blocks run here, asked once per device and kernel: the device (sm_90 on),
  // the code loaded for it (a build without sm_90 code JIT-compiles the sm_80 PTX, whose body is empty),
  // its shared memory, and a cluster that fits. Asked per shared-memory size too: one kernel serves every r
  // with the same KB, and a plan of another D or r takes more (the limit raised for the first size was once
  // kept for all: a larger plan's launch then failed, "invalid argument")
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, std::size_t>, bool> usable;
  int dev = 0;
  check_call(cudaGetDevice(&dev), "cudaGetDevice");
  {
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = usable.try_emplace({dev, reinterpret_cast<const void*>(kernel), CS, smem}, false);
    if (fresh) {
      int major = 0, active = 0;
      cudaFuncAttributes fa{};
      check_call(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
      bool ok = major >= 9 && p.smem_bytes <= block_smem_optin() && cudaFuncGetAttributes(&fa, kernel) == cudaSuccess &&
                fa.ptxVersion >= 90;
      if (ok) {
        allow_smem(kernel, smem);
        ok = cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) == cudaSuccess && active >= 1;
      }
      (void)cudaGetLastError();  // a refusal above is not an error of the product: the one-pass kernel runs instead
      it->second = ok;
    }
    if (!it->second) return false;
  }
  allow_smem(kernel, smem);  // this plan's size (the attribute is the kernel's, set by whichever size came last)
  int* flags = static_cast<int*>(ws);
  float* agg = reinterpret_cast<float*>(static_cast<char*>(ws) + fb);
  double* inc = reinterpret_cast<double*>(agg + units * rD);  // 16-byte aligned: r D is a multiple of 8
  check_call(cudaMemsetAsync(flags, 0, static_cast<std::size_t>(units + 1) * sizeof(int)),
             "cudaMemsetAsync (semiseparable_matvec)");
  check_call(cudaLaunchKernelEx(&cfg, kernel, x, d, lo, u, v, y, flags, flags + units, agg, inc, dm.N, dm.D, dm.r, nc,
                                ncl, p),
             "cudaLaunchKernelEx (semiseparable_matvec, causal, clusters)");
  check_launch("semiseparable_matvec (causal, clusters)");
  return true;
}
void causal_cluster(const SemisepDims& dm, const float* x, const float* d, const float* lo, const float* u,
                    const float* v, float* y, void* ws, int CS) {
  scan3_by_rank(dm.r, [&](auto kb, auto exact) {
    constexpr int KB = decltype(kb)::value;
    constexpr bool kExact = decltype(exact)::value;
    if (!causal_cluster_kb<KB, kExact>(dm, x, d, lo, u, v, y, ws, CS))
      causal_scan3_kb<KB, kExact>(dm, x, d, lo, u, v, y, ws);
  });
}

// The tiled forward: chunk sums, combined (total or exclusive prefix), then
// the rows. variant 1: the first tiled kernels only; 2: the warp-level ones
// where they apply; 3: the staged ones where they apply (f32; causal in one
// pass where semisep_plan::staged_scan fits, S then being its workspace of
// staged_scan_ws_bytes), else as 2; 4 and 0 (the default): as 3, tiles copied
// in bulk where the device and the alignment allow; 5 and 6: as 4, the causal
// product in clusters of 8 and 4 chunks where they can run (else as 4); 7 to
// 10: as 4, the causal product in rounds (causal_rounds_kb). Timing only (y is
// then not the product, docs/benchmarks.md): 11 to 14, parts of 7 left out
// (causal_rounds); 15 to 17, the one-pass kernel without its walks, without
// its look-back, without either.
template <class T>
void matvec_tiled(const SemisepDims& dm, bool causal, const T* x, const T* d, const T* up, const T* lo, const T* u,
                  const T* v, T* y, T* S, int variant, int upto) {
  const i64 nc = (dm.N + dm.L - 1) / dm.L, rD = dm.r * dm.D;
  const bool v2 = variant != 1;
  bool v3 = false;
  const bool bulk = variant == 0 || variant >= 4;
  if constexpr (sizeof(T) == 4) {
    v3 = (variant == 0 || variant >= 3) && staged_applies(dm, sizeof(T), x, y);
    if (v3 && causal && scan3_applies(dm)) {  // one pass, its own chunks: no stages to stop after
      if (upto != 3) return;
      if (variant == 5 || variant == 6) causal_cluster(dm, x, d, lo, u, v, y, S, variant == 5 ? 8 : 4);
      else if (variant >= 15) causal_scan3(dm, x, d, lo, u, v, y, S, variant - 14);  // skip 1, 2, 3
      else if (variant >= 7) causal_rounds(dm, x, d, lo, u, v, y, S, variant);
      else causal_scan3(dm, x, d, lo, u, v, y, S);
      return;
    }
    if (v3) chunk_sums3(dm, x, v, S, bulk);
  }
  if (!v3) {
    if (v2 && sums2_applies<T>(dm)) chunk_sums2(dm, x, v, S);
    else chunk_sums(dm, x, v, S);
  }
  if (upto == 1) return;
  combine(S, dm.B, nc, rD, causal ? 1 : 0);
  if (upto == 2) return;
  if (causal) {
    if (v2 && dm.D <= 32) causal_scan2_kb<T>(dm, x, d, lo, u, v, S, y);
    else causal_scan_kb<T, 1>(dm, x, d, lo, u, v, S, y);
    return;
  }
  if constexpr (sizeof(T) == 4) {
    if (v3) {
      full_rows3(dm, x, d, up, lo, u, S, y, bulk);
      return;
    }
  }
  if (v2 && semisep_plan::rows(dm.r, dm.D, static_cast<int>(sizeof(T))).fits) {
    full_rows2(dm, x, d, up, lo, u, S, y);
    return;
  }
  const int kp = round4(dm.r), Dp = round4(dm.D), ne = Dp / 4, rows = full_rows_per_block<T>(kp, Dp);
  const std::size_t smem = static_cast<std::size_t>(kp * Dp + rows * kp) * sizeof(T);
  const i64 tiles = (dm.N + rows - 1) / rows;
  full_rows_kernel<T><<<capped(dm.B * tiles), (rows / 2) * ne, smem>>>(x, d, up, lo, u, S, y, dm.B, dm.N, dm.D, dm.r, nc,
                                                                       kp, Dp, rows);
  check_launch("semiseparable_matvec (rows)");
}

template <class T>
void matvec_t(const SemisepDims& dm, bool causal, const T* x, const T* d, const T* up, const T* lo, const T* u,
              const T* v, T* y, T* S, DType dt, int variant, int upto) {
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, L = dm.L, nc = (N + L - 1) / L, rD = r * D;
  if (B * N * D == 0) return;
  if (tiled(dm, sizeof(T))) {
    matvec_tiled(dm, causal, x, d, up, lo, u, v, y, S, variant, upto);
    return;
  }
  if (!causal) {
    // W_b = V^T x_b (r x D, at S + b nc rD), y_b = U W_b, then y += T x
    gemm(dt, true, false, B, r, D, N, v, 0, x, N * D, S, nc * rD);
    gemm(dt, false, false, B, N, D, r, u, 0, S, nc * rD, y, N * D);
    band(x, d, lo, up, y, B, N, D, true);
    return;
  }
  band(x, d, lo, static_cast<const T*>(nullptr), y, B, N, D, false);
  if (r == 0) return;
  // chunk sums of v (x) x, exclusive prefix over chunks, then per chunk
  // P_i = S_<c + sum_{c0<=j<=i} v_j (x) x_j and y_i += u_i . P_i
  SweepArgs<T> s{B, N, L, nc, r, D, S, nc * rD, rD, D, 1, {v, 0, r}, {x, N * D, D}, {u, 0, r}, y, N * D, D,
                 false, false};
  sweep(Mode::sums, s, "semiseparable_matvec (chunk sums)");
  combine(S, B, nc, rD, 1);
  sweep(Mode::scan, s, "semiseparable_matvec (causal scan)");
}

template <class T>
void matvec_backward_t(const SemisepDims& dm, bool causal, const T* x, const T* d, const T* up, const T* lo,
                       const T* u, const T* v, const T* dy, const MatvecGradPtrs& gp, T* Sx, T* Sg, DType dt) {
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, L = dm.L, nc = (N + L - 1) / L, rD = r * D;
  T *dx = static_cast<T*>(gp.dx), *dd = static_cast<T*>(gp.dd), *dup = static_cast<T*>(gp.dup),
    *dlo = static_cast<T*>(gp.dlo), *du = static_cast<T*>(gp.du), *dv = static_cast<T*>(gp.dv);
  const std::size_t es = sizeof(T);
  if (du) zero(du, static_cast<std::size_t>(N * r) * es);
  if (dv) zero(dv, static_cast<std::size_t>(N * r) * es);
  if (dd || dup || dlo) {
    if (B * D == 0) {  // empty sums
      if (dd) zero(dd, static_cast<std::size_t>(N) * es);
      if (dup) zero(dup, static_cast<std::size_t>(N - 1) * es);
      if (dlo) zero(dlo, static_cast<std::size_t>(N - 1) * es);
    } else {
      band_grads_kernel<<<grid_for(N, kThreads), kThreads>>>(x, dy, dd, dup, dlo, B, N, D, causal);
      check_launch("semiseparable_matvec_backward (band gradients)");
    }
  }
  if (B * N * D == 0) return;
  const bool rank = r > 0, need_x = du && rank, need_g = (dx || dv) && rank;
  // dx's band: T^T dy (causal: d_j dy_j + lo_j dy_{j+1})
  const T* no = nullptr;
  if (!causal) {
    if (need_x) gemm(dt, true, false, B, r, D, N, v, 0, x, N * D, Sx, nc * rD);   // W = V^T x
    if (need_g) gemm(dt, true, false, B, r, D, N, u, 0, dy, N * D, Sg, nc * rD);  // G = U^T dy
    if (dx) {
      gemm(dt, false, false, B, N, D, r, v, 0, Sg, nc * rD, dx, N * D);  // dx = V G (zeros when r = 0)
      band(dy, d, up, lo, dx, B, N, D, true);
    }
    // du_i = sum_b W_b dy_i, dv_j = sum_b G_b x_j: the state is W_b^T (D x r), the same for every chunk
    if (need_x)
      sweep(Mode::mix,
            SweepArgs<T>{B, N, L, nc, D, r, Sx, nc * rD, 0, 1, D, {no, 0, 0}, {no, 0, 0}, {dy, N * D, D}, du, 0, r,
                         false, true},
            "semiseparable_matvec_backward (du)");
    if (need_g && dv)
      sweep(Mode::mix,
            SweepArgs<T>{B, N, L, nc, D, r, Sg, nc * rD, 0, 1, D, {no, 0, 0}, {no, 0, 0}, {x, N * D, D}, dv, 0, r,
                         false, true},
            "semiseparable_matvec_backward (dv)");
    return;
  }
  if (dx) band(dy, d, no, lo, dx, B, N, D, false);
  if (need_x) {  // Sx: exclusive prefixes of v (x) x
    sweep(Mode::sums,
          SweepArgs<T>{B, N, L, nc, r, D, Sx, nc * rD, rD, D, 1, {v, 0, r}, {x, N * D, D}, {no, 0, 0}, nullptr, 0, 0,
                       false, false},
          "semiseparable_matvec_backward (chunk sums of x)");
    combine(Sx, B, nc, rD, 1);
  }
  if (need_g) {  // Sg: exclusive suffixes of u (x) dy
    sweep(Mode::sums,
          SweepArgs<T>{B, N, L, nc, r, D, Sg, nc * rD, rD, D, 1, {u, 0, r}, {dy, N * D, D}, {no, 0, 0}, nullptr, 0, 0,
                       false, false},
          "semiseparable_matvec_backward (chunk sums of dy)");
    combine(Sg, B, nc, rD, 2);
  }
  if (dx)  // dx_j += v_j . Q_j, Q_j = sum_{i>=j} u_i (x) dy_i (reversed scan)
    sweep(Mode::scan,
          SweepArgs<T>{B, N, L, nc, r, D, Sg, nc * rD, rD, D, 1, {u, 0, r}, {dy, N * D, D}, {v, 0, r}, dx, N * D, D,
                       true, false},
          "semiseparable_matvec_backward (dx)");
  if (need_x)  // du_i = sum_b P_i dy_i, state P^T (D x r) updated by x_i[k] v_i[e]
    sweep(Mode::scan,
          SweepArgs<T>{B, N, L, nc, D, r, Sx, nc * rD, rD, 1, D, {x, N * D, D}, {v, 0, r}, {dy, N * D, D}, du, 0, r,
                       false, true},
          "semiseparable_matvec_backward (du)");
  if (need_g && dv)  // dv_j = sum_b Q_j x_j, state Q^T updated by dy_j[k] u_j[e] (reversed)
    sweep(Mode::scan,
          SweepArgs<T>{B, N, L, nc, D, r, Sg, nc * rD, rD, 1, D, {dy, N * D, D}, {u, 0, r}, {x, N * D, D}, dv, 0, r,
                       true, true},
          "semiseparable_matvec_backward (dv)");
}

// ---- tridiagonal ----
// Forward elimination coefficients, one thread (a recurrence over the rows):
// den_i = d_i - lo_{i-1} c_{i-1}, c_i = up_i / den_i. The first bad pivot's
// row goes to *bad (which starts at -1) and its value to den[row].
template <class T> __global__ void tridiag_factor_kernel(i64 N, const T* d, const T* up, const T* lo, T* cp, T* den,
                                                         long long* bad) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  T c_prev = T(0);
  for (i64 i = 0; i < N; ++i) {
    const T p = semisep::thomas_pivot(d[i], i ? lo[i - 1] : T(0), c_prev);
    den[i] = p;
    if (!(p != T(0)) || !isfinite(p)) {
      *bad = static_cast<long long>(i);
      return;
    }
    c_prev = i + 1 < N ? up[i] / p : T(0);
    cp[i] = c_prev;
  }
}
// One thread per (outer, column): forward substitution, then back substitution.
template <class T> __global__ void tridiag_apply_kernel(i64 N, i64 outer, i64 inner, const T* lo, const T* cp,
                                                        const T* den, const T* b, T* y) {
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < outer * inner;
       t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 o = t / inner, c = t % inner;
    const T* bo = b + o * N * inner + c;
    T* yo = y + o * N * inner + c;
    yo[0] = bo[0] / den[0];
    for (i64 i = 1; i < N; ++i) yo[i * inner] = (bo[i * inner] - lo[i - 1] * yo[(i - 1) * inner]) / den[i];
    for (i64 i = N - 2; i >= 0; --i) yo[i * inner] -= cp[i] * yo[(i + 1) * inner];
  }
}
// One thread per row: the CPU's band gradients (tridiag_band_grads_row).
template <class T> __global__ void tridiag_grads_kernel(i64 N, i64 outer, i64 inner, const T* lam, const T* y, T* dd,
                                                        T* dup, T* dlo) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<i64>(gridDim.x) * blockDim.x)
    semisep::tridiag_band_grads_row(i, N, outer, inner, lam, y, dd, dup, dlo);
}

// ---- resolvent diagonal: one thread per shift, the CPU's recurrences in double ----
template <class T> __global__ void resolvent_kernel(i64 N, i64 K, const T* d, const T* up, const T* lo, const T* z,
                                                    T* out, double* w) {
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < K;
       k += static_cast<i64>(gridDim.x) * blockDim.x) {
    double *r = w + 2 * k * N, *s = r + N;
    const double zk = static_cast<double>(z[k]);
    semisep::resolvent_ratios(N, d, up, lo, zk, r, s);
    for (i64 i = 0; i < N; ++i)
      out[k * N + i] = static_cast<T>(semisep::resolvent_diag(r[i], s[i], static_cast<double>(d[i]) - zk));
  }
}
// Per shift: ab (w + 5kN + 2N), gu (+ 3N) and gl (+ 4N) as on the CPU; dz[k].
template <class T> __global__ void resolvent_backward_kernel(i64 N, i64 K, const T* d, const T* up, const T* lo,
                                                             const T* z, const T* dg, T* dz, double* w) {
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < K;
       k += static_cast<i64>(gridDim.x) * blockDim.x) {
    double *r = w + 5 * k * N, *s = r + N, *ab = s + N, *gu = ab + N, *gl = gu + N;
    const double zk = static_cast<double>(z[k]);
    semisep::resolvent_ratios(N, d, up, lo, zk, r, s);
    dz[k] = static_cast<T>(semisep::resolvent_backward_sweep(N, d, up, lo, zk, dg + k * N, r, s, ab, gu, gl));
  }
}
// Sums over shifts in order, one thread per row.
template <class T> __global__ void resolvent_sum_kernel(i64 N, i64 K, const double* w, T* dd, T* dup, T* dlo) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<i64>(gridDim.x) * blockDim.x)
    semisep::resolvent_band_sums_row(i, N, K, w, dd, dup, dlo);
}

// ---- complex resolvent: one thread per shift, the CPU's recurrences (semiseparable_math.hpp) ----
template <class T> __global__ void resolvent_complex_kernel(i64 N, i64 K, const T* d, const T* up, const T* lo,
                                                            const T* z, T* out, semisep::Cplx* w) {
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < K;
       k += static_cast<i64>(gridDim.x) * blockDim.x) {
    semisep::Cplx *r = w + 2 * k * N, *s = r + N;
    const semisep::Cplx zk{static_cast<double>(z[2 * k]), static_cast<double>(z[2 * k + 1])};
    semisep::resolvent_ratios_complex(N, d, up, lo, zk, r, s);
    for (i64 i = 0; i < N; ++i) {
      const semisep::Cplx G = semisep::resolvent_diag_complex(r[i], s[i], semisep::resolvent_shifted(d, i, zk));
      out[2 * (k * N + i)] = static_cast<T>(G.re);
      out[2 * (k * N + i) + 1] = static_cast<T>(G.im);
    }
  }
}
template <class T> __global__ void resolvent_complex_backward_kernel(i64 N, i64 K, const T* d, const T* up,
                                                                     const T* lo, const T* z, const T* dg, T* dz,
                                                                     semisep::Cplx* cw, double* ew) {
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < K;
       k += static_cast<i64>(gridDim.x) * blockDim.x) {
    semisep::Cplx *r = cw + 3 * k * N, *s = r + N, *ab = s + N;
    const semisep::Cplx zk{static_cast<double>(z[2 * k]), static_cast<double>(z[2 * k + 1])};
    semisep::resolvent_ratios_complex(N, d, up, lo, zk, r, s);
    const semisep::Cplx sz =
        semisep::resolvent_backward_sweep_complex(N, d, up, lo, zk, dg + 2 * k * N, r, s, ab, ew + 2 * k * N,
                                                  ew + 2 * k * N + N);
    dz[2 * k] = static_cast<T>(-sz.re);
    dz[2 * k + 1] = static_cast<T>(sz.im);
  }
}
template <class T> __global__ void resolvent_complex_sum_kernel(i64 N, i64 K, const semisep::Cplx* cw,
                                                                const double* ew, T* dd, T* dup, T* dlo) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<i64>(gridDim.x) * blockDim.x)
    semisep::resolvent_complex_band_sums_row(i, N, K, cw, ew, dd, dup, dlo);
}

// ---- semiseparable_solve (Woodbury) ----
// C = I + S (S = V^T Z, r x r) in double, then its LU with partial pivoting:
// semisep::lu_factor, the very code the CPU runs. One thread: r is small (tens)
// and O(r^3) is nothing next to the O(N r^2) products around it.
// *flag = 1 when C is singular to working precision, else 0
// (semisep::capacitance_factor; C holds r r + 2 r doubles).
template <class T> __global__ void capacitance_kernel(i64 r, const T* S, double* C, i64* piv, i64* flag) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  *flag = semisep::capacitance_factor(S, r, C, piv, C + r * r, C + r * r + r) ? 0 : 1;
}
// One thread per (b, column c) of W_b (r x D at W + b r D): W_b[:, c] = -C^-1 W_b[:, c]
// (semisep::lu_solve in double through r doubles of tmp per thread).
template <class T>
__global__ void capacitance_solve_kernel(i64 B, i64 D, i64 r, const double* C, const i64* piv, T* W, double* tmp) {
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < B * D;
       t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 b = t / D, c = t % D;
    semisep::lu_solve(C, r, piv, W + b * r * D + c, D, tmp + t * r, -1.0);
  }
}
// One thread per (i, k): du[i,k] = -sum_b lam_b[i] . A_b[k], dv[i,k] = -sum_b y_b[i] . G_b[k]
// (rows of D elements; A_b, G_b r x D at b r D), subtracted per b in order as on the CPU.
template <class T>
__global__ void woodbury_uv_grads_kernel(i64 B, i64 N, i64 D, i64 r, const T* lam, const T* y, const T* A,
                                         const T* G, T* du, T* dv) {
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < N * r;
       t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 i = t / r, k = t % r;
    T su = T(0), sv = T(0);
    for (i64 b = 0; b < B; ++b) {
      const T *li = lam + (b * N + i) * D, *yi = y + (b * N + i) * D;
      const T *a = A + (b * r + k) * D, *g = G + (b * r + k) * D;
      T pu = T(0), pv = T(0);
      for (i64 e = 0; e < D; ++e) {
        pu += li[e] * a[e];
        pv += yi[e] * g[e];
      }
      su -= pu;
      sv -= pv;
    }
    du[t] = su;
    dv[t] = sv;
  }
}

// y = H^-1 x (trans: H^-T, i.e. T^T and U, V swapped), the CPU's steps:
// factor T (stop on a bad pivot), y = T^-1 x, Z = T^-1 U, C = I + V^T Z
// (stop if singular), W_b = V^T y_b, W_b <- -C^-1 W_b, y_b += Z W_b.
template <class T>
SolveStatus solve_t(DType dt, const SemisepDims& dm, const T* x, const T* d, const T* up, const T* lo, const T* u,
                    const T* v, T* y, bool trans, const semisep::WoodburyGpuWs& w) {
  if (trans) {
    std::swap(up, lo);
    std::swap(u, v);
  }
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, L = dm.L, nc = (N + L - 1) / L, rD = r * D;
  SolveStatus st;
  st.bad_row = tridiag_factor(dt, N, d, up, lo, w.cp, w.den, &st.bad_pivot);
  if (st.bad_row >= 0) return st;
  tridiag_apply(dt, N, B, D, lo, w.cp, w.den, x, y);  // y = T^-1 x
  if (r == 0) return st;
  T* Z = reinterpret_cast<T*>(w.Z);
  T* S = reinterpret_cast<T*>(w.S);
  tridiag_apply(dt, N, 1, r, lo, w.cp, w.den, u, Z);  // Z = T^-1 U (N x r)
  gemm(dt, true, false, 1, r, r, N, v, 0, Z, 0, S, 0);  // V^T Z (r x r)
  capacitance_kernel<<<1, 1>>>(r, S, w.C, w.piv, w.flag);
  check_launch("semiseparable_solve (capacitance LU)");
  i64 singular = 0;
  // the default stream orders this copy after the kernel; it returns when done
  check_call(cudaMemcpy(&singular, w.flag, sizeof singular, cudaMemcpyDeviceToHost), "cudaMemcpy (capacitance check)");
  if (singular) {
    st.singular = true;
    return st;
  }
  if (B * D == 0) return st;
  gemm(dt, true, false, B, r, D, N, v, 0, y, N * D, S, rD);  // W_b = V^T y_b (r x D per b)
  capacitance_solve_kernel<<<grid_for(B * D, kThreads), kThreads>>>(B, D, r, w.C, w.piv, S, w.tmp);
  check_launch("semiseparable_solve (capacitance solves)");
  // y_b[i] += sum_k Z[i][k] S_b[k]: the state S_b (r x D), the same for every chunk
  const T* no = nullptr;
  sweep(Mode::mix,
        SweepArgs<T>{B, N, L, nc, r, D, S, rD, 0, D, 1, {no, 0, 0}, {no, 0, 0}, {Z, 0, r}, y, N * D, D, false, false},
        "semiseparable_solve (y -= Z C^-1 V^T y)");
  return st;
}

// lam = H^-T dy into g.dx, then the band's gradients (tridiag_band_grads: the
// same -lam y^T sums as tridiag_solve_backward) and du, dv through A_b = V^T y_b
// and G_b = U^T lam_b.
template <class T>
SolveStatus solve_backward_t(DType dt, const SemisepDims& dm, const T* d, const T* up, const T* lo, const T* u,
                             const T* v, const T* y, const T* dy, const MatvecGradPtrs& gp,
                             const semisep::WoodburyGpuWs& w) {
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, rD = r * D;
  T* lam = static_cast<T*>(gp.dx);
  SolveStatus st = solve_t<T>(dt, dm, dy, d, up, lo, u, v, lam, true, w);
  if (st.bad_row >= 0 || st.singular) return st;
  tridiag_band_grads(dt, N, B, D, lam, y, gp.dd, gp.dup, gp.dlo);
  if (r == 0) return st;
  T* A = reinterpret_cast<T*>(w.A);
  T* G = reinterpret_cast<T*>(w.G);
  if (B * D > 0) {
    gemm(dt, true, false, B, r, D, N, v, 0, y, N * D, A, rD);    // A_b = V^T y_b
    gemm(dt, true, false, B, r, D, N, u, 0, lam, N * D, G, rD);  // G_b = U^T lam_b
  }
  woodbury_uv_grads_kernel<<<grid_for(N * r, kThreads), kThreads>>>(B, N, D, r, lam, y, A, G, static_cast<T*>(gp.du),
                                                                    static_cast<T*>(gp.dv));
  check_launch("semiseparable_solve_backward (du, dv)");
  return st;
}

// f(T{}) for f32 / f64
template <class F> void by_type(DType t, F f) {
  if (t == DType::f32) f(float{});
  else f(double{});
}
}  // namespace

void semisep_matvec(DType t, const SemisepDims& dm, bool causal, const void* x, const void* d, const void* up,
                    const void* lo, const void* u, const void* v, void* y, void* ws, int variant, int upto) {
  by_type(t, [&](auto z) {
    using T = decltype(z);
    matvec_t<T>(dm, causal, static_cast<const T*>(x), static_cast<const T*>(d), static_cast<const T*>(up),
                static_cast<const T*>(lo), static_cast<const T*>(u), static_cast<const T*>(v), static_cast<T*>(y),
                static_cast<T*>(ws), t, variant, upto);
  });
}

void semisep_matvec_backward(DType t, const SemisepDims& dm, bool causal, const void* x, const void* d,
                             const void* up, const void* lo, const void* u, const void* v, const void* dy,
                             const MatvecGradPtrs& g, void* sx, void* sg) {
  by_type(t, [&](auto z) {
    using T = decltype(z);
    matvec_backward_t<T>(dm, causal, static_cast<const T*>(x), static_cast<const T*>(d), static_cast<const T*>(up),
                         static_cast<const T*>(lo), static_cast<const T*>(u), static_cast<const T*>(v),
                         static_cast<const T*>(dy), g, static_cast<T*>(sx), static_cast<T*>(sg), t);
  });
}

std::int64_t tridiag_factor(DType t, std::int64_t N, const void* d, const void* up, const void* lo, void* cp,
                            void* den, double* bad_pivot) {
  if (N <= 0) return -1;
  void* flag = nullptr;
  int dev = 0;
  check_call(cudaGetDevice(&dev), "cudaGetDevice");
  flag = cuda_rt::allocate(dev, sizeof(long long));
  long long row = -1;
  try {
    auto* f = static_cast<long long*>(flag);
    check_call(cudaMemsetAsync(f, 0xff, sizeof(long long), 0), "cudaMemsetAsync");  // -1: no bad pivot
    by_type(t, [&](auto z) {
      using T = decltype(z);
      tridiag_factor_kernel<<<1, 1>>>(N, static_cast<const T*>(d), static_cast<const T*>(up),
                                      static_cast<const T*>(lo), static_cast<T*>(cp), static_cast<T*>(den), f);
    });
    check_launch("tridiag (pivots)");
    // the default stream orders this copy after the kernel; it returns when done
    check_call(cudaMemcpy(&row, f, sizeof row, cudaMemcpyDeviceToHost), "cudaMemcpy (pivot check)");
    if (row >= 0) {
      by_type(t, [&](auto z) {
        using T = decltype(z);
        T p{};
        check_call(cudaMemcpy(&p, static_cast<const T*>(den) + row, sizeof p, cudaMemcpyDeviceToHost),
                   "cudaMemcpy (bad pivot)");
        *bad_pivot = static_cast<double>(p);
      });
    }
  } catch (...) {
    cuda_rt::deallocate(dev, flag, sizeof(long long));
    throw;
  }
  cuda_rt::deallocate(dev, flag, sizeof(long long));
  return static_cast<std::int64_t>(row);
}

void tridiag_apply(DType t, std::int64_t N, std::int64_t outer, std::int64_t inner, const void* lo, const void* cp,
                   const void* den, const void* b, void* y) {
  if (N <= 0 || outer * inner <= 0) return;
  by_type(t, [&](auto z) {
    using T = decltype(z);
    tridiag_apply_kernel<<<grid_for(outer * inner, kThreads), kThreads>>>(
        N, outer, inner, static_cast<const T*>(lo), static_cast<const T*>(cp), static_cast<const T*>(den),
        static_cast<const T*>(b), static_cast<T*>(y));
  });
  check_launch("tridiag_solve");
}

void tridiag_band_grads(DType t, std::int64_t N, std::int64_t outer, std::int64_t inner, const void* lam,
                        const void* y, void* dd, void* dup, void* dlo) {
  if (N <= 0) return;
  by_type(t, [&](auto z) {
    using T = decltype(z);
    tridiag_grads_kernel<<<grid_for(N, kThreads), kThreads>>>(N, outer, inner, static_cast<const T*>(lam),
                                                              static_cast<const T*>(y), static_cast<T*>(dd),
                                                              static_cast<T*>(dup), static_cast<T*>(dlo));
  });
  check_launch("tridiag_solve_backward (band gradients)");
}

void resolvent_diag(DType t, std::int64_t N, std::int64_t K, const void* d, const void* up, const void* lo,
                    const void* z, void* out, double* ws) {
  if (N <= 0 || K <= 0) return;
  by_type(t, [&](auto zz) {
    using T = decltype(zz);
    resolvent_kernel<<<grid_for(K, kThreads), kThreads>>>(N, K, static_cast<const T*>(d), static_cast<const T*>(up),
                                                          static_cast<const T*>(lo), static_cast<const T*>(z),
                                                          static_cast<T*>(out), ws);
  });
  check_launch("tridiag_resolvent_diag");
}

void resolvent_diag_backward(DType t, std::int64_t N, std::int64_t K, const void* d, const void* up, const void* lo,
                             const void* z, const void* dg, void* dd, void* dup, void* dlo, void* dz, double* ws) {
  if (N <= 0) return;
  by_type(t, [&](auto zz) {
    using T = decltype(zz);
    if (K > 0) {
      resolvent_backward_kernel<<<grid_for(K, kThreads), kThreads>>>(
          N, K, static_cast<const T*>(d), static_cast<const T*>(up), static_cast<const T*>(lo),
          static_cast<const T*>(z), static_cast<const T*>(dg), static_cast<T*>(dz), ws);
      check_launch("tridiag_resolvent_diag_backward");
    }
    resolvent_sum_kernel<<<grid_for(N, kThreads), kThreads>>>(N, K, ws, static_cast<T*>(dd), static_cast<T*>(dup),
                                                              static_cast<T*>(dlo));
    check_launch("tridiag_resolvent_diag_backward (sums over shifts)");
  });
}

void resolvent_diag_complex(DType t, std::int64_t N, std::int64_t K, const void* d, const void* up, const void* lo,
                            const void* z, void* out, void* ws) {
  if (N <= 0 || K <= 0) return;
  by_type(t, [&](auto zz) {
    using T = decltype(zz);
    resolvent_complex_kernel<<<grid_for(K, kThreads), kThreads>>>(
        N, K, static_cast<const T*>(d), static_cast<const T*>(up), static_cast<const T*>(lo),
        static_cast<const T*>(z), static_cast<T*>(out), static_cast<semisep::Cplx*>(ws));
  });
  check_launch("tridiag_resolvent_diag_complex");
}

void resolvent_diag_complex_backward(DType t, std::int64_t N, std::int64_t K, const void* d, const void* up,
                                     const void* lo, const void* z, const void* dg, void* dd, void* dup, void* dlo,
                                     void* dz, void* cw, double* ew) {
  if (N <= 0) return;
  by_type(t, [&](auto zz) {
    using T = decltype(zz);
    auto* c = static_cast<semisep::Cplx*>(cw);
    if (K > 0) {
      resolvent_complex_backward_kernel<<<grid_for(K, kThreads), kThreads>>>(
          N, K, static_cast<const T*>(d), static_cast<const T*>(up), static_cast<const T*>(lo),
          static_cast<const T*>(z), static_cast<const T*>(dg), static_cast<T*>(dz), c, ew);
      check_launch("tridiag_resolvent_diag_complex_backward");
    }
    resolvent_complex_sum_kernel<<<grid_for(N, kThreads), kThreads>>>(N, K, c, ew, static_cast<T*>(dd),
                                                                      static_cast<T*>(dup), static_cast<T*>(dlo));
    check_launch("tridiag_resolvent_diag_complex_backward (sums over shifts)");
  });
}

SolveStatus semisep_solve(DType t, const SemisepDims& dm, const void* x, const void* d, const void* up,
                          const void* lo, const void* u, const void* v, void* y, bool trans, void* ws) {
  SolveStatus st;
  by_type(t, [&](auto z) {
    using T = decltype(z);
    st = solve_t<T>(t, dm, static_cast<const T*>(x), static_cast<const T*>(d), static_cast<const T*>(up),
                    static_cast<const T*>(lo), static_cast<const T*>(u), static_cast<const T*>(v), static_cast<T*>(y),
                    trans, semisep::woodbury_gpu_ws(dm.B, dm.N, dm.D, dm.r, sizeof(T), false, ws));
  });
  return st;
}

SolveStatus semisep_solve_backward(DType t, const SemisepDims& dm, const void* d, const void* up, const void* lo,
                                   const void* u, const void* v, const void* y, const void* dy,
                                   const MatvecGradPtrs& g, void* ws) {
  SolveStatus st;
  by_type(t, [&](auto z) {
    using T = decltype(z);
    st = solve_backward_t<T>(t, dm, static_cast<const T*>(d), static_cast<const T*>(up), static_cast<const T*>(lo),
                             static_cast<const T*>(u), static_cast<const T*>(v), static_cast<const T*>(y),
                             static_cast<const T*>(dy), g,
                             semisep::woodbury_gpu_ws(dm.B, dm.N, dm.D, dm.r, sizeof(T), true, ws));
  });
  return st;
}

}  // namespace ad::cuda_k
