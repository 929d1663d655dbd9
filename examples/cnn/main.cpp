// Trains a small convolutional network on images made here: 16x16 grey
// pictures of one of four shapes (a horizontal bar, a vertical bar, a square
// outline, a cross), at random places and sizes, in noise. Conv2d, GroupNorm,
// max pooling and a linear head; Adam. Prints one line per epoch (loss, test
// accuracy, step time, peak bytes of a step, predicted and measured) and
// exits non-zero if the test accuracy ends below 90 % or a step's measured
// peak exceeds the prediction.
//
//   ./cnn [--epochs N] [--seed S] [--policy keep_all|sqrt_n|budget] [--budget KiB]
#include <ad/ad.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/args.hpp"

namespace {

constexpr std::int64_t kSide = 16, kClasses = 4;

struct Dataset {
  ad::Tensor x;  // [N, 1, 16, 16] f32
  ad::Tensor y;  // [N] i64
};

// Shape c at a random place and size (length 5-10), noise N(0, 0.25^2).
Dataset make_shapes(std::int64_t n, ad::Rng& rng) {
  Dataset d{ad::Tensor::randn({n, 1, kSide, kSide}, rng, ad::DType::f32, 0.0, 0.25),
            ad::Tensor::randint({n}, rng, kClasses)};
  ad::Tensor pick = ad::Tensor::randint({n, 3}, rng, 1 << 20);
  float* x = d.x.data<float>();
  const std::int64_t* c = d.y.data<std::int64_t>();
  const std::int64_t* r = pick.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t len = 5 + r[3 * i] % 6, top = r[3 * i + 1] % (kSide - len + 1),
                       left = r[3 * i + 2] % (kSide - len + 1);
    float* img = x + i * kSide * kSide;
    auto dot = [&](std::int64_t yy, std::int64_t xx) { img[(top + yy) * kSide + left + xx] += 1.0f; };
    for (std::int64_t k = 0; k < len; ++k) switch (c[i]) {
        case 0: dot(len / 2, k); break;                        // horizontal bar
        case 1: dot(k, len / 2); break;                        // vertical bar
        case 2:                                                // square outline
          dot(0, k), dot(len - 1, k);
          if (k > 0 && k + 1 < len) dot(k, 0), dot(k, len - 1);
          break;
        default: dot(k, k), dot(k, len - 1 - k); break;        // cross
      }
  }
  return d;
}

struct Net : ad::nn::Module {
  ad::nn::Conv2d c1, c2;
  ad::nn::GroupNorm n1, n2;
  ad::nn::Linear head;
  explicit Net(ad::Rng& rng)
      : c1(1, 16, {3, 3}, rng, pad1()), c2(16, 32, {3, 3}, rng, pad1()), n1(4, 16), n2(8, 32),
        head(32 * 4 * 4, kClasses, rng) {}
  static ad::nn::Conv2dLayerOptions pad1() {
    ad::nn::Conv2dLayerOptions o;
    o.conv.padding = {1, 1};
    return o;
  }
  ad::Var operator()(const ad::Var& x) const {
    ad::Var h = ad::max_pool2d(ad::relu(n1(c1(x))));  // [N, 16, 8, 8]
    h = ad::max_pool2d(ad::relu(n2(c2(h))));          // [N, 32, 4, 4]
    return head(ad::reshape(h, {h.dim(0), 32 * 4 * 4}));
  }
  void visit(ad::nn::Visitor& v) const override {
    v.module("c1", c1), v.module("n1", n1), v.module("c2", c2), v.module("n2", n2), v.module("head", head);
  }
};

double accuracy(const Net& net, const Dataset& d) {
  ad::Graph g;
  ad::Tensor logits = ad::eval(net(g.input(d.x)));
  const float* l = logits.data<float>();
  const std::int64_t* y = d.y.data<std::int64_t>();
  std::int64_t hit = 0;
  for (std::int64_t i = 0; i < d.y.numel(); ++i)
    hit += std::max_element(l + i * kClasses, l + (i + 1) * kClasses) - (l + i * kClasses) == y[i];
  return static_cast<double>(hit) / static_cast<double>(d.y.numel());
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t epochs = 6, budget_kib = 0;
  std::uint64_t seed = 3;
  std::string policy_name = "keep_all";
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--epochs" && i + 1 < argc) epochs = args::flag_whole(a, argv[++i], 1, 1000);
      else if (a == "--seed" && i + 1 < argc) seed = args::flag_seed(a, argv[++i]);
      else if (a == "--policy" && i + 1 < argc) policy_name = argv[++i];
      else if (a == "--budget" && i + 1 < argc) budget_kib = args::flag_whole(a, argv[++i], 1);
      else {
        std::fprintf(stderr, "usage: %s [--epochs N] [--seed S] [--policy keep_all|sqrt_n|budget] [--budget KiB]\n",
                     argv[0]);
        return 2;
      }
    }
    if (policy_name != "keep_all" && policy_name != "sqrt_n" && policy_name != "budget")
      throw ad::Error(fmt::format("unknown --policy '{}' (keep_all, sqrt_n or budget)", policy_name));
    if ((policy_name == "budget") != (budget_kib > 0))
      throw ad::Error("--policy budget and --budget KiB go together");
  } catch (const ad::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    ad::Rng rng(seed);
    Dataset train = make_shapes(4096, rng), test = make_shapes(1024, rng);
    Net net(rng);
    ad::nn::AdamOptions ao;
    ao.lr = 3e-3;
    ad::nn::Adam opt(net.named_parameters(), ao);
    const ad::Policy policy = policy_name == "sqrt_n"   ? ad::policy::sqrt_n()
                              : policy_name == "budget" ? ad::policy::budget(budget_kib << 10)
                                                        : ad::policy::keep_all();
    const std::int64_t batch = 64, n = train.y.numel();
    fmt::print("ad {} — CNN (conv 16, conv 32, group norm, max pool) on {} 16x16 shape images, batch {}, policy {}\n",
               ad::kVersionString, n, batch, policy.name());
    double test_acc = 0;
    for (std::int64_t e = 1; e <= epochs; ++e) {
      double loss_sum = 0, ms = 0;
      std::int64_t steps = 0, peak = 0, predicted = 0;
      for (std::int64_t b = 0; b + batch <= n; b += batch) {
        const auto t0 = std::chrono::steady_clock::now();
        ad::Graph g;
        ad::Var loss = ad::cross_entropy(net(g.input(train.x.rows(b, batch))), g.input(train.y.rows(b, batch)));
        opt.zero_grad();
        ad::Report r = ad::backward(loss, policy);
        opt.step();
        ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r.measured_peak_bytes > r.predicted_peak_bytes) {
          fmt::print(stderr, "peak above the prediction: predicted {} measured {}\n", r.predicted_peak_bytes,
                     r.measured_peak_bytes);
          return 1;
        }
        peak = std::max(peak, r.measured_peak_bytes);
        predicted = std::max(predicted, r.predicted_peak_bytes);
        loss_sum += loss.value().item();
        ++steps;
      }
      test_acc = accuracy(net, test);
      fmt::print("epoch {}  loss {:.4f}  test acc {:.2f}%  step {:.2f} ms  peak {} B (predicted {} B)\n", e,
                 loss_sum / static_cast<double>(steps), 100 * test_acc, ms / static_cast<double>(steps), peak,
                 predicted);
    }
    fmt::print("final test accuracy {:.2f}%\n", 100 * test_acc);
    return test_acc >= 0.90 ? 0 : 1;
  } catch (const std::exception& e) {
    return args::report_error(e);
  }
}
