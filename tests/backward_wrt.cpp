// backward_wrt: gradients with respect to inputs (or any node) computed under a
// policy in the same pass as the parameters' — what a pipeline stage sends
// back. Checked bitwise against keep_all and against ad::grad evaluated
// plainly, on random DAGs and chains under every policy kind.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"
#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

namespace {

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

struct WrtOutcome {
  std::vector<Tensor> input_grads, param_grads;
  Report report;
};
// Builds a fresh graph for `seed` (chain or DAG) and runs backward_wrt on its
// two data inputs (pool[0] and pool[1] for a DAG, the chain's input).
WrtOutcome run_wrt(std::uint64_t seed, bool chain, const Policy& pol) {
  Graph g;
  RandomDag d = chain ? random_chain(g, seed, 60) : random_dag(g, seed);
  std::vector<Var> wrt{d.pool[0]};
  if (!chain) wrt.push_back(d.pool[1]);
  WrtOutcome o;
  o.report = backward_wrt(d.loss, wrt, pol);
  for (const Tensor& t : o.report.grads) o.input_grads.push_back(t.clone());
  o.param_grads = grads_of(d.params);
  o.report.plan.reset();
  return o;
}

}  // namespace

TEST_CASE("backward_wrt: input gradients under every policy are keep_all's bits and ad::grad's values") {
  int budget_runs = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const bool chain = seed % 4 == 0;
    INFO("seed ", seed, std::string(chain ? " (chain)" : " (dag)"));
    WrtOutcome ref = run_wrt(seed, chain, policy::keep_all());
    // ad::grad evaluated plainly, on its own graph: the same values
    {
      Graph g;
      RandomDag d = chain ? random_chain(g, seed, 60) : random_dag(g, seed);
      std::vector<Var> wrt{d.pool[0]};
      if (!chain) wrt.push_back(d.pool[1]);
      std::vector<Var> gr = grad(d.loss, wrt);
      REQUIRE(ref.input_grads.size() == wrt.size());
      for (std::size_t i = 0; i < gr.size(); ++i) {
        Tensor want = eval(gr[i]);
        REQUIRE(want.shape() == wrt[i].shape());
        CHECK(max_abs_diff(ref.input_grads[i], want) <= 1e-6 * (1 + max_abs(want)));
      }
    }
    std::vector<Policy> pols{policy::sqrt_n(), policy::uniform(3), policy::sqrt_n().offloaded(),
                             policy::budget(ref.report.predicted_peak_bytes * 3 / 4)};
    if (chain) pols.push_back(policy::optimal_chain(3));
    for (const Policy& pol : pols) {
      INFO(pol.name());
      WrtOutcome o;
      try {
        o = run_wrt(seed, chain, pol);
      } catch (const BudgetError&) {
        continue;  // three quarters of keep_all is below this graph's least peak
      }
      check_bitwise(o.input_grads, ref.input_grads);
      check_bitwise(o.param_grads, ref.param_grads);
      CHECK(o.report.measured_peak_bytes <= o.report.predicted_peak_bytes);
      if (pol.kind == Policy::Kind::budget) {
        CHECK(o.report.measured_peak_bytes - o.report.baseline_bytes <= pol.budget_bytes);
        ++budget_runs;
      }
    }
  }
  CHECK(budget_runs >= 20);  // most graphs fit three quarters of keep_all's peak
}

TEST_CASE("backward_wrt: with compressed activations, the parameters' gradients are backward()'s") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    INFO("seed ", seed);
    const Policy pol = policy::sqrt_n().compressed(DType::bf16);
    std::vector<Tensor> want;
    {
      Graph g;
      RandomDag d = random_dag(g, seed);
      backward(d.loss, pol);
      want = grads_of(d.params);
    }
    WrtOutcome o = run_wrt(seed, false, pol);
    check_bitwise(o.param_grads, want);
    CHECK(o.report.measured_peak_bytes <= o.report.predicted_peak_bytes);
    for (const Tensor& t : o.input_grads) CHECK(all_finite(t));
  }
}

TEST_CASE("backward_wrt: a two-stage pipeline gives the single graph's parameter gradients") {
  Rng rng(5);
  Parameter w1 = Parameter::randn({6, 8}, rng, 0.4, DType::f64), w2 = Parameter::randn({8, 3}, rng, 0.4, DType::f64);
  Tensor x = Tensor::randn({5, 6}, rng, DType::f64);
  // one graph
  {
    Graph g;
    backward(mean(tanh(matmul(tanh(matmul(g.input(x), w1)), w2))), policy::sqrt_n());
  }
  std::vector<Tensor> whole = grads_of({w1, w2});
  w1.zero_grad();
  w2.zero_grad();
  // stage 1 computes h and hands it on; stage 2 computes the loss from h as an input
  Graph g1, g2;
  Var h = tanh(matmul(g1.input(x), w1));
  Var h_in = g2.input(eval(h).clone());
  Var loss = mean(tanh(matmul(h_in, w2)));
  Report r2 = backward_wrt(loss, {h_in}, policy::sqrt_n());
  REQUIRE(r2.grads.size() == 1);
  CHECK(r2.grads[0].shape() == h.shape());
  // stage 1's backward is seeded with the gradient stage 2 sent back
  backward(h, policy::sqrt_n(), g1.input(r2.grads[0].clone()));
  std::vector<Tensor> piped = grads_of({w1, w2});
  for (std::size_t i = 0; i < 2; ++i) CHECK(max_abs_diff(piped[i], whole[i]) <= 1e-14);
}

TEST_CASE("backward_wrt: no parameters needed, zeros for what the loss does not read, gradient nodes reused") {
  Rng rng(2);
  Graph g;
  Var x = g.input(Tensor::randn({4, 3}, rng, DType::f64)), unused = g.input(Tensor::randn({2}, rng, DType::f64));
  Var loss = sum(mul(tanh(x), tanh(x)));
  Report r = backward_wrt(loss, {x, unused}, policy::sqrt_n());
  REQUIRE(r.grads.size() == 2);
  std::vector<double> xv = x.value().to_vector(), gv = r.grads[0].to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) {
    double t = std::tanh(xv[i]);
    CHECK(gv[i] == doctest::Approx(2 * t * (1 - t * t)).epsilon(1e-12));
  }
  for (double v : r.grads[1].to_vector()) CHECK(v == 0.0);
  CHECK(r.grads[1].shape() == Shape{2});
  const std::int64_t nodes = g.num_nodes();
  Report again = backward_wrt(loss, {x, unused}, policy::sqrt_n());
  CHECK(g.num_nodes() == nodes);  // the gradient nodes of the first call
  CHECK(bitwise_equal(again.grads[0], r.grads[0]));
  // the gradients are the plan's outputs: a fresh graph's predicted peak counts them
  Graph g2;
  Var x2 = g2.input(x.value()), unused2 = g2.input(unused.value());
  Var loss2 = sum(mul(tanh(x2), tanh(x2)));
  Plan p = plan_backward_wrt(loss2, {x2, unused2}, policy::keep_all());
  CHECK(p.schedule.predicted_peak_bytes >= 12 * 8 + 2 * 8);
  Report r2 = backward_wrt(loss2, {x2, unused2}, policy::keep_all());
  CHECK(r2.measured_peak_bytes == r2.predicted_peak_bytes);
  CHECK(bitwise_equal(r2.grads[0], r.grads[0]));
}

TEST_CASE("backward_wrt: bad arguments are ad::Errors naming the call") {
  Rng rng(3);
  Graph g, other;
  Var x = g.input(Tensor::randn({4, 3}, rng));
  Var loss = sum(tanh(x));
  EXPECT_ERROR(backward_wrt(loss, {}), "backward_wrt", "wrt is empty");
  EXPECT_ERROR(backward_wrt(loss, {Var{}}), "backward_wrt", "wrt[0]", "undefined");
  EXPECT_ERROR(backward_wrt(loss, {x, other.input(Tensor::randn({2}, rng))}), "backward_wrt", "wrt[1]",
               "another graph");
  EXPECT_ERROR(backward_wrt(tanh(x), {x}), "backward_wrt", "not a scalar");
  EXPECT_ERROR(backward_wrt(Var{}, {x}), "backward_wrt", "undefined");
  EXPECT_ERROR(backward_wrt(tanh(x), {x}, policy::keep_all(), g.input(Tensor::ones({4, 3}, DType::f64))),
               "backward_wrt: seed f64[4,3] does not match loss f32[4,3]");
  EXPECT_ERROR(backward_wrt(tanh(x), {x}, policy::keep_all(), other.input(Tensor::ones({4, 3}))),
               "backward_wrt: seed", "another graph");
  // backward's own error points here
  EXPECT_ERROR(backward(loss), "does not depend on any Parameter", "backward_wrt");
}

namespace {
// x -> tanh(matmul(., w_i)) x12 -> sum, f64 [8,16] values
struct Chain {
  std::vector<Parameter> w;
  Tensor x;
  Chain() {
    Rng rng(5);
    for (int i = 0; i < 12; ++i) w.push_back(Parameter::randn({16, 16}, rng, 0.3, DType::f64));
    x = Tensor::randn({8, 16}, rng, DType::f64);
  }
  Var build(Graph& g, Var& xin) const {
    xin = g.input(x);
    Var h = xin;
    for (const auto& p : w) h = tanh(matmul(h, p));
    return sum(h);
  }
};
}  // namespace

// The executor and explain() took the last target for the end of the forward
// pass: with backward_wrt's gradient targets that was the end of the backward.
TEST_CASE("backward_wrt: the budget guard evicts forward values only, as for backward()") {
  Chain c;
  for (int wrt = 0; wrt < 2; ++wrt) {
    INFO(std::string(wrt ? "backward_wrt" : "backward"));
    for (auto& p : c.w) p.zero_grad();
    Graph g;
    Var x;
    Var loss = c.build(g, x);
    Plan p = wrt ? plan_backward_wrt(loss, {x}) : plan_backward(loss);
    p.schedule.budget_bytes = p.schedule.predicted_peak_bytes / 2;  // too small: the guard must evict
    Trace tr;
    g.record(&tr);
    RunStats st = execute(*p.graph, p.schedule);  // threw "nothing left to evict" for backward_wrt
    g.record(nullptr);
    CHECK(st.evictions > 0);
    CHECK(st.measured_peak_bytes <= p.schedule.budget_bytes);
    for (const TraceEvent& e : tr.events())
      if (e.kind == TraceEvent::Kind::evict) CHECK(e.node <= loss.id());
  }
}

TEST_CASE("backward_wrt: parameters' gradients are not copied, and explain() names gradient nodes as such") {
  Chain c;
  for (int wrt = 0; wrt < 2; ++wrt) {
    INFO(std::string(wrt ? "backward_wrt" : "backward"));
    for (auto& p : c.w) p.zero_grad();
    for (int step = 0; step < 2; ++step) {  // the second adds to gradients that hold values
      Graph g;
      Var x;
      Var loss = c.build(g, x);
      auto d = default_allocator();
      const std::int64_t n0 = d->allocations(), live0 = d->live_bytes();
      d->reset_peak();
      Report r = wrt ? backward_wrt(loss, {x}) : backward(loss);
      if (step == 1) {
        CHECK(d->allocations() - n0 == 0);  // backward_wrt copied 11 of them
        CHECK(d->peak_bytes() - live0 == 0);
      }
      if (wrt) {
        const std::string text = explain(*r.plan);
        CHECK(text.find("gradient value") != std::string::npos);
        std::istringstream lines(text);
        int rows = 0;
        for (std::string line; std::getline(lines, line);) {  // "| 7 | full | f64[] | ... | gradient value |"
          if (line.size() < 3 || line[0] != '|' || !std::isdigit(static_cast<unsigned char>(line[2]))) continue;
          const int id = std::stoi(line.substr(2));
          if (id <= loss.id()) continue;
          ++rows;
          INFO(line);
          CHECK((line.find("gradient value") != std::string::npos || line.find("a target") != std::string::npos));
        }
        CHECK(rows > 20);
      }
    }
  }
}

TEST_CASE("backward_keep: kept forward values are the plain forward's, under every policy, with backward()'s gradients") {
  // two values of the forward pass (the first and a middle one of the pool)
  // kept through backward: their values equal a plain eval on a fresh graph,
  // the parameters' gradients equal backward()'s bit for bit, and the peak
  // (which now holds them to the end) is predicted exactly
  int budget_runs = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const bool chain = seed % 4 == 0;
    INFO("seed ", seed, std::string(chain ? " (chain)" : " (dag)"));
    auto pick = [](const RandomDag& d) { return std::vector<Var>{d.pool.back(), d.pool[d.pool.size() / 2]}; };
    std::vector<Tensor> want, ref_grads;
    std::int64_t ref_peak = 0;
    {
      Graph g;
      RandomDag d = chain ? random_chain(g, seed, 60) : random_dag(g, seed);
      for (const Var& v : pick(d)) want.push_back(eval(v).clone());
    }
    {
      Graph g;
      RandomDag d = chain ? random_chain(g, seed, 60) : random_dag(g, seed);
      ref_peak = backward(d.loss, policy::keep_all()).predicted_peak_bytes;
      ref_grads = grads_of(d.params);
    }
    std::vector<Policy> pols{policy::keep_all(), policy::sqrt_n(), policy::uniform(3), policy::manual(),
                             policy::budget(ref_peak * 3 / 4)};
    if (chain) pols.push_back(policy::optimal_chain(3));
    for (const Policy& pol : pols) {
      INFO(pol.name());
      Graph g;
      RandomDag d = chain ? random_chain(g, seed, 60) : random_dag(g, seed);
      Report r;
      try {
        r = backward_keep(d.loss, pick(d), pol);
      } catch (const BudgetError&) {
        continue;
      } catch (const Error& e) {
        // optimal_chain refuses a graph that keeping a middle value makes a non-chain
        CHECK(pol.kind == Policy::Kind::optimal_chain);
        continue;
      }
      REQUIRE(r.values.size() == 2);
      for (std::size_t i = 0; i < 2; ++i) CHECK(max_abs_diff(r.values[i], want[i]) == 0);
      check_bitwise(grads_of(d.params), ref_grads);
      CHECK(r.measured_peak_bytes == r.predicted_peak_bytes);
      if (pol.kind == Policy::Kind::budget) {
        CHECK(r.measured_peak_bytes - r.baseline_bytes <= pol.budget_bytes);
        ++budget_runs;
      }
    }
  }
  CHECK(budget_runs >= 15);
}

TEST_CASE("backward_keep: bad keep lists are ad::Errors") {
  Rng rng(3);
  Parameter w = Parameter::randn({3, 3}, rng);
  Graph g, other;
  Var x = g.input(Tensor::randn({2, 3}, rng));
  Var h = tanh(matmul(x, w));
  Var loss = sum(h);
  CHECK(throws_with([&] { backward_keep(loss, {}); }, "backward_keep: keep is empty"));
  CHECK(throws_with([&] { backward_keep(loss, {Var{}}); }, "keep[0] is an undefined Var"));
  CHECK(throws_with([&] { backward_keep(loss, {other.input(Tensor::zeros({1}))}); }, "belongs to another graph"));
  Report r = backward_keep(loss, {h});
  CHECK(max_abs_diff(r.values[0], eval(h)) == 0);
  Var later = mul_scalar(h, 2.0);  // made after the loss's first backward
  CHECK(throws_with([&] { backward_keep(loss, {later}); }, "was made after the first backward of this loss"));
}
