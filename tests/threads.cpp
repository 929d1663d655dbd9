// User threads: each trains its own model on its own graphs at once (every
// policy, a loader thread making the batches, kernels that split work over
// the kernel pool), and the results are the one-thread results bit for bit,
// with predicted == measured peaks; one model's Dropout called from several
// threads gives every call its own mask.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/cache.hpp"
#include "test_util.hpp"

namespace {

using ad::DType;
using ad::Graph;
using ad::Policy;
using ad::Rng;
using ad::Tensor;
using ad::Var;

// What a training run produced: losses, peaks and final parameters as bits.
struct Run {
  std::vector<std::uint64_t> bits;
  std::string err;  // an exception, or a peak the plan did not predict
  bool operator==(const Run&) const = default;
};
void add_bits(Run& r, double v) {
  std::uint64_t u;
  std::memcpy(&u, &v, 8);
  r.bits.push_back(u);
}
void add_bits(Run& r, const Tensor& t) {
  for (double v : t.to_vector()) add_bits(r, v);
}
void add_report(Run& r, const ad::Report& rep) {
  if (rep.predicted_peak_bytes != rep.measured_peak_bytes)
    r.err += fmt::format("{}: predicted {} B, measured {} B; ", rep.policy, rep.predicted_peak_bytes,
                         rep.measured_peak_bytes);
  r.bits.push_back(static_cast<std::uint64_t>(rep.measured_peak_bytes));
  r.bits.push_back(static_cast<std::uint64_t>(rep.recomputed_nodes));
}

using Batch = std::vector<Tensor>;
using MakeBatch = std::function<Batch(Rng&)>;

// Batches made on a loader thread ahead of the trainer, handed over by a queue.
class Loader {
 public:
  Loader(MakeBatch make, std::uint64_t seed, int n)
      : th_([this, make, seed, n] {
          Rng rng(seed);
          for (int i = 0; i < n; ++i) {
            Batch b = make(rng);
            Tensor scratch = b[0].clone();  // and tensors made and dropped here
            scratch.fill(1.0);
            std::lock_guard<std::mutex> lk(m_);
            q_.push_back(std::move(b));
            cv_.notify_one();
          }
        }) {}
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  ~Loader() { th_.join(); }
  Batch next() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return !q_.empty(); });
    Batch b = std::move(q_.front());
    q_.pop_front();
    return b;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Batch> q_;
  std::thread th_;  // last: started once the queue exists
};

// Batches from the trainer's own thread, or from a Loader.
class Batches {
 public:
  Batches(MakeBatch make, std::uint64_t seed, int n, bool loader) : make_(std::move(make)), rng_(seed) {
    if (loader) loader_ = std::make_unique<Loader>(make_, seed, n);
  }
  Batch next() { return loader_ ? loader_->next() : make_(rng_); }

 private:
  MakeBatch make_;
  Rng rng_;
  std::unique_ptr<Loader> loader_;
};

// An MLP with dropout, Adam.
Run train_mlp(const Policy& pol, int steps, bool loader) {
  Run r;
  try {
    Rng rng(1);
    ad::nn::MLPOptions mo;
    mo.dropout = 0.1;
    mo.activation = ad::nn::Activation::gelu;
    ad::nn::MLP m({12, 24, 24, 5}, rng, mo);
    ad::nn::Adam opt(m.named_parameters());
    Batches data([](Rng& g) { return Batch{Tensor::randn({8, 12}, g), Tensor::randint({8}, g, 5)}; }, 2, steps, loader);
    for (int s = 0; s < steps; ++s) {
      Batch b = data.next();
      Graph g;
      Var loss = ad::cross_entropy(m(g.input(b[0])), g.input(b[1]));
      add_report(r, ad::backward(loss, pol));
      add_bits(r, loss.value().item());
      opt.step();
      opt.zero_grad();
    }
    for (const auto& p : m.parameters()) add_bits(r, p.value());
  } catch (const std::exception& e) {
    r.err += e.what();
  }
  return r;
}

// A chain of tanh layers (small enough for the budget's exact tier, and a
// chain for optimal_chain), SGD with momentum.
Run train_chain(const Policy& pol, int steps) {
  Run r;
  try {
    Rng rng(3);
    std::vector<ad::Parameter> ws;
    for (int i = 0; i < 5; ++i) ws.push_back(ad::Parameter::randn({16, 16}, rng, 0.3, DType::f32, fmt::format("w{}", i)));
    ad::nn::SGD opt(ws, ad::nn::SGDOptions{0.05, 0.9});
    for (int s = 0; s < steps; ++s) {
      Graph g;
      Var h = g.input(Tensor::randn({32, 16}, rng));
      for (const auto& w : ws) h = ad::tanh(ad::matmul(h, w));
      Var loss = ad::sum(ad::mul(h, h));
      add_report(r, ad::backward(loss, pol));
      add_bits(r, loss.value().item());
      opt.step();
      opt.zero_grad();
    }
    for (const auto& p : ws) add_bits(r, p.value());
  } catch (const std::exception& e) {
    r.err += e.what();
  }
  return r;
}

// A small decoder LM (attention or the semiseparable mixer: kernels that run
// teams on the kernel pool), AdamW, and an eval graph each step.
Run train_lm(const Policy& pol, int steps, ad::nn::Mixer mixer, bool loader) {
  Run r;
  try {
    Rng rng(4);
    ad::nn::DecoderLMOptions o;
    o.vocab = 11;
    o.max_len = 48;
    o.dim = 32;
    o.layers = 2;
    o.block.heads = 2;
    o.block.kv_heads = 2;
    o.block.mixer = mixer;
    o.block.max_len = 48;
    o.block.mixer_rank = 4;
    o.checkpoint_blocks = true;
    ad::nn::DecoderLM lm(o, rng);
    ad::nn::AdamW opt(lm.named_parameters());
    const std::int64_t B = 4, T = 48;
    Batches data([](Rng& g) { return Batch{Tensor::randint({4, 48}, g, 11), Tensor::randint({4 * 48}, g, 11)}; }, 5,
                 steps, loader);
    for (int s = 0; s < steps; ++s) {
      Batch b = data.next();
      Graph g;
      Var loss = ad::cross_entropy(ad::reshape(lm(g, b[0]), {B * T, 11}), g.input(b[1]));
      add_report(r, ad::backward(loss, pol));
      add_bits(r, loss.value().item());
      opt.step();
      opt.zero_grad();
      lm.eval();
      Graph ge;
      add_bits(r, ad::eval(ad::sum(lm(ge, b[0]))));
      lm.train();
    }
    for (const auto& p : lm.parameters()) add_bits(r, p.value());
  } catch (const std::exception& e) {
    r.err += e.what();
  }
  return r;
}

// A semi-CRF head (its kernels' teams meet at barriers), Adam, marginals.
Run train_crf(const Policy& pol, int steps) {
  Run r;
  try {
    Rng rng(6);
    ad::nn::SemiCRFHead head(6, 3, 5, rng);
    ad::nn::Adam opt(head.named_parameters());
    const std::int64_t B = 6, T = 64;
    std::vector<std::int64_t> lens(B), seg(static_cast<std::size_t>(B * T), -1);
    for (std::int64_t b = 0; b < B; ++b) {
      lens[static_cast<std::size_t>(b)] = T - 3 * b;
      for (std::int64_t t = 0; t < T - 3 * b; t += 4) seg[static_cast<std::size_t>(b * T + t)] = (t + b) % 3;
    }
    Tensor L = Tensor::from(std::span<const std::int64_t>(lens), {B});
    Tensor S = Tensor::from(std::span<const std::int64_t>(seg), {B, T});
    for (int s = 0; s < steps; ++s) {
      Tensor feats = Tensor::randn({B, T, 6}, rng);
      Graph g;
      Var nll = head.nll(g.input(feats), g.input(L), g.input(S));
      add_report(r, ad::backward(nll, pol));
      add_bits(r, nll.value().item());
      opt.step();
      opt.zero_grad();
      Graph ge;
      add_bits(r, ad::eval(head.marginals(ge.input(feats), ge.input(L))));
    }
    for (const auto& p : head.parameters()) add_bits(r, p.value());
  } catch (const std::exception& e) {
    r.err += e.what();
  }
  return r;
}

}  // namespace

TEST_CASE("threads: models trained on several threads at once match their one-thread runs bit for bit") {
#ifdef AD_TEST_SANITIZED
  const int steps = 2, rounds = 1;
#else
  const int steps = 3, rounds = 2;
#endif
  using ad::nn::Mixer;
  namespace P = ad::policy;
  // One Policy object per setting, shared by every thread that uses it (its
  // plan cache is shared); the chains' budgets share one exact-tier sweep
  // (the same problem at several budgets).
  const Policy keep_all = P::keep_all(), sqrt_n = P::sqrt_n(), manual = P::manual(), sel = P::selective(ad::save_matmuls),
               bf16 = P::sqrt_n().compressed(DType::bf16), offload = P::sqrt_n().offloaded(),
               chain_oc = P::optimal_chain(3), lm_budget = P::budget(700 * 1024);
  std::vector<Policy> chain_budgets = {P::budget(9000), P::budget(10000), P::budget(13000)};
  std::vector<std::pair<std::string, std::function<Run()>>> jobs = {
      {"mlp keep_all", [&] { return train_mlp(keep_all, steps, false); }},
      {"mlp keep_all, loader thread", [&] { return train_mlp(keep_all, steps, true); }},
      {"mlp sqrt_n, loader thread", [&] { return train_mlp(sqrt_n, steps, true); }},
      {"mlp selective", [&] { return train_mlp(sel, steps, false); }},
      {"mlp sqrt_n bf16", [&] { return train_mlp(bf16, steps, false); }},
      {"mlp sqrt_n offloaded", [&] { return train_mlp(offload, steps, false); }},
      {"chain optimal_chain", [&] { return train_chain(chain_oc, steps); }},
      {"lm attention manual, loader thread", [&] { return train_lm(manual, steps, Mixer::attention, true); }},
      {"lm attention budget", [&] { return train_lm(lm_budget, steps, Mixer::attention, false); }},
      {"lm semiseparable sqrt_n", [&] { return train_lm(sqrt_n, steps, Mixer::semiseparable, false); }},
      {"crf keep_all", [&] { return train_crf(keep_all, steps); }},
      {"crf sqrt_n", [&] { return train_crf(sqrt_n, steps); }},
  };
  for (const Policy& b : chain_budgets)
    for (int copy = 0; copy < 2; ++copy) jobs.push_back({b.name(), [&] { return train_chain(b, steps); }});

  std::vector<Run> want;
  for (const auto& job : jobs) {
    want.push_back(job.second());
    INFO(job.first);
    CHECK(want.back().err.empty());
    CHECK(!want.back().bits.empty());
  }
  for (int round = 0; round < rounds; ++round) {
    std::vector<Run> got(jobs.size());
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < jobs.size(); ++i)
      threads.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < static_cast<int>(jobs.size())) std::this_thread::yield();  // all start together
        got[i] = jobs[i].second();
      });
    for (auto& t : threads) t.join();
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      INFO(jobs[i].first, ", round ", round);
      CHECK(got[i].err == want[i].err);
      CHECK(got[i].bits == want[i].bits);
    }
  }
}

TEST_CASE("threads: one Dropout layer called from several threads at once gives every call its own mask") {
  // Graphs built at once from one model (threads sharing its Parameters):
  // each call reserves its own counters. A plain read and write of the
  // layer's offset lost updates, and two calls got the same mask.
  Rng rng(8);
  ad::nn::Dropout d(0.5, rng);
  const int threads = 4;
#ifdef AD_TEST_SANITIZED
  const int calls = 500;
#else
  const int calls = 4000;
#endif
  const std::int64_t n = 3;
  std::vector<std::vector<std::uint64_t>> offsets(threads);
  std::atomic<int> ready{0};
  std::vector<std::thread> th;
  for (int t = 0; t < threads; ++t)
    th.emplace_back([&, t] {
      Graph g;
      Var x = g.input(Tensor::ones({n}));
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      for (int c = 0; c < calls; ++c) {
        Var y = d(x);
        offsets[static_cast<std::size_t>(t)].push_back(g.impl().node(y.id()).attrs.offset);
      }
    });
  for (auto& t : th) t.join();
  std::set<std::uint64_t> all;
  for (const auto& v : offsets) all.insert(v.begin(), v.end());
  CHECK(all.size() == static_cast<std::size_t>(threads * calls));  // no two calls share a mask
  CHECK(d.rng_state.at({1}) == static_cast<double>(threads * calls * n));  // no reservation lost
  // and every range is its own: offsets n apart, from 0
  std::uint64_t expect = 0;
  bool contiguous = true;
  for (auto o : all) {
    contiguous = contiguous && o == expect;
    expect += static_cast<std::uint64_t>(n);
  }
  CHECK(contiguous);
}

TEST_CASE("threads: a step planned on several threads at once is cached once") {
  // Threads training copies of one model share a Policy: their first steps
  // miss its cache together and each inserts the plan. One entry per key,
  // else the copies push other plans (an eval step's) out of the cache.
  const Policy pol = ad::policy::budget(9000);  // the exact tier: some time to plan
  const int threads = 6;
  std::atomic<int> ready{0};
  std::vector<std::thread> th;
  std::vector<int> cached(threads, -1);
  for (int t = 0; t < threads; ++t)
    th.emplace_back([&, t] {
      Rng rng(static_cast<std::uint64_t>(t));
      std::vector<ad::Parameter> ws;
      for (int i = 0; i < 5; ++i) ws.push_back(ad::Parameter::randn({16, 16}, rng, 0.3));
      Graph g;
      Var h = g.input(Tensor::randn({32, 16}, rng));
      for (const auto& w : ws) h = ad::tanh(ad::matmul(h, w));
      Var loss = ad::sum(h);
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      cached[static_cast<std::size_t>(t)] = ad::backward(loss, pol).plan_cached;
    });
  for (auto& t : th) t.join();
  CHECK(pol.cache->size() == 1);
  for (int c : cached) CHECK(c >= 0);
}
