#pragma once
// fmt formatting: fmt::format("{}", tensor) prints dtype, shape and values
// (elided past 6 per dim: the first and last 3); Shape, DType, Var, Report.
#include <fmt/format.h>

#include <string>

#include "ad/graph.hpp"
#include "ad/schedule.hpp"

namespace ad {
std::string to_string(const Tensor& t);
std::string to_string(const Report& r);
}  // namespace ad

template <> struct fmt::formatter<ad::Shape> : fmt::formatter<std::string> {
  auto format(const ad::Shape& s, format_context& ctx) const { return fmt::formatter<std::string>::format(s.str(), ctx); }
};
template <> struct fmt::formatter<ad::DType> : fmt::formatter<std::string> {
  auto format(ad::DType t, format_context& ctx) const { return fmt::formatter<std::string>::format(ad::dtype_name(t), ctx); }
};
template <> struct fmt::formatter<ad::Tensor> : fmt::formatter<std::string> {
  auto format(const ad::Tensor& t, format_context& ctx) const { return fmt::formatter<std::string>::format(ad::to_string(t), ctx); }
};
template <> struct fmt::formatter<ad::Var> : fmt::formatter<std::string> {
  auto format(const ad::Var& v, format_context& ctx) const { return fmt::formatter<std::string>::format(v.str(), ctx); }
};
template <> struct fmt::formatter<ad::Report> : fmt::formatter<std::string> {
  auto format(const ad::Report& r, format_context& ctx) const { return fmt::formatter<std::string>::format(ad::to_string(r), ctx); }
};
