// bench_semicrf: semi-Markov CRF forward (logZ) and backward (all gradients)
// time, working memory measured by the graph's allocator against the design
// bound 2·√(T·K)·C + K·C values, the f32 − f64 logZ difference, and the speed
// ratio against a naive reference that keeps the full α and β tables (small
// sizes only). B = 1, fast path (Tr (C, C)).
//
//   bench_semicrf [--quick] [--only T,K,C] [--no-f64] [--no-naive] [--json] [--marginals] [--padded]
//                 [--threads N: time the kernels alone with N threads (no graph,
//                  no memory / f64 / naive columns)]
//                 [--flat: scores 0, transitions -20: every window flat, nothing skipped]
//                 [--gpu: the CUDA kernels on device 0 through the graph, default
//                  T,K,C = 400000,3000,24 (--only overrides): forward and
//                  forward+backward time, working memory from the allocator]
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"
#include "../cli.hpp"
#include "ops/semicrf_cpu.hpp"
#include "ops/semicrf_gpu.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Problem {
  std::int64_t T, K, C;
  std::vector<double> S, Tr, D, P;  // f64 master copy
};

// Genome-like scores: a hidden label path of segments with label-specific
// emission means, noise N(0,1); S = cumulative sums with the mean removed.
Problem make_problem(std::int64_t T, std::int64_t K, std::int64_t C, std::uint64_t seed) {
  Problem p{T, K, C, {}, {}, {}, {}};
  ad::Rng rng(seed);
  std::vector<double> noise = ad::Tensor::randn({T, C}, rng, ad::DType::f64).to_vector();
  std::vector<double> u = ad::Tensor::uniform({T}, rng, ad::DType::f64).to_vector();
  std::vector<double> x(static_cast<std::size_t>(T * C));
  std::int64_t label = 0, left = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    if (left == 0) {
      label = static_cast<std::int64_t>(u[static_cast<std::size_t>(t)] * static_cast<double>(C)) % C;
      left = 1 + static_cast<std::int64_t>(u[static_cast<std::size_t>((t * 7919) % T)] * static_cast<double>(K - 1));
    }
    --left;
    for (std::int64_t c = 0; c < C; ++c)
      x[static_cast<std::size_t>(t * C + c)] = noise[static_cast<std::size_t>(t * C + c)] + (c == label ? 0.5 : 0.0);
  }
  double mean = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  p.S.assign(static_cast<std::size_t>((T + 1) * C), 0.0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < C; ++c)
      p.S[static_cast<std::size_t>((t + 1) * C + c)] =
          p.S[static_cast<std::size_t>(t * C + c)] + x[static_cast<std::size_t>(t * C + c)] - mean;
  p.Tr = ad::Tensor::randn({C, C}, rng, ad::DType::f64, 0, 0.5).to_vector();
  p.D = ad::Tensor::randn({K, C}, rng, ad::DType::f64, -0.001, 0.3).to_vector();
  p.P = ad::Tensor::randn({C}, rng, ad::DType::f64, 0, 0.5).to_vector();
  return p;
}

struct Row {
  std::int64_t T, K, C, I = 0;
  double fwd_s = 0, bwd_s = 0, f64_fwd_s = -1, naive_s = -1, cpu_s = -1;
  double logz32 = 0, logz64 = NAN;
  std::int64_t ws_measured = 0, ws_predicted = 0, seq_values = 0;
  double bound_values = 0;
};

ad::Tensor tensor(const std::vector<double>& v, const ad::Shape& s, ad::DType t) {
  return ad::Tensor::from(std::span<const double>(v), s).to(t);
}

// Naive reference (f64): full α and β tables, O(T·K·C) with the transition
// logsumexp per position, plain scalar loops and std::exp; logZ + gradients.
double naive_fwd_bwd(const Problem& p, std::vector<double>& dS, std::vector<double>& dD) {
  const std::int64_t T = p.T, K = std::min(p.K, p.T), C = p.C;
  auto S = [&](std::int64_t t, std::int64_t c) { return p.S[static_cast<std::size_t>(t * C + c)]; };
  auto lse_add = [](double& m, double& s, double x) {
    if (x > m) { s = s * std::exp(m - x) + 1; m = x; } else s += std::exp(x - m);
  };
  std::vector<double> al(static_cast<std::size_t>((T + 1) * C), -INFINITY), A(al.size(), -INFINITY), be = al, G = al;
  auto trans = [&](const double* row, std::int64_t c, bool in) {
    double m = -INFINITY, s = 0;
    for (std::int64_t o = 0; o < C; ++o)
      lse_add(m, s, row[o] + (in ? p.Tr[static_cast<std::size_t>(o * C + c)] : p.Tr[static_cast<std::size_t>(c * C + o)]));
    return m + std::log(s);
  };
  for (std::int64_t c = 0; c < C; ++c) A[static_cast<std::size_t>(c)] = p.P[static_cast<std::size_t>(c)];
  for (std::int64_t t = 1; t <= T; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      double m = -INFINITY, s = 0;
      for (std::int64_t k = 1; k <= std::min(K, t); ++k)
        lse_add(m, s, A[static_cast<std::size_t>((t - k) * C + c)] - S(t - k, c) + p.D[static_cast<std::size_t>((k - 1) * C + c)]);
      al[static_cast<std::size_t>(t * C + c)] = S(t, c) + m + std::log(s);
    }
    if (t < T)
      for (std::int64_t c = 0; c < C; ++c) A[static_cast<std::size_t>(t * C + c)] = trans(&al[static_cast<std::size_t>(t * C)], c, true);
  }
  double m = -INFINITY, s = 0;
  for (std::int64_t c = 0; c < C; ++c) lse_add(m, s, al[static_cast<std::size_t>(T * C + c)]);
  double z = m + std::log(s);
  dS.assign(al.size(), 0.0);
  dD.assign(static_cast<std::size_t>(p.K * C), 0.0);
  for (std::int64_t c = 0; c < C; ++c) be[static_cast<std::size_t>(T * C + c)] = 0;
  for (std::int64_t t = T - 1; t >= 0; --t) {
    for (std::int64_t c = 0; c < C; ++c) {
      double mm = -INFINITY, ss = 0, a = A[static_cast<std::size_t>(t * C + c)];
      for (std::int64_t k = 1; k <= std::min(K, T - t); ++k) {
        double x = S(t + k, c) - S(t, c) + p.D[static_cast<std::size_t>((k - 1) * C + c)] + be[static_cast<std::size_t>((t + k) * C + c)];
        lse_add(mm, ss, x);
        double mu = std::exp(a + x - z);
        dD[static_cast<std::size_t>((k - 1) * C + c)] += mu;
        dS[static_cast<std::size_t>((t + k) * C + c)] += mu;
        dS[static_cast<std::size_t>(t * C + c)] -= mu;
      }
      G[static_cast<std::size_t>(t * C + c)] = mm + std::log(ss);
    }
    if (t > 0)
      for (std::int64_t c = 0; c < C; ++c) be[static_cast<std::size_t>(t * C + c)] = trans(&G[static_cast<std::size_t>(t * C)], c, false);
  }
  return z;
}

// Times the kernels directly with `threads` threads (f32): forward, backward.
struct Direct {
  double fwd, bwd, fwd_cpu, bwd_cpu;
};
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }
Direct run_direct(const Problem& p, int threads) {
  const std::int64_t T = p.T, K = p.K, C = p.C;
  ad::Tensor S = tensor(p.S, {1, T + 1, C}, ad::DType::f32), Tr = tensor(p.Tr, {C, C}, ad::DType::f32),
             D = tensor(p.D, {K, C}, ad::DType::f32), P = tensor(p.P, {C}, ad::DType::f32);
  std::vector<std::int64_t> L{T};
  ad::semicrf::Args a;
  a.d = {1, T, K, C, false, 4};
  a.S = S.raw(); a.Tr = Tr.raw(); a.D = D.raw(); a.P = P.raw(); a.L = L.data();
  std::vector<char> ws(static_cast<std::size_t>(ad::semicrf::workspace_bytes(a.d, ad::semicrf::Pass::backward, threads)));
  std::vector<float> out(static_cast<std::size_t>((T + 1) * C + C * C + K * C + C)), z(1);
  float dz = 1;
  Direct r{};
  auto t0 = Clock::now();
  double c0 = cpu_seconds();
  ad::semicrf::logz_cpu(a, z.data(), ws.data(), threads);
  r.fwd = seconds_since(t0);
  r.fwd_cpu = cpu_seconds() - c0;
  t0 = Clock::now();
  c0 = cpu_seconds();
  ad::semicrf::logz_backward_cpu(a, &dz, out.data(), ws.data(), threads);
  r.bwd = seconds_since(t0);
  r.bwd_cpu = cpu_seconds() - c0;
  return r;
}

// Worst case for block skipping: scores, D and P 0 and every transition −20,
// so α grows by ~C·e^-20 per position and every window term is within a few
// nats of its maximum: no block can be skipped.
void flatten(Problem& p) {
  for (auto* v : {&p.S, &p.D, &p.P}) std::fill(v->begin(), v->end(), 0.0);
  std::fill(p.Tr.begin(), p.Tr.end(), -20.0);
}

bool g_flat = false;

Row run(std::int64_t T, std::int64_t K, std::int64_t C, bool f64, bool naive, int threads) {
  Row r{T, K, C};
  Problem p = make_problem(T, K, C, 1000 + static_cast<std::uint64_t>(T + K + C));
  if (g_flat) flatten(p);
  ad::semicrf::Dims d{1, T, K, C, false, 4};
  r.I = ad::semicrf::interval(T, d.ke());
  r.seq_values = ad::semicrf::sequence_values(d);
  r.bound_values = 2 * std::sqrt(static_cast<double>(T) * static_cast<double>(d.ke())) * static_cast<double>(C) +
                   static_cast<double>(d.ke() * C);
  r.ws_predicted = ad::semicrf::workspace_bytes(d, ad::semicrf::Pass::backward, ad::semicrf::default_threads());
  if (threads > 0) {
    Direct x = run_direct(p, threads);
    r.fwd_s = x.fwd;
    r.bwd_s = x.bwd;
    r.cpu_s = x.fwd_cpu + x.bwd_cpu;
    return r;
  }
  {
    ad::Graph g;
    auto t = ad::DType::f32;
    ad::Var S = g.input(tensor(p.S, {1, T + 1, C}, t)), Tr = g.input(tensor(p.Tr, {C, C}, t)),
            D = g.input(tensor(p.D, {K, C}, t)), P = g.input(tensor(p.P, {C}, t)),
            L = g.input(ad::Tensor::from(std::span<const std::int64_t>(std::vector<std::int64_t>{T}), {1}));
    ad::Var z = ad::semicrf_logz(S, Tr, D, P, L);
    std::vector<ad::Var> gr = ad::grad(ad::sum(z), {S, Tr, D, P});
    auto t0 = Clock::now();
    r.logz32 = ad::eval(z).item();
    r.fwd_s = seconds_since(t0);
    auto& alloc = *g.impl().alloc;
    std::int64_t before = alloc.live_bytes();
    alloc.reset_peak();
    t0 = Clock::now();
    ad::eval(gr[0]);
    r.bwd_s = seconds_since(t0);
    std::int64_t out_bytes = (p.S.size() + p.Tr.size() + p.D.size() + p.P.size()) * 4;
    r.ws_measured = alloc.peak_bytes() - before - out_bytes;
  }
  if (f64) {
    ad::Graph g;
    auto t = ad::DType::f64;
    ad::Var z = ad::semicrf_logz(g.input(tensor(p.S, {1, T + 1, C}, t)), g.input(tensor(p.Tr, {C, C}, t)),
                                 g.input(tensor(p.D, {K, C}, t)), g.input(tensor(p.P, {C}, t)),
                                 g.input(ad::Tensor::from(std::span<const std::int64_t>(std::vector<std::int64_t>{T}), {1})));
    auto t0 = Clock::now();
    r.logz64 = ad::eval(z).item();
    r.f64_fwd_s = seconds_since(t0);
  }
  if (naive) {
    std::vector<double> dS, dD;
    auto t0 = Clock::now();
    double z = naive_fwd_bwd(p, dS, dD);
    r.naive_s = seconds_since(t0);
    if (!f64) r.logz64 = z;
  }
  return r;
}

// ---- --marginals ----
// The f32 fast path's posterior marginals against f64 on the same inputs
// (every input rounded to f32 first, so only the arithmetic differs): the
// largest absolute difference, and the f32 values outside [0, 1].
int marginals_accuracy(const std::vector<std::array<std::int64_t, 3>>& grid) {
  std::printf("semicrf_marginals, f32 against f64 on the same (f32-rounded) inputs, B = 1\n\n");
  std::printf("| T | K | C | max abs(f32 - f64) | min f32 | max f32 | f32 values outside [0, 1] |\n|---|---|---|---|---|---|---|\n");
  for (auto [T, K, C] : grid) {
    Problem p = make_problem(T, K, C, 1000 + static_cast<std::uint64_t>(T + K + C));
    if (g_flat) flatten(p);
    std::vector<double> m[2];
    for (int i = 0; i < 2; ++i) {
      const ad::DType t = i ? ad::DType::f64 : ad::DType::f32;
      auto in = [&](const std::vector<double>& v, const ad::Shape& s) {
        return tensor(v, s, ad::DType::f32).to(t);
      };
      ad::Graph g;
      ad::Var L = g.input(ad::Tensor::from(std::span<const std::int64_t>(std::vector<std::int64_t>{T}), {1}));
      m[i] = ad::eval(ad::semicrf_marginals(g.input(in(p.S, {1, T + 1, C})), g.input(in(p.Tr, {C, C})),
                                            g.input(in(p.D, {K, C})), g.input(in(p.P, {C})), L))
                 .to_vector();
    }
    double worst = 0, lo = INFINITY, hi = -INFINITY;
    std::int64_t out = 0;
    for (std::size_t j = 0; j < m[0].size(); ++j) {
      worst = std::max(worst, std::fabs(m[0][j] - m[1][j]));
      lo = std::min(lo, m[0][j]);
      hi = std::max(hi, m[0][j]);
      out += m[0][j] < 0 || m[0][j] > 1;
    }
    std::printf("| %lld | %lld | %lld | %.3g | %.4g | %.6g | %lld of %zu |\n", static_cast<long long>(T),
                static_cast<long long>(K), static_cast<long long>(C), worst, lo, hi, static_cast<long long>(out),
                m[0].size());
  }
  return 0;
}

// ---- --padded ----
// A sequence of L real positions (N(0, 1) scores) padded to T = 2L with a
// constant score, as a padded batch holds it: f32 marginals over the real
// positions against f64's of the sequence alone, with S from
// semicrf_cumulative(scores) (the shift is the mean over the padding too) and
// from semicrf_cumulative(scores, L) (the real positions only).
int padded_accuracy() {
  std::printf("semicrf_marginals in f32, a sequence of L positions padded to T = 2L: max abs difference from f64 "
              "on the sequence alone, B = 1\n\n");
  std::printf("| L | K | C | padding score | S without L | S with L |\n|---|---|---|---|---|---|\n");
  for (auto [L, K, C] : {std::array<std::int64_t, 3>{1000, 20, 4}, {10000, 100, 8}})
    for (double pad : {0.0, -100.0, -1e4}) {
      const std::int64_t T = 2 * L;
      ad::Rng rng(7 + static_cast<std::uint64_t>(L));
      const ad::Tensor real = ad::Tensor::randn({1, L, C}, rng, ad::DType::f64);
      ad::Tensor padded = ad::Tensor::full({1, T, C}, pad, ad::DType::f64);
      std::copy(real.data<double>(), real.data<double>() + L * C, padded.data<double>());
      const ad::Tensor tr = ad::Tensor::randn({C, C}, rng, ad::DType::f64, 0, 0.5),
                       d = ad::Tensor::randn({K, C}, rng, ad::DType::f64, 0, 0.5),
                       p = ad::Tensor::randn({C}, rng, ad::DType::f64, 0, 0.5);
      auto marginals = [&](const ad::Tensor& x, ad::DType t, bool with_lengths) {
        ad::Graph g;
        ad::Var lv = g.input(ad::Tensor::from(std::span<const std::int64_t>(std::vector<std::int64_t>{L}), {1}));
        ad::Var s = with_lengths ? ad::semicrf_cumulative(g.input(x.to(t)), lv) : ad::semicrf_cumulative(g.input(x.to(t)));
        return ad::eval(ad::semicrf_marginals(s, g.input(tr.to(t)), g.input(d.to(t)), g.input(p.to(t)), lv))
            .to(ad::DType::f64)
            .to_vector();
      };
      const std::vector<double> ref = marginals(real, ad::DType::f64, true);
      double err[2] = {0, 0};
      for (int w = 0; w < 2; ++w) {
        const std::vector<double> m = marginals(padded, ad::DType::f32, w == 1);
        for (std::int64_t i = 0; i < L * C; ++i)
          err[w] = std::max(err[w], std::fabs(m[static_cast<std::size_t>(i)] - ref[static_cast<std::size_t>(i)]));
      }
      std::printf("| %lld | %lld | %lld | %g | %.3g | %.3g |\n", static_cast<long long>(L), static_cast<long long>(K),
                  static_cast<long long>(C), pad, err[0], err[1]);
    }
  return 0;
}

// ---- --gpu ----
// logZ and all four gradients of one sequence on device 0 (f32, fast path),
// through the graph as a user runs them: forward time (logZ copied back),
// backward time (gradients computed, device synchronised), and the working
// memory the graph's allocator saw during the backward pass beyond its
// outputs, against the workspace the op reports and the design bound.
int gpu_bench(std::int64_t T, std::int64_t K, std::int64_t C, bool json) {
  if (!ad::cuda::available()) {
    std::printf("bench_semicrf --gpu: no GPU on this machine (or no CUDA backend in this build); nothing measured\n");
    return 0;
  }
  const ad::Device dev = ad::Device::cuda(0);
  auto once = [&](std::int64_t T1, Row& r) {
    Problem p = make_problem(T1, K, C, 1000 + static_cast<std::uint64_t>(T1 + K + C));
    ad::Graph g;
    auto t = ad::DType::f32;
    ad::Var S = g.input(tensor(p.S, {1, T1 + 1, C}, t).to(dev)), Tr = g.input(tensor(p.Tr, {C, C}, t).to(dev)),
            D = g.input(tensor(p.D, {K, C}, t).to(dev)), P = g.input(tensor(p.P, {C}, t).to(dev)),
            L = g.input(ad::Tensor::from(std::span<const std::int64_t>(std::vector<std::int64_t>{T1}), {1}).to(dev));
    ad::Var z = ad::semicrf_logz(S, Tr, D, P, L);
    std::vector<ad::Var> gr = ad::grad(ad::sum(z), {S, Tr, D, P});
    ad::cuda::synchronize(0);
    auto t0 = Clock::now();
    r.logz32 = ad::eval(z).to(ad::Device::cpu()).item();
    r.fwd_s = seconds_since(t0);
    auto& alloc = *g.impl().alloc;
    std::int64_t before = alloc.live_bytes();
    alloc.reset_peak();
    t0 = Clock::now();
    ad::eval(gr[0]);
    ad::cuda::synchronize(0);
    r.bwd_s = seconds_since(t0);
    std::int64_t out_bytes = static_cast<std::int64_t>(p.S.size() + p.Tr.size() + p.D.size() + p.P.size()) * 4;
    r.ws_measured = alloc.peak_bytes() - before - out_bytes;
  };
  Row warm{2000, K, C};
  once(2000, warm);  // CUDA context, module load
  Row r{T, K, C};
  ad::semicrf::Dims d{1, T, K, C, false, 4};
  r.I = ad::semicrf::interval(T, d.ke());
  r.ws_predicted = ad::semicrf::gpu::layout(d, ad::semicrf::Pass::backward).total;
  r.bound_values = 2 * std::sqrt(static_cast<double>(T) * static_cast<double>(d.ke())) * static_cast<double>(C) +
                   static_cast<double>(d.ke() * C);
  once(T, r);
  if (json) {
    std::printf("{\"device\": \"cuda:0\", \"T\": %lld, \"K\": %lld, \"C\": %lld, \"I\": %lld, \"forward_s\": %.6f, "
                "\"backward_s\": %.6f, \"workspace_bytes\": %lld, \"workspace_predicted\": %lld, \"logz_f32\": %.10g}\n",
                static_cast<long long>(T), static_cast<long long>(K), static_cast<long long>(C),
                static_cast<long long>(r.I), r.fwd_s, r.bwd_s, static_cast<long long>(r.ws_measured),
                static_cast<long long>(r.ws_predicted), r.logz32);
    return 0;
  }
  std::printf("semicrf on GPU (cuda:0), B = 1, fast path, f32, through the graph\n\n");
  std::printf("| T | K | C | I | forward s | backward s (incl. its forward) | fwd+bwd s | working MB (allocator) | "
              "workspace MB (op) | bound MB 4·(2√(TK)C+KC) | logZ f32 |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %lld | %lld | %lld | %lld | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.6g |\n", static_cast<long long>(T),
              static_cast<long long>(K), static_cast<long long>(C), static_cast<long long>(r.I), r.fwd_s, r.bwd_s,
              r.fwd_s + r.bwd_s, static_cast<double>(r.ws_measured) / 1e6, static_cast<double>(r.ws_predicted) / 1e6,
              4 * r.bound_values / 1e6, r.logz32);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table row as it is measured, also into a pipe
  bool quick = false, json = false, f64 = true, naive = true, gpu = false, marginals = false, padded = false;
  int threads = 0;
  std::int64_t oT = 0, oK = 0, oC = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--json") json = true;
    else if (a == "--no-f64") f64 = false;
    else if (a == "--no-naive") naive = false;
    else if (a == "--flat") g_flat = true;
    else if (a == "--gpu") gpu = true;
    else if (a == "--marginals") marginals = true;
    else if (a == "--padded") padded = true;
    else if (a == "--threads" && i + 1 < argc) threads = bench_cli::whole_int(argc, argv, i, 0);
    else if (a == "--only" && i + 1 < argc) {
      long long t, k, c;
      char end = 0;
      if (std::sscanf(argv[++i], "%lld,%lld,%lld%c", &t, &k, &c, &end) != 3 || t < 1 || k < 1 || c < 1) {
        std::fprintf(stderr, "--only takes T,K,C, three whole numbers >= 1, got '%s'\n", argv[i]);
        return 2;
      }
      oT = t; oK = k; oC = c;
    } else {
      std::fprintf(stderr, "usage: bench_semicrf [--quick] [--only T,K,C] [--no-f64] [--no-naive] [--json] [--threads N] [--flat] [--gpu] [--marginals] [--padded]\n");
      return 2;
    }
  }
  if (gpu) return oT ? gpu_bench(oT, oK, oC, json) : gpu_bench(400000, 3000, 24, json);
  if (padded) return padded_accuracy();
  std::vector<std::array<std::int64_t, 3>> grid;
  if (oT) grid.push_back({oT, oK, oC});
  else if (quick) grid = {{10000, 100, 16}, {10000, 1000, 24}, {100000, 100, 24}};
  else
    for (std::int64_t T : {10000, 100000, 400000})
      for (std::int64_t K : {100, 1000, 3000})
        for (std::int64_t C : {16, 24}) grid.push_back({T, K, C});
  if (marginals)
    return marginals_accuracy(oT ? grid : std::vector<std::array<std::int64_t, 3>>{{2000, 50, 8}, {10000, 100, 16},
                                                                                  {10000, 1000, 24}, {20000, 1000, 8}});
  std::vector<Row> rows;
  if (!json && threads > 0) {
    std::printf("semicrf kernels alone, B = 1, fast path, f32, %d threads%s\n\n", threads, g_flat ? ", flat scores" : "");
    std::printf("| T | K | C | forward s | backward s | fwd+bwd s | CPU s (all threads) |\n|---|---|---|---|---|---|---|\n");
  } else if (!json) {
    std::printf("semicrf, B = 1, fast path, f32, %d threads%s\n\n", ad::semicrf::default_threads(),
                g_flat ? ", flat scores" : "");
    std::printf("| T | K | C | I | forward s | backward s | fwd+bwd s | workspace MB (measured) | bound MB 4·(2√(TK)C+KC) | "
                "per-seq f32 elements / bound (a ring slot: 1.5) | f64 fwd s | logZ f32 | logZ f32−f64 (rel) | naive f64 fwd+bwd s | naive / ours |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (auto [T, K, C] : grid) {
    bool nv = naive && T * std::min(K, T) * C <= 10000LL * 1000 * 24;
    Row r = run(T, K, C, f64, nv, threads);
    rows.push_back(r);
    if (json) continue;
    if (threads > 0) {
      std::printf("| %lld | %lld | %lld | %.3f | %.3f | %.3f | %.3f |\n", static_cast<long long>(T),
                  static_cast<long long>(K), static_cast<long long>(C), r.fwd_s, r.bwd_s, r.fwd_s + r.bwd_s, r.cpu_s);
      std::fflush(stdout);
      continue;
    }
    double rel = std::isnan(r.logz64) ? NAN : (r.logz32 - r.logz64) / std::fabs(r.logz64);
    std::printf("| %lld | %lld | %lld | %lld | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s | %.6g | %s | %s | %s |\n",
                static_cast<long long>(T), static_cast<long long>(K), static_cast<long long>(C),
                static_cast<long long>(r.I), r.fwd_s, r.bwd_s, r.fwd_s + r.bwd_s, static_cast<double>(r.ws_measured) / 1e6,
                4 * r.bound_values / 1e6, static_cast<double>(r.seq_values) / r.bound_values,
                r.f64_fwd_s < 0 ? "-" : std::to_string(r.f64_fwd_s).c_str(), r.logz32,
                std::isnan(rel) ? "-" : fmt::format("{:.2e}", rel).c_str(),
                r.naive_s < 0 ? "-" : fmt::format("{:.3f}", r.naive_s).c_str(),
                r.naive_s < 0 ? "-" : fmt::format("{:.1f}", r.naive_s / (r.fwd_s + r.bwd_s)).c_str());
    std::fflush(stdout);
  }
  if (json) {
    std::printf("[\n");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("  {\"T\": %lld, \"K\": %lld, \"C\": %lld, \"I\": %lld, \"forward_s\": %.6f, \"backward_s\": %.6f, "
                  "\"workspace_bytes\": %lld, \"workspace_predicted\": %lld, \"bound_values\": %.1f, \"sequence_values\": %lld, "
                  "\"f64_forward_s\": %.6f, \"logz_f32\": %.10g, \"logz_f64\": %s, \"naive_s\": %.6f}%s\n",
                  static_cast<long long>(r.T), static_cast<long long>(r.K), static_cast<long long>(r.C),
                  static_cast<long long>(r.I), r.fwd_s, r.bwd_s, static_cast<long long>(r.ws_measured),
                  static_cast<long long>(r.ws_predicted), r.bound_values, static_cast<long long>(r.seq_values),
                  r.f64_fwd_s, r.logz32, std::isnan(r.logz64) ? "null" : fmt::format("{:.17g}", r.logz64).c_str(),
                  r.naive_s, i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
  }
  return 0;
}
