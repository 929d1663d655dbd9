// bench/overhead — what ad costs beyond the arithmetic, measured in one run:
//   1. per-op overhead: a chain of small elementwise ops on f32[8], built,
//      planned, executed (forward, and forward+backward), µs per op;
//   2. MLP training steps (graph build + backward + plain SGD), ms per step;
//   3. the physical reference of the same run: cblas_sgemm GFLOP/s at the
//      MLPs' shapes and 1024^3, and each step's "GEMM floor" (its GEMMs alone);
//   4. LibTorch, when built with it: the same chain and MLPs, same threads.
//
//   bench_overhead [--threads N] [--json] [--quick] [--ops N] [--no-torch]
//                  [--only chain|mlp|gemm] [--profile relu|tanh [--steps N]]
//
// --profile runs only ad's training steps of one MLP (for perf/callgrind)
// and prints the median breakdown.
//
// --threads N: OpenBLAS threads for ad (and for LibTorch, which calls the
// same OpenBLAS), LibTorch intra-op threads N, inter-op 1. Every figure is a
// median over repetitions; ratios are taken between medians of this run.
#include <ad/ad.hpp>
#include "../cli.hpp"
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#ifdef AD_BENCH_HAVE_TORCH
#include "torch_mlp.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  double pos = q * static_cast<double>(v.size() - 1);
  auto lo = static_cast<std::size_t>(pos);
  std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

[[maybe_unused]] std::vector<float> to_floats(const ad::Tensor& t) {
  const float* p = t.data<float>();
  return {p, p + t.numel()};
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(line.find_first_not_of(' ', p + 1));
    }
  return "unknown";
}

// A number for JSON: finite, or null.
std::string jnum(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "null"; }
std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

struct Options {
  int threads = 1;
  bool json = false;
  bool quick = false;
  bool torch = true;
  int ops = 10000;
  std::string only;  // "", "chain", "mlp", "gemm"
  std::string profile;  // "", "relu", "tanh"
  int steps = 0;
  bool run(const char* section) const { return only.empty() || only == section; }
};

std::string omp_wait_policy() {
  const char* v = std::getenv("OMP_WAIT_POLICY");
  return v ? v : "unset";
}

bool have_torch() {
#ifdef AD_BENCH_HAVE_TORCH
  return true;
#else
  return false;
#endif
}

// ============================================================================
// 1. per-op overhead
// ============================================================================

// n ops cycling add(h, p), tanh(h), h * 0.5, h * x on f32[8], then sum.
// Values stay bounded (|h| < 2), so every op does ordinary arithmetic.
ad::Var build_chain(ad::Graph& g, const ad::Tensor& x, const ad::Parameter& p, int n) {
  ad::Var xv = g.input(x);
  ad::Var pv = g.param(p);
  ad::Var h = xv;
  for (int i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0: h = ad::add(h, pv); break;
      case 1: h = ad::tanh(h); break;
      case 2: h = ad::mul_scalar(h, 0.5); break;
      default: h = ad::mul(h, xv); break;
    }
  }
  return ad::sum(h);
}

struct ChainResult {
  int ops = 0;  // forward ops (chain + sum)
  int reps = 0;
  // forward: build, plan, execute, teardown (ms, medians)
  double f_build = 0, f_plan = 0, f_exec = 0, f_teardown = 0, f_total = 0;
  // forward + backward
  double b_build = 0, b_grad_plan = 0, b_exec = 0, b_teardown = 0, b_total = 0;
  std::int64_t joint_ops = 0;  // non-leaf nodes of the joint graph
  // LibTorch (eager: build and execute are one)
  double t_fwd = std::nan(""), t_bwd = std::nan("");
};

ChainResult bench_chain(const Options& o) {
  ChainResult r;
  const int n = o.ops;
  r.ops = n + 1;
  r.reps = o.quick ? 3 : 15;
  ad::Rng rng(11);
  ad::Tensor x = ad::Tensor::uniform({8}, rng, ad::DType::f32, 0.5, 1.0);
  ad::Parameter p(ad::Tensor::uniform({8}, rng, ad::DType::f32, -0.5, 0.5), "p");

  std::vector<double> fb, fp, fe, ft, fT, bb, bg, be, bt, bT, tf, tb;
  for (int rep = 0; rep < r.reps + 1; ++rep) {  // rep 0 is warm-up
    {
      auto t0 = Clock::now();
      auto g = std::make_unique<ad::Graph>();
      ad::Var loss = build_chain(*g, x, p, n);
      auto t1 = Clock::now();
      ad::Schedule s = ad::plan(g->impl(), {loss.id()}, {}, ad::policy::keep_all());
      auto t2 = Clock::now();
      ad::execute(g->impl(), s);
      auto t3 = Clock::now();
      if (!std::isfinite(loss.value().item())) throw ad::Error("chain: non-finite loss");
      auto t4 = Clock::now();
      g.reset();
      auto t5 = Clock::now();
      if (rep) {
        fb.push_back(ms_between(t0, t1));
        fp.push_back(ms_between(t1, t2));
        fe.push_back(ms_between(t2, t3));
        ft.push_back(ms_between(t4, t5));
        fT.push_back(ms_between(t0, t3) + ms_between(t4, t5));
      }
    }
    {
      auto t0 = Clock::now();
      auto g = std::make_unique<ad::Graph>();
      ad::Var loss = build_chain(*g, x, p, n);
      auto t1 = Clock::now();
      ad::Report rep_ = ad::backward(loss);
      auto t2 = Clock::now();
      std::int64_t nodes = g->num_nodes();
      g.reset();
      auto t3 = Clock::now();
      p.zero_grad();
      r.joint_ops = nodes - 2;  // minus the two leaves
      if (rep) {
        bb.push_back(ms_between(t0, t1));
        // backward's own split: autodiff + plan, then execute
        double bwd = ms_between(t1, t2);
        bg.push_back(bwd - rep_.run_ms);
        be.push_back(rep_.run_ms);
        bt.push_back(ms_between(t2, t3));
        bT.push_back(ms_between(t0, t3));
      }
    }
#ifdef AD_BENCH_HAVE_TORCH
    if (o.torch) {
      std::vector<float> xv = to_floats(x), pv = to_floats(p.value());
      double a = torch_bench::chain_forward_ms(xv, pv, n);
      double b = torch_bench::chain_backward_ms(xv, pv, n);
      if (rep) { tf.push_back(a); tb.push_back(b); }
    }
#endif
  }
  r.f_build = median(fb); r.f_plan = median(fp); r.f_exec = median(fe); r.f_teardown = median(ft); r.f_total = median(fT);
  r.b_build = median(bb); r.b_grad_plan = median(bg); r.b_exec = median(be); r.b_teardown = median(bt);
  r.b_total = median(bT);
  if (!tf.empty()) { r.t_fwd = median(tf); r.t_bwd = median(tb); }
  return r;
}

// ============================================================================
// 3. GEMM reference
// ============================================================================

struct Gemm {
  int m, n, k;
  bool ta, tb;
  double flops() const { return 2.0 * m * n * k; }
  std::string op() const { return fmt::format("{}{}", ta ? 'T' : 'N', tb ? 'T' : 'N'); }
};

// Buffers for one call, as ad's matmul lays them out (row-major).
struct GemmBufs {
  ad::Tensor a, b, c;
};
GemmBufs gemm_bufs(const Gemm& g, ad::Rng& rng) {
  return {ad::Tensor::randn({g.m, g.k}, rng), ad::Tensor::randn({g.k, g.n}, rng), ad::Tensor::empty({g.m, g.n})};
}
// Exactly the call src/ops/linalg.cpp makes for matmul(a, b, ta, tb).
void run_gemm(const Gemm& g, GemmBufs& b) {
  int lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
  cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.0f,
              b.a.data<float>(), lda, b.b.data<float>(), ldb, 0.0f, b.c.data<float>(), g.n);
}

// Median ms of one pass over `calls`, back to back (each sample lasts >= ~2 ms).
double time_gemms(const std::vector<Gemm>& calls, int samples) {
  ad::Rng rng(5);
  std::vector<GemmBufs> bufs;
  double flops = 0;
  for (const auto& c : calls) { bufs.push_back(gemm_bufs(c, rng)); flops += c.flops(); }
  auto pass = [&] { for (std::size_t i = 0; i < calls.size(); ++i) run_gemm(calls[i], bufs[i]); };
  auto t0 = Clock::now();
  pass();
  pass();
  double one = std::max(1e-4, ms_since(t0) / 2);
  int inner = std::max(1, static_cast<int>(2.0 / one));
  std::vector<double> v;
  for (int s = 0; s < samples; ++s) {
    auto t = Clock::now();
    for (int i = 0; i < inner; ++i) pass();
    v.push_back(ms_since(t) / inner);
  }
  return median(v);
}

struct GemmRow {
  Gemm g;
  std::string what;
  double ms = 0;
  double gflops() const { return g.flops() / (ms * 1e6); }
};

// ============================================================================
// 2. MLP training steps
// ============================================================================

struct MlpConfig {
  std::string name;
  std::vector<std::int64_t> sizes;
  bool tanh = false;
  std::int64_t batch = 64;
  int rounds = 10, steps_per_round = 20;
};

// GEMMs of one training step as ad issues them: per layer [in -> out],
// forward x W (NN), dW = x^T dY (TN), dX = dY W^T (NT; not for layer 0,
// whose input needs no gradient).
std::vector<Gemm> step_gemms(const MlpConfig& c) {
  std::vector<Gemm> v;
  int B = static_cast<int>(c.batch);
  for (std::size_t l = 0; l + 1 < c.sizes.size(); ++l) {
    int in = static_cast<int>(c.sizes[l]), out = static_cast<int>(c.sizes[l + 1]);
    v.push_back({B, out, in, false, false});
    v.push_back({in, out, B, true, false});
    if (l > 0) v.push_back({B, in, out, false, true});
  }
  return v;
}

struct AdMlp {
  std::vector<ad::Parameter> w, b, params;
  bool tanh = false;
};

AdMlp make_ad_mlp(const MlpConfig& c, ad::Rng& rng) {
  AdMlp m;
  m.tanh = c.tanh;
  for (std::size_t l = 0; l + 1 < c.sizes.size(); ++l) {
    // He for relu, LeCun for tanh; small random biases
    double stddev = std::sqrt((c.tanh ? 1.0 : 2.0) / static_cast<double>(c.sizes[l]));
    m.w.push_back(ad::Parameter::randn({c.sizes[l], c.sizes[l + 1]}, rng, stddev, ad::DType::f32, fmt::format("w{}", l)));
    m.b.push_back(ad::Parameter(ad::Tensor::uniform({c.sizes[l + 1]}, rng, ad::DType::f32, -0.01, 0.01),
                                fmt::format("b{}", l)));
    m.params.push_back(m.w.back());
    m.params.push_back(m.b.back());
  }
  return m;
}

struct StepTimes {
  double build = 0, grad_plan = 0, exec = 0, sgd = 0, teardown = 0, total = 0;
};

// One training step: build the graph, backward (forward + backward, grads
// accumulated into the Parameters), SGD p -= lr g with raw loops, zero_grad.
StepTimes ad_step(AdMlp& m, const ad::Tensor& x, const ad::Tensor& y, float lr, double* loss_out) {
  StepTimes st;
  auto t0 = Clock::now();
  auto g = std::make_unique<ad::Graph>();
  ad::Var h = g->input(x);
  for (std::size_t l = 0; l < m.w.size(); ++l) {
    h = ad::add(ad::matmul(h, m.w[l]), m.b[l]);  // [B, in] x [in, out] + [out]
    if (l + 1 < m.w.size()) h = m.tanh ? ad::tanh(h) : ad::relu(h);
  }
  ad::Var loss = ad::cross_entropy(h, g->input(y));
  auto t1 = Clock::now();
  ad::Report r = ad::backward(loss);
  auto t2 = Clock::now();
  if (loss_out) *loss_out = loss.value().item();
  auto t3 = Clock::now();
  for (const auto& p : m.params) {
    float* v = p.value().data<float>();
    const float* gr = p.grad().data<float>();
    std::int64_t n = p.value().numel();
    for (std::int64_t j = 0; j < n; ++j) v[j] -= lr * gr[j];
    p.zero_grad();
  }
  auto t4 = Clock::now();
  g.reset();
  auto t5 = Clock::now();
  st.build = ms_between(t0, t1);
  st.exec = r.run_ms;
  st.grad_plan = ms_between(t1, t2) - r.run_ms;
  st.sgd = ms_between(t3, t4);
  st.teardown = ms_between(t4, t5);
  st.total = ms_between(t0, t2) + ms_between(t3, t5);
  return st;
}

struct MlpResult {
  MlpConfig cfg;
  std::int64_t params = 0;
  int steps = 0;
  double gemm_gflop = 0;   // GEMM flops of one step
  double gemm_floor = 0;   // ms: the step's GEMMs alone, back to back
  StepTimes ad;            // medians
  double ad_p10 = 0, ad_p90 = 0;
  double ad_loss0 = 0;
  double torch_ms = std::nan(""), torch_p10 = std::nan(""), torch_p90 = std::nan(""), torch_loss0 = std::nan("");
  double torch_fwd = std::nan(""), torch_bwd = std::nan(""), torch_upd = std::nan("");  // medians of the parts
};

MlpResult bench_mlp(const MlpConfig& cfg, const Options& o) {
  MlpResult res;
  res.cfg = cfg;
  ad::Rng rng(42);
  AdMlp m = make_ad_mlp(cfg, rng);
  for (const auto& p : m.params) res.params += p.value().numel();
  const float lr = 0.01f;
  const int nbatches = 4;
  std::vector<ad::Tensor> xs, ys;
  for (int i = 0; i < nbatches; ++i) {
    xs.push_back(ad::Tensor::randn({cfg.batch, cfg.sizes.front()}, rng));
    ys.push_back(ad::Tensor::randint({cfg.batch}, rng, cfg.sizes.back()));
  }
  for (const auto& gm : step_gemms(cfg)) res.gemm_gflop += gm.flops() * 1e-9;

#ifdef AD_BENCH_HAVE_TORCH
  std::unique_ptr<torch_bench::Mlp> tm;
  if (o.torch) {  // same initial weights and data as ad
    torch_bench::MlpSpec s;
    s.sizes = cfg.sizes;
    s.tanh = cfg.tanh;
    s.batch = cfg.batch;
    s.lr = lr;
    for (std::size_t l = 0; l < m.w.size(); ++l) {
      s.w.push_back(to_floats(m.w[l].value()));
      s.b.push_back(to_floats(m.b[l].value()));
    }
    for (int i = 0; i < nbatches; ++i) {
      s.x.push_back(to_floats(xs[static_cast<std::size_t>(i)]));
      const std::int64_t* yp = ys[static_cast<std::size_t>(i)].data<std::int64_t>();
      s.y.emplace_back(yp, yp + cfg.batch);
    }
    tm = std::make_unique<torch_bench::Mlp>(s);
  }
#endif

  // first step of each: the same loss from the same weights and batch
  ad_step(m, xs[0], ys[0], lr, &res.ad_loss0);
#ifdef AD_BENCH_HAVE_TORCH
  if (tm) res.torch_loss0 = tm->step(0, true);
#endif
  int rounds = o.quick ? 2 : cfg.rounds, per = o.quick ? std::max(2, cfg.steps_per_round / 4) : cfg.steps_per_round;
  int warm = o.quick ? 2 : 10;
  std::size_t it = 1;
  for (int i = 0; i < warm; ++i, ++it) {
    ad_step(m, xs[it % nbatches], ys[it % nbatches], lr, nullptr);
#ifdef AD_BENCH_HAVE_TORCH
    if (tm) tm->step(it);
#endif
  }
  // interleaved rounds, so a change in machine load hits both sides alike
  std::vector<StepTimes> ad_t;
  std::vector<double> torch_t, torch_f, torch_b, torch_u;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < per; ++i, ++it) ad_t.push_back(ad_step(m, xs[it % nbatches], ys[it % nbatches], lr, nullptr));
#ifdef AD_BENCH_HAVE_TORCH
    if (tm)
      for (int i = 0; i < per; ++i, ++it) {
        auto t0 = Clock::now();
        tm->step(it);
        torch_t.push_back(ms_since(t0));
        auto parts = tm->last_parts();
        torch_f.push_back(parts.forward);
        torch_b.push_back(parts.backward);
        torch_u.push_back(parts.update);
      }
#endif
  }
  res.steps = static_cast<int>(ad_t.size());
  auto col = [&](double StepTimes::*f) {
    std::vector<double> v;
    for (const auto& s : ad_t) v.push_back(s.*f);
    return v;
  };
  res.ad.build = median(col(&StepTimes::build));
  res.ad.grad_plan = median(col(&StepTimes::grad_plan));
  res.ad.exec = median(col(&StepTimes::exec));
  res.ad.sgd = median(col(&StepTimes::sgd));
  res.ad.teardown = median(col(&StepTimes::teardown));
  res.ad.total = median(col(&StepTimes::total));
  res.ad_p10 = quantile(col(&StepTimes::total), 0.1);
  res.ad_p90 = quantile(col(&StepTimes::total), 0.9);
  if (!torch_t.empty()) {
    res.torch_ms = median(torch_t);
    res.torch_p10 = quantile(torch_t, 0.1);
    res.torch_p90 = quantile(torch_t, 0.9);
    res.torch_fwd = median(torch_f);
    res.torch_bwd = median(torch_b);
    res.torch_upd = median(torch_u);
  }
  res.gemm_floor = time_gemms(step_gemms(cfg), o.quick ? 5 : 21);
  return res;
}

MlpConfig relu_mlp() { return {"784-256-256-10 relu", {784, 256, 256, 10}, false, 64, 10, 20}; }
MlpConfig tanh_mlp() {
  std::vector<std::int64_t> sizes(16, 512);  // 16 linear layers: 15 x [512 -> 512], [512 -> 10]
  sizes.push_back(10);
  return {"16 x 512 tanh (512-...-512-10)", sizes, true, 64, 10, 6};
}

// ad's steps only, for a profiler.
int profile_mlp(const Options& o) {
  if (o.profile != "relu" && o.profile != "tanh") throw ad::Error("--profile: relu or tanh");
  MlpConfig cfg = o.profile == "relu" ? relu_mlp() : tanh_mlp();
  int steps = o.steps > 0 ? o.steps : (o.profile == "relu" ? 500 : 60);
  ad::Rng rng(42);
  AdMlp m = make_ad_mlp(cfg, rng);
  ad::Tensor x = ad::Tensor::randn({cfg.batch, cfg.sizes.front()}, rng);
  ad::Tensor y = ad::Tensor::randint({cfg.batch}, rng, cfg.sizes.back());
  std::vector<StepTimes> t;
  for (int i = 0; i < steps; ++i) t.push_back(ad_step(m, x, y, 0.01f, nullptr));
  auto col = [&](double StepTimes::*f) {
    std::vector<double> v;
    for (const auto& s : t) v.push_back(s.*f);
    return median(v);
  };
  fmt::print("{}: {} steps, median ms: total {:.3f} = build {:.3f} + autodiff/plan {:.3f} + execute {:.3f} + sgd {:.3f} + "
             "teardown {:.3f}\n",
             cfg.name, steps, col(&StepTimes::total), col(&StepTimes::build), col(&StepTimes::grad_plan),
             col(&StepTimes::exec), col(&StepTimes::sgd), col(&StepTimes::teardown));
  return 0;
}

// ============================================================================
// output
// ============================================================================

std::string ratio(double a, double b) { return std::isfinite(a) && std::isfinite(b) && b > 0 ? fmt::format("{:.2f}", a / b) : "—"; }
std::string num(double v, const char* f = "{:.3f}") { return std::isfinite(v) ? fmt::format(fmt::runtime(f), v) : "—"; }

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each table row as it is measured, also into a pipe
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) o.threads = bench_cli::whole_int(argc, argv, i, 1);
    else if (a == "--ops" && i + 1 < argc) o.ops = bench_cli::whole_int(argc, argv, i, 4);
    else if (a == "--only" && i + 1 < argc) o.only = argv[++i];
    else if (a == "--profile" && i + 1 < argc) o.profile = argv[++i];
    else if (a == "--steps" && i + 1 < argc) o.steps = bench_cli::whole_int(argc, argv, i, 1);
    else if (a == "--json") o.json = true;
    else if (a == "--quick") o.quick = true;
    else if (a == "--no-torch") o.torch = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--json] [--quick] [--ops N] [--no-torch] [--only chain|mlp|gemm]\n"
                   "       [--profile relu|tanh [--steps N]]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.threads < 1 || o.ops < 4) { std::fprintf(stderr, "--threads >= 1, --ops >= 4\n"); return 2; }
  if (!have_torch()) o.torch = false;
  try {
    openblas_set_num_threads(o.threads);
    std::string torch_ver = "not built in (AD_BENCH_TORCH=OFF, or CMake did not find LibTorch)";
    int torch_threads = 0;
#ifdef AD_BENCH_HAVE_TORCH
    if (o.torch) {
      torch_bench::set_threads(o.threads);
      torch_ver = torch_bench::version();
      torch_threads = torch_bench::intra_op_threads();
    } else {
      torch_ver = "disabled (--no-torch)";
    }
#endif
    const std::string cpu = cpu_model();
    const unsigned cores = std::thread::hardware_concurrency();
    const std::string blas = fmt::format("{} ({}, {} threads)", openblas_get_config(), openblas_get_corename(),
                                         openblas_get_num_threads());

    if (!o.profile.empty()) return profile_mlp(o);

    std::optional<ChainResult> chain;
    if (o.run("chain")) chain = bench_chain(o);

    std::vector<MlpResult> mlps;
    if (o.run("mlp")) {
      mlps.push_back(bench_mlp(relu_mlp(), o));
      mlps.push_back(bench_mlp(tanh_mlp(), o));
    }

    std::vector<GemmRow> gemms;
    if (o.run("gemm") || o.run("mlp")) {
      std::vector<std::pair<Gemm, std::string>> list = {
          {{64, 256, 784, false, false}, "784-256 layer, forward"},
          {{784, 256, 64, true, false}, "784-256 layer, dW = x^T dY"},
          {{64, 256, 256, false, false}, "256-256 layer, forward"},
          {{64, 512, 512, false, false}, "512-512 layer, forward"},
          {{512, 512, 64, true, false}, "512-512 layer, dW = x^T dY"},
          {{64, 512, 512, false, true}, "512-512 layer, dX = dY W^T"},
          {{1024, 1024, 1024, false, false}, "large square"},
      };
      for (auto& [g, what] : list) gemms.push_back({g, what, time_gemms({g}, o.quick ? 5 : 21)});
    }
    double big_gflops = gemms.empty() ? std::nan("") : gemms.back().gflops();

    if (o.json) {
      std::string j = "{\n";
      j += fmt::format("  \"ad_version\": {},\n  \"cpu\": {},\n  \"cores\": {},\n  \"threads\": {},\n", jstr(ad::kVersionString),
                       jstr(cpu), cores, o.threads);
      j += fmt::format("  \"openblas\": {},\n  \"libtorch\": {},\n  \"libtorch_threads\": {},\n  \"omp_wait_policy\": {},\n",
                       jstr(blas), jstr(torch_ver), torch_threads, jstr(omp_wait_policy()));
      if (chain) {
        const auto& c = *chain;
        double us = 1000.0 / c.ops;
        j += fmt::format(
            "  \"chain\": {{\"ops\": {}, \"joint_ops\": {}, \"reps\": {}, \"forward_ms\": {{\"build\": {}, \"plan\": {}, "
            "\"execute\": {}, \"teardown\": {}, \"total\": {}}}, \"forward_us_per_op\": {}, "
            "\"build_plus_eval_us_per_op\": {}, \"backward_ms\": {{\"build\": {}, \"autodiff_plan\": {}, \"execute\": {}, "
            "\"teardown\": {}, \"total\": {}}}, \"backward_us_per_joint_op\": {}, \"backward_us_per_forward_op\": {}, "
            "\"libtorch_forward_us_per_op\": {}, \"libtorch_backward_us_per_forward_op\": {}}},\n",
            c.ops, c.joint_ops, c.reps, jnum(c.f_build), jnum(c.f_plan), jnum(c.f_exec), jnum(c.f_teardown),
            jnum(c.f_total), jnum(c.f_total * us), jnum((c.f_build + c.f_plan + c.f_exec) * us), jnum(c.b_build),
            jnum(c.b_grad_plan), jnum(c.b_exec), jnum(c.b_teardown), jnum(c.b_total),
            jnum(c.b_total * 1000.0 / static_cast<double>(c.joint_ops)), jnum(c.b_total * us), jnum(c.t_fwd * us),
            jnum(c.t_bwd * us));
      }
      j += "  \"mlp\": [";
      for (std::size_t i = 0; i < mlps.size(); ++i) {
        const auto& r = mlps[i];
        j += fmt::format(
            "{}\n    {{\"model\": {}, \"batch\": {}, \"params\": {}, \"steps\": {}, \"gemm_gflop_per_step\": {}, "
            "\"gemm_floor_ms\": {}, \"ad_step_ms\": {}, \"ad_p10_ms\": {}, \"ad_p90_ms\": {}, \"ad_build_ms\": {}, "
            "\"ad_autodiff_plan_ms\": {}, \"ad_execute_ms\": {}, \"ad_sgd_ms\": {}, \"ad_teardown_ms\": {}, "
            "\"ad_gemm_fraction\": {}, \"libtorch_step_ms\": {}, \"libtorch_p10_ms\": {}, \"libtorch_p90_ms\": {}, "
            "\"libtorch_gemm_fraction\": {}, \"ad_over_libtorch\": {}, \"libtorch_forward_ms\": {}, "
            "\"libtorch_backward_ms\": {}, \"libtorch_sgd_ms\": {}, \"ad_loss0\": {}, \"libtorch_loss0\": {}}}",
            i ? "," : "", jstr(r.cfg.name), r.cfg.batch, r.params, r.steps, jnum(r.gemm_gflop), jnum(r.gemm_floor),
            jnum(r.ad.total), jnum(r.ad_p10), jnum(r.ad_p90), jnum(r.ad.build), jnum(r.ad.grad_plan), jnum(r.ad.exec),
            jnum(r.ad.sgd), jnum(r.ad.teardown), jnum(r.gemm_floor / r.ad.total), jnum(r.torch_ms),
            jnum(r.torch_p10), jnum(r.torch_p90), jnum(r.gemm_floor / r.torch_ms), jnum(r.ad.total / r.torch_ms),
            jnum(r.torch_fwd), jnum(r.torch_bwd), jnum(r.torch_upd), jnum(r.ad_loss0), jnum(r.torch_loss0));
      }
      j += mlps.empty() ? "],\n" : "\n  ],\n";
      j += "  \"gemm\": [";
      for (std::size_t i = 0; i < gemms.size(); ++i) {
        const auto& g = gemms[i];
        j += fmt::format("{}\n    {{\"m\": {}, \"n\": {}, \"k\": {}, \"op\": {}, \"what\": {}, \"ms\": {}, \"gflops\": {}}}",
                         i ? "," : "", g.g.m, g.g.n, g.g.k, jstr(g.g.op()), jstr(g.what), jnum(g.ms), jnum(g.gflops()));
      }
      j += gemms.empty() ? "]\n" : "\n  ]\n";
      j += "}\n";
      std::fputs(j.c_str(), stdout);
      return 0;
    }

    fmt::print("# bench/overhead — ad {}\n\n", ad::kVersionString);
    fmt::print("- machine: {}, {} hardware threads; run with --threads {}\n", cpu, cores, o.threads);
    fmt::print("- BLAS: {}\n", blas);
    fmt::print("- LibTorch: {}{}\n", torch_ver, torch_threads ? fmt::format(" (intra-op threads {}, inter-op 1)", torch_threads) : "");
    if (o.torch && o.threads > 1)
      fmt::print("- OMP_WAIT_POLICY={} (LibTorch's OpenMP workers; unset = spin, which starves OpenBLAS's threads when "
                 "threads = cores)\n", omp_wait_policy());
    fmt::print("- all figures are medians over repetitions of this run\n\n");

    if (chain) {
      const auto& c = *chain;
      double us = 1000.0 / c.ops;
      fmt::print("## Per-op overhead: chain of {} small ops on f32[8] (median of {} runs)\n\n", c.ops, c.reps);
      fmt::print("Ops cycle add(h, p), tanh(h), h * 0.5, h * x, then sum; LibTorch runs the same chain eagerly.\n\n");
      fmt::print("| forward only | ms | µs / op | LibTorch µs / op | ad / LibTorch |\n|---|---:|---:|---:|---:|\n");
      fmt::print("| build (make_node, shape inference) | {} | {} | | |\n", num(c.f_build), num(c.f_build * us));
      fmt::print("| plan (keep_all) | {} | {} | | |\n", num(c.f_plan), num(c.f_plan * us));
      fmt::print("| execute (kernels, allocation, frees) | {} | {} | | |\n", num(c.f_exec), num(c.f_exec * us));
      fmt::print("| **build + eval** | {} | **{}** | | |\n", num(c.f_build + c.f_plan + c.f_exec),
                 num((c.f_build + c.f_plan + c.f_exec) * us));
      fmt::print("| graph teardown | {} | {} | | |\n", num(c.f_teardown), num(c.f_teardown * us));
      fmt::print("| **all of it** | {} | **{}** | {} | {} |\n\n", num(c.f_total), num(c.f_total * us), num(c.t_fwd * us),
                 ratio(c.f_total, c.t_fwd));
      double uj = 1000.0 / static_cast<double>(c.joint_ops);
      fmt::print("| forward + backward (joint graph: {} op nodes) | ms | µs / joint node | µs / forward op | LibTorch µs / forward op | ad / LibTorch |\n",
                 c.joint_ops);
      fmt::print("|---|---:|---:|---:|---:|---:|\n");
      fmt::print("| build forward | {} | {} | {} | | |\n", num(c.b_build), num(c.b_build * uj), num(c.b_build * us));
      fmt::print("| backward: autodiff (gradient nodes) + plan | {} | {} | {} | | |\n", num(c.b_grad_plan),
                 num(c.b_grad_plan * uj), num(c.b_grad_plan * us));
      fmt::print("| backward: execute | {} | {} | {} | | |\n", num(c.b_exec), num(c.b_exec * uj), num(c.b_exec * us));
      fmt::print("| graph teardown | {} | {} | {} | | |\n", num(c.b_teardown), num(c.b_teardown * uj),
                 num(c.b_teardown * us));
      fmt::print("| **all of it** | {} | **{}** | {} | {} | {} |\n\n", num(c.b_total), num(c.b_total * uj),
                 num(c.b_total * us), num(c.t_bwd * us), ratio(c.b_total, c.t_bwd));
    }

    if (!mlps.empty()) {
      fmt::print("## MLP training step (batch 64, f32): build + backward + SGD + zero_grad\n\n");
      fmt::print("| model | params | ad ms/step [p10, p90] | LibTorch ms/step [p10, p90] | ad / LibTorch | GEMM GFLOP/step | GEMM floor ms | ad GEMM share | LibTorch GEMM share | ad GFLOP/s | ad GFLOP/s / sgemm 1024³ |\n");
      fmt::print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
      for (const auto& r : mlps) {
        double achieved = r.gemm_gflop / (r.ad.total * 1e-3);
        fmt::print("| {} | {} | {} [{}, {}] | {} [{}, {}] | {} | {:.4f} | {} | {:.0f}% | {} | {:.1f} | {:.0f}% |\n",
                   r.cfg.name, r.params, num(r.ad.total), num(r.ad_p10), num(r.ad_p90), num(r.torch_ms),
                   num(r.torch_p10), num(r.torch_p90), ratio(r.ad.total, r.torch_ms), r.gemm_gflop, num(r.gemm_floor),
                   100.0 * r.gemm_floor / r.ad.total,
                   std::isfinite(r.torch_ms) ? fmt::format("{:.0f}%", 100.0 * r.gemm_floor / r.torch_ms) : "—",
                   achieved, 100.0 * achieved / big_gflops);
      }
      fmt::print("\nGEMM floor: the step's own GEMMs (forward, dW, dX; {} calls for the first model) run back to back "
                 "with cblas_sgemm; GEMM share = floor / step time.\n\n",
                 step_gemms(mlps.front().cfg).size());
      fmt::print("Step parts, ms (medians of each part separately):\n\n");
      fmt::print("| model | ad build | ad autodiff + plan | ad execute (fwd + bwd) | ad SGD + zero_grad | ad teardown | "
                 "LibTorch forward | LibTorch backward | LibTorch SGD + zero | first-step loss ad / LibTorch |\n");
      fmt::print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
      for (const auto& r : mlps)
        fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.6f} / {} |\n", r.cfg.name, num(r.ad.build),
                   num(r.ad.grad_plan), num(r.ad.exec), num(r.ad.sgd), num(r.ad.teardown), num(r.torch_fwd),
                   num(r.torch_bwd), num(r.torch_upd), r.ad_loss0, num(r.torch_loss0, "{:.6f}"));
      fmt::print("\n");
    }

    if (!gemms.empty()) {
      fmt::print("## cblas_sgemm reference (row-major, as ad's matmul calls it)\n\n");
      fmt::print("| M | N | K | op | what | ms | GFLOP/s |\n|---:|---:|---:|---|---|---:|---:|\n");
      for (const auto& g : gemms)
        fmt::print("| {} | {} | {} | {} | {} | {:.4f} | {:.1f} |\n", g.g.m, g.g.n, g.g.k, g.g.op(), g.what, g.ms, g.gflops());
      fmt::print("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
