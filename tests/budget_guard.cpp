// The executor's budget guard: when a schedule's real sizes exceed its budget
// (here: a keep_all schedule run under half its peak), the executor evicts
// (DTR's rule) and recomputes on demand instead of exceeding the budget.
#include <doctest/doctest.h>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"

namespace {
struct Net {
  std::vector<ad::Parameter> w;
  explicit Net(ad::Rng& rng) {
    for (int i = 0; i < 12; ++i) w.push_back(ad::Parameter::randn({16, 16}, rng, 0.3, ad::DType::f64));
  }
  ad::Var loss(ad::Graph& g, const ad::Tensor& x) const {
    ad::Var h = g.input(x);
    for (const auto& p : w) h = ad::tanh(ad::matmul(h, p));
    return ad::sum(h);
  }
  std::vector<ad::Tensor> grads() const {
    std::vector<ad::Tensor> v;
    for (const auto& p : w) { v.push_back(p.grad().clone()); p.zero_grad(); }
    return v;
  }
};
}  // namespace

TEST_CASE("budget guard: the executor evicts and recomputes rather than exceed a too-small budget") {
  ad::Rng rng(5);
  Net net(rng);
  ad::Tensor x = ad::Tensor::randn({8, 16}, rng, ad::DType::f64);
  ad::Graph g0;
  ad::Report base = ad::backward(net.loss(g0, x));
  auto expect = net.grads();

  ad::Graph g;
  ad::Var loss = net.loss(g, x);
  ad::Plan p = ad::plan_backward(loss);  // keep_all: peak = base peak
  REQUIRE(p.schedule.predicted_peak_bytes == base.predicted_peak_bytes);
  p.schedule.budget_bytes = base.predicted_peak_bytes / 2;  // the plan no longer fits
  ad::RunStats st = ad::execute(*p.graph, p.schedule);
  CHECK(st.measured_peak_bytes <= p.schedule.budget_bytes);
  CHECK(st.evictions > 0);
  CHECK(st.recomputed_nodes > 0);
  auto got = net.grads();
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(ad::bitwise_equal(got[i], expect[i]));

  // a budget no schedule can meet is an error, not an overrun
  ad::Graph g2;
  ad::Plan p2 = ad::plan_backward(net.loss(g2, x));
  p2.schedule.budget_bytes = 8;
  CHECK_THROWS_AS(ad::execute(*p2.graph, p2.schedule), ad::Error);
}
