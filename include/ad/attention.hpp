#pragma once
// Multi-head scaled dot-product attention as one graph op with O(N d) memory:
// the forward pass tiles over keys with an online softmax and keeps only the
// output and one log-sum-exp per query row; the backward pass recomputes the
// probabilities tile by tile. Nothing of size Nq x Nk is ever allocated.
#include <optional>

#include "ad/graph.hpp"

namespace ad {

struct AttentionOptions {
  // Query i attends key j only if j <= i + (Nk - Nq): bottom-right aligned,
  // as in decoding with a cache (the last query sees every key). With
  // Nq == Nk this is the usual lower triangle; with Nq > Nk the first
  // Nq - Nk query rows see no key (their output is zero).
  bool causal = false;
  // Multiplies q k^T; default 1 / sqrt(d). Must be finite.
  std::optional<double> scale;
  // Optional i64 [B]: keys j >= key_lengths[b] of batch element b are masked
  // (padding) and never read: padding may hold anything, NaN included, in
  // the forward and the backward. (The causal mask alone gives no such
  // promise: as in a dense masked softmax, a NaN or inf in a key or value that
  // a query may not see can still reach it. Mark padding with key_lengths.)
  // Undefined Var = no padding. Values outside [0, Nk] throw
  // ad::Error when the op runs. Combined with `causal`, a query sees the keys
  // allowed by both masks.
  Var key_lengths;
};

// out[b,h,i,:] = sum_j softmax_j(scale q[b,h,i,:] . k[b,g(h),j,:] + mask) v[b,g(h),j,:]
//   q [B, H, Nq, d], k and v [B, Hkv, Nk, d] -> [B, H, Nq, d], all of one
//   dtype: f32, f64, bf16 or f16; the output has the inputs' dtype.
// Precision: f32 and f64 compute in their own type. bf16/f16 inputs are
// computed with f32 accumulation everywhere (scores, softmax statistics,
// output sums; the per-row log-sum-exp residual is stored in f32) and the
// output and the gradients are rounded to the input dtype once, at the end.
// On the CPU every intermediate is f32, the backward's D = dO . O included
// (it recomputes the output in f32 rather than widen the rounded one: where
// the softmax is peaked, D cancels against dP and the output's rounding gave
// dq and dk errors of 50-150 u). On CUDA the products run on tensor cores
// (wmma, sm_80+), so the probabilities P and the backward's dS are also
// rounded to the input dtype before their products with V, dO, Q, K, and D is
// formed from the rounded output (as in FlashAttention): expect larger
// gradient errors there when the softmax is peaked. Expect errors of a few
// unit roundoffs u of the input type (bf16 u = 2^-8, f16 u = 2^-11) relative
// to the largest value of each result — tested on the CPU at <= 4 u against
// f64, peaked rows included — not f32 accuracy.
// Every dtype: the backward recomputes the probabilities from one stored
// value per row, lse = m + log(sum exp(s - m)), so they carry an error of
// about |m| u where m is the row's largest score (scale q . k): with scores
// far past 1/u (1e7 in f32, 1e15 in f64) the gradients are meaningless even
// where the output is right (a review: two tied keys scored 3e10 in f32 gave
// dv twice dO). A known limit, as in FlashAttention; keep scores moderate.
// Grouped-query attention when Hkv < H: Hkv must divide H, and query head h
// uses key/value head g(h) = h / (H / Hkv).
// A query row whose keys are all masked (key_lengths[b] = 0, or causal with
// Nq > Nk) gets a zero output and zero gradients, never NaN.
// Any head size d >= 1 works on the CPU; tiles are sized for d in {32, 64,
// 128}. On CUDA, d <= 128 (d is zero-padded to 32, 64 or 128 inside the
// kernels, so those three waste nothing); larger d throws ad::Error naming the
// op and d when the graph is built.
// Throws ad::Error (naming the op and the shapes) when q, k, v are not rank
// 4, batch sizes or d differ, k and v differ, Hkv does not divide H, d is 0,
// dtypes differ or are not f32/f64/bf16/f16, key_lengths is not i64 [B], or scale is
// not finite.
Var attention(const Operand& q, const Operand& k, const Operand& v, const AttentionOptions& options = {});

}  // namespace ad
