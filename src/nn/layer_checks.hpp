#pragma once
// Constructor checks the nn layers share.
#include <cstdint>

#include <fmt/format.h>

#include "ad/dtype.hpp"
#include "ad/error.hpp"

namespace ad::nn::detail {

inline void check_positive(const char* layer, const char* what, std::int64_t v) {
  if (v <= 0) throw Error(fmt::format("{}: {} must be positive, got {}", layer, what, v));
}
inline void check_dtype(const char* layer, DType t) {
  if (!is_compute_float(t))
    throw Error(fmt::format("{}: parameter dtype must be f32 or f64, got {}", layer, dtype_name(t)));
}

}  // namespace ad::nn::detail
