// Trains a small decoder-only transformer (examples/train_lm/model.hpp:
// embeddings, pre-norm blocks with causal multi-head self-attention through
// ad::attention and a GELU MLP, final norm, LM head) on a synthetic
// algorithmic language made here:  BOS x1 .. xL SEP y1 .. yL  where y is x
// sorted (--task sort, the default) or reversed (--task reverse), x random
// digits (L = 12 by default). The loss is next-token cross-entropy on the y
// part. Held-out strings (a fixed hash class, never drawn for training) are
// decoded greedily at the end and scored by exact match. Exits 3 if a step's
// measured peak ever differs from the predicted one.
//
//   train_lm [--policy keep_all|manual|sqrt_n|uniform:K|selective|budget|optimal:S] [--budget MiB]
//            [--steps N] [--batch B] [--digits L] [--task reverse|sort] [--dim D] [--heads H]
//            [--kv-heads H] [--layers N] [--lr X] [--mixer attention] [--seed S] [--log-every N]
//
// policy: keep_all (no recomputation), manual (keep block outputs, marked with
// ad::checkpoint), sqrt_n, uniform:K (every K-th forward value), selective
// (keep matmul outputs), budget (the cheapest schedule within --budget MiB),
// optimal:S (Revolve with S slots; applies to chain graphs only, which a
// residual network is not: it reports ad::Error).
#include <ad/ad.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model.hpp"

namespace {

constexpr std::int64_t kBos = 10, kSep = 11, kVocab = 12;

struct Options {
  std::string policy = "keep_all", task = "sort";
  std::int64_t budget_mib = 0, steps = 500, batch = 64, digits = 12, log_every = 50, eval_n = 1000;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  lm::Config model;
};

// ---- the language ----
// Held-out strings: those whose mixed hash falls in class 0 of 8. Training
// never draws them.
bool held_out(const std::int64_t* x, std::int64_t n) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull;
  for (std::int64_t i = 0; i < n; ++i) h = (h ^ static_cast<std::uint64_t>(x[i])) * 0xBF58476D1CE4E5B9ull;
  return ((h ^ (h >> 29)) & 7) == 0;
}
void answer(const std::string& task, const std::int64_t* x, std::int64_t n, std::int64_t* y) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i];
  if (task == "sort") std::sort(y, y + n);
  else std::reverse(y, y + n);
}
// Full sequences [count, 2L + 2]: BOS x SEP y.
ad::Tensor make_sequences(const Options& o, std::int64_t count, bool want_held_out, ad::Rng& rng) {
  const std::int64_t L = o.digits, T = 2 * L + 2;
  std::vector<std::int64_t> seq(static_cast<std::size_t>(count * T));
  std::int64_t made = 0;
  while (made < count) {
    ad::Tensor d = ad::Tensor::randint({256, L}, rng, 10);
    const std::int64_t* dv = d.data<std::int64_t>();
    for (std::int64_t r = 0; r < 256 && made < count; ++r) {
      const std::int64_t* x = dv + r * L;
      if (held_out(x, L) != want_held_out) continue;
      std::int64_t* s = seq.data() + made * T;
      s[0] = kBos;
      std::copy(x, x + L, s + 1);
      s[L + 1] = kSep;
      answer(o.task, x, L, s + L + 2);
      ++made;
    }
  }
  return ad::Tensor::from(std::span<const std::int64_t>(seq), {count, T});
}
// Columns [c0, c1) of an i64 [N, T] tensor.
ad::Tensor columns(const ad::Tensor& t, std::int64_t c0, std::int64_t c1) {
  const std::int64_t n = t.dim(0), T = t.dim(1), w = c1 - c0;
  ad::Tensor out = ad::Tensor::empty({n, w}, ad::DType::i64);
  const std::int64_t* s = t.data<std::int64_t>();
  std::int64_t* d = out.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) std::copy(s + i * T + c0, s + i * T + c1, d + i * w);
  return out;
}

// ---- Adam with decoupled weight decay 0, global-norm clipping ----
struct Adam {
  double lr = 3e-3, b1 = 0.9, b2 = 0.98, eps = 1e-8, clip = 1.0;
  std::int64_t t = 0;
  std::vector<ad::Tensor> m, v;
  void step(const std::vector<ad::Parameter>& ps) {
    if (m.empty())
      for (const auto& p : ps) {
        m.push_back(ad::Tensor::zeros(p.shape(), p.dtype()));
        v.push_back(ad::Tensor::zeros(p.shape(), p.dtype()));
      }
    double norm2 = 0;
    for (const auto& p : ps)
      if (p.has_grad())
        for (double g : p.grad().to_vector()) norm2 += g * g;
    const double scale = std::min(1.0, clip / (std::sqrt(norm2) + 1e-12));
    ++t;
    const double c1 = 1 - std::pow(b1, static_cast<double>(t)), c2 = 1 - std::pow(b2, static_cast<double>(t));
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].has_grad()) continue;
      float* w = ps[i].value().data<float>();
      const float* g = ps[i].grad().data<float>();
      float *mi = m[i].data<float>(), *vi = v[i].data<float>();
      for (std::int64_t j = 0; j < ps[i].value().numel(); ++j) {
        const double gj = g[j] * scale;
        mi[j] = static_cast<float>(b1 * mi[j] + (1 - b1) * gj);
        vi[j] = static_cast<float>(b2 * vi[j] + (1 - b2) * gj * gj);
        w[j] -= static_cast<float>(lr * (mi[j] / c1) / (std::sqrt(vi[j] / c2) + eps));
      }
      ps[i].zero_grad();
    }
  }
};

ad::Policy make_policy(const Options& o) {
  const std::string& p = o.policy;
  if (p == "keep_all") return ad::policy::keep_all();
  if (p == "manual") return ad::policy::manual();
  if (p == "sqrt_n") return ad::policy::sqrt_n();
  if (p == "selective") return ad::policy::selective(ad::save_matmuls);
  if (p.rfind("uniform:", 0) == 0) return ad::policy::uniform(std::atoll(p.c_str() + 8));
  if (p.rfind("optimal:", 0) == 0) return ad::policy::optimal_chain(std::atoi(p.c_str() + 8));
  if (p == "budget") {
    if (o.budget_mib <= 0) throw ad::Error("--policy budget needs --budget <MiB>");
    return ad::policy::budget(o.budget_mib << 20);
  }
  throw ad::Error(fmt::format("unknown --policy '{}'", p));
}

// Greedy decoding of the held-out set; returns (exact-match, per-digit) accuracy.
std::pair<double, double> evaluate(const lm::DecoderLM& model, const Options& o, const ad::Tensor& seqs) {
  const std::int64_t n = seqs.dim(0), L = o.digits, V = kVocab;
  ad::Tensor prefix = columns(seqs, 0, L + 2);  // BOS x SEP
  for (std::int64_t s = 0; s < L; ++s) {
    const std::int64_t len = prefix.dim(1);
    ad::Graph g;
    ad::Tensor logits = ad::eval(model(g, prefix));  // [n, len, V]
    const float* lg = logits.data<float>();
    ad::Tensor next = ad::Tensor::empty({n, len + 1}, ad::DType::i64);
    const std::int64_t* p = prefix.data<std::int64_t>();
    std::int64_t* q = next.data<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      std::copy(p + i * len, p + (i + 1) * len, q + i * (len + 1));
      const float* row = lg + (i * len + len - 1) * V;
      q[i * (len + 1) + len] = std::max_element(row, row + 10) - row;  // digits only
    }
    prefix = next;
  }
  const std::int64_t T = 2 * L + 2;
  const std::int64_t *got = prefix.data<std::int64_t>(), *want = seqs.data<std::int64_t>();
  std::int64_t exact = 0, digits_ok = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    bool all = true;
    for (std::int64_t j = L + 2; j < T; ++j) {
      bool ok = got[i * T + j] == want[i * T + j];
      digits_ok += ok;
      all = all && ok;
    }
    exact += all;
  }
  return {static_cast<double>(exact) / static_cast<double>(n), static_cast<double>(digits_ok) / static_cast<double>(n * L)};
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--policy keep_all|manual|sqrt_n|uniform:K|selective|budget|optimal:S] [--budget MiB]\n"
               "          [--steps N] [--batch B] [--digits L] [--task reverse|sort] [--dim D] [--heads H]\n"
               "          [--kv-heads H] [--layers N] [--lr X] [--mixer attention] [--seed S] [--log-every N]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage(argv[0]);
    std::string v = argv[++i];
    if (a == "--policy") o.policy = v;
    else if (a == "--budget") o.budget_mib = std::atoll(v.c_str());
    else if (a == "--steps") o.steps = std::atoll(v.c_str());
    else if (a == "--batch") o.batch = std::atoll(v.c_str());
    else if (a == "--digits") o.digits = std::atoll(v.c_str());
    else if (a == "--task") o.task = v;
    else if (a == "--dim") o.model.dim = std::atoll(v.c_str());
    else if (a == "--heads") o.model.heads = std::atoll(v.c_str());
    else if (a == "--kv-heads") o.model.kv_heads = std::atoll(v.c_str());
    else if (a == "--layers") o.model.layers = std::atoll(v.c_str());
    else if (a == "--lr") o.lr = std::atof(v.c_str());
    else if (a == "--mixer") o.model.mixer = v;
    else if (a == "--seed") o.seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--log-every") o.log_every = std::max<std::int64_t>(1, std::atoll(v.c_str()));
    else return usage(argv[0]);
  }
  if (o.task != "reverse" && o.task != "sort") return usage(argv[0]);
  if (o.digits < 1 || o.batch < 1 || o.steps < 0) return usage(argv[0]);
  try {
    ad::Rng rng(o.seed);
    const std::int64_t L = o.digits, T = 2 * L + 2;  // full sequence; the model reads T - 1 tokens
    o.model.vocab = kVocab;
    o.model.max_len = T;
    lm::DecoderLM model(o.model, rng);
    model.checkpoint_blocks = o.policy == "manual";
    const ad::Policy policy = make_policy(o);
    std::int64_t nparams = 0;
    for (const auto& p : model.params.all) nparams += p.value().numel();
    fmt::print("ad {} — decoder-only LM, task {} of {} digits: {} layers, dim {}, {} heads ({} kv), {} params, "
               "mixer {}, batch {}, policy {}\n",
               ad::kVersionString, o.task, L, o.model.layers, o.model.dim, o.model.heads, o.model.kv_heads, nparams,
               o.model.mixer, o.batch, policy.name());

    // the loss reads the logits at the positions that predict y1 .. yL
    std::vector<std::int64_t> rows;
    for (std::int64_t b = 0; b < o.batch; ++b)
      for (std::int64_t t = L + 1; t < T - 1; ++t) rows.push_back(b * (T - 1) + t);
    const ad::Tensor pick = ad::Tensor::from(std::span<const std::int64_t>(rows), {o.batch * L});

    Adam opt;
    bool peaks_agree = true;  // predicted == measured on every step (CPU sizes are exact)
    double loss_acc = 0, ms_acc = 0;
    std::int64_t n_acc = 0;
    const auto t_start = std::chrono::steady_clock::now();
    for (std::int64_t step = 1; step <= o.steps; ++step) {
      // linear warm-up over 5 % of the steps, then cosine decay to 10 %
      const double warm = std::max<double>(1.0, 0.05 * static_cast<double>(o.steps));
      const double prog = static_cast<double>(step) / static_cast<double>(o.steps);
      opt.lr = o.lr * std::min(static_cast<double>(step) / warm, 0.1 + 0.45 * (1 + std::cos(3.141592653589793 * prog)));
      ad::Tensor seqs = make_sequences(o, o.batch, false, rng);
      ad::Tensor labels = columns(seqs, L + 2, T).reshape({o.batch * L});
      auto t0 = std::chrono::steady_clock::now();
      ad::Graph g;
      ad::Var logits = model(g, columns(seqs, 0, T - 1));  // [B, T-1, V]
      ad::Var picked = ad::gather(ad::reshape(logits, {-1, kVocab}), g.input(pick), 0);
      ad::Var loss = ad::cross_entropy(picked, g.input(labels));
      ad::Report r = ad::backward(loss, policy);
      peaks_agree = peaks_agree && r.predicted_peak_bytes == r.measured_peak_bytes;
      opt.step(model.params.all);
      ms_acc += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      loss_acc += loss.value().item();
      ++n_acc;
      if (step % o.log_every == 0 || step == o.steps) {
        const double tokens = static_cast<double>(n_acc * o.batch * (T - 1));
        fmt::print("step {:5d}  loss {:.4f}  tokens/s {:8.0f}  peak {:.2f} MiB (predicted {:.2f})  recomputed {}  "
                   "lr {:.2e}\n",
                   step, loss_acc / static_cast<double>(n_acc), tokens / (ms_acc * 1e-3),
                   static_cast<double>(r.measured_peak_bytes) / (1 << 20),
                   static_cast<double>(r.predicted_peak_bytes) / (1 << 20), r.recomputed_nodes, opt.lr);
        std::fflush(stdout);
        loss_acc = ms_acc = 0;
        n_acc = 0;
      }
    }
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    ad::Rng eval_rng(o.seed + 1000003);
    ad::Tensor held = make_sequences(o, o.eval_n, true, eval_rng);
    auto [exact, per_digit] = evaluate(model, o, held);
    fmt::print("trained {} steps in {:.1f} s; held-out {} sequences, greedy decoding: exact match {:.1f} %, "
               "digits {:.1f} %\n",
               o.steps, train_s, o.eval_n, 100 * exact, 100 * per_digit);
    if (!peaks_agree) {
      std::fprintf(stderr, "error: a step's measured peak differed from the predicted one\n");
      return 3;
    }
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
