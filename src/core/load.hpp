#pragma once
// Element i of an array of any dtype, as a double: the one reader shared by
// host code (Tensor's element access, the executor's range check) and CUDA
// kernels (the cast range count).
#include <cstdint>

#include "ad/dtype.hpp"
#include "ad/hd.hpp"

namespace ad::detail {

AD_HD double load_as_double(DType t, const void* p, std::int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f16: return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
  }
  return 0;
}

}  // namespace ad::detail
