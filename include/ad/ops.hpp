#pragma once
// The ops of ad. Each builds a node in the graph of its arguments, infers its
// shape and dtype, and throws ad::Error (naming the op and the shapes) when the
// arguments do not fit. Nothing is computed until eval()/backward().
// Float ops take f32 or f64 (all float arguments of one op share a dtype).
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "ad/graph.hpp"

namespace ad {

// ---- elementwise binary, numpy broadcasting: [2,1,4] op [3,1] -> [2,3,4] ----
Var add(const Operand& a, const Operand& b);
Var sub(const Operand& a, const Operand& b);
Var mul(const Operand& a, const Operand& b);
Var div(const Operand& a, const Operand& b);
// a^b elementwise; d/da = b a^(b-1), 0 where b = 0 (a = 0 included); d/db
// uses log(a), defined for a > 0.
Var pow(const Operand& a, const Operand& b);
// Elementwise larger / smaller (broadcasting). The gradient goes to the
// chosen operand, half to each on a tie; NaN in either gives NaN (and NaN
// gradients), as numpy's maximum.
Var maximum(const Operand& a, const Operand& b);
Var minimum(const Operand& a, const Operand& b);
// Elementwise comparisons (broadcasting, as maximum): 1 where a > b (>=, <,
// <=, ==, !=) holds, else 0, in the operands' dtype (f32 or f64, the same
// for both). IEEE: a NaN compares false, except for not_equal (true); -0 ==
// 0. The gradient is zero (they are piecewise constant): grad() gives zeros,
// and backward() gives no gradient to a Parameter the loss reads only
// through comparisons (an error if the loss reads none otherwise), as for
// detach. Throws ad::Error naming the op and both shapes when they do not
// broadcast or the dtypes differ.
Var greater(const Operand& a, const Operand& b);
Var greater_equal(const Operand& a, const Operand& b);
Var less(const Operand& a, const Operand& b);
Var less_equal(const Operand& a, const Operand& b);
Var equal(const Operand& a, const Operand& b);
Var not_equal(const Operand& a, const Operand& b);
// The same against a number (a rank-0 constant of a's dtype): greater(x, 0.0).
// a must be a Var (a Parameter alone knows no graph).
Var greater(const Operand& a, double b);
Var greater_equal(const Operand& a, double b);
Var less(const Operand& a, double b);
Var less_equal(const Operand& a, double b);
Var equal(const Operand& a, double b);
Var not_equal(const Operand& a, double b);
// Elementwise select: a where cond is nonzero (NaN included, as numpy's
// bool(nan)), else b. cond, a and b broadcast together (numpy rules: [3,1],
// [2,3,4], [4] -> [2,3,4]) and share one float dtype (cond is typically a
// comparison's 1/0 output). The operand not taken never reaches the output:
// a NaN or inf there is not seen. Gradients: a gets where(cond, dout, 0), b
// where(cond, 0, dout) (each summed to its shape), cond none (a Parameter
// read only as cond gets no gradient from backward, as for comparisons).
// Note that a branch op's own gradient is still formed where it is not
// taken: where(x > 0, log(x), 0) has a NaN gradient at x = 0 (0 / 0 in
// log's backward); select the input too, log(where(x > 0, x, 1)).
// The scalar forms put `a` or `b` in as a rank-0 constant of the other
// operand's dtype: where(cond, x, 0.0). Throws ad::Error naming where and
// the three shapes when they do not broadcast, and for dtypes that differ
// or are not f32/f64.
Var where(const Operand& cond, const Operand& a, const Operand& b);
Var where(const Operand& cond, const Operand& a, double b);
Var where(const Operand& cond, double a, const Operand& b);

// ---- elementwise with a scalar ----
Var add_scalar(const Operand& x, double s);   // x + s
Var mul_scalar(const Operand& x, double s);   // x * s
Var div_scalar(const Operand& x, double s);   // x / s (a division, not x * (1/s))
Var rsub_scalar(const Operand& x, double s);  // s - x
Var rdiv_scalar(const Operand& x, double s);  // s / x
Var pow_scalar(const Operand& x, double p);   // x^p

// ---- elementwise unary ----
Var neg(const Operand& x);
Var exp(const Operand& x);
Var log(const Operand& x);
Var sqrt(const Operand& x);
Var abs(const Operand& x);      // d/dx = sign(x), 0 at 0
Var sign(const Operand& x);     // -1, 0, 1 (NaN for NaN); gradient 0
Var tanh(const Operand& x);
Var sigmoid(const Operand& x);
Var relu(const Operand& x);     // NaN stays NaN; d/dx = 1 for x > 0, else 0
Var gelu(const Operand& x);     // exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
Var silu(const Operand& x);     // x * sigmoid(x)
Var sin(const Operand& x);
Var cos(const Operand& x);
// min(max(x, lo), hi); lo = -inf or hi = inf for one bound. d/dx = 1 where
// lo <= x <= hi (the bounds included), else 0; NaN stays NaN. lo > hi or a
// NaN bound is an ad::Error.
Var clamp(const Operand& x, double lo, double hi);
// Converts between f32, f64, f16 and bf16 (f16/bf16 are storage only);
// the gradient is cast back to the input's dtype.
Var cast(const Operand& x, DType dtype);

// ---- matrix products ----
// [..., M, K] x [..., K, N] -> [..., M, N] (trans_a / trans_b transpose the
// last two dims of a / b first), numpy's matmul rules: the batch dims (all but
// the last two) broadcast, aligned from the right ([B,T,C] x [C,O] ->
// [B,T,O]; [B,1,M,K] x [H,K,N] -> [B,H,M,N]); a rank-1 a is a row [1,K] and a
// rank-1 b a column [K,1], whose dim the output drops ([B,M,K] x [K] -> [B,M],
// [K] x [K] -> []); the trans flag of a rank-1 operand is ignored. Gradients
// of a broadcast operand are summed over the batch it was broadcast to.
// OpenBLAS sgemm/dgemm on the CPU, cuBLAS on CUDA.
Var matmul(const Operand& a, const Operand& b, bool trans_a = false, bool trans_b = false);

// ---- shape ----
// New shape with the same number of elements; one dim may be -1. A view:
// shares the input's memory.
Var reshape(const Operand& x, const Shape& shape);
// x itself (a view: no copy), but a constant to differentiation: no gradient
// flows through it to x (a stop-gradient: targets, straight-through
// estimators, a frozen branch). x may be of any dtype.
Var detach(const Operand& x);
// Reorders dims: out.shape[i] = x.shape[perm[i]].
Var permute(const Operand& x, const Shape& perm);
// Swaps two dims.
Var transpose(const Operand& x, int dim0 = -2, int dim1 = -1);
// Numpy broadcasting of x to `shape`.
Var broadcast_to(const Operand& x, const Shape& shape);
// Sums x down to `shape` (the inverse of broadcast_to: leading dims summed
// away, dims where shape has 1 summed with keepdim).
Var sum_to(const Operand& x, const Shape& shape);
// x[..., start:stop, ...] along `axis`. Negative start/stop/axis count from
// the end, as in Python, and stop is clamped to the dim; unlike Python, a
// start outside the dim (after counting from the end) or a stop before start
// is an ad::Error, not an empty or clamped slice.
Var slice(const Operand& x, int axis, std::int64_t start, std::int64_t stop);
// numel(shape) elements of x in flat order starting at element `offset`, as
// a view (no copy). Ops with several outputs return one buffer and hand out
// its parts this way.
Var part(const Operand& x, std::int64_t offset, const Shape& shape);
// Joins tensors along `axis`; all other dims must agree.
Var concat(const std::vector<Var>& xs, int axis = 0);
// Rows of x along `axis` picked by integer `index` (i64, any shape):
// out.shape = x.shape[:axis] + index.shape + x.shape[axis+1:]. Out-of-range
// indices throw at run time.
Var gather(const Operand& x, const Operand& index, int axis = 0);
// Embedding lookup: table [V, D], ids i64 [...] -> [..., D].
Var embedding(const Operand& table, const Operand& ids);

// ---- reductions ----
// Over `axes` (empty = all axes); keepdim keeps reduced dims as 1.
Var sum(const Operand& x, const Shape& axes = {}, bool keepdim = false);
// mean: throws ad::Error if a reduced axis is empty (no value; sum gives 0).
Var mean(const Operand& x, const Shape& axes = {}, bool keepdim = false);
// Maximum; the gradient flows to the first maximal element. Throws ad::Error
// if a reduced axis is empty.
Var max(const Operand& x, const Shape& axes = {}, bool keepdim = false);
// log sum exp over `axis`, stable for large |x|. A row of all -inf gives
// -inf, with gradient 0; a row with a NaN gives NaN (softmax and log_softmax
// too).
Var logsumexp(const Operand& x, int axis = -1, bool keepdim = false);
// exp(x - logsumexp(x)) over `axis`. A row of all -inf gives all 0 (and
// gradient 0), never NaN.
Var softmax(const Operand& x, int axis = -1);
// x - logsumexp(x) over `axis`. A row of all -inf gives all -inf, gradient 0.
Var log_softmax(const Operand& x, int axis = -1);

// ---- normalisation, over the last dim D ----
// (x - mean) / sqrt(var + eps) * gamma + beta; gamma, beta [D].
Var layer_norm(const Operand& x, const Operand& gamma, const Operand& beta, double eps = 1e-5);
// x / sqrt(mean(x^2) + eps) * gamma; gamma [D].
Var rms_norm(const Operand& x, const Operand& gamma, double eps = 1e-6);
// Group normalisation (Wu & He): x [N, C, ...] split into `groups` groups of
// C / groups channels; each (image, group) is normalised over its channels
// and positions together, then y = xhat * gamma[c] + beta[c]; gamma, beta
// [C]. groups = 1 normalises each image over everything (LayerNorm over
// C, H, W); groups = C each channel alone (InstanceNorm). No batch
// statistics, so it behaves the same at any batch size, one included.
// A composition: layer_norm over x viewed as [N, G, C/G * H * W] (a fused op
// whose backward recomputes the statistics), then the affine.
// Throws ad::Error naming group_norm and the shapes when x has rank < 2,
// groups does not divide C, or gamma / beta are not [C].
Var group_norm(const Operand& x, std::int64_t groups, const Operand& gamma, const Operand& beta, double eps = 1e-5);

// ---- losses ----
enum class Reduction : std::uint8_t { mean, sum };
// logits [..., C] (float), labels [...] (i64 in [0, C); logits' shape without
// the class dim) -> scalar: -log softmax(logits)[i, label_i] over every
// position i, averaged (mean) or summed: [B, T, C] with [B, T] is the same as
// the flattened [B*T, C] with [B*T].
// Labels out of range throw at run time.
Var cross_entropy(const Operand& logits, const Operand& labels, Reduction reduction = Reduction::mean);
// (a - b)^2 averaged (mean) or summed over all elements -> scalar.
Var mse(const Operand& a, const Operand& b, Reduction reduction = Reduction::mean);

// ---- random ----
// Zeroes each element with probability p and scales the rest by 1/(1-p).
// The mask is a pure function of (seed, offset, element index) (Philox), so
// recomputing the node gives the same mask, bit for bit. The Rng overload
// reserves x.numel() counters from rng.
Var dropout(const Operand& x, double p, Rng& rng);
Var dropout(const Operand& x, double p, std::uint64_t seed, std::uint64_t offset);

// ---- constants ----
// A tensor of `shape` filled with `value`, in the graph of `like` and on its
// device. Throws ad::Error for an i64 `value` that is not an integer it holds.
Var full(const Var& like, const Shape& shape, double value, DType dtype);
Var zeros_like(const Var& x);
Var ones_like(const Var& x);

// ---- operators ----
inline Var operator+(const Var& a, const Var& b) { return add(a, b); }
inline Var operator-(const Var& a, const Var& b) { return sub(a, b); }
inline Var operator*(const Var& a, const Var& b) { return mul(a, b); }
inline Var operator/(const Var& a, const Var& b) { return div(a, b); }
inline Var operator-(const Var& a) { return neg(a); }
inline Var operator+(const Var& a, double s) { return add_scalar(a, s); }
inline Var operator+(double s, const Var& a) { return add_scalar(a, s); }
inline Var operator-(const Var& a, double s) { return add_scalar(a, -s); }
inline Var operator-(double s, const Var& a) { return rsub_scalar(a, s); }
inline Var operator*(const Var& a, double s) { return mul_scalar(a, s); }
inline Var operator*(double s, const Var& a) { return mul_scalar(a, s); }
inline Var operator/(const Var& a, double s) { return div_scalar(a, s); }
inline Var operator/(double s, const Var& a) { return rdiv_scalar(a, s); }
// A Var with a Parameter, either side (the Parameter joins the Var's graph):
// h + bias, w * x.
inline Var operator+(const Var& a, const Parameter& b) { return add(a, b); }
inline Var operator+(const Parameter& a, const Var& b) { return add(a, b); }
inline Var operator-(const Var& a, const Parameter& b) { return sub(a, b); }
inline Var operator-(const Parameter& a, const Var& b) { return sub(a, b); }
inline Var operator*(const Var& a, const Parameter& b) { return mul(a, b); }
inline Var operator*(const Parameter& a, const Var& b) { return mul(a, b); }
inline Var operator/(const Var& a, const Parameter& b) { return div(a, b); }
inline Var operator/(const Parameter& a, const Var& b) { return div(a, b); }
// x > y etc. are the comparisons (1 or 0 in x's dtype); == and != are not
// overloaded (use equal / not_equal).
inline Var operator>(const Var& a, const Var& b) { return greater(a, b); }
inline Var operator>=(const Var& a, const Var& b) { return greater_equal(a, b); }
inline Var operator<(const Var& a, const Var& b) { return less(a, b); }
inline Var operator<=(const Var& a, const Var& b) { return less_equal(a, b); }
inline Var operator>(const Var& a, double s) { return greater(a, s); }
inline Var operator>=(const Var& a, double s) { return greater_equal(a, s); }
inline Var operator<(const Var& a, double s) { return less(a, s); }
inline Var operator<=(const Var& a, double s) { return less_equal(a, s); }
inline Var operator>(double s, const Var& a) { return less(a, s); }
inline Var operator>=(double s, const Var& a) { return less_equal(a, s); }
inline Var operator<(double s, const Var& a) { return greater(a, s); }
inline Var operator<=(double s, const Var& a) { return greater_equal(a, s); }

}  // namespace ad
