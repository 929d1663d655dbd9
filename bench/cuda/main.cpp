// bench_cuda: the core ops on a GPU (device 0), through ad's graph API,
// against references measured in the same run.
//   1. matmul TFLOP/s (f32, f64) against cuBLAS called directly (cublasSgemm /
//      cublasDgemm into a preallocated output);
//   2. elementwise and reduction GB/s (the bytes each op must move: inputs
//      read once, output written once) against a device-to-device copy;
//   3. per-op overhead: a chain of 1,000 ops on one-element tensors, one
//      schedule executed (µs per op), and the same with graph building and
//      planning included;
//   4. an MLP training step (forward, backward, SGD) in ms.
// Every figure is the minimum over --reps timed runs after a warm-up, timed
// on the host around ad::cuda::synchronize(). Without a GPU (or without the
// CUDA backend) it says so and exits 0; scripts/gpu-check.sh runs it.
//   bench_cuda [--reps k] [--quick]
#include <ad/ad.hpp>
#include "../cli.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../gpu_time.hpp"
#include "core/graph_impl.hpp"

#if AD_BENCH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace {
using Clock = std::chrono::steady_clock;
using i64 = std::int64_t;

#if AD_BENCH_CUDA
// One op through the graph: a fresh graph per call (as a training loop
// builds one per step), evaluated on the device.
template <class Build> std::function<void()> graph_op(const std::vector<ad::Tensor>& in, Build build) {
  return [&in, build] {
    ad::Graph g;
    std::vector<ad::Var> vs;
    for (const auto& t : in) vs.push_back(g.input(t));
    ad::eval(build(vs));
  };
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw ad::Error(std::string("bench_cuda: ") + what + " failed");
}

int run(int reps, bool quick) {
  if (!ad::cuda::available()) {
    std::printf("bench_cuda: no GPU on this machine (ad::cuda::available() is false); nothing measured\n");
    return 0;
  }
  const ad::Device dev = ad::Device::cuda(0);
  ad::Rng rng(1);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("bench_cuda on %s (%d SMs)\n\n", prop.name, prop.multiProcessorCount);

  // ---- 1. matmul ----
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  std::printf("### matmul (C = A B, n x n)\n\n| dtype | n | ad TFLOP/s | cuBLAS TFLOP/s | ad / cuBLAS |\n|---|---|---|---|---|\n");
  for (ad::DType t : {ad::DType::f32, ad::DType::f64}) {
    for (i64 n : quick ? std::vector<i64>{2048} : std::vector<i64>{1024, 4096, 8192}) {
      if (t == ad::DType::f64 && n > 4096) continue;
      std::vector<ad::Tensor> in{ad::Tensor::randn({n, n}, rng, t).to(dev), ad::Tensor::randn({n, n}, rng, t).to(dev)};
      ad::Tensor c = ad::Tensor::zeros({n, n}, t).to(dev);
      const double t_ad = bench::gpu_time_min(reps, graph_op(in, [](auto& v) { return ad::matmul(v[0], v[1]); }));
      const int ni = static_cast<int>(n);
      const double t_blas = bench::gpu_time_min(reps, [&] {
        // row-major C = A B is column-major C^T = B^T A^T
        if (t == ad::DType::f32) {
          const float one = 1, zero = 0;
          check_cublas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &one, static_cast<const float*>(in[1].raw()),
                                   ni, static_cast<const float*>(in[0].raw()), ni, &zero, static_cast<float*>(c.raw()), ni),
                       "cublasSgemm");
        } else {
          const double one = 1, zero = 0;
          check_cublas(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &one, static_cast<const double*>(in[1].raw()),
                                   ni, static_cast<const double*>(in[0].raw()), ni, &zero, static_cast<double*>(c.raw()),
                                   ni),
                       "cublasDgemm");
        }
      });
      const double fl = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      std::printf("| %s | %lld | %.2f | %.2f | %.3f |\n", ad::dtype_name(t), static_cast<long long>(n), fl / t_ad / 1e12,
                  fl / t_blas / 1e12, t_blas / t_ad);
    }
  }
  cublasDestroy(h);

  // ---- 2. elementwise and reductions ----
  const i64 rows = quick ? 4096 : 8192, cols = quick ? 4096 : 8192, N = rows * cols;
  std::vector<ad::Tensor> in{ad::Tensor::randn({rows, cols}, rng).to(dev), ad::Tensor::randn({rows, cols}, rng).to(dev)};
  ad::Tensor dst = ad::Tensor::zeros({rows, cols}).to(dev);
  const double t_copy = bench::gpu_time_min(reps, [&] {
    if (cudaMemcpy(dst.raw(), in[0].raw(), static_cast<std::size_t>(N) * 4, cudaMemcpyDeviceToDevice) != cudaSuccess)
      throw ad::Error("bench_cuda: cudaMemcpy failed");
  });
  const double copy_gbs = 8.0 * static_cast<double>(N) / t_copy / 1e9;
  std::printf("\n### elementwise and reductions (f32, %lld x %lld)\n\n| op | bytes moved / element | ms | GB/s | vs "
              "device copy |\n|---|---|---|---|---|\n",
              static_cast<long long>(rows), static_cast<long long>(cols));
  std::printf("| device-to-device copy | 8 | %.3f | %.1f | 1.00 |\n", t_copy * 1e3, copy_gbs);
  struct Case {
    const char* name;
    double bytes;  // per element
    std::function<ad::Var(std::vector<ad::Var>&)> f;
  };
  std::vector<Case> cases = {
      {"add(a, b)", 12, [](auto& v) { return ad::add(v[0], v[1]); }},
      {"mul(a, b)", 12, [](auto& v) { return ad::mul(v[0], v[1]); }},
      {"tanh(a)", 8, [](auto& v) { return ad::tanh(v[0]); }},
      {"add(a, row) (broadcast)", 8, [](auto& v) { return ad::add(v[0], ad::slice(v[1], 0, 0, 1)); }},
      {"sum(a) (all)", 4, [](auto& v) { return ad::sum(v[0]); }},
      {"sum(a, rows)", 4, [](auto& v) { return ad::sum(v[0], {1}); }},
      {"sum(a, columns)", 4, [](auto& v) { return ad::sum(v[0], {0}); }},
      {"softmax(a, -1)", 8, [](auto& v) { return ad::softmax(v[0], -1); }},
  };
  for (auto& c : cases) {
    const double t = bench::gpu_time_min(reps, graph_op(in, c.f));
    const double gbs = c.bytes * static_cast<double>(N) / t / 1e9;
    std::printf("| %s | %.0f | %.3f | %.1f | %.2f |\n", c.name, c.bytes, t * 1e3, gbs, gbs / copy_gbs);
  }

  // ---- 3. per-op overhead ----
  constexpr int kOps = 1000;
  ad::Tensor one = ad::Tensor::ones({1}).to(dev);
  double exec_best = INFINITY;
  const double t_all = bench::gpu_time_min(reps, [&] {
    ad::Graph g;
    ad::Var x = g.input(one);
    for (int i = 0; i < kOps; ++i) x = ad::add_scalar(x, 1.0);
    ad::Schedule s = ad::plan(g.impl(), {x.id()}, {}, ad::policy::keep_all());
    auto t0 = Clock::now();
    ad::execute(g.impl(), s);
    ad::cuda::synchronize(0);
    exec_best = std::min(exec_best, std::chrono::duration<double>(Clock::now() - t0).count());
  });
  std::printf("\n### per-op overhead (a chain of %d add_scalar on one element)\n\n| what | µs per op |\n|---|---|\n", kOps);
  std::printf("| execute a planned schedule (launch + bookkeeping) | %.2f |\n", exec_best / kOps * 1e6);
  std::printf("| build the graph, plan, execute | %.2f |\n", t_all / kOps * 1e6);

  // ---- 4. MLP training step ----
  const i64 width = 1024, batch = 256, layers = 4;
  std::vector<ad::Parameter> w;
  for (i64 i = 0; i < layers; ++i)
    w.emplace_back(ad::Tensor::randn({width, width}, rng, ad::DType::f32, 0, 1.0 / std::sqrt(double(width))).to(dev));
  ad::Tensor x = ad::Tensor::randn({batch, width}, rng).to(dev);
  for (const ad::Policy& pol : {ad::policy::keep_all(), ad::policy::sqrt_n(), ad::policy::keep_all().offloaded()}) {
    ad::Report last;
    const double t = bench::gpu_time_min(reps, [&] {
      ad::Graph g;
      ad::Var hh = g.input(x);
      for (auto& p : w) hh = ad::tanh(ad::matmul(hh, p));
      last = ad::backward(ad::mean(ad::mul(hh, hh)), pol);
      for (auto& p : w) p.zero_grad();
    });
    std::printf("%s| MLP step (%lld x tanh(%lld), batch %lld), %s | %.3f ms | peak %lld B (predicted %lld B) |\n",
                pol.kind == ad::Policy::Kind::keep_all && !pol.offload ? "\n### MLP training step (forward + backward)\n\n| "
                                                                          "what | time | device memory |\n|---|---|---|\n"
                                                                        : "",
                static_cast<long long>(layers), static_cast<long long>(width), static_cast<long long>(batch),
                last.policy.c_str(), t * 1e3, static_cast<long long>(last.measured_peak_bytes),
                static_cast<long long>(last.predicted_peak_bytes));
  }
  std::printf("\nLibTorch on the GPU: not compared (the LibTorch that bench_overhead links, Debian's, is CPU-only).\n");
  return 0;
}
#endif
}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table row as it is measured, also into a pipe
  int reps = 10;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = bench_cli::whole_int(argc, argv, i, 1);
    else if (a == "--quick") quick = true;
    else if (a == "--gpu") {  // accepted for symmetry with the other benchmarks: this one only runs on a GPU
    } else {
      std::fprintf(stderr, "usage: bench_cuda [--reps k] [--quick]\n");
      return 2;
    }
  }
#if AD_BENCH_CUDA
  try {
    return run(reps, quick);
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
#else
  (void)reps, (void)quick;
  std::printf("bench_cuda: this build has no CUDA backend (configure with -DAD_CUDA=ON); nothing measured\n");
  return 0;
#endif
}
