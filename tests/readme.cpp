// The code shown in README.md, compiled and run. The parts between the
// snippet markers are the README's blocks (scripts/check-snippets.sh, run by
// ctest as docs_snippets, compares them line by line).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <ad/ad.hpp>

namespace {

ad::Tensor labels(ad::Rng& rng) { return ad::Tensor::randint({64}, rng, 10); }

// The README's build_model: a small MLP on a batch of [64, 784] inputs.
struct Batch {
  ad::Tensor x, y;
};
struct Model {
  ad::Rng rng{1};
  ad::Parameter w1 = ad::Parameter::randn({784, 128}, rng, 0.05), b1 = ad::Parameter::zeros({128});
  ad::Parameter w2 = ad::Parameter::randn({128, 128}, rng, 0.08), b2 = ad::Parameter::zeros({128});
  ad::Parameter w3 = ad::Parameter::randn({128, 10}, rng, 0.08), b3 = ad::Parameter::zeros({10});
};

}  // namespace

TEST_CASE("README: a training step runs as written") {
  ad::Rng data(7);
  ad::Tensor batch_x = ad::Tensor::randn({64, 784}, data);
  ad::Tensor batch_y = labels(data);
  // [snippet step]
  ad::Rng rng(0);
  ad::Parameter w1 = ad::Parameter::randn({784, 256}, rng, 0.05), b1 = ad::Parameter::zeros({256});
  ad::Parameter w2 = ad::Parameter::randn({256, 10}, rng, 0.06),  b2 = ad::Parameter::zeros({10});

  ad::Graph g;                                        // one per step
  ad::Var x = g.input(batch_x);                       // [64, 784] f32, shared not copied
  ad::Var h = ad::relu(ad::matmul(x, w1) + g.param(b1));  // symbolic: shapes known, nothing computed yet
  ad::Var loss = ad::cross_entropy(ad::matmul(h, w2) + g.param(b2), g.input(batch_y));  // labels i64 [64]
  ad::Report r = ad::backward(loss);                  // computes loss, accumulates into w1.grad() ...
  fmt::print("loss {}  peak {} B (predicted {} B)\n", loss.value().item(),
             r.measured_peak_bytes, r.predicted_peak_bytes);
  // [end snippet]
  CHECK(r.measured_peak_bytes == r.predicted_peak_bytes);
  CHECK(r.measured_peak_bytes > 0);
  CHECK(std::isfinite(loss.value().item()));
  for (const ad::Parameter* p : {&w1, &b1, &w2, &b2}) CHECK(p->has_grad());
}

TEST_CASE("README: the budget loop runs as written") {
  Model m;
  ad::Rng data(8);
  const int steps = 3;
  auto batch = [&](int) { return Batch{ad::Tensor::randn({64, 784}, data), labels(data)}; };
  auto build_model = [&](ad::Graph& g, const Batch& b) {
    ad::Var h = ad::tanh(ad::matmul(g.input(b.x), m.w1) + g.param(m.b1));
    h = ad::tanh(ad::matmul(h, m.w2) + g.param(m.b2));
    return ad::cross_entropy(ad::matmul(h, m.w3) + g.param(m.b3), g.input(b.y));
  };
  // [snippet budget]
  using namespace ad::literals;
  ad::Policy pol = ad::policy::budget(64_MiB);    // create once: it caches plans across steps
  ad::Report r;
  for (int step = 0; step < steps; ++step) {
    ad::Graph g;
    ad::Var loss = build_model(g, batch(step));   // the same structure every step
    r = ad::backward(loss, pol);                  // r.measured_peak_bytes <= 64 MiB, always
    fmt::print("{}\n", r);                        // predicted/measured peak, recomputations, times
    if (step == 0) fmt::print("{}", ad::explain(*r.plan));  // per node: kept, deleted + recomputed, or freed
  }
  // [end snippet]
  CHECK(r.measured_peak_bytes == r.predicted_peak_bytes);
  CHECK(r.measured_peak_bytes <= 64_MiB);
  CHECK(r.plan_cached);  // steps after the first reuse the policy's plan
}

TEST_CASE("explain and to_dot of a plan whose graph is gone: ad::Error, not a dangling read") {
  Model m;
  ad::Rng data(9);
  ad::Report r;
  {
    ad::Graph g;
    ad::Var h = ad::tanh(ad::matmul(g.input(ad::Tensor::randn({4, 784}, data)), m.w1) + g.param(m.b1));
    r = ad::backward(ad::sum(h));
    CHECK_NOTHROW(ad::explain(*r.plan));
    CHECK_NOTHROW(ad::to_dot(*r.plan));
  }
  CHECK_THROWS_WITH_AS(ad::explain(*r.plan), doctest::Contains("graph has been destroyed"), ad::Error);
  CHECK_THROWS_WITH_AS(ad::to_dot(*r.plan), doctest::Contains("graph has been destroyed"), ad::Error);
  ad::Graph other;  // may take the freed graph's address: still not the plan's graph
  CHECK_THROWS_WITH_AS(ad::to_dot(other, *r.plan), doctest::Contains("another graph"), ad::Error);
}
