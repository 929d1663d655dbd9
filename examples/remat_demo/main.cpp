// Rematerialisation at a glance: the same 32-layer tanh MLP (width 256, batch
// 64) trained for a few SGD steps under each policy, one table row per policy:
// memory (predicted = measured peak, bytes kept), what it cost (recomputed
// nodes, extra flops, step time against keep_all), and the loss after the
// steps, which is the same to the bit under every policy. Each Policy object
// is made once and reused by every step: its plan cache makes the first step
// plan and the later ones look the plan up. At the end, ad::explain shows what
// sqrt_n does to each node of a 4-layer net.
//
//   ./remat_demo [--steps N] [--seed S]     (N from 2 to 10000, default 6)
#include <ad/ad.hpp>

#include <algorithm>
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

constexpr std::int64_t kIn = 16, kWidth = 256, kOut = 4, kBatch = 64;
// every step's batch is made up front (5 KiB each) and trained under 8 policies
constexpr std::int64_t kMaxSteps = 10000;

// A regression task made here: y = sin(x A) for a fixed random teacher A [kIn, kOut].
struct Batch {
  ad::Tensor x;  // [kBatch, kIn] f32
  ad::Tensor y;  // [kBatch, kOut] f32
};
std::vector<Batch> make_batches(int n, ad::Rng& rng) {
  ad::Tensor a = ad::Tensor::randn({kIn, kOut}, rng, ad::DType::f32, 0.0, 1.0 / std::sqrt(double(kIn)));
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    Batch b{ad::Tensor::randn({kBatch, kIn}, rng), ad::Tensor::empty({kBatch, kOut})};
    const float* x = b.x.data<float>();
    const float* av = a.data<float>();
    float* y = b.y.data<float>();
    for (std::int64_t r = 0; r < kBatch; ++r)
      for (std::int64_t c = 0; c < kOut; ++c) {
        double s = 0;
        for (std::int64_t k = 0; k < kIn; ++k) s += double(x[r * kIn + k]) * double(av[k * kOut + c]);
        y[r * kOut + c] = static_cast<float>(std::sin(s));
      }
    out.push_back(std::move(b));
  }
  return out;
}

struct Mlp {
  std::vector<ad::Parameter> w, b;
  Mlp(int layers, std::int64_t in, std::int64_t width, std::int64_t out, std::uint64_t seed) {
    ad::Rng rng(seed);
    for (int i = 0; i < layers; ++i) {
      std::int64_t fi = i == 0 ? in : width, fo = i + 1 == layers ? out : width;
      // LeCun initialisation keeps tanh activations in range over many layers
      w.push_back(ad::Parameter::randn({fi, fo}, rng, 1.0 / std::sqrt(double(fi)), ad::DType::f32, fmt::format("w{}", i)));
      b.push_back(ad::Parameter::zeros({fo}, ad::DType::f32, fmt::format("b{}", i)));
    }
  }
  std::vector<ad::Parameter> params() const {
    std::vector<ad::Parameter> ps;
    for (std::size_t i = 0; i < w.size(); ++i) { ps.push_back(w[i]); ps.push_back(b[i]); }
    return ps;
  }
  // checkpoint_every > 0 marks every k-th hidden activation with ad::checkpoint (for policy::manual)
  ad::Var forward(ad::Var h, int checkpoint_every = 0) const {
    for (std::size_t i = 0; i < w.size(); ++i) {
      h = ad::add(ad::matmul(h, w[i]), b[i]);  // [N, in] x [in, out] + [out]
      if (i + 1 < w.size()) {
        h = ad::tanh(h);
        if (checkpoint_every > 0 && (i + 1) % static_cast<std::size_t>(checkpoint_every) == 0) h = ad::checkpoint(h);
      }
    }
    return h;
  }
};

// p -= lr * grad; grads reset
void sgd(const std::vector<ad::Parameter>& ps, float lr) {
  for (const auto& p : ps) {
    float* v = p.value().data<float>();
    const float* g = p.grad().data<float>();
    for (std::int64_t j = 0; j < p.value().numel(); ++j) v[j] -= lr * g[j];
    p.zero_grad();
  }
}

std::string bytes_str(std::int64_t b) {
  if (b >= (1 << 20)) return fmt::format("{:.2f} MiB", double(b) / double(1 << 20));
  return fmt::format("{:.1f} KiB", double(b) / 1024.0);
}

struct Row {
  std::string policy, error;
  ad::Report last;            // report of the last step
  double first_plan_ms = 0;   // planning time of step 1 (uncached)
  double later_plan_ms = 0;   // largest planning time of steps 2.. (cache lookups)
  bool later_cached = true;   // every step after the first found its plan in the cache
  double step_ms = 0;         // median over steps 2..
  float loss = 0;             // loss of the last step
  std::vector<ad::Tensor> params;
};

// Trains a fresh copy of the model (same seed, same batches) under `pol`.
Row train(const std::string& label, const ad::Policy& pol, int checkpoint_every, const std::vector<Batch>& data,
          int layers, std::uint64_t seed) {
  Row r;
  r.policy = label;
  Mlp model(layers, kIn, kWidth, kOut, seed);
  auto ps = model.params();
  std::vector<double> times;
  try {
    for (std::size_t s = 0; s < data.size(); ++s) {
      auto t0 = std::chrono::steady_clock::now();
      ad::Graph g;
      ad::Var loss = ad::mse(model.forward(g.input(data[s].x), checkpoint_every), g.input(data[s].y));
      ad::Report rep = ad::backward(loss, pol);  // the same Policy object every step
      sgd(ps, 0.02f);
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (rep.measured_peak_bytes != rep.predicted_peak_bytes)
        fmt::print(stderr, "{}: predicted peak {} B but measured {} B\n", label, rep.predicted_peak_bytes,
                   rep.measured_peak_bytes);
      if (s == 0) r.first_plan_ms = rep.plan_ms;
      else {
        r.later_plan_ms = std::max(r.later_plan_ms, rep.plan_ms);
        r.later_cached = r.later_cached && rep.plan_cached;
      }
      r.loss = static_cast<float>(loss.value().item());
      r.last = rep;
    }
  } catch (const ad::Error& e) {
    r.error = e.what();
    return r;
  }
  std::vector<double> later(times.begin() + 1, times.end());
  if (later.empty()) later = times;
  std::nth_element(later.begin(), later.begin() + static_cast<std::ptrdiff_t>(later.size() / 2), later.end());
  r.step_ms = later[later.size() / 2];
  for (const auto& p : ps) r.params.push_back(p.value());
  return r;
}

bool same_bits(const Row& a, const Row& b) {
  if (a.params.size() != b.params.size() || std::memcmp(&a.loss, &b.loss, sizeof a.loss) != 0) return false;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    if (!ad::bitwise_equal(a.params[i], b.params[i])) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 6;
  std::uint64_t seed = 11;
  std::string trace_path, dot_path;
  try {
    for (int i = 1; i < argc; ++i) {
      if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)  // step 1 plans, steps 2.. are timed
        steps = static_cast<int>(args::flag_whole(argv[i], argv[i + 1], 2, kMaxSteps)), ++i;
      else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = args::flag_seed(argv[i], argv[i + 1]), ++i;
      else if (!std::strcmp(argv[i], "--trace") && i + 1 < argc) trace_path = argv[++i];
      else if (!std::strcmp(argv[i], "--dot") && i + 1 < argc) dot_path = argv[++i];
      else {
        std::fprintf(stderr, "usage: %s [--steps N] [--seed S] [--trace step.trace.json] [--dot plan.dot]\n", argv[0]);
        return 2;
      }
    }
  } catch (const ad::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    constexpr int kLayers = 32;
    ad::Rng rng(seed);
    auto data = make_batches(steps, rng);
    fmt::print("ad {} — {}-layer tanh MLP {}-{}x{}-{}, batch {}, regression y = sin(x A); {} SGD steps per policy\n\n",
               ad::kVersionString, kLayers, kIn, kWidth, kLayers - 1, kOut, kBatch, steps);

    std::vector<Row> rows;
    rows.push_back(train("keep_all", ad::policy::keep_all(), 0, data, kLayers, seed));
    if (!rows[0].error.empty()) throw ad::Error(rows[0].error);
    const std::int64_t top = rows[0].last.measured_peak_bytes;
    struct Run { std::string label; ad::Policy pol; int checkpoint_every; };
    std::vector<Run> runs = {
        {"sqrt_n", ad::policy::sqrt_n(), 0},
        {"uniform(4)", ad::policy::uniform(4), 0},
        {"selective(save_matmuls)", ad::policy::selective(ad::save_matmuls), 0},
        {"manual (ad::checkpoint every 8th layer)", ad::policy::manual(), 8},
        {fmt::format("budget(50% = {})", bytes_str(top / 2)), ad::policy::budget(top / 2), 0},
        {fmt::format("budget(25% = {})", bytes_str(top / 4)), ad::policy::budget(top / 4), 0},
        {"optimal_chain(8)", ad::policy::optimal_chain(8), 0},
    };
    for (const auto& run : runs) rows.push_back(train(run.label, run.pol, run.checkpoint_every, data, kLayers, seed));

    const Row& base = rows[0];
    fmt::print("| policy | predicted peak | measured peak | kept | recomputed nodes | extra flops | step time | "
               "planning: step 1 / steps 2+ | loss after {} steps |\n", steps);
    fmt::print("|---|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows) {
      if (!r.error.empty()) {
        fmt::print("| {} | — | — | — | — | — | — | — | infeasible: {} |\n", r.policy, r.error);
        continue;
      }
      const ad::Report& p = r.last;
      std::string plan = fmt::format("{:.2f} ms / {}", r.first_plan_ms,
                                     r.later_cached ? fmt::format("cached ({:.2f} ms)", r.later_plan_ms)
                                                    : fmt::format("replanned ({:.2f} ms)", r.later_plan_ms));
      if (r.policy == "keep_all") plan = fmt::format("{:.2f} ms / {:.2f} ms (no cache: planning is trivial)",
                                                     r.first_plan_ms, r.later_plan_ms);
      fmt::print("| {} | {} | {} | {} | {} | {:.3g} | {:.2f}x | {} | {:.9f}{} |\n", r.policy,
                 bytes_str(p.predicted_peak_bytes), bytes_str(p.measured_peak_bytes), bytes_str(p.kept_bytes),
                 p.recomputed_nodes, p.recompute_flops, r.step_ms / base.step_ms, plan, r.loss,
                 same_bits(r, base) ? " (bit-identical)" : " (DIFFERS from keep_all)");
    }
    fmt::print("\nkeep_all step: {:.2f} ms (median of steps 2..{}). Extra flops are the cost model's count for the\n"
               "recomputed forward nodes of one step; a step computes every node at least once.\n"
               "\"bit-identical\": the loss and every parameter after the last step equal keep_all's to the bit.\n",
               base.step_ms, steps);

    // ---- what sqrt_n does to each node of a small net ----
    Mlp small(4, kIn, 32, kOut, seed);
    ad::Graph g;
    ad::Var loss = ad::mse(small.forward(g.input(data[0].x)), g.input(data[0].y));
    ad::Plan plan = ad::plan_backward(loss, ad::policy::sqrt_n());
    std::string text = ad::explain(plan);
    constexpr int kMaxLines = 26;
    int lines = 0;
    std::size_t cut = 0;
    for (; cut < text.size() && lines < kMaxLines; ++cut)
      if (text[cut] == '\n') ++lines;
    std::size_t total = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
    fmt::print("\nad::explain of a 4-layer MLP ({}-32x3-{}) under sqrt_n:\n\n{}", kIn, kOut, text.substr(0, cut));
    if (cut < text.size()) fmt::print("| … | ({} more rows) | | | | | |\n", total - static_cast<std::size_t>(lines));
    // ---- the memory timeline of one step and the plan as a picture ----
    if (!trace_path.empty()) {
      ad::Trace trace;
      g.record(&trace);
      ad::Report rep = ad::backward(loss, ad::policy::sqrt_n());
      g.record(nullptr);
      trace.save(trace_path);
      fmt::print("\nwrote {}: {} events of one sqrt_n step (peak {}); open it in Perfetto or chrome://tracing\n",
                 trace_path, trace.events().size(), bytes_str(rep.measured_peak_bytes));
    }
    if (!dot_path.empty()) {
      std::string dot = ad::to_dot(g, plan);
      std::FILE* f = std::fopen(dot_path.c_str(), "w");
      if (!f || std::fwrite(dot.data(), 1, dot.size(), f) != dot.size()) throw ad::Error("cannot write " + dot_path);
      std::fclose(f);
      fmt::print("wrote {}: the sqrt_n plan as Graphviz (dot -Tsvg {} -o plan.svg)\n", dot_path, dot_path);
    }
    bool all_same = true;
    for (const Row& r : rows) all_same = all_same && (!r.error.empty() || same_bits(r, base));
    return all_same ? 0 : 1;
  } catch (const std::exception& e) {
    return args::report_error(e);
  }
}
