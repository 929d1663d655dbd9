#pragma once
// Per-element math of the elementwise ops, as AD_HD functors: the CPU
// kernels (src/ops/unary.cpp, binary.cpp) and the CUDA kernels
// (src/cuda/pointwise.cu) apply the same functor, so the CPU tests exercise
// the code the GPU runs. No fmt or other host-only headers here: nvcc
// compiles it.
#include <cmath>

#include "core/math.hpp"

namespace ad::pw {

#define AD_PW_UNARY(Name, expr)                              \
  struct Name {                                              \
    template <class T> AD_HD T operator()(T x) const { return expr; } \
  };
#define AD_PW_BINARY(Name, expr)                                  \
  struct Name {                                                   \
    template <class T> AD_HD T operator()(T a, T b) const { return expr; } \
  };
#define AD_PW_TERNARY(Name, expr)                                      \
  struct Name {                                                        \
    template <class T> AD_HD T operator()(T c, T a, T b) const { return expr; } \
  };
#define AD_PW_SCALAR(Name, expr)                                  \
  struct Name {                                                   \
    double s;                                                     \
    template <class T> AD_HD T operator()(T x) const { return expr; } \
  };

// ---- unary ----
AD_PW_UNARY(Neg, -x)
AD_PW_UNARY(Exp, math::exp_(x))
AD_PW_UNARY(Log, std::log(x))
AD_PW_UNARY(Sqrt, std::sqrt(x))
AD_PW_UNARY(Abs, std::fabs(x))
AD_PW_UNARY(Sign, x > T(0) ? T(1) : (x < T(0) ? T(-1) : (x == T(0) ? T(0) : x)))  // NaN -> NaN
AD_PW_UNARY(Tanh, math::tanh_(x))
AD_PW_UNARY(Sigmoid, math::sigmoid_(x))
AD_PW_UNARY(Relu, x > T(0) ? x : (x == x ? T(0) : x))  // NaN -> NaN
AD_PW_UNARY(Gelu, math::gelu(x))
AD_PW_UNARY(Silu, math::silu(x))
AD_PW_UNARY(Sin, std::sin(x))
AD_PW_UNARY(Cos, std::cos(x))
// ---- with a scalar ----
AD_PW_SCALAR(AddScalar, x + static_cast<T>(s))
AD_PW_SCALAR(MulScalar, x * static_cast<T>(s))
AD_PW_SCALAR(DivScalar, x / static_cast<T>(s))
AD_PW_SCALAR(RsubScalar, static_cast<T>(s) - x)
AD_PW_SCALAR(RdivScalar, static_cast<T>(s) / x)
AD_PW_SCALAR(PowScalar, s == 2.0 ? x * x : (s == 1.0 ? x : static_cast<T>(std::pow(x, static_cast<T>(s)))))
// ---- fused activation backward: (saved, dy) -> dx ----
AD_PW_BINARY(TanhBackward, b * (T(1) - a * a))        // a = y
AD_PW_BINARY(SigmoidBackward, b * a * (T(1) - a))     // a = y
AD_PW_BINARY(ReluBackward, a > T(0) ? b : T(0))       // a = y
AD_PW_BINARY(GeluBackward, b * math::gelu_grad(a))    // a = x
AD_PW_BINARY(SiluBackward, b * math::silu_grad(a))    // a = x
// ---- binary (broadcasting) ----
AD_PW_BINARY(Add, a + b)
AD_PW_BINARY(Sub, a - b)
AD_PW_BINARY(Mul, a * b)
AD_PW_BINARY(Div, a / b)
AD_PW_BINARY(Pow, std::pow(a, b))
AD_PW_BINARY(First, ((void)b, a))  // broadcast_to: a copy of a, broadcast
// NaN in either operand gives NaN (a + b is NaN then), as numpy's maximum
AD_PW_BINARY(Maximum, (a != a || b != b) ? a + b : (a > b ? a : b))
AD_PW_BINARY(Minimum, (a != a || b != b) ? a + b : (a < b ? a : b))
// the share of maximum(a, b)'s gradient that goes to a: 1, 1/2 on a tie, 0
AD_PW_BINARY(MaximumBackward, (a != a || b != b) ? a + b : (a > b ? T(1) : (a == b ? T(0.5) : T(0))))
// ---- comparisons: 1 or 0 in the operands' dtype; IEEE: a NaN compares
//      false, except not_equal (true); -0 == 0 ----
AD_PW_BINARY(Greater, a > b ? T(1) : T(0))
AD_PW_BINARY(GreaterEqual, a >= b ? T(1) : T(0))
AD_PW_BINARY(Less, a < b ? T(1) : T(0))
AD_PW_BINARY(LessEqual, a <= b ? T(1) : T(0))
AD_PW_BINARY(Equal, a == b ? T(1) : T(0))
AD_PW_BINARY(NotEqual, a != b ? T(1) : T(0))
// ---- select: a where c is nonzero (NaN included, as numpy's bool(nan)),
//      else b; a select, not a blend, so the other operand's NaN or inf
//      never reaches the result ----
AD_PW_TERNARY(Where, c != T(0) ? a : b)
// ---- clamp to [lo, hi] (NaN stays NaN), and its backward (saved x, dy) ----
struct Clamp {
  double lo, hi;
  template <class T> AD_HD T operator()(T x) const {
    return x < static_cast<T>(lo) ? static_cast<T>(lo) : (x > static_cast<T>(hi) ? static_cast<T>(hi) : x);
  }
};
struct ClampBackward {  // dy where lo <= x <= hi (the bounds included), else 0; NaN for a NaN x
  double lo, hi;
  template <class T> AD_HD T operator()(T x, T dy) const {
    return x != x ? x : (x >= static_cast<T>(lo) && x <= static_cast<T>(hi) ? dy : T(0));
  }
};

#undef AD_PW_UNARY
#undef AD_PW_BINARY
#undef AD_PW_TERNARY
#undef AD_PW_SCALAR

// The functors the CUDA backend instantiates (X-macro lists).
#define AD_PW_UNARY_LIST(X) X(Neg) X(Exp) X(Log) X(Sqrt) X(Abs) X(Sign) X(Tanh) X(Sigmoid) X(Relu) X(Gelu) X(Silu) \
  X(Sin) X(Cos) X(AddScalar) X(MulScalar) X(DivScalar) X(RsubScalar) X(RdivScalar) X(PowScalar) X(Clamp)
#define AD_PW_BINARY_LIST(X) X(TanhBackward) X(SigmoidBackward) X(ReluBackward) X(GeluBackward) X(SiluBackward) \
  X(Add) X(Sub) X(Mul) X(Div) X(Pow) X(First) X(Maximum) X(Minimum) X(MaximumBackward) X(ClampBackward) \
  X(Greater) X(GreaterEqual) X(Less) X(LessEqual) X(Equal) X(NotEqual)
#define AD_PW_TERNARY_LIST(X) X(Where)

}  // namespace ad::pw
