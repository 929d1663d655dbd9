#include <doctest/doctest.h>
#include "ad/ad.hpp"
TEST_CASE("smoke") {
  ad::Rng rng(1);
  auto w = ad::Parameter::randn({3, 2}, rng);
  ad::Graph g;
  auto x = g.input(ad::Tensor::randn({4, 3}, rng));
  auto loss = ad::sum(ad::tanh(ad::matmul(x, w)));
  auto r = ad::backward(loss);
  CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  CHECK(w.has_grad());
  fmt::print("{}\n{}\n{}\n", loss.value(), w.grad(), r);
}
