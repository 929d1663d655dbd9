// The planner and executor at the edges: a backward with no forward step
// left to run, a run that throws half way, a policy copy edited after use.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "test_util.hpp"

namespace {
std::vector<double> grad_of(const ad::Parameter& p) { return p.grad().to(ad::DType::f64).to_vector(); }
}  // namespace

TEST_CASE("remat: a backward whose forward values are all present, under every policy") {
  // the loss is evaluated first, or a second backward runs on the same graph:
  // the plan has gradient steps only (optimal_chain and budget once wrote past
  // their per-step table here)
  for (int second : {0, 1}) {
    for (int which = 0; which < 4; ++which) {
      ad::Rng rng(0);
      ad::Parameter W = ad::Parameter::randn({4, 4}, rng);
      ad::Graph g;
      ad::Var x = g.input(ad::Tensor::randn({4, 4}, rng));
      ad::Var loss = ad::sum(ad::mul(x, W));
      ad::Report ref = ad::backward(loss);  // keep_all: computes the loss, one gradient
      std::vector<double> once = grad_of(W);
      if (!second) {
        W.zero_grad();
        loss.value();
      }
      ad::Policy pol = which == 0   ? ad::policy::optimal_chain(2)
                       : which == 1 ? ad::policy::budget(1 << 20)
                       : which == 2 ? ad::policy::budget(ref.measured_peak_bytes)
                                    : ad::policy::sqrt_n();
      CAPTURE(pol.name());
      CAPTURE(second);
      ad::Report r = ad::backward(loss, pol);
      CHECK(r.measured_peak_bytes == r.predicted_peak_bytes);
      std::vector<double> want = once;
      if (second)
        for (double& v : want) v *= 2;
      CHECK(grad_of(W) == want);
    }
  }
}

TEST_CASE("remat: a backward that throws half way leaves gradients and graph memory as they were") {
  for (int accumulated : {0, 1}) {
    ad::Rng rng(1);
    ad::Parameter W = ad::Parameter::randn({3, 1}, rng, 1.0, ad::DType::f64);
    ad::Tensor xt = ad::Tensor::randn({3, 3}, rng, ad::DType::f64), zt = ad::Tensor::randn({3, 3}, rng, ad::DType::f64);
    ad::Tensor lab = ad::Tensor::full({3}, 7.0, ad::DType::i64);  // out of range: 3 classes
    ad::Graph g;
    ad::Var loss = ad::add(ad::cross_entropy(g.input(zt), g.input(lab)), ad::sum(ad::matmul(ad::tanh(g.input(xt)), W)));
    std::vector<double> before;
    if (accumulated) {  // an earlier micro-batch's gradient (its own graph), to be kept
      ad::Tensor good = ad::Tensor::zeros({3}, ad::DType::i64);
      ad::Graph g0;
      ad::backward(ad::add(ad::cross_entropy(g0.input(zt), g0.input(good)), ad::sum(ad::matmul(ad::tanh(g0.input(xt)), W))));
      before = grad_of(W);
    }
    std::int64_t least = 0;
    try {
      ad::plan_backward(loss, ad::policy::budget(1));
    } catch (const ad::BudgetError& e) {
      least = e.least_peak;
    }
    REQUIRE(least > 0);
    ad::Policy pol = ad::policy::budget(least);
    // a plan that adds W's gradient before the loss's last forward step (the one that throws)
    ad::Plan p = ad::plan_backward(loss, pol);
    bool early = false, seen_acc = false;
    for (const auto& st : p.schedule.steps) {
      if (st.kind == ad::Step::Kind::accumulate || (st.kind == ad::Step::Kind::compute && st.aux >= 0)) seen_acc = true;
      if (st.kind == ad::Step::Kind::compute && st.node <= loss.id() && seen_acc) early = true;
    }
    CAPTURE(accumulated);
    CHECK(early);  // (else this test does not test what it says)
    const std::int64_t live = g.live_bytes();
    CHECK_THROWS_WITH_AS(ad::backward(loss, pol), doctest::Contains("cross_entropy"), ad::Error);
    CHECK(g.live_bytes() == live);  // the failed run's values are gone
    if (accumulated) {
      CHECK(grad_of(W) == before);
      CHECK(W.has_fresh_grad());
    } else {
      CHECK_FALSE(W.has_grad());
    }
    // fixed labels: the same plan fits again, and the gradient is the reference's
    lab.fill(0.0);
    ad::Report r = ad::backward(loss, pol);
    CHECK(r.measured_peak_bytes <= least);
    ad::Rng rng2(1);
    ad::Parameter W2 = ad::Parameter::randn({3, 1}, rng2, 1.0, ad::DType::f64);
    ad::Graph g2;
    ad::Var loss2 = ad::add(ad::cross_entropy(g2.input(zt), g2.input(lab)), ad::sum(ad::matmul(ad::tanh(g2.input(xt)), W2)));
    ad::backward(loss2);
    if (accumulated) ad::backward(loss2);
    CHECK(grad_of(W) == grad_of(W2));
  }
}

TEST_CASE("remat: a policy copy with other settings does not reuse the original's plans") {
  std::vector<ad::Parameter> ps;
  ad::Rng init(3);
  for (int i = 0; i < 3; ++i) ps.push_back(ad::Parameter::randn({16, 16}, init, 0.3));
  auto build = [&](ad::Graph& g) {
    ad::Rng rng(4);
    ad::Var h = g.input(ad::Tensor::randn({8, 16}, rng));
    for (int i = 0; i < 12; ++i) h = ad::tanh(ad::matmul(h, ps[static_cast<std::size_t>(i % 3)]));
    return ad::mean(ad::mul(h, h));
  };
  std::int64_t peak = 0;
  {
    ad::Graph g;
    peak = ad::backward(build(g)).measured_peak_bytes;
  }
  ad::Policy big = ad::policy::budget(peak);
  {
    ad::Graph g;
    ad::backward(build(g), big);
  }
  ad::Policy small = big;  // shares big's plan cache
  small.budget_bytes = peak * 3 / 4;
  {
    ad::Graph g;
    ad::Report r = ad::backward(build(g), small);
    CHECK_FALSE(r.plan_cached);
    CHECK(r.measured_peak_bytes <= small.budget_bytes);
    CHECK(r.policy == small.name());
  }
  ad::Policy u = ad::policy::uniform(1);
  std::int64_t recomputed1 = 0;
  {
    ad::Graph g;
    recomputed1 = ad::backward(build(g), u).recomputed_nodes;
  }
  u.every = 4;
  {
    ad::Graph g;
    ad::Report r = ad::backward(build(g), u);
    CHECK_FALSE(r.plan_cached);
    CHECK(r.recomputed_nodes > recomputed1);
    CHECK(r.policy == "uniform(4)");
  }
  // a selective copy given another predicate (another function or lambda)
  ad::Policy sel = ad::policy::selective(ad::save_matmuls);
  std::int64_t recomputed_sel = 0;
  {
    ad::Graph g;
    recomputed_sel = ad::backward(build(g), sel).recomputed_nodes;
  }
  sel.keep = [](const ad::NodeInfo&) { return true; };  // keep everything: nothing to recompute
  {
    ad::Graph g;
    ad::Report r = ad::backward(build(g), sel);
    CHECK_FALSE(r.plan_cached);
    CHECK(r.recomputed_nodes == 0);
    CHECK(recomputed_sel > 0);
  }
  // the same lambda type with other captures: the plan follows what the predicate keeps
  auto keep_over = [](std::int64_t bytes) { return [bytes](const ad::NodeInfo& i) { return i.bytes > bytes; }; };
  ad::Policy cap = ad::policy::selective(keep_over(std::int64_t{1} << 40));  // keeps nothing
  std::int64_t recomputed_none = 0;
  {
    ad::Graph g;
    recomputed_none = ad::backward(build(g), cap).recomputed_nodes;
  }
  {
    ad::Graph g;
    CHECK(ad::backward(build(g), cap).plan_cached);  // same predicate, same graph: the cached plan
  }
  cap.keep = keep_over(0);  // same type, keeps every value
  {
    ad::Graph g;
    ad::Report r = ad::backward(build(g), cap);
    CHECK_FALSE(r.plan_cached);
    CHECK(r.recomputed_nodes == 0);
    CHECK(recomputed_none > 0);
  }
  CHECK(ad::policy::sqrt_n().compressed(ad::DType::bf16).name() == "sqrt_n+bf16");
  CHECK(ad::policy::sqrt_n().offloaded().name() == "sqrt_n+offload");
}

TEST_CASE("remat: budget plans a graph of thousands of nodes (DTR runs are bounded inside one demand)") {
  // 600 layers with a skip connection every 4: about 3,900 nodes. A DTR run
  // at a low memory level once recursed through one demand without its step
  // limit: minutes and more than 20 GB before std::bad_alloc.
  const int L = 600;
  ad::Rng rng(0);
  std::vector<ad::Parameter> ps;
  for (int i = 0; i < L; ++i) ps.push_back(ad::Parameter::randn({32, 32}, rng, 0.1));
  ad::Tensor x = ad::Tensor::randn({16, 32}, rng);
  auto build = [&](ad::Graph& g) {
    ad::Var h = g.input(x), skip = h;
    for (int i = 0; i < L; ++i) {
      h = ad::tanh(ad::matmul(h, ps[static_cast<std::size_t>(i)]));
      if (i % 4 == 3) {
        h = ad::add(h, skip);
        skip = h;
      }
    }
    return ad::mean(ad::mul(h, h));
  };
  std::int64_t peak = 0;
  std::vector<std::vector<double>> ref;
  {
    ad::Graph g;
    peak = ad::backward(build(g)).measured_peak_bytes;
    for (auto& p : ps) ref.push_back(grad_of(p));
  }
  for (double frac : {0.5, 0.25}) {
    for (auto& p : ps) p.zero_grad();
    ad::Graph g;
    ad::Report r = ad::backward(build(g), ad::policy::budget(static_cast<std::int64_t>(static_cast<double>(peak) * frac)));
    CAPTURE(frac);
    CHECK(r.measured_peak_bytes == r.predicted_peak_bytes);
    CHECK(static_cast<double>(r.measured_peak_bytes) <= static_cast<double>(peak) * frac);
    for (std::size_t i = 0; i < ps.size(); ++i) REQUIRE(grad_of(ps[i]) == ref[i]);
  }
}

TEST_CASE("remat: a policy whose fields were edited to invalid values is an ad::Error at backward") {
  ad::Rng init(1);
  ad::Parameter w = ad::Parameter::randn({4, 4}, init, 0.5);
  auto run = [&](const ad::Policy& pol) {
    ad::Graph g;
    ad::Rng rng(2);
    ad::Var h = g.input(ad::Tensor::randn({3, 4}, rng));
    for (int i = 0; i < 4; ++i) h = ad::tanh(ad::matmul(h, w));
    ad::backward(ad::mean(h), pol);
  };
  auto fails_with = [&](ad::Policy pol, const std::string& what) {
    INFO(what);
    CHECK_THROWS_WITH_AS(run(pol), doctest::Contains(what.c_str()), ad::Error);
  };
  ad::Policy u = ad::policy::uniform(2);
  u.every = 0;  // was a division by zero
  fails_with(u, "`every` must be >= 1, got 0");
  ad::Policy s = ad::policy::selective(ad::save_matmuls);
  s.keep = nullptr;  // was std::bad_function_call
  fails_with(s, "`keep` is an empty predicate");
  ad::Policy b = ad::policy::budget(1 << 20);
  b.budget_bytes = -5;
  fails_with(b, "negative budget_bytes -5");
  ad::Policy c = ad::policy::optimal_chain(3);
  c.slots = 0;
  fails_with(c, "`slots` must be >= 1, got 0");
  ad::Policy z = ad::policy::sqrt_n();
  z.compress = ad::DType::i64;
  fails_with(z, "`compress` must be f32 (off), f16 or bf16");
  ad::Policy bo = ad::policy::budget(1 << 20);
  bo.offload = true;
  fails_with(bo, "compression and offload apply to keep-set policies only");
  ad::Policy co = ad::policy::manual().compressed(ad::DType::bf16);
  co.offload = true;
  fails_with(co, "compression and offload cannot be combined");
  ad::Policy k = ad::policy::manual();
  k.kind = static_cast<ad::Policy::Kind>(99);
  fails_with(k, "policy kind 99 is not one of Policy::Kind");
  // and a valid edit still runs
  u.every = 3;
  CHECK_NOTHROW(run(u));
}

TEST_CASE("remat: manual keeps what a checkpointed view views (a reshape, attention's output)") {
  ad::Rng rng(0);
  ad::Parameter w1 = ad::Parameter::randn({16, 16}, rng, 0.3), w2 = ad::Parameter::randn({16, 16}, rng, 0.3);
  ad::Tensor x = ad::Tensor::randn({8, 16}, rng);
  auto run = [&](int mark) {
    ad::Graph g;
    ad::Var t = ad::tanh(ad::matmul(g.input(x), w1));
    ad::Var r = ad::reshape(t, {8, 16});  // a view of t
    if (mark == 1) ad::checkpoint(t);
    if (mark == 2) ad::checkpoint(r);
    return ad::backward(ad::sum(ad::tanh(ad::matmul(r, w2))), ad::policy::manual());
  };
  const ad::Report none = run(0), base = run(1), view = run(2);
  CHECK(base.recomputed_nodes < none.recomputed_nodes);
  CHECK(view.recomputed_nodes == base.recomputed_nodes);  // was none's: the mark on the view kept nothing
  CHECK(view.measured_peak_bytes == base.measured_peak_bytes);
  // attention's output is a part of the op's buffer: marking it keeps the attention
  ad::Tensor q = ad::Tensor::randn({1, 1, 32, 16}, rng);
  auto att = [&](bool mark) {
    ad::Graph g;
    ad::Var qv = g.input(q);
    ad::Var h = ad::tanh(ad::matmul(ad::reshape(qv, {32, 16}), w1));
    ad::Var a = ad::attention(ad::reshape(h, {1, 1, 32, 16}), ad::reshape(h, {1, 1, 32, 16}),
                              ad::reshape(h, {1, 1, 32, 16}));
    if (mark) ad::checkpoint(a);
    return ad::backward(ad::sum(ad::tanh(a)), ad::policy::manual());
  };
  const ad::Report unmarked = att(false), marked = att(true);
  CHECK(marked.recompute_flops < unmarked.recompute_flops);
}

TEST_CASE("remat: a graph with dropout drawn from an Rng reuses its plan (the stream position is not structure)") {
  using namespace ad::literals;
  ad::Rng init(0);
  ad::Parameter w = ad::Parameter::randn({64, 64}, init, 0.15);
  ad::Tensor x = ad::Tensor::randn({32, 64}, init);
  ad::Policy pol = ad::policy::budget(64_KiB);
  ad::Rng rng(5), ref_rng(5);
  for (int step = 0; step < 4; ++step) {
    auto build = [&](ad::Graph& g, ad::Rng& r) {
      ad::Var t = ad::tanh(ad::matmul(g.input(x), w));
      return ad::mean(ad::tanh(ad::matmul(ad::dropout(t, 0.1, r), w)));
    };
    w.zero_grad();
    ad::Report rep;
    {
      ad::Graph g;
      rep = ad::backward(build(g, rng), pol);
    }
    CHECK(rep.plan_cached == (step > 0));  // was false at every step
    ad::Tensor got = w.grad().clone();
    w.zero_grad();
    {
      ad::Graph g;
      ad::backward(build(g, ref_rng));  // keep_all, same masks
    }
    CHECK(ad::bitwise_equal(got, w.grad()));  // the cached plan runs this step's masks
  }
}
