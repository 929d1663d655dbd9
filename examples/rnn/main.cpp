// Trains a recurrent network by backpropagation through long sequences, the
// textbook case for rematerialisation: keep_all holds every gate of every
// step until backward reaches it, so memory grows with the sequence length;
// sqrt_n and budget keep a few states and recompute the steps between them.
//
// The task, "delayed echo": the input is a random sequence of symbols (8 of
// them) and the target at step t is the input at step t - delay, so the
// network must carry the last `delay` symbols in its state. Embedding ->
// GRU (or LSTM, or a tanh RNN) -> Linear, cross-entropy over the steps
// t >= delay, Adam. Prints the peak bytes of a step under keep_all and under
// the chosen policy (predicted before running, and measured), then one line
// per 25 steps; exits non-zero if the held-out accuracy ends below
// --min-acc or a step's measured peak exceeds the prediction.
//
//   ./rnn [--cell gru|lstm|rnn] [--seq T] [--delay D] [--hidden H] [--layers L] [--batch B] [--steps N]
//         [--policy keep_all|sqrt_n|budget] [--budget KiB] [--seed S] [--min-acc F]
#include <ad/ad.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "../common/args.hpp"

namespace {

constexpr std::int64_t kSymbols = 8;

struct Options {
  std::string cell = "gru", policy = "sqrt_n";
  std::int64_t seq = 256, delay = 4, hidden = 64, layers = 1, batch = 16, steps = 300, budget_kib = 0;
  std::uint64_t seed = 1;
  double min_acc = 0.9;
};

// ids [B, T] uniform over the symbols; targets [B, T - delay]: ids shifted by delay.
struct Batch {
  ad::Tensor ids, targets;
};
Batch make_batch(std::int64_t B, std::int64_t T, std::int64_t delay, ad::Rng& rng) {
  Batch b{ad::Tensor::randint({B, T}, rng, kSymbols), ad::Tensor::zeros({B, T - delay}, ad::DType::i64)};
  const std::int64_t* x = b.ids.data<std::int64_t>();
  std::int64_t* y = b.targets.data<std::int64_t>();
  for (std::int64_t i = 0; i < B; ++i)
    for (std::int64_t t = delay; t < T; ++t) y[i * (T - delay) + t - delay] = x[i * T + t - delay];
  return b;
}

// [snippet net]
struct Net : ad::nn::Module {
  ad::nn::Embedding embed;
  ad::nn::Recurrent rnn;
  ad::nn::Linear head;
  Net(const Options& o, ad::nn::CellKind kind, ad::Rng& rng)
      : embed(kSymbols, 16, rng), rnn(kind, 16, o.hidden, rng, layers(o)), head(o.hidden, kSymbols, rng) {}
  static ad::nn::RNNOptions layers(const Options& o) {
    ad::nn::RNNOptions r;
    r.num_layers = o.layers;
    return r;
  }
  // logits [B, T - delay, symbols] for the steps that have a target
  ad::Var operator()(const ad::Var& ids, std::int64_t delay) const {
    ad::Var h = rnn(embed(ids)).output;  // [B, T, hidden]
    return head(ad::slice(h, 1, delay, h.dim(1)));
  }
  void visit(ad::nn::Visitor& v) const override {
    v.module("embed", embed), v.module("rnn", rnn), v.module("head", head);
  }
};
// [end snippet]

ad::Var loss_of(const Net& net, ad::Graph& g, const Batch& b, std::int64_t delay) {
  ad::Var logits = net(g.input(b.ids), delay);
  return ad::cross_entropy(ad::reshape(logits, {-1, kSymbols}), ad::reshape(g.input(b.targets), {-1}));
}

double accuracy(const Net& net, const Batch& b, std::int64_t delay) {
  ad::Graph g;
  const ad::Tensor logits = ad::eval(net(g.input(b.ids), delay));
  const float* l = logits.data<float>();
  const std::int64_t* y = b.targets.data<std::int64_t>();
  std::int64_t hit = 0;
  const std::int64_t n = b.targets.numel();
  for (std::int64_t i = 0; i < n; ++i)
    hit += std::max_element(l + i * kSymbols, l + (i + 1) * kSymbols) - (l + i * kSymbols) == y[i];
  return static_cast<double>(hit) / static_cast<double>(n);
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--cell gru|lstm|rnn] [--seq T] [--delay D] [--hidden H] [--layers L] [--batch B] "
               "[--steps N] [--policy keep_all|sqrt_n|budget] [--budget KiB] [--seed S] [--min-acc F]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  ad::nn::CellKind kind = ad::nn::CellKind::gru;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) return usage(argv[0]);
      const std::string v = argv[++i];
      if (a == "--cell") o.cell = v;
      else if (a == "--seq") o.seq = args::flag_whole(a, v, 2, 1 << 20);
      else if (a == "--delay") o.delay = args::flag_whole(a, v, 0, 1 << 20);
      else if (a == "--hidden") o.hidden = args::flag_whole(a, v, 1, 4096);
      else if (a == "--layers") o.layers = args::flag_whole(a, v, 1, 16);
      else if (a == "--batch") o.batch = args::flag_whole(a, v, 1, 4096);
      else if (a == "--steps") o.steps = args::flag_whole(a, v, 1, 1000000);
      else if (a == "--policy") o.policy = v;
      else if (a == "--budget") o.budget_kib = args::flag_whole(a, v, 1);
      else if (a == "--seed") o.seed = args::flag_seed(a, v);
      else if (a == "--min-acc") o.min_acc = static_cast<double>(args::flag_whole(a, v, 0, 100)) / 100;
      else return usage(argv[0]);
    }
    if (o.cell == "gru") kind = ad::nn::CellKind::gru;
    else if (o.cell == "lstm") kind = ad::nn::CellKind::lstm;
    else if (o.cell == "rnn") kind = ad::nn::CellKind::rnn;
    else throw ad::Error(fmt::format("unknown --cell '{}' (gru, lstm or rnn)", o.cell));
    if (o.policy != "keep_all" && o.policy != "sqrt_n" && o.policy != "budget")
      throw ad::Error(fmt::format("unknown --policy '{}' (keep_all, sqrt_n or budget)", o.policy));
    if ((o.policy == "budget") != (o.budget_kib > 0)) throw ad::Error("--policy budget and --budget KiB go together");
    if (o.delay >= o.seq)
      throw ad::Error(fmt::format("--delay ({}) must be less than --seq ({}): no step would have a target", o.delay,
                                  o.seq));
  } catch (const ad::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    ad::Rng rng(o.seed);
    Net net(o, kind, rng);
    ad::nn::AdamOptions ao;
    ao.lr = 1e-2;
    ad::nn::Adam opt(net.named_parameters(), ao);
    const ad::Policy policy = o.policy == "sqrt_n"   ? ad::policy::sqrt_n()
                              : o.policy == "budget" ? ad::policy::budget(o.budget_kib << 10)
                                                     : ad::policy::keep_all();
    const Batch held_out = make_batch(64, o.seq, o.delay, rng);
    fmt::print("ad {} — {} x{} (hidden {}) on delayed echo: {} symbols, delay {}, sequences of {}, batch {}, "
               "policy {}\n",
               ad::kVersionString, o.cell, o.layers, o.hidden, kSymbols, o.delay, o.seq, o.batch, policy.name());
    {  // what a step costs under keep_all and under the policy, planned before anything runs
      ad::Graph g;
      const Batch b = make_batch(o.batch, o.seq, o.delay, rng);
      ad::Var loss = loss_of(net, g, b, o.delay);
      const std::int64_t all = ad::plan_backward(loss, ad::policy::keep_all()).schedule.predicted_peak_bytes;
      const ad::Plan p = ad::plan_backward(loss, policy);
      fmt::print("a step: {} nodes; peak {} B under keep_all, {} B under {} ({:.2f}x), recomputing {} nodes\n",
                 g.num_nodes(), all, p.schedule.predicted_peak_bytes, policy.name(),
                 static_cast<double>(p.schedule.predicted_peak_bytes) / static_cast<double>(all),
                 p.schedule.recomputed_nodes);
    }
    double acc = 0, ms = 0, loss_sum = 0;
    std::int64_t peak = 0, predicted = 0, n = 0;
    for (std::int64_t s = 1; s <= o.steps; ++s) {
      const Batch b = make_batch(o.batch, o.seq, o.delay, rng);
      const auto t0 = std::chrono::steady_clock::now();
      ad::Graph g;
      ad::Var loss = loss_of(net, g, b, o.delay);
      opt.zero_grad();
      const ad::Report r = ad::backward(loss, policy);
      ad::nn::clip_grad_norm(net.parameters(), 1.0);
      opt.step();
      ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r.measured_peak_bytes > r.predicted_peak_bytes) {
        fmt::print(stderr, "peak above the prediction: predicted {} measured {}\n", r.predicted_peak_bytes,
                   r.measured_peak_bytes);
        return 1;
      }
      peak = std::max(peak, r.measured_peak_bytes);
      predicted = std::max(predicted, r.predicted_peak_bytes);
      loss_sum += loss.value().item();
      ++n;
      if (s % 25 == 0 || s == o.steps) {
        acc = accuracy(net, held_out, o.delay);
        fmt::print("step {:4}  loss {:.4f}  held-out acc {:.2f}%  step {:.1f} ms  peak {} B (predicted {} B)\n", s,
                   loss_sum / static_cast<double>(n), 100 * acc, ms / static_cast<double>(n), peak, predicted);
        loss_sum = 0, ms = 0, n = 0;
      }
    }
    fmt::print("final held-out accuracy {:.2f}%\n", 100 * acc);
    return acc >= o.min_acc ? 0 : 1;
  } catch (const std::exception& e) {
    return args::report_error(e);
  }
}
