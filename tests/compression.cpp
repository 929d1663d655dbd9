// Activation compression: kept values stored as f16/bf16 between forward and
// backward. Lossy by design: the test bounds the gradient error it causes,
// and checks that the memory it saves is predicted exactly.
#include <doctest/doctest.h>

#include <cmath>

#include "ad/ad.hpp"

namespace {
struct Net {
  std::vector<ad::Parameter> w;
  explicit Net(ad::Rng& rng) {
    for (int i = 0; i < 10; ++i) w.push_back(ad::Parameter::randn({32, 32}, rng, 0.2));
  }
  ad::Var loss(ad::Graph& g, const ad::Tensor& x) const {
    ad::Var h = g.input(x);
    for (const auto& p : w) h = ad::tanh(ad::matmul(h, p));
    return ad::mean(ad::mul(h, h));
  }
  std::vector<std::vector<double>> grads() const {
    std::vector<std::vector<double>> v;
    for (const auto& p : w) { v.push_back(p.grad().to_vector()); p.zero_grad(); }
    return v;
  }
};
double max_rel_err(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double num = 0, den = 0;
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      num += (a[i][j] - b[i][j]) * (a[i][j] - b[i][j]);
      den += b[i][j] * b[i][j];
    }
    worst = std::max(worst, std::sqrt(num / den));
  }
  return worst;
}
}  // namespace

TEST_CASE("compression: bf16/f16 checkpoints cut memory, predicted exactly, with bounded gradient error") {
  ad::Rng rng(17);
  Net net(rng);
  ad::Tensor x = ad::Tensor::randn({64, 32}, rng);
  ad::Graph g0;
  ad::Report base = ad::backward(net.loss(g0, x), ad::policy::sqrt_n());
  auto exact = net.grads();
  struct Case { ad::DType t; double bound; };
  // relative L2 error per parameter gradient; bf16 keeps 8 mantissa bits, f16 11
  for (Case c : {Case{ad::DType::bf16, 2e-2}, Case{ad::DType::f16, 3e-3}}) {
    CAPTURE(ad::dtype_name(c.t));
    for (const ad::Policy& pol : {ad::policy::sqrt_n().compressed(c.t), ad::policy::keep_all().compressed(c.t)}) {
      ad::Graph g;
      ad::Report r = ad::backward(net.loss(g, x), pol);
      CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
      CHECK(r.policy.find(ad::dtype_name(c.t)) != std::string::npos);
      auto got = net.grads();
      double err = max_rel_err(got, exact);
      CHECK(err > 0);  // lossy: something changed
      CHECK(err <= c.bound);
      if (pol.kind == ad::Policy::Kind::sqrt_n) {
        CHECK(r.kept_bytes < base.kept_bytes);
        CHECK(r.measured_peak_bytes <= base.measured_peak_bytes);
        CHECK(ad::explain(*r.plan).find("stored compressed") != std::string::npos);
      }
    }
  }
  CHECK_THROWS_AS(ad::policy::sqrt_n().compressed(ad::DType::f64), ad::Error);
  CHECK_THROWS_AS(ad::policy::budget(1 << 20).compressed(ad::DType::bf16), ad::Error);
}

// max's backward finds the maximum again from the x it reads: with x stored
// rounded (or recomputed exactly while y came from the rounded copy), a test
// against the forward's y matched no element and every gradient was zero.
TEST_CASE("compression: max keeps its gradient when its input is stored rounded") {
  ad::Parameter p = ad::Parameter::zeros({4});
  float* v = p.value().data<float>();
  v[0] = 0.1f, v[1] = 0.7f, v[2] = 0.3f, v[3] = -0.2f;
  for (ad::Policy pol : {ad::policy::keep_all(), ad::policy::keep_all().compressed(ad::DType::bf16),
                         ad::policy::keep_all().compressed(ad::DType::f16)}) {
    ad::Graph g;
    ad::backward(ad::max(ad::mul_scalar(g.param(p), 3.0)), pol);
    INFO(pol.name());
    CHECK(p.grad().to_vector() == std::vector<double>{0, 3, 0, 0});
    p.zero_grad();
  }
  // a net where the max is recomputed from the compressed copy and its input recomputed exactly
  ad::Rng rng(3);
  ad::Parameter w = ad::Parameter::randn({8, 8}, rng, 0.3);
  ad::Tensor x = ad::Tensor::randn({4, 8}, rng);
  std::vector<double> ref;
  for (ad::Policy pol : {ad::policy::sqrt_n(), ad::policy::sqrt_n().compressed(ad::DType::bf16),
                         ad::policy::uniform(2).compressed(ad::DType::f16), ad::policy::uniform(3)}) {
    ad::Graph g;
    ad::Var loss = ad::sum(ad::max(ad::dropout(ad::tanh(ad::matmul(g.input(x), w)), 0.5, 7, 0), {1}));
    ad::backward(loss, pol);
    INFO(pol.name());
    const std::vector<double> gr = w.grad().to_vector();
    w.zero_grad();
    if (ref.empty()) {
      ref = gr;
      double n2 = 0;
      for (double e : ref) n2 += e * e;
      REQUIRE(n2 > 1.0);
      continue;
    }
    CHECK(max_rel_err({gr}, {ref}) < 2e-2);
  }
}

// f16 holds at most 65504: a kept activation above it became infinite, and
// its gradients with it, silently. The compress step now refuses it.
TEST_CASE("compression: a value beyond f16's range is an error naming it, not an infinite gradient") {
  ad::Parameter w = ad::Parameter::zeros({1, 4});
  for (int i = 0; i < 4; ++i) w.value().data<float>()[i] = 10.0f + static_cast<float>(i);  // exp: 2.2e4 .. 4.4e5
  auto run = [&](const ad::Policy& pol) {
    ad::Graph g;
    ad::Var e = ad::exp(ad::mul_scalar(g.param(w), 1.0));
    ad::backward(ad::sum(ad::mul(e, e)), pol);
  };
  CHECK_THROWS_WITH_AS(run(ad::policy::keep_all().compressed(ad::DType::f16)),
                       doctest::Contains("to f16: 2 finite elements are beyond f16's range (largest finite 65504)"),
                       ad::Error);
  CHECK(!w.has_grad());  // the failed step left no gradient
  run(ad::policy::keep_all().compressed(ad::DType::bf16));  // bf16 holds them (to its precision)
  const std::vector<double> gr = w.grad().to_vector();
  for (int i = 0; i < 4; ++i) {
    const double want = 2 * std::exp(2.0 * (10.0 + i));
    CHECK(std::isfinite(gr[static_cast<std::size_t>(i)]));
    CHECK(std::abs(gr[static_cast<std::size_t>(i)] - want) < 2e-2 * want);
  }
}
