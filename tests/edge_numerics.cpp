// Edge values in the core ops' numbers (not their errors: tests/edge_input.cpp):
// empty products, NaN through row reductions and activations, 0^0, the
// saturation of f32 tanh, f64 -> f16 / bf16 in one rounding, and the
// comparisons and where (IEEE NaN, untaken branches, broadcasting, their
// errors, and parameters read only through them).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ad/ad.hpp"
#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

TEST_CASE("edge: matmul of a batched a and a 2-D b with K or N = 0 differentiates to empty or zero gradients") {
  // the backward folded the batch with reshape(., {-1, 0}): -1 next to a 0 is ambiguous, and it threw
  struct Case {
    Shape sa, sb;
    bool tb;
  };
  for (const Case& c : {Case{{2, 3, 4}, {4, 0}, false}, Case{{2, 3, 4}, {0, 4}, true}, Case{{2, 3, 0}, {0, 5}, false},
                        Case{{2, 3, 0}, {5, 0}, true}}) {
    const Shape &sa = c.sa, &sb = c.sb;
    const bool tb = c.tb;
    INFO(sa.str(), " x ", sb.str(), tb ? "^T" : "");  // references, not structured bindings (clang 14 lambdas)
    Graph g;
    Var a = g.input(Tensor::ones(sa, DType::f64)), b = g.input(Tensor::ones(sb, DType::f64));
    std::vector<Var> gr = grad(sum(matmul(a, b, false, tb)), {a, b});
    Tensor ga = eval(gr[0]), gb = eval(gr[1]);
    CHECK(ga.shape() == sa);
    CHECK(gb.shape() == sb);
    for (double v : ga.to_vector()) CHECK(v == 0.0);  // C is empty (N = 0) or K = 0: nothing flows
  }
}

// numpy's matmul computed by plain loops: batch dims broadcast from the
// right, a rank-1 a is a row, a rank-1 b a column, their dims dropped
static std::vector<double> matmul_by_loops(const Tensor& a, const Tensor& b, bool ta, bool tb, Shape& out) {
  Shape sa = a.shape(), sb = b.shape();
  bool va = sa.rank() == 1, vb = sb.rank() == 1;
  if (va) { sa = Shape{1, sa[0]}; ta = false; }
  if (vb) { sb = Shape{sb[0], 1}; tb = false; }
  std::int64_t m = ta ? sa[sa.rank() - 1] : sa[sa.rank() - 2], k = ta ? sa[sa.rank() - 2] : sa[sa.rank() - 1];
  std::int64_t n = tb ? sb[sb.rank() - 2] : sb[sb.rank() - 1];
  int r = std::max(sa.rank(), sb.rank()) - 2;
  Shape batch;
  for (int i = 0; i < r; ++i) {
    int ia = sa.rank() - 2 - r + i, ib = sb.rank() - 2 - r + i;
    std::int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
    batch.push_back(da == 1 ? db : da);
  }
  std::vector<double> A = a.to_vector(), B = b.to_vector(), C;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
  for (std::int64_t bi = 0; bi < batch.numel(); ++bi) {
    std::int64_t oa = 0, ob = 0;  // matrix index of a and b for this batch index
    for (int d = 0; d < sa.rank() - 2; ++d) {
      std::int64_t dim = sa[d];
      oa = oa * dim + (dim == 1 ? 0 : idx[static_cast<std::size_t>(r - (sa.rank() - 2) + d)]);
    }
    for (int d = 0; d < sb.rank() - 2; ++d) {
      std::int64_t dim = sb[d];
      ob = ob * dim + (dim == 1 ? 0 : idx[static_cast<std::size_t>(r - (sb.rank() - 2) + d)]);
    }
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          double x = A[static_cast<std::size_t>(oa * m * k + (ta ? p * m + i : i * k + p))];
          double y = B[static_cast<std::size_t>(ob * k * n + (tb ? j * k + p : p * n + j))];
          acc += x * y;
        }
        C.push_back(acc);
      }
    for (int d = r - 1; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < batch[d]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  out = batch;
  if (!va) out.push_back(m);
  if (!vb) out.push_back(n);
  return C;
}

TEST_CASE("edge: matmul broadcasts batch dims and takes vectors as numpy does, forward and gradients") {
  struct Case {
    Shape sa, sb;
    bool ta, tb;
  };
  const Case cases[] = {
      {{2, 1, 3, 4}, {5, 4, 2}, false, false}, {{1, 3, 4}, {2, 4, 5}, false, false},  // broadcast both / a's 1
      {{2, 3, 4}, {1, 4, 5}, false, false},    {{3, 1, 4, 3}, {1, 2, 5, 4}, true, true},  // b's 1; both, transposed
      {{2, 2, 3, 4}, {2, 1, 4, 5}, false, false},                                        // inner-dim broadcast
      {{4}, {4, 5}, false, false},             {{3, 4}, {4}, false, false},  {{4}, {4}, false, false},
      {{2, 3, 4}, {4}, false, false},          {{4}, {2, 4, 5}, false, false}, {{4}, {2, 5, 4}, true, true},
      {{4}, {3, 1, 4, 2}, false, false},       {{2, 4, 3}, {4}, true, false},  {{0, 3, 4}, {1, 4, 2}, false, false},
  };
  Rng rng(17);
  for (const Case& c : cases) {
    INFO(c.sa.str(), c.ta ? "^T" : "", " x ", c.sb.str(), c.tb ? "^T" : "");
    Tensor ta = randn64(c.sa, rng), tb = randn64(c.sb, rng);
    Shape want_shape;
    std::vector<double> want = matmul_by_loops(ta, tb, c.ta, c.tb, want_shape);
    Graph g;
    Var a = g.input(ta), b = g.input(tb);
    Var y = matmul(a, b, c.ta, c.tb);
    REQUIRE(y.shape() == want_shape);
    std::vector<double> got = eval(y).to_vector();
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
    // gradients against sum(w * y) by finite differences of the loop reference
    Tensor w = randn64(want_shape, rng);
    std::vector<double> wv = w.to_vector();
    std::vector<Var> gr = grad(sum(mul(y, g.input(w))), {a, b});
    for (int side = 0; side < 2; ++side) {
      Tensor base = side == 0 ? ta : tb, gt = eval(gr[static_cast<std::size_t>(side)]);
      REQUIRE(gt.shape() == base.shape());
      std::vector<double> gv = gt.to_vector(), bv = base.to_vector();
      for (std::size_t i = 0; i < bv.size(); ++i) {
        auto loss_at = [&](double delta) {
          std::vector<double> v = bv;
          v[i] += delta;
          Tensor t = f64s(v, base.shape());
          Shape s;
          std::vector<double> yy = side == 0 ? matmul_by_loops(t, tb, c.ta, c.tb, s) : matmul_by_loops(ta, t, c.ta, c.tb, s);
          double l = 0;
          for (std::size_t j = 0; j < yy.size(); ++j) l += yy[j] * wv[j];
          return l;
        };
        // the loss is linear in each input: the central difference is exact up to rounding
        CHECK(gv[i] == doctest::Approx((loss_at(0.5) - loss_at(-0.5))).epsilon(1e-9));
      }
    }
  }
}

TEST_CASE("edge: a NaN in a row makes logsumexp, softmax and log_softmax NaN (it was taken for -inf)") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::f64, DType::f32}) {
    INFO(dtype_name(t));
    Graph g;
    // rows: all NaN; NaN with -inf; +inf with NaN; an ordinary row
    Var x = g.input(f64s({nan, nan, nan, nan, -inf, -inf, inf, nan, 1.0, 0.0, 1.0, 2.0}, {4, 3}).to(t));
    auto lse = eval(logsumexp(x, 1)).to_vector(), sm = eval(softmax(x, 1)).to_vector(),
         ls = eval(log_softmax(x, 1)).to_vector(), dl = eval(grad(sum(logsumexp(x, 1)), {x})[0]).to_vector();
    for (int r = 0; r < 3; ++r) {
      CHECK(std::isnan(lse[static_cast<std::size_t>(r)]));
      for (int c = 0; c < 3; ++c) {
        const auto i = static_cast<std::size_t>(3 * r + c);
        CHECK(std::isnan(sm[i]));
        CHECK(std::isnan(ls[i]));
        CHECK(std::isnan(dl[i]));
      }
    }
    CHECK(std::isfinite(lse[3]));  // the other row is untouched
    CHECK(sm[9] + sm[10] + sm[11] == doctest::Approx(1.0));
  }
}

TEST_CASE("edge: relu and sign keep NaN; pow's d/da is 0 at a = b = 0; f32 tanh reaches 1") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType t : {DType::f64, DType::f32}) {
    INFO(dtype_name(t));
    Graph g;
    Var x = g.input(f64s({nan, 1.0, -2.0, 0.0}, {4}).to(t));
    auto r = eval(relu(x)).to_vector(), s = eval(sign(x)).to_vector(), da = eval(grad(sum(abs(x)), {x})[0]).to_vector();
    CHECK(std::isnan(r[0]));
    CHECK(std::isnan(s[0]));
    CHECK(std::isnan(da[0]));  // d|x|/dx = sign(x)
    CHECK(r[1] == 1.0);
    CHECK(r[2] == 0.0);
    CHECK(s[2] == -1.0);
    CHECK(s[3] == 0.0);
    CHECK(da[3] == 0.0);
    Graph g2;
    Var a = g2.input(f64s({0.0, 0.0, 2.0}, {3}).to(t)), b = g2.input(f64s({0.0, 2.0, 0.0}, {3}).to(t));
    auto ga = eval(grad(sum(pow(a, b)), {a})[0]).to_vector();
    CHECK(ga[0] == 0.0);  // 0 * 0^-1 was NaN
    CHECK(ga[1] == 0.0);  // 2 * 0^1
    CHECK(ga[2] == 0.0);  // 0 * 2^-1
  }
  Graph g;
  Var x = g.input(f64s({9.5, 20.0, std::numeric_limits<double>::infinity(), -9.5, 9.01}, {5}).to(DType::f32));
  auto y = eval(tanh(x)).to_vector(), dy = eval(grad(sum(tanh(x)), {x})[0]).to_vector();
  CHECK(y[0] == 1.0);  // was 0.99999994 (a clamp at 9)
  CHECK(y[1] == 1.0);
  CHECK(y[2] == 1.0);
  CHECK(y[3] == -1.0);
  CHECK(static_cast<float>(y[4]) == static_cast<float>(std::tanh(9.01)));  // below the clamp: nearest
  for (int i = 0; i < 4; ++i) CHECK(dy[static_cast<std::size_t>(i)] == 0.0);
}

TEST_CASE("edge: f64 converts to f16 and bf16 in one rounding (no double rounding through f32)") {
  // just above the midpoint between two f16 (bf16) values: the upper one, not the even lower one
  Tensor hi = f64s({1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-8 + 0x1p-30, -(1 + 0x1p-11 + 0x1p-40), 0x1p-25 + 0x1p-60}, {4});
  auto f16 = hi.to(DType::f16).to(DType::f64).to_vector(), bf = hi.to(DType::bf16).to(DType::f64).to_vector();
  CHECK(f16[0] == 1 + 0x1p-10);
  CHECK(bf[1] == 1 + 0x1p-7);
  CHECK(f16[2] == -(1 + 0x1p-10));
  CHECK(f16[3] == 0x1p-24);  // above half the smallest subnormal: rounds up to it
  // the cast op too, and exact midpoints still round to even
  Graph g;
  Var c = cast(g.input(f64s({1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-11, 1 + 3 * 0x1p-11}, {3})), DType::f16);
  auto cv = eval(c).to(DType::f64).to_vector();
  CHECK(cv[0] == 1 + 0x1p-10);
  CHECK(cv[1] == 1.0);
  CHECK(cv[2] == 1 + 0x1p-9);
  // against the neighbouring f16 values for random doubles: the result is the nearest
  Rng rng(3);
  Tensor r = Tensor::randn({20000}, rng, DType::f64, 0.0, 3.0);
  Tensor h = r.to(DType::f16);
  auto rv = r.to_vector();
  const auto* hb = static_cast<const std::uint16_t*>(h.raw());
  int wrong = 0;
  for (std::size_t i = 0; i < rv.size(); ++i) {
    const double d = rv[i], got = f16_to_f32(hb[i]);
    for (int step : {-1, 1}) {  // the f16 values on either side (same sign: |d| < 65504 here)
      const double other = f16_to_f32(static_cast<std::uint16_t>(hb[i] + step));
      if (std::abs(d - other) < std::abs(d - got)) ++wrong;
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("edge: x / s divides (it multiplied by 1/s: one rounding more, and inf when 1/s overflows)") {
  // 3 / 3 is 1 exactly; 3 * (1/3) is 1 - 2^-53 in f64. A tiny s: 1/s overflows f64 while x / s is finite.
  Graph g;
  const double tiny = 1e-310;  // subnormal: 1 / tiny = 1e310 > DBL_MAX
  Var x = g.input(f64s({3.0, 1e-300, 7.0}, {3}));
  auto y = eval(x / 3.0).to_vector();
  CHECK(y[0] == 1.0);
  CHECK(y[2] == 7.0 / 3.0);
  auto z = eval(x / tiny).to_vector();
  CHECK(z[1] == 1e-300 / tiny);
  CHECK(std::isfinite(z[1]));
  // the gradient of sum(x / s) is 1 / s, computed as a division too
  auto d = eval(grad(sum(x / 3.0), {x})[0]).to_vector();
  for (double v : d) CHECK(v == 1.0 / 3.0);
  // f32: the division happens in the tensor's dtype, as div with a tensor does
  Graph h;
  Var xf = h.input(f64s({3.0, 10.0}, {2}).to(DType::f32));
  auto yf = eval(xf / 3.0).to_vector();
  CHECK(yf[0] == 1.0);
  CHECK(yf[1] == static_cast<double>(10.0f / 3.0f));
}

TEST_CASE("edge: maximum and minimum split a tie's gradient, propagate NaN; clamp passes the bounds' gradient") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::f64, DType::f32}) {
    INFO(dtype_name(t));
    Graph g;
    Var a = g.input(f64s({1, 2, 3, nan, inf, -inf}, {6}).to(t)), b = g.input(f64s({2, 2, 1, 0, inf, 5}, {6}).to(t));
    Var mx = maximum(a, b), mn = minimum(a, b);
    std::vector<double> vmx = eval(mx).to(DType::f64).to_vector(), vmn = eval(mn).to(DType::f64).to_vector();
    CHECK(vmx[0] == 2);
    CHECK(vmx[1] == 2);
    CHECK(vmx[2] == 3);
    CHECK(std::isnan(vmx[3]));
    CHECK(vmx[4] == inf);
    CHECK(vmx[5] == 5);
    CHECK(vmn[0] == 1);
    CHECK(vmn[2] == 1);
    CHECK(std::isnan(vmn[3]));
    CHECK(vmn[4] == inf);
    CHECK(vmn[5] == -inf);
    std::vector<Var> gmx = grad(sum(mx), {a, b}), gmn = grad(sum(mn), {a, b});
    std::vector<double> ga = eval(gmx[0]).to(DType::f64).to_vector(), gb = eval(gmx[1]).to(DType::f64).to_vector();
    const double want_a[] = {0, 0.5, 1, nan, 0.5, 0}, want_b[] = {1, 0.5, 0, nan, 0.5, 1};
    for (std::size_t i = 0; i < 6; ++i) {
      INFO("element ", i);
      if (std::isnan(want_a[i])) {
        CHECK(std::isnan(ga[i]));
        CHECK(std::isnan(gb[i]));
      } else {
        CHECK(ga[i] == want_a[i]);
        CHECK(gb[i] == want_b[i]);
      }
    }
    std::vector<double> na = eval(gmn[0]).to(DType::f64).to_vector(), nb = eval(gmn[1]).to(DType::f64).to_vector();
    CHECK(na[0] == 1);
    CHECK(nb[0] == 0);
    CHECK(na[1] == 0.5);
    CHECK(na[2] == 0);
    CHECK(nb[2] == 1);
    CHECK(na[5] == 1);  // -inf is the smaller
    // clamp: the bounds themselves pass the gradient; outside, 0; NaN stays NaN
    Var x = g.input(f64s({-2, -1, 0, 1, 2, nan}, {6}).to(t));
    Var y = clamp(x, -1, 1);
    std::vector<double> vy = eval(y).to(DType::f64).to_vector(), gy = eval(grad(sum(y), {x})[0]).to(DType::f64).to_vector();
    const double want_y[] = {-1, -1, 0, 1, 1, nan}, want_g[] = {0, 1, 1, 1, 0, nan};
    for (std::size_t i = 0; i < 6; ++i) {
      INFO("clamp element ", i);
      if (std::isnan(want_y[i])) {
        CHECK(std::isnan(vy[i]));
        CHECK(std::isnan(gy[i]));
      } else {
        CHECK(vy[i] == want_y[i]);
        CHECK(gy[i] == want_g[i]);
      }
    }
    // one-sided
    std::vector<double> lo_only = eval(clamp(x, 0, inf)).to(DType::f64).to_vector();
    CHECK(lo_only[0] == 0);
    CHECK(lo_only[4] == 2);
    // bad bounds
    EXPECT_ERROR(clamp(x, 1, -1), "clamp", "lo = 1 and hi = -1", "[6]");
    EXPECT_ERROR(clamp(x, nan, 1), "clamp", "lo = nan");
    EXPECT_ERROR(maximum(a, g.input(f64s({1, 2}, {2}).to(t))), "maximum", "shapes do not broadcast");
  }
  // sin and cos against std
  Graph g;
  Var x = g.input(f64s({-3, -0.5, 0, 1e-8, 2, 40}, {6}));
  std::vector<double> xs = x.value().to_vector(), s = eval(sin(x)).to_vector(), c = eval(cos(x)).to_vector();
  std::vector<double> ds = eval(grad(sum(sin(x)), {x})[0]).to_vector(), dc = eval(grad(sum(cos(x)), {x})[0]).to_vector();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    CHECK(s[i] == std::sin(xs[i]));
    CHECK(c[i] == std::cos(xs[i]));
    CHECK(ds[i] == std::cos(xs[i]));
    CHECK(dc[i] == -std::sin(xs[i]));
  }
}

TEST_CASE("edge: detach is x, shares its memory, and stops the gradient (not an error)") {
  Rng rng(23);
  Graph g;
  Var x = g.input(randn64({3, 4}, rng));
  Var d = detach(x);
  CHECK(d.shape() == x.shape());
  CHECK(bitwise_equal(eval(d), x.value()));
  CHECK(eval(d).raw() == x.value().raw());  // a view
  // x * detach(x): the gradient is detach(x) = x, not 2x
  std::vector<double> xs = x.value().to_vector(), gx = eval(grad(sum(mul(x, d)), {x})[0]).to_vector();
  for (std::size_t i = 0; i < xs.size(); ++i) CHECK(gx[i] == xs[i]);
  // a straight-through estimator: forward sign(x), gradient 1
  Var st = add(x, detach(sub(sign(x), x)));
  std::vector<double> sv = eval(st).to_vector(), sg = eval(grad(sum(st), {x})[0]).to_vector();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    CHECK(sv[i] == (xs[i] > 0 ? 1.0 : -1.0));
    CHECK(sg[i] == 1.0);
  }
  // only through detach: a zero gradient, no error; integer inputs detach too
  CHECK(eval(grad(sum(detach(tanh(x))), {x})[0]).to_vector() == std::vector<double>(12, 0.0));
  Var ids = g.input(index({0, 2, 1}, {3}));
  CHECK(eval(detach(ids)).dtype() == DType::i64);
  // a parameter read only through detach gets zeros from backward; one read both ways, the live path's
  Parameter w = Parameter::randn({4, 4}, rng, 0.5, DType::f64), v = Parameter::randn({4, 4}, rng, 0.5, DType::f64);
  for (const Policy& pol : {policy::keep_all(), policy::sqrt_n()}) {
    w.zero_grad();
    v.zero_grad();
    Graph g2;
    Var h = tanh(matmul(g2.input(x.value()), w));
    Var loss = sum(mul(tanh(matmul(detach(h), v)), h));
    backward(loss, pol);
    Graph g3;  // the same function with detach(h) fed in as an input: the reference for both gradients
    Var h3 = tanh(matmul(g3.input(x.value()), w));
    Var loss3 = sum(mul(tanh(matmul(g3.input(eval(h3).clone()), v)), h3));
    std::vector<Var> want = grad(loss3, {g3.param(w), g3.param(v)});
    CHECK(max_abs_diff(w.grad(), eval(want[0])) <= 1e-14);
    CHECK(max_abs_diff(v.grad(), eval(want[1])) <= 1e-14);
    Parameter u = Parameter::randn({4}, rng, 0.5, DType::f64);
    Graph g4;
    v.zero_grad();
    backward(sum(mul(detach(add(g4.input(x.value()), u)), g4.input(x.value()))) + sum(mul(g4.param(v), v)), pol);
    CHECK_FALSE(u.has_fresh_grad());  // not a gradient of zeros: an optimizer leaves u alone
    CHECK(v.has_fresh_grad());
    Graph g5;
    EXPECT_ERROR(backward(sum(detach(g5.param(u))), pol), "does not depend on any Parameter (other than through detach");
  }
}

// ---- comparisons and where ----
namespace {
// A rank-0 constant of x's dtype, for comparisons with a number.
Var scalar_like(const Var& x, double v) { return full(x, {}, v, x.dtype()); }
}  // namespace

TEST_CASE("edge: comparisons follow IEEE (a NaN compares false but for not_equal, -0 == 0) and have zero gradient") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<double> av{1, 2, 3, nan, inf, -inf, 0.0, -0.0, nan, 1, inf};
  const std::vector<double> bv{2, 2, 1, 0, inf, 5, -0.0, 0.0, nan, nan, -inf};
  struct Cmp {
    Var (*fn)(const Operand&, const Operand&);
    bool (*want)(double, double);
    const char* name;
  };
  const Cmp cmps[] = {
      {ad::greater, [](double x, double y) { return x > y; }, "greater"},
      {ad::greater_equal, [](double x, double y) { return x >= y; }, "greater_equal"},
      {ad::less, [](double x, double y) { return x < y; }, "less"},
      {ad::less_equal, [](double x, double y) { return x <= y; }, "less_equal"},
      {ad::equal, [](double x, double y) { return x == y; }, "equal"},
      {ad::not_equal, [](double x, double y) { return x != y; }, "not_equal"},
  };
  for (DType t : {DType::f64, DType::f32}) {
    PGraph g;
    Var a = g.input(f64s(av, {11}).to(t)), b = g.input(f64s(bv, {11}).to(t));
    for (const Cmp& cm : cmps) {
      INFO(dtype_name(t), " ", cm.name);
      Var y = cm.fn(a, b);
      CHECK(y.dtype() == t);
      CHECK(y.shape() == Shape{11});
      std::vector<double> got = eval(y).to(DType::f64).to_vector();
      for (std::size_t i = 0; i < av.size(); ++i) {
        INFO("element ", i, ": ", av[i], " vs ", bv[i]);
        CHECK(got[i] == (cm.want(av[i], bv[i]) ? 1.0 : 0.0));
      }
      // the gradient is zero for both operands, of their shapes
      std::vector<Var> gr = grad(sum(cm.fn(a, b)), {a, b});
      CHECK(eval(gr[0]).to(DType::f64).to_vector() == std::vector<double>(11, 0.0));
      CHECK(eval(gr[1]).to(DType::f64).to_vector() == std::vector<double>(11, 0.0));
    }
    // spelled out: NaN is neither greater, less nor equal (not even to itself) but is not_equal; -0 == 0
    CHECK(eval(greater(a, b)).to(DType::f64).to_vector()[3] == 0.0);
    CHECK(eval(less_equal(a, b)).to(DType::f64).to_vector()[3] == 0.0);
    CHECK(eval(equal(a, b)).to(DType::f64).to_vector()[8] == 0.0);
    CHECK(eval(not_equal(a, b)).to(DType::f64).to_vector()[8] == 1.0);
    CHECK(eval(equal(a, b)).to(DType::f64).to_vector()[6] == 1.0);
    CHECK(eval(equal(a, b)).to(DType::f64).to_vector()[4] == 1.0);  // inf == inf
  }
  // broadcasting as maximum: [3,1] against [4] -> [3,4]
  PGraph g;
  Var col = g.input(f64s({-1, 0.5, 2}, {3, 1})), row = g.input(f64s({0, 1, -2, 0.5}, {4}));
  Var y = greater_equal(col, row);
  REQUIRE(y.shape() == Shape{3, 4});
  std::vector<double> got = eval(y).to_vector();
  const double cv[] = {-1, 0.5, 2}, rv[] = {0, 1, -2, 0.5};
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 4; ++j) CHECK(got[i * 4 + j] == (cv[i] >= rv[j] ? 1.0 : 0.0));
  std::vector<Var> gr = grad(sum(mul(y, col)), {col, row});  // d/dcol = the mask's row sums; d/drow = 0
  CHECK(eval(gr[0]).to_vector() == std::vector<double>{1, 3, 4});
  CHECK(eval(gr[1]).to_vector() == std::vector<double>(4, 0.0));
  // errors name the op and both shapes
  EXPECT_ERROR(greater(col, g.input(f64s({1, 2}, {2, 1}))), "greater: shapes do not broadcast: a f64[3,1] vs b f64[2,1]");
  EXPECT_ERROR(not_equal(col, g.input(Tensor::ones({3, 1}, DType::f32))), "not_equal", "dtype mismatch",
               "a f64[3,1] vs b f32[3,1]");
  EXPECT_ERROR(less(g.input(index({1, 2}, {2})), g.input(index({1, 2}, {2}))), "less", "a must be f32 or f64, got i64");
}

TEST_CASE("edge: where selects; a NaN or inf in the branch not taken reaches neither the value nor the gradient") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType t : {DType::f64, DType::f32}) {
    INFO(dtype_name(t));
    PGraph g;
    // cond: NaN counts as true (nonzero), -0 as false
    Var c = g.input(f64s({1, 0, 1, 0, nan, -0.0, 2}, {7}).to(t));
    Var a = g.input(f64s({1, nan, 2, inf, 3, -inf, -4}, {7}).to(t));
    Var b = g.input(f64s({nan, 5, inf, 6, -inf, 7, nan}, {7}).to(t));
    Var y = where(c, a, b);
    CHECK(y.dtype() == t);
    CHECK(eval(y).to(DType::f64).to_vector() == std::vector<double>{1, 5, 2, 6, 3, 7, -4});
    // gradients: dout where taken, exactly 0 elsewhere, even where the seed there is inf or NaN
    Var seed = g.input(f64s({1, inf, 3, nan, 5, 6, 7}, {7}).to(t));
    std::vector<Var> gr = grad(y, {a, b, c}, seed);
    std::vector<double> ga = eval(gr[0]).to(DType::f64).to_vector(), gb = eval(gr[1]).to(DType::f64).to_vector();
    std::vector<double> gc = eval(gr[2]).to(DType::f64).to_vector();
    const double want_a[] = {1, 0, 3, 0, 5, 0, 7}, want_b[] = {0, inf, 0, nan, 0, 6, 0};
    for (std::size_t i = 0; i < 7; ++i) {
      INFO("element ", i);
      CHECK(ga[i] == want_a[i]);
      if (std::isnan(want_b[i])) CHECK(std::isnan(gb[i]));
      else CHECK(gb[i] == want_b[i]);
      CHECK(gc[i] == 0.0);
    }
    // the safe-branch pattern: log where x > 0, 0 elsewhere, with the input selected too (log's own
    // backward divides by x): finite values and gradients at x = 0 and x < 0
    Var x = g.input(f64s({-1, 0, 2, -0.0}, {4}).to(t));
    Var pos = greater(x, scalar_like(x, 0));
    Var safe = where(pos, log(where(pos, x, 1.0)), 0.0);
    std::vector<double> sv = eval(safe).to(DType::f64).to_vector(), sg = eval(grad(sum(safe), {x})[0]).to(DType::f64).to_vector();
    CHECK(sv == std::vector<double>{0, 0, static_cast<double>(t == DType::f32 ? std::log(2.0f) : std::log(2.0)), 0});
    CHECK(sg == std::vector<double>{0, 0, 0.5, 0});
  }
}

TEST_CASE("edge: where broadcasts cond, a and b together (every input's turn), on poisoned outputs") {
  Rng rng(31);
  struct Shapes {
    Shape c, a, b;
  };
  const Shapes cases[] = {{{3, 1}, {2, 3, 4}, {4}},  {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}, {{1, 4}, {3, 1}, {2, 1, 1}},
                          {{2, 1, 4}, {}, {2, 3, 1}}, {{5}, {5}, {1}},                 {{}, {}, {}},
                          {{4, 1, 1}, {1, 3, 1}, {1, 1, 5}}, {{2, 0, 3}, {3}, {1}},    {{6, 1}, {6, 7}, {6, 7}}};
  for (const Shapes& s : cases) {
    INFO("cond ", s.c.str(), " a ", s.a.str(), " b ", s.b.str());
    Shape ab, out;
    REQUIRE(broadcast_shapes(s.a, s.b, ab));
    REQUIRE(broadcast_shapes(s.c, ab, out));
    PGraph g;
    Tensor ct = away_from_zero(s.c, rng), at = randn64(s.a, rng), bt = randn64(s.b, rng);
    Var c = g.input(ct), a = g.input(at), b = g.input(bt);
    Var y = where(greater(c, scalar_like(c, 0)), a, b);
    REQUIRE(y.shape() == out);
    Tensor w = randn64(out, rng);
    std::vector<Var> gr = grad(sum(mul(y, g.input(w))), {a, b, c});
    std::vector<double> yv = eval(y).to_vector(), ga = eval(gr[0]).to_vector(), gb = eval(gr[1]).to_vector();
    CHECK(eval(gr[2]).to_vector() == std::vector<double>(static_cast<std::size_t>(s.c.numel()), 0.0));
    // the reference: element by element through the output's index, by numpy's rules
    std::vector<double> cv = ct.to_vector(), av = at.to_vector(), bv = bt.to_vector(), wv = w.to_vector();
    std::vector<double> want_ga(av.size(), 0.0), want_gb(bv.size(), 0.0);
    auto flat = [&out](const Shape& in, std::int64_t i) {  // the element of `in` that output element i reads
      std::int64_t k = 0, stride = 1;
      for (int d = out.rank() - 1, e = in.rank() - 1; e >= 0; --d, --e) {
        const std::int64_t coord = i % out[d];  // i: the output index with the dims after d divided out
        k += (in[e] == 1 ? 0 : coord) * stride;
        stride *= in[e];
        i /= out[d];
      }
      return static_cast<std::size_t>(k);
    };
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      const bool take_a = cv[flat(s.c, i)] > 0;
      const std::size_t ia = flat(s.a, i), ib = flat(s.b, i);
      CHECK(yv[static_cast<std::size_t>(i)] == (take_a ? av[ia] : bv[ib]));
      (take_a ? want_ga[ia] : want_gb[ib]) += wv[static_cast<std::size_t>(i)];
    }
    for (std::size_t i = 0; i < ga.size(); ++i) CHECK(ga[i] == doctest::Approx(want_ga[i]).epsilon(1e-12));
    for (std::size_t i = 0; i < gb.size(); ++i) CHECK(gb[i] == doctest::Approx(want_gb[i]).epsilon(1e-12));
  }
}

TEST_CASE("edge: where(x > 0, x, 0) is relu, value and gradient, bit for bit") {
  Rng rng(37);
  for (DType t : {DType::f64, DType::f32}) {
    INFO(dtype_name(t));
    std::vector<double> xs = randn64({5, 8}, rng).to(t).to(DType::f64).to_vector();
    xs[3] = 0.0;
    xs[7] = -0.0;
    xs[11] = std::numeric_limits<double>::infinity();
    xs[12] = -std::numeric_limits<double>::infinity();
    PGraph g;
    Var x = g.input(f64s(xs, {5, 8}).to(t));
    Var r = relu(x), m = where(greater(x, scalar_like(x, 0)), x, 0.0);
    Tensor w = randn64({5, 8}, rng).to(t);
    Var gr = grad(sum(mul(r, g.input(w))), {x})[0], gm = grad(sum(mul(m, g.input(w))), {x})[0];
    CHECK(bitwise_equal(eval(m), eval(r)));
    CHECK(bitwise_equal(eval(gm), eval(gr)));
    // the number and operator forms: x > 0.0 is greater(x, 0); x <= y is less_equal
    CHECK(bitwise_equal(eval(where(x > 0.0, x, 0.0)), eval(r)));
    Var y = g.input(randn64({5, 8}, rng).to(t));
    CHECK(bitwise_equal(eval(x <= y), eval(less_equal(x, y))));
    CHECK(bitwise_equal(eval(x < 0.5), eval(less(x, scalar_like(x, 0.5)))));
    CHECK(bitwise_equal(eval(x >= y), eval(greater_equal(x, y))));
    CHECK(bitwise_equal(eval(not_equal(x, 0.0)), eval(not_equal(x, scalar_like(x, 0)))));
    CHECK(bitwise_equal(eval(0.5 > x), eval(x < 0.5)));  // a number on the left
    CHECK(bitwise_equal(eval(0.5 <= x), eval(greater_equal(x, 0.5))));
  }
  Graph g;
  EXPECT_ERROR(greater(Parameter::zeros({3}), 1.0), "greater", "Parameter [3]", "no graph");
}

TEST_CASE("edge: where's errors name where and the three shapes") {
  PGraph g;
  Var c = g.input(Tensor::ones({2}, DType::f64)), a = g.input(Tensor::ones({3}, DType::f64));
  Var b = g.input(Tensor::ones({4}, DType::f64));
  EXPECT_ERROR(where(c, a, b), "where: shapes do not broadcast: cond f64[2] vs a f64[3] vs b f64[4]");
  EXPECT_ERROR(where(g.input(Tensor::ones({2, 3}, DType::f64)), g.input(Tensor::ones({4, 1}, DType::f64)), 0.0),
               "where: shapes do not broadcast: cond f64[2,3] vs a f64[4,1] vs b f64[]");
  EXPECT_ERROR(where(g.input(Tensor::ones({3}, DType::f32)), a, a), "where", "dtype mismatch",
               "cond f32[3] vs a f64[3] vs b f64[3]");
  EXPECT_ERROR(where(g.input(index({1, 0, 1}, {3})), a, a), "where", "cond must be f32 or f64, got i64");
  EXPECT_ERROR(where(a, g.input(index({1, 0, 1}, {3})), 0.0), "where", "a must be f32 or f64, got i64");
  EXPECT_ERROR(where(a, 1.0, g.input(Tensor::ones({3}, DType::bf16))), "where", "b must be f32 or f64, got bf16");
  Parameter p = Parameter::zeros({3}, DType::f64), q = Parameter::zeros({3}, DType::f64);
  EXPECT_ERROR(where(p, q, 0.0), "where: neither cond nor a is a Var of a graph", "g.param(p)");
  EXPECT_ERROR(where(p, q, Parameter::zeros({1}, DType::f64)), "where: every input is a Parameter",
               "cond f64[3] vs a f64[3] vs b f64[1]");
  EXPECT_ERROR(where(c, Var{}, 0.0), "where: input a is an undefined Var");
}

TEST_CASE("edge: a Parameter read only through a comparison or as where's cond gets no gradient, as through detach") {
  Rng rng(41);
  Tensor xt = randn64({4, 3}, rng);
  for (const Policy& pol : {policy::keep_all(), policy::sqrt_n()}) {
    Parameter u = Parameter::randn({4, 3}, rng, 1.0, DType::f64), v = Parameter::randn({4, 3}, rng, 1.0, DType::f64);
    // u only in masks, v differentiably: v's gradient, none for u
    {
      Graph g;
      Var x = g.input(xt), pu = g.param(u);
      Var mask = greater(pu, scalar_like(pu, 0));
      backward(sum(mul(where(mask, x, 0.0), g.param(v))) + sum(where(pu, x, mul(x, x))), pol);
      CHECK_FALSE(u.has_fresh_grad());
      CHECK_FALSE(u.has_grad());
      REQUIRE(v.has_fresh_grad());
      std::vector<double> uv = u.value().to_vector(), xv = xt.to_vector(), gv = v.grad().to_vector();
      for (std::size_t i = 0; i < uv.size(); ++i) CHECK(gv[i] == (uv[i] > 0 ? xv[i] : 0.0));
    }
    // only masks: the error backward gives for detach, naming both
    Graph g2;
    Var pu = g2.param(u);
    EXPECT_ERROR(backward(sum(less(pu, scalar_like(pu, 0.5))), pol),
                 "does not depend on any Parameter (other than through detach, a comparison or where's cond");
    EXPECT_ERROR(backward(sum(where(pu, g2.input(xt), 1.0)), pol), "does not depend on any Parameter");
    // grad() and backward_wrt: zeros, no error (as through detach)
    CHECK(eval(grad(sum(equal(pu, pu)), {pu})[0]).to_vector() == std::vector<double>(12, 0.0));
    Var xi = g2.input(xt);
    Report r = backward_wrt(sum(greater(xi, scalar_like(xi, 0))), {xi}, pol);
    CHECK(r.grads[0].to_vector() == std::vector<double>(12, 0.0));
    // read through a mask and differentiably: the differentiable path's gradient (relu's)
    Graph g3;
    Var p3 = g3.param(u);
    u.zero_grad();
    backward(sum(where(greater(p3, scalar_like(p3, 0)), p3, 0.0)), pol);
    REQUIRE(u.has_fresh_grad());
    std::vector<double> uv = u.value().to_vector(), gu = u.grad().to_vector();
    for (std::size_t i = 0; i < uv.size(); ++i) CHECK(gu[i] == (uv[i] > 0 ? 1.0 : 0.0));
  }
}
