// Optimizers: two steps of each against values worked out by hand (the
// formulas in include/ad/nn/optim.hpp, evaluated separately), clipping,
// schedule values, state save/restore, misuse.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "test_util.hpp"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ad/ad.hpp"

namespace {

using ad::DType;
using ad::Parameter;
using ad::Tensor;
namespace nn = ad::nn;

// Makes the gradient of each parameter exactly gs[i] (loss = sum_i sum(p_i * g_i)).
void set_grads(const std::vector<Parameter>& ps, const std::vector<std::vector<double>>& gs) {
  for (const auto& p : ps)
    if (p.has_grad()) p.zero_grad();
  ad::Graph g;
  ad::Var loss;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    Tensor gt = Tensor::from(std::span<const double>(gs[i]), ps[i].shape()).to(ps[i].dtype());
    ad::Var term = ad::sum(ad::mul(g.param(ps[i]), g.input(gt)));
    if (term.dtype() != DType::f64) term = ad::cast(term, DType::f64);
    loss = loss.defined() ? ad::add(loss, term) : term;
  }
  ad::backward(loss);
}

Parameter param(std::vector<double> v, DType t = DType::f64, std::string name = "w") {
  return Parameter(Tensor::from(std::span<const double>(v), {static_cast<std::int64_t>(v.size())}).to(t), name);
}

void check_values(const Parameter& p, const std::vector<double>& want, double tol) {
  auto got = p.value().to_vector();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol);
  }
}

// Two steps from p = [1, -2] with gradients [0.5, -1] then [-0.25, 2].
const std::vector<double> kG1{0.5, -1.0}, kG2{-0.25, 2.0};

template <class Opt, class Options>
void two_steps(Options o, const std::vector<double>& want1, const std::vector<double>& want2, double tol = 1e-14,
               DType t = DType::f64) {
  Parameter p = param({1.0, -2.0}, t);
  Opt opt(nn::NamedParameters{{"w", p}}, o);
  set_grads({p}, {kG1});
  opt.step();
  check_values(p, want1, tol);
  set_grads({p}, {kG2});
  opt.step();
  check_values(p, want2, tol);
  CHECK(opt.step_count() == 2);
}

}  // namespace

TEST_CASE("nn optim SGD two steps by hand") {
  nn::SGDOptions o;
  o.lr = 0.1;
  // plain: p -= 0.1 g
  two_steps<nn::SGD>(o, {0.95, -1.9}, {0.975, -2.1});
  // weight decay 0.1: g + 0.1 p -> [0.6, -1.2]; p = [0.94, -1.88];
  // then g = [-0.25 + 0.094, 2 - 0.188] = [-0.156, 1.812]; p = [0.9556, -2.0612]
  o.weight_decay = 0.1;
  two_steps<nn::SGD>(o, {0.94, -1.88}, {0.9556, -2.0612});
  // momentum 0.9: b = g1; p = [0.95, -1.9]; b = 0.9 b + g2 = [0.2, 1.1]; p = [0.93, -2.01]
  o.weight_decay = 0;
  o.momentum = 0.9;
  two_steps<nn::SGD>(o, {0.95, -1.9}, {0.93, -2.01});
  // dampening 0.5: first b = g1 (undamped, as PyTorch), then b = 0.9 b + 0.5 g2 = [0.325, 0.1]
  o.dampening = 0.5;
  two_steps<nn::SGD>(o, {0.95, -1.9}, {0.9175, -1.91});
  // nesterov: d = g + 0.9 b. step 1: b = g1, d = 1.9 g1 = [0.95, -1.9], p = [0.905, -1.81];
  // step 2: b = [0.2, 1.1], d = [-0.25 + 0.18, 2 + 0.99] = [-0.07, 2.99], p = [0.912, -2.109]
  o.dampening = 0;
  o.nesterov = true;
  two_steps<nn::SGD>(o, {0.905, -1.81}, {0.912, -2.109});
  // the same in f32, to f32 rounding
  two_steps<nn::SGD>(o, {0.905, -1.81}, {0.912, -2.109}, 1e-6, DType::f32);
}

TEST_CASE("nn optim Adam and AdamW two steps by hand") {
  nn::AdamOptions o;
  o.lr = 0.1;
  // step 1: m = 0.1 g, v = 0.001 g^2, bias-corrected m/sqrt(v) = sign(g):
  // p -= 0.1 * |g| / (|g| + 1e-8) * sign(g) = 1 - 0.1 (1 - 2e-8) = 0.900000002, -2 + 0.1 (1 - 1e-8).
  // step 2 (evaluated from the formulas): 0.8733662987078463, -1.9366103534720749
  two_steps<nn::Adam>(o, {0.900000002, -1.900000001}, {0.8733662987078463, -1.9366103534720749}, 1e-13);
  two_steps<nn::Adam>(o, {0.900000002, -1.900000001}, {0.8733662987078463, -1.9366103534720749}, 2e-6,
                      DType::f32);
  // AdamW, wd 0.1: p *= 1 - 0.01 first: 0.99 - 0.099999998 = 0.890000002, -1.98 + 0.099999999
  o.weight_decay = 0.1;
  two_steps<nn::AdamW>(o, {0.890000002, -1.880000001},
                       {0.8544662986878463, -1.897810353462075}, 1e-13);
  // Adam with L2 0.1: g = [0.6, -1.2] at step 1, so step 1 is as plain Adam (up to eps);
  // step 2: g = g2 + 0.1 p
  two_steps<nn::Adam>(o, {0.9000000016666666, -1.9000000008333333}, {0.8544413674617625, -1.9250178784643248}, 1e-13);
}

TEST_CASE("nn optim parameters without gradient are skipped") {
  Parameter a = param({1.0}, DType::f64, "a"), b = param({2.0}, DType::f64, "b");
  nn::Adam opt({a, b}, nn::AdamOptions{});
  set_grads({a}, {{1.0}});
  opt.step();
  CHECK(a.value().item() != 1.0);
  CHECK(b.value().item() == 2.0);
  auto st = opt.state();
  std::vector<std::string> names;
  for (auto& nt : st) names.push_back(nt.first);
  CHECK(names == std::vector<std::string>{"step", "a.step", "a.exp_avg", "a.exp_avg_sq"});
}

// One test per optimizer: a parameter that the step's loss did not reach
// (zero_grad() ran, nothing wrote its gradient since) keeps its value, its
// slots and its update count, even when its stale gradient is read.
template <class Opt, class Options> void check_unreached_is_skipped(Options o) {
  Parameter a = param({1.0}, DType::f64, "a"), b = param({2.0}, DType::f64, "b");
  Opt opt(nn::NamedParameters{{"a", a}, {"b", b}}, o);
  set_grads({a, b}, {{1.0}, {1.0}});
  opt.step();
  opt.zero_grad();
  set_grads({a}, {{1.0}});  // b is not in this loss
  CHECK(b.has_grad());      // the buffer is kept ...
  CHECK_FALSE(b.has_fresh_grad());  // ... but it holds no gradient of this step
  CHECK(a.has_fresh_grad());
  const double b1 = b.value().item(), a1 = a.value().item();
  auto state_of = [&](const std::string& prefix) {
    std::vector<std::pair<std::string, std::vector<double>>> out;
    for (auto& nt : opt.state())
      if (nt.first.rfind(prefix, 0) == 0) out.emplace_back(nt.first, nt.second.to(DType::f64).to_vector());
    return out;
  };
  auto before = state_of("b.");
  REQUIRE_FALSE(before.empty());
  CHECK(b.grad().item() == 0.0);  // reading the stale gradient gives zeros and does not make it fresh
  CHECK_FALSE(b.has_fresh_grad());
  opt.step();
  CHECK(b.value().item() == b1);
  CHECK(state_of("b.") == before);
  CHECK(a.value().item() != a1);
  // the next backward that reaches b steps it again
  opt.zero_grad();
  set_grads({a, b}, {{1.0}, {1.0}});
  opt.step();
  CHECK(b.value().item() != b1);
}

TEST_CASE("nn optim a parameter no loss reached since zero_grad is not stepped") {
  nn::SGDOptions s;
  s.lr = 0.1;
  s.momentum = 0.9;
  s.weight_decay = 0.01;
  check_unreached_is_skipped<nn::SGD>(s);
  nn::AdamOptions ad;
  ad.weight_decay = 0.01;
  check_unreached_is_skipped<nn::Adam>(ad);
  check_unreached_is_skipped<nn::AdamW>(nn::adamw_defaults());
}

TEST_CASE("nn optim one parameter under two names (tied weights) is stepped once") {
  Parameter a = param({1.0}, DType::f64, "a");
  nn::SGDOptions o;
  o.lr = 0.1;
  nn::SGD opt(nn::NamedParameters{{"embed.weight", a}, {"head.weight", a}}, o);
  REQUIRE(opt.params().size() == 1);
  CHECK(opt.params()[0].first == "embed.weight");
  set_grads({a}, {{1.0}});
  opt.step();
  CHECK(a.value().item() == 0.9);
  CHECK(nn::grad_norm({a, a}) == 1.0);
  CHECK(nn::clip_grad_norm(std::vector<Parameter>{a, a}, 0.5) == 1.0);
  CHECK(a.grad().item() == doctest::Approx(0.5 / (1.0 + 1e-6)).epsilon(1e-15));  // scaled once
  nn::AdamW adamw(nn::NamedParameters{{"x", a}, {"y", a}});
  adamw.step();
  std::size_t slots = 0;
  for (auto& nt : adamw.state()) slots += nt.first != "step";
  CHECK(slots == 3);  // x.step, x.exp_avg, x.exp_avg_sq: one set
  // two different parameters under one name stay an error
  Parameter b = param({1.0}, DType::f64, "b");
  CHECK_THROWS_WITH_AS(nn::SGD(nn::NamedParameters{{"w", a}, {"w", b}}, o), doctest::Contains("repeated"), ad::Error);
}

TEST_CASE("nn optim data-parallel and ZeRO-1 hold a tied parameter once") {
  Parameter a = param({1.0, 2.0}, DType::f64, "a"), b = param({3.0}, DType::f64, "b");
  ad::dist::DataParallel dp(ad::dist::Communicator::local(), {a, b, a});
  CHECK(dp.params().size() == 2);
  ad::dist::Zero1 z(ad::dist::Communicator::local(), nn::NamedParameters{{"embed", a}, {"b", b}, {"head", a}},
                    [](nn::NamedParameters shard) { return std::make_unique<nn::SGD>(std::move(shard)); });
  CHECK(z.shard_elements() == 3);  // a's two elements once, b's one
  set_grads({a, b}, {{1.0, 1.0}, {1.0}});
  z.reduce_gradients();
  z.step();
  CHECK(a.value().to_vector() == std::vector<double>{1.0 - 0.01, 2.0 - 0.01});  // SGD's default lr, one step
}

TEST_CASE("nn optim names by index never collide with a parameter's own name") {
  Parameter named = param({1.0}, DType::f64, "1"), u1 = param({1.0}, DType::f64, ""), u2 = param({1.0}, DType::f64, "");
  nn::SGD opt(std::vector<Parameter>{named, u1, u2});
  std::vector<std::string> names;
  for (auto& np : opt.params()) names.push_back(np.first);
  CHECK(names == std::vector<std::string>{"1", "_1", "2"});
}

TEST_CASE("nn optim clip_grad_norm") {
  Parameter a = param({3.0, 0.0}, DType::f64, "a"), b = param({0.0}, DType::f32, "b"), c = param({5.0}, DType::f64, "c");
  set_grads({a, b}, {{3.0, 0.0}, {4.0}});
  CHECK(nn::grad_norm({a, b, c}) == 5.0);  // c has no gradient
  // under the limit: untouched
  CHECK(nn::clip_grad_norm(std::vector<Parameter>{a, b}, 10.0) == 5.0);
  CHECK(a.grad().to_vector() == std::vector<double>{3.0, 0.0});
  // over: scaled by 1 / (5 + 1e-6)
  double n = nn::clip_grad_norm(nn::NamedParameters{{"a", a}, {"b", b}}, 1.0);
  CHECK(n == 5.0);
  CHECK(a.grad().to_vector()[0] == doctest::Approx(3.0 / (5.0 + 1e-6)).epsilon(1e-15));
  CHECK(b.grad().to_vector()[0] == doctest::Approx(4.0 / (5.0 + 1e-6)).epsilon(1e-7));
  CHECK(nn::grad_norm({a, b}) < 1.0);
  // non-finite: reported, gradients left alone
  set_grads({a}, {{INFINITY, 1.0}});
  CHECK(std::isinf(nn::clip_grad_norm(std::vector<Parameter>{a}, 1.0)));
  CHECK(a.grad().to_vector()[1] == 1.0);
}

TEST_CASE("nn optim schedule values") {
  auto c = nn::LrSchedule::constant(0.1);
  CHECK(c(0) == 0.1);
  CHECK(c(1000) == 0.1);
  auto w = nn::LrSchedule::linear_warmup(1.0, 4);
  CHECK(w(0) == 0.25);
  CHECK(w(1) == 0.5);
  CHECK(w(3) == 1.0);
  CHECK(w(10) == 1.0);
  auto cs = nn::LrSchedule::cosine(1.0, 10);
  CHECK(cs(0) == 1.0);
  CHECK(cs(5) == doctest::Approx(0.5).epsilon(1e-15));
  CHECK(cs(10) == doctest::Approx(0.0));
  CHECK(cs(20) == cs(10));
  CHECK(nn::LrSchedule::cosine(1.0, 10, 0.1)(5) == doctest::Approx(0.55).epsilon(1e-15));
  // u = 1/4: 2 (1 + cos(pi / 4)) / 2
  CHECK(nn::LrSchedule::cosine(2.0, 4)(1) == doctest::Approx(1.0 + std::sqrt(0.5)).epsilon(1e-15));
  auto wc = nn::LrSchedule::warmup_cosine(1.0, 2, 12, 0.0);
  CHECK(wc(0) == 0.5);
  CHECK(wc(1) == 1.0);
  CHECK(wc(2) == 1.0);
  CHECK(wc(7) == doctest::Approx(0.5).epsilon(1e-15));
  CHECK(wc(12) == doctest::Approx(0.0));
  CHECK(wc(100) == wc(12));
  CHECK(nn::LrSchedule::warmup_cosine(1.0, 3, 3, 0.25)(3) == 0.25);

  // an optimizer follows its schedule by step count
  Parameter p = param({0.0});
  nn::SGD opt({p}, nn::SGDOptions{});
  opt.set_schedule(w);
  CHECK(opt.lr() == 0.25);
  set_grads({p}, {{1.0}});
  opt.step();  // p -= 0.25
  CHECK(opt.lr() == 0.5);
  opt.step();  // p -= 0.5
  CHECK(p.value().item() == -0.75);
  opt.set_lr(0.01);
  CHECK(opt.lr() == 0.01);
}

TEST_CASE("nn optim state save and restore continues bit for bit") {
  for (int kind = 0; kind < 3; ++kind) {
    ad::Rng rng(21);
    auto make = [&](const std::vector<Parameter>& ps) -> std::unique_ptr<nn::Optimizer> {
      nn::NamedParameters np{{"a", ps[0]}, {"b", ps[1]}};
      if (kind == 0) return std::make_unique<nn::SGD>(np, nn::SGDOptions{0.1, 0.9, 0, 0.01, true});
      if (kind == 1) return std::make_unique<nn::Adam>(np, nn::AdamOptions{});
      return std::make_unique<nn::AdamW>(np);
    };
    std::vector<Parameter> p1{Parameter(Tensor::randn({3, 2}, rng)), Parameter(Tensor::randn({4}, rng, DType::f64))};
    std::vector<Tensor> g1{Tensor::randn({6}, rng, DType::f64), Tensor::randn({4}, rng, DType::f64)};
    std::vector<Tensor> g2{Tensor::randn({6}, rng, DType::f64), Tensor::randn({4}, rng, DType::f64)};
    auto opt1 = make(p1);
    opt1->set_schedule(nn::LrSchedule::warmup_cosine(0.1, 1, 5));
    set_grads(p1, {g1[0].to_vector(), g1[1].to_vector()});
    opt1->step();
    opt1->step();
    // a second optimizer over copies of the parameters, restored from the first's state
    std::vector<Parameter> p2{Parameter(p1[0].value().clone()), Parameter(p1[1].value().clone())};
    auto opt2 = make(p2);
    opt2->set_schedule(nn::LrSchedule::warmup_cosine(0.1, 1, 5));
    opt2->load_state(opt1->state());
    CHECK(opt2->step_count() == 2);
    CHECK(opt2->lr() == opt1->lr());
    set_grads(p1, {g2[0].to_vector(), g2[1].to_vector()});
    set_grads(p2, {g2[0].to_vector(), g2[1].to_vector()});
    opt1->step();
    opt2->step();
    INFO("optimizer " << opt1->name());
    CHECK(ad::bitwise_equal(p1[0].value(), p2[0].value()));
    CHECK(ad::bitwise_equal(p1[1].value(), p2[1].value()));
  }
}

TEST_CASE("nn optim misuse") {
  auto has = [](auto&& f, const std::string& needle) { return ad::test::throws_with(f, needle); };
  Parameter p = param({1.0, 2.0}), q = param({1.0});
  CHECK(has([&] { nn::SGD({p}, nn::SGDOptions{0.1, 0, 0, 0, true}); }, "SGD: nesterov needs momentum > 0"));
  CHECK(has([&] { nn::SGD({p}, nn::SGDOptions{-1.0}); }, "SGD: lr must be finite and >= 0, got -1"));
  nn::AdamOptions bad;
  bad.beta1 = 1.0;
  CHECK(has([&] { nn::Adam({p}, bad); }, "Adam: betas must be in [0, 1), got (1, 0.999)"));
  CHECK(has([&] { nn::AdamW({p}, bad); }, "AdamW: betas"));
  CHECK(has([&] { nn::SGD(nn::NamedParameters{{"w", p}, {"w", q}}); }, "parameter name \"w\" is repeated"));
  CHECK(has([&] { nn::LrSchedule::linear_warmup(1.0, 0); }, "warmup_steps must be >= 1, got 0"));
  CHECK(has([&] { nn::LrSchedule::warmup_cosine(1.0, 5, 4); }, "total_steps (4) must be >= warmup_steps (5)"));
  CHECK(has([&] { nn::LrSchedule::cosine(1.0, 10, 2.0); }, "lr_min must be in [0, lr = 1], got 2"));
  CHECK(has([&] { nn::LrSchedule::constant(1.0)(-1); }, "step must be >= 0, got -1"));
  CHECK(has([&] { nn::clip_grad_norm(std::vector<Parameter>{p}, 0.0); }, "clip_grad_norm: max_norm must be > 0"));

  nn::Adam opt(nn::NamedParameters{{"w", p}}, nn::AdamOptions{});
  set_grads({p}, {{1.0, 1.0}});
  opt.step();
  nn::NamedTensors st = opt.state();
  CHECK(has([&] { opt.load_state({}); }, "Adam::load_state: the state has no \"step\" tensor"));
  auto wrong = st;
  wrong[2].second = Tensor::zeros({3}, DType::f64);
  CHECK(has([&] { opt.load_state(wrong); }, "\"w.exp_avg\" is f64[3], parameter is f64[2]"));
  wrong = st;
  wrong.emplace_back("v.exp_avg", Tensor::zeros({2}, DType::f64));
  CHECK(has([&] { opt.load_state(wrong); }, "unexpected tensor \"v.exp_avg\""));
  wrong = st;
  wrong.erase(wrong.begin() + 1);
  CHECK(has([&] { opt.load_state(wrong); }, "\"w.exp_avg\" is present but \"w.step\" is not"));
  wrong = st;
  wrong.erase(wrong.begin() + 3);
  CHECK(has([&] { opt.load_state(wrong); }, "\"w.exp_avg_sq\" is missing"));
  wrong = st;
  wrong[0].second = Tensor::zeros({}, DType::f32);
  CHECK(has([&] { opt.load_state(wrong); }, "\"step\" must be one i64 value, got f32[]"));
  // a failed load changes nothing
  CHECK(opt.step_count() == 1);
}

TEST_CASE("nn optim ZeRO-1 steps what the unsharded optimizer steps, and counts it") {
  // a segment keeps its fresh flag until Zero1::zero_grad: zeroing the parameters' gradients only
  // (Module::zero_grad) then reaching one parameter stepped the other again with its old gradient
  Parameter a = param({0.0, 0.0}, DType::f64, "a"), b = param({0.0}, DType::f64, "b");
  nn::SGDOptions so;
  so.lr = 0.1;
  ad::dist::Zero1 z(ad::dist::Communicator::local(), nn::NamedParameters{{"a", a}, {"b", b}},
                    [so](nn::NamedParameters s) { return std::make_unique<nn::SGD>(std::move(s), so); });
  auto loss = [&](bool with_b) {
    ad::Graph g;
    ad::Var l = ad::sum(g.param(a));
    if (with_b) l = ad::add(l, ad::sum(g.param(b)));
    z.backward(l);
  };
  auto step_of = [&](const std::string& n) {
    for (const auto& nt : z.state())
      if (nt.first == n) return nt.second.data<std::int64_t>()[0];
    return std::int64_t{0};
  };
  loss(true);
  z.step();
  a.zero_grad();
  b.zero_grad();
  loss(false);
  z.step();
  CHECK(b.value().to_vector() == std::vector<double>{-0.1});  // once
  CHECK(a.value().to_vector() == std::vector<double>{-0.2, -0.2});
  CHECK(step_of("a.step") == 2);
  CHECK(step_of("b.step") == 1);
  z.step();  // again without zero_grad: the same gradient again, as the unsharded optimizer
  CHECK(a.value().to_vector()[0] == doctest::Approx(-0.3));
  CHECK(step_of("a.step") == 3);
  CHECK(step_of("b.step") == 1);
  // names the optimizer needs are checked on the whole list (every rank alike)
  Parameter c = param({1.0}, DType::f64, "w"), d = param({1.0}, DType::f64, "w");
  CHECK_THROWS_WITH_AS(ad::dist::Zero1(ad::dist::Communicator::local(), nn::NamedParameters{{"w", c}, {"w", d}},
                                       [](nn::NamedParameters s) { return std::make_unique<nn::SGD>(std::move(s)); }),
                       doctest::Contains("Zero1: parameter name \"w\" is repeated"), ad::Error);
}

TEST_CASE("nn optim a parameter given a tensor of another shape is an ad::Error before any parameter steps") {
  // loading a checkpoint and then growing a vocabulary: the moments still have the old shape (this stepped
  // past their end before)
  Parameter a = param({1.0, 2.0}, DType::f64, "a"), b = param({3.0, 4.0}, DType::f64, "b");
  nn::Adam opt(nn::NamedParameters{{"a", a}, {"b", b}});
  set_grads({a, b}, {{0.5, 0.5}, {0.5, 0.5}});
  opt.step();
  const std::vector<double> a1 = a.value().to_vector();
  b.value() = Tensor::zeros({5}, DType::f64);
  set_grads({a, b}, {{0.5, 0.5}, {0.5, 0.5, 0.5, 0.5, 0.5}});
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("Adam.step: state \"b.exp_avg\" is f64[2], parameter is f64[5]"),
                       ad::Error);
  CHECK(a.value().to_vector() == a1);  // "a" comes first but was not stepped: every check runs before any update
  CHECK(opt.step_count() == 1);
  nn::Adam fresh(nn::NamedParameters{{"a", a}, {"b", b}});  // what the message suggests
  fresh.step();
  CHECK(b.value().to_vector() != std::vector<double>(5, 0.0));
  // given yet another tensor with its gradient not zeroed: the next backward names the parameter
  b.value() = Tensor::zeros({3}, DType::f64);
  ad::Graph g;
  CHECK_THROWS_WITH_AS(ad::backward(ad::sum(g.param(b))),
                       doctest::Contains("parameter \"b\" holds a gradient f64[5] but is now f64[3]"), ad::Error);
  b.zero_grad();
  ad::Graph g2;
  ad::backward(ad::sum(g2.param(b)));
  CHECK(b.grad().to_vector() == std::vector<double>(3, 1.0));
}

TEST_CASE("nn optim load_state finds each tensor by name in a hash map: 20,000 parameters load and match") {
  std::vector<Parameter> ps;
  nn::NamedParameters named;
  for (int i = 0; i < 20000; ++i) {
    const std::string name = fmt::format("p{}", i);  // ("p" + std::to_string(i): a false -Wrestrict in g++ 12)
    ps.push_back(param({static_cast<double>(i)}, DType::f64, name));
    named.emplace_back(name, ps.back());
  }
  nn::Adam a(named);
  std::vector<std::vector<double>> gs(ps.size(), std::vector<double>{1.0});
  set_grads(ps, gs);
  a.step();
  nn::Adam b(named);
  b.load_state(a.state());
  const auto sa = a.state(), sb = b.state();
  REQUIRE(sa.size() == sb.size());
  REQUIRE(sa.size() == 1 + 3 * ps.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < sa.size(); ++i)
    differ += sa[i].first != sb[i].first || sa[i].second.to_vector() != sb[i].second.to_vector();
  CHECK(differ == 0);
  nn::NamedTensors twice = a.state();
  twice.push_back(twice[5]);
  CHECK_THROWS_WITH_AS(b.load_state(twice), doctest::Contains("appears twice"), ad::Error);
}
