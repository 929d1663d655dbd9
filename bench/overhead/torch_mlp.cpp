// LibTorch side of bench/overhead (see torch_mlp.hpp). Compiled only when
// CMake finds LibTorch, with LibTorch's flags and warnings not fatal.
#include "torch_mlp.hpp"

#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>

namespace torch_bench {

std::string version() { return TORCH_VERSION; }

void set_threads(int n) {
  torch::set_num_threads(n);
  try {
    at::set_num_interop_threads(1);  // throws once inter-op work has started
  } catch (const std::exception&) {
  }
}
int intra_op_threads() { return torch::get_num_threads(); }

struct Mlp::Impl {
  std::vector<torch::nn::Linear> layers;
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> x, y;
  bool tanh = false;
  double lr = 0;
  Mlp::Parts parts;
};

Mlp::Mlp(const MlpSpec& s) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.tanh = s.tanh;
  m.lr = s.lr;
  torch::NoGradGuard ng;
  for (std::size_t l = 0; l + 1 < s.sizes.size(); ++l) {
    std::int64_t in = s.sizes[l], out = s.sizes[l + 1];
    torch::nn::Linear lin(torch::nn::LinearOptions(in, out));
    // ad keeps w as [in, out]; torch::nn::Linear keeps weight as [out, in]
    auto w = torch::from_blob(const_cast<float*>(s.w[l].data()), {in, out}, torch::kFloat32);
    lin->weight.copy_(w.t());
    lin->bias.copy_(torch::from_blob(const_cast<float*>(s.b[l].data()), {out}, torch::kFloat32));
    m.layers.push_back(lin);
    m.params.push_back(lin->weight);
    m.params.push_back(lin->bias);
  }
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    m.x.push_back(torch::from_blob(const_cast<float*>(s.x[i].data()), {s.batch, s.sizes.front()}, torch::kFloat32)
                      .clone());
    m.y.push_back(torch::from_blob(const_cast<std::int64_t*>(s.y[i].data()), {s.batch}, torch::kInt64).clone());
  }
}
Mlp::~Mlp() = default;

double Mlp::step(std::size_t i, bool want_loss) {
  auto& m = *impl_;
  i %= m.x.size();
  auto t0 = std::chrono::steady_clock::now();
  torch::Tensor h = m.x[i];
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    h = m.layers[l]->forward(h);
    if (l + 1 < m.layers.size()) h = m.tanh ? torch::tanh(h) : torch::relu(h);
  }
  torch::Tensor loss = torch::nn::functional::cross_entropy(h, m.y[i]);
  auto t1 = std::chrono::steady_clock::now();
  loss.backward();
  auto t2 = std::chrono::steady_clock::now();
  double lv = want_loss ? loss.item<double>() : 0.0;
  auto t3 = std::chrono::steady_clock::now();
  {
    torch::NoGradGuard ng;
    for (auto& p : m.params) {
      p.add_(p.grad(), -m.lr);  // p -= lr * grad
      p.grad().zero_();
    }
  }
  auto t4 = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  m.parts = {ms(t0, t1), ms(t1, t2), ms(t3, t4)};
  return lv;
}

Mlp::Parts Mlp::last_parts() const { return impl_->parts; }

namespace {
torch::Tensor chain(torch::Tensor x, torch::Tensor p, int n) {
  torch::Tensor h = x;
  for (int i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0: h = torch::add(h, p); break;
      case 1: h = torch::tanh(h); break;
      case 2: h = torch::mul(h, 0.5); break;
      default: h = torch::mul(h, x); break;
    }
  }
  return h.sum();
}
torch::Tensor vec(const std::vector<float>& v) {
  return torch::from_blob(const_cast<float*>(v.data()), {static_cast<std::int64_t>(v.size())}, torch::kFloat32).clone();
}
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double chain_forward_ms(const std::vector<float>& xv, const std::vector<float>& pv, int n) {
  torch::Tensor x = vec(xv), p = vec(pv);
  torch::NoGradGuard ng;
  auto t0 = std::chrono::steady_clock::now();
  {
    torch::Tensor loss = chain(x, p, n);
  }
  return ms_since(t0);
}

double chain_backward_ms(const std::vector<float>& xv, const std::vector<float>& pv, int n) {
  torch::Tensor x = vec(xv), p = vec(pv).requires_grad_(true);
  auto t0 = std::chrono::steady_clock::now();
  {
    torch::Tensor loss = chain(x, p, n);
    loss.backward();
  }
  return ms_since(t0);
}

}  // namespace torch_bench
