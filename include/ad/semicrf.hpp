#pragma once
// Semi-Markov CRF layer: log-partition, gold-segmentation score, Viterbi
// decoding and posterior marginals over segmentations of long sequences.
//
// The model (docs/design.md, "Semi-Markov CRF"). For a batch of B sequences:
//   S  (B, T+1, C)  cumulative label scores, S[:, 0, :] = 0 (semicrf_cumulative)
//   Tr (C, C)       transitions c' -> c, or (K, C, C): one matrix per duration
//   D  (K, C)       duration bias; K is the maximum segment length, K >= 1
//   P  (C)          start scores
//   L  (B) i64      lengths, 1 <= L[b] <= T
// A segment of label c over positions s..s+k-1 (1 <= k <= K) scores
//   S[s+k,c] - S[s,c] + D[k-1,c] + (first segment ? P[c] : Tr[c',c] or Tr[k-1,c',c])
// where c' is the previous segment's label. A segmentation of 0..L[b]-1 scores
// the sum over its segments; logZ[b] = log sum over all segmentations of exp(score).
// -inf in Tr, D or P means "forbidden": a sequence with no allowed
// segmentation has logZ = -inf, zero gradients and zero marginals (never
// NaN). Position scores (semicrf_cumulative's input) must be finite.
//
// Segments encoding (gold segmentations, Viterbi output): i64 (B, T) with
// segments[b, t] = c where a segment of label c starts at t, and -1 at every
// other position (inside a segment, and at t >= L[b]). A segment runs to the
// next start or to L[b].
//
// Shape and dtype errors throw ad::Error when the graph is built; invalid
// lengths or segments (known only from the data) throw when the op runs.
//
// Precision (docs/design.md "Precision"): all sums over labels and positions
// are f64. In f32 the CPU fast path (Tr (C, C)) keeps each α/β ring value as
// an f32 plus its rounding error in bf16, so the marginals and the gradients
// w.r.t. the scores (running sums over the whole sequence) stay within 1e-5
// of f64 at T = 400,000, K = 3,000 (7.3e-6, bench_semicrf --marginals) for
// scores of scale 1. The rest error is relative to the ring values' size (K times
// the per-position growth, which grows with the scores' scale): with scores
// of scale 1e2 the f32 marginals drift by 3.7e-3 at T = 100,000, K = 52, and
// by 0.28 at scale 1e4 (values outside [0, 1]): take f64 there. The CUDA
// kernels keep the same hi + lo rings (since 2026-11-27; before, plain f32
// rings' errors added up to about 8e-2 at K = 3,000): on an H200 the GPU's
// f32 marginals and score gradients were within 5e-5 of the CPU's f64 at
// T = 20,000, K = 1,000 (tests/cuda.cpp).
// f64 has the same kind of limit far out: logZ's gradients come from
// exp(alpha + beta - logZ), each term of the size of the cumulative scores,
// so their error is about (cumulative score) u: with position scores near
// 1e15 (1e20 with Tr (C, C)) two tied segmentations no longer split 0.5 /
// 0.5 (a review's case). Keep scores well under 1/u of the dtype.
// A huge finite "mask" (-1e9, -FLT_MAX, also stacked) in Tr, D or P gives
// what -inf gives for a sequence that keeps an unmasked segmentation
// (tested: marginals and gradients within 5e-5 in f32, 1e-9 in f64; a ring
// lap's base moves up past such a value, semicrf::lap_base). A sequence
// whose every segmentation is masked gets a logZ near the mask, not -inf,
// and marginals only as good as the dtype at that size: forbid with -inf
// where that can happen. Huge positive scores do not work: a score near 1/u
// of the dtype (+1e12 in f32) gives marginals outside [0, 1] or infinite;
// keep scores well under 1/u.
// A NaN or infinite S (for t <= L[b]), or a NaN or +inf in Tr, D or P,
// throws ad::Error when the op runs, naming the element (on a GPU S is
// checked on the device, Tr, D and P from host copies).
#include "ad/graph.hpp"

namespace ad {

// scores (B, T, C) f32/f64 -> S (B, T+1, C): S[b,0,:] = 0,
// S[b,t+1,c] = S[b,t,c] + scores[b,t,c] - m_b, summed in f64, where m_b is the
// mean of scores[b] over t and c. The shift by one constant per sequence
// keeps the sums small and changes every segmentation of b by the same
// -L[b]·m_b: logZ and score shift alike; NLL = logZ - score, marginals and
// Viterbi do not change. Differentiable. A non-finite score throws ad::Error
// (at run time) naming b, t and c: prefix sums cannot hold -inf.
Var semicrf_cumulative(const Operand& scores);
// The same for a padded batch, with the lengths L (B) i64 (1 <= L[b] <= T)
// the other ops take: m_b is the mean over t < L[b] only, and the padding
// t >= L[b] is not read (S[b, t+1] = S[b, L[b]] there; any value, NaN
// included; its gradient is 0). Use it whenever sequences are padded: the
// padding's scores would otherwise move m_b away from the real scores' mean
// and make the sums drift, which costs f32 its accuracy: at T = 2,000,
// L = 1,000, K = 20, C = 4 the f32 marginals were off f64's by 1.1e-3 with
// padding scores of -100 and by 0.16 with -1e4 without the lengths, 1.1e-6
// with them; at L = 10,000, K = 100, C = 8 by 0.86 and 3.7e-6
// (bench_semicrf --padded, docs/benchmarks.md; tests/semicrf.cpp holds 2e-5).
Var semicrf_cumulative(const Operand& scores, const Operand& L);

// logZ (B) (dtype of S). Differentiable w.r.t. S, Tr, D and P (one backward
// pass produces all four gradients). The backward pass's checkpoints, interval
// buffer and β ring take at most 2·√(T·K)·C + K·C values per sequence in
// flight, K standing for min(K, T) (plus less than C from rounding the
// interval to whole positions: 0.54·C at most over T <= 20,000, K <= 400; an
// f32 ring value takes 6 bytes, hi + a bf16 lo: see Precision); besides them
// it holds parameter-sized buffers (D transposed, dD partial sums) and O(C)
// per checkpoint and interval row. All of it is the op's workspace, counted
// by the graph's allocator; see docs/design.md.
Var semicrf_logz(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P, const Operand& L);

// Score (B) of the segmentations `segments` (i64 (B, T), encoding above),
// with the conventions of semicrf_logz, so logZ - score >= 0.
// Differentiable w.r.t. S, Tr, D and P. Throws (at run time) for segments
// with a gap at position 0, a label outside 0..C-1, a segment longer than K,
// or a segment starting at or beyond L[b].
Var semicrf_score(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P, const Operand& L,
                  const Operand& segments);

// Best segmentation, i64 (B, T) in the segments encoding (max semiring, ties
// to the shortest segment, then the lowest label). Not differentiable.
// Throws (at run time) if a sequence has no allowed segmentation.
Var semicrf_viterbi(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P, const Operand& L);

// The best segmentation and its score (semicrf_score of it: differentiable,
// e.g. for a structured perceptron or a max-margin loss).
struct SemicrfDecode {
  Var segments;  // i64 (B, T)
  Var score;     // (B)
};
SemicrfDecode semicrf_decode(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P,
                             const Operand& L);

// Posterior marginals (B, T, C): the probability that position t lies in a
// segment of label c (0 for t >= L[b], and for a sequence with logZ = -inf).
// Not differentiable (differentiate semicrf_logz instead).
Var semicrf_marginals(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P, const Operand& L);

}  // namespace ad
