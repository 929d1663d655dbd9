#pragma once
#include <stdexcept>
#include <string>

namespace ad {

// Every misuse of the library (bad shapes, dtypes, axes, missing values, ...)
// is reported by throwing ad::Error. The message names the op and the shapes
// involved, e.g. "matmul: inner dims differ: a f32[32,64] vs b f32[65,10]".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ad
