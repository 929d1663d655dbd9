// bench/semiseparable — the semiseparable matvec y = (T + U V^T) x against N,
// measured in one run against the machine's own limits:
//   1. time vs N (2^12 .. 2^22 by default) at fixed r and D, forward (full
//      and causal) and backward (all gradients); the fitted exponent of
//      time ~ N^p (target p <= 1.05);
//   2. effective bandwidth (the bytes the op must move at least: x read, y
//      written, T, U, V read; backward: x and dy read, dx written) against a
//      memory-copy rate measured in the same run with the same threads
//      (target >= 60 %);
//   3. the dense matvec H X (cblas_sgemm) where H fits (N <= --dense-max);
//   4. the graph op through ad::eval (allocates its output each call);
//   5. --accuracy: the error that bf16/f16 storage of U and V adds, and the
//      HODLR accuracy-versus-rank table (see docs/benchmarks.md).
//
//   6. --gpu: the matvec's CUDA kernels (full and causal) at N = 2^max-log2
//      (default 2^22), r = 22 unless --r is given: effective bandwidth against
//      a device-to-device copy of x measured in the same run; prints a "no
//      GPU" line and exits 0 where there is none (or the build has no CUDA).
//
//   bench_semiseparable [--json] [--r R] [--d D] [--b B] [--min-log2 a]
//                       [--max-log2 b] [--dense-max N] [--reps k] [--sweeps s] [--accuracy] [--gpu] [--gpu-profile]
//
// Each cell is the minimum over `reps` interleaved rounds; --sweeps s runs the
// whole N range s times and keeps each cell's minimum (a shared host's load
// comes in phases of tens of seconds).
#include <ad/ad.hpp>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../cli.hpp"
#include "../gpu_time.hpp"
#include "ops/parallel.hpp"
#include "ops/semiseparable_cpu.hpp"
#if AD_BENCH_CUDA
#include <cuda_runtime.h>

#include "cuda/launch.hpp"
#include "cuda/semisep_plan.hpp"
#endif

namespace {
using Clock = std::chrono::steady_clock;
using i64 = std::int64_t;

double seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }
// Best (minimum) time of f over at least `reps` calls and at least ~0.3 s:
// the host is shared, so the minimum is the least disturbed figure.
template <class F> double time_it(F&& f, int reps) {
  f();  // warm (first touch)
  std::vector<double> t;
  auto start = Clock::now();
  while (static_cast<int>(t.size()) < reps || (seconds(start) < 0.3 && t.size() < 50)) {
    auto a = Clock::now();
    f();
    t.push_back(seconds(a));
  }
  return *std::min_element(t.begin(), t.end());
}
// Minimum time of each function over `reps` interleaved rounds (at least ~0.5 s in all).
std::vector<double> time_rounds(const std::vector<std::function<void()>>& fns, int reps) {
  for (const auto& f : fns) f();  // warm (first touch)
  std::vector<double> best(fns.size(), INFINITY);
  auto start = Clock::now();
  for (int k = 0; k < reps || (seconds(start) < 0.5 && k < 50); ++k)
    for (std::size_t i = 0; i < fns.size(); ++i) {
      auto a = Clock::now();
      fns[i]();
      best[i] = std::min(best[i], seconds(a));
    }
  return best;
}
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}
// Buffers start on a 64-byte line, as the engine's allocator gives its
// tensors (glibc's large allocations start 16 bytes past one).
template <class T> struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U> Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <class U> bool operator==(const Aligned64<U>&) const { return true; }
};
using fvec = std::vector<float, Aligned64<float>>;
fvec randn(i64 n, ad::Rng& rng, double sd = 1.0) {
  ad::Tensor t = ad::Tensor::randn({n}, rng, ad::DType::f32, 0, sd);
  return {t.data<float>(), t.data<float>() + n};
}
// Parallel copy of n floats with the kernels' thread count: the memory-copy reference.
void copy_par(const float* src, float* dst, i64 n) {
  int t = ad::parallel::max_threads();
  ad::parallel::parallel_for(t, 1e9, [&](i64 w) {
    i64 lo = n * w / t, hi = n * (w + 1) / t;
    std::memcpy(dst + lo, src + lo, static_cast<std::size_t>(hi - lo) * sizeof(float));
  });
}
// Least-squares slope of log t against log N.
double fit_exponent(const std::vector<double>& n, const std::vector<double>& t) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0, k = static_cast<double>(n.size());
  for (std::size_t i = 0; i < n.size(); ++i) {
    double x = std::log(n[i]), y = std::log(t[i]);
    sx += x; sy += y; sxx += x * x; sxy += x * y;
  }
  return (k * sxy - sx * sy) / (k * sxx - sx * sx);
}

struct Row {
  i64 n;
  double fwd, causal, bwd, bwd_causal, graph, copy, dense;  // seconds (dense: NaN where not run)
  double bytes_fwd, bytes_bwd;
};

int accuracy_tables(bool json);
int gpu_bench(i64 N, i64 r, i64 D, i64 B, int reps);
}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table row as it is measured, also into a pipe
  bool json = false, accuracy = false, gpu = false, r_given = false;
  i64 r = 16, D = 16, B = 1, lo2 = 12, hi2 = 22, dense_max = 8192;
  int reps = 5, sweeps = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto num = [&](i64 lo, i64 hi) { return bench_cli::whole(argc, argv, i, lo, hi); };
    if (a == "--json") json = true;
    else if (a == "--accuracy") accuracy = true;
    else if (a == "--gpu") gpu = true;
    else if (a == "--gpu-profile") gpu = true, reps = -1;  // each kernel set once, for a profiler
    else if (a == "--r") { r = num(1, 4096); r_given = true; }
    else if (a == "--d") D = num(1, 4096);
    else if (a == "--b") B = num(1, 1 << 20);
    else if (a == "--min-log2") lo2 = num(1, 30);
    else if (a == "--max-log2") hi2 = num(1, 30);
    else if (a == "--dense-max") dense_max = num(0, 1 << 20);
    else if (a == "--reps") reps = static_cast<int>(num(1, 1 << 20));
    else if (a == "--sweeps") sweeps = static_cast<int>(num(1, 1 << 20));
    else {
      std::fprintf(stderr,
                   "usage: %s [--json] [--r R] [--d D] [--b B] [--min-log2 a] [--max-log2 b] [--dense-max N]\n"
                   "       [--reps k] [--sweeps s] [--accuracy] [--gpu] [--gpu-profile]\n",
                   argv[0]);
      return 2;
    }
  }
  if (accuracy) return accuracy_tables(json);
  if (gpu) return gpu_bench(i64{1} << hi2, r_given ? r : 22, D, B, reps);
  if (lo2 > hi2) {
    std::fprintf(stderr, "--min-log2 %lld is above --max-log2 %lld: no N to run\n", static_cast<long long>(lo2),
                 static_cast<long long>(hi2));
    return 2;
  }
  ad::Rng rng(1);
  std::vector<Row> rows;
  for (int sweep = 0; sweep < sweeps; ++sweep)
  for (i64 l2 = lo2; l2 <= hi2; ++l2) {
    const i64 N = i64{1} << l2, nx = B * N * D;
    fvec x = randn(nx, rng), dy = randn(nx, rng), y(static_cast<std::size_t>(nx)),
                       dx(static_cast<std::size_t>(nx));
    fvec d = randn(N, rng), up = randn(N - 1, rng), lo = randn(N - 1, rng);
    fvec u = randn(N * r, rng, 1.0 / std::sqrt(static_cast<double>(r))),
                       v = randn(N * r, rng, 1.0 / std::sqrt(static_cast<double>(N)));
    fvec gd(static_cast<std::size_t>(N)), gu(static_cast<std::size_t>(N)), gl(static_cast<std::size_t>(N)),
        gU(static_cast<std::size_t>(N * r)), gV(static_cast<std::size_t>(N * r));
    ad::semisep::Dims dm = ad::semisep::make_dims(B, N, D, r, 0);
    std::vector<char> ws(ad::semisep::matvec_backward_ws_bytes(dm, sizeof(float)));
    // W = V^T x as the graph's semiseparable_sums node hands it to the full
    // backward (the forward timed below forms it itself: the op's two nodes)
    fvec vtx(static_cast<std::size_t>(B * r * D));
    ad::semisep::sums<float, float>(dm, x.data(), v.data(), vtx.data(), ws.data());
    Row row{};
    row.n = N;
    ad::semisep::MatvecGrads<float> g{dx.data(), gd.data(), gu.data(), gl.data(), gU.data(), gV.data()};
    ad::Tensor tx = ad::Tensor::from(std::span<const float>(x), {B, N, D});
    ad::Tensor td = ad::Tensor::from(std::span<const float>(d), {N});
    ad::Tensor tu = ad::Tensor::from(std::span<const float>(up), {N - 1});
    ad::Tensor tl = ad::Tensor::from(std::span<const float>(lo), {N - 1});
    ad::Tensor tU = ad::Tensor::from(std::span<const float>(u), {N, r});
    ad::Tensor tV = ad::Tensor::from(std::span<const float>(v), {N, r});
    // all six measured in interleaved rounds (the host is shared: a burst of
    // load then hits every figure of a round, not one of them)
    std::vector<std::function<void()>> fns = {
        [&] { copy_par(x.data(), y.data(), nx); },
        [&] { ad::semisep::matvec<float, float>(dm, false, x.data(), d.data(), up.data(), lo.data(), u.data(), v.data(), nullptr, y.data(), ws.data()); },
        [&] { ad::semisep::matvec<float, float>(dm, true, x.data(), d.data(), up.data(), lo.data(), u.data(), v.data(), nullptr, y.data(), ws.data()); },
        [&] { ad::semisep::matvec_backward<float, float>(dm, false, x.data(), d.data(), up.data(), lo.data(), u.data(), v.data(), vtx.data(), dy.data(), g, ws.data()); },
        [&] { ad::semisep::matvec_backward<float, float>(dm, true, x.data(), d.data(), up.data(), lo.data(), u.data(), v.data(), nullptr, dy.data(), g, ws.data()); },
        [&] {  // the graph op: build + eval (allocates y every call)
          ad::Graph gr;
          (void)ad::eval(ad::semiseparable_matvec(gr.input(tx), gr.input(td), gr.input(tu), gr.input(tl), gr.input(tU), gr.input(tV)));
        }};
    std::vector<double> best = time_rounds(fns, reps);
    row.copy = best[0]; row.fwd = best[1]; row.causal = best[2]; row.bwd = best[3]; row.bwd_causal = best[4]; row.graph = best[5];
    // minimum traffic (f32): forward x + y + T + U + V; backward x + dy + dx + T + U + V + their gradients
    double small = 4.0 * static_cast<double>(3 * N + 2 * N * r);
    row.bytes_fwd = 8.0 * static_cast<double>(nx) + small;
    row.bytes_bwd = 12.0 * static_cast<double>(nx) + 2 * small;
    row.dense = std::nan("");
    if (N <= dense_max) {
      fvec h(static_cast<std::size_t>(N * N));
      for (i64 i = 0; i < N; ++i)
        for (i64 j = 0; j < N; ++j) {
          float a = 0;
          for (i64 k = 0; k < r; ++k) a += u[static_cast<std::size_t>(i * r + k)] * v[static_cast<std::size_t>(j * r + k)];
          h[static_cast<std::size_t>(i * N + j)] = a;
        }
      row.dense = time_it([&] {
        for (i64 b = 0; b < B; ++b)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(N), static_cast<int>(D),
                      static_cast<int>(N), 1.0f, h.data(), static_cast<int>(N), x.data() + b * N * D,
                      static_cast<int>(D), 0.0f, y.data() + b * N * D, static_cast<int>(D));
      }, reps);
    }
    if (sweep == 0) {
      rows.push_back(row);
    } else {  // keep the least disturbed figure of each cell over the sweeps
      Row& w = rows[static_cast<std::size_t>(l2 - lo2)];
      for (auto [a, b] : {std::pair{&w.fwd, row.fwd}, {&w.causal, row.causal}, {&w.bwd, row.bwd},
                          {&w.bwd_causal, row.bwd_causal}, {&w.graph, row.graph}, {&w.copy, row.copy},
                          {&w.dense, row.dense}})
        *a = std::fmin(*a, b);
    }
    if (!json)
      std::fprintf(stderr, "sweep %d: N = 2^%lld done\n", sweep, static_cast<long long>(l2));
  }
  std::vector<double> ns, tf, tc, tb, tbc, tcp;
  for (const Row& w : rows) {
    ns.push_back(static_cast<double>(w.n));
    tf.push_back(w.fwd); tc.push_back(w.causal); tb.push_back(w.bwd); tbc.push_back(w.bwd_causal);
    tcp.push_back(w.copy);
  }
  double pf = fit_exponent(ns, tf), pc = fit_exponent(ns, tc), pb = fit_exponent(ns, tb), pbc = fit_exponent(ns, tbc);
  // the copy reference's own exponent: above 1 where the machine's bandwidth
  // drops once x leaves the cache (it moves x's bytes and nothing else)
  double pcp = fit_exponent(ns, tcp);
  // the same fit over the sizes whose x exceeds the last-level cache (>= 64 MiB of x): memory-bound throughout
  std::vector<double> ln, lf, lc, lb, lbc;
  for (const Row& w : rows)
    if (static_cast<double>(B * w.n * D) * 4.0 >= 64.0 * (1 << 20)) {
      ln.push_back(static_cast<double>(w.n));
      lf.push_back(w.fwd); lc.push_back(w.causal); lb.push_back(w.bwd); lbc.push_back(w.bwd_causal);
    }
  bool large = ln.size() >= 2;
  // (-1 when fewer than two sizes are out of cache)
  double qf = large ? fit_exponent(ln, lf) : -1, qc = large ? fit_exponent(ln, lc) : -1,
         qb = large ? fit_exponent(ln, lb) : -1, qbc = large ? fit_exponent(ln, lbc) : -1;
  auto gbs = [](double bytes, double s) { return bytes / s * 1e-9; };
  if (json) {
    std::printf("{\"cpu\": \"%s\", \"threads\": %d, \"r\": %lld, \"D\": %lld, \"B\": %lld,\n \"exponent\": {\"forward\": %.4f, "
                "\"causal\": %.4f, \"backward\": %.4f, \"backward_causal\": %.4f, \"copy\": %.4f, \"forward_out_of_cache\": %.4f, "
                "\"causal_out_of_cache\": %.4f, \"backward_out_of_cache\": %.4f, \"backward_causal_out_of_cache\": %.4f},\n \"rows\": [",
                cpu_model().c_str(), ad::parallel::max_threads(), static_cast<long long>(r),
                static_cast<long long>(D), static_cast<long long>(B), pf, pc, pb, pbc, pcp, qf, qc, qb, qbc);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& w = rows[i];
      std::printf("%s\n  {\"N\": %lld, \"forward_ms\": %.4f, \"causal_ms\": %.4f, \"backward_ms\": %.4f, "
                  "\"backward_causal_ms\": %.4f, \"graph_ms\": %.4f, \"copy_gbs\": %.3f, \"forward_gbs\": %.3f, "
                  "\"causal_gbs\": %.3f, \"backward_gbs\": %.3f, \"dense_ms\": %s}",
                  i ? "," : "", static_cast<long long>(w.n), w.fwd * 1e3, w.causal * 1e3, w.bwd * 1e3,
                  w.bwd_causal * 1e3, w.graph * 1e3, gbs(8.0 * static_cast<double>(B * w.n * D), w.copy),
                  gbs(w.bytes_fwd, w.fwd), gbs(w.bytes_fwd, w.causal), gbs(w.bytes_bwd, w.bwd),
                  std::isfinite(w.dense) ? fmt::format("{:.4f}", w.dense * 1e3).c_str() : "null");
    }
    std::printf("\n]}\n");
    return 0;
  }
  std::printf("semiseparable_matvec, f32, B = %lld, D = %lld, r = %lld, %d threads, %s\n\n",
              static_cast<long long>(B), static_cast<long long>(D), static_cast<long long>(r),
              ad::parallel::max_threads(), cpu_model().c_str());
  std::printf("| N | fwd ms | causal ms | bwd ms | bwd causal ms | graph fwd ms | copy GB/s | fwd GB/s (%% copy) | "
              "causal GB/s (%% copy) | bwd GB/s (%% copy) | dense sgemm ms | dense / fwd |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& w : rows) {
    double cp = gbs(8.0 * static_cast<double>(B * w.n * D), w.copy);
    double f = gbs(w.bytes_fwd, w.fwd), c = gbs(w.bytes_fwd, w.causal), b = gbs(w.bytes_bwd, w.bwd);
    std::printf("| 2^%d | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f (%.0f %%) | %.2f (%.0f %%) | %.2f (%.0f %%) | %s | %s |\n",
                static_cast<int>(std::lround(std::log2(static_cast<double>(w.n)))), w.fwd * 1e3, w.causal * 1e3,
                w.bwd * 1e3, w.bwd_causal * 1e3, w.graph * 1e3, cp, f, 100 * f / cp, c, 100 * c / cp, b,
                100 * b / cp, std::isfinite(w.dense) ? fmt::format("{:.3f}", w.dense * 1e3).c_str() : "-",
                std::isfinite(w.dense) ? fmt::format("{:.1f}", w.dense / w.fwd).c_str() : "-");
  }
  std::printf("\nfitted exponent of time ~ N^p over all N: forward %.3f, causal %.3f, backward %.3f, backward causal %.3f "
              "(target <= 1.05); the copy reference %.3f\n", pf, pc, pb, pbc, pcp);
  if (large)
    std::printf("over the N with x >= 64 MiB (out of cache): forward %.3f, causal %.3f, backward %.3f, backward causal %.3f\n",
                qf, qc, qb, qbc);
  return 0;
}

namespace {
// The accuracy tables: bf16/f16 storage of U, V; HODLR rank sweep.
int accuracy_tables(bool json) {
  ad::Rng rng(2);
  // (1) mixed precision: relative L2 error of y against f64 with exact U, V
  std::vector<std::string> lines;
  const i64 N = 4096, D = 16;
  for (i64 r : {4, 16, 64}) {
    ad::Tensor x = ad::Tensor::randn({1, N, D}, rng, ad::DType::f64), d = ad::Tensor::randn({N}, rng, ad::DType::f64),
               up = ad::Tensor::randn({N - 1}, rng, ad::DType::f64), lo = ad::Tensor::randn({N - 1}, rng, ad::DType::f64),
               u = ad::Tensor::randn({N, r}, rng, ad::DType::f64, 0, 1 / std::sqrt(static_cast<double>(r))),
               v = ad::Tensor::randn({N, r}, rng, ad::DType::f64, 0, 1 / std::sqrt(static_cast<double>(N)));
    for (bool causal : {false, true}) {
      ad::Graph g;
      auto f32 = [&](const ad::Tensor& t) { return g.input(t.to(ad::DType::f32)); };
      ad::Tensor ref = ad::eval(ad::semiseparable_matvec(g.input(x), g.input(d), g.input(up), g.input(lo),
                                                         g.input(u), g.input(v), causal));
      auto err = [&](ad::DType t) {
        ad::Var uu = t == ad::DType::f32 ? f32(u) : g.input(u.to(t)), vv = t == ad::DType::f32 ? f32(v) : g.input(v.to(t));
        ad::Tensor y = ad::eval(ad::semiseparable_matvec(f32(x), f32(d), f32(up), f32(lo), uu, vv, causal));
        auto a = y.to_vector(), b = ref.to_vector();
        double num = 0, den = 0;
        for (std::size_t i = 0; i < a.size(); ++i) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
        return std::sqrt(num / den);
      };
      lines.push_back(fmt::format("| {} | {} | {:.2e} | {:.2e} | {:.2e} |", r, causal ? "causal" : "full",
                                  err(ad::DType::f32), err(ad::DType::f16), err(ad::DType::bf16)));
    }
  }
  // (2) HODLR: H_ij = 1 / (1 + |t_i - t_j|) over sorted random points t in
  //     [0, N/8] (a smooth kernel; off-diagonal blocks numerically low rank)
  std::vector<std::string> hl;
  const i64 M = 2048;
  ad::Tensor pts = ad::Tensor::uniform({M}, rng, ad::DType::f64, 0, static_cast<double>(M) / 8);
  std::vector<double> p = pts.to_vector();
  std::sort(p.begin(), p.end());
  ad::Tensor h = ad::Tensor::empty({M, M}, ad::DType::f64);
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < M; ++j)
      h.data<double>()[i * M + j] = 1.0 / (1.0 + std::fabs(p[static_cast<std::size_t>(i)] - p[static_cast<std::size_t>(j)]));
  ad::Tensor xs = ad::Tensor::randn({M, 4}, rng, ad::DType::f64);
  std::vector<double> ref(static_cast<std::size_t>(M * 4), 0.0);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(M), 4, static_cast<int>(M), 1.0,
              h.data<double>(), static_cast<int>(M), xs.data<double>(), 4, 0.0, ref.data(), 4);
  for (i64 r : {1, 2, 4, 8, 16, 32}) {
    ad::Hodlr hm = ad::Hodlr::build(h, r, 64);
    ad::Tensor y = hm.matvec(xs);
    auto a = y.to_vector();
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) { num += (a[i] - ref[i]) * (a[i] - ref[i]); den += ref[i] * ref[i]; }
    auto t0 = Clock::now();
    for (int k = 0; k < 20; ++k) (void)hm.matvec(xs);
    double ms = seconds(t0) / 20 * 1e3;
    ad::SemiseparableFactors f = ad::semiseparable_factorize(h, r, 1);  // band removed + one truncated SVD
    hl.push_back(fmt::format("| {} | {:.2e} | {} | {:.3f} | {:.2e} |", r, std::sqrt(num / den), hm.stored_elements(),
                             ms, f.rel_error));
  }
  if (json) {
    std::printf("{\"mixed_precision\": [");
    for (std::size_t i = 0; i < lines.size(); ++i) std::printf("%s\"%s\"", i ? ", " : "", lines[i].c_str());
    std::printf("], \"hodlr\": [");
    for (std::size_t i = 0; i < hl.size(); ++i) std::printf("%s\"%s\"", i ? ", " : "", hl[i].c_str());
    std::printf("]}\n");
    return 0;
  }
  std::printf("Mixed precision: relative L2 error of y (f32 compute) against f64 with exact U, V; N = %lld, D = %lld\n\n",
              static_cast<long long>(N), static_cast<long long>(D));
  std::printf("| r | H | U, V f32 | U, V f16 | U, V bf16 |\n|---|---|---|---|---|\n");
  for (auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf("\nHODLR (leaf 64) of H_ij = 1/(1+|t_i-t_j|), N = %lld: relative L2 error of H x (4 columns), numbers "
              "stored (dense: %lld), matvec ms; and the single-level T + U V^T split (band removed, one truncated SVD): its relative error\n\n",
              static_cast<long long>(M), static_cast<long long>(M * M));
  std::printf("| rank | HODLR matvec rel. error | stored | matvec ms | T + U V^T rel. error (Frobenius) |\n|---|---|---|---|---|\n");
  for (auto& l : hl) std::printf("%s\n", l.c_str());
  return 0;
}
// ---- --gpu ----
// Times cuda_k::semisep_matvec (the op's launcher, no graph) on device 0 and a
// device-to-device copy of x (cudaMemcpy: x read, y written) in the same run; each is the minimum over `reps` timed calls after a warm-up,
// timed on the host around ad::cuda::synchronize().
int gpu_bench(i64 N, i64 r, i64 D, i64 B, int reps) {
#if AD_BENCH_CUDA
  if (!ad::cuda::available()) {
    std::printf("bench_semiseparable --gpu: no GPU on this machine (ad::cuda::available() is false); nothing measured\n");
    return 0;
  }
  const ad::Device dev = ad::Device::cuda(0);
  ad::Rng rng(1);
  const i64 nx = B * N * D;
  auto on_gpu = [&](i64 n, double sd) { return ad::Tensor::randn({n}, rng, ad::DType::f32, 0, sd).to(dev); };
  ad::Tensor x = on_gpu(nx, 1), y = on_gpu(nx, 1), d = on_gpu(N, 1), up = on_gpu(N - 1, 1), lo = on_gpu(N - 1, 1);
  ad::Tensor u = on_gpu(N * r, 1.0 / std::sqrt(static_cast<double>(r))),
             v = on_gpu(N * r, 1.0 / std::sqrt(static_cast<double>(N)));
  ad::semisep::Dims dm = ad::semisep::make_dims(B, N, D, r, 0);
  const i64 ws_elems = (std::max({static_cast<i64>(ad::semisep::matvec_ws_bytes(dm, sizeof(float))),
                                  ad::cuda_k::semisep_plan::staged_scan_ws_bytes(B, N, D, r)}) +
                        3) /
                       4;
  ad::Tensor ws = ad::Tensor::zeros({std::max<i64>(1, ws_elems)}).to(dev);
  const ad::cuda_k::SemisepDims gd{B, N, D, r, dm.L};
  auto gpu_time = [&](const std::function<void()>& f) { return bench::gpu_time_min(reps, f); };
  // variant 0: the op's kernels; 1: the first tiled kernels
  // upto: 1 the chunk sums only, 2 and their combination, 3 all (stage times by difference)
  auto matvec = [&](bool causal, int variant = 0, int upto = 3) {
    return [&, causal, variant, upto] {
      ad::cuda_k::semisep_matvec(ad::DType::f32, gd, causal, x.raw(), d.raw(), up.raw(), lo.raw(), u.raw(), v.raw(),
                                 y.raw(), ws.raw(), variant, upto);
    };
  };
  if (reps < 0) {  // --gpu-profile: variants 2 to 10 once each, full and causal
    for (int vi : {2, 3, 4, 5, 6, 7, 8, 9, 10})
      for (bool causal : {false, true}) matvec(causal, vi)();
    ad::cuda::synchronize();
    std::printf("bench_semiseparable --gpu-profile: ran variants 2 to 10 once each, full and causal\n");
    return 0;
  }
  const double t_copy = gpu_time([&] {
    if (cudaMemcpy(y.raw(), x.raw(), static_cast<std::size_t>(nx) * sizeof(float), cudaMemcpyDeviceToDevice) !=
        cudaSuccess)
      throw ad::Error("bench_semiseparable: cudaMemcpy failed");
  });
  // variants: 0 the op's default, 1 the first tiled kernels, 2 the warp-level ones, 3 the staged ones,
  // 4 the staged ones with bulk copies, 5 and 6 as 4 with the causal product in clusters of 8 and 4 chunks,
  // 7 to 10 as 4 with the causal product in rounds (of 32, 64, 16 and 32 chunks, lag 8, 4, 16 and 16),
  // 11 to 14 time parts of 7 (causal only; y is then not the product): without any walk, without A's
  // walk, without B's phase 1, without B's phase 2 (y written as zeros); 15 to 17 time parts of the
  // one-pass kernel: without walks, without the look-back (a zero prefix), with neither
  constexpr int kV = 18, kChecked = 11;
  const char* vname[kV] = {"", ", first tiled kernels", ", warp-level kernels", ", staged kernels",
                           ", staged kernels, bulk copies", ", clusters of 8 chunks", ", clusters of 4 chunks",
                           ", rounds of 32 chunks, lag 8", ", rounds of 64 chunks, lag 4",
                           ", rounds of 16 chunks, lag 16", ", rounds of 32 chunks, lag 16",
                           ", as lag 8 without walks (timing only)", ", as lag 8 without A's walk (timing only)",
                           ", as lag 8 without B's phase 1 (timing only)",
                           ", as lag 8 without B's phase 2 (timing only)",
                           ", one pass without walks (timing only)", ", one pass without look-back (timing only)",
                           ", one pass without walks or look-back (timing only)"};
  double t_full[kV], t_causal[kV];
  for (int vi = 0; vi < kV; ++vi) {
    t_full[vi] = vi < kChecked ? gpu_time(matvec(false, vi)) : 0.0;  // the timing-only ones: causal only
    t_causal[vi] = gpu_time(matvec(true, vi));
  }
  const double t_copy2 = gpu_time([&] {
    if (cudaMemcpy(y.raw(), x.raw(), static_cast<std::size_t>(nx) * sizeof(float), cudaMemcpyDeviceToDevice) !=
        cudaSuccess)
      throw ad::Error("bench_semiseparable: cudaMemcpy failed");
  });
  // Correct first: each variant's y (poisoned with NaN before the call) against the CPU kernel's y in f64
  // terms (largest |difference| over largest |y|), every element written.
  auto host = [](const ad::Tensor& t) { return t.to(ad::Device::cpu()).to_vector(); };
  const std::vector<double> hx = host(x), hd = host(d), hup = host(up), hlo = host(lo), hu = host(u), hv = host(v);
  auto as_f = [](const std::vector<double>& a) { return std::vector<float>(a.begin(), a.end()); };
  const std::vector<float> fx = as_f(hx), fd = as_f(hd), fup = as_f(hup), flo = as_f(hlo), fu = as_f(hu), fv = as_f(hv);
  std::vector<float> fy(static_cast<std::size_t>(nx));
  std::vector<unsigned char> fws(ad::semisep::matvec_ws_bytes(dm, sizeof(float)));
  auto check = [&](const char* name, bool causal, int variant) {
    ad::semisep::matvec<float, float>(dm, causal, fx.data(), fd.data(), fup.data(), flo.data(), fu.data(), fv.data(),
                                      nullptr, fy.data(), fws.data());
    if (cudaMemset(y.raw(), 0xff, static_cast<std::size_t>(nx) * sizeof(float)) != cudaSuccess)
      throw ad::Error("bench_semiseparable: cudaMemset failed");
    matvec(causal, variant)();
    const std::vector<double> gy = host(y);
    double worst = 0, scale = 0;
    std::int64_t unwritten = 0;
    for (std::size_t i = 0; i < gy.size(); ++i) {
      if (std::isnan(gy[i])) ++unwritten;
      else worst = std::max(worst, std::abs(gy[i] - static_cast<double>(fy[i])));
      scale = std::max(scale, std::abs(static_cast<double>(fy[i])));
    }
    std::printf("check %s: max |GPU - CPU| / max |y| = %.2e, NaN (unwritten) elements %lld\n", name, worst / scale,
                static_cast<long long>(unwritten));
  };
  for (int vi = 0; vi < kChecked; ++vi) {
    check(("matvec (full)" + std::string(vname[vi])).c_str(), false, vi);
    check(("matvec (causal)" + std::string(vname[vi])).c_str(), true, vi);
  }
  std::printf("\n");
  // stage times of the op's kernels, by difference
  std::printf("| stage (op's kernels) | full ms | causal ms |\n|---|---|---|\n");
  {
    double tf[4] = {0, 0, 0, 0}, tc[4] = {0, 0, 0, 0};
    for (int vi : {2, 3, 4}) {
      for (int k = 1; k <= 3; ++k) {
        tf[k] = gpu_time(matvec(false, vi, k));
        tc[k] = gpu_time(matvec(true, vi, k));
      }
      const char* names[4] = {"", "chunk sums (x, v read)", "combine the chunk sums", "rows (full) / scan (causal)"};
      for (int k = 1; k <= 3; ++k)
        std::printf("| %s%s | %.3f | %.3f |\n", names[k], vname[vi], (tf[k] - tf[k - 1]) * 1e3,
                    (tc[k] - tc[k - 1]) * 1e3);
    }
    std::printf("\n");
  }
  // the bytes the op must move at least: x read, y written, T, U, V read
  const double bytes = 4.0 * static_cast<double>(2 * nx + 3 * N + 2 * N * r), copy_bytes = 8.0 * static_cast<double>(nx);
  std::printf("GPU semiseparable_matvec, f32, B %lld, N %lld, D %lld, r %lld, chunk %lld rows\n\n",
              static_cast<long long>(B), static_cast<long long>(N), static_cast<long long>(D),
              static_cast<long long>(r), static_cast<long long>(dm.L));
  std::printf("| kernel | ms | GB/s | vs device copy |\n|---|---|---|---|\n");
  std::printf("| device-to-device copy of x | %.3f | %.1f | 1.00 |\n", t_copy * 1e3, copy_bytes / t_copy / 1e9);
  std::printf("| the same copy again, after the products | %.3f | %.1f | %.2f |\n", t_copy2 * 1e3,
              copy_bytes / t_copy2 / 1e9, t_copy / t_copy2);
  for (int causal = 0; causal < 2; ++causal)
    for (int vi = 0; vi < (causal ? kV : kChecked); ++vi) {
      const double t = causal ? t_causal[vi] : t_full[vi];
      std::printf("| matvec (%s)%s | %.3f | %.1f | %.2f |\n", causal ? "causal" : "full", vname[vi], t * 1e3,
                  bytes / t / 1e9, (bytes / t) / (copy_bytes / t_copy));
    }
  return 0;
#else
  (void)N, (void)r, (void)D, (void)B, (void)reps;
  std::printf("bench_semiseparable --gpu: this build has no CUDA backend (configure with -DAD_CUDA=ON); nothing "
              "measured\n");
  return 0;
#endif
}
}  // namespace
