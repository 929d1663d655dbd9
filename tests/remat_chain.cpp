// optimal_chain: Revolve / binomial checkpointing on chains of l = 1..200
// steps with s = 1..16 snapshots executes exactly T(l, s) + l forward-node
// computations and never holds more than s snapshots; T's closed form agrees
// with its recursion; non-chains and bad policy arguments are refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "checkpoint/revolve.hpp"
#include "core/graph_impl.hpp"
#include "test_util.hpp"

namespace {

using ad::Var;

constexpr std::int64_t kMaxL = 200, kMaxS = 16;

// A chain of exactly l steps: x0 (a Parameter leaf) -> l - 1 ops, each reading
// only the previous value and parameter leaves, cycling matmul(h, W1), tanh,
// matmul(h, W2), sigmoid, mul(h, P) -> sum (the loss, step l). Every op is
// one step (one forward node). [rows, 8] values.
struct Chain {
  std::vector<ad::Parameter> params;
  Var loss;
};
Chain make_chain(ad::Graph& g, std::int64_t l, ad::DType t = ad::DType::f32, std::int64_t rows = 4) {
  ad::Rng rng(77);
  Chain c;
  ad::Parameter x0 = ad::Parameter::randn({rows, 8}, rng, 1.0, t), w1 = ad::Parameter::randn({8, 8}, rng, 0.4, t),
                w2 = ad::Parameter::randn({8, 8}, rng, 0.4, t), p = ad::Parameter::randn({rows, 8}, rng, 1.0, t);
  c.params = {x0, w1, w2, p};
  Var h = g.param(x0);
  for (std::int64_t i = 1; i < l; ++i) {
    switch (i % 5) {
      case 1: h = ad::matmul(h, w1); break;
      case 2: h = ad::tanh(h); break;
      case 3: h = ad::matmul(h, w2); break;
      case 4: h = ad::sigmoid(h); break;
      default: h = ad::mul(h, p); break;
    }
  }
  c.loss = ad::sum(h);
  return c;
}

// Forward non-leaf nodes of a graph up to `loss` (the chain's steps).
std::vector<std::int32_t> steps_of(const ad::GraphImpl& g, std::int32_t loss) {
  std::vector<std::int32_t> f;
  for (std::int32_t id = 0; id <= loss; ++id)
    if (!g.is_leaf(id)) f.push_back(id);
  return f;
}

// What a schedule does to a chain's forward values.
//
// Counted: compute steps of forward nodes (ids <= the loss id, the chain's l
// steps; leaves are never computed). Snapshots: values of forward non-leaf
// nodes present in the graph, except the loss (the step's output, kept to
// the end by definition; the chain's last step computes it only in its fused
// step). The input x0 is a leaf and holds one of the s snapshots, so:
//  - at a compute step of forward node x_i, the snapshots other than x_i and
//    the value it is computed from (x_{i-1}, if not the leaf x0) number at
//    most s - 1 (`fwd_others`);
//  - at a compute step of a gradient node (reversing step i, which needs
//    x_i and x_{i-1}), the snapshots number at most s + 1 (`grad_held`:
//    s - 1 held besides x0, plus x_{i-1} and x_i when x_{i-1} is not one of them).
struct ChainCount {
  std::int64_t forward_computes = 0;
  std::int64_t fwd_others = 0;  // max over forward compute steps
  std::int64_t grad_held = 0;   // max over gradient compute steps
};
ChainCount count(const ad::GraphImpl& g, const ad::Schedule& s, std::int32_t loss) {
  ChainCount c;
  std::vector<char> present(static_cast<std::size_t>(loss) + 1, 0);
  std::int64_t held = 0;  // present forward non-leaf values, except the loss
  auto snapshot = [&](std::int32_t id) { return id < loss && !g.is_leaf(id); };
  for (const ad::Step& st : s.steps) {
    if (st.kind == ad::Step::Kind::free) {
      if (st.node <= loss && present[static_cast<std::size_t>(st.node)]) {
        present[static_cast<std::size_t>(st.node)] = 0;
        held -= snapshot(st.node);
      }
      continue;
    }
    if (st.kind != ad::Step::Kind::compute) continue;  // other steps neither make nor drop a value
    if (st.node > loss) {
      c.grad_held = std::max(c.grad_held, held);
      continue;
    }
    ++c.forward_computes;
    std::int64_t others = held - (present[static_cast<std::size_t>(st.node)] && snapshot(st.node));
    for (auto in : g.node(st.node).inputs)  // chain steps read one non-leaf value (mul(h, h) reads it twice)
      if (snapshot(in) && present[static_cast<std::size_t>(in)]) { --others; break; }
    c.fwd_others = std::max(c.fwd_others, others);
    if (!present[static_cast<std::size_t>(st.node)]) {
      present[static_cast<std::size_t>(st.node)] = 1;
      held += snapshot(st.node);
    }
  }
  return c;
}

// T(l, s) for all l <= kMaxL, s <= kMaxS, by the recursion, computed here
// independently of the library.
std::vector<std::vector<std::int64_t>> revolve_table() {
  std::vector<std::vector<std::int64_t>> t(kMaxS + 1, std::vector<std::int64_t>(kMaxL + 1, 0));
  for (std::int64_t s = 1; s <= kMaxS; ++s)
    for (std::int64_t l = 2; l <= kMaxL; ++l) {
      auto& v = t[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)];
      if (s == 1) { v = l * (l - 1) / 2; continue; }
      v = std::numeric_limits<std::int64_t>::max();
      for (std::int64_t j = 1; j < l; ++j)
        v = std::min(v, j + t[static_cast<std::size_t>(s - 1)][static_cast<std::size_t>(l - j)] +
                            t[static_cast<std::size_t>(s)][static_cast<std::size_t>(j)]);
    }
  return t;
}

}  // namespace

TEST_CASE("remat: revolve::steps closed form == recursion, l <= 200, s <= 16") {
  const auto t = revolve_table();
  for (std::int64_t s = 1; s <= kMaxS; ++s)
    for (std::int64_t l = 1; l <= kMaxL; ++l) {
      CAPTURE(l);
      CAPTURE(s);
      const std::int64_t want = t[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)];
      REQUIRE(ad::revolve::steps(l, s) == want);
      REQUIRE(ad::revolve::steps_recursive(l, s) == want);
      if (s == 1) CHECK(want == l * (l - 1) / 2);
      if (s >= l - 1) CHECK(want == std::max<std::int64_t>(l - 1, 0));  // every x_i fits: one sweep
      if (s >= 2 && l >= 2) {
        const std::int64_t j = ad::revolve::best_split(l, s);
        REQUIRE(j >= 1);
        REQUIRE(j < l);
        CHECK(j + t[static_cast<std::size_t>(s - 1)][static_cast<std::size_t>(l - j)] +
                  t[static_cast<std::size_t>(s)][static_cast<std::size_t>(j)] ==
              want);
        // the first optimal split (best_split bisects a convex function)
        for (std::int64_t k = 1; k < j; ++k)
          REQUIRE(k + t[static_cast<std::size_t>(s - 1)][static_cast<std::size_t>(l - k)] +
                      t[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)] >
                  want);
      }
    }
  // a few by hand: r*l - C(s+r, s+1), r least with C(s+r, s) >= l
  CHECK(ad::revolve::steps(4, 2) == 2 * 4 - 4);    // r = 2: C(4,2) = 6 >= 4;  C(4,3) = 4
  CHECK(ad::revolve::steps(10, 2) == 3 * 10 - 10); // r = 3: C(5,2) = 10 >= 10; C(5,3) = 10
  CHECK(ad::revolve::steps(10, 3) == 2 * 10 - 5);  // r = 2: C(5,3) = 10 >= 10; C(5,4) = 5
  CHECK(ad::revolve::steps(200, 16) == 3 * 200 - 171);  // r = 3: C(18,16) = 153 < 200 <= C(19,16) = 969; C(19,17) = 171
}

TEST_CASE("remat: optimal_chain plans exactly T(l, s) + l forward computations with at most s snapshots, l <= 200, s <= 16") {
  std::int64_t plans = 0;
  for (std::int64_t l = 1; l <= kMaxL; ++l) {
    ad::Graph g;
    Chain c = make_chain(g, l);
    REQUIRE(static_cast<std::int64_t>(steps_of(g.impl(), c.loss.id()).size()) == l);
    REQUIRE(ad::test::remat::is_forward_chain(g.impl(), c.loss.id()));
    for (std::int32_t s = 1; s <= kMaxS; ++s) {
      CAPTURE(l);
      CAPTURE(s);
      ad::Plan p = ad::plan_backward(c.loss, ad::policy::optimal_chain(s));
      ChainCount n = count(g.impl(), p.schedule, c.loss.id());
      CHECK(n.forward_computes == ad::revolve::steps(l, s) + l);
      CHECK(p.schedule.recomputed_nodes == ad::revolve::steps(l, s));
      CHECK(n.fwd_others <= s - 1);
      CHECK(n.grad_held <= s + 1);
      if (l == kMaxL) CHECK(n.fwd_others == s - 1);  // a long chain uses every slot (the bound is tight)
      CHECK(p.schedule.predicted_peak_bytes == ad::simulate_peak(g.impl(), p.schedule));
      ++plans;
    }
  }
  CHECK(plans == kMaxL * kMaxS);
}

TEST_CASE("remat: optimal_chain executes exactly T(l, s) + l forward computations, gradients bitwise equal to keep_all") {
  // all s for l = 1..20 and l = 200, and a seeded sample of the rest of the grid
  std::vector<std::pair<std::int64_t, std::int32_t>> grid;
  for (std::int64_t l = 1; l <= 20; ++l)
    for (std::int32_t s = 1; s <= kMaxS; ++s) grid.emplace_back(l, s);
  for (std::int32_t s = 1; s <= kMaxS; ++s) grid.emplace_back(200, s);
  ad::test::Picker pick(2024);
  for (int i = 0; i < 60; ++i)
    grid.emplace_back(21 + static_cast<std::int64_t>(pick(179)), 1 + static_cast<std::int32_t>(pick(kMaxS)));
  std::int64_t last_l = -1;
  std::vector<ad::Tensor> ref;
  for (const auto& ls : grid) {
    const std::int64_t l = ls.first;  // not a structured binding: CAPTURE needs capturable variables
    const std::int32_t s = ls.second;
    CAPTURE(l);
    CAPTURE(s);
    const ad::DType t = l % 2 ? ad::DType::f32 : ad::DType::f64;
    if (l != last_l) {
      ad::Graph g0;
      Chain c0 = make_chain(g0, l, t);
      ad::Report r0 = ad::backward(c0.loss);
      REQUIRE(r0.predicted_peak_bytes == r0.measured_peak_bytes);
      ref = ad::test::grads_of(c0.params);
      last_l = l;
    }
    ad::Graph g;
    Chain c = make_chain(g, l, t);
    ad::Report r = ad::backward(c.loss, ad::policy::optimal_chain(s));
    const std::int64_t T = ad::revolve::steps(l, s);
    std::int64_t fwd = 0;
    for (auto id : steps_of(g.impl(), c.loss.id())) fwd += g.impl().node(id).last_run_computes;
    CHECK(fwd == T + l);                 // measured by the executor, per node
    CHECK(r.recomputed_nodes == T);      // each forward node once, T more; gradient nodes once
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    ChainCount n = count(g.impl(), r.plan->schedule, c.loss.id());
    CHECK(n.forward_computes == T + l);
    CHECK(n.fwd_others <= s - 1);
    CHECK(n.grad_held <= s + 1);
    ad::test::check_bitwise(ad::test::grads_of(c.params), ref);
  }
}

TEST_CASE("remat: optimal_chain snapshots pay off: the peak falls as slots are taken away") {
  // l = 64 steps of [64,8] f32 (activations larger than the [8,8] weights):
  // with s >= l every value backward needs is held; with s slots about s.
  ad::Graph g;
  Chain c = make_chain(g, 64, ad::DType::f32, 64);
  std::int64_t prev = -1;
  for (std::int32_t s : {64, 16, 8, 4, 2, 1}) {
    CAPTURE(s);
    ad::Plan p = ad::plan_backward(c.loss, ad::policy::optimal_chain(s));
    if (prev >= 0) CHECK(p.schedule.predicted_peak_bytes <= prev);
    prev = p.schedule.predicted_peak_bytes;
  }
  ad::Plan all = ad::plan_backward(c.loss, ad::policy::keep_all());
  ad::Plan one = ad::plan_backward(c.loss, ad::policy::optimal_chain(1));
  CHECK(one.schedule.predicted_peak_bytes < all.schedule.predicted_peak_bytes / 4);
}

TEST_CASE("remat: optimal_chain refuses graphs that are not chains") {
  ad::Rng rng(3);
  ad::Parameter w = ad::Parameter::randn({6, 6}, rng, 0.4);
  {
    // a diamond: a feeds b and the final product
    ad::Graph g;
    Var a = ad::tanh(ad::matmul(g.input(ad::Tensor::randn({3, 6}, rng)), w));
    Var loss = ad::sum(ad::mul(a, ad::sigmoid(a)));
    CHECK_FALSE(ad::test::remat::is_forward_chain(g.impl(), loss.id()));
    try {
      ad::plan_backward(loss, ad::policy::optimal_chain(3));
      FAIL("no throw");
    } catch (const ad::Error& e) {
      CHECK(std::string(e.what()).find("optimal_chain") != std::string::npos);
      CHECK(std::string(e.what()).find("chain") != std::string::npos);
    }
    CHECK_THROWS_AS(ad::backward(loss, ad::policy::optimal_chain(16)), ad::Error);
    CHECK_FALSE(w.has_grad());  // refused before anything ran
  }
  {
    // a skip connection: step 3 reads step 1
    ad::Graph g;
    Var x = g.input(ad::Tensor::randn({3, 6}, rng));
    Var a = ad::matmul(x, w), b = ad::tanh(a), d = ad::add(b, a);
    CHECK_THROWS_AS(ad::plan_backward(ad::sum(d), ad::policy::optimal_chain(2)), ad::Error);
  }
  // the same ops as a chain are accepted
  ad::Graph g;
  Var loss = ad::sum(ad::sigmoid(ad::tanh(ad::matmul(g.input(ad::Tensor::randn({3, 6}, rng)), w))));
  CHECK(ad::test::remat::is_forward_chain(g.impl(), loss.id()));
  CHECK_NOTHROW(ad::backward(loss, ad::policy::optimal_chain(2)));
}

TEST_CASE("remat: policy arguments out of range throw ad::Error") {
  auto message = [](auto f) -> std::string {
    try {
      f();
    } catch (const ad::Error& e) {
      return e.what();
    }
    return "no throw";
  };
  std::string m = message([] { ad::policy::uniform(0); });
  CHECK(m.find("uniform") != std::string::npos);
  CHECK(message([] { ad::policy::uniform(-3); }).find("uniform") != std::string::npos);
  m = message([] { ad::policy::budget(-1); });
  CHECK(m.find("budget") != std::string::npos);
  m = message([] { ad::policy::optimal_chain(0); });
  CHECK(m.find("optimal_chain") != std::string::npos);
  CHECK(message([] { ad::policy::optimal_chain(-2); }).find("optimal_chain") != std::string::npos);
  CHECK(message([] { ad::policy::selective(nullptr); }).find("selective") != std::string::npos);
  CHECK_NOTHROW(ad::policy::uniform(1));
  CHECK_NOTHROW(ad::policy::budget(0));
  CHECK_NOTHROW(ad::policy::optimal_chain(1));
}
