// Schedules and memory: the predicted peak equals the measured peak to the
// byte, recomputation is bit-identical, reports are consistent, gradients
// accumulate across backward() calls, and plan/simulate_peak/execute work
// with hand-made schedules.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cmath>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"
#include "test_util.hpp"

namespace {

using ad::DType;
using ad::Var;

ad::Tensor randn(const ad::Shape& s, std::uint64_t seed, DType t = DType::f32) {
  ad::Rng rng(seed);
  return ad::Tensor::randn(s, rng, t);
}

std::int64_t total_computes(const ad::Graph& g) {
  std::int64_t n = 0;
  for (const auto& nd : g.impl().nodes) n += nd.times_computed;
  return n;
}

// Parameters the value of `loss` depends on.
std::set<const ad::ParamState*> reachable_params(const Var& loss) {
  const ad::GraphImpl& g = *loss.graph();
  std::vector<char> seen(g.nodes.size(), 0);
  seen.at(static_cast<std::size_t>(loss.id())) = 1;
  std::set<const ad::ParamState*> out;
  for (std::int32_t id = loss.id(); id >= 0; --id) {
    if (!seen[static_cast<std::size_t>(id)]) continue;
    const ad::Node& nd = g.node(id);
    if (nd.op == ad::OpId::parameter) out.insert(nd.param.get());
    for (auto in : nd.inputs) seen[static_cast<std::size_t>(in)] = 1;
  }
  return out;
}

// backward() with every check that holds for any graph under keep_all.
ad::Report checked_backward(ad::Graph& g, const Var& loss, const Var& seed = {}) {
  const std::int64_t live = g.live_bytes(), computes = total_computes(g);
  const bool had_value = loss.has_value();
  ad::Report r = ad::backward(loss, ad::policy::keep_all(), seed);
  CHECK(r.policy == "keep_all");
  CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  CHECK(r.baseline_bytes == live);
  CHECK(r.computed_nodes == total_computes(g) - computes);
  CHECK(r.steps > r.computed_nodes);  // at least one accumulate step
  CHECK(r.recomputed_nodes <= r.computed_nodes);
  CHECK(r.measured_peak_bytes >= 0);
  // keep_all frees every value it computed, except the loss
  std::int64_t loss_bytes = had_value ? 0 : static_cast<std::int64_t>(loss.numel()) * static_cast<std::int64_t>(ad::dtype_size(loss.dtype()));
  if (loss.op() != ad::OpId::reshape) CHECK(g.live_bytes() == live + loss_bytes);
  CHECK(loss.has_value());
  return r;
}

// ---- graphs ----
struct Mlp {
  ad::Parameter w1, b1, w2, b2;
  Mlp(std::uint64_t seed, DType t) {
    ad::Rng rng(seed);
    w1 = ad::Parameter::randn({20, 64}, rng, 0.2, t);
    b1 = ad::Parameter::randn({64}, rng, 0.1, t);
    w2 = ad::Parameter::randn({64, 10}, rng, 0.2, t);
    b2 = ad::Parameter::randn({10}, rng, 0.1, t);
  }
  Var loss(ad::Graph& g, std::uint64_t seed, DType t) const {
    ad::Rng rng(seed);
    Var x = g.input(ad::Tensor::randn({32, 20}, rng, t));
    Var y = g.input(ad::Tensor::randint({32}, rng, 10));
    Var h = ad::relu(ad::matmul(x, w1) + g.param(b1));
    return ad::cross_entropy(ad::matmul(h, w2) + g.param(b2), y);
  }
  std::vector<ad::Parameter> params() const { return {w1, b1, w2, b2}; }
};

using ad::test::check_bitwise;
using ad::test::grads_of;
using ad::test::random_dag;
using ad::test::RandomDag;

}  // namespace

TEST_CASE("executor: predicted peak == measured peak, MLP") {
  for (DType t : {DType::f32, DType::f64}) {
    Mlp m(1, t);
    ad::Graph g;
    Var loss = m.loss(g, 2, t);
    ad::Report r = checked_backward(g, loss);
    CHECK(r.baseline_bytes == 0);
    CHECK(r.recomputed_nodes == 0);
    CHECK(r.measured_peak_bytes > 0);
    for (const auto& p : m.params()) CHECK(p.has_grad());
    // the two [32,64] activations (pre-relu sum and relu output) are live together at least once
    CHECK(r.measured_peak_bytes >= 2 * 32 * 64 * static_cast<std::int64_t>(ad::dtype_size(t)));
  }
}

TEST_CASE("executor: predicted peak == measured peak, deep tanh chain with shared weights") {
  ad::Rng rng(3);
  ad::Parameter w = ad::Parameter::randn({16, 16}, rng, 0.25), v = ad::Parameter::randn({16, 16}, rng, 0.25);
  ad::Graph g;
  Var h = g.input(ad::Tensor::randn({8, 16}, rng));
  for (int i = 0; i < 60; ++i) h = ad::tanh(ad::matmul(h, i % 3 ? w : v));
  Var loss = ad::mean(ad::mul(h, h));
  ad::Report r = checked_backward(g, loss);
  // keep_all keeps all 60 tanh outputs ([8,16] f32 = 512 B each) until backward reaches them
  CHECK(r.measured_peak_bytes >= 60 * 512);
  CHECK(w.has_grad());
  CHECK(v.has_grad());
}

TEST_CASE("executor: predicted peak == measured peak, reshape views") {
  ad::Rng rng(4);
  ad::Parameter w = ad::Parameter::randn({6, 5}, rng), w2 = ad::Parameter::randn({8, 5}, rng);
  ad::Graph g;
  Var x = g.input(ad::Tensor::randn({8, 6}, rng));
  Var h = ad::tanh(ad::matmul(x, w));             // [8,5]
  Var r1 = ad::reshape(h, {5, 8});                // view of a computed value
  Var r2 = ad::reshape(r1, {40});                 // view of a view
  Var z = ad::matmul(r1, w2);                     // [5,5]
  Var xr = ad::reshape(x, {-1});                  // view of an input leaf (user memory)
  Var wr = ad::reshape(g.param(w), {30});         // view of a parameter
  Var loss = ad::add(ad::add(ad::sum(ad::mul(r2, r2)), ad::sum(ad::reshape(z, {25}))),
                     ad::add(ad::sum(ad::sigmoid(xr)), ad::sum(ad::mul(wr, wr))));
  checked_backward(g, loss);
  CHECK(w.has_grad());
  CHECK(w2.has_grad());
  // a loss that is itself a view
  ad::Graph g2;
  Var v = ad::reshape(ad::sum(ad::tanh(ad::matmul(g2.input(ad::Tensor::randn({3, 6}, rng)), w))), {1, 1});
  checked_backward(g2, v, g2.input(ad::Tensor::ones({1, 1})));
}

TEST_CASE("executor: predicted peak == measured peak, shared subexpressions, max, dropout") {
  ad::Rng rng(5);
  ad::Parameter w = ad::Parameter::randn({7, 7}, rng), b = ad::Parameter::randn({7}, rng);
  ad::Graph g;
  Var x = g.input(ad::Tensor::randn({9, 7}, rng));
  Var a = ad::tanh(ad::matmul(x, w) + g.param(b));
  Var sq = a * a;
  Var c = ad::add(a, sq);
  Var d = ad::sigmoid(c) * a;
  Var m0 = ad::max(d, {0}, true), m1 = ad::max(d, {1}), mall = ad::max(c);
  Var dr = ad::dropout(ad::matmul(d, w), 0.4, rng);
  Var loss = ad::sum(d - m0) + ad::sum(m1) + mall + ad::mean(dr * a) + ad::sum(ad::matmul(sq, w));
  checked_backward(g, loss);
  CHECK(w.has_grad());
  CHECK(b.has_grad());
}

TEST_CASE("executor: predicted peak == measured peak on 60 seeded random DAGs") {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    CAPTURE(seed);
    // 1. fresh graph
    ad::Graph g1;
    RandomDag d1 = random_dag(g1, seed);
    ad::Report r1 = checked_backward(g1, d1.loss);
    CHECK(r1.baseline_bytes == 0);
    CHECK(r1.recomputed_nodes == 0);
    auto reach = reachable_params(d1.loss);
    for (const auto& p : d1.params)
      if (reach.count(p.state())) { CHECK(p.has_grad()); }
    std::vector<ad::Tensor> grads1 = grads_of(d1.params);
    // 2. the same graph again: values of the first run are recomputed, gradients accumulate
    ad::Report r2 = checked_backward(g1, d1.loss);
    CHECK(r2.baseline_bytes == static_cast<std::int64_t>(ad::dtype_size(d1.loss.dtype())));

    // 3. an identical graph where some values are present before backward
    //    (evaluated first; some are views whose base value was freed)
    ad::Graph g3;
    RandomDag d3 = random_dag(g3, seed);
    for (std::size_t i = 4; i < d3.pool.size(); i += 3) ad::eval(d3.pool[i]);
    ad::eval(d3.pool.back());
    checked_backward(g3, d3.loss);
    check_bitwise(grads_of(d3.params), grads1);

    // 4. an identical graph with outputs poisoned before every kernel: same bits
    ad::Graph g4;
    g4.impl().poison_outputs = true;
    RandomDag d4 = random_dag(g4, seed);
    checked_backward(g4, d4.loss);
    check_bitwise(grads_of(d4.params), grads1);
  }
}

TEST_CASE("executor: values present before the run (view of a freed base)") {
  ad::Rng rng(6);
  ad::Parameter w = ad::Parameter::randn({4, 6}, rng);
  ad::Graph g;
  Var x = g.input(ad::Tensor::randn({5, 4}, rng));
  Var h = ad::tanh(ad::matmul(x, w));  // [5,6]; tanh_backward reads h
  Var r = ad::reshape(h, {30});         // a view: keeps h's storage alive
  Var loss = ad::sum(ad::mul(r, r));
  ad::eval(r);                          // computes matmul, tanh, reshape; frees matmul and tanh
  CHECK(r.has_value());
  CHECK_FALSE(h.has_value());
  CHECK(g.live_bytes() == 5 * 6 * 4);
  // backward recomputes h into new memory while r still holds the old storage
  ad::Report rep = checked_backward(g, loss);
  CHECK(rep.baseline_bytes == 5 * 6 * 4);
  CHECK(rep.predicted_peak_bytes >= 2 * 5 * 6 * 4);
  CHECK(r.has_value());  // a value present before the run is left alone
}

TEST_CASE("executor: eval after backward recomputes bit-identically") {
  ad::Rng rng(7);
  ad::Parameter w = ad::Parameter::randn({6, 6}, rng);
  ad::Graph g;
  Var x = g.input(ad::Tensor::randn({4, 6}, rng));
  Var h = ad::dropout(ad::gelu(ad::matmul(x, w)), 0.5, rng);
  Var s = ad::softmax(ad::matmul(h, w));
  Var ln = ad::layer_norm(h, g.input(ad::Tensor::ones({6})), g.input(ad::Tensor::zeros({6})));
  Var loss = ad::sum(ad::mul(s, ln));
  ad::Tensor h0 = ad::eval(h).clone(), s0 = ad::eval(s).clone();
  CHECK(h0.storage()->allocator() == ad::default_allocator());  // the clones are not the graph's
  // drop both values with a hand-made schedule, then run backward
  ad::Schedule drop;
  drop.steps = {{ad::Step::Kind::free, h.id()}, {ad::Step::Kind::free, s.id()}};
  ad::execute(g.impl(), drop);
  CHECK_FALSE(h.has_value());
  CHECK(g.live_bytes() == 0);
  checked_backward(g, loss);
  CHECK_FALSE(h.has_value());  // freed by keep_all after its last use
  CHECK_FALSE(s.has_value());
  const std::int32_t before = g.impl().node(h.id()).times_computed;
  CHECK(ad::bitwise_equal(ad::eval(h), h0));
  CHECK(g.impl().node(h.id()).times_computed == before + 1);
  CHECK(ad::bitwise_equal(s.value(), s0));
}

TEST_CASE("executor: backward twice accumulates twice, and zeroing resets") {
  for (DType t : {DType::f64, DType::f32}) {
    Mlp m(11, t);
    ad::Graph g;
    Var loss = m.loss(g, 12, t);
    checked_backward(g, loss);
    std::vector<ad::Tensor> once = grads_of(m.params());
    const std::int64_t nodes = g.num_nodes();
    ad::Report r2 = checked_backward(g, loss);
    CHECK(g.num_nodes() == nodes);  // gradient nodes are reused, not rebuilt
    CHECK(r2.computed_nodes > 0);
    CHECK(r2.recomputed_nodes == 0);  // keep_all computes each node once per run (recomputations count within a run)
    CHECK(r2.baseline_bytes == static_cast<std::int64_t>(ad::dtype_size(t)));
    for (std::size_t i = 0; i < once.size(); ++i) {
      std::vector<double> a = once[i].to_vector(), b = m.params()[i].grad().to_vector();
      REQUIRE(a.size() == b.size());
      for (std::size_t j = 0; j < a.size(); ++j) CHECK(b[j] == 2 * a[j]);  // x + x == 2x exactly
    }
    for (const auto& p : m.params()) p.zero_grad();
    for (const auto& p : m.params()) {
      REQUIRE(p.has_grad());  // zero_grad keeps the buffer
      for (double v : p.grad().to_vector()) CHECK(v == 0);
    }
    checked_backward(g, loss);
    check_bitwise(grads_of(m.params()), once);
  }
}

TEST_CASE("executor: one backward node feeding several parameters, and a seed that is the result") {
  ad::Rng rng(13);
  ad::Parameter a = ad::Parameter::randn({3, 4}, rng), b = ad::Parameter::randn({3, 4}, rng);
  {
    ad::Graph g;
    Var loss = ad::sum(ad::add(g.param(a), b));  // d/da = d/db = the same ones node
    checked_backward(g, loss);
    REQUIRE(a.has_grad());
    REQUIRE(b.has_grad());
    CHECK(a.grad().to_vector() == std::vector<double>(12, 1.0));
    CHECK(b.grad().to_vector() == std::vector<double>(12, 1.0));
    checked_backward(g, loss);
    CHECK(a.grad().to_vector() == std::vector<double>(12, 2.0));
    CHECK(b.grad().to_vector() == std::vector<double>(12, 2.0));
  }
  a.zero_grad();
  {
    // y = a + 1: d(seed . y)/da is the seed itself, an input leaf that already holds its value
    ad::Graph g;
    ad::Tensor seed = randn({3, 4}, 14);
    Var y = ad::add_scalar(g.param(a), 1.0);
    Var sv_ = g.input(seed);
    checked_backward(g, y, sv_);
    CHECK(ad::bitwise_equal(a.grad(), seed));
    checked_backward(g, y, sv_);
    std::vector<double> sv = seed.to_vector(), gv = a.grad().to_vector();
    for (std::size_t i = 0; i < sv.size(); ++i) CHECK(gv[i] == 2 * sv[i]);
  }
}

TEST_CASE("executor: gradients go straight into zeroed or absent gradient buffers, and add otherwise") {
  // loss = sum(tanh(x W)): dW = x^T (...) is a [64,64] matmul whose only reader is the accumulation
  ad::Rng rng(21);
  ad::Parameter w = ad::Parameter::randn({64, 64}, rng, 0.1);
  ad::Tensor x = randn({8, 64}, 22);
  const std::int64_t wbytes = 64 * 64 * 4;
  auto step = [&](ad::Policy pol) {
    ad::Graph g;
    Var loss = ad::sum(ad::tanh(ad::matmul(g.input(x), g.param(w))));
    ad::Report r = ad::backward(loss, pol);
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    return r;
  };
  for (ad::Policy pol : {ad::policy::keep_all(), ad::policy::sqrt_n(), ad::policy::budget(1 << 20)}) {
    CAPTURE(pol.name());
    w.state()->grad = ad::Tensor{};
    ad::Report first = step(pol);  // no gradient yet: it becomes the node's output
    REQUIRE(w.has_grad());
    const ad::Tensor once = w.grad().clone();
    const void* buf = w.grad().raw();
    ad::Report accumulating = step(pol);  // holds a gradient: computed apart, then added
    CHECK(first.measured_peak_bytes < wbytes);          // dW never sat in the graph's memory
    CHECK(accumulating.measured_peak_bytes >= wbytes);  // here it did, before the add
    CHECK(w.grad().raw() == buf);
    {
      auto a = once.to_vector(), b = w.grad().to_vector();
      for (std::size_t i = 0; i < a.size(); ++i) CHECK(b[i] == 2 * a[i]);
    }
    w.zero_grad();
    ad::Report zeroed = step(pol);  // zeroed: written into the same buffer, no graph bytes for it
    CHECK(zeroed.measured_peak_bytes == first.measured_peak_bytes);
    CHECK(w.grad().raw() == buf);
    CHECK(ad::bitwise_equal(w.grad(), once));
  }
  // zero_grad then read: zeros (the fill is lazy); a later backward adds to what was read
  w.zero_grad();
  for (double v : w.grad().to_vector()) CHECK(v == 0);
  ad::Report after_read = step(ad::policy::keep_all());
  ad::Tensor once = w.grad().clone();
  // a zeroed gradient that the user changed through grad() before backward is added to, not overwritten
  w.zero_grad();
  float* gp = static_cast<float*>(const_cast<void*>(w.grad().raw()));
  gp[0] = 1000.0f;
  step(ad::policy::keep_all());
  CHECK(w.grad().to_vector()[0] == static_cast<double>(1000.0f + static_cast<float>(once.to_vector()[0])));
  CHECK(after_read.measured_peak_bytes > 0);
  // the gradient buffer read by the graph itself is never overwritten while it is read
  w.zero_grad();
  {
    ad::Graph g;
    Var gin = g.input(w.state()->grad);  // stale contents, read as they are
    Var loss = ad::add(ad::sum(ad::tanh(ad::matmul(g.input(x), g.param(w)))), ad::mul_scalar(ad::sum(gin), 0.0));
    ad::Report r = ad::backward(loss, ad::policy::keep_all());
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  }
  CHECK(ad::bitwise_equal(w.grad(), once));
}

TEST_CASE("executor: determinism across freshly built graphs (with dropout)") {
  auto step = [](std::uint64_t seed) {
    ad::Rng rng(seed);
    ad::Parameter w1 = ad::Parameter::randn({12, 24}, rng, 0.3), w2 = ad::Parameter::randn({24, 5}, rng, 0.3);
    ad::Parameter gamma = ad::Parameter::randn({24}, rng), beta = ad::Parameter::randn({24}, rng);
    ad::Graph g;
    Var x = g.input(ad::Tensor::randn({16, 12}, rng));
    Var y = g.input(ad::Tensor::randint({16}, rng, 5));
    Var h = ad::dropout(ad::gelu(ad::layer_norm(ad::matmul(x, w1), gamma, beta)), 0.3, rng);
    Var logits = ad::matmul(ad::add(h, ad::softmax(h)), w2);
    Var loss = ad::cross_entropy(logits, y) + ad::mul_scalar(ad::mean(ad::mul(g.param(w1), w1)), 0.01);
    ad::Report r = ad::backward(loss);
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    std::vector<ad::Tensor> out = grads_of({w1, w2, gamma, beta});
    out.push_back(loss.value().clone());
    return out;
  };
  std::vector<ad::Tensor> a = step(21), b = step(21), c = step(22);
  check_bitwise(a, b);
  CHECK_FALSE(ad::bitwise_equal(a[0], c[0]));
}

TEST_CASE("executor: hand-made schedules with plan, simulate_peak and execute") {
  ad::Graph g;
  ad::Tensor xt = randn({4, 5}, 31);
  Var x = g.input(xt);
  Var a = ad::tanh(x);                      // 80 B
  Var b = ad::exp(a);                       // 80 B
  Var c = ad::add(a, b);                    // 80 B
  Var r = ad::reshape(c, {20});             // view of c
  Var d = ad::sum(r);                       // 4 B
  ad::GraphImpl& gi = g.impl();
  using K = ad::Step::Kind;

  ad::Schedule s;
  s.steps = {{K::compute, a.id()}, {K::compute, b.id()}, {K::compute, c.id()}, {K::free, a.id()}, {K::free, b.id()},
             {K::compute, r.id()}, {K::free, c.id()}, {K::compute, d.id()}, {K::free, r.id()}};
  s.targets = {d.id()};
  CHECK(ad::simulate_peak(gi, s) == 240);
  ad::RunStats st = ad::execute(gi, s);
  CHECK(st.measured_peak_bytes == 240);
  CHECK(st.baseline_bytes == 0);
  CHECK(st.computed_nodes == 5);
  CHECK(st.recomputed_nodes == 0);
  CHECK(d.has_value());
  CHECK_FALSE(a.has_value());
  CHECK_FALSE(r.has_value());
  CHECK(g.live_bytes() == 4);
  double expect = 0;
  for (double v : xt.to_vector()) expect += static_cast<float>(std::tanh(static_cast<float>(v))) + std::exp(std::tanh(v));
  CHECK(d.value().item() == doctest::Approx(expect).epsilon(1e-5));

  // recompute a, twice without a free in between (the old value is released after the new one is made)
  ad::Schedule s2;
  s2.steps = {{K::compute, a.id()}, {K::compute, a.id()}, {K::compute, b.id()}, {K::free, a.id()}, {K::free, b.id()}};
  CHECK(ad::simulate_peak(gi, s2) == 160);
  st = ad::execute(gi, s2);
  CHECK(st.measured_peak_bytes == 160);
  CHECK(st.baseline_bytes == 4);
  CHECK(st.recomputed_nodes == 1);  // a computed twice in this run; b once
  CHECK(g.live_bytes() == 4);

  // a value the user still holds is not released by a free step
  ad::Tensor held = ad::eval(c);  // shares c's storage
  CHECK(g.live_bytes() == 84);
  ad::Schedule s3;
  s3.steps = {{K::free, c.id()}, {K::compute, a.id()}, {K::compute, b.id()}, {K::free, a.id()}, {K::free, b.id()}};
  CHECK(ad::simulate_peak(gi, s3) == 160);
  st = ad::execute(gi, s3);
  CHECK(st.measured_peak_bytes == 160);
  held = ad::Tensor();
  CHECK(g.live_bytes() == 4);

  // plan() for keep_all, then run it
  ad::Schedule p = ad::plan(gi, {c.id(), r.id()}, {}, ad::policy::keep_all());
  CHECK(p.predicted_peak_bytes == ad::simulate_peak(gi, p));
  st = ad::execute(gi, p);
  CHECK(st.measured_peak_bytes == p.predicted_peak_bytes);
  CHECK(c.has_value());
  CHECK(r.has_value());
  CHECK(r.value().same_storage(c.value()));
  CHECK_THROWS_AS(ad::plan(gi, {static_cast<std::int32_t>(g.num_nodes())}, {}, ad::policy::keep_all()), ad::Error);

  // gradients: plan with sinks, accumulate steps, workspace ops
  ad::Rng rng(32);
  ad::Parameter w = ad::Parameter::randn({5, 3}, rng);
  ad::Graph g2;
  Var h = ad::matmul(g2.input(xt), w);
  Var loss = ad::sum(ad::max(h, {1}));  // max_backward needs a workspace
  Var gw = ad::grad(loss, {g2.param(w)})[0];
  ad::Schedule q = ad::plan(g2.impl(), {loss.id()}, {ad::Sink{gw.id(), w}}, ad::policy::keep_all());
  int accumulates = 0;
  for (const auto& stp : q.steps) accumulates += stp.kind == K::accumulate;
  CHECK(accumulates == 1);
  REQUIRE(q.sinks.size() == 1);
  st = ad::execute(g2.impl(), q);
  CHECK(st.measured_peak_bytes == q.predicted_peak_bytes);
  REQUIRE(w.has_grad());
  CHECK_FALSE(gw.has_value());  // accumulated, then freed
  CHECK(ad::bitwise_equal(ad::eval(gw), w.grad()));

  // a schedule that computes a node before its input holds a value is rejected by both
  ad::Graph g3;
  Var u = ad::tanh(g3.input(xt));
  Var v = ad::exp(u);
  ad::Schedule bad;
  bad.steps = {{K::compute, v.id()}};
  CHECK_THROWS_AS(ad::simulate_peak(g3.impl(), bad), ad::Error);
  try {
    ad::execute(g3.impl(), bad);
    FAIL("no throw");
  } catch (const ad::Error& e) {
    std::string m = e.what();
    CHECK(m.find("exp") != std::string::npos);
    CHECK(m.find("tanh") != std::string::npos);
  }
  ad::Schedule leaf;
  leaf.steps = {{K::compute, 0}};
  CHECK_THROWS_AS(ad::execute(g3.impl(), leaf), ad::Error);
  ad::Schedule acc;
  acc.steps = {{K::accumulate, u.id(), 0}};
  acc.sinks = {w};
  CHECK_THROWS_AS(ad::execute(g3.impl(), acc), ad::Error);  // u holds no value
}

TEST_CASE("executor: elementwise ops write over inputs that die there, with the same bits and a lower peak") {
  // h = sigmoid(exp(tanh(x W) * 0.5) + b): each elementwise op's input dies at it
  ad::Rng rng(31);
  ad::Parameter w = ad::Parameter::randn({32, 32}, rng, 0.2), b = ad::Parameter::zeros({32});
  ad::Tensor x = randn({16, 32}, 32);
  const std::int64_t act = 16 * 32 * 4;
  auto step = [&](bool reuse) {
    w.zero_grad();
    b.zero_grad();
    ad::Graph g;
    Var h = ad::matmul(g.input(x), g.param(w));
    for (int i = 0; i < 6; ++i) h = ad::add(ad::exp(ad::mul_scalar(ad::tanh(h), 0.5)), b);
    Var loss = ad::sum(ad::neg(ad::sigmoid(h)));
    ad::Policy pol = ad::policy::keep_all();
    pol.reuse_buffers = reuse;
    ad::Report r = ad::backward(loss, pol);
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    std::int64_t reused = 0;
    for (const auto& st : r.plan->schedule.steps) reused += st.reuse >= 0;
    return std::make_tuple(r.measured_peak_bytes, reused, w.grad().clone(), b.grad().clone());
  };
  auto [peak_off, n_off, w_off, b_off] = step(false);
  auto [peak_on, n_on, w_on, b_on] = step(true);
  CHECK(n_off == 0);
  CHECK(n_on > 0);
  CHECK(peak_on < peak_off);
  CHECK(peak_off - peak_on >= act - 8);  // an activation-sized transient saved (the peak moves by a scalar)
  CHECK(ad::bitwise_equal(w_on, w_off));
  CHECK(ad::bitwise_equal(b_on, b_off));
  MESSAGE("keep_all peak ", peak_off, " B without reuse, ", peak_on, " B with (", n_on, " compute steps reuse a buffer)");
}

TEST_CASE("executor: backward calls on two threads that reach one Parameter both accumulate (they take turns)") {
  // each backward holds its graph's parameters from planning to the end of its run; without that, one
  // thread's gradient was lost in about a third of such rounds
  ad::Rng rng(1);
  ad::Tensor x = ad::Tensor::randn({1, 64}, rng, ad::DType::f64);
  double want = 0;
  for (double v : x.to_vector()) want += v;
  want *= 64;  // d sum(x W) / dW summed over W's elements, per backward
  ad::Parameter w = ad::Parameter::zeros({64, 64}, ad::DType::f64), other = ad::Parameter::zeros({64, 64}, ad::DType::f64);
  const int rounds = 200;
  std::atomic<int> go{0};
  auto run = [&](bool with_other) {
    ++go;
    while (go < 2) std::this_thread::yield();
    for (int r = 0; r < rounds; ++r) {
      ad::Graph g;
      ad::Var y = ad::matmul(g.input(x), w);
      if (with_other) y = ad::add(y, ad::matmul(g.input(x), other));  // two shared parameters, any order
      ad::backward(ad::sum(y));
    }
  };
  std::thread a(run, false), b(run, true);
  a.join();
  b.join();
  double s = 0;
  for (double v : w.grad().to_vector()) s += v;
  CHECK(s == doctest::Approx(2 * rounds * want).epsilon(1e-9));
  double so = 0;
  for (double v : other.grad().to_vector()) so += v;
  CHECK(so == doctest::Approx(rounds * want).epsilon(1e-9));
}

TEST_CASE("executor: a leaf written after the graph computed from it makes those values stale (recomputed)") {
  // y = p * p computed at p = 2, then p set to 3 in place: backward must see 3 everywhere
  // (before: loss 4 from the kept y, gradient 6 from the new p)
  {
    ad::Graph g;
    ad::Parameter p(ad::Tensor::full({1}, 2.0, DType::f64));
    Var y = ad::mul(g.param(p), p);
    Var loss = ad::sum(y);
    CHECK(y.value().item() == 4.0);
    p.value().fill(3.0);
    ad::backward(loss);
    CHECK(loss.value().item() == 9.0);
    CHECK(p.grad().item() == 6.0);
    CHECK(y.value().item() == 9.0);
  }
  // an input written through data<T>() between two evals
  {
    ad::Graph g;
    ad::Tensor t = ad::Tensor::full({2}, 1.0, DType::f64);
    Var s = ad::sum(ad::mul(g.input(t), g.input(t)));
    CHECK(s.value().item() == 2.0);
    const std::int64_t before = total_computes(g);
    CHECK(s.value().item() == 2.0);
    CHECK(total_computes(g) == before);  // nothing written: nothing recomputed
    t.data<double>()[0] = 3.0;
    CHECK(s.value().item() == 10.0);
  }
  // backward, an optimizer step, backward again on the same graph: loss and gradients are those of a
  // fresh graph at the new weights (the second run recomputes the forward)
  for (DType t : {DType::f64, DType::f32}) {
    Mlp m(13, t);
    ad::Graph g;
    Var loss = m.loss(g, 12, t);
    ad::backward(loss);
    ad::nn::SGD opt(m.params(), {.lr = 0.1});
    opt.step();
    for (const auto& p : m.params()) p.zero_grad();
    ad::backward(loss);
    const double again = loss.value().item();
    std::vector<ad::Tensor> g_again = grads_of(m.params());
    for (const auto& p : m.params()) p.zero_grad();
    ad::Graph fresh;
    Var l2 = m.loss(fresh, 12, t);
    ad::backward(l2);
    CHECK(again == l2.value().item());
    check_bitwise(g_again, grads_of(m.params()));
  }
  // a gradient buffer given to another graph as an input: the next backward writes the gradient
  // into it through a kernel's raw() (slice's backward, after zero_grad); the executor marks every
  // output it computes as written, so the other graph recomputes (it kept 2 instead of 10)
  {
    ad::Parameter p(ad::Tensor::full({4}, 1.0, DType::f64), "p");
    ad::Tensor c = ad::Tensor::full({2}, 1.0, DType::f64);
    {
      ad::Graph g;
      ad::backward(ad::sum(ad::mul(ad::slice(g.param(p), 0, 0, 2), g.input(c))));
    }
    ad::Graph monitor;
    Var gsum = ad::sum(monitor.input(p.grad()));
    CHECK(gsum.value().item() == 2.0);
    p.zero_grad();
    c.fill(5.0);
    {
      ad::Graph g;
      ad::backward(ad::sum(ad::mul(ad::slice(g.param(p), 0, 0, 2), g.input(c))));
    }
    CHECK(gsum.value().item() == 10.0);
  }
  // a run that throws (a Parameter of another shape) loses no write found before the error
  {
    ad::Graph g;
    ad::Tensor x = ad::Tensor::full({2}, 1.0, DType::f64);
    ad::Parameter w(ad::Tensor::full({2}, 1.0, DType::f64), "w");
    Var xv = g.input(x);  // the input's leaf before the parameter's: it is refreshed first
    Var s = ad::sum(ad::mul(xv, g.param(w)));
    CHECK(s.value().item() == 2.0);
    x.fill(10.0);
    ad::Tensor keep = w.value();
    w.value() = ad::Tensor::full({3}, 1.0, DType::f64);
    CHECK_THROWS_AS(s.value(), ad::Error);
    w.value() = keep;
    CHECK(s.value().item() == 20.0);
  }
  // a Parameter given another tensor: the graph follows it; another shape is an error
  {
    ad::Graph g;
    ad::Parameter p(ad::Tensor::full({2}, 1.0, DType::f64), "w");
    Var s = ad::sum(ad::mul(g.param(p), p));
    CHECK(s.value().item() == 2.0);
    p.value() = ad::Tensor::full({2}, 2.0, DType::f64);
    CHECK(s.value().item() == 8.0);
    p.value() = ad::Tensor::full({3}, 2.0, DType::f64);
    CHECK_THROWS_WITH_AS(s.value(), doctest::Contains("parameter 'w' is now f64[3]"), ad::Error);
  }
}

TEST_CASE("executor: simulate_peak and execute accept and reject the same hand-made reuse, free and compress steps") {
  using K = ad::Step::Kind;
  ad::Graph g;
  Var x = g.input(ad::Tensor::ones({3, 4}));
  Var s1 = ad::slice(x, 0, 0, 1);  // [1, 4]
  Var a = ad::exp(s1);             // [1, 4]
  Var b = ad::add(a, x);           // [3, 4]: a broadcast, so b cannot take a's buffer
  Var t = ad::tanh(x);             // [3, 4]
  Var l = ad::sum(b);
  ad::GraphImpl& gi = g.impl();
  auto both_reject = [&](const ad::Schedule& s, const char* what) {
    CHECK_THROWS_WITH_AS(ad::simulate_peak(gi, s), doctest::Contains(what), ad::Error);
    CHECK_THROWS_WITH_AS(ad::execute(gi, s), doctest::Contains(what), ad::Error);
    CHECK(x.has_value());  // the leaf is never lost
  };
  ad::Schedule s;  // b over a: other shapes (execute ignored it and the peaks differed: 36 against 80)
  s.targets = {l.id()};
  s.steps = {{K::compute, s1.id()}, {K::compute, a.id()}, {K::compute, b.id(), -1, a.id()}, {K::free, a.id()},
             {K::compute, l.id()}};
  both_reject(s, "cannot write over exp#");
  s.steps = {{K::compute, t.id(), -1, x.id()}};  // over a leaf (it was overwritten and dropped)
  both_reject(s, "a leaf: the engine never frees leaves");
  s.steps = {{K::compute, s1.id()}, {K::free, x.id()}};  // free of a leaf
  both_reject(s, "free of input#0, a leaf");
  s.steps = {{K::compute, s1.id()}, {K::compute, t.id(), -1, s1.id()}};  // not an input of tanh(x)
  both_reject(s, "not an input its kernel may overwrite");
  s.steps = {{K::compute, s1.id()}, {K::compute, a.id()}, {K::compress, a.id(), 77}};
  both_reject(s, "to dtype value 77: not a floating dtype");
  // an allowed reuse: the same bytes in both
  Var e = ad::exp(t);
  ad::Schedule ok;
  ok.targets = {e.id()};
  ok.steps = {{K::compute, t.id()}, {K::compute, e.id(), -1, t.id()}, {K::free, t.id()}};
  const std::int64_t predicted = ad::simulate_peak(gi, ok);
  CHECK(predicted == 48);  // one [3, 4] f32 buffer
  CHECK(ad::execute(gi, ok).measured_peak_bytes == predicted);
  // the same step while something outside the graph holds t's value: neither takes its buffer
  ad::Schedule first;
  first.targets = {t.id()};
  first.steps = {{K::compute, t.id()}};
  ad::execute(gi, first);
  ad::Tensor held = t.value();
  ad::Schedule again;
  again.targets = {e.id()};
  again.steps = {{K::compute, e.id(), -1, t.id()}, {K::free, t.id()}};
  const std::int64_t p2 = ad::simulate_peak(gi, again);
  CHECK(ad::execute(gi, again).measured_peak_bytes == p2);
  CHECK(held.to_vector() == std::vector<double>(12, std::tanh(1.0f)));
}

namespace ad::test {
// Steps on leaves, sinks of another shape, reads of compressed values: refused
// by simulate_peak, execute, explain and to_dot alike, before any step runs.
TEST_CASE("executor: offload or compress of a leaf, a sink of another shape, a read of a compressed value") {
  using K = ad::Step::Kind;
  ad::Tensor xt = ad::Tensor::full({2, 2}, 1.0 + 1.0 / 1024);
  ad::Parameter w(ad::Tensor::full({2, 2}, 1.0));
  ad::Graph g;
  Var x = g.input(xt);
  Var m = ad::mul(x, g.param(w));
  Var loss = ad::sum(m);
  Var a = ad::tanh(x), b = ad::exp(a);
  ad::GraphImpl& gi = g.impl();
  auto both_reject = [&](const ad::Schedule& s, const char* what) {
    CHECK_THROWS_WITH_AS(ad::simulate_peak(gi, s), doctest::Contains(what), ad::Error);
    CHECK_THROWS_WITH_AS(ad::execute(gi, s), doctest::Contains(what), ad::Error);
    CHECK(x.value().same_storage(xt));  // the leaf still is the caller's tensor
  };
  ad::Schedule s;
  s.targets = {loss.id()};
  for (K k : {K::offload, K::compress}) {
    s.steps = {{k, x.id(), k == K::compress ? static_cast<std::int32_t>(ad::DType::bf16) : -1},
               {k == K::offload ? K::prefetch : K::decompress, x.id()}};
    both_reject(s, "a leaf: a leaf's value is the caller's tensor");
  }
  // the graph still reads the caller's tensor: a later write is seen
  xt.fill(2.0);
  CHECK(eval(loss).item() == 8.0);  // 2 x 1, four times
  // a compute into a sink whose parameter has another shape (the gradient was silently never written)
  ad::Parameter v = ad::Parameter::zeros({5, 5});
  s.targets = {};
  s.sinks = {v};
  s.steps = {{K::compute, a.id(), 0}};
  both_reject(s, "into the gradient of parameter");
  s.steps = {{K::compute, a.id()}, {K::accumulate, a.id(), 0}};
  both_reject(s, "into the gradient of parameter");
  s.steps = {{K::compute, a.id()}, {K::accumulate, a.id(), 3}};
  both_reject(s, "names sink 3 of 1");
  CHECK(!v.has_grad());
  // a read of a value while it is stored compressed
  s.sinks = {};
  s.targets = {b.id()};
  s.steps = {{K::compute, a.id()}, {K::compress, a.id(), static_cast<std::int32_t>(ad::DType::bf16)}, {K::compute, b.id()}};
  both_reject(s, "while it is stored compressed");
  s.steps = {{K::compute, a.id()}, {K::compress, a.id(), static_cast<std::int32_t>(ad::DType::bf16)}, {K::offload, a.id()}};
  both_reject(s, "while it is stored compressed");
  // explain and to_dot of a plan with a step naming no node
  ad::Plan plan = ad::plan_backward(loss);
  plan.schedule.steps.push_back({K::compute, 9999});
  CHECK_THROWS_WITH_AS(ad::explain(plan), doctest::Contains("names node 9999"), ad::Error);
  CHECK_THROWS_WITH_AS(ad::to_dot(plan), doctest::Contains("names node 9999"), ad::Error);
}

// A plan made while a parameter had no gradient writes that gradient in place
// (no graph bytes); should the parameter get a gradient before the plan runs,
// the step allocates in the graph: simulate_peak, asked then, says so.
TEST_CASE("executor: simulate_peak counts a gradient that can no longer be written in place") {
  ad::Rng rng(1);
  ad::Parameter w = ad::Parameter::randn({64, 64}, rng, 0.1);
  ad::Tensor x = ad::Tensor::randn({8, 64}, rng);
  ad::Graph g;
  ad::Var loss = ad::sum(ad::tanh(ad::matmul(g.input(x), w)));
  ad::Plan p = ad::plan_backward(loss);
  CHECK(ad::simulate_peak(*p.graph, p.schedule) == p.schedule.predicted_peak_bytes);
  {
    ad::Graph g2;
    ad::backward(ad::sum(g2.param(w)));  // w has a gradient now
  }
  const std::int64_t now = ad::simulate_peak(*p.graph, p.schedule);
  CHECK(now > p.schedule.predicted_peak_bytes);  // the 16 KB gradient is the graph's now
  CHECK(ad::execute(*p.graph, p.schedule).measured_peak_bytes == now);
}

// Values of 2^62 bytes each: the predicted peak must not wrap around (it did,
// to a figure a budget then accepted).
TEST_CASE("executor: a peak beyond 2^63 bytes is an error, not a wrapped figure") {
  const std::int64_t n = std::int64_t{1} << 30;
  ad::Parameter p = ad::Parameter::zeros({1});
  for (ad::Policy pol : {ad::policy::keep_all(), ad::policy::budget((std::int64_t{1} << 62) + 64)}) {
    ad::Graph g;
    ad::Var y = ad::broadcast_to(g.param(p), {n, n});
    ad::Var l = ad::sum(ad::mul(ad::mul(ad::exp(y), ad::tanh(y)), ad::sigmoid(y)));
    INFO(pol.name());
    CHECK_THROWS_WITH_AS(ad::plan_backward(l, pol), doctest::Contains("more than 2^63 bytes"), ad::Error);
  }
}
}  // namespace ad::test

namespace ad::test {
// Every sink's gradient state is checked before the first step: a parameter
// given a tensor of another shape (gradient not zeroed) failed at its own
// accumulate step, after another parameter's gradient had been added to (a
// retry then added it twice).
TEST_CASE("executor: a stale gradient fails the run before any gradient is added to") {
  ad::Parameter a(ad::Tensor::full({3}, 1.0, ad::DType::f64), "a"), b(ad::Tensor::full({3}, 1.0, ad::DType::f64), "b");
  {
    ad::Graph g;
    ad::backward(ad::sum(ad::mul(ad::add(g.param(a), g.param(b)), g.input(ad::Tensor::full({3}, 2.0, ad::DType::f64)))));
  }
  a.value() = ad::Tensor::full({4}, 1.0, ad::DType::f64);  // another shape; a.zero_grad() forgotten
  ad::Graph g;
  Var la = ad::sum(ad::mul(g.param(a), g.input(ad::Tensor::full({4}, 2.0, ad::DType::f64))));
  Var lb = ad::sum(ad::mul(g.param(b), g.input(ad::Tensor::full({3}, 2.0, ad::DType::f64))));
  Var l = ad::add(la, lb);
  for (ad::Policy pol : {ad::policy::keep_all(), ad::policy::budget(1 << 20)}) {
    CHECK_THROWS_WITH_AS(ad::backward(l, pol), doctest::Contains("parameter \"a\" holds a gradient f64[3] but is now f64[4]"),
                         ad::Error);
    CHECK(b.grad().to_vector() == std::vector<double>(3, 2.0));  // as before the failed run
  }
  a.zero_grad();
  ad::backward(l);
  CHECK(b.grad().to_vector() == std::vector<double>(3, 4.0));
}

// A step that fails after gradient steps added to gradients holding earlier
// contents: those are not restored (copying every gradient would cost its
// memory each step), and the error says which.
TEST_CASE("executor: a run failing after it added to gradients names them") {
  using K = ad::Step::Kind;
  ad::Parameter w(ad::Tensor::full({4}, 1.0), "w");
  {
    ad::Graph g0;
    ad::backward(ad::sum(g0.param(w)));  // w's gradient holds ones
  }
  ad::Graph g;
  Var x = g.input(ad::Tensor::full({4}, 0.5));
  Var a = ad::tanh(x), c = ad::exp(x), d = ad::mul(c, c);
  ad::Schedule s;
  s.sinks = {w};
  s.steps = {{K::compute, a.id()}, {K::accumulate, a.id(), 0}, {K::compute, d.id()}};  // c holds no value
  CHECK_THROWS_WITH_AS(ad::execute(g.impl(), s),
                       doctest::Contains("which holds no value (bad schedule); this step had already added to the "
                                         "gradients of 1 parameter (w)"),
                       ad::Error);
  CHECK(w.grad().to_vector()[0] == doctest::Approx(1.0 + std::tanh(0.5)));
}
}  // namespace ad::test
