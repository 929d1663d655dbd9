// Trains an MLP on a synthetic task made here: points on four interleaved
// noisy spirals in the plane, classified by spiral. Prints one line per epoch
// (loss, train and test accuracy, step time, peak bytes of a training step).
//
//   ./mlp [--epochs N] [--seed S]
#include <ad/ad.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "../common/args.hpp"

namespace {

constexpr int kClasses = 4;

struct Dataset {
  ad::Tensor x;  // [N, 2] f32
  ad::Tensor y;  // [N] i64
};

// Class c: r = t, angle = 10 t + c * pi/2 (+ noise), t uniform in (0.05, 1].
Dataset make_spirals(std::int64_t n, ad::Rng& rng) {
  ad::Tensor t = ad::Tensor::uniform({n}, rng, ad::DType::f64, 0.05, 1.0);
  ad::Tensor noise = ad::Tensor::randn({n, 2}, rng, ad::DType::f64, 0.0, 0.02);
  ad::Tensor cls = ad::Tensor::randint({n}, rng, kClasses);
  Dataset d{ad::Tensor::empty({n, 2}), cls};
  float* x = d.x.data<float>();
  const double* tv = t.data<double>();
  const double* nv = noise.data<double>();
  const std::int64_t* c = cls.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    double a = tv[i] * 10.0 + static_cast<double>(c[i]) * 1.5707963267948966;
    x[2 * i] = static_cast<float>(tv[i] * std::cos(a) + nv[2 * i]);
    x[2 * i + 1] = static_cast<float>(tv[i] * std::sin(a) + nv[2 * i + 1]);
  }
  return d;
}

// Rows [b, b + n) of a dataset.
ad::Tensor rows(const ad::Tensor& t, std::int64_t b, std::int64_t n) {
  ad::Shape s = t.shape();
  std::int64_t row = t.numel() / s[0];
  s[0] = n;
  ad::Tensor out = ad::Tensor::empty(s, t.dtype());
  std::size_t es = ad::dtype_size(t.dtype());
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + static_cast<std::size_t>(b * row) * es,
              static_cast<std::size_t>(n * row) * es);
  return out;
}

struct Mlp {
  std::vector<ad::Parameter> w, b;
  Mlp(const std::vector<std::int64_t>& sizes, ad::Rng& rng) {
    for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
      double stddev = std::sqrt(2.0 / static_cast<double>(sizes[i]));  // He initialisation
      w.push_back(ad::Parameter::randn({sizes[i], sizes[i + 1]}, rng, stddev, ad::DType::f32, fmt::format("w{}", i)));
      b.push_back(ad::Parameter::zeros({sizes[i + 1]}, ad::DType::f32, fmt::format("b{}", i)));
    }
  }
  ad::Var forward(ad::Var h) const {
    for (std::size_t i = 0; i < w.size(); ++i) {
      h = ad::add(ad::matmul(h, w[i]), b[i]);  // [N, in] x [in, out] + [out]
      if (i + 1 < w.size()) h = ad::relu(h);
    }
    return h;
  }
};

// SGD with momentum: v = mu v + g; p -= lr v.
struct Sgd {
  double lr, mu;
  std::vector<ad::Tensor> vel;
  void step(const std::vector<ad::Parameter>& ps) {
    if (vel.empty())
      for (const auto& p : ps) vel.push_back(ad::Tensor::zeros(p.shape(), p.dtype()));
    for (std::size_t i = 0; i < ps.size(); ++i) {
      float* p = ps[i].value().data<float>();
      const float* g = ps[i].grad().data<float>();
      float* v = vel[i].data<float>();
      for (std::int64_t j = 0; j < ps[i].value().numel(); ++j) {
        v[j] = static_cast<float>(mu) * v[j] + g[j];
        p[j] -= static_cast<float>(lr) * v[j];
      }
      ps[i].zero_grad();
    }
  }
};

double accuracy(const Mlp& m, const Dataset& d) {
  ad::Graph g;
  ad::Var logits = m.forward(g.input(d.x));
  const float* l = logits.value().data<float>();
  const std::int64_t* y = d.y.data<std::int64_t>();
  std::int64_t n = d.y.numel(), hit = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    int best = 0;
    for (int c = 1; c < kClasses; ++c)
      if (l[i * kClasses + c] > l[i * kClasses + best]) best = c;
    hit += best == y[i];
  }
  return static_cast<double>(hit) / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t epochs = 30;
  std::uint64_t seed = 7;
  try {
    for (int i = 1; i < argc; ++i) {
      if (!std::strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = args::flag_whole(argv[i], argv[i + 1], 1), ++i;
      else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = args::flag_seed(argv[i], argv[i + 1]), ++i;
      else { std::fprintf(stderr, "usage: %s [--epochs N] [--seed S]\n", argv[0]); return 2; }
    }
  } catch (const ad::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    ad::Rng rng(seed);
    Dataset train = make_spirals(8000, rng), test = make_spirals(2000, rng);
    Mlp model({2, 128, 128, kClasses}, rng);
    std::vector<ad::Parameter> params;
    for (std::size_t i = 0; i < model.w.size(); ++i) { params.push_back(model.w[i]); params.push_back(model.b[i]); }
    Sgd opt{0.05, 0.9, {}};
    const std::int64_t batch = 64, n = train.y.numel();
    fmt::print("ad {} — MLP 2-128-128-{} on {} spiral points, batch {}\n", ad::kVersionString, kClasses, n, batch);
    double test_acc = 0;
    for (std::int64_t e = 1; e <= epochs; ++e) {
      // cosine learning-rate decay from 0.05 to 0 over the run
      opt.lr = 0.05 * 0.5 *
               (1.0 + std::cos(3.141592653589793 * static_cast<double>(e - 1) / static_cast<double>(epochs)));
      double loss_sum = 0, step_ms = 0;
      std::int64_t steps = 0, peak = 0;
      for (std::int64_t b = 0; b + batch <= n; b += batch) {
        auto t0 = std::chrono::steady_clock::now();
        ad::Graph g;
        ad::Var logits = model.forward(g.input(rows(train.x, b, batch)));
        ad::Var loss = ad::cross_entropy(logits, g.input(rows(train.y, b, batch)));
        ad::Report r = ad::backward(loss);
        opt.step(params);
        step_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r.measured_peak_bytes != r.predicted_peak_bytes) {
          fmt::print(stderr, "peak mismatch: predicted {} measured {}\n", r.predicted_peak_bytes, r.measured_peak_bytes);
          return 1;
        }
        peak = std::max(peak, r.measured_peak_bytes);
        loss_sum += loss.value().item();
        ++steps;
      }
      double train_acc = accuracy(model, train);
      test_acc = accuracy(model, test);
      fmt::print("epoch {:3d}  loss {:.4f}  train acc {:.2f}%  test acc {:.2f}%  step {:.3f} ms  peak {} B (predicted = measured)\n",
                 e, loss_sum / static_cast<double>(steps), 100 * train_acc, 100 * test_acc,
                 step_ms / static_cast<double>(steps), peak);
    }
    fmt::print("final test accuracy {:.2f}%\n", 100 * test_acc);
    return test_acc >= 0.95 ? 0 : 1;
  } catch (const std::exception& e) {
    return args::report_error(e);
  }
}
