// Fits y = 3x - 1 with one Parameter pair and round-trips a Linear layer
// through safetensors; exits 0 when the fit is close and the bytes agree.
#include <ad/ad.hpp>

#include <cmath>

int main() {
  ad::Rng rng(3);
  ad::Parameter w = ad::Parameter::zeros({1, 1}), b = ad::Parameter::zeros({1});
  ad::Tensor x = ad::Tensor::randn({32, 1}, rng);
  ad::Tensor y = ad::Tensor::empty({32, 1});
  for (int i = 0; i < 32; ++i) y.data<float>()[i] = 3.0f * x.data<float>()[i] - 1.0f;
  for (int step = 0; step < 200; ++step) {
    ad::Graph g;
    auto loss = ad::mse(ad::add(ad::matmul(g.input(x), w), b), g.input(y));
    ad::backward(loss);
    for (auto* p : {&w, &b}) {
      p->value().data<float>()[0] -= 0.1f * p->grad().data<float>()[0];
      p->zero_grad();
    }
  }
  // links LAPACKE through the package (semiseparable_factorize calls dgesdd)
  ad::Tensor h = ad::Tensor::randn({6, 6}, rng, ad::DType::f64);
  if (!(ad::semiseparable_factorize(h, 6).rel_error < 1e-12)) return 1;
  float wf = w.value().data<float>()[0], bf = b.value().data<float>()[0];
  // the training toolkit's headers and code are installed too
  ad::nn::Linear lin(2, 3, rng);
  auto bytes = ad::serialize_safetensors(ad::nn::module_state(lin));
  auto back = ad::parse_safetensors(bytes.data(), bytes.size());
  bool io_ok = back.tensors.size() == 2 && ad::bitwise_equal(back.at("weight"), lin.weight.value());
  fmt::print("ad {}: w = {:.4f}, b = {:.4f}, safetensors round trip {}\n", ad::kVersionString, wf, bf, io_ok ? "ok" : "FAILED");
  return std::fabs(wf - 3.0f) < 1e-3f && std::fabs(bf + 1.0f) < 1e-3f && io_ok ? 0 : 1;
}
