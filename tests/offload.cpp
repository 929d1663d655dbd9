// Host offload: kept forward values go to host memory between the forward
// pass and their use in backward (Step offload / prefetch). Exact: gradients
// are bitwise equal to the same policy without offload, and the graph's peak
// (the device's, on a GPU) is predicted to the byte. The GPU run of the same
// checks is in tests/cuda.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"

namespace {
struct Net {
  std::vector<ad::Parameter> w;
  explicit Net(ad::Rng& rng) {
    for (int i = 0; i < 12; ++i) w.push_back(ad::Parameter::randn({32, 32}, rng, 0.2));
  }
  // a tanh MLP with a skip connection and dropout, so kept values include
  // matmul outputs, activations and a dropout mask's product
  ad::Var loss(ad::Graph& g, const ad::Tensor& x) const {
    ad::Var h = g.input(x);
    for (std::size_t i = 0; i < w.size(); ++i) {
      ad::Var z = ad::tanh(ad::matmul(h, w[i]));
      if (i % 4 == 3) z = ad::dropout(z, 0.25, 1000 + i, 0);
      h = i % 2 ? ad::add(h, z) : z;
    }
    return ad::mean(ad::mul(h, h));
  }
  std::vector<std::vector<double>> grads() const {
    std::vector<std::vector<double>> v;
    for (const auto& p : w) {
      v.push_back(p.grad().to_vector());
      p.zero_grad();
    }
    return v;
  }
};

std::int64_t count(const ad::Schedule& s, ad::Step::Kind k) {
  std::int64_t n = 0;
  for (const auto& st : s.steps) n += st.kind == k;
  return n;
}
}  // namespace

TEST_CASE("offload: gradients bitwise equal, peak predicted exactly and lower, for every keep-set policy") {
  ad::Rng rng(5);
  Net net(rng);
  ad::Tensor x = ad::Tensor::randn({48, 32}, rng);
  std::vector<ad::Policy> policies = {ad::policy::keep_all(), ad::policy::sqrt_n(), ad::policy::uniform(3),
                                      ad::policy::selective(ad::save_matmuls)};
  for (const ad::Policy& base : policies) {
    CAPTURE(base.name());
    ad::Graph g0;
    ad::Report plain = ad::backward(net.loss(g0, x), base);
    auto expect = net.grads();
    const ad::Policy off = base.offloaded();
    for (int step = 0; step < 2; ++step) {  // the second step's plan comes from the cache
      ad::Graph g;
      ad::Report r = ad::backward(net.loss(g, x), off);
      CHECK(r.plan_cached == (step == 1));
      CHECK(net.grads() == expect);  // bit for bit
      CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
      CHECK(r.policy.find("+offload") != std::string::npos);
      const ad::Schedule& s = r.plan->schedule;
      const auto offloads = count(s, ad::Step::Kind::offload);
      CHECK(offloads > 0);
      CHECK(count(s, ad::Step::Kind::prefetch) == offloads);  // each comes back once, for backward
      CHECK(r.offload_peak_bytes > 0);
      CHECK(r.offload_peak_bytes == s.offload_peak_bytes);
      // the values kept for backward live on the host: fewer graph bytes held
      // at the loss, and the peak no higher (lower where keeping dominated it)
      CHECK(r.kept_bytes < plain.kept_bytes);
      CHECK(r.measured_peak_bytes <= plain.measured_peak_bytes);
      if (base.kind == ad::Policy::Kind::keep_all) CHECK(r.measured_peak_bytes < plain.measured_peak_bytes);
      CHECK(r.recomputed_nodes == plain.recomputed_nodes);  // offload changes where values live, not what is computed
      CHECK(ad::explain(*r.plan).find("offloaded to host") != std::string::npos);
      CHECK(ad::to_string(r).find("offloaded to host memory") != std::string::npos);
    }
  }
}

TEST_CASE("offload: each prefetch is queued one compute step before its first reader") {
  ad::Rng rng(6);
  Net net(rng);
  ad::Tensor x = ad::Tensor::randn({16, 32}, rng);
  ad::Graph g;
  ad::Var loss = net.loss(g, x);
  ad::Plan p = ad::plan_backward(loss, ad::policy::keep_all().offloaded());
  const auto& st = p.schedule.steps;
  const ad::GraphImpl& gi = *p.graph;
  std::int64_t prefetches = 0, hoisted = 0;
  for (std::size_t i = 0; i < st.size(); ++i) {
    if (st[i].kind != ad::Step::Kind::prefetch) continue;
    ++prefetches;
    // the first compute after it that reads the node
    std::size_t j = i + 1;
    auto reads = [&](std::size_t k) {
      if (st[k].kind != ad::Step::Kind::compute) return false;
      for (auto in : gi.node(st[k].node).inputs)
        if (in == st[i].node) return true;
      return false;
    };
    while (j < st.size() && !reads(j)) ++j;
    REQUIRE(j < st.size());  // prefetched for a reader
    std::int64_t computes_between = 0;
    for (std::size_t k = i + 1; k < j; ++k) computes_between += st[k].kind == ad::Step::Kind::compute;
    hoisted += computes_between >= 1;
    // nothing reads it between its offload and its prefetch
    for (std::size_t k = 0; k < i; ++k)
      if (st[k].kind == ad::Step::Kind::offload && st[k].node == st[i].node)
        for (std::size_t m = k + 1; m < i; ++m) CHECK_FALSE(reads(m));
  }
  CHECK(prefetches > 0);
  CHECK(hoisted == prefetches);
}

TEST_CASE("offload: recompute on demand after backward, tracing, and bad use") {
  ad::Rng rng(7);
  Net net(rng);
  ad::Tensor x = ad::Tensor::randn({8, 32}, rng);
  ad::Graph g0;
  ad::Var l0 = net.loss(g0, x);
  ad::backward(l0, ad::policy::keep_all());
  net.grads();

  ad::Graph g;
  ad::Var h = ad::tanh(ad::matmul(g.input(x), net.w[0]));
  ad::Var loss = ad::mean(ad::mul(ad::tanh(ad::matmul(h, net.w[1])), h));
  ad::Trace trace;
  g.record(&trace);
  ad::Report r = ad::backward(loss, ad::policy::keep_all().offloaded());
  g.record(nullptr);
  CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  std::int64_t offs = 0, pres = 0;
  for (const auto& e : trace.events()) {
    offs += e.kind == ad::TraceEvent::Kind::offload;
    pres += e.kind == ad::TraceEvent::Kind::prefetch;
  }
  CHECK(offs > 0);
  CHECK(pres == offs);
  // h was offloaded and freed after its last use: asking for it recomputes it
  ad::Graph g2;
  ad::Var h2 = ad::tanh(ad::matmul(g2.input(x), net.w[0]));
  CHECK(h.value().to_vector() == ad::eval(h2).to_vector());
  net.grads();

  CHECK_THROWS_AS(ad::policy::budget(1 << 20).offloaded(), ad::Error);
  CHECK_THROWS_AS(ad::policy::optimal_chain(4).offloaded(), ad::Error);
  CHECK_THROWS_AS(ad::policy::sqrt_n().offloaded().compressed(ad::DType::bf16), ad::Error);
  CHECK_THROWS_AS(ad::policy::sqrt_n().compressed(ad::DType::bf16).offloaded(), ad::Error);
}

TEST_CASE("offload: hand-made schedules that read an offloaded value are rejected") {
  ad::Graph g;
  ad::Rng rng(8);
  ad::Var x = g.input(ad::Tensor::randn({4, 5}, rng));
  ad::Var a = ad::tanh(x);  // 80 B
  ad::Var b = ad::exp(a);   // 80 B
  ad::Var c = ad::sum(b);   // 4 B
  ad::GraphImpl& gi = g.impl();
  using K = ad::Step::Kind;
  ad::Schedule ok;
  ok.steps = {{K::compute, a.id()}, {K::offload, a.id()}, {K::prefetch, a.id()}, {K::compute, b.id()},
              {K::free, a.id()},    {K::compute, c.id()}, {K::free, b.id()}};
  ok.targets = {c.id()};
  CHECK(ad::simulate_peak(gi, ok) == 160);  // a and b
  ad::RunStats st = ad::execute(gi, ok);
  CHECK(st.measured_peak_bytes == 160);
  CHECK(st.offload_peak_bytes == 80);
  const float want = c.value().item();

  ad::Graph g2;
  ad::Var x2 = g2.input(ad::Tensor::randn({4, 5}, rng));
  ad::Var a2 = ad::tanh(x2);
  ad::Var b2 = ad::exp(a2);
  ad::Schedule bad;
  bad.steps = {{K::compute, a2.id()}, {K::offload, a2.id()}, {K::compute, b2.id()}};
  bad.targets = {b2.id()};
  CHECK_THROWS_AS(ad::simulate_peak(g2.impl(), bad), ad::Error);
  CHECK_THROWS_AS(ad::execute(g2.impl(), bad), ad::Error);
  ad::Schedule twice;
  twice.steps = {{K::compute, a2.id()}, {K::prefetch, a2.id()}};
  CHECK_THROWS_AS(ad::simulate_peak(g2.impl(), twice), ad::Error);
  CHECK_THROWS_AS(ad::execute(g2.impl(), twice), ad::Error);
  // a failed run keeps none of the values it computed
  CHECK_FALSE(a2.has_value());
  // an offloaded value that the schedule frees without bringing it back
  ad::Schedule drop;
  drop.steps = {{K::compute, a2.id()}, {K::offload, a2.id()}, {K::free, a2.id()}};
  CHECK(ad::simulate_peak(g2.impl(), drop) == 80);
  ad::RunStats ds = ad::execute(g2.impl(), drop);
  CHECK(ds.offload_peak_bytes == 80);
  CHECK(ds.measured_peak_bytes == 80);
  CHECK_FALSE(a2.has_value());
  CHECK(want == c.value().item());
}
