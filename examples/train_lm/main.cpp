// Trains a small decoder-only transformer (ad::nn::DecoderLM: embeddings,
// pre-norm blocks with causal multi-head self-attention through
// ad::attention and a GELU MLP, final norm, LM head) on a synthetic
// algorithmic language made here:  BOS x1 .. xL SEP y1 .. yL  where y is x
// sorted (--task sort, the default) or reversed (--task reverse), x random
// digits (L = 12 by default). The loss is next-token cross-entropy on the y
// part. Held-out strings (a fixed hash class, never drawn for training) are
// decoded greedily at the end and scored by exact match. Exits 3 if a step's
// measured peak ever differs from the predicted one, 2 on a bad command line,
// 1 on other errors.
//
//   train_lm [--policy keep_all|manual|sqrt_n|uniform:K|selective|budget] [--budget MiB]
//            [--steps N] [--batch B] [--digits L] [--task reverse|sort] [--dim D] [--heads H]
//            [--kv-heads H] [--layers N] [--lr X] [--mixer attention|semiseparable] [--seed S] [--log-every N]
//            [--eval N] [--save FILE] [--save-every N] [--resume FILE] [--trace FILE] [--dot FILE]
//            [--stop-at N]
//
// --save writes a safetensors checkpoint (parameters, AdamW state, step and
// data stream position) every --save-every steps and at the end; --resume
// continues from one, giving the same parameters bit for bit as a run that
// was never interrupted; the --save path is checked before training (a file
// can be created in its directory). --trace writes the memory timeline of the
// first step as Chrome trace-event JSON (open it in Perfetto or
// chrome://tracing); --dot writes that step's plan as Graphviz (dot -Tsvg
// plan.dot > plan.svg).
// --mixer semiseparable replaces attention in every block by a learned causal
// semiseparable matrix (T + U V^T per position, O(N) in the sequence length).
// The last line prints a hash of the parameters.
//
// policy: keep_all (no recomputation), manual (keep block outputs, marked with
// ad::checkpoint), sqrt_n, uniform:K (every K-th forward value), selective
// (keep matmul outputs), budget (the cheapest schedule within --budget MiB).
// optimal_chain (Revolve) is not offered: it applies to chain graphs only,
// and this model (token plus position embeddings, residual blocks) is never
// one; examples/remat_demo runs it on a chain.
#include <ad/ad.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>  // close, unlink (mkstemp is in cstdlib)

#include "../common/args.hpp"

namespace {

constexpr std::int64_t kBos = 10, kSep = 11, kVocab = 12;

struct Options {
  std::string policy = "keep_all", task = "sort";
  std::int64_t budget_mib = 0, steps = 500, batch = 64, digits = 12, log_every = 50, eval_n = 1000;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  std::string mixer = "attention", save, resume, trace, dot;
  std::int64_t save_every = 0, stop_at = 0;
  ad::nn::DecoderLMOptions model;
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
  ad::Tensor out = ad::Tensor::empty({count, T}, ad::DType::i64);  // ad::Error if too large
  std::int64_t* seq = out.data<std::int64_t>();
  std::int64_t made = 0;
  while (made < count) {
    ad::Tensor d = ad::Tensor::randint({256, L}, rng, 10);
    const std::int64_t* dv = d.data<std::int64_t>();
    for (std::int64_t r = 0; r < 256 && made < count; ++r) {
      const std::int64_t* x = dv + r * L;
      if (held_out(x, L) != want_held_out) continue;
      std::int64_t* s = seq + made * T;
      s[0] = kBos;
      std::copy(x, x + L, s + 1);
      s[L + 1] = kSep;
      answer(o.task, x, L, s + L + 2);
      ++made;
    }
  }
  return out;
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

// The largest --digits and --dim for which 2 L + 2 and 4 dim fit in 64 bits
// (far beyond memory: such a model fails to allocate, with an error).
constexpr std::int64_t kMaxDigits = (INT64_MAX - 2) / 2, kMaxDim = INT64_MAX / 4;

// The value of `key` in the metadata of checkpoint `path`, else ad::Error naming both.
const std::string& metadata_at(const ad::Metadata& md, const std::string& path, const std::string& key) {
  auto it = md.find(key);
  if (it == md.end())
    throw ad::Error(fmt::format("--resume {}: the checkpoint's metadata has no {} (not a checkpoint of train_lm)",
                                path, key));
  return it->second;
}

// --save PATH is checked before training, not at the first save (the end of
// the run without --save-every): PATH is not a directory, and a file can be
// created in PATH's directory (the link's target's, for a symbolic link). The
// probe file is removed; an existing checkpoint at PATH is not touched.
void check_writable(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw ad::Error(fmt::format("--save {}: is a directory", path));
  fs::path target = path;
  if (fs::exists(target, ec)) {
    fs::path real = fs::canonical(target, ec);
    if (!ec) target = real;
  }
  std::string probe = (target.has_parent_path() ? target.parent_path() / ".train_lm-probe-XXXXXX"
                                                : fs::path(".train_lm-probe-XXXXXX")).string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0)
    throw ad::Error(fmt::format("--save {}: cannot create a file in its directory ({})", path, std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

ad::Policy make_policy(const Options& o) {
  const std::string& p = o.policy;
  if (p == "keep_all") return ad::policy::keep_all();
  if (p == "manual") return ad::policy::manual();
  if (p == "sqrt_n") return ad::policy::sqrt_n();
  if (p == "selective") return ad::policy::selective(ad::save_matmuls);
  if (p.rfind("uniform:", 0) == 0) return ad::policy::uniform(args::flag_whole("--policy uniform:K", p.substr(8), 1));
  if (p.rfind("optimal:", 0) == 0)
    throw ad::Error("--policy optimal:S (Revolve) applies to chain graphs only; this model is not one "
                    "(examples/remat_demo runs it on a chain)");
  if (p == "budget") {
    if (o.budget_mib <= 0) throw ad::Error("--policy budget needs --budget <MiB>");
    return ad::policy::budget(o.budget_mib << 20);
  }
  throw ad::Error(fmt::format("unknown --policy '{}'", p));
}

// Greedy decoding of the held-out set; returns (exact-match, per-digit) accuracy.
std::pair<double, double> evaluate(const ad::nn::DecoderLM& model, const Options& o, const ad::Tensor& seqs) {
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
               "usage: %s [--policy keep_all|manual|sqrt_n|uniform:K|selective|budget] [--budget MiB]\n"
               "          [--steps N] [--batch B] [--digits L] [--task reverse|sort] [--dim D] [--heads H]\n"
               "          [--kv-heads H] [--layers N] [--lr X] [--mixer attention|semiseparable] [--seed S] [--log-every N]\n"
               "          [--eval N] [--save FILE] [--save-every N] [--resume FILE] [--trace FILE] [--dot FILE]\n"
               "          [--stop-at N] (stop after step N of --steps, as if interrupted)\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  ad::Policy policy;
  bool heads_given = false, budget_given = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (i + 1 >= argc) return usage(argv[0]);
      std::string v = argv[++i];
      if (a == "--policy") o.policy = v;
      else if (a == "--budget") o.budget_mib = args::flag_whole(a, v, 1, INT64_MAX >> 20), budget_given = true;
      else if (a == "--steps") o.steps = args::flag_whole(a, v, 1);
      else if (a == "--batch") o.batch = args::flag_whole(a, v, 1);
      else if (a == "--digits") o.digits = args::flag_whole(a, v, 1, kMaxDigits);
      else if (a == "--task") o.task = v;
      else if (a == "--dim") o.model.dim = args::flag_whole(a, v, 1, kMaxDim);
      else if (a == "--heads") o.model.block.heads = args::flag_whole(a, v, 1), heads_given = true;
      else if (a == "--kv-heads") o.model.block.kv_heads = args::flag_whole(a, v, 1), heads_given = true;
      else if (a == "--layers") o.model.layers = args::flag_whole(a, v, 0);
      else if (a == "--lr") {
        char* end = nullptr;
        errno = 0;
        o.lr = std::strtod(v.c_str(), &end);
        if (v.empty() || *end || errno || !std::isfinite(o.lr) || o.lr <= 0)
          throw ad::Error(fmt::format("--lr takes a number > 0, got '{}'", v));
      }
      else if (a == "--mixer") o.mixer = v;
      else if (a == "--eval") o.eval_n = args::flag_whole(a, v, 0);
      else if (a == "--save") o.save = v;
      else if (a == "--save-every") o.save_every = args::flag_whole(a, v, 1);
      else if (a == "--resume") o.resume = v;
      else if (a == "--stop-at") o.stop_at = args::flag_whole(a, v, 1);
      else if (a == "--trace") o.trace = v;
      else if (a == "--dot") o.dot = v;
      else if (a == "--seed") o.seed = args::flag_seed(a, v);
      else if (a == "--log-every") o.log_every = args::flag_whole(a, v, 1);
      else return usage(argv[0]);
    }
    if (o.task != "reverse" && o.task != "sort")
      throw ad::Error(fmt::format("--task takes sort or reverse, got '{}'", o.task));
    if (o.mixer != "attention" && o.mixer != "semiseparable")
      throw ad::Error(fmt::format("--mixer takes attention or semiseparable, got '{}'", o.mixer));
    // options another one makes meaningless are errors, not silently ignored
    if (budget_given && o.policy != "budget") throw ad::Error("--budget applies to --policy budget only");
    if (o.save_every != 0 && o.save.empty()) throw ad::Error("--save-every applies with --save only");
    if (heads_given && o.mixer == "semiseparable")
      throw ad::Error("--heads and --kv-heads apply to --mixer attention (the semiseparable mixer has no heads)");
    policy = make_policy(o);  // made once: a budget policy caches its plans across steps
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  try {
    if (!o.save.empty()) check_writable(o.save);
    if (o.mixer == "semiseparable") o.model.block.mixer = ad::nn::Mixer::semiseparable;
    ad::Rng init_rng(o.seed);
    const std::int64_t L = o.digits, T = 2 * L + 2;  // full sequence; the model reads T - 1 tokens
    o.model.vocab = kVocab;
    o.model.max_len = T;
    o.model.embed_init_stddev = 0.5;
    o.model.block.init_stddev = 0;  // linear layers: U(+-1/sqrt(in))
    o.model.block.mlp_hidden = 4 * o.model.dim;
    o.model.checkpoint_blocks = o.policy == "manual";
    ad::nn::DecoderLM model(o.model, init_rng);
    const std::vector<ad::Parameter> params = model.parameters();
    const std::string heads = o.mixer == "attention" ? fmt::format(", {} heads ({} kv)", o.model.block.heads,
                                                                    o.model.block.kv_heads)
                                                     : std::string();
    fmt::print("ad {} — decoder-only LM, task {} of {} digits: {} layers, dim {}{}, {} params, mixer {}, batch {}, "
               "policy {}\n",
               ad::kVersionString, o.task, L, o.model.layers, o.model.dim, heads, model.num_parameters(), o.mixer,
               o.batch, policy.name());

    // the loss reads the logits at the positions that predict y1 .. yL; this
    // and the held-out set are made before training, so that a --batch or an
    // --eval too large for memory fails now rather than after the run
    ad::Tensor pick, held;
    try {
      pick = ad::Tensor::empty({o.batch, L}, ad::DType::i64);
    } catch (const ad::Error& e) {
      throw ad::Error(fmt::format("--batch {}: {}", o.batch, e.what()));
    }
    std::int64_t* rows = pick.data<std::int64_t>();
    for (std::int64_t b = 0; b < o.batch; ++b)
      for (std::int64_t j = 0; j < L; ++j) rows[b * L + j] = b * (T - 1) + L + 1 + j;
    pick = pick.reshape({o.batch * L});
    if (o.eval_n > 0) {
      ad::Rng eval_rng(o.seed + 1000003);
      try {
        held = make_sequences(o, o.eval_n, true, eval_rng);
      } catch (const ad::Error& e) {
        throw ad::Error(fmt::format("--eval {}: {}", o.eval_n, e.what()));
      }
    }

    // AdamW (no weight decay), betas (0.9, 0.98); linear warm-up over 5 % of
    // the steps, then cosine decay to 10 %; gradients clipped to norm 1
    ad::nn::AdamOptions ao;
    ao.lr = o.lr;
    ao.beta2 = 0.98;
    ao.weight_decay = 0;
    ad::nn::AdamW opt(model.named_parameters(), ao);
    const auto warm = std::max<std::int64_t>(1, o.steps / 20);
    opt.set_schedule(ad::nn::LrSchedule::warmup_cosine(o.lr, warm, std::max(o.steps, warm), 0.1 * o.lr));

    // the training data stream: seeded, its position saved with checkpoints
    ad::Rng rng(o.seed + 17);
    std::int64_t first = 1;
    if (!o.resume.empty()) {
      ad::Metadata md = ad::nn::load_checkpoint(o.resume, model, opt);
      // the data stream is the task's, the seed's and the batch's, the learning-rate schedule spans
      // --steps, and heads of another count fit the same weights: resuming with any of them changed
      // would not continue the run the checkpoint came from
      for (const auto& [key, want] :
           {std::pair<std::string, std::string>{"task", o.task}, {"seed", std::to_string(o.seed)},
            {"batch", std::to_string(o.batch)}, {"steps", std::to_string(o.steps)},
            {"heads", std::to_string(o.model.block.heads)}, {"kv-heads", std::to_string(o.model.block.kv_heads)}})
        if (md.count(key) && md.at(key) != want)
          throw ad::Error(fmt::format("--resume {}: the checkpoint was made with --{} {}, this run has --{} {}", o.resume,
                                      key, md.at(key), key, want));
      const std::string& step = metadata_at(md, o.resume, "step");
      const std::string& offset = metadata_at(md, o.resume, "data_offset");
      auto not_whole = [&](const char* key, const std::string& v) {
        return ad::Error(
            fmt::format("--resume {}: the checkpoint's {} is '{}', not a whole number >= 0", o.resume, key, v));
      };
      std::int64_t done = 0;
      std::uint64_t at = 0;
      if (!args::whole(step, 0, INT64_MAX - 1, done)) throw not_whole("step", step);
      if (!args::whole_u64(offset, at)) throw not_whole("data_offset", offset);
      first = done + 1;
      rng.reserve(at);
      fmt::print("resumed from {} at step {}\n", o.resume, first - 1);
    }
    auto save = [&](std::int64_t step) {
      ad::nn::save_checkpoint(o.save, model, opt,
                              {{"step", std::to_string(step)}, {"data_offset", std::to_string(rng.offset())},
                               {"task", o.task}, {"seed", std::to_string(o.seed)}, {"batch", std::to_string(o.batch)},
                               {"steps", std::to_string(o.steps)}, {"heads", std::to_string(o.model.block.heads)},
                               {"kv-heads", std::to_string(o.model.block.kv_heads)}});
    };

    bool peaks_agree = true;  // predicted == measured on every step (CPU sizes are exact)
    double loss_acc = 0, ms_acc = 0;
    std::int64_t n_acc = 0;
    const auto t_start = std::chrono::steady_clock::now();
    const std::int64_t last = o.stop_at > 0 ? std::min(o.stop_at, o.steps) : o.steps;  // --stop-at: an interruption
    if (first > last)  // a checkpoint of a finished run (or one past --stop-at): no step to take, nothing saved
      fmt::print("nothing to do: {} is at step {}, this run ends at step {}\n", o.resume, first - 1, last);
    for (std::int64_t step = first; step <= last; ++step) {
      ad::Tensor seqs = make_sequences(o, o.batch, false, rng);
      ad::Tensor labels = columns(seqs, L + 2, T).reshape({o.batch * L});
      auto t0 = std::chrono::steady_clock::now();
      ad::Graph g;
      ad::Var logits = model(g, columns(seqs, 0, T - 1));  // [B, T-1, V]
      ad::Var picked = ad::gather(ad::reshape(logits, {-1, kVocab}), g.input(pick), 0);
      ad::Var loss = ad::cross_entropy(picked, g.input(labels));
      const bool inspect = step == first && (!o.trace.empty() || !o.dot.empty());
      ad::Trace trace;
      if (inspect && !o.trace.empty()) g.record(&trace);
      ad::Report r = ad::backward(loss, policy);
      g.record(nullptr);
      if (inspect && !o.trace.empty()) {
        trace.save(o.trace);
        fmt::print("wrote {}: the memory timeline of step {} ({} events)\n", o.trace, step, trace.events().size());
      }
      if (inspect && !o.dot.empty()) {
        std::string dot = ad::to_dot(g, *r.plan);
        std::FILE* f = std::fopen(o.dot.c_str(), "w");
        if (!f || std::fwrite(dot.data(), 1, dot.size(), f) != dot.size() || std::fclose(f) != 0)
          throw ad::Error("cannot write " + o.dot);
        fmt::print("wrote {}: the plan of step {} as Graphviz\n", o.dot, step);
      }
      peaks_agree = peaks_agree && r.predicted_peak_bytes == r.measured_peak_bytes;
      const double lr = opt.lr();
      ad::nn::clip_grad_norm(params, 1.0);
      opt.step();
      opt.zero_grad();
      ms_acc += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      loss_acc += loss.value().item();
      ++n_acc;
      if (step % o.log_every == 0 || step == o.steps) {
        const double tokens = static_cast<double>(n_acc) * static_cast<double>(o.batch) * static_cast<double>(T - 1);
        fmt::print("step {:5d}  loss {:.4f}  tokens/s {:8.0f}  peak {:.2f} MiB (predicted {:.2f})  recomputed {}  "
                   "lr {:.2e}\n",
                   step, loss_acc / static_cast<double>(n_acc), tokens / (ms_acc * 1e-3),
                   static_cast<double>(r.measured_peak_bytes) / (1 << 20),
                   static_cast<double>(r.predicted_peak_bytes) / (1 << 20), r.recomputed_nodes, lr);
        std::fflush(stdout);
        loss_acc = ms_acc = 0;
        n_acc = 0;
      }
      if (!o.save.empty() && ((o.save_every > 0 && step % o.save_every == 0) || step == last)) save(step);
    }
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    if (first <= last) fmt::print("trained to step {} in {:.1f} s\n", last, train_s);
    if (o.eval_n > 0) {
      auto [exact, per_digit] = evaluate(model, o, held);
      fmt::print("held-out {} sequences, greedy decoding: exact match {:.1f} %, digits {:.1f} %\n", o.eval_n,
                 100 * exact, 100 * per_digit);
    }
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over every parameter's bytes
    for (const auto& p : params) {
      const auto* b = static_cast<const unsigned char*>(p.value().raw());
      for (std::size_t i = 0; i < p.value().nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
    }
    fmt::print("params-hash {:016x}\n", h);
    if (!peaks_agree) {
      std::fprintf(stderr, "error: a step's measured peak differed from the predicted one\n");
      return 3;
    }
  } catch (const std::exception& e) {
    return args::report_error(e);
  }
  return 0;
}
