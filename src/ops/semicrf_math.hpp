#pragma once
// Per-element math of the semi-Markov CRF, shared by the CPU kernels and the
// CUDA kernels (src/cuda/semicrf.cu) (AD_HD). exp_win is branch-free so the windowed loops over
// k vectorise.
//
// The model (docs/design.md, "Semi-Markov CRF"): a segment of label c over
// positions s..s+k-1 scores S[s+k,c] - S[s,c] + D[k-1,c], plus P[c] if it is
// the first segment, plus Tr[c',c] (or Tr[k-1,c',c]) after a segment of label c'.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ad/dtype.hpp"
#include "ad/hd.hpp"
#include "core/math.hpp"

namespace ad::semicrf {

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// e^x for the window sums, where x = value - max <= 0 up to rounding.
// f32: x clamped to [-88, 80]; everything below about -87.3 (and -inf, a
// forbidden term) gives exactly 0 (2^-127 is built as the zero bit pattern).
// x = n ln2 + r, |r| <= ln2/2, e^r by its degree-6 Taylor polynomial
// (relative error < 2e-7).
AD_HD float exp_win(float x) {
  x = math::select(x < -88.0f, -88.0f, x);
  x = math::select(x > 80.0f, 80.0f, x);
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  std::int32_t ni = static_cast<std::int32_t>(n);
  std::uint32_t b = static_cast<std::uint32_t>(ni + 127) << 23;  // n = -127: 0.0f
  float s;
  std::memcpy(&s, &b, 4);
  return p * s;
}
// f64: x clamped to [-708, 700], degree-12 Taylor polynomial on |r| <= ln2/2
// (truncation < 2e-16 relative); x < -708 (and -inf) gives exactly 0.
AD_HD double exp_win(double x) {
  bool zero = x < -708.0;
  x = math::select(zero, -708.0, x);
  x = math::select(x > 700.0, 700.0, x);
  double n = (x * 1.4426950408889634074 + 6755399441055744.0) - 6755399441055744.0;
  double r = x - n * 0.693147180369123816490;  // ln2 split: hi has 32 significant bits
  r = r - n * 1.90821492927058770002e-10;
  double p = 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  std::int64_t ni = static_cast<std::int64_t>(n);
  std::uint64_t b = static_cast<std::uint64_t>(ni + 1023) << 52;
  double s;
  std::memcpy(&s, &b, 8);
  return math::select(zero, 0.0, p * s);
}

// The score of one segment of label c over positions s..s+k-1, without the
// start / transition term: S[s+k,c] - S[s,c] + D[k-1,c]. S_c points at
// S[0,c] with row stride C; D_c at D[0,c] with row stride C.
template <class T>
AD_HD double segment_score(const T* S_c, const T* D_c, std::int64_t C, std::int64_t s, std::int64_t k) {
  return static_cast<double>(S_c[(s + k) * C]) - static_cast<double>(S_c[s * C]) +
         static_cast<double>(D_c[(k - 1) * C]);
}

// Streaming logsumexp in f64: add() values one at a time, value() at the end.
struct LseAcc {
  double m = kNegInf, s = 0;
  AD_HD void add(double x) {
    if (x == kNegInf) return;
    if (x > m) { s = s * std::exp(m - x) + 1.0; m = x; }
    else s += std::exp(x - m);
  }
  AD_HD double value() const { return m == kNegInf ? kNegInf : m + std::log(s); }
  // Adds another accumulator's terms. Commutative bit for bit (a.merge(b)
  // and b.merge(a) give the same m and s), so a butterfly over GPU lanes
  // leaves the same value in every lane.
  AD_HD void merge(const LseAcc& o) {
    if (o.m == kNegInf) return;
    if (m == kNegInf) { m = o.m; s = o.s; return; }
    if (o.m > m) { s = o.s + s * std::exp(m - o.m); m = o.m; }
    else s = s + o.s * std::exp(o.m - m);
  }
};

// Stored ring checkpoints of a sequence of length L with interval I
// (positions I, 2I, ... below the last interval; the last one is never stored).
AD_HD std::int64_t checkpoint_count(std::int64_t L, std::int64_t I) { return (L + 1 + I - 1) / I - 1; }

// The base of one lap of a ring (values stored relative to an f64 base per
// label and lap of Ke positions, so they hold local differences, not values
// growing like logZ). The base is the lap's first finite value (NaN until
// there is one: the values before it are -inf), and moves up to a later value
// more than kRebaseAbove above it while the lap's moves are cheap (`cheap`:
// the caller's budget), else more than max(kRebaseAbove, kRebasePerSlot n)
// above it, where n is the number of the lap's values already stored.
// Without the move a lap starting at a huge finite "mask" (-1e9 in D or P: α
// is near -1e9 there) stored the next values as +1e9 relative to it, and an
// f32 slot kept none of their digits (marginals outside [0, 1]); with it the
// stored values stay small, which also makes the f32 rings more accurate.
// Moving costs O(n) (the stored values shift); past the budget the bound
// growing with n keeps that to O(rise / kRebasePerSlot) per lap where values
// rise steadily (a move at every position made such rings 60 times slower).
// Returns the shift the stored values must take (they become value − shift),
// 0 for none.
inline constexpr double kRebaseAbove = 1024.0, kRebasePerSlot = 64.0;
AD_HD double lap_base(double& bs, bool lap_start, double x, std::int64_t n, bool cheap) {
  const bool fin = x - x == 0.0;  // finite
  if (lap_start) {
    bs = fin ? x : std::numeric_limits<double>::quiet_NaN();
    return 0.0;
  }
  if (!fin) return 0.0;
  if (bs != bs) {
    bs = x;
    return 0.0;
  }
  const double above = cheap ? 0.0 : kRebasePerSlot * static_cast<double>(n);
  if (!(x - bs > (above > kRebaseAbove ? above : kRebaseAbove))) return 0.0;
  const double shift = x - bs;
  bs = x;
  return shift;
}
// Slot i of a ring column of ke slots (the CPU's and the GPU's): its value
// rounded to E (hi), and for f32 the rounding error in bf16 (lo) after the ke
// hi parts (ring_column in semicrf_cpu.hpp). lo is 0 where hi is not finite
// (below -FLT_MAX, as two stacked f32 masks make, hi is -inf). ring_put
// returns hi; ring_get gives hi + lo in f64.
template <class E> AD_HD E ring_put(E* col, std::int64_t ke, std::int64_t i, double x) {
  const E h = static_cast<E>(x);
  col[i] = h;
  if constexpr (sizeof(E) == 4) {
    const double hd = static_cast<double>(h);
    reinterpret_cast<std::uint16_t*>(col + ke)[i] =
        hd - hd == 0.0 ? f32_to_bf16(static_cast<float>(x - hd)) : std::uint16_t(0);
  }
  return h;
}
template <class E> AD_HD double ring_get(const E* col, std::int64_t ke, std::int64_t i) {
  double v = static_cast<double>(col[i]);
  if constexpr (sizeof(E) == 4) v += static_cast<double>(bf16_to_f32(reinterpret_cast<const std::uint16_t*>(col + ke)[i]));
  return v;
}

// A ring value relative to its lap's base, and back (-inf stays -inf, also
// against a NaN base).
AD_HD double to_lap(double x, double bs) { return x - x == 0.0 ? x - bs : x; }
AD_HD double from_lap(double stored, double bs) { return stored == kNegInf ? kNegInf : stored + bs; }

// e^x, and exactly 0 for x = -inf (a forbidden term).
AD_HD double exp_or_zero(double x) { return x == kNegInf ? 0.0 : std::exp(x); }

// Calls f(start, length, label, previous label or -1) for each segment of one
// sequence: r is its row of the segments encoding (label at each segment
// start, -1 elsewhere), L its length (already validated).
template <class F> AD_HD void for_each_segment(const std::int64_t* r, std::int64_t L, F&& f) {
  std::int64_t start = 0, prev = -1;
  for (std::int64_t t = 1; t <= L; ++t) {
    if (t < L && r[t] < 0) continue;
    f(start, t - start, r[start], prev);
    prev = r[start];
    start = t;
  }
}

}  // namespace ad::semicrf
