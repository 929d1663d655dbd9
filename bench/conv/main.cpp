// bench/conv — conv2d through the graph on the CPU, against the physical
// reference measured in the same run: one sgemm of the same total product
// ([O/G, C/G KH KW] x [C/G KH KW, N HO WO], per group), which is what an
// im2col convolution must at least do.
//   1. forward (eval of the conv node) and forward + both gradients
//      (backward_wrt for x and the weight: 3x the forward's flops), ms and
//      GFLOP/s, for a few layer shapes;
//   2. the predicted and measured peak bytes of a step of a 4-layer
//      conv-relu stack under keep_all, next to its activations' bytes and
//      to what the columns would add if they were kept as nodes.
//
//   bench_conv [--reps R] [--threads T]
#include <ad/ad.hpp>
#include <cblas.h>

#include "../cli.hpp"
#include "../timing.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace {

using bench_time::median_ms;

struct Layer {
  const char* what;
  std::int64_t n, c, h, w, o, k, pad, groups;
};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int reps = 9, threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = bench_cli::whole_int(argc, argv, i, 1);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = bench_cli::whole_int(argc, argv, i, 1, 256);
    else { std::fprintf(stderr, "usage: %s [--reps R] [--threads T]\n", argv[0]); return 2; }
  }
  if (threads > 0) openblas_set_num_threads(threads);
  try {
    ad::Rng rng(1);
    const Layer layers[] = {
        {"3x3, 64 -> 64, 32x32", 16, 64, 32, 32, 64, 3, 1, 1},
        {"3x3, 3 -> 32, 64x64 (a first layer)", 16, 3, 64, 64, 32, 3, 1, 1},
        {"1x1, 128 -> 128, 16x16", 16, 128, 16, 16, 128, 1, 0, 1},
        {"3x3 depthwise, 128, 16x16", 16, 128, 16, 16, 128, 3, 1, 128},
    };
    std::printf("f32, median of %d; reference: cblas_sgemm of the same total product per group\n\n", reps);
    std::printf("| layer | GFLOP fwd | fwd ms | fwd GFLOP/s | fwd+bwd ms | fwd+bwd GFLOP/s | sgemm GFLOP/s | fwd / sgemm "
                "| fwd+bwd / sgemm |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Layer& L : layers) {
      const std::int64_t cg = L.c / L.groups, og = L.o / L.groups, kk = L.k * L.k;
      ad::Tensor x = ad::Tensor::randn({L.n, L.c, L.h, L.w}, rng);
      ad::Parameter w = ad::Parameter::randn({L.o, cg, L.k, L.k}, rng, 0.1);
      ad::Conv2dOptions o;
      o.padding = {L.pad, L.pad};
      o.groups = L.groups;
      const std::int64_t ho = L.h + 2 * L.pad - L.k + 1, wo = L.w + 2 * L.pad - L.k + 1;
      const double flops = 2.0 * static_cast<double>(L.n * L.o * ho * wo * cg * kk);
      const double fwd = median_ms(reps, [&] {
        ad::Graph g;
        (void)ad::eval(ad::conv2d(g.input(x), w, o));
      });
      const double both = median_ms(reps, [&] {
        w.zero_grad();
        ad::Graph g;
        ad::Var xv = g.input(x);
        (void)ad::backward_wrt(ad::sum(ad::conv2d(xv, w, o)), {xv});
      });
      // the reference: per group, [og, cg kk] x [cg kk, n ho wo]
      const std::int64_t K = cg * kk, N = L.n * ho * wo;
      std::vector<float> A(static_cast<std::size_t>(og * K), 0.5f), B(static_cast<std::size_t>(K * N), 0.25f),
          C(static_cast<std::size_t>(og * N));
      const double gemm = median_ms(reps, [&] {
        for (std::int64_t gi = 0; gi < L.groups; ++gi)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(og), static_cast<int>(N),
                      static_cast<int>(K), 1.0f, A.data(), static_cast<int>(K), B.data(), static_cast<int>(N), 0.0f,
                      C.data(), static_cast<int>(N));
      });
      const double gf = flops / (fwd * 1e6), gb = 3 * flops / (both * 1e6), gr = flops / (gemm * 1e6);
      std::printf("| %s, N = %lld | %.2f | %.2f | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f |\n", L.what,
                  static_cast<long long>(L.n), flops / 1e9, fwd, gf, both, gb, gr, gf / gr, gb / gr);
    }

    // memory: 4 conv(3x3, 64 -> 64) + relu on [8, 64, 32, 32]
    const std::int64_t n = 8, c = 64, hw = 32;
    std::vector<ad::Parameter> ws;
    for (int i = 0; i < 4; ++i) ws.push_back(ad::Parameter::randn({c, c, 3, 3}, rng, 0.05));
    ad::Tensor x = ad::Tensor::randn({n, c, hw, hw}, rng);
    ad::Graph g;
    ad::Var h = g.input(x);
    ad::Conv2dOptions o;
    o.padding = {1, 1};
    for (auto& w : ws) h = ad::relu(ad::conv2d(h, w, o));
    ad::Report r = ad::backward(ad::mean(h));
    const double act = static_cast<double>(n * c * hw * hw * 4);
    std::printf("\n4 x (conv 3x3 64 -> 64 + relu) on [8, 64, 32, 32] f32, keep_all: predicted peak %.2f MiB, measured "
                "%.2f MiB; one activation %.2f MiB; the columns, were they nodes kept for backward, would add %.2f "
                "MiB\n",
                static_cast<double>(r.predicted_peak_bytes) / 1048576.0,
                static_cast<double>(r.measured_peak_bytes) / 1048576.0, act / 1048576.0, 4 * 9 * act / 1048576.0);
    if (r.measured_peak_bytes != r.predicted_peak_bytes) {
      std::fprintf(stderr, "error: measured peak differs from the prediction\n");
      return 1;
    }
    return 0;
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
