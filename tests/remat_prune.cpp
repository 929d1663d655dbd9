// budget()'s pruning (src/checkpoint/budget.cpp): candidates that cost more
// than one known to fit are not simulated and their builders stop at that
// cost, keep sets whose held bytes alone exceed the budget are not built, and
// DTR runs stopped at the cap are run again in full where their capping
// decides the rungs below. None of it may change the plan: on graphs beyond
// the exact tier, at budgets from under the least peak up to keep_all's,
// the plan is the same schedule step for step (or the same error) as with
// every candidate built and simulated.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "checkpoint/planner.hpp"
#include "core/graph_impl.hpp"
#include "models.hpp"
#include "test_util.hpp"

namespace {

struct Outcome {
  ad::Schedule s;
  std::string error;
  std::int64_t least = -1;  // the least peak the error states
};

Outcome plan(const ad::planner::Problem& p, std::int64_t bytes, ad::planner::Pruning& pr) {
  Outcome o;
  try {
    o.s = ad::planner::budget(p, bytes, true, &pr);
  } catch (const ad::BudgetError& e) {
    o.error = e.what();
    o.least = e.least_peak;
  }
  return o;
}

bool same_steps(const ad::Schedule& a, const ad::Schedule& b) {
  if (a.steps.size() != b.steps.size()) return false;
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    const ad::Step &x = a.steps[i], &y = b.steps[i];
    if (x.kind != y.kind || x.node != y.node || x.aux != y.aux || x.reuse != y.reuse) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("remat: budget's pruning plans exactly what the whole candidate list plans") {
  ad::planner::Pruning total;
  int plans = 0, errors = 0;
  auto compare = [&](const ad::Var& loss, const std::string& name) {
    CAPTURE(name);
    const std::int64_t top = ad::plan_backward(loss, ad::policy::keep_all()).schedule.predicted_peak_bytes;
    ad::GraphImpl& g = *loss.graph();
    ad::planner::Problem p(g, {loss.id()}, g.grad_cache.at(loss.id()).sinks);
    REQUIRE(p.order.size() > static_cast<std::size_t>(ad::planner::kExactValues));  // beyond the exact tier
    ad::planner::Pruning first;
    const std::int64_t least = plan(p, 1, first).least;  // the least peak the planner reaches
    REQUIRE(least > 0);
    // one byte under it (an error), then from it up to keep_all's peak
    for (int i = -1; i < 8; ++i) {
      const std::int64_t bytes = i < 0 ? least - 1 : least + (top - least) * i / 8;
      CAPTURE(bytes);
      ad::planner::Pruning on, off;
      off.on = false;
      const Outcome a = plan(p, bytes, on), b = plan(p, bytes, off);
      CHECK(a.error == b.error);
      CHECK(same_steps(a.s, b.s));
      CHECK(a.s.recompute_flops == b.s.recompute_flops);
      CHECK(a.s.proven_cheapest == b.s.proven_cheapest);
      CHECK(off.stopped + off.unsimulated + off.held_over + off.reruns == 0);
      total.stopped += on.stopped;
      total.unsimulated += on.unsimulated;
      total.held_over += on.held_over;
      total.reruns += on.reruns;
      ++plans;
      errors += !a.error.empty();
    }
  };
#ifdef AD_TEST_SANITIZED
  const std::uint64_t dags = 4;
#else
  const std::uint64_t dags = 12;
#endif
  for (std::uint64_t seed = 1; seed <= dags; ++seed) {  // the tests' random graphs, 120-200 nodes
    ad::Graph g;
    const std::int64_t target = 120 + static_cast<std::int64_t>(ad::test::Picker(seed * 11 + 5)(81));
    ad::test::RandomDag d = seed % 4 == 0 ? ad::test::random_chain(g, seed, target) : ad::test::random_dag(g, seed, target);
    compare(d.loss, "random graph " + std::to_string(seed));
  }
  {  // a chain: the Revolve candidates, DTR and keep sets
    remat_bench::Mlp mlp(40, 16, 4, 7);
    ad::Graph g;
    compare(mlp.loss(g, false), mlp.name());
  }
  {  // views, layer norms, attention from core ops
    remat_bench::Transformer tf(3, 1, 8, 16, 2, 5);
    ad::Graph g;
    compare(tf.loss(g, false), tf.name());
  }
  std::printf("budget pruning: %d plans (%d errors) equal to the unpruned ones; %d candidates stopped at the cap, "
              "%d not simulated, %d keep sets held over, %d DTR runs re-run\n",
              plans, errors, total.stopped, total.unsimulated, total.held_over, total.reruns);
  // each kind of pruning took place, so the comparison covers it
  CHECK(total.stopped > 0);
  CHECK(total.held_over > 0);
  CHECK(errors > 0);
}
