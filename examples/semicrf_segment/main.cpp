// Segments synthetic genome-like sequences with a semi-Markov CRF trained by
// gradient descent through ad::backward. The data is made here: three labels
// ("intergenic", "exon", "repeat") with distinct emission means over F
// features and distinct segment-length distributions; each sequence has
// T >= 100,000 positions. Learned: per-label linear emission scores (W, b),
// duration bias D (K, C), transitions Tr (C, C), start scores P (C); the loss
// is the mean NLL per position, (logZ − score(gold)) / T. Each epoch prints
// the training NLL, segment-boundary F1 of the Viterbi segmentation on
// held-out sequences (exact, and within ±5 positions), step time and the
// measured peak memory of a training step.
//
//   ./semicrf_segment [--epochs N] [--length T] [--seed S]
#include <ad/ad.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "../common/args.hpp"

namespace {

constexpr std::int64_t kC = 3, kF = 4, kK = 400;

struct Sequences {
  ad::Tensor x;         // (B, T, F) f32 features
  ad::Tensor segments;  // (B, T) i64, label at each segment start, -1 elsewhere
  ad::Tensor lengths;   // (B) i64
};

// Segment lengths: intergenic ~ 60 + geometric(mean 140), exon uniform
// 20..120, repeat ~ 150 ± 30; all clipped to K. Next label: any other label.
// Emissions: N(mu[label], 1.2) per feature.
Sequences make_sequences(std::int64_t B, std::int64_t T, ad::Rng& rng) {
  const double mu[kC][kF] = {{0.0, 0.0, 0.0, 0.0}, {0.9, -0.4, 0.5, 0.0}, {-0.3, 0.8, 0.0, 0.6}};
  Sequences s{ad::Tensor::empty({B, T, kF}), ad::Tensor::full({B, T}, -1, ad::DType::i64),
              ad::Tensor::full({B}, static_cast<double>(T), ad::DType::i64)};
  ad::Tensor noise = ad::Tensor::randn({B, T, kF}, rng, ad::DType::f64, 0, 1.2);
  ad::Tensor u = ad::Tensor::uniform({B, T, 2}, rng, ad::DType::f64);
  const double* nz = noise.data<double>();
  const double* uv = u.data<double>();
  float* x = s.x.data<float>();
  std::int64_t* seg = s.segments.data<std::int64_t>();
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t label = 0, t = 0;
    while (t < T) {
      double u1 = uv[(b * T + t) * 2], u2 = uv[(b * T + t) * 2 + 1];
      std::int64_t len = label == 0   ? 60 + static_cast<std::int64_t>(-140.0 * std::log(1.0 - u1 * 0.999))
                         : label == 1 ? 20 + static_cast<std::int64_t>(u1 * 100.0)
                                      : 120 + static_cast<std::int64_t>(u1 * 60.0);
      len = std::clamp<std::int64_t>(len, 1, std::min(kK, T - t));
      seg[b * T + t] = label;
      for (std::int64_t i = t; i < t + len; ++i)
        for (std::int64_t f = 0; f < kF; ++f)
          x[(b * T + i) * kF + f] = static_cast<float>(mu[label][f] + nz[(b * T + i) * kF + f]);
      t += len;
      label = (label + 1 + static_cast<std::int64_t>(u2 * (kC - 1))) % kC;
    }
  }
  return s;
}

// Boundary F1: predicted segment starts (t > 0) against gold starts, a
// prediction counting as a hit if a gold start lies within ±tol (each gold
// start matched at most once).
double boundary_f1(const std::vector<double>& pred, const std::vector<double>& gold, std::int64_t T, std::int64_t tol) {
  std::vector<std::int64_t> p, g;
  for (std::int64_t t = 1; t < T; ++t) {
    if (pred[static_cast<std::size_t>(t)] >= 0) p.push_back(t);
    if (gold[static_cast<std::size_t>(t)] >= 0) g.push_back(t);
  }
  std::vector<char> used(g.size(), 0);
  std::int64_t hit = 0;
  std::size_t j = 0;
  for (std::int64_t t : p) {
    while (j < g.size() && g[j] < t - tol) ++j;
    for (std::size_t k = j; k < g.size() && g[k] <= t + tol; ++k)
      if (!used[k]) { used[k] = 1; ++hit; break; }
  }
  double prec = p.empty() ? 0 : static_cast<double>(hit) / static_cast<double>(p.size());
  double rec = g.empty() ? 0 : static_cast<double>(hit) / static_cast<double>(g.size());
  return prec + rec > 0 ? 2 * prec * rec / (prec + rec) : 0;
}

struct Adam {
  std::vector<ad::Parameter> ps;
  std::vector<std::vector<double>> m, v;
  double lr;
  int step = 0;
  Adam(std::vector<ad::Parameter> p, double lr_) : ps(std::move(p)), lr(lr_) {
    for (auto& q : ps) {
      m.emplace_back(static_cast<std::size_t>(q.value().numel()), 0.0);
      v.emplace_back(static_cast<std::size_t>(q.value().numel()), 0.0);
    }
  }
  void update() {
    ++step;
    double c1 = 1 - std::pow(0.9, step), c2 = 1 - std::pow(0.999, step);
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].has_grad()) continue;
      float* p = ps[i].value().data<float>();
      const float* g = ps[i].grad().data<float>();
      for (std::size_t j = 0; j < m[i].size(); ++j) {
        if (!std::isfinite(p[j])) continue;  // -inf: forbidden stays forbidden
        m[i][j] = 0.9 * m[i][j] + 0.1 * g[j];
        v[i][j] = 0.999 * v[i][j] + 0.001 * g[j] * g[j];
        p[j] = static_cast<float>(p[j] - lr * (m[i][j] / c1) / (std::sqrt(v[i][j] / c2) + 1e-8));
      }
      ps[i].zero_grad();
    }
  }
};

}  // namespace

static int run(int argc, char** argv) {
  int epochs = 20;
  std::int64_t T = 100000;
  std::uint64_t seed = 7;
  try {
    for (int i = 1; i < argc; ++i) {
      const bool has = i + 1 < argc;
      if (!std::strcmp(argv[i], "--epochs") && has)
        epochs = static_cast<int>(args::flag_whole(argv[i], argv[i + 1], 0, 1000000)), ++i;
      else if (!std::strcmp(argv[i], "--length") && has) T = args::flag_whole(argv[i], argv[i + 1], 1), ++i;
      else if (!std::strcmp(argv[i], "--seed") && has) seed = args::flag_seed(argv[i], argv[i + 1]), ++i;
      else {
        std::fprintf(stderr, "usage: semicrf_segment [--epochs N >= 0] [--length T >= 1] [--seed S >= 0]\n");
        return 2;
      }
    }
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  ad::Rng rng(seed);
  Sequences train = make_sequences(2, T, rng), test = make_sequences(1, T, rng);
  ad::Parameter W = ad::Parameter::randn({kF, kC}, rng, 0.1, ad::DType::f32, "W");
  ad::Parameter bias = ad::Parameter::zeros({kC}, ad::DType::f32, "b");
  ad::Parameter D = ad::Parameter::zeros({kK, kC}, ad::DType::f32, "D");
  ad::Parameter Tr = ad::Parameter::zeros({kC, kC}, ad::DType::f32, "Tr");
  ad::Parameter P = ad::Parameter::zeros({kC}, ad::DType::f32, "P");
  {
    float* tr = Tr.value().data<float>();  // no self-transitions: a segment is a maximal run
    for (std::int64_t c = 0; c < kC; ++c) tr[c * kC + c] = -INFINITY;
  }
  Adam opt({W, bias, D, Tr, P}, 0.2);
  std::printf("semi-Markov CRF segmentation: %d train + 1 held-out sequences of T = %lld, C = %lld labels, K = %lld\n",
              2, static_cast<long long>(T), static_cast<long long>(kC), static_cast<long long>(kK));
  std::printf("%5s %12s %10s %12s %9s %12s\n", "epoch", "train NLL/T", "F1 exact", "F1 within 5", "step s", "peak MB");
  auto scores_of = [&](const ad::Var& x) { return ad::add(ad::matmul(x, W), bias); };
  for (int e = 0; e <= epochs; ++e) {
    double nll = 0, step_s = 0;
    std::int64_t peak = 0;
    if (e > 0) {
      ad::Graph g;
      auto t0 = std::chrono::steady_clock::now();
      ad::Var L = g.input(train.lengths);
      ad::Var S = ad::semicrf_cumulative(scores_of(g.input(train.x)), L);
      ad::Var nllv = ad::sub(ad::semicrf_logz(S, Tr, D, P, L), ad::semicrf_score(S, Tr, D, P, L, g.input(train.segments)));
      ad::Var loss = ad::mul_scalar(ad::sum(nllv), 1.0 / (2.0 * static_cast<double>(T)));
      ad::Report r = ad::backward(loss);
      opt.update();
      step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      nll = loss.value().item();
      peak = r.measured_peak_bytes;
    }
    ad::Graph g;
    ad::Var L = g.input(test.lengths);
    ad::Var S = ad::semicrf_cumulative(scores_of(g.input(test.x)), L);
    std::vector<double> pred = ad::eval(ad::semicrf_viterbi(S, Tr, D, P, L)).to_vector();
    std::vector<double> gold = test.segments.to_vector();
    if (e == 0) std::printf("%5d %12s %10.3f %12.3f %9s %12s\n", e, "-", boundary_f1(pred, gold, T, 0),
                            boundary_f1(pred, gold, T, 5), "-", "-");
    else
      std::printf("%5d %12.5f %10.3f %12.3f %9.2f %12.2f\n", e, nll, boundary_f1(pred, gold, T, 0),
                  boundary_f1(pred, gold, T, 5), step_s, static_cast<double>(peak) / 1e6);
    std::fflush(stdout);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // e.g. memory for a --length too large
    return args::report_error(e);
  }
}
