// Rematerialisation beyond the gradients: deleted values recomputed on demand
// after backward (same bits as keep_all), the plan cache, explain() and the
// Report's counters, and dropout inside recomputed segments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"
#include "test_util.hpp"

namespace {

using ad::DType;
using ad::Var;
using ad::test::RandomDag;

// x -> tanh(matmul(x, W_i)) [-> dropout] ... -> mean(h * h): a deep chain with
// `layers` layers over [rows, 8] values, weights shared every third layer.
RandomDag deep_chain(ad::Graph& g, int layers, std::int64_t rows = 4, DType t = DType::f32, bool drop = false) {
  ad::Rng rng(91);
  RandomDag d;
  for (int i = 0; i < 3; ++i) d.params.push_back(ad::Parameter::randn({8, 8}, rng, 0.4, t));
  Var h = g.input(ad::Tensor::randn({rows, 8}, rng, t));
  for (int i = 0; i < layers; ++i) {
    h = ad::tanh(ad::matmul(h, d.params[static_cast<std::size_t>(i % 3)]));
    if (drop && i % 2 == 0) h = ad::dropout(h, 0.25, rng);
    d.pool.push_back(h);
  }
  d.loss = ad::mean(ad::mul(h, h));
  return d;
}

// Forward non-leaf nodes the loss depends on.
std::vector<std::int32_t> forward_nodes(const ad::GraphImpl& g, std::int32_t loss) {
  std::vector<char> reach(static_cast<std::size_t>(loss) + 1, 0);
  reach[static_cast<std::size_t>(loss)] = 1;
  std::vector<std::int32_t> out;
  for (std::int32_t id = loss; id >= 0; --id) {
    if (!reach[static_cast<std::size_t>(id)]) continue;
    for (auto in : g.node(id).inputs) reach[static_cast<std::size_t>(in)] = 1;
    if (!g.is_leaf(id)) out.push_back(id);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// Every forward value of a freshly built graph, computed under keep_all (all
// of them targets) and copied.
std::map<std::int32_t, ad::Tensor> keep_all_values(ad::Graph& g, const Var& loss) {
  std::vector<std::int32_t> ids = forward_nodes(g.impl(), loss.id());
  ad::Schedule s = ad::plan(g.impl(), ids, {}, ad::policy::keep_all());
  ad::RunStats st = ad::execute(g.impl(), s);
  CHECK(st.measured_peak_bytes == s.predicted_peak_bytes);
  std::map<std::int32_t, ad::Tensor> out;
  for (auto id : ids) {
    REQUIRE(g.impl().node(id).value.defined());
    out[id] = g.impl().node(id).value.clone();
  }
  return out;
}

// The minimum feasible budget of a graph's backward step (from the error of an infeasible one).
std::int64_t min_budget(const Var& loss) {
  try {
    ad::plan_backward(loss, ad::policy::budget(1));
  } catch (const ad::Error& e) {
    return ad::test::remat::parse_min_peak(e);
  }
  return -1;
}

// After backward under `pol`, each deleted forward value is recomputed on
// demand (ad::eval or Var::value(), alternately) with keep_all's bits, and
// the values recomputed on the way are freed again: only the asked-for
// value's storage stays. Returns how many were recomputed.
int check_recompute_on_demand(const std::function<RandomDag(ad::Graph&)>& build, const ad::Policy& pol) {
  ad::Graph g0;
  RandomDag d0 = build(g0);
  const std::map<std::int32_t, ad::Tensor> ref = keep_all_values(g0, d0.loss);

  ad::Graph g;
  RandomDag d = build(g);
  ad::Report r = ad::backward(d.loss, pol);
  CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  std::vector<std::int32_t> deleted;
  for (auto id : forward_nodes(g.impl(), d.loss.id()))
    if (!g.impl().node(id).value.defined()) deleted.push_back(id);
  // a seeded order, so later requests find some inputs present and some not
  ad::test::Picker pick(static_cast<std::uint64_t>(deleted.size()) * 31 + 7);
  for (std::size_t i = deleted.size(); i > 1; --i) std::swap(deleted[i - 1], deleted[pick(i)]);
  int n = 0;
  for (auto id : deleted) {
    CAPTURE(id);
    const ad::Node& nd = g.impl().node(id);
    if (nd.value.defined()) continue;  // recomputed as the input of an earlier request? it was freed again
    const std::int64_t live = g.live_bytes();
    const std::int32_t times = nd.times_computed;
    Var v(&g.impl(), id);
    ad::Tensor t = n % 2 ? v.value() : ad::eval(v);
    CHECK(ad::bitwise_equal(t, ref.at(id)));
    CHECK(nd.times_computed == times + 1);
    CHECK(v.has_value());
    if (!ad::op_def(nd.op).view) CHECK(g.live_bytes() == live + static_cast<std::int64_t>(nd.meta.nbytes()));
    else CHECK(g.live_bytes() <= live + static_cast<std::int64_t>(t.storage()->bytes()));
    ++n;
  }
  return n;
}

std::int64_t keep_all_peak(const std::function<RandomDag(ad::Graph&)>& build) {
  ad::Graph g;
  RandomDag d = build(g);
  return ad::plan_backward(d.loss).schedule.predicted_peak_bytes;
}

ad::test::remat::Outcome run(const std::function<RandomDag(ad::Graph&)>& build, const ad::Policy& pol) {
  ad::Graph g;
  RandomDag d = build(g);
  return ad::test::remat::run(g, d, pol);
}

}  // namespace

TEST_CASE("remat: deleted values are recomputed on demand after backward, bitwise equal to keep_all") {
  int total = 0;
  // a deep chain with dropout, and random DAGs (some of them chains)
  std::vector<std::function<RandomDag(ad::Graph&)>> builds = {
      [](ad::Graph& g) { return deep_chain(g, 40, 4, DType::f32, true); },
      [](ad::Graph& g) { return deep_chain(g, 25, 3, DType::f64, true); }};
  for (std::uint64_t seed = 1; seed <= 24; ++seed)
    builds.push_back([seed](ad::Graph& g) {
      return seed % 4 == 0 ? ad::test::random_chain(g, seed, 60 + static_cast<std::int64_t>(seed) * 5)
                           : ad::test::random_dag(g, seed, 60 + static_cast<std::int64_t>(seed) * 5);
    });
  for (std::size_t i = 0; i < builds.size(); ++i) {
    CAPTURE(i);
    int n = check_recompute_on_demand(builds[i], ad::policy::sqrt_n());
    CHECK(n > 0);
    total += n;
    // budget: a quarter of keep_all's peak where feasible, else the minimum
    ad::Graph g;
    RandomDag d = builds[i](g);
    const std::int64_t b = std::max(keep_all_peak(builds[i]) / 4, min_budget(d.loss));
    REQUIRE(b > 0);
    n = check_recompute_on_demand(builds[i], ad::policy::budget(b));
    CHECK(n > 0);
    total += n;
  }
  MESSAGE("values recomputed on demand: " << total);
}

TEST_CASE("remat: plan cache: the same structure on a fresh graph hits, another structure or shape misses") {
  using Build = std::function<RandomDag(ad::Graph&)>;
  auto dag = [](std::uint64_t seed) -> Build {
    return [seed](ad::Graph& g) { return ad::test::random_dag(g, seed, 80); };
  };
  auto chain = [](std::uint64_t seed) -> Build {
    return [seed](ad::Graph& g) { return ad::test::random_chain(g, seed, 60); };
  };
  for (std::uint64_t seed : {3, 4, 5}) {
    CAPTURE(seed);
    const Build same = dag(seed), other = dag(seed + 100), same_chain = chain(seed);
    const ad::test::remat::Outcome ref = run(same, ad::policy::keep_all());
    const ad::test::remat::Outcome ref_chain = run(same_chain, ad::policy::keep_all());
    std::int64_t half = keep_all_peak(same) / 2;
    {
      ad::Graph g, g2;  // feasible for the other structure too
      half = std::max({half, min_budget(same(g).loss), min_budget(other(g2).loss)});
    }
    struct Case {
      ad::Policy pol;
      bool chain;
    };
    std::vector<Case> cases = {{ad::policy::uniform(3), false},
                               {ad::policy::sqrt_n(), false},
                               {ad::policy::selective(ad::save_matmuls), false},
                               {ad::policy::budget(half), false},
                               {ad::policy::optimal_chain(3), true},
                               {ad::policy::sqrt_n(), true}};
    for (const auto& c : cases) {
      CAPTURE(c.pol.name());
      CAPTURE(c.chain);
      const Build& build = c.chain ? same_chain : same;
      const auto& want = c.chain ? ref_chain : ref;
      ad::Graph g1, g2, g3, g4;
      RandomDag d1 = build(g1), d2 = build(g2);
      ad::Report r1 = ad::backward(d1.loss, c.pol);
      CHECK_FALSE(r1.plan_cached);
      ad::test::check_bitwise(ad::test::grads_of(d1.params), want.grads);
      ad::Report r2 = ad::backward(d2.loss, c.pol);
      CHECK(r2.plan_cached);
      CHECK(r2.predicted_peak_bytes == r2.measured_peak_bytes);
      CHECK(r2.measured_peak_bytes == r1.measured_peak_bytes);
      ad::test::check_bitwise(ad::test::grads_of(d2.params), want.grads);
      REQUIRE(r1.plan->schedule.steps.size() == r2.plan->schedule.steps.size());
      CHECK(std::equal(r1.plan->schedule.steps.begin(), r1.plan->schedule.steps.end(), r2.plan->schedule.steps.begin(),
                       [](const ad::Step& a, const ad::Step& b) {
                         return a.kind == b.kind && a.node == b.node && a.aux == b.aux;
                       }));
      // another structure misses (and is then cached too); copies of the policy share its cache
      RandomDag d3 = c.chain ? chain(seed + 100)(g3) : other(g3);
      CHECK_FALSE(ad::backward(d3.loss, c.pol).plan_cached);
      ad::Policy copy = c.pol;
      RandomDag d4 = build(g4);
      ad::Report r4 = ad::backward(d4.loss, copy);
      CHECK(r4.plan_cached);
      ad::test::check_bitwise(ad::test::grads_of(d4.params), want.grads);
    }
  }
  // same ops, another shape or dtype: misses; checkpoint marks are part of the structure
  ad::Policy pol = ad::policy::manual();
  auto step = [&](std::int64_t rows, DType t, bool mark) {
    ad::Graph g;
    RandomDag d = deep_chain(g, 12, rows, t);
    if (mark) ad::checkpoint(d.pool[5]);
    ad::Report r = ad::backward(d.loss, pol);
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    return r.plan_cached;
  };
  CHECK_FALSE(step(4, DType::f32, true));
  CHECK(step(4, DType::f32, true));
  CHECK_FALSE(step(5, DType::f32, true));
  CHECK_FALSE(step(4, DType::f64, true));
  CHECK_FALSE(step(4, DType::f32, false));
  CHECK(step(5, DType::f32, true));
  CHECK(step(4, DType::f32, true));
  // keep_all has nothing to plan: it is never cached
  ad::Graph g;
  CHECK_FALSE(ad::backward(deep_chain(g, 3).loss).plan_cached);
}

TEST_CASE("remat: explain and Report fields, sqrt_n vs keep_all on a deep chain") {
  ad::Graph ga, gs;
  RandomDag da = deep_chain(ga, 64), ds = deep_chain(gs, 64);
  ad::Report ra = ad::backward(da.loss, ad::policy::keep_all());
  ad::Report rs = ad::backward(ds.loss, ad::policy::sqrt_n());
  ad::test::check_bitwise(ad::test::grads_of(ds.params), ad::test::grads_of(da.params));
  CHECK(ra.recomputed_nodes == 0);
  CHECK(ra.recompute_flops == 0);
  CHECK(rs.recomputed_nodes > 0);
  CHECK(rs.recompute_flops > 0);
  CHECK(rs.kept_bytes > 0);
  CHECK(rs.kept_bytes < ra.kept_bytes);
  CHECK(rs.measured_peak_bytes < ra.measured_peak_bytes);
  CHECK(rs.predicted_peak_bytes == rs.measured_peak_bytes);
  CHECK(rs.computed_nodes == ra.computed_nodes + rs.recomputed_nodes);
  CHECK(rs.policy == "sqrt_n");
  CHECK(ra.policy == "keep_all");

  const std::string ea = ad::explain(*ra.plan), es = ad::explain(*rs.plan);
  CHECK(ea.find("recomputed") == std::string::npos);
  CHECK(es.find("recomputed") != std::string::npos);
  CHECK(es.find("sqrt_n") != std::string::npos);
  // every forward node the run computed more than once is listed as recomputed that many extra times
  std::map<std::int32_t, std::string> rows;
  std::istringstream lines(es);
  for (std::string line; std::getline(lines, line);)
    if (line.size() > 2 && line[0] == '|' && line[2] >= '0' && line[2] <= '9') rows[std::stoi(line.substr(2))] = line;
  int recomputed = 0;
  for (std::int32_t id = 0; id <= ds.loss.id(); ++id) {
    const ad::Node& nd = gs.impl().node(id);
    if (nd.last_run_computes < 2) continue;
    CAPTURE(id);
    REQUIRE(rows.count(id));
    CHECK(rows[id].find(fmt::format("recomputed x{}", nd.last_run_computes - 1)) != std::string::npos);
    ++recomputed;
  }
  CHECK(recomputed > 0);
  // the printed report names the policy and the peaks
  const std::string table = fmt::format("{}", rs);
  CHECK(table.find("sqrt_n") != std::string::npos);
  CHECK(table.find(std::to_string(rs.measured_peak_bytes)) != std::string::npos);
}

TEST_CASE("remat: dropout inside recomputed segments gives bitwise equal gradients") {
  for (DType t : {DType::f32, DType::f64}) {
    CAPTURE(t == DType::f32);
    auto build = [t](ad::Graph& g) { return deep_chain(g, 30, 5, t, true); };
    const ad::test::remat::Outcome ref = run(build, ad::policy::keep_all());
    std::int64_t min_b;
    {
      ad::Graph g;
      min_b = min_budget(build(g).loss);
    }
    REQUIRE(min_b > 0);
    for (const ad::Policy& pol : {ad::policy::sqrt_n(), ad::policy::uniform(2), ad::policy::manual(),
                                  ad::policy::budget(min_b), ad::policy::optimal_chain(2),
                                  ad::policy::selective(ad::save_matmuls)}) {
      CAPTURE(pol.name());
      ad::Graph g;
      RandomDag d = build(g);
      ad::Report r = ad::backward(d.loss, pol);
      CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
      ad::test::check_bitwise(ad::test::grads_of(d.params), ref.grads);
      CHECK(ad::bitwise_equal(d.loss.value(), ref.loss));
      int dropouts_recomputed = 0;
      for (const ad::Node& nd : g.impl().nodes) dropouts_recomputed += nd.op == ad::OpId::dropout && nd.last_run_computes > 1;
      CHECK(dropouts_recomputed > 0);
    }
  }
}

TEST_CASE("remat: a recomputed segment holds what backward reads, not the ops' other outputs") {
  // 16 layers of tanh(x W + b) on [8, 32] values (1 KiB each), checkpoints
  // after layers 4, 8 and 12. Backward of the last segment recomputes layers
  // 13..16: held at once are the 3 checkpoints, the segment's tanh outputs
  // (4) and at most 3 transients (a matmul and a bias output while the next
  // op reads them, or dY / dX), plus the loss scalars. Gradients of W and b
  // go straight into fresh gradient buffers (0 graph bytes). Before values
  // were freed when spent, every matmul and bias output of the segment
  // stayed until the segment's backward was done (18 values).
  ad::Rng rng(17);
  std::vector<ad::Parameter> w, b;
  for (int i = 0; i < 16; ++i) {
    w.push_back(ad::Parameter::randn({32, 32}, rng, 0.2));
    b.push_back(ad::Parameter::zeros({32}));
  }
  ad::Tensor x = ad::Tensor::randn({8, 32}, rng), y = ad::Tensor::randn({8, 32}, rng);
  const std::int64_t act = 8 * 32 * 4;
  auto step = [&](const ad::Policy& pol, bool marks) {
    for (auto& p : w) p.zero_grad();
    for (auto& p : b) p.zero_grad();
    ad::Graph g;
    Var h = g.input(x);
    for (int i = 0; i < 16; ++i) {
      h = ad::tanh(ad::add(ad::matmul(h, w[static_cast<std::size_t>(i)]), b[static_cast<std::size_t>(i)]));
      if (marks && (i + 1) % 4 == 0 && i + 1 < 16) h = ad::checkpoint(h);
    }
    ad::Report r = ad::backward(ad::mse(h, g.input(y)), pol);
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    std::vector<ad::Tensor> grads;
    for (auto& p : w) grads.push_back(p.grad().clone());
    return std::make_pair(r, grads);
  };
  auto [ref, ref_grads] = step(ad::policy::keep_all(), false);
  auto [man, man_grads] = step(ad::policy::manual(), true);
  CHECK(man.recomputed_nodes > 0);
  MESSAGE("manual every 4th layer: peak ", man.measured_peak_bytes, " B = ", double(man.measured_peak_bytes) / act,
          " activations (keep_all ", double(ref.measured_peak_bytes) / act, ")");
  CHECK(man.measured_peak_bytes <= (3 + 4 + 3) * act + 64);
  for (std::size_t i = 0; i < ref_grads.size(); ++i) CHECK(ad::bitwise_equal(man_grads[i], ref_grads[i]));
}

// Runs f on a thread with a stack of `bytes` (pthreads: std::thread cannot
// choose); rethrows what f threw.
#include <pthread.h>

#include <exception>

namespace {
void on_small_stack(std::size_t bytes, const std::function<void()>& f) {
  struct Job {
    const std::function<void()>* f;
    std::exception_ptr error;
  } job{&f, nullptr};
  auto body = [](void* p) -> void* {
    auto* j = static_cast<Job*>(p);
    try {
      (*j->f)();
    } catch (...) {
      j->error = std::current_exception();
    }
    return nullptr;
  };
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, bytes) == 0);
  pthread_t t;
  REQUIRE(pthread_create(&t, &attr, body, &job) == 0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
  if (job.error) std::rethrow_exception(job.error);
}
}  // namespace

TEST_CASE("remat: budget plans a chain far deeper than the stack would allow a recursive demand") {
  // The budget planner's DTR runs demanded a value by recursing over its
  // inputs: a chain of 20,000 layers overflowed an 8 MiB stack (SIGSEGV). On
  // a 1 MiB stack that recursion died at a few thousand layers; 4,000 layers
  // (12,000 nodes deep) plan and run here, predicted == measured <= budget.
  const int layers = 4000;
  ad::Graph g0;
  RandomDag d0 = deep_chain(g0, layers);
  const std::int64_t top = ad::plan_backward(d0.loss).schedule.predicted_peak_bytes;
  const std::int64_t budget = top / 4;
  ad::Report r;
  // sanitizers' frames are larger throughout: more room there (the check is Release's)
#if defined(__SANITIZE_ADDRESS__)
  const std::size_t stack = std::size_t{8} << 20;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  const std::size_t stack = std::size_t{8} << 20;
#else
  const std::size_t stack = std::size_t{1} << 20;
#endif
#else
  const std::size_t stack = std::size_t{1} << 20;
#endif
  on_small_stack(stack, [&] {
    ad::Graph g;
    RandomDag d = deep_chain(g, layers);
    r = ad::backward(d.loss, ad::policy::budget(budget));
  });
  CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  CHECK(r.measured_peak_bytes <= budget);
  CHECK(r.recomputed_nodes > 0);
}

TEST_CASE("remat: sqrt_n keeps a recurrent cell's state, not its gates") {
  // A GRU-like cell unrolled 48 steps with a loss summed over the steps. Every
  // ceil(sqrt(n))-th value (sqrt_n until it placed boundaries) landed on gates,
  // so recomputing a state restarted from the first step: peak 0.82 of
  // keep_all. The state and the running loss are what crosses each step's
  // boundary; keeping them: 0.19. Gradients stay keep_all's, bit for bit.
  ad::Rng rng(5);
  const int H = 32, B = 8, T = 48;
  ad::Parameter wz = ad::Parameter::randn({H, H}, rng, 0.2), wc = ad::Parameter::randn({H, H}, rng, 0.2),
                wo = ad::Parameter::randn({H, H}, rng, 0.2);
  const ad::Tensor x = ad::Tensor::randn({B, H}, rng);
  auto run = [&](const ad::Policy& pol) {
    for (ad::Parameter* p : {&wz, &wc, &wo}) p->zero_grad();
    ad::Graph g;
    Var h = g.input(x), loss;
    for (int t = 0; t < T; ++t) {
      Var z = ad::sigmoid(ad::matmul(h, wz));
      Var c = ad::tanh(ad::matmul(h, wc));
      h = z * h + (1.0 - z) * c;
      Var o = ad::matmul(h, wo);
      Var step = ad::mean(o * o);
      loss = t == 0 ? step : loss + step;
    }
    ad::Report r = ad::backward(loss, pol);
    std::vector<std::vector<double>> grads;
    for (ad::Parameter* p : {&wz, &wc, &wo}) grads.push_back(p->grad().to_vector());
    return std::make_pair(r, grads);
  };
  auto [r0, g0] = run(ad::policy::keep_all());
  auto [r1, g1] = run(ad::policy::sqrt_n());
  CHECK(r1.predicted_peak_bytes == r1.measured_peak_bytes);
  CHECK(static_cast<double>(r1.measured_peak_bytes) < 0.3 * static_cast<double>(r0.measured_peak_bytes));
  CHECK(g0 == g1);
}

TEST_CASE("remat: Graph::release drops computed values (the loss read before backward no longer pins the forward)") {
  auto build = [](ad::Graph& g) { return deep_chain(g, 30, 16, DType::f32, true); };
  // reference: backward without reading anything first
  std::vector<ad::Tensor> want;
  std::int64_t clean_peak = 0;
  {
    ad::Graph g;
    RandomDag d = build(g);
    ad::Report r = ad::backward(d.loss, ad::policy::sqrt_n());
    want = ad::test::grads_of(d.params);
    clean_peak = r.measured_peak_bytes;
    for (auto& p : d.params) p.zero_grad();
  }
  ad::Graph g;
  RandomDag d = build(g);
  ad::Tensor loss_before = d.loss.value().clone();
  for (const Var& v : d.pool) (void)ad::eval(v);  // intermediates read for logging: each stays held
  const std::int64_t held = g.live_bytes();
  const std::int64_t loss_bytes = static_cast<std::int64_t>(d.loss.value().nbytes());
  CHECK(held > 10 * loss_bytes);
  CHECK(g.release({d.loss}) == held - loss_bytes);
  CHECK(g.live_bytes() == loss_bytes);
  CHECK(d.loss.has_value());
  for (const Var& v : d.pool) CHECK_FALSE(v.has_value());
  ad::Report r = ad::backward(d.loss, ad::policy::sqrt_n());
  CHECK(r.baseline_bytes == loss_bytes);
  // the step a graph nothing was read from runs, less the loss (held before it began)
  CHECK(r.measured_peak_bytes + loss_bytes == clean_peak);
  ad::test::check_bitwise(ad::test::grads_of(d.params), want);
  CHECK(ad::bitwise_equal(d.loss.value(), loss_before));
  // everything, the loss too: recomputed on demand, the same bits (dropout's masks are seeded)
  g.release();
  CHECK(g.live_bytes() == 0);
  CHECK_FALSE(d.loss.has_value());
  CHECK(ad::bitwise_equal(d.loss.value(), loss_before));
  // leaves stay; a Var of another graph is an error
  ad::Graph other;
  Var x = other.input(ad::Tensor::ones({2}));
  CHECK(other.release() == 0);
  CHECK(x.has_value());
  EXPECT_ERROR(g.release({x}), "Graph::release", "keep[0]", "another graph");
  EXPECT_ERROR(g.release({Var{}}), "Graph::release", "undefined");
}
