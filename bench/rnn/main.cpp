// bench/rnn — backpropagation through time with ad::nn::GRU / LSTM under the
// rematerialisation policies, against keep_all and against the GEMMs the
// step must do, measured in the same run.
//
// Per (cell, sequence length T) and policy (keep_all, sqrt_n, budget at a
// quarter of keep_all's peak): a fresh graph per step (x [B, T, input] ->
// recurrent layer -> Linear head -> mse against per-step targets ->
// backward), its peak (predicted before the run and measured by the
// allocator; the run fails if they differ), the median step time, the
// nodes recomputed, the first step's planning time. The reference: the
// recurrence's matrix products alone (per step and layer: x W_ih^T, h W_hh^T
// forward; their two input gradients and two weight gradients backward), as
// back-to-back cblas_sgemm calls of the same shapes — what an unrolled
// recurrence of this batch costs before any elementwise work or bookkeeping.
//
//   bench_rnn [--seq T]... [--batch B] [--hidden H] [--input I] [--layers L] [--reps R] [--threads N] [--json]
// --threads sets OpenBLAS's threads (the GEMMs of both ad and the reference).
#include <ad/ad.hpp>
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "../cli.hpp"
#include "../timing.hpp"

extern "C" void openblas_set_num_threads(int);

namespace {

struct Config {
  std::vector<std::int64_t> seqs;
  std::int64_t batch = 16, hidden = 128, input = 32, layers = 1;
  int reps = 5, threads = 2;
  bool json = false;
};

struct Row {
  std::string cell, policy;
  std::int64_t T = 0, peak = 0, nodes = 0, recomputed = 0;
  double ms = 0, plan_ms = 0, gemm_ms = 0, peak_ratio = 0, time_ratio = 0;
};

// The recurrence's GEMMs for one step of training, back to back.
double gemm_floor_ms(const Config& c, std::int64_t T, std::int64_t gates, int reps) {
  const std::int64_t B = c.batch, H = c.hidden, GH = gates * H, I0 = c.input;
  std::vector<float> x(static_cast<std::size_t>(B * std::max(I0, H)), 0.5f), w(static_cast<std::size_t>(GH * std::max(I0, H)), 0.01f),
      g(static_cast<std::size_t>(B * GH), 0.1f), dw(w.size(), 0.0f), dx(x.size(), 0.0f);
  return bench_time::median_ms(reps, [&] {
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t l = 0; l < c.layers; ++l) {
        const auto I = static_cast<int>(l == 0 ? I0 : H);
        const auto b = static_cast<int>(B), gh = static_cast<int>(GH), h = static_cast<int>(H);
        // forward: [B, I] x [GH, I]^T and [B, H] x [GH, H]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, gh, I, 1, x.data(), I, w.data(), I, 0, g.data(), gh);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, gh, h, 1, x.data(), h, w.data(), h, 0, g.data(), gh);
        // backward: dx = dG W_ih, dh = dG W_hh, dW_ih += dG^T x, dW_hh += dG^T h
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, I, gh, 1, g.data(), gh, w.data(), I, 0, dx.data(), I);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, h, gh, 1, g.data(), gh, w.data(), h, 0, dx.data(), h);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, gh, I, b, 1, g.data(), gh, x.data(), I, 1, dw.data(), I);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, gh, h, b, 1, g.data(), gh, x.data(), h, 1, dw.data(), h);
      }
  });
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seq") c.seqs.push_back(bench_cli::whole(argc, argv, i, 2, 1 << 20));
    else if (a == "--batch") c.batch = bench_cli::whole(argc, argv, i, 1, 1 << 16);
    else if (a == "--hidden") c.hidden = bench_cli::whole(argc, argv, i, 1, 1 << 14);
    else if (a == "--input") c.input = bench_cli::whole(argc, argv, i, 1, 1 << 14);
    else if (a == "--layers") c.layers = bench_cli::whole(argc, argv, i, 1, 16);
    else if (a == "--reps") c.reps = bench_cli::whole_int(argc, argv, i, 1, 1000);
    else if (a == "--threads") c.threads = bench_cli::whole_int(argc, argv, i, 1, 256);
    else if (a == "--json") c.json = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--seq T]... [--batch B] [--hidden H] [--input I] [--layers L] [--reps R] "
                   "[--threads N] [--json]\n",
                   argv[0]);
      return 2;
    }
  }
  if (c.seqs.empty()) c.seqs = {256, 1024, 4096};
  openblas_set_num_threads(c.threads);
  std::vector<Row> rows;
  try {
    for (ad::nn::CellKind kind : {ad::nn::CellKind::gru, ad::nn::CellKind::lstm})
      for (std::int64_t T : c.seqs) {
        const std::string cell = kind == ad::nn::CellKind::gru ? "GRU" : "LSTM";
        ad::Rng rng(1);
        ad::nn::RNNOptions o;
        o.num_layers = c.layers;
        ad::nn::Recurrent net(kind, c.input, c.hidden, rng, o);
        ad::nn::Linear head(c.hidden, 1, rng);
        const ad::Tensor x = ad::Tensor::randn({c.batch, T, c.input}, rng),
                         y = ad::Tensor::randn({c.batch, T, 1}, rng);
        const double gemm = gemm_floor_ms(c, T, kind == ad::nn::CellKind::gru ? 3 : 4, c.reps);
        double all_ms = 0;
        std::int64_t all_peak = 0;
        for (int p = 0; p < 3; ++p) {
          const ad::Policy pol = p == 0   ? ad::policy::keep_all()
                                 : p == 1 ? ad::policy::sqrt_n()
                                          : ad::policy::budget(all_peak / 2);
          Row r{cell, pol.name(), T};
          bool first = true;
          auto step = [&] {
            ad::Graph g;
            ad::Var loss = ad::mse(head(net(g.input(x)).output), g.input(y));
            const ad::Report rep = ad::backward(loss, pol);
            if (std::getenv("BENCH_RNN_TRACE"))
              std::fprintf(stderr, "  step: plan %.1f ms (cached %d) run %.1f ms\n", rep.plan_ms, int(rep.plan_cached), rep.run_ms);
            if (rep.measured_peak_bytes != rep.predicted_peak_bytes)
              throw ad::Error(fmt::format("{} T={} {}: measured peak {} B, predicted {} B", cell, T, pol.name(),
                                          rep.measured_peak_bytes, rep.predicted_peak_bytes));
            if (first) r.plan_ms = rep.plan_ms, r.nodes = g.num_nodes(), first = false;
            r.peak = rep.measured_peak_bytes;
            r.recomputed = rep.recomputed_nodes;
          };
          r.ms = bench_time::median_ms(c.reps, step);
          if (p == 0) all_ms = r.ms, all_peak = r.peak;
          r.gemm_ms = gemm;
          r.peak_ratio = static_cast<double>(r.peak) / static_cast<double>(all_peak);
          r.time_ratio = r.ms / all_ms;
          rows.push_back(r);
          if (!c.json) std::fprintf(stderr, "%s T=%lld %s done\n", cell.c_str(), static_cast<long long>(T), pol.name().c_str());
        }
      }
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (c.json) {
    std::printf("[");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s{\"cell\":\"%s\",\"T\":%lld,\"policy\":\"%s\",\"nodes\":%lld,\"peak_bytes\":%lld,\"peak_ratio\":%.4f,"
                  "\"step_ms\":%.3f,\"time_ratio\":%.4f,\"recomputed\":%lld,\"plan_ms\":%.2f,\"gemm_floor_ms\":%.3f}",
                  i ? "," : "", r.cell.c_str(), static_cast<long long>(r.T), r.policy.c_str(),
                  static_cast<long long>(r.nodes), static_cast<long long>(r.peak), r.peak_ratio, r.ms, r.time_ratio,
                  static_cast<long long>(r.recomputed), r.plan_ms, r.gemm_ms);
    }
    std::printf("]\n");
    return 0;
  }
  std::printf("Backpropagation through time: batch %lld, input %lld, hidden %lld, %lld layer(s), median of %d, %d thread(s)\n\n",
              static_cast<long long>(c.batch), static_cast<long long>(c.input), static_cast<long long>(c.hidden),
              static_cast<long long>(c.layers), c.reps, c.threads);
  std::printf("| cell | T | policy | nodes | peak MiB (predicted = measured) | peak / keep_all | step ms | time / keep_all | recomputed | plan ms | GEMM floor ms | floor / step |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %lld | %s | %lld | %.2f | %.3f | %.1f | %.2f | %lld | %.1f | %.1f | %.2f |\n", r.cell.c_str(),
                static_cast<long long>(r.T), r.policy.c_str(), static_cast<long long>(r.nodes),
                static_cast<double>(r.peak) / (1 << 20), r.peak_ratio, r.ms, r.time_ratio,
                static_cast<long long>(r.recomputed), r.plan_ms, r.gemm_ms, r.gemm_ms / r.ms);
  return 0;
}
