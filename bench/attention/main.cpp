// bench_attention: the attention op (tiled, O(N d) memory) against the same
// attention composed from core ops (matmul, softmax, matmul: N x N scores).
//   1. peak bytes of forward + backward for N from 1K to 32K (d = 64, H = 8,
//      B = 1, causal, f32): predicted by the planner for every N, measured
//      where the run is allowed (N <= --run-max); the composed version under
//      policy::budget(--cap-mib), run where a schedule fits (and N <= --run-max),
//      "over budget" where none does;
//   2. CPU throughput of forward and backward (f32), FLOPs counted as
//      4 B H N^2 d forward (half for causal) and 2.5x that for backward, as
//      a fraction of cblas_sgemm throughput (2048^3) measured in the same run,
//      right before each row.
//
//   3. --gpu (only this part): the CUDA kernels' TFLOP/s at N = 4096, d in
//      {64, 128}, causal and not, f32 and bf16, same FLOP counts, next to
//      cuBLAS's f32 GEMM rate (4096^3) measured in the same run.
//
//   bench_attention [--json] [--quick] [--threads T] [--run-max N] [--n-max N] [--cap-mib M]
//                   [--only memory|speed] [--n N] [--no-composed] [--gpu]
#include <cblas.h>

#include <ad/ad.hpp>
#include "../cli.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#if AD_BENCH_CUDA
#include "../gpu_time.hpp"
#include "cuda/launch.hpp"
#include "ops/attention_cpu.hpp"
#endif

extern "C" void openblas_set_num_threads(int);

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  bool json = false, quick = false;
  int threads = 0;  // OpenBLAS threads for the sgemm reference; 0: hardware threads
  std::int64_t run_max = 32768, n_max = 32768, cap_mib = 4096;
  std::string only;      // "", "memory", "speed"
  std::int64_t n = 0;    // speed: this N only (0: 1024, 2048, 4096)
  bool composed = true;  // speed: also time the composed version (N <= 2048)
  bool gpu = false;      // --gpu: only the CUDA kernels' throughput
  bool run(const char* part) const { return only.empty() || only == part; }
};

constexpr std::int64_t kB = 1, kH = 8, kD = 64;

// One step's graph: q, k, v parameters [B, H, N, d], loss = sum(attention(q, k, v) * w).
struct Step {
  ad::Graph g;
  ad::Parameter q, k, v;
  ad::Var out, loss;
};
void build(Step& s, std::int64_t n, bool causal, bool composed, std::uint64_t seed) {
  ad::Rng rng(seed);
  s.q = ad::Parameter::randn({kB, kH, n, kD}, rng);
  s.k = ad::Parameter::randn({kB, kH, n, kD}, rng);
  s.v = ad::Parameter::randn({kB, kH, n, kD}, rng);
  ad::Var q = s.g.param(s.q), k = s.g.param(s.k), v = s.g.param(s.v);
  if (composed) {
    ad::Var sc = ad::mul_scalar(ad::matmul(q, k, false, true), 1.0 / std::sqrt(double(kD)));  // [B,H,N,N]
    if (causal) {
      ad::Tensor m = ad::Tensor::zeros({1, 1, n, n});
      float* p = m.data<float>();
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = i + 1; j < n; ++j) p[i * n + j] = -INFINITY;
      sc = ad::add(sc, s.g.input(m));
    }
    s.out = ad::matmul(ad::softmax(sc, -1), v);
  } else {
    ad::AttentionOptions o;
    o.causal = causal;
    s.out = ad::attention(q, k, v, o);
  }
  s.loss = ad::sum(ad::mul(s.out, s.g.input(ad::Tensor::randn(s.out.shape(), rng))));
}

std::string mib(double bytes) { return fmt::format("{:.1f}", bytes / (1 << 20)); }

// ---- 1. memory ----
struct MemRow {
  std::int64_t n;
  std::int64_t fused_pred = 0, fused_meas = -1;  // -1: not run
  std::int64_t comp_pred = 0, comp_meas = -1;
  std::string comp_status;                       // "ran", "over budget (needs >= X MiB)", "not run (N > run-max)"
};
MemRow memory_row(std::int64_t n, const Options& o) {
  MemRow r;
  r.n = n;
  const bool run = n <= o.run_max;
  {
    Step s;
    build(s, n, true, false, 1);
    r.fused_pred = ad::plan_backward(s.loss, ad::policy::keep_all()).schedule.predicted_peak_bytes;
    if (run) {
      ad::Report rep = ad::backward(s.loss, ad::policy::keep_all());
      r.fused_meas = rep.measured_peak_bytes;
    }
  }
  {
    Step s;
    build(s, n, true, true, 1);
    r.comp_pred = ad::plan_backward(s.loss, ad::policy::keep_all()).schedule.predicted_peak_bytes;
    const std::int64_t cap = o.cap_mib << 20;
    ad::Policy pol = ad::policy::budget(cap);
    try {
      ad::Plan p = ad::plan_backward(s.loss, pol);
      if (!run) {
        r.comp_status = fmt::format("fits ({} MiB), not run: N > run-max", mib(double(p.schedule.predicted_peak_bytes)));
      } else {
        ad::Report rep = ad::backward(s.loss, pol);
        r.comp_meas = rep.measured_peak_bytes;
        r.comp_status = "ran";
      }
    } catch (const ad::BudgetError& e) {
      r.comp_status = fmt::format("over budget (plans from {} MiB)", mib(double(e.least_peak)));
    }
  }
  return r;
}

// ---- 2. throughput ----
double sgemm_gflops(int samples) {
  const int n = 2048;
  ad::Rng rng(3);
  ad::Tensor a = ad::Tensor::randn({n, n}, rng), b = ad::Tensor::randn({n, n}, rng), c = ad::Tensor::empty({n, n});
  auto once = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                c.data<float>(), n);
  };
  once();
  std::vector<double> v;
  for (int s = 0; s < samples; ++s) {
    auto t = Clock::now();
    once();
    v.push_back(ms_since(t));
  }
  return 2.0 * n * double(n) * n / (median(v) * 1e6);
}

struct SpeedRow {
  std::int64_t n;
  bool causal;
  bool composed;
  double fwd_ms = 0, step_ms = 0;  // forward alone; forward + backward
  double fwd_gflop = 0, bwd_gflop = 0;
  double ref = 0;  // sgemm GFLOP/s measured right before this row (the load on a shared machine drifts)
};
SpeedRow speed_row(std::int64_t n, bool causal, bool composed, int samples) {
  SpeedRow r{n, causal, composed};
  r.ref = sgemm_gflops(5);
  r.fwd_gflop = 4.0 * kB * kH * double(n) * double(n) * kD * (causal ? 0.5 : 1.0) * 1e-9;
  r.bwd_gflop = 2.5 * r.fwd_gflop;
  std::vector<double> f, t;
  for (int s = 0; s < samples + 1; ++s) {  // the first run warms up
    {
      Step st;
      build(st, n, causal, composed, 7);
      auto t0 = Clock::now();
      ad::eval(st.out);
      if (s) f.push_back(ms_since(t0));
    }
    {
      Step st;
      build(st, n, causal, composed, 7);
      auto t0 = Clock::now();
      ad::backward(st.loss, ad::policy::keep_all());
      if (s) t.push_back(ms_since(t0));
    }
  }
  r.fwd_ms = median(f);
  r.step_ms = median(t);
  return r;
}

// ---- --gpu ----
// Calls the launchers (cuda_k::attention_forward / _backward, no graph) on
// device 0; each time is the minimum over `reps` calls after a warm-up, timed
// on the host around ad::cuda::synchronize(). B H = 32 heads (B = 4, H = 8):
// 32 x 64 query tiles, enough blocks to fill an H100/H200.
int gpu_bench(int reps) {
#if AD_BENCH_CUDA
  if (!ad::cuda::available()) {
    std::printf("bench_attention --gpu: no GPU on this machine (ad::cuda::available() is false); nothing measured\n");
    return 0;
  }
  using i64 = std::int64_t;
  const ad::Device dev = ad::Device::cuda(0);
  ad::Rng rng(3);
  auto gpu_time = [&](const std::function<void()>& f) { return bench::gpu_time_min(reps, f); };
  const i64 G = 4096;
  ad::Tensor ga = ad::Tensor::randn({G, G}, rng).to(dev), gb = ad::Tensor::randn({G, G}, rng).to(dev),
             gc = ad::Tensor::zeros({G, G}).to(dev);
  const double t_gemm = gpu_time([&] {
    ad::cuda_k::gemm(ad::DType::f32, false, false, 1, G, G, G, ga.raw(), 0, gb.raw(), 0, gc.raw(), 0);
  });
  const double gemm_tflops = 2.0 * double(G) * double(G) * double(G) / t_gemm / 1e12;
  std::printf("## GPU attention (B=4, H=8, N=4096), kernels called directly\n\n");
  std::printf("cuBLAS f32 GEMM 4096^3: %.1f TFLOP/s (the f32 reference)\n\n", gemm_tflops);
  std::printf("| dtype | d | causal | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd / f32 GEMM | bwd / f32 GEMM |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  const i64 B = 4, H = 8, N = 4096;
  for (ad::DType t : {ad::DType::f32, ad::DType::bf16})
    for (i64 d : {i64{64}, i64{128}})
      for (bool causal : {false, true}) {
        ad::attn::Dims dm;
        dm.B = B; dm.H = H; dm.Hkv = H; dm.Nq = N; dm.Nk = N; dm.d = d; dm.causal = causal;
        dm.scale = 1.0 / std::sqrt(double(d));
        const i64 n = B * H * N * d, rows = B * H * N;
        auto in = [&] { return ad::Tensor::randn({n}, rng).to(t).to(dev); };
        ad::Tensor q = in(), k = in(), v = in(), dout = in(), o = in(), dq = in(), dk = in(), dv = in();
        ad::Tensor lse = ad::Tensor::zeros({rows}).to(dev), dlse = ad::Tensor::zeros({rows}).to(dev),
                   ws = ad::Tensor::zeros({rows}).to(dev);  // f32: the accumulate type of f32 and bf16
        const double t_f = gpu_time([&] {
          ad::cuda_k::attention_forward(t, dm, q.raw(), k.raw(), v.raw(), nullptr, o.raw(), lse.raw());
        });
        const double t_b = gpu_time([&] {
          ad::cuda_k::attention_backward(t, dm, q.raw(), k.raw(), v.raw(), o.raw(), lse.raw(), dout.raw(), dlse.raw(),
                                         nullptr, dq.raw(), dk.raw(), dv.raw(), ws.raw());
        });
        const double ff = 4.0 * double(B * H) * double(N) * double(N) * double(d) * (causal ? 0.5 : 1.0);
        const double fb = 2.5 * ff;
        std::printf("| %s | %lld | %s | %.2f | %.2f | %.1f | %.1f | %.0f %% | %.0f %% |\n", ad::dtype_name(t),
                    static_cast<long long>(d), causal ? "yes" : "no", t_f * 1e3, t_b * 1e3, ff / t_f / 1e12,
                    fb / t_b / 1e12, 100.0 * ff / t_f / 1e12 / gemm_tflops, 100.0 * fb / t_b / 1e12 / gemm_tflops);
      }
  std::printf("\nFLOPs: 4 B H N^2 d forward (half for causal), 2.5x that backward (the backward kernels do more: "
              "S and dP are recomputed in both of them).\n");
  return 0;
#else
  (void)reps;
  std::printf("bench_attention --gpu: this build has no CUDA backend (configure with -DAD_CUDA=ON); nothing measured\n");
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table row as it is measured, also into a pipe
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") o.json = true;
    else if (a == "--quick") o.quick = true;
    else if (a == "--threads" && i + 1 < argc) o.threads = bench_cli::whole_int(argc, argv, i, 0);
    else if (a == "--run-max" && i + 1 < argc) o.run_max = bench_cli::whole(argc, argv, i, 1);
    else if (a == "--n-max" && i + 1 < argc) o.n_max = bench_cli::whole(argc, argv, i, 1);
    else if (a == "--cap-mib" && i + 1 < argc) o.cap_mib = bench_cli::whole(argc, argv, i, 1);
    else if (a == "--only" && i + 1 < argc) o.only = argv[++i];
    else if (a == "--n" && i + 1 < argc) o.n = bench_cli::whole(argc, argv, i, 1);
    else if (a == "--no-composed") o.composed = false;
    else if (a == "--gpu") o.gpu = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--json] [--quick] [--threads T] [--run-max N] [--n-max N] [--cap-mib M]\n"
                   "       [--only memory|speed] [--n N] [--no-composed] [--gpu]\n", argv[0]);
      return 2;
    }
  }
  try {
    if (o.gpu) return gpu_bench(o.quick ? 3 : 10);
    unsigned hw = std::thread::hardware_concurrency();
    const int threads = o.threads > 0 ? o.threads : static_cast<int>(hw ? hw : 1);
    openblas_set_num_threads(threads);
    const int samples = o.quick ? 1 : 3;

    std::vector<MemRow> mem;
    if (o.run("memory"))
      for (std::int64_t n = 1024; n <= o.n_max; n *= 2) mem.push_back(memory_row(n, o));

    const double ref = sgemm_gflops(o.quick ? 3 : 7);
    std::vector<SpeedRow> speed;
    std::vector<std::int64_t> ns = o.quick ? std::vector<std::int64_t>{1024} : std::vector<std::int64_t>{1024, 2048, 4096};
    if (o.n > 0) ns = {o.n};
    if (o.run("speed"))
      for (bool causal : {false, true})
        for (std::int64_t n : ns) {
          if (n > o.run_max) continue;
          speed.push_back(speed_row(n, causal, false, samples));
          if (o.composed && n <= 2048) speed.push_back(speed_row(n, causal, true, samples));  // the same math, N x N
        }
    const double ref_after = sgemm_gflops(o.quick ? 3 : 7);  // the reference again: the machine stayed the same

    if (o.json) {
      std::string j = "{\n";
      j += fmt::format("  \"config\": {{\"B\": {}, \"H\": {}, \"d\": {}, \"dtype\": \"f32\", \"threads\": {}}},\n", kB,
                       kH, kD, threads);
      j += fmt::format("  \"sgemm_gflops\": [{:.2f}, {:.2f}],\n  \"memory\": [", ref, ref_after);
      for (std::size_t i = 0; i < mem.size(); ++i) {
        const auto& r = mem[i];
        j += fmt::format("{}\n    {{\"N\": {}, \"fused_predicted\": {}, \"fused_measured\": {}, \"composed_predicted\": "
                         "{}, \"composed_measured\": {}, \"composed_status\": \"{}\"}}",
                         i ? "," : "", r.n, r.fused_pred, r.fused_meas, r.comp_pred, r.comp_meas, r.comp_status);
      }
      j += "\n  ],\n  \"speed\": [";
      for (std::size_t i = 0; i < speed.size(); ++i) {
        const auto& r = speed[i];
        double bwd_ms = r.step_ms - r.fwd_ms;
        j += fmt::format("{}\n    {{\"N\": {}, \"causal\": {}, \"impl\": \"{}\", \"fwd_ms\": {:.3f}, \"step_ms\": {:.3f}, "
                         "\"fwd_gflops\": {:.2f}, \"bwd_gflops\": {:.2f}, \"step_gflops\": {:.2f}, \"sgemm_gflops\": {:.2f}}}",
                         i ? "," : "", r.n, r.causal, r.composed ? "composed" : "fused", r.fwd_ms, r.step_ms,
                         r.fwd_gflop / (r.fwd_ms * 1e-3), r.bwd_gflop / (bwd_ms * 1e-3),
                         (r.fwd_gflop + r.bwd_gflop) / (r.step_ms * 1e-3), r.ref);
      }
      j += "\n  ]\n}\n";
      fmt::print("{}", j);
      return 0;
    }

    if (!mem.empty()) {
      fmt::print("## Peak bytes of forward + backward (B={}, H={}, d={}, causal, f32)\n\n", kB, kH, kD);
      fmt::print("Composed = matmul, softmax, matmul with an N x N mask, under policy::budget({} MiB); measured only for "
                 "N <= {}.\n\n",
                 o.cap_mib, o.run_max);
      fmt::print("| N | attention op: predicted MiB | measured MiB | bytes / N | composed keep_all predicted MiB | "
                 "composed under budget | composed measured MiB | composed / op |\n|---|---|---|---|---|---|---|---|\n");
      for (const auto& r : mem)
        fmt::print("| {} | {} | {} | {} | {} | {} | {} | {:.1f} |\n", r.n, mib(double(r.fused_pred)),
                   r.fused_meas >= 0 ? mib(double(r.fused_meas)) : "not run", r.fused_pred / r.n, mib(double(r.comp_pred)),
                   r.comp_status, r.comp_meas >= 0 ? mib(double(r.comp_meas)) : "-",
                   double(r.comp_pred) / double(r.fused_pred));
    }
    if (!speed.empty()) {
      fmt::print("\n## CPU throughput (f32, B={}, H={}, d={}), {} threads\n\n", kB, kH, kD, threads);
      fmt::print("sgemm 2048^3 reference: {:.1f} GFLOP/s (before all rows), {:.1f} GFLOP/s (after); each row is "
                 "compared with an sgemm measured right before it\n\n",
                 ref, ref_after);
      fmt::print("| N | causal | impl | fwd ms | fwd+bwd ms | fwd GFLOP/s | bwd GFLOP/s | fwd+bwd GFLOP/s | sgemm GFLOP/s | "
                 "fwd+bwd / sgemm |\n|---|---|---|---|---|---|---|---|---|---|\n");
      for (const auto& r : speed) {
        double bwd_ms = r.step_ms - r.fwd_ms, total = (r.fwd_gflop + r.bwd_gflop) / (r.step_ms * 1e-3);
        fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.0f} % |\n", r.n,
                   r.causal ? "yes" : "no", r.composed ? "composed" : "attention op", r.fwd_ms, r.step_ms,
                   r.fwd_gflop / (r.fwd_ms * 1e-3), r.bwd_gflop / (bwd_ms * 1e-3), total, r.ref, 100.0 * total / r.ref);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
