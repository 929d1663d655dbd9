#pragma once
// Per-element math of attention, shared by the CPU kernels and (later) the
// CUDA kernels (AD_HD). The masks, the online-softmax update and the
// backward's dS are defined here once.
#include <cmath>
#include <cstdint>
#include <limits>

#include "ad/hd.hpp"
#include "core/math.hpp"

namespace ad::attn {

// The keys query row i may attend form a prefix: j in [0, key_end(i)).
//   len:    keys of this batch element (key_lengths[b], or nk without padding)
//   causal: query i attends keys j <= i + (nk - nq) — bottom-right aligned, as
//           in decoding: the last query sees every key; with nq > nk the first
//           nq - nk rows see none.
// key_end is nondecreasing in i. A row with key_end <= 0 is fully masked.
AD_HD std::int64_t key_end(std::int64_t i, std::int64_t nq, std::int64_t nk, std::int64_t len, bool causal) {
  std::int64_t e = len;
  if (causal) {
    std::int64_t c = i + (nk - nq) + 1;
    e = c < e ? c : e;
  }
  return e < 0 ? 0 : e;
}

// Keys of row i inside the tile [j0, j0 + cb): the first n are visible.
AD_HD std::int64_t visible_in_tile(std::int64_t end, std::int64_t j0, std::int64_t cb) {
  std::int64_t n = end - j0;
  return n < 0 ? 0 : (n > cb ? cb : n);
}

// Online softmax of one row: state (m, l) = (running max, running sum of
// e^{s - m}). Absorbing a tile whose visible scores have maximum mx moves the
// max to m' = max(m, mx); the old sum and output are scaled by
// e^{m - m'} (0 when m = -inf, i.e. nothing seen yet).
template <class T> AD_HD T online_max(T m, T mx) { return mx > m ? mx : m; }
template <class T> AD_HD T online_rescale(T m_old, T m_new) { return math::exp_(m_old - m_new); }

// logsumexp of a finished row: m + log l; -inf for a row that saw no key.
template <class T> AD_HD T finish_lse(T m, T l) {
  return l > T(0) ? m + static_cast<T>(std::log(l)) : -std::numeric_limits<T>::infinity();
}
// 1 / l for the output; 0 for a row that saw no key (its output is zero).
template <class T> AD_HD T finish_inv(T l) { return l > T(0) ? T(1) / l : T(0); }

// Backward: P = e^{s - lse} (recomputed), D = rowsum(dO o O) - dlse,
// dS = P (dP - D) with dP = dO V^T.
template <class T> AD_HD T prob(T s, T lse) { return math::exp_(s - lse); }
template <class T> AD_HD T dscore(T p, T dp, T d) { return p * (dp - d); }

}  // namespace ad::attn
