// Edge behaviour of the softmax family (huge inputs, all -inf rows) and the
// accuracy of the f32 kernels (fast exp/tanh/erf of src/core/math.hpp)
// against the f64 ones. Part of the gradcheck suite (names match *grad*).
#include <cmath>
#include <limits>

#include <doctest/doctest.h>

#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

namespace {
enum class Fam { logsumexp, softmax, log_softmax };
const char* fam_name(Fam f) {
  return f == Fam::logsumexp ? "logsumexp" : f == Fam::softmax ? "softmax" : "log_softmax";
}
Var apply(Fam f, const Var& x, int axis) {
  switch (f) {
    case Fam::logsumexp: return logsumexp(x, axis);
    case Fam::softmax: return softmax(x, axis);
    case Fam::log_softmax: return log_softmax(x, axis);
  }
  return {};
}
// A 2-d tensor of `lanes` rows of `len` along `axis`: [lanes, len] (axis 1) or [len, lanes] (axis 0).
struct Layout {
  int axis;
  std::int64_t lanes, len;
  Shape shape() const { return axis == 1 ? Shape{lanes, len} : Shape{len, lanes}; }
  std::size_t at(std::int64_t lane, std::int64_t j) const {
    return static_cast<std::size_t>(axis == 1 ? lane * len + j : j * lanes + lane);
  }
};
// The op's value computed here, in double, with the max shift: logsumexp gives
// one value per lane, softmax / log_softmax one per element (x's layout).
std::vector<double> reference(Fam f, const std::vector<double>& x, const Layout& l) {
  std::vector<double> y(f == Fam::logsumexp ? static_cast<std::size_t>(l.lanes) : x.size());
  for (std::int64_t k = 0; k < l.lanes; ++k) {
    double m = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < l.len; ++j) m = std::max(m, x[l.at(k, j)]);
    for (std::int64_t j = 0; j < l.len; ++j) s += std::exp(x[l.at(k, j)] - m);
    double lse = m + std::log(s);
    if (f == Fam::logsumexp) { y[static_cast<std::size_t>(k)] = lse; continue; }
    for (std::int64_t j = 0; j < l.len; ++j)
      y[l.at(k, j)] = f == Fam::softmax ? std::exp(x[l.at(k, j)] - lse) : x[l.at(k, j)] - lse;
  }
  return y;
}
}  // namespace

TEST_CASE("gradcheck softmax family: inputs at +-1e4 stay finite and exact") {
  Rng rng(21);
  for (int axis : {1, 0}) {
    Layout l{axis, 4, 6};
    Tensor xt = randn64(l.shape(), rng), st = xt.clone();  // st: x with each lane's offset removed
    double* px = xt.data<double>();
    std::vector<double> c(static_cast<std::size_t>(l.lanes));
    for (std::int64_t k = 0; k < l.lanes; ++k) {
      c[static_cast<std::size_t>(k)] = k % 2 ? -1e4 : 1e4;
      for (std::int64_t j = 0; j < l.len; ++j) px[l.at(k, j)] += c[static_cast<std::size_t>(k)];
    }
    auto xv = xt.to_vector();
    for (Fam f : {Fam::logsumexp, Fam::softmax, Fam::log_softmax}) {
      INFO(fmt::format("{} axis {}", fam_name(f), axis));
      PGraph g;
      Var x = g.input(xt), xs = g.input(st);
      Var y = apply(f, x, axis), ys = apply(f, xs, axis);
      Tensor wt = randn64(y.shape(), rng);
      auto yv = eval(y).to_vector(), ysv = eval(ys).to_vector(), ref = reference(f, xv, l);
      REQUIRE(yv.size() == ref.size());
      // relative (doctest::Approx: of 1 + |value|): lse ~ 1e4 to 1e-13, x - lse (x ~ 1e4, rounding ~2e-12) to 1e-11
      double tol = f == Fam::logsumexp ? 1e-13 : f == Fam::softmax ? 1e-12 : 1e-11;
      for (std::size_t i = 0; i < yv.size(); ++i) {
        // the lane's offset, to compare with the shifted computation
        std::int64_t lane = f == Fam::logsumexp ? static_cast<std::int64_t>(i)
                                                : (axis == 1 ? static_cast<std::int64_t>(i) / l.len
                                                             : static_cast<std::int64_t>(i) % l.lanes);
        double shift = f == Fam::logsumexp ? c[static_cast<std::size_t>(lane)] : 0.0;  // the others are invariant
        CHECK(std::isfinite(yv[i]));
        CHECK(yv[i] == doctest::Approx(ref[i]).epsilon(tol));
        CHECK(yv[i] == doctest::Approx(ysv[i] + shift).epsilon(tol));
      }
      // gradients are shift invariant: equal to those at the shifted input
      Tensor gx = eval(grad(sum(mul(y, g.input(wt))), {x})[0]).clone();
      Tensor gs = eval(grad(sum(mul(ys, g.input(wt))), {xs})[0]).clone();
      CHECK(all_finite(gx));
      CHECK(max_abs_diff(gx, gs) <= 1e-9);
    }
  }
}

TEST_CASE("gradcheck softmax family: an all -inf row gives -inf / 0 / -inf and gradient 0 (second too)") {
  Rng rng(22);
  for (int axis : {1, 0}) {
    Layout l{axis, 3, 5}, live{axis, 2, 5};  // lane 1 is dead; `live` holds lanes 0 and 2
    Tensor xt = randn64(l.shape(), rng);
    double* px = xt.data<double>();
    for (std::int64_t j = 0; j < l.len; ++j) px[l.at(1, j)] = -INFINITY;
    Tensor lt = Tensor::empty(live.shape(), DType::f64);
    for (std::int64_t j = 0; j < l.len; ++j) {
      lt.data<double>()[live.at(0, j)] = px[l.at(0, j)];
      lt.data<double>()[live.at(1, j)] = px[l.at(2, j)];
    }
    for (Fam f : {Fam::logsumexp, Fam::softmax, Fam::log_softmax}) {
      INFO(fmt::format("{} axis {}", fam_name(f), axis));
      PGraph g;
      Var x = g.input(xt), xl = g.input(lt);
      Var y = apply(f, x, axis), yl = apply(f, xl, axis);
      auto yv = eval(y).to_vector(), ylv = eval(yl).to_vector();
      // where element (lane k, j) of y lives (logsumexp: one per lane)
      auto yat = [&](const Layout& lay, std::int64_t k, std::int64_t j) {
        return f == Fam::logsumexp ? static_cast<std::size_t>(k) : lay.at(k, j);
      };
      for (std::int64_t j = 0; j < l.len; ++j) {
        double d = yv[yat(l, 1, j)];
        if (f == Fam::softmax) CHECK(d == 0.0);
        else CHECK(d == -INFINITY);
        CHECK(yv[yat(l, 0, j)] == doctest::Approx(ylv[yat(live, 0, j)]).epsilon(1e-14));
        CHECK(yv[yat(l, 2, j)] == doctest::Approx(ylv[yat(live, 1, j)]).epsilon(1e-14));
      }
      // weights for y, and the same weights for the live lanes
      Tensor wt = randn64(y.shape(), rng), wl = Tensor::empty(yl.shape(), DType::f64);
      for (std::int64_t j = 0; j < (f == Fam::logsumexp ? 1 : l.len); ++j) {
        wl.data<double>()[yat(live, 0, j)] = wt.data<double>()[yat(l, 0, j)];
        wl.data<double>()[yat(live, 1, j)] = wt.data<double>()[yat(l, 2, j)];
      }
      Var gxv = grad(sum(mul(y, g.input(wt))), {x})[0], glv = grad(sum(mul(yl, g.input(wl))), {xl})[0];
      auto gx = eval(gxv).to_vector(), gl = eval(glv).to_vector();
      for (std::int64_t j = 0; j < l.len; ++j) {
        CHECK(gx[l.at(1, j)] == 0.0);  // not NaN
        CHECK(gx[l.at(0, j)] == doctest::Approx(gl[live.at(0, j)]).epsilon(1e-14));
        CHECK(gx[l.at(2, j)] == doctest::Approx(gl[live.at(1, j)]).epsilon(1e-14));
      }
      // differentiated twice (the backward ops' own rules): 0 on the dead lane too
      Tensor w2 = randn64(x.shape(), rng), w2l = Tensor::empty(xl.shape(), DType::f64);
      for (std::int64_t j = 0; j < l.len; ++j) {
        w2l.data<double>()[live.at(0, j)] = w2.data<double>()[l.at(0, j)];
        w2l.data<double>()[live.at(1, j)] = w2.data<double>()[l.at(2, j)];
      }
      auto hx = eval(grad(sum(mul(gxv, g.input(w2))), {x})[0]).to_vector();
      auto hl = eval(grad(sum(mul(glv, g.input(w2l))), {xl})[0]).to_vector();
      for (std::int64_t j = 0; j < l.len; ++j) {
        CHECK(hx[l.at(1, j)] == 0.0);
        CHECK(hx[l.at(0, j)] == doctest::Approx(hl[live.at(0, j)]).epsilon(1e-13));
        CHECK(hx[l.at(2, j)] == doctest::Approx(hl[live.at(1, j)]).epsilon(1e-13));
      }
    }
  }
}

TEST_CASE("gradcheck log_softmax_backward on an all -inf row: 0, and 0 in its gradient in dy") {
  // z = dy - exp(y) sum(dy) on a live row, 0 on a row of y all -inf: so d/d(dy) is 0 there, not g
  Rng rng(23);
  Tensor yt = randn64({3, 4}, rng, -2.0, 0.5);
  for (int j = 0; j < 4; ++j) yt.data<double>()[4 + j] = -INFINITY;  // row 1 dead
  PGraph g;
  Var y = g.input(yt), dy = g.input(randn64({3, 4}, rng));
  Attrs at;
  at.axis = 1;
  Var z = make_node(OpId::log_softmax_backward, {y, dy}, at);
  auto zv = eval(z).to_vector();
  Tensor w = randn64({3, 4}, rng);
  auto gd = eval(grad(sum(mul(z, g.input(w))), {dy})[0]).to_vector();
  const double* pw = w.data<double>();
  for (int j = 0; j < 4; ++j) {
    CHECK(zv[static_cast<std::size_t>(4 + j)] == 0.0);
    CHECK(gd[static_cast<std::size_t>(4 + j)] == 0.0);
    double s = 0;  // a live row: w_j - sum_k w_k exp(y_k)
    for (int k = 0; k < 4; ++k) s += pw[k] * std::exp(yt.data<double>()[k]);
    CHECK(gd[static_cast<std::size_t>(j)] == doctest::Approx(pw[j] - s).epsilon(1e-14));
  }
}

// ---- f32 kernels against f64 ----
namespace {
constexpr double kF32Rel = 4e-7, kF32Abs = 1e-7;
// Elements where the f32 result is off by more than 4e-7 relative and 1e-7 absolute.
struct F32Errors {
  std::int64_t n = 0, bad = 0;
  double max_rel = 0;                  // over outputs with |y64| >= 1e-3 (informative)
  double worst_rel = 0, worst_x = NAN, worst_y32 = NAN, worst_y64 = NAN;  // worst offending element
  void add(double x, double y32, double y64) {
    ++n;
    if (y32 == y64) return;
    double ae = std::fabs(y32 - y64), re = ae / std::fabs(y64);
    if (std::isnan(ae)) re = INFINITY;
    if (std::fabs(y64) >= 1e-3) max_rel = std::max(max_rel, re);
    if (re <= kF32Rel || ae <= kF32Abs) return;
    ++bad;
    if (!(re <= worst_rel)) { worst_rel = re; worst_x = x; worst_y32 = y32; worst_y64 = y64; }
  }
  std::string str(const char* what) const {
    return fmt::format("{}: {} of {} outside rel {} / abs {}; max rel error (|y| >= 1e-3) {:.3g}; worst at x = {:.9g}: "
                       "f32 {:.9g} vs f64 {:.17g} (rel {:.3g})",
                       what, bad, n, kF32Rel, kF32Abs, max_rel, worst_x, worst_y32, worst_y64, worst_rel);
  }
};
// n f32 values evenly spread over [lo, hi]
Tensor grid_f32(double lo, double hi, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<float>(lo + (hi - lo) * static_cast<double>(i) / static_cast<double>(n - 1));
  return Tensor::from(std::span<const float>(v), {n});
}
// op on x (f32) vs op on x converted to f64, element by element
F32Errors compare_f32(const std::function<Var(const Var&)>& op, const Tensor& x32) {
  PGraph g;
  Var a = g.input(x32), b = g.input(x32.to(DType::f64));
  auto ya = eval(op(a)), yb = eval(op(b));
  REQUIRE(ya.dtype() == DType::f32);
  auto xs = x32.to_vector(), va = ya.to_vector(), vb = yb.to_vector();
  F32Errors e;
  for (std::size_t i = 0; i < va.size(); ++i) e.add(xs[va.size() == xs.size() ? i : 0], va[i], vb[i]);
  return e;
}
}  // namespace

TEST_CASE("gradcheck aux: f32 elementwise kernels match f64 within 4e-7") {
  const Tensor wide = grid_f32(-20, 20, 400001);  // step 1e-4
  struct E { const char* name; Var (*fn)(const Operand&); };
  for (E e : {E{"exp", ad::exp}, E{"tanh", ad::tanh}, E{"sigmoid", ad::sigmoid}, E{"gelu", ad::gelu}, E{"silu", ad::silu}}) {
    auto fn = e.fn;
    F32Errors r = compare_f32([fn](const Var& v) { return fn(v); }, wide);
    CHECK_MESSAGE(r.bad == 0, r.str(e.name));
  }
  // exp over its whole range, down into the subnormals and up to 88
  F32Errors r = compare_f32([](const Var& v) { return exp(v); }, grid_f32(-100, 88, 376001));
  CHECK_MESSAGE(r.bad == 0, r.str("exp [-100, 88]"));
}

TEST_CASE("gradcheck aux: f32 softmax, log_softmax and cross_entropy match f64 within 4e-7") {
  Rng rng(23);
  Tensor x = Tensor::uniform({2000, 48}, rng, DType::f32, -20, 20);
  F32Errors s = compare_f32([](const Var& v) { return softmax(v, -1); }, x);
  CHECK_MESSAGE(s.bad == 0, s.str("softmax"));
  F32Errors ls = compare_f32([](const Var& v) { return log_softmax(v, -1); }, x);
  CHECK_MESSAGE(ls.bad == 0, ls.str("log_softmax"));
  F32Errors s0 = compare_f32([](const Var& v) { return softmax(v, 0); }, Tensor::uniform({48, 300}, rng, DType::f32, -20, 20));
  CHECK_MESSAGE(s0.bad == 0, s0.str("softmax axis 0"));
  // cross_entropy: one row at a time (sum), then the whole batch (mean and sum)
  Tensor labels = Tensor::randint({2000}, rng, 48);
  F32Errors ce;
  const std::int64_t rows = 400;
  for (std::int64_t r = 0; r < rows; ++r) {
    PGraph g;
    Var xr = slice(g.input(x), 0, r, r + 1), yr = slice(g.input(labels), 0, r, r + 1);
    double a = eval(cross_entropy(xr, yr, Reduction::sum)).item();
    double b = eval(cross_entropy(cast(xr, DType::f64), yr, Reduction::sum)).item();
    ce.add(static_cast<double>(r), a, b);
  }
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    PGraph g;
    Var xa = g.input(x), ya = g.input(labels);
    ce.add(-1, eval(cross_entropy(xa, ya, red)).item(), eval(cross_entropy(cast(xa, DType::f64), ya, red)).item());
  }
  CHECK_MESSAGE(ce.bad == 0, ce.str("cross_entropy (x = row, -1 = whole batch)"));
}

TEST_CASE("gradcheck aux: f32 elementwise kernels on NaN, +-inf, huge and tiny inputs behave as f64") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float fmax = std::numeric_limits<float>::max();
  const std::vector<float> xs = {nan, -nan, inf, -inf, 0.0f, 1e-30f, -1e-30f, 1e-8f, -3e-8f,
                                 0.39999f, 0.4f, 0.40001f, 8.99f, 9.0f, 9.01f, 88.7f, 88.73f, 89.0f,
                                 -103.9f, -104.0f, -200.0f, fmax, -fmax};
  Tensor x = Tensor::from(std::span<const float>(xs), {static_cast<std::int64_t>(xs.size())});
  struct E { const char* name; Var (*fn)(const Operand&); };
  for (E e : {E{"exp", ad::exp}, E{"tanh", ad::tanh}, E{"sigmoid", ad::sigmoid}, E{"gelu", ad::gelu}, E{"silu", ad::silu}}) {
    PGraph g;
    auto y32 = eval(e.fn(g.input(x))).to_vector();
    auto y64 = eval(e.fn(g.input(x.to(DType::f64)))).to_vector();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      INFO(fmt::format("{}({:.9g}): f32 {:.9g} vs f64 {:.17g}", e.name, xs[i], y32[i], y64[i]));
      double ref = static_cast<double>(static_cast<float>(y64[i]));  // f64 result in f32 range (overflow -> inf)
      if (std::isnan(ref)) { CHECK(std::isnan(y32[i])); continue; }
      if (std::isinf(ref)) { CHECK(y32[i] == ref); continue; }
      double ae = std::fabs(y32[i] - y64[i]);
      CHECK((ae <= kF32Abs || ae <= kF32Rel * std::fabs(y64[i])));
    }
  }
}

TEST_CASE("gradcheck aux: f32 gelu keeps its relative accuracy in the negative tail") {
  // Phi(x) for x < 0 comes from erfc directly, so x Phi(x) does not cancel.
  Tensor x = grid_f32(-12, 0, 120001);
  PGraph g;
  auto y32 = eval(gelu(g.input(x))).to_vector();
  auto y64 = eval(gelu(g.input(x.to(DType::f64)))).to_vector();
  auto xs = x.to_vector();
  double worst = 0, at = 0;
  for (std::size_t i = 0; i < y32.size(); ++i) {
    if (std::fabs(y64[i]) < 1e-12) continue;  // deeper still, exp's argument (-x^2/2) itself rounds
    double re = std::fabs(y32[i] - y64[i]) / std::fabs(y64[i]);
    if (!(re <= worst)) { worst = re; at = xs[i]; }
  }
  INFO(fmt::format("worst relative error {:.3g} at x = {:.6g}", worst, at));
  CHECK(worst <= 1e-5);  // grows like (x^2/2) 2^-24: 4.9e-6 at x = -7.1 (y ~ 1e-12)
}
