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
// The Woodbury solve (semiseparable_solve, compiled, not run on a GPU) composes
// the Thomas launchers, cuBLAS, the sweep and a one-thread LU of the r x r
// capacitance matrix with the CPU's own code (semisep::lu_factor / lu_solve).
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/device.hpp"
#include "cuda/launch.hpp"
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
// in chunk order, in double: kind 0 total (into slot 0), 1 exclusive prefix, 2 exclusive suffix.
template <class T> __global__ void combine_kernel(T* S, i64 B, i64 nc, i64 width, int kind) {
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < B * width;
       t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 b = t / width, j = t % width;
    T* base = S + b * nc * width + j;
    double acc = 0;
    for (i64 q = 0; q < nc; ++q) {
      const i64 c = kind == 2 ? nc - 1 - q : q;
      T* p = base + c * width;
      const double v = static_cast<double>(*p);
      if (kind != 0) *p = static_cast<T>(acc);
      acc += v;
    }
    if (kind == 0) *base = static_cast<T>(acc);
  }
}
template <class T> void combine(T* S, i64 B, i64 nc, i64 width, int kind) {
  if (B * width <= 0) return;
  combine_kernel<<<grid_for(B * width, kThreads), kThreads>>>(S, B, nc, width, kind);
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

template <class T>
void matvec_t(const SemisepDims& dm, bool causal, const T* x, const T* d, const T* up, const T* lo, const T* u,
              const T* v, T* y, T* S, DType dt) {
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, L = dm.L, nc = (N + L - 1) / L, rD = r * D;
  if (B * N * D == 0) return;
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
// Per shift: ab (w + 4kN + 2N) and eb (+ 3N) as on the CPU; dz[k].
template <class T> __global__ void resolvent_backward_kernel(i64 N, i64 K, const T* d, const T* up, const T* lo,
                                                             const T* z, const T* dg, T* dz, double* w) {
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < K;
       k += static_cast<i64>(gridDim.x) * blockDim.x) {
    double *r = w + 4 * k * N, *s = r + N, *ab = s + N, *eb = ab + N;
    const double zk = static_cast<double>(z[k]);
    semisep::resolvent_ratios(N, d, up, lo, zk, r, s);
    dz[k] = static_cast<T>(semisep::resolvent_backward_sweep(N, d, up, lo, zk, dg + k * N, r, s, ab, eb));
  }
}
// Sums over shifts in order, one thread per row.
template <class T> __global__ void resolvent_sum_kernel(i64 N, i64 K, const T* up, const T* lo, const double* w, T* dd,
                                                        T* dup, T* dlo) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<i64>(gridDim.x) * blockDim.x)
    semisep::resolvent_band_sums_row(i, N, K, w, up, lo, dd, dup, dlo);
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
        semisep::resolvent_backward_sweep_complex(N, d, up, lo, zk, dg + 2 * k * N, r, s, ab, ew + k * N);
    dz[2 * k] = static_cast<T>(-sz.re);
    dz[2 * k + 1] = static_cast<T>(sz.im);
  }
}
template <class T> __global__ void resolvent_complex_sum_kernel(i64 N, i64 K, const T* up, const T* lo,
                                                                const semisep::Cplx* cw, const double* ew, T* dd,
                                                                T* dup, T* dlo) {
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<i64>(gridDim.x) * blockDim.x)
    semisep::resolvent_complex_band_sums_row(i, N, K, cw, ew, up, lo, dd, dup, dlo);
}

// ---- semiseparable_solve (Woodbury) ----
// C = I + S (S = V^T Z, r x r) in double, then its LU with partial pivoting:
// semisep::lu_factor, the very code the CPU runs. One thread: r is small (tens)
// and O(r^3) is nothing next to the O(N r^2) products around it.
// *flag = 1 when C is singular, else 0.
template <class T> __global__ void capacitance_kernel(i64 r, const T* S, double* C, i64* piv, i64* flag) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (i64 k = 0; k < r; ++k)
    for (i64 l = 0; l < r; ++l) C[k * r + l] = (k == l ? 1.0 : 0.0) + static_cast<double>(S[k * r + l]);
  *flag = semisep::lu_factor(C, r, piv) ? 0 : 1;
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
                    const void* lo, const void* u, const void* v, void* y, void* ws) {
  by_type(t, [&](auto z) {
    using T = decltype(z);
    matvec_t<T>(dm, causal, static_cast<const T*>(x), static_cast<const T*>(d), static_cast<const T*>(up),
                static_cast<const T*>(lo), static_cast<const T*>(u), static_cast<const T*>(v), static_cast<T*>(y),
                static_cast<T*>(ws), t);
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
    resolvent_sum_kernel<<<grid_for(N, kThreads), kThreads>>>(N, K, static_cast<const T*>(up),
                                                              static_cast<const T*>(lo), ws, static_cast<T*>(dd),
                                                              static_cast<T*>(dup), static_cast<T*>(dlo));
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
    resolvent_complex_sum_kernel<<<grid_for(N, kThreads), kThreads>>>(N, K, static_cast<const T*>(up),
                                                                      static_cast<const T*>(lo), c, ew,
                                                                      static_cast<T*>(dd), static_cast<T*>(dup),
                                                                      static_cast<T*>(dlo));
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
