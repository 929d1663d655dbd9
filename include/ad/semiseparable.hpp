#pragma once
// Semiseparable matrices H = T + U V^T (T tridiagonal, U and V of rank r) and
// tridiagonal systems, as graph ops with exact gradients, plus Tensor-level
// utilities (factorisation of a dense H, a multi-level HODLR form) and a
// learned causal token-mixer layer built from them.
//
// T is given by three vectors: t_diag (N) is T[i][i], t_upper (N-1) is
// T[i][i+1], t_lower (N-1) is T[i+1][i]. T is not assumed symmetric.
// U and V are (N, r), row-major. All float arguments of an op share x's dtype
// (f32 or f64) unless said otherwise.
#include <cstdint>
#include <vector>

#include "ad/graph.hpp"

namespace ad {

// ---- graph ops ----

// y[b] = H x[b] = T x[b] + U (V^T x[b]);  x (B, N, D) -> y (B, N, D).
// causal: only the lower triangle of H is applied: the diagonal and
// sub-diagonal of T and the lower triangle of U V^T including its diagonal,
//   y_i = t_lower[i-1] x_{i-1} + t_diag[i] x_i + u_i . sum_{j<=i} v_j x_j^T,
// through prefix sums of v_j x_j^T (t_upper is then unused, its gradient 0).
// Cost O(B N D r) either way; gradients for every input in one backward pass.
// The full product on the CPU is two nodes: W = V^T x (B, r, D, a
// semiseparable_sums node) and the product reading it, which its backward
// reads again instead of passing over x and v once more.
// Mixed precision (CPU only): with x in f32, u and v may be stored as bf16 or
// f16 (both the same); products and sums are formed in f32 (their gradients
// come back cast to bf16/f16). On a GPU, bf16/f16 u, v are an ad::Error when
// the op runs. Throws ad::Error (naming the op and the shapes) when the
// shapes or dtypes do not fit, or N < 1.
Var semiseparable_matvec(const Operand& x, const Operand& t_diag, const Operand& t_upper, const Operand& t_lower,
                         const Operand& u, const Operand& v, bool causal = false);

// y[b] = (T + U V^T)^-1 x[b];  x (B, N, D) -> y (B, N, D), by the Woodbury
// identity: T^-1 applied by the Thomas algorithm, one r x r capacitance
// matrix I + V^T T^-1 U (LU with partial pivoting). Cost O(N r^2 + B N D r).
// u, v have x's dtype. Gradients: a second Woodbury solve with H^T.
// Throws ad::Error at build time on shape/dtype misfit; at run time (naming
// the op and the row) when T has a zero pivot (the Thomas algorithm does not
// pivot: T should be diagonally dominant or otherwise LU-stable), or when the
// capacitance matrix C = I + V^T T^-1 U is singular to working precision
// (||C^-1||_1 (1 + ||V^T T^-1 U||_1) u >= 0.1, u = 2^-24 for f32, 2^-53 for
// f64: past that the solution has no correct digit), or (on the CPU) when
// the result's relative residual ||x - H y||_inf / (||H||_inf ||y||_inf +
// ||x||_inf) exceeds 1e-8 (f64) or 1e-3 (f32): the Woodbury formula is not
// backward stable, and where T^-1 is far larger than H^-1 (T = diag(1e-17,
// 1), u = v = e_1) its two terms cancel and y lost every digit with no other
// check failing. The residual costs one more product with H. The capacitance
// estimate takes the error of forming S = V^T T^-1 U as u (1 + ||S||); where
// S's sums cancel (terms far larger than S) it is larger, and a numerically
// singular H can pass both checks: H = T + u v^T with v^T T^-1 u = -1 built
// from random vectors at N >= 1000 returned y ~ 1e15, a small residual for
// a y that large (a known gap). On a GPU the residual is not checked yet.
Var semiseparable_solve(const Operand& x, const Operand& t_diag, const Operand& t_upper, const Operand& t_lower,
                        const Operand& u, const Operand& v);

// y = T^-1 b by the Thomas algorithm, O(N) per column. b is (N), or
// (..., N, M): the systems run along the second-to-last axis, every other
// index is an independent right-hand side (batched). y has b's shape.
// Gradients: db = T^-T dy (a second solve), dT = -db y^T on the band.
// A zero (or non-finite) pivot throws ad::Error at run time naming the op
// and the row; no pivoting is done (see semiseparable_solve).
Var tridiag_solve(const Operand& t_diag, const Operand& t_upper, const Operand& t_lower, const Operand& b);

// diag((T - z I)^-1) in O(N) per shift, through the theta/phi recurrences in
// ratio form (r_i = theta_i / theta_{i-1}, s_i = phi_i / phi_{i+1}, each an
// O(1) recurrence; G_ii = 1 / (r_i + s_i - a_i)): neither overflows nor
// underflows at any N (10^6 tested). Computed in double. Real shifts: z is ()
// giving (N), or (K) giving (K, N). Differentiable in t_diag, t_upper,
// t_lower and z (reverse mode through the recurrences, O(N) per shift, run
// on T / 2^m and scaled back, so scaling T and z by 2^k scales the gradients
// by 2^-2k exactly; the gradient is finite while no leading or trailing
// principal minor of T - zI vanishes, it is itself within double's range and
// the entries of T - zI span less than about 10^150 in magnitude: the one
// scale 2^m that the backward runs at must hold every G_ii^2, and diagonal
// entries 1e160 and 1 apart overflow it (inf and NaN gradients; a known
// limit, the real and the complex op alike).
// A zero coupling (t_upper or t_lower exactly 0) splits T into blocks: z at an
// eigenvalue of one block makes its rows infinite, the other rows stay right.
Var tridiag_resolvent_diag(const Operand& t_diag, const Operand& t_upper, const Operand& t_lower, const Operand& z);

// tridiag_resolvent_diag for complex shifts. The engine has no complex dtype:
// a complex number is a trailing dimension of 2 holding (re, im). z is (2)
// giving (N, 2), or (K, 2) giving (K, N, 2); T stays real (not assumed
// symmetric). The same ratio recurrences in complex double arithmetic (e / w
// by Smith's method), so no overflow or underflow at any N (10^6 tested);
// with Im z = 0 the real parts are the real op's values bit for bit.
// Differentiable in t_diag, t_upper, t_lower and z (dz = (dL/dRe z,
// dL/dIm z)), O(N) per shift. When z is an eigenvalue of T the value is
// infinite, as for the real op (no error): a ratio that is exactly 0 gives an
// infinite quotient and G_ii = 1/0 = (+-inf, 0); the gradient is then not
// finite. Throws ad::Error naming the op and the shapes when z is not (2) or
// (K, 2), or the shapes of T or the dtypes (f32/f64, all the same) do not fit.
Var tridiag_resolvent_diag_complex(const Operand& t_diag, const Operand& t_upper, const Operand& t_lower,
                                   const Operand& z);

// ---- utilities on tensors (not graph ops; f64 results) ----

// The dense N x N matrix T + U V^T (causal: its lower triangle), f64.
// Inputs as for semiseparable_matvec (any float dtype). For tests and checks.
Tensor semiseparable_dense(const Tensor& t_diag, const Tensor& t_upper, const Tensor& t_lower, const Tensor& u,
                           const Tensor& v, bool causal = false);

// Splits a dense H (N, N) into T (its tridiagonal band) + U V^T (rank r):
// the band is removed, the rest truncated to rank r by an SVD (LAPACK
// dgesdd), then band and low-rank part are refined by alternating
// projections (L = svd_r(H - T), T = band(H - L)) until the relative error
// stops improving or max_iters. u = U_r S_r, v = V_r.
// rel_error = ||H - T - U V^T||_F / ||H||_F. Throws ad::Error if h is not
// square or rank is not in [0, N].
struct SemiseparableFactors {
  Tensor t_diag, t_upper, t_lower, u, v;  // f64
  double rel_error = 0;
  int iterations = 0;  // SVDs computed
};
SemiseparableFactors semiseparable_factorize(const Tensor& h, std::int64_t rank, int max_iters = 200,
                                             double tol = 1e-15);

// A multi-level (HODLR) form of a dense N x N matrix: H = [[H11, U1 V1^T],
// [U2 V2^T, H22]] recursively, the off-diagonal blocks truncated to rank r by
// SVD (LAPACK), blocks of at most `leaf` rows kept dense. Storage and matvec
// cost O(N r log N) (+ O(N leaf)). f64.
class Hodlr {
 public:
  static Hodlr build(const Tensor& h, std::int64_t rank, std::int64_t leaf = 64);
  // H x for x (N) or (N, D), f64; result of x's shape.
  Tensor matvec(const Tensor& x) const;
  std::int64_t size() const { return n_; }
  std::int64_t levels() const { return levels_; }
  std::int64_t stored_elements() const;  // numbers kept (dense leaves + factors)

 private:
  struct Block {
    std::int64_t lo = 0, hi = 0, mid = 0;  // rows [lo, hi); children split at mid
    int child[2] = {-1, -1};
    std::vector<double> dense;              // leaf: (hi-lo)^2
    std::vector<double> u12, v12, u21, v21; // H[lo:mid, mid:hi] ~ u12 v12^T etc. (column-major rank)
    std::int64_t k12 = 0, k21 = 0;          // ranks kept
  };
  int build_block(const std::vector<double>& h, std::int64_t lo, std::int64_t hi, int depth);
  void apply(int b, const double* x, double* y, std::int64_t D) const;
  std::vector<Block> blocks_;
  std::int64_t n_ = 0, rank_ = 0, leaf_ = 64, levels_ = 0;
};

// ---- layer ----

// A learned causal semiseparable token mixer, a drop-in replacement for
// causal self-attention over x (B, N, C):
//   h = x W_in;  m = causal semiseparable_matvec(h, t_diag, 0, t_lower, U, V);  y = m W_out
// with T (diagonal and sub-diagonal) and U, V (max_len, rank) learned per
// position and sliced to the first N rows (N <= max_len). U and V do not
// depend on the input; the input enters through W_in and the mixing is the
// same for every channel. uv_dtype bf16/f16 casts U and V for the product
// (mixed precision, CPU only; gradients reach the f32 parameters through the
// cast);
// f32 or f64 uses them in their own dtype (make() sets it to `dtype`).
struct SemiseparableMixer {
  Parameter t_diag, t_lower, u, v, w_in, w_out;
  std::int64_t max_len = 0, channels = 0, rank = 0;
  DType uv_dtype = DType::f32;
  // Init: t_diag = 1, t_lower ~ N(0, 0.1^2), u ~ N(0, 1/rank),
  // v ~ N(0, 1/max_len), w_in, w_out ~ N(0, 1/C). Throws ad::Error on
  // non-positive sizes.
  static SemiseparableMixer make(std::int64_t max_len, std::int64_t channels, std::int64_t rank, Rng& rng,
                                 DType dtype = DType::f32);
  // x (B, N, C) with N <= max_len -> (B, N, C). Throws ad::Error otherwise.
  Var operator()(const Var& x) const;
  std::vector<Parameter> parameters() const { return {t_diag, t_lower, u, v, w_in, w_out}; }
};

}  // namespace ad
