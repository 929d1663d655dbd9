#pragma once
// CPU kernels of the semiseparable and tridiagonal ops: plain functions over
// raw row-major pointers. Conventions in semiseparable_math.hpp.
//
// Sequences of N rows are cut into chunks of L rows (L fixed by the shapes,
// never by the thread count). Sums over rows (V^T x, prefix and suffix sums)
// are formed per chunk, then combined over chunks in order (in double), so
// every result is the same bits for any number of threads.
#include <cstddef>
#include <cstdint>

#include "ops/semiseparable_math.hpp"

namespace ad::semisep {

struct Dims {
  std::int64_t B = 1, N = 0, D = 0, r = 0;  // batch, sequence, columns, rank
  std::int64_t L = 1;                        // rows per chunk
  std::int64_t chunks() const { return (N + L - 1) / L; }
};
// Rows per chunk: `requested` if > 0, else max(256, 16384 / D) (a chunk of
// x stays in L2 between the two passes that read it).
std::int64_t chunk_rows(std::int64_t N, std::int64_t D, std::int64_t requested);
inline Dims make_dims(std::int64_t B, std::int64_t N, std::int64_t D, std::int64_t r, std::int64_t requested) {
  return Dims{B, N, D, r, chunk_rows(N, D, requested)};
}

// Outputs of at least this many bytes (y, dx, and du / dv together) have
// their rows written with streaming (non-temporal) stores on x86, bypassing
// the cache: default, the last-level cache's size (32 MiB where the system
// does not say). Same bits either way; tests lower it to reach that path.
std::size_t stream_min_bytes();
void set_stream_min_bytes(std::size_t bytes);  // 0 counts as 1

// Which CUDA kernels semiseparable_matvec's forward runs on a GPU
// (cuda_k::semisep_matvec's variant): 0 the default (as 4), 1 the first tiled
// kernels only, 2 the warp-level ones, 3 the staged ones, 4 the staged ones
// with bulk copies, 5 and 6 as 4 with the causal product in clusters of 8
// and 4 chunks (sm_90), 7 to 10 as 4 with the causal product in rounds that
// keep x and v in L2 (rounds of 32, 64, 16 and 32 chunks, B tasks 8, 4, 16
// and 16 rounds of tickets behind); each where it applies, else as 4; any
// other value is an ad::Error (the benchmark's timing-only kernels, 11 on,
// are not products). Returns the previous setting; for tests and benchmarks
// that compare them.
int set_gpu_matvec_variant(int v);
int gpu_matvec_variant();
// How the full backward runs at r <= 4 (f32, D a multiple of 8, every
// gradient wanted): 0 as the host and shape suit (the default: one sweep
// over each chunk's rows where the CPU has AVX-512 or D >= 128, else three
// sweeps: the band's dots, dx's mix, du and dv's dots), 1 one sweep always,
// 2 three sweeps always. Results agree to rounding, not in bits. Returns the
// previous setting; for tests and benchmarks that compare them.
int set_cpu_backward_sweeps(int mode);

// Workspace carving: regions of `n` elements, each rounded up to 64 bytes.
struct Carve {
  char* p = nullptr;
  std::size_t bytes = 0;
  template <class U> U* take(std::int64_t n) {
    U* out = p ? reinterpret_cast<U*>(p + bytes) : nullptr;
    bytes += (static_cast<std::size_t>(n) * sizeof(U) + 63) / 64 * 64;
    return out;
  }
};

// ---- semiseparable_matvec ----  y[b] = H x[b], H = T + U V^T (causal: the
// lower triangle of H: d, lo and tril(U V^T) including its diagonal).
// x, y (B, N, D); u, v (N, r) stored as T, or as bf16/f16 with T = float.
// w: W = V^T x per b, (B, r, D), as semiseparable_sums forms it, or nullptr
// (formed here). Only the full product reads it; causal ignores it.
std::size_t matvec_ws_bytes(const Dims& dm, std::size_t elem);
template <class T, class UV>
void matvec(const Dims& dm, bool causal, const T* x, const T* d, const T* up, const T* lo, const UV* u, const UV* v,
            const T* w, T* y, void* ws);

// ---- semiseparable_sums ----  W[b] = V^T x[b] (B, r, D): the chunk sums
// combined in double in chunk order, the same bits matvec forms itself.
std::size_t sums_ws_bytes(const Dims& dm, std::size_t elem);
template <class T, class UV> void sums(const Dims& dm, const T* x, const UV* v, T* w, void* ws);

// The gradients of semiseparable_matvec for dy = dL/dy; a nullptr output is
// not formed. dup is all zero when causal (t_upper is unused).
template <class T> struct MatvecGrads { T *dx = nullptr, *dd = nullptr, *dup = nullptr, *dlo = nullptr, *du = nullptr, *dv = nullptr; };
std::size_t matvec_backward_ws_bytes(const Dims& dm, std::size_t elem);
// w as for matvec: given, the full backward's first pass reads only dy and u.
template <class T, class UV>
void matvec_backward(const Dims& dm, bool causal, const T* x, const T* d, const T* up, const T* lo, const UV* u,
                     const UV* v, const T* w, const T* dy, const MatvecGrads<T>& g, void* ws);

// The errors of a failed solve, shared by the CPU and CUDA paths (ad::Error
// naming `op`): a zero or non-finite Thomas pivot at `row`, and a singular
// Woodbury capacitance matrix of rank r.
[[noreturn]] void fail_pivot(const char* op, double pivot, std::int64_t row, std::int64_t N);
[[noreturn]] void fail_capacitance(const char* op, std::int64_t r);

// ---- tridiag_solve ----  y = T^-1 b (trans: T^-T b) for b viewed as
// (outer, N, inner): every (outer, column) is one system. Thomas algorithm
// without pivoting; a zero (or non-finite) pivot throws ad::Error naming
// `op` and the row. y may equal b.
std::size_t tridiag_ws_bytes(std::int64_t N, std::size_t elem);
template <class T>
void tridiag_solve(const char* op, std::int64_t N, std::int64_t outer, std::int64_t inner, const T* d, const T* up,
                   const T* lo, const T* b, T* y, bool trans, void* ws);
// For y = T^-1 b and g = dL/dy: lam = T^-T g (= dL/db), dd = -sum lam_i y_i,
// dup_i = -sum lam_i y_{i+1}, dlo_i = -sum lam_{i+1} y_i (sums over outer and columns).
template <class T>
void tridiag_solve_backward(const char* op, std::int64_t N, std::int64_t outer, std::int64_t inner, const T* d,
                            const T* up, const T* lo, const T* y, const T* g, T* lam, T* dd, T* dup, T* dlo, void* ws);

// ---- tridiag_resolvent_diag ----  out[k, i] = ((T - z_k I)^-1)_{ii}, K shifts.
std::size_t resolvent_ws_bytes(std::int64_t N, std::int64_t K);
template <class T>
void resolvent_diag(std::int64_t N, std::int64_t K, const T* d, const T* up, const T* lo, const T* z, T* out, void* ws);
std::size_t resolvent_backward_ws_bytes(std::int64_t N, std::int64_t K);
template <class T>
void resolvent_diag_backward(std::int64_t N, std::int64_t K, const T* d, const T* up, const T* lo, const T* z,
                             const T* dg, T* dd, T* dup, T* dlo, T* dz, void* ws);

// ---- tridiag_resolvent_diag_complex ----  complex shifts z_k = (z[2k], z[2k+1]);
// out[(k N + i) 2 + {0, 1}] = (re, im) of ((T - z_k I)^-1)_{ii}. dg has out's
// layout; dz[2k], dz[2k+1] = dL/dRe z_k, dL/dIm z_k.
std::size_t resolvent_complex_ws_bytes(std::int64_t N, std::int64_t K);
template <class T>
void resolvent_diag_complex(std::int64_t N, std::int64_t K, const T* d, const T* up, const T* lo, const T* z, T* out,
                            void* ws);
std::size_t resolvent_complex_backward_ws_bytes(std::int64_t N, std::int64_t K);
template <class T>
void resolvent_diag_complex_backward(std::int64_t N, std::int64_t K, const T* d, const T* up, const T* lo, const T* z,
                                     const T* dg, T* dd, T* dup, T* dlo, T* dz, void* ws);

// ---- semiseparable_solve ----  y[b] = H^-1 x[b] by Woodbury:
// H^-1 = T^-1 - T^-1 U (I + V^T T^-1 U)^-1 V^T T^-1 (trans: with H^T).
std::size_t woodbury_ws_bytes(const Dims& dm, std::size_t elem);
template <class T>
void woodbury_solve(const char* op, const Dims& dm, const T* x, const T* d, const T* up, const T* lo, const T* u,
                    const T* v, T* y, bool trans, void* ws);
// For y = H^-1 x, g = dL/dy: lam = H^-T g, dH = -lam y^T on the band of T
// and through U, V: du = -lam (y^T V), dv = -y (lam^T U) (summed over b).
std::size_t woodbury_backward_ws_bytes(const Dims& dm, std::size_t elem);
template <class T>
void woodbury_solve_backward(const char* op, const Dims& dm, const T* d, const T* up, const T* lo, const T* u,
                             const T* v, const T* y, const T* g, T* lam, T* dd, T* dup, T* dlo, T* du, T* dv,
                             void* ws);

// ---- semiseparable_solve on a GPU (src/cuda/semiseparable.cu) ----
// Its workspace, carved in this order (64-byte aligned regions; elem = the
// dtype's size): cp, den (N elems each: the Thomas coefficients), Z = T^-1 U
// (N r elems), S (max(B r D, r r) elems: V^T Z, then W_b = V^T y_b per b at
// b r D, then -C^-1 W_b in place), C (r r + 2 r doubles: the LU factors of
// C = I + V^T Z, and capacitance_factor's two vectors), piv (r i64), flag (1 i64: 1 = C singular), tmp (B D r
// doubles: one r-vector per column for the LU solves). The backward adds
// A_b = V^T y_b and G_b = U^T lam_b (B r D elems each). With base nullptr
// every pointer is nullptr and only `bytes` is meaningful (the planner's size).
struct WoodburyGpuWs {
  char *cp = nullptr, *den = nullptr, *Z = nullptr, *S = nullptr;
  double* C = nullptr;
  std::int64_t *piv = nullptr, *flag = nullptr;
  double* tmp = nullptr;
  char *A = nullptr, *G = nullptr;
  std::size_t bytes = 0;
};
inline WoodburyGpuWs woodbury_gpu_ws(std::int64_t B, std::int64_t N, std::int64_t D, std::int64_t r,
                                     std::size_t elem, bool backward, void* base = nullptr) {
  Carve c{static_cast<char*>(base)};
  const auto e = static_cast<std::int64_t>(elem);
  const std::int64_t rD = B * r * D;
  WoodburyGpuWs w;
  w.cp = c.take<char>(N * e);
  w.den = c.take<char>(N * e);
  w.Z = c.take<char>(N * r * e);
  w.S = c.take<char>((rD > r * r ? rD : r * r) * e);
  w.C = c.take<double>(r * r + 2 * r);  // and two r-vectors for capacitance_factor
  w.piv = c.take<std::int64_t>(r);
  w.flag = c.take<std::int64_t>(1);
  w.tmp = c.take<double>(rD);
  if (backward) {
    w.A = c.take<char>(rD * e);
    w.G = c.take<char>(rD * e);
  }
  w.bytes = c.bytes;
  return w;
}

}  // namespace ad::semisep
