// Edge values in the core ops' numbers (not their errors: tests/edge_input.cpp):
// empty products, NaN through row reductions and activations, 0^0, the
// saturation of f32 tanh, and f64 -> f16 / bf16 in one rounding.
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
    EXPECT_ERROR(backward(sum(detach(g5.param(u))), pol), "does not depend on any Parameter (other than through detach)");
  }
}
