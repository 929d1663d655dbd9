#pragma once
// Internal: the CUDA kernels' launchers, as plain functions over raw device
// pointers and sizes (no CUDA or fmt headers: the op files, compiled by the
// host compiler, call them from their *_cuda glue). Everything is queued on
// the current device's default stream.
#include <cstddef>
#include <cstdint>

#include "ad/dtype.hpp"
#include "ad/shape.hpp"
#include "ops/conv_math.hpp"
#include "ops/pointwise.hpp"
#include "ops/rows.hpp"

#include <initializer_list>

namespace ad::cuda_k {

// ---- pointwise (src/cuda/pointwise.cu) ----
// y[i] = f(x[i]); t is f32 or f64.
template <class F> void map1(DType t, const void* x, void* y, std::int64_t n, F f);
// y[i] = f(a[i], b[i]), same shapes.
template <class F> void map2(DType t, const void* a, const void* b, void* y, std::int64_t n, F f);
// y = f(a, b) with numpy broadcasting of a (shape as) and b (bs) to ys.
template <class F>
void broadcast2(DType t, const void* a, const Shape& as, const void* b, const Shape& bs, void* y, const Shape& ys, F f);
// y[i] = f(a[i], b[i], c[i]), same shapes.
template <class F> void map3(DType t, const void* a, const void* b, const void* c, void* y, std::int64_t n, F f);
// y = f(a, b, c) with numpy broadcasting of a (as), b (bs) and c (cs) to ys.
template <class F>
void broadcast3(DType t, const void* a, const Shape& as, const void* b, const Shape& bs, const void* c, const Shape& cs,
                void* y, const Shape& ys, F f);
// y = x converted between any of f32, f64, f16, bf16.
void cast(DType from, DType to, const void* x, void* y, std::int64_t n);
// Adds to *counter (on the current device) the elements finite in x (dtype
// from) but not in y (its conversion, dtype to).
void count_cast_overflows(DType from, const void* x, DType to, const void* y, std::int64_t n,
                          unsigned long long* counter);
// dst += src.
void add_into(DType t, void* dst, const void* src, std::int64_t n);
// y[i] = dropout's f(x[i], i) (src/ops/random_math.hpp).
void dropout(DType t, const void* x, void* y, std::int64_t n, std::uint64_t seed, std::uint64_t offset, float p,
             double scale);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- cuBLAS (src/cuda/blas.cpp) ----
// Row-major C_i = op(A_i) op(B_i) for i < batch, op = transpose when ta/tb;
// A_i = a + i * stride_a (stride 0: the same matrix for every i), likewise B
// and C. f32 or f64. K = 0 gives zeros. accumulate: C_i += ... instead.
void gemm(DType t, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
          const void* a, std::int64_t stride_a, const void* b, std::int64_t stride_b, void* c, std::int64_t stride_c,
          bool accumulate = false);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- reductions (src/cuda/reduce.cu) ----
// y = scale * sum of x over the dims where `keep` (same rank as xs) is 1 and
// xs is not; y is laid out as `keep`. Accumulates in f64, in a fixed order.
// ws: sumlayout::layout(xs, keep).ws_bytes() bytes (ops/sum_layout.hpp), nullptr when 0
void reduce_sum(DType t, const void* x, const Shape& xs, const Shape& keep, void* y, double scale, void* ws);
// y = max of x over the same groups (NaN propagates; the same value, and for
// ties between 0 and -0 the same bits, as the CPU's left-to-right scan).
void reduce_max(DType t, const void* x, const Shape& xs, const Shape& keep, void* y);
// dx = dy at the first (lowest-index) element of each group equal to the
// group's maximum, found again from x (or the first NaN where the group has
// one), 0 elsewhere.
void max_backward(DType t, const void* x, const Shape& xs, const Shape& keep, const void* dy, void* dx);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- along one axis (src/cuda/rows.cu) ----
// Rows of a tensor viewed as (outer, len, inner): row (o, i) holds elements
// o * len * inner + i + j * inner, j < len.
struct RowGeom {
  std::int64_t outer, len, inner;
};
// Runs the row functor `op` of ops/rows.hpp on every row, one row per thread:
// `in` are its input pointers in the functor's order, `out` its output.
void for_rows(DType t, RowGeom g, rows::Op op, std::initializer_list<const void*> in, void* out);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- data movement (src/cuda/shape.cu) ----
// Element-size-generic: `es` is the element size in bytes (2, 4 or 8).
// y = x with its dims permuted: ys[i] = xs[perm[i]].
void permute(std::size_t es, const void* x, const Shape& xs, const Shape& perm, void* y, const Shape& ys);
// Along one axis of tensors seen as (outer, len, inner): for o < outer,
// j < n: dst[(o * dst_len + dst_at + j) * inner + i] = src[(o * src_len + src_at + j) * inner + i].
// Covers slice, slice_backward, concat, part_backward.
void copy_axis(std::size_t es, const void* src, std::int64_t src_len, std::int64_t src_at, void* dst,
               std::int64_t dst_len, std::int64_t dst_at, std::int64_t outer, std::int64_t n, std::int64_t inner);
// bytes of zeros at p
void zero(void* p, std::size_t bytes);
// The first position i < n with index[i] outside [0, len), or -1; when found,
// its value goes to *value. Synchronises with the device (it reads a flag the
// check kernel wrote), so the caller can throw ad::Error on the host.
std::int64_t first_bad_index(const std::int64_t* index, std::int64_t n, std::int64_t len, std::int64_t* value);
// gather along an axis: x (outer, len, inner), index [ni] (all in range),
// y (outer, ni, inner): y[o, j, i] = x[o, index[j], i].
void gather(std::size_t es, const void* x, std::int64_t outer, std::int64_t len, std::int64_t inner,
            const std::int64_t* index, std::int64_t ni, void* y);
// Its adjoint: dx (outer, len, inner) [o, v, i] = sum over j with index[j] = v
// of dy[o, j, i], added in increasing j from 0 (the CPU's order: same bits);
// no atomics, so deterministic. f32 or f64.
void gather_backward(DType t, const void* dy, std::int64_t outer, std::int64_t len, std::int64_t inner,
                     const std::int64_t* index, std::int64_t ni, void* dx);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- convolution and pooling (src/cuda/conv.cu) ----
// Geometry and layouts: ops/conv_math.hpp. f32 or f64.
// cols [cnt][g.rows()][g.l()] = the columns of images n0 .. n0 + cnt - 1 of x.
void im2col(DType t, const conv::Geom& g, const void* x, std::int64_t n0, std::int64_t cnt, void* cols);
// dx [cnt][C][H][W] = col2im of cols [cnt][g.rows()][g.l()] (written, not added).
void col2im(DType t, const conv::Geom& g, const void* cols, std::int64_t cnt, void* dx);
// y [N][C][HO][WO] = the windows' maxima of x; dx = max_pool2d's gradient for dy.
void max_pool2d(DType t, const conv::Geom& g, const void* x, void* y);
void max_pool2d_backward(DType t, const conv::Geom& g, const void* x, const void* dy, void* dx);

// ---- normalisation over the last dim d (src/cuda/norm.cu) ----
// The row functors of ops/norm_math.hpp, one thread per row. The dgamma
// variants (which = 1) first store each row's statistics in `stats` (2 * rows
// doubles for layer_norm, rows for rms_norm), then one thread per column sums
// the rows in order.
void layer_norm(DType t, const void* x, const void* g, const void* b, void* y, std::int64_t rows, std::int64_t d,
                double eps);
void layer_norm_backward(DType t, int which, const void* x, const void* g, const void* dy, void* out,
                         std::int64_t rows, std::int64_t d, double eps, double* stats);
void rms_norm(DType t, const void* x, const void* g, void* y, std::int64_t rows, std::int64_t d, double eps);
void rms_norm_backward(DType t, int which, const void* x, const void* g, const void* dy, void* out,
                       std::int64_t rows, std::int64_t d, double eps, double* stats);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- losses (src/cuda/loss.cu) ----
// Each writes one value y[0] = (sum of terms) / divisor, the terms summed in
// f64 in a fixed order: per-row (cross_entropy) or per-block (mse) partial
// sums go to `parts` (the op's workspace), then one block adds them up.
// cross_entropy: logits (rows, c), labels in range; parts: rows doubles.
void cross_entropy(DType t, const void* x, const std::int64_t* labels, std::int64_t rows, std::int64_t c,
                   double divisor, double* parts, void* y);
// (softmax - onehot) dy [/ rows], one thread per row (ops/loss_math.hpp).
void cross_entropy_backward(DType t, const void* x, const std::int64_t* labels, const void* dy, void* dx,
                            std::int64_t rows, std::int64_t c, bool mean);
// mse: (a - b)^2 over n elements; parts: nparts doubles (nparts >= 1).
void mse(DType t, const void* a, const void* b, std::int64_t n, double divisor, double* parts, std::int64_t nparts,
         void* y);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- semiseparable and tridiagonal (src/cuda/semiseparable.cu) ----
// Shapes of semiseparable_matvec: x (B, N, D), u, v (N, r); rows cut into
// chunks of L (the CPU's chunking, ops/semiseparable_cpu.hpp). f32 or f64,
// u and v in x's dtype.
struct SemisepDims {
  std::int64_t B, N, D, r, L;
};
// y = H x (causal: its lower triangle). ws: B * chunks * r * D elements
// (chunk sums; non-causal: V^T x per b at ws + b * chunks * r * D); causal
// f32 with the staged kernels: at least semisep_plan::staged_scan_ws_bytes
// r <= 32 and D <= 256 take the tiled kernels. variant (see
// semisep::set_gpu_matvec_variant): 1 the first tiled ones only, 2 the
// warp-level ones where they apply, 3 the staged ones (f32) where they apply,
// 4 and 0 the staged ones with bulk copies, 5 and 6 as 4 with the causal
// product in clusters of 8 and 4 chunks, 7 to 10 as 4 with the causal
// product in rounds; 11 to 17 time parts of the causal kernels (y is then
// not the product; semiseparable.cu, matvec_tiled); upto (the tiled kernels only):
// 1 stops after the chunk sums, 2 after combining them, 3 runs all (the
// benchmark times the stages by difference; y is not formed before 3; the
// one-pass causal kernel runs only at 3).
void semisep_matvec(DType t, const SemisepDims& dm, bool causal, const void* x, const void* d, const void* up,
                    const void* lo, const void* u, const void* v, void* y, void* ws, int variant = 0,
                    int upto = 3);
// The matvec's gradients for dy; a nullptr output is not formed (dup is 0
// when causal). sx, sg: two regions of B * chunks * r * D elements each.
struct MatvecGradPtrs {
  void *dx, *dd, *dup, *dlo, *du, *dv;
};
void semisep_matvec_backward(DType t, const SemisepDims& dm, bool causal, const void* x, const void* d,
                             const void* up, const void* lo, const void* u, const void* v, const void* dy,
                             const MatvecGradPtrs& g, void* sx, void* sg);
// y[b] = H^-1 x[b] (trans: H^-T) by Woodbury, H = T + U V^T:
// y = T^-1 x - Z C^-1 V^T T^-1 x, Z = T^-1 U, C = I + V^T Z (r x r, LU in
// double by one GPU thread). ws: semisep::woodbury_gpu_ws (ops/semiseparable_cpu.hpp).
// Waits for the device (twice: the pivots, then C) and reports a failure for
// the caller to throw; y is then incomplete.
struct SolveStatus {
  std::int64_t bad_row = -1;  // first zero or non-finite Thomas pivot, or -1
  double bad_pivot = 0;       // its value
  bool singular = false;      // C is singular
};
SolveStatus semisep_solve(DType t, const SemisepDims& dm, const void* x, const void* d, const void* up,
                          const void* lo, const void* u, const void* v, void* y, bool trans, void* ws);
// Its gradients for y = H^-1 x and dy, all formed (every pointer of g set;
// g.dx receives lam = H^-T dy = dL/dx): dT = -lam y^T on the band,
// du = -sum_b lam_b (V^T y_b)^T, dv = -sum_b y_b (U^T lam_b)^T.
// ws: woodbury_gpu_ws(..., backward = true).
SolveStatus semisep_solve_backward(DType t, const SemisepDims& dm, const void* d, const void* up, const void* lo,
                                   const void* u, const void* v, const void* y, const void* dy,
                                   const MatvecGradPtrs& g, void* ws);
// Thomas elimination coefficients (cp, den: N elements each) of T with
// diagonal d, super-diagonal up, sub-diagonal lo. Returns -1, or the first row
// with a zero or non-finite pivot (its value in *bad_pivot). Waits for the
// device (it reads a flag the kernel wrote), so the caller can throw.
std::int64_t tridiag_factor(DType t, std::int64_t N, const void* d, const void* up, const void* lo, void* cp,
                            void* den, double* bad_pivot);
// y = T^-1 b from those coefficients, b and y (outer, N, inner), one thread
// per (outer, column); y may equal b.
void tridiag_apply(DType t, std::int64_t N, std::int64_t outer, std::int64_t inner, const void* lo, const void* cp,
                   const void* den, const void* b, void* y);
// dd_i = -sum lam_i y_i, dup_i = -sum lam_i y_{i+1}, dlo_i = -sum lam_{i+1} y_i (f64 sums, the CPU's order).
void tridiag_band_grads(DType t, std::int64_t N, std::int64_t outer, std::int64_t inner, const void* lam,
                        const void* y, void* dd, void* dup, void* dlo);
// diag((T - z_k I)^-1) for K shifts, one thread per shift; ws: 2 N K doubles.
void resolvent_diag(DType t, std::int64_t N, std::int64_t K, const void* d, const void* up, const void* lo,
                    const void* z, void* out, double* ws);
// Its gradients; ws: 4 N K doubles.
void resolvent_diag_backward(DType t, std::int64_t N, std::int64_t K, const void* d, const void* up, const void* lo,
                             const void* z, const void* dg, void* dd, void* dup, void* dlo, void* dz, double* ws);
// The same for K complex shifts z (K, 2) = (re, im), out (K, N, 2); one
// thread per shift; ws: 2 N K complex doubles (16 B each).
void resolvent_diag_complex(DType t, std::int64_t N, std::int64_t K, const void* d, const void* up, const void* lo,
                            const void* z, void* out, void* ws);
// Its gradients (dz (K, 2)); cw: 3 N K complex doubles (r, s, abar per
// shift), ew: N K doubles (Re ebar per shift), both carved by the caller.
void resolvent_diag_complex_backward(DType t, std::int64_t N, std::int64_t K, const void* d, const void* up,
                                     const void* lo, const void* z, const void* dg, void* dd, void* dup, void* dlo,
                                     void* dz, void* cw, double* ew);

}  // namespace ad::cuda_k

namespace ad::cuda_k {

// ---- semi-Markov CRF (src/cuda/semicrf.cu) ----
// The model and shapes: include/ad/semicrf.hpp. Device pointers in the dtype
// t (f32 or f64), L i64 (B) already checked (1 <= L[b] <= T). ws: the op's
// workspace, ops/semicrf_gpu.hpp's layout for the pass.
struct SemicrfArgs {
  std::int64_t B, T, K, C;
  bool general;  // Tr (K, C, C)
  const void *S, *Tr, *D, *P;
  const std::int64_t* L;
};
// logZ (B).
void semicrf_logz(DType t, const SemicrfArgs& a, void* out, void* ws);
// [dS (B,T+1,C) | dTr | dD (K,C) | dP (C)] for dlogz (B).
void semicrf_logz_backward(DType t, const SemicrfArgs& a, const void* dlogz, void* out, void* ws);
// Posterior marginals (B, T, C).
void semicrf_marginals(DType t, const SemicrfArgs& a, void* out, void* ws);
// Best segmentation (B, T), segments encoding. Returns -1, or the first
// sequence with no allowed segmentation (waits for the device).
std::int64_t semicrf_viterbi(DType t, const SemicrfArgs& a, std::int64_t* out, void* ws);
// Score (B) of segments (B, T), already validated.
void semicrf_score(DType t, const SemicrfArgs& a, const std::int64_t* seg, void* out);
// Its gradient for dscore (B), flat as semicrf_logz_backward.
void semicrf_score_backward(DType t, const SemicrfArgs& a, const std::int64_t* seg, const void* dscore, void* out);
// The flat index into S of its first NaN or infinite value S[b, t, c] with
// t <= L[b] (L on the device), and that value in *v; -1 if there is none.
// Waits for the device.
std::int64_t semicrf_first_non_finite_s(DType t, const SemicrfArgs& a, double* v);
// S (B, T+1, C) from scores (B, T, C) (semicrf_cumulative), and its adjoint;
// L (B, on the device, already checked to be 1..T) or nullptr (every
// sequence T long): positions t >= L[b] are padding, not read. Returns the
// first b with a non-finite S (a non-finite score, or sums that overflow the
// dtype; every element is checked, as on the CPU), or -1. Waits for the
// device.
std::int64_t semicrf_cumulative(DType t, std::int64_t B, std::int64_t T, std::int64_t C, const void* x,
                                const std::int64_t* L, void* S);
void semicrf_cumulative_backward(DType t, std::int64_t B, std::int64_t T, std::int64_t C, const void* dS,
                                 const std::int64_t* L, void* dx);

}  // namespace ad::cuda_k

#include "ops/attention_cpu.hpp"

namespace ad::cuda_k {

// ---- attention (src/cuda/attention.cu) ----
// Layouts of ops/attention_cpu.hpp; d <= 128 (throws ad::Error naming the op
// and d otherwise); lens: device i64 [B] (checked in range) or nullptr.
// q, k, v, o (and dout, dq, dk, dv) in dtype t: f32 or f64 on CUDA cores,
// bf16 or f16 on tensor cores (f32 accumulation). lse, dlse and D in the
// accumulate type: f64 for f64, f32 otherwise.
void attention_forward(DType t, const attn::Dims& dm, const void* q, const void* k, const void* v,
                       const std::int64_t* lens, void* o, void* lse);
// ws: B H Nq accumulate-type elements (D = rowsum(dO o O) - dlse).
void attention_backward(DType t, const attn::Dims& dm, const void* q, const void* k, const void* v, const void* o,
                        const void* lse, const void* dout, const void* dlse, const std::int64_t* lens, void* dq,
                        void* dk, void* dv, void* ws);

}  // namespace ad::cuda_k
