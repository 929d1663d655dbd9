#pragma once
// Per-element math of the random ops, as AD_HD code: the CPU kernels
// (src/ops/random.cpp) and the CUDA kernels (src/cuda/pointwise.cu) draw the
// same Philox numbers (ad/rng.hpp), so a mask is the same bits on every device.
#include <cstdint>

#include "ad/rng.hpp"

namespace ad::rnd {

// dropout: y_i = x_i m_i scale, m_i = [u_i > p], u_i = uniform(seed, offset + i)
template <class T> struct Dropout {
  std::uint64_t seed, offset;
  float p;
  T scale;  // 1 / (1 - p)
  AD_HD bool keep(std::int64_t i) const {
    return uniform01(philox_u32(seed, offset + static_cast<std::uint64_t>(i))) > p;
  }
  AD_HD T operator()(T x, std::int64_t i) const { return keep(i) ? x * scale : T(0); }
};

}  // namespace ad::rnd
