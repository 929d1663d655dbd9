#pragma once
// The LibTorch side of bench/overhead, behind a plain C++ interface so that
// main.cpp never includes a LibTorch header (torch_mlp.cpp is compiled with
// LibTorch's own flags and without -Werror). Built only when CMake finds
// LibTorch (AD_BENCH_HAVE_TORCH).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch_bench {

// "1.13.0" (TORCH_VERSION of the headers built against).
std::string version();
// Intra-op threads = n, inter-op threads = 1 (when still possible).
void set_threads(int n);
int intra_op_threads();

// An MLP given in ad's layout, so both sides start from the same numbers:
// w[l] is [in, out] row-major, b[l] is [out]; x[i] is batch i, [batch, in];
// y[i] its labels. Activation after every layer but the last.
struct MlpSpec {
  std::vector<std::int64_t> sizes;
  bool tanh = false;  // else relu
  std::int64_t batch = 0;
  float lr = 0;
  std::vector<std::vector<float>> w, b;
  std::vector<std::vector<float>> x;
  std::vector<std::vector<std::int64_t>> y;
};

// torch::nn::Linear layers, relu/tanh, functional::cross_entropy,
// loss.backward(), SGD p -= lr * grad under NoGradGuard, grads zeroed.
class Mlp {
 public:
  explicit Mlp(const MlpSpec& spec);
  ~Mlp();
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;
  // One training step on batch i (mod the number of batches). Returns the
  // loss before the update when want_loss, else 0.
  double step(std::size_t i, bool want_loss = false);
  // Milliseconds of the last step's parts: forward (to the loss),
  // loss.backward(), SGD update + zeroing the grads.
  struct Parts { double forward = 0, backward = 0, update = 0; };
  Parts last_parts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The per-op chain of bench/overhead, eagerly in LibTorch: n ops cycling
// add(h, p), tanh(h), h * 0.5, h * x on f32[x.size()], then sum.
// Returns milliseconds of one run: forward only (NoGradGuard), or forward +
// loss.backward() with p requiring grad.
double chain_forward_ms(const std::vector<float>& x, const std::vector<float>& p, int n);
double chain_backward_ms(const std::vector<float>& x, const std::vector<float>& p, int n);

}  // namespace torch_bench
