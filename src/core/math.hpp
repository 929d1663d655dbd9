#pragma once
// Per-element math shared by CPU and CUDA kernels (AD_HD). The f32 versions
// are branch-free so loops over them vectorise; f64 uses the C library.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ad/hd.hpp"

namespace ad::math {

// c ? a : b as a bit mask, no branch. The f32 functions below use it for
// every select: with GCC's default -ftrapping-math, a ?: whose compare or
// arms the optimiser moved under a branch is not if-converted (the compare
// "could trap"), and the whole loop stays scalar. Same values, bit for bit.
AD_HD float select(bool c, float a, float b) {
  std::uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  std::uint32_t r = (ua & m) | (ub & ~m);
  float f;
  std::memcpy(&f, &r, 4);
  return f;
}

AD_HD double select(bool c, double a, double b) {
  std::uint64_t ua, ub;
  std::memcpy(&ua, &a, 8);
  std::memcpy(&ub, &b, 8);
  std::uint64_t m = 0ull - static_cast<std::uint64_t>(c);
  std::uint64_t r = (ua & m) | (ub & ~m);
  double f;
  std::memcpy(&f, &r, 8);
  return f;
}

// e^x in f32, within 2 ulp: x = n ln2 + r, |r| <= ln2/2, e^r by its degree-7
// Taylor polynomial, 2^n by exponent bits. Overflow gives inf, underflow 0,
// NaN stays NaN. Plain multiply-adds (no libm calls) so loops vectorise.
AD_HD float expf_fast(float x) {
  const float hi = 88.7228394f, lo = -103.972084f;
  float xc = select(x > hi, hi, select(x < lo, lo, x));
  xc = select(x != x, 0.0f, xc);
  // round to nearest integer: adding 1.5*2^23 pushes the fraction out
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693145751953125f;  // ln2 split in two for exact reduction
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n as two factors so n in [-150, 128] never overflows the exponent field
  std::int32_t ni = static_cast<std::int32_t>(n);
  std::int32_t n1 = ni / 2, n2 = ni - n1;
  std::uint32_t b1 = static_cast<std::uint32_t>(n1 + 127) << 23, b2 = static_cast<std::uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  float y = p * s1 * s2;
  y = select(x > hi, std::numeric_limits<float>::infinity(), y);
  y = select(x < lo, 0.0f, y);
  return select(x != x, x, y);
}

// tanh in f32: odd polynomial near 0 (no cancellation), 1 - 2/(e^{2|x|}+1) beyond.
AD_HD float tanhf_fast(float x) {
  float a = std::fabs(x);
  float x2 = x * x;
  // tanh(x)/x = 1 + x^2 P(x^2), Taylor to x^18: < 1 ulp for |x| < 0.4
  float p = -0.00023912911f;  // Taylor coefficients of tanh(x)/x, highest first
  p = p * x2 + 0.0005900274f;
  p = p * x2 + -0.0014558344f;
  p = p * x2 + 0.0035921280f;
  p = p * x2 + -0.0088632355f;
  p = p * x2 + 0.0218694885f;
  p = p * x2 + -0.0539682540f;
  p = p * x2 + 0.1333333333f;
  p = p * x2 + -0.3333333333f;
  float small = p * x2 * x + x;
  // past 9.02 tanh rounds to 1 in f32 (1 - 2^-25 at atanh = 9.0109; a clamp at 9 gave 0.99999994 there
  // and a gradient of 1.2e-7 to saturated units); NaN passes through
  float e = expf_fast(2.0f * select(a > 9.02f, 9.02f, a));
  float big = select(a > 9.02f, 1.0f, 1.0f - 2.0f / (e + 1.0f));
  big = std::copysign(big, x);
  return select(a < 0.4f, small, big);
}

AD_HD float sigmoidf_fast(float x) { return 1.0f / (1.0f + expf_fast(-x)); }

// erfc(z) for z >= 0 in f32, branch-free, relative error < 1.2e-7 over the
// whole range: erfc(z) = t exp(-z^2 + P(t)), t = 1/(1 + z/2) (the Chebyshev
// fit in Numerical Recipes, "erfcc").
AD_HD float erfcf_pos(float z) {
  float t = 1.0f / (0.5f * z + 1.0f);
  float p = 0.17087277f;
  p = p * t + -0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t + -1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t + -0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t + -1.26551223f;
  return t * expf_fast(-z * z + p);
}

// Standard normal CDF Phi(x) in f32. The tail x < 0 is taken as
// erfc(|x|/sqrt 2) / 2 directly, so it keeps its relative accuracy (computing
// (1 + erf) / 2 would cancel).
AD_HD float normal_cdf_f(float x) {
  float h = 0.5f * erfcf_pos(std::fabs(x) * 0.70710678118654752f);
  return select(x < 0.0f, h, 1.0f - h);
}

// ---- scalar functions used by kernels, one per type ----
AD_HD float exp_(float x) { return expf_fast(x); }
AD_HD double exp_(double x) { return std::exp(x); }
AD_HD float tanh_(float x) { return tanhf_fast(x); }
AD_HD double tanh_(double x) { return std::tanh(x); }
AD_HD float sigmoid_(float x) { return sigmoidf_fast(x); }
AD_HD double sigmoid_(double x) { return 1.0 / (1.0 + std::exp(-x)); }
AD_HD float normal_cdf(float x) { return normal_cdf_f(x); }
AD_HD double normal_cdf(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752440); }

// gelu(x) = x Phi(x)
template <class T> AD_HD T gelu(T x) { return x * normal_cdf(x); }
// d/dx gelu = Phi(x) + x phi(x)
template <class T> AD_HD T gelu_grad(T x) {
  T cdf = normal_cdf(x);
  T pdf = T(0.39894228040143267794) * exp_(T(-0.5) * x * x);
  return cdf + x * pdf;
}
template <class T> AD_HD T silu(T x) { return x * sigmoid_(x); }
// d/dx silu = s (1 + x (1 - s))
template <class T> AD_HD T silu_grad(T x) { T s = sigmoid_(x); return s * (T(1) + x * (T(1) - s)); }

}  // namespace ad::math
