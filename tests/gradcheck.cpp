// Float64 central-difference gradcheck of every differentiable op, driven by
// the op table (so no op escapes), plus the op-specific gradient properties
// (sign, dropout, cast, cross_entropy, mse, gather, embedding, max ties).
// Cases live in tests/gradcheck_cases.cpp.
#include <cmath>
#include <memory>
#include <string_view>

#include <doctest/doctest.h>

#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

namespace {
// The op names as spelled in ad/op_list.inc, by OpId.
const char* const kOpListNames[] = {
#define AD_OP(name, family) #name,
#include "ad/op_list.inc"
#undef AD_OP
};
static_assert(sizeof(kOpListNames) / sizeof(kOpListNames[0]) == static_cast<std::size_t>(kNumOps));

std::uint64_t weight_seed(std::size_t case_index) { return 7000 + case_index; }
bool is_leaf_op(OpId op) { return op == OpId::input || op == OpId::parameter; }
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
}  // namespace

// ---- the gradcheck, one subcase per op of the table ----
TEST_CASE("gradcheck") {
  const auto cases = gradcheck_cases();
  for (int i = 0; i < kNumOps; ++i) {
    auto op = static_cast<OpId>(i);
    bool any = false;
    for (const auto& c : cases) any |= c.op == op;
    if (!any) continue;  // the coverage test below says whether that is allowed
    SUBCASE(op_name(op)) {
      for (std::size_t k = 0; k < cases.size(); ++k) {
        if (cases[k].op != op) continue;
        INFO(fmt::format("gradcheck {} {}", op_name(op), cases[k].label));
        GradcheckResult r = gradcheck(cases[k], weight_seed(k));
        CHECK_MESSAGE(r.ok(), r.str());
      }
    }
  }
}

// ---- every case also runs in f32 ----
// tests/cuda.cpp runs each case on a GPU in f64 and in f32 (inputs given in f64
// cast to f32) against the CPU: a case whose build fixes a dtype of its own
// (a constant made in f64, say) then mixes dtypes and throws there, where no
// CI machine sees it. Here the same f32 run on the CPU, forward and gradients,
// each value within 1e-4 of its f64 run relative to the largest |value| of
// that output (f32 rounding through a few ops, not a wrong formula), infs
// and NaNs where the f64 run has them.
TEST_CASE("every gradcheck case also runs in f32, near its f64 result") {
  const auto cases = gradcheck_cases();
  auto run = [](const GradCase& c, DType t) {
    PGraph g;
    std::vector<Var> vs, wrt;
    for (const auto& x : c.inputs) {
      vs.push_back(g.input(x.dtype() == DType::f64 ? x.to(t) : x));
      if (x.dtype() == DType::f64) wrt.push_back(vs.back());
    }
    Var out = c.build(vs);
    Rng wr(91);
    Var loss = sum(mul(out, g.input(Tensor::randn(out.shape(), wr, DType::f64).to(out.dtype()))));
    std::vector<Tensor> vals{eval(out)};
    for (Var& gv : grad(loss, wrt)) vals.push_back(eval(gv));
    return vals;
  };
  int compared = 0;
  for (const auto& c : cases) {
    INFO(fmt::format("{} {}", op_name(c.op), c.label));
    std::vector<Tensor> a, b;
    CHECK_NOTHROW(a = run(c, DType::f64));
    CHECK_NOTHROW(b = run(c, DType::f32));  // a throwing case is reported, and the others still run
    if (a.empty() || a.size() != b.size()) {
      CHECK(a.size() == b.size());
      continue;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("value " << i << " (0: the output, then the gradients)");
      const auto x = a[i].to_vector(), y = b[i].to_vector();
      REQUIRE(x.size() == y.size());
      double scale = 0, worst = 0;
      int apart = 0;  // NaN or inf in one run only, or infs of opposite signs
      for (std::size_t k = 0; k < x.size(); ++k)
        if (std::isfinite(x[k])) scale = std::max(scale, std::abs(x[k]));
      for (std::size_t k = 0; k < x.size(); ++k) {
        if (!std::isfinite(x[k]) || !std::isfinite(y[k])) {
          if (!(x[k] == y[k] || (std::isnan(x[k]) && std::isnan(y[k])))) ++apart;
          continue;
        }
        worst = std::max(worst, std::abs(x[k] - y[k]));
      }
      CHECK(apart == 0);
      CHECK(worst <= 1e-4 * std::max(scale, 1e-6));
    }
    ++compared;
  }
  CHECK(compared == static_cast<int>(cases.size()));
}

// ---- every op of the table is gradchecked, or has a reason not to be ----
TEST_CASE("gradcheck covers the op table") {
  const auto cases = gradcheck_cases();
  // Cases per op (counted only if the built graph really contains the op), and
  // the ops that appear in the gradient graphs built for each op's cases.
  std::vector<int> ncases(static_cast<std::size_t>(kNumOps), 0);
  std::vector<std::vector<char>> in_grad_of(static_cast<std::size_t>(kNumOps),
                                            std::vector<char>(static_cast<std::size_t>(kNumOps), 0));
  for (const auto& c : cases) {
    PGraph g;
    std::vector<Var> vs, wrt;
    for (const auto& t : c.inputs) {
      vs.push_back(g.input(t));
      if (t.dtype() == DType::f64) wrt.push_back(vs.back());
    }
    Var out = c.build(vs);
    INFO(fmt::format("case {} {}", op_name(c.op), c.label));
    REQUIRE_FALSE(wrt.empty());
    bool present = false;
    for (std::int32_t id = 0; id <= out.id(); ++id) present |= g.impl().node(id).op == c.op;
    CHECK_MESSAGE(present, "the case's graph does not contain its op");
    if (present) ++ncases[static_cast<std::size_t>(c.op)];
    Var loss = sum(mul(out, g.input(Tensor::ones(out.shape(), DType::f64))));
    std::int32_t first_grad_node = static_cast<std::int32_t>(g.num_nodes());
    grad(loss, wrt);
    for (std::int32_t id = first_grad_node; id < g.num_nodes(); ++id)
      in_grad_of[static_cast<std::size_t>(c.op)][static_cast<std::size_t>(g.impl().node(id).op)] = 1;
  }
  auto find_op = [](std::string_view name) {
    for (int i = 0; i < kNumOps; ++i)
      if (name == op_def(static_cast<OpId>(i)).name) return i;
    return -1;
  };
  for (int i = 0; i < kNumOps; ++i) {
    auto op = static_cast<OpId>(i);
    const OpDef& d = op_def(op);
    std::string_view name = d.name ? d.name : "";
    INFO(fmt::format("op #{} {}", i, kOpListNames[i]));
    CHECK(name == kOpListNames[i]);
    bool has_infer = d.infer != nullptr, has_cpu = d.cpu != nullptr;
    CHECK(has_infer);
    CHECK_MESSAGE(has_cpu != is_leaf_op(op), "every op but the leaves (input, parameter) has a CPU kernel");
    int n = ncases[static_cast<std::size_t>(i)];
    if (d.backward) {
      CHECK_MESSAGE(n >= 3, fmt::format("{} is differentiable but has {} gradcheck cases (need >= 3)", name, n));
      CHECK_MESSAGE(d.no_grad == nullptr, "an op with a backward rule must not give a no_grad reason");
      continue;
    }
    // not differentiable: must say why, and be a leaf, a constant, or a fused *_backward op
    CHECK_MESSAGE(d.no_grad != nullptr, fmt::format("{} has no backward rule and no no_grad reason", name));
    CHECK_MESSAGE(n == 0, fmt::format("{} has no backward rule but {} gradcheck cases", name, n));
    if (d.stops_gradient) continue;  // detach: tests/edge_numerics.cpp checks that nothing flows
    if (d.arity == 0) continue;  // input, parameter, full
    // inference-only ops whose result is not a differentiable function of
    // their inputs: an argmax (i64 output), posterior marginals
    if (name == "semicrf_viterbi" || name == "semicrf_marginals") continue;
    bool fused = ends_with(name, "_backward");
    CHECK_MESSAGE(fused, fmt::format("{} has no backward rule and is neither a leaf/constant nor a fused *_backward op: "
                                     "give it a backward rule and gradcheck cases", name));
    if (!fused) continue;
    // checked through its parent's gradcheck: the parent has cases, and their gradient graphs use this op
    int parent = find_op(name.substr(0, name.size() - std::string_view("_backward").size()));
    REQUIRE_MESSAGE(parent >= 0, fmt::format("{} has no parent op", name));
    CHECK_MESSAGE(ncases[static_cast<std::size_t>(parent)] >= 3,
                  fmt::format("{}'s parent {} has too few gradcheck cases", name, op_def(static_cast<OpId>(parent)).name));
    CHECK_MESSAGE(in_grad_of[static_cast<std::size_t>(parent)][static_cast<std::size_t>(i)],
                  fmt::format("no gradcheck case of {} reaches {}", op_def(static_cast<OpId>(parent)).name, name));
  }
}

// ---- the harness itself can fail ----
TEST_CASE("gradcheck harness detects a wrong gradient and an unwritten output") {
  Rng rng(5);
  // the analytic graph (first build) computes 2x, the numeric ones 2.01x
  auto calls = std::make_shared<int>(0);
  GradCase wrong{OpId::mul_scalar, "2x vs 2.01x", {randn64({3, 4}, rng)}, [calls](const std::vector<Var>& v) {
                   return mul_scalar(v[0], (*calls)++ == 0 ? 2.0 : 2.01);
                 }};
  GradcheckResult r = gradcheck(wrong, 1);
  CHECK_FALSE(r.ok());
  CHECK(r.mismatches.size() == 12);
  // a NaN forward value (what a poisoned, unwritten element looks like) is reported
  GradCase nan_out{OpId::log, "log of negatives", {uniform64({4}, rng, -2, -1)},
                   [](const std::vector<Var>& v) { return log(v[0]); }};
  r = gradcheck(nan_out, 2);
  CHECK_FALSE(r.ok());
  CHECK_FALSE(r.problem.empty());
  // and a case whose graph lacks the op it claims is refused
  GradCase no_op{OpId::exp, "claims exp, builds tanh", {randn64({3}, rng)},
                 [](const std::vector<Var>& v) { return tanh(v[0]); }};
  CHECK_FALSE(gradcheck(no_op, 3).ok());
}

// ---- op-specific gradient properties ----
TEST_CASE("gradcheck sign: the gradient is exactly zero") {
  Rng rng(11);
  PGraph g;
  Tensor xt = away_from_zero({4, 5}, rng);
  Var x = g.input(xt);
  Tensor w = randn64({4, 5}, rng);
  // sign alone, and sign inside x * sign(x) = |x| (so only the x factor carries gradient)
  Var gs = grad(sum(mul(sign(x), g.input(w))), {x})[0];
  Var ga = grad(sum(mul(mul(x, sign(x)), g.input(w))), {x})[0];
  auto vs = eval(gs).to_vector(), va = eval(ga).to_vector(), vx = xt.to_vector(), vw = w.to_vector();
  for (std::size_t i = 0; i < vs.size(); ++i) {
    CHECK(vs[i] == 0.0);
    CHECK(va[i] == doctest::Approx(vw[i] * (vx[i] > 0 ? 1.0 : -1.0)).epsilon(1e-15));
  }
}

TEST_CASE("gradcheck dropout: the mask is a pure function of (seed, offset)") {
  Rng rng(12);
  Tensor xt = uniform64({1000}, rng, 0.5, 1.5), wt = randn64({1000}, rng);
  auto run = [&](std::uint64_t seed, std::uint64_t offset, Tensor* gx) {
    PGraph g;
    Var x = g.input(xt);
    Var y = dropout(x, 0.3, seed, offset);
    if (gx) *gx = eval(grad(sum(mul(y, g.input(wt))), {x})[0]).clone();
    return eval(y).clone();
  };
  Tensor gx;
  Tensor y1 = run(42, 7, &gx), y2 = run(42, 7, nullptr), y3 = run(42, 8, nullptr), y4 = run(43, 7, nullptr);
  CHECK(bitwise_equal(y1, y2));
  CHECK_FALSE(bitwise_equal(y1, y3));
  CHECK_FALSE(bitwise_equal(y1, y4));
  auto vy = y1.to_vector(), vx = xt.to_vector(), vg = gx.to_vector(), vw = wt.to_vector();
  int dropped = 0;
  for (std::size_t i = 0; i < vy.size(); ++i) {
    bool kept = vy[i] != 0.0;
    dropped += !kept;
    CHECK(vy[i] == doctest::Approx(kept ? vx[i] / 0.7 : 0.0).epsilon(1e-15));
    CHECK(vg[i] == doctest::Approx(kept ? vw[i] / 0.7 : 0.0).epsilon(1e-15));  // same mask on dy
  }
  CHECK(dropped > 240);  // p = 0.3 of 1000: 300 +- 14.5
  CHECK(dropped < 360);
  // offset o + 1 shifts the stream by one element: mask(o + 1)[i] == mask(o)[i + 1]
  auto v3 = y3.to_vector();
  int differ = 0;
  for (std::size_t i = 0; i + 1 < vy.size(); ++i) differ += (v3[i] != 0.0) != (vy[i + 1] != 0.0);
  CHECK(differ == 0);
}

TEST_CASE("gradcheck cast: the gradient is cast back to the input dtype") {
  Rng rng(13);
  Tensor xt = randn64({3, 5}, rng), wt = randn64({3, 5}, rng);
  for (DType mid : {DType::f32, DType::f16, DType::bf16}) {
    INFO(dtype_name(mid));
    PGraph g;
    Var x = g.input(xt);
    Var y = cast(cast(x, mid), DType::f64);
    CHECK(cast(x, mid).dtype() == mid);
    Var gx = grad(sum(mul(y, g.input(wt))), {x})[0];
    const Tensor& gv = eval(gx);
    CHECK(gv.dtype() == DType::f64);
    // d/dx = 1 through both casts: the weights, rounded once to the middle dtype
    CHECK(bitwise_equal(gv, wt.to(mid).to(DType::f64)));
    CHECK(bitwise_equal(eval(y), xt.to(mid).to(DType::f64)));
  }
}

TEST_CASE("gradcheck cross_entropy: logits only, mean and sum") {
  Rng rng(14);
  const std::int64_t n = 6, c = 5;
  Tensor lt = randn64({n, c}, rng, 0, 2), yt = Tensor::randint({n}, rng, c);
  auto lv = lt.to_vector();
  auto yv = yt.to_vector();
  double ref_sum = 0;
  std::vector<double> ref_grad(static_cast<std::size_t>(n * c));  // softmax - onehot
  for (std::int64_t r = 0; r < n; ++r) {
    double m = -INFINITY, s = 0;
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, lv[static_cast<std::size_t>(r * c + j)]);
    for (std::int64_t j = 0; j < c; ++j) s += std::exp(lv[static_cast<std::size_t>(r * c + j)] - m);
    auto label = static_cast<std::int64_t>(yv[static_cast<std::size_t>(r)]);
    ref_sum += m + std::log(s) - lv[static_cast<std::size_t>(r * c + label)];
    for (std::int64_t j = 0; j < c; ++j)
      ref_grad[static_cast<std::size_t>(r * c + j)] =
          std::exp(lv[static_cast<std::size_t>(r * c + j)] - m) / s - (j == label ? 1.0 : 0.0);
  }
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    double f = red == Reduction::mean ? 1.0 / static_cast<double>(n) : 1.0;
    INFO(std::string(red == Reduction::mean ? "mean" : "sum"));
    PGraph g;
    Var logits = g.input(lt), labels = g.input(yt);
    Var loss = cross_entropy(logits, labels, red);
    CHECK(loss.shape() == Shape{});
    CHECK(eval(loss).item() == doctest::Approx(ref_sum * f).epsilon(1e-12));
    // asking for the labels' gradient too: no gradient flows into integer labels
    auto gs = grad(loss, {logits, labels});
    auto ga = eval(gs[0]).to_vector();
    for (std::size_t i = 0; i < ga.size(); ++i) CHECK(ga[i] == doctest::Approx(ref_grad[i] * f).epsilon(1e-12));
    const Tensor& gy = eval(gs[1]);
    CHECK(gy.shape() == yt.shape());
    for (double v : gy.to_vector()) CHECK(v == 0.0);
  }
}

TEST_CASE("gradcheck mse: mean is sum / n, gradients 2 (a - b) [/ n]") {
  Rng rng(15);
  Tensor at = randn64({3, 4}, rng), bt = randn64({3, 4}, rng);
  auto va = at.to_vector(), vb = bt.to_vector();
  double ref = 0;
  for (std::size_t i = 0; i < va.size(); ++i) ref += (va[i] - vb[i]) * (va[i] - vb[i]);
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    double f = red == Reduction::mean ? 1.0 / 12.0 : 1.0;
    PGraph g;
    Var a = g.input(at), b = g.input(bt);
    Var loss = mse(a, b, red);
    CHECK(eval(loss).item() == doctest::Approx(ref * f).epsilon(1e-14));
    auto gs = grad(loss, {a, b});
    auto ga = eval(gs[0]).to_vector(), gb = eval(gs[1]).to_vector();
    for (std::size_t i = 0; i < va.size(); ++i) {
      CHECK(ga[i] == doctest::Approx(2 * (va[i] - vb[i]) * f).epsilon(1e-14));
      CHECK(gb[i] == doctest::Approx(-2 * (va[i] - vb[i]) * f).epsilon(1e-14));
    }
  }
}

TEST_CASE("gradcheck gather: repeated indices accumulate (scatter-add)") {
  Rng rng(16);
  // axis 0: rows 0 (x3) and 3 (x1) picked; axis 1: columns 2 (x2) and 0 (x1)
  Tensor xt = randn64({4, 3}, rng);
  {
    PGraph g;
    Var x = g.input(xt);
    Var gx = grad(sum(gather(x, g.input(index({0, 0, 3, 0}, {4})), 0)), {x})[0];
    CHECK(max_abs_diff(eval(gx), f64s({3, 3, 3, 0, 0, 0, 0, 0, 0, 1, 1, 1}, {4, 3})) == 0.0);
  }
  {
    PGraph g;
    Var x = g.input(xt);
    Var gx = grad(sum(gather(x, g.input(index({2, 0, 2}, {3})), 1)), {x})[0];
    CHECK(max_abs_diff(eval(gx), f64s({1, 0, 2, 1, 0, 2, 1, 0, 2, 1, 0, 2}, {4, 3})) == 0.0);
  }
}

TEST_CASE("gradcheck embedding: a row's gradient sums the weights of its ids") {
  Rng rng(17);
  const std::vector<std::int64_t> ids = {4, 1, 4, 0, 4, 1};
  Tensor table = randn64({5, 3}, rng), wt = randn64({2, 3, 3}, rng);
  PGraph g;
  Var t = g.input(table);
  Var e = embedding(t, g.input(index(ids, {2, 3})));
  CHECK(e.shape() == Shape{2, 3, 3});
  auto ev = eval(e).to_vector(), tv = table.to_vector(), wv = wt.to_vector();
  std::vector<double> ref(15, 0.0);
  for (std::size_t k = 0; k < ids.size(); ++k)
    for (std::size_t j = 0; j < 3; ++j) {
      CHECK(ev[k * 3 + j] == tv[static_cast<std::size_t>(ids[k]) * 3 + j]);
      ref[static_cast<std::size_t>(ids[k]) * 3 + j] += wv[k * 3 + j];
    }
  auto gv = eval(grad(sum(mul(e, g.input(wt))), {t})[0]).to_vector();
  for (std::size_t i = 0; i < ref.size(); ++i) CHECK(gv[i] == doctest::Approx(ref[i]).epsilon(1e-14));
  CHECK(gv[2 * 3] == 0.0);  // id 2 never looked up
}

TEST_CASE("gradcheck max: ties send the gradient to the first maximal element") {
  PGraph g;
  Var x = g.input(f64s({1, 3, 3, 2, 5, 5, 5, 0}, {2, 4}));
  auto gx = eval(grad(sum(max(x, {1})), {x})[0]);
  CHECK(max_abs_diff(gx, f64s({0, 1, 0, 0, 1, 0, 0, 0}, {2, 4})) == 0.0);
  auto g0 = eval(grad(sum(max(x, {})), {x})[0]);
  CHECK(max_abs_diff(g0, f64s({0, 0, 0, 0, 1, 0, 0, 0}, {2, 4})) == 0.0);
}
