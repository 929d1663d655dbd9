// Runs under mpirun (see run.sh): checks ad::dist's collectives, data-parallel
// training against single-process training on the global batch, and that a
// dead rank turns into an ad::Error on the others. Prints one line per check
// and exits non-zero on the first failure.
#include <ad/ad.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

int failures = 0;
void check(bool ok, const std::string& what, const ad::dist::Communicator& c) {
  if (!ok) {
    fmt::print("rank {}: FAIL {}\n", c.rank(), what);
    ++failures;
  }
}

// f throws an ad::Error whose message holds `needle` (another message is printed)
bool throws_with(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
  } catch (const ad::Error& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return true;
    fmt::print("unexpected ad::Error: {}\n", e.what());
  }
  return false;
}

// ---- collectives: values every rank can predict ----
void collectives(const ad::dist::Communicator& c) {
  const int p = c.size(), r = c.rank();
  for (ad::DType dt : {ad::DType::f32, ad::DType::f64}) {
    ad::Tensor t = ad::Tensor::empty({5}, dt);
    for (int i = 0; i < 5; ++i)
      dt == ad::DType::f32 ? void(t.data<float>()[i] = static_cast<float>(r * 10 + i))
                           : void(t.data<double>()[i] = r * 10 + i);
    ad::Tensor m = t.clone();
    c.all_reduce(t, ad::dist::ReduceOp::sum);
    c.all_reduce(m, ad::dist::ReduceOp::mean);
    for (int i = 0; i < 5; ++i) {
      double want = 10.0 * p * (p - 1) / 2 + p * i;
      check(t.to_vector()[static_cast<std::size_t>(i)] == want, fmt::format("all_reduce sum {}", ad::dtype_name(dt)), c);
      check(std::abs(m.to_vector()[static_cast<std::size_t>(i)] - want / p) < 1e-5,
            fmt::format("all_reduce mean {}", ad::dtype_name(dt)), c);
    }
  }
  std::vector<std::int64_t> iv = {r, 1, -r};
  ad::Tensor it = ad::Tensor::from(std::span<const std::int64_t>(iv), {3});
  c.all_reduce(it);
  check(it.to_vector() == std::vector<double>{p * (p - 1) / 2.0, 1.0 * p, -p * (p - 1) / 2.0}, "all_reduce i64", c);

  int root = p - 1;
  ad::Tensor b = ad::Tensor::full({4}, r == root ? 7.5 : -1.0, ad::DType::f64);
  c.broadcast(b, root);
  check(b.to_vector() == std::vector<double>(4, 7.5), "broadcast from the last rank", c);

  // reduce_scatter: rank r contributes r+1 everywhere; block k of the sum is p(p+1)/2
  ad::Tensor in = ad::Tensor::full({3 * p}, r + 1.0, ad::DType::f64), out = ad::Tensor::empty({3}, ad::DType::f64);
  for (int k = 0; k < 3 * p; ++k) in.data<double>()[k] += k;  // block-dependent too
  c.reduce_scatter(in, out);
  for (int j = 0; j < 3; ++j)
    check(out.to_vector()[static_cast<std::size_t>(j)] == p * (p + 1) / 2.0 + p * (3.0 * r + j), "reduce_scatter", c);

  ad::Tensor mine = ad::Tensor::full({2}, 100.0 + r, ad::DType::f32), all = ad::Tensor::empty({2 * p}, ad::DType::f32);
  c.all_gather(mine, all);
  for (int k = 0; k < 2 * p; ++k) check(all.to_vector()[static_cast<std::size_t>(k)] == 100.0 + k / 2, "all_gather", c);
  c.barrier();

  // ranks disagreeing on the shape: every rank gets an ad::Error naming it
  ad::Tensor odd = ad::Tensor::zeros({r == 0 ? 3 : 4});
  bool threw = false;
  try {
    c.all_reduce(odd);
  } catch (const ad::Error& e) {
    threw = std::string(e.what()).find("ranks disagree") != std::string::npos;
  }
  check(threw || p == 1, "mismatched shapes give ad::Error", c);
  // the same element count in another shape, another root, another reduce op,
  // another collective: each an ad::Error on every rank, at once
  auto fails_with = [&](auto f, const char* needle) {
    try {
      f();
    } catch (const ad::Error& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  ad::Tensor turned = ad::Tensor::zeros(r == 0 ? ad::Shape{2, 3} : ad::Shape{3, 2});
  check(fails_with([&] { c.all_reduce(turned); }, "another rank's dimension 0") || p == 1, "same count, other shape", c);
  ad::Tensor six = ad::Tensor::zeros({6});
  check(fails_with([&] { c.broadcast(six, r == 0 ? 0 : 1); }, "disagree on the root") || p == 1, "other roots", c);
  check(fails_with([&] { c.all_reduce(six, r == 0 ? ad::dist::ReduceOp::sum : ad::dist::ReduceOp::mean); },
                   "disagree on the reduce op") ||
            p == 1,
        "other reduce ops", c);
  ad::Tensor big = ad::Tensor::zeros({6 * p});
  check(fails_with([&] {
          if (r == 0) c.reduce_scatter(big, six);
          else c.all_reduce(six);
        }, "ranks call different collectives") || p == 1,
        "other collectives", c);
  // barrier() is checked as the others are: one rank in all_reduce, the others in barrier (MPI failed
  // with MPI_ERR_TRUNCATE before, and Open MPI's fatal handler ended the job)
  ad::Tensor four = ad::Tensor::full({4}, r + 1.0, ad::DType::f64);
  check(fails_with([&] {
          if (r == 0) c.all_reduce(four);
          else c.barrier();
        }, "ranks call different collectives") || p == 1,
        "all_reduce against barrier", c);
  check(four.to_vector() == std::vector<double>(4, r + 1.0), "all_reduce against barrier leaves the tensor", c);
  // a failed all_reduce(mean) leaves the tensor as it was (it was divided by the world size before)
  ad::Tensor eights = ad::Tensor::full({r == 0 ? 3 : 4}, 8.0, ad::DType::f64);
  check(fails_with([&] { c.all_reduce(eights, ad::dist::ReduceOp::mean); }, "ranks disagree") || p == 1,
        "all_reduce(mean) of other shapes", c);
  check(eights.to_vector() == std::vector<double>(static_cast<std::size_t>(eights.numel()), 8.0),
        "a failed all_reduce(mean) leaves the tensor", c);
  // an argument error only one rank finds (mean on i64): every rank fails at once, and all go on
  ad::Tensor ints = ad::Tensor::zeros({4}, r == 0 ? ad::DType::i64 : ad::DType::f64);
  check(fails_with([&] { c.all_reduce(ints, ad::dist::ReduceOp::mean); },
                   r == 0 ? "dtype of i64[4] not supported" : "another rank's call was invalid"),
        "a local argument error fails every rank", c);
  // more elements than MPI's int count: an ad::Error naming the collective and the tensor (was cast to int),
  // on rank 0; the others learn that a call was invalid. 8 GiB of address space, never touched.
  {
    ad::Tensor huge, reserved = ad::Tensor::zeros({1}, ad::DType::f64);
    if (r == 0) {
      try {
        huge = ad::Tensor::empty({std::int64_t{1} << 31}, ad::DType::f32);
        reserved.fill(1.0);
      } catch (const ad::Error&) {
      }
    }
    c.broadcast(reserved, 0);
    if (reserved.item() == 1.0) {
      ad::Tensor small = ad::Tensor::zeros({4});
      check(fails_with([&] { c.all_reduce(r == 0 ? huge : small); },
                       r == 0 ? "all_reduce: f32[2147483648] has 2147483648 elements, more than MPI's count limit"
                              : "another rank's call was invalid") ||
                p == 1,
            "a tensor over 2^31-1 elements", c);
    } else if (r == 0) {
      fmt::print("rank 0: skipped the 2^31-element check: 8 GiB of address space could not be reserved\n");
    }
  }
  c.barrier();
  // shape errors caught locally
  threw = false;
  try {
    c.reduce_scatter(in, mine);
  } catch (const ad::Error& e) {
    threw = std::string(e.what()).find("reduce_scatter") != std::string::npos;
  }
  check(threw, "reduce_scatter shape error", c);
  // still usable afterwards
  ad::Tensor one = ad::Tensor::ones({1}, ad::DType::f64);
  c.all_reduce(one);
  check(one.item() == p, "usable after an error", c);
  // an async all_reduce dropped before wait() completes (MPI wrote into the freed tensor before: a segfault),
  // and one assigned over is waited for first
  {
    ad::Tensor a = ad::Tensor::full({1 << 16}, r + 1.0, ad::DType::f64);
    { auto w = c.all_reduce_async(a); }
    check(a.to_vector()[0] == p * (p + 1) / 2.0 && a.to_vector()[(1 << 16) - 1] == p * (p + 1) / 2.0,
          "an async all_reduce dropped before wait() completes", c);
    ad::Tensor m = ad::Tensor::full({1000}, 2.0 * r, ad::DType::f64), s = ad::Tensor::ones({7}, ad::DType::f64);
    auto w = c.all_reduce_async(m, ad::dist::ReduceOp::mean);
    w = c.all_reduce_async(s);
    w.wait();
    check(m.to_vector()[999] == p - 1.0 && s.to_vector()[6] == p, "an async all_reduce assigned over is waited for", c);
  }
  c.barrier();
  c.all_reduce(one);
  check(one.item() == 1.0 * p * p, "usable after dropped async work", c);
  // DataParallel: a parameter no rank's loss reached is not stepped (as in one process)
  {
    ad::Parameter used = ad::Parameter::zeros({4}, ad::DType::f64, "used"), idle = ad::Parameter::zeros({4}, ad::DType::f64, "idle");
    ad::dist::DataParallel dp(c, {used, idle});
    ad::nn::SGDOptions so;
    so.lr = 0.1;
    so.momentum = 0.9;
    ad::nn::SGD opt(ad::nn::NamedParameters{{"used", used}, {"idle", idle}}, so);
    for (int step = 0; step < 3; ++step) {
      ad::Graph g;
      ad::Var loss = ad::sum(step == 0 ? ad::add(g.param(used), g.param(idle)) : ad::mul_scalar(g.param(used), 1.0));
      dp.backward(loss);
      check(used.has_fresh_grad(), "a used parameter has a fresh gradient", c);
      check(idle.has_fresh_grad() == (step == 0), "an unused parameter has none after step 0", c);
      opt.step();
      opt.zero_grad();
    }
    check(idle.value().to_vector() == std::vector<double>(4, -0.1), "the unused parameter moved once only", c);
  }
  // Zero1 starts each step from the parameters as they are (values written after it was made count)
  {
    ad::Parameter w = ad::Parameter::zeros({5}, ad::DType::f64, "w");
    ad::dist::Zero1 z(c, ad::nn::NamedParameters{{"w", w}}, [](ad::nn::NamedParameters s) {
      ad::nn::SGDOptions so;
      so.lr = 0.1;
      return std::make_unique<ad::nn::SGD>(std::move(s), so);
    });
    w.value().fill(5.0);  // e.g. pretrained weights loaded after the optimizer was made
    ad::Graph g;
    z.backward(ad::sum(g.param(w)));
    z.step();
    check(w.value().to_vector() == std::vector<double>(5, 4.9), "Zero1 keeps values written after it was made", c);
  }
  // Zero1 steps what an unsharded optimizer would: a parameter no rank's loss reached keeps its value
  // and momentum; one only rank 0 reached gets the mean gradient on every rank; step counts follow
  {
    auto zeros = [](std::int64_t n, const char* name) { return ad::Parameter::zeros({n}, ad::DType::f64, name); };
    ad::Parameter used = zeros(4, "used"), idle = zeros(4, "idle"), solo = zeros(3, "solo");
    ad::dist::Zero1 z(c, ad::nn::NamedParameters{{"used", used}, {"idle", idle}, {"solo", solo}},
                      [](ad::nn::NamedParameters s) {
                        ad::nn::SGDOptions so;
                        so.lr = 0.1;
                        so.momentum = 0.9;
                        return std::make_unique<ad::nn::SGD>(std::move(s), so);
                      });
    for (int step = 0; step < 3; ++step) {
      ad::Graph g;
      ad::Var loss = ad::sum(g.param(used));
      if (step == 0) loss = ad::add(loss, ad::sum(g.param(idle)));
      if (step == 1 && r == 0) loss = ad::add(loss, ad::sum(g.param(solo)));
      z.backward(loss);
      z.step();
      z.zero_grad();
    }
    check(idle.value().to_vector() == std::vector<double>(4, -0.1), "Zero1: the unused parameter moved once only", c);
    check(solo.value().to_vector() == std::vector<double>(3, -0.1 * (1.0 / p)),
          "Zero1: a parameter one rank reached moved once, by the mean gradient", c);
    const double u3 = -(0.1 * 1.0 + 0.1 * 1.9 + 0.1 * 2.71);  // b = 1, 0.9 b + 1 = 1.9, 2.71
    bool used_ok = true;
    for (double x : used.value().to_vector()) used_ok = used_ok && std::abs(x - u3) < 1e-12;
    check(used_ok, "Zero1: the used parameter took three momentum steps", c);
    ad::nn::NamedTensors st = z.state();
    auto step_of = [&](const std::string& n) {
      for (const auto& nt : st)
        if (nt.first == n) return nt.second.data<std::int64_t>()[0];
      return std::int64_t{-1};
    };
    check(step_of("step") == 3 && step_of("used.step") == 3 && step_of("idle.step") == 1 && step_of("solo.step") == 1,
          "Zero1: per-parameter step counts in its state", c);
    // loading it back (here, as a resumed run would) and a bad state named on every rank alike
    ad::Parameter u2 = zeros(4, "used"), i2 = zeros(4, "idle"), s2 = zeros(3, "solo");
    ad::dist::Zero1 z2(c, ad::nn::NamedParameters{{"used", u2}, {"idle", i2}, {"solo", s2}},
                       [](ad::nn::NamedParameters s) { return std::make_unique<ad::nn::SGD>(std::move(s), ad::nn::SGDOptions{0.1, 0.9}); });
    z2.load_state(st);
    ad::nn::NamedTensors st2 = z2.state();
    bool same = st2.size() == st.size();
    for (std::size_t k = 0; same && k < st.size(); ++k)
      same = st[k].first == st2[k].first && ad::bitwise_equal(st[k].second.to(ad::Device::cpu()), st2[k].second.to(ad::Device::cpu()));
    check(same, "Zero1: state() after load_state(state()) is the same state", c);
    ad::nn::NamedTensors bad = st;
    bad.emplace_back("ghost.step", bad[1].second);
    check(fails_with([&] { z2.load_state(bad); }, "unexpected tensor \"ghost.step\""), "Zero1: unknown names in a state", c);
  }
  fmt::print("rank {}: collectives {}\n", r, failures ? "FAILED" : "ok");
}

// Zero1 refusing a step (or a backward) for a parameter one rank changed leaves every rank as it was:
// no rank steps its shard (the ranks that had not changed it used to step theirs before they learnt of it,
// their moments and step counts running ahead), so once the parameter has its old tensor back, the run
// goes on as if nothing had been refused
void zero1_refusal_keeps_state(const ad::dist::Communicator& c) {
  const int p = c.size(), r = c.rank();
  const bool mine = r == p - 1;
  const std::string there = "was given a tensor of another shape, dtype or device on another rank";
  auto adam = [](ad::nn::NamedParameters s) {
    ad::nn::AdamOptions o;
    o.lr = 0.1;
    return std::make_unique<ad::nn::Adam>(std::move(s), o);
  };
  auto same_state = [](const ad::nn::NamedTensors& a, const ad::nn::NamedTensors& b) {
    bool same = a.size() == b.size();
    for (std::size_t k = 0; same && k < a.size(); ++k)
      same = a[k].first == b[k].first &&
             ad::bitwise_equal(a[k].second.to(ad::Device::cpu()), b[k].second.to(ad::Device::cpu()));
    return same;
  };
  auto make = [](const char* n, std::int64_t size) {
    ad::Rng rng(static_cast<std::uint64_t>(size));  // the same values on every rank, and in both runs
    return ad::Parameter::randn({size}, rng, 1.0, ad::DType::f64, n);
  };
  // u^2 summed, plus v weighted by the rank (different gradients per rank); a run z that is refused and the
  // same run zr that never is
  ad::Parameter u = make("u", 5), v = make("v", 7), ur = make("u", 5), vr = make("v", 7);
  ad::dist::Zero1 z(c, ad::nn::NamedParameters{{"u", u}, {"v", v}}, adam);
  ad::dist::Zero1 zr(c, ad::nn::NamedParameters{{"u", ur}, {"v", vr}}, adam);
  auto backward = [&](ad::dist::Zero1& zz, const ad::Parameter& a, const ad::Parameter& b) {
    ad::Graph g;
    ad::Var x = g.param(a);
    zz.backward(ad::add(ad::sum(ad::mul(x, x)), ad::mul_scalar(ad::sum(g.param(b)), r + 1.0)));
  };
  for (int step = 0; step < 3; ++step) {
    backward(zr, ur, vr);
    zr.step();
    zr.zero_grad();
  }
  backward(z, u, v);  // step 1 (moments and step counts away from their initial values)
  z.step();
  z.zero_grad();
  const ad::Tensor kept = v.value();
  // step 2: v changed on the last rank before backward
  ad::nn::NamedTensors before = z.state();
  if (mine) v.value() = ad::Tensor::zeros({3}, ad::DType::f64);
  check(throws_with([&] { backward(z, u, v); }, mine ? "it was f64[7], it is f64[3]" : there),
        "Zero1::backward after a parameter shrank on one rank (state check)", c);
  check(same_state(before, z.state()), "Zero1: the optimizer state unchanged on every rank after a refused backward", c);
  if (mine) v.value() = kept;
  z.zero_grad();  // the gradients this rank's own backward accumulated into u and v
  backward(z, u, v);
  z.step();
  z.zero_grad();
  // step 3: v changed on the last rank between backward and step
  backward(z, u, v);
  before = z.state();
  const std::vector<double> u_before = u.value().to_vector();
  if (mine) v.value() = ad::Tensor::zeros({3}, ad::DType::f64);
  check(throws_with([&] { z.step(); }, mine ? "Zero1::step: parameter \"v\" was given" : there),
        "Zero1::step after a parameter shrank on one rank (state check)", c);
  check(same_state(before, z.state()),
        "Zero1: the optimizer state (moments, step counts) unchanged on every rank after a refused step", c);
  check(u.value().to_vector() == u_before, "Zero1: no parameter written by a refused step", c);
  if (mine) v.value() = kept;
  z.step();  // the same step again, now accepted: the one the uninterrupted run took
  check(same_state(z.state(), zr.state()), "Zero1: a refused step, retried, leaves the state of a run never refused", c);
  check(ad::bitwise_equal(u.value(), ur.value()) && ad::bitwise_equal(v.value(), vr.value()),
        "Zero1: a refused step, retried, leaves the parameters of a run never refused", c);
}

// ---- DataParallel and Zero1 misused: every rank gets an ad::Error, at once ----
void changed(const ad::dist::Communicator& c) {
  const int p = c.size(), r = c.rank();
  const std::string here = "was given a tensor of another shape, dtype or device after this";
  const std::string there = "was given a tensor of another shape, dtype or device on another rank";
  auto sgd = [](ad::nn::NamedParameters s) {
    ad::nn::SGDOptions so;
    so.lr = 0.1;
    return std::make_unique<ad::nn::SGD>(std::move(s), so);
  };
  // ranks that wrap different numbers of parameters (the same bytes in all: the broadcasts pair up)
  {
    std::vector<ad::Parameter> ps{ad::Parameter::zeros({2, 2}, ad::DType::f32, "a")};
    if (r == 0) ps.push_back(ad::Parameter::zeros({2, 2}, ad::DType::f32, "b"));
    check(throws_with([&] { ad::dist::DataParallel dp(c, ps); }, "ranks pass different numbers of parameters") ||
              p == 1,
          "DataParallel over different numbers of parameters", c);
    ad::nn::NamedParameters named;
    for (const auto& q : ps) named.emplace_back(q.name(), q);
    check(throws_with([&] { ad::dist::Zero1 z(c, named, sgd); }, "ranks pass different numbers of parameters") ||
              p == 1,
          "Zero1 over different numbers of parameters", c);
  }
  // a rank whose own arguments are invalid (no parameters) fails, and so do the others, at once
  {
    std::vector<ad::Parameter> ps;
    if (r != p - 1) ps.push_back(ad::Parameter::zeros({2}, ad::DType::f32, "a"));
    check(throws_with([&] { ad::dist::DataParallel dp(c, ps); },
                      r == p - 1 ? "DataParallel: no parameters" : "another rank's arguments are invalid"),
          "DataParallel with no parameters on one rank", c);
    ad::nn::NamedParameters named;
    for (const auto& q : ps) named.emplace_back(q.name(), q);
    check(throws_with([&] { ad::dist::Zero1 z(c, named, sgd); },
                      r == p - 1 ? "Zero1: no parameters" : "another rank's arguments are invalid"),
          "Zero1 with no parameters on one rank", c);
  }
  // a parameter changed on one rank that still holds its old gradient (no zero_grad): backward would refuse
  // that gradient on this rank alone, leaving the others to time out; every rank gets the changed error
  {
    const bool mine = r == p - 1;
    ad::Parameter a = ad::Parameter::zeros({4}, ad::DType::f32, "a");
    ad::dist::DataParallel dp(c, {a});
    {
      ad::Graph g;
      dp.backward(ad::sum(g.param(a)));
    }
    if (mine) a.value() = ad::Tensor::ones({8});
    ad::Graph g;
    check(throws_with([&] { dp.backward(ad::sum(g.param(a))); }, mine ? "it was f32[4], it is f32[8]" : there),
          "DataParallel::backward after a parameter grew on one rank, its old gradient kept", c);
    ad::Parameter z0 = ad::Parameter::zeros({4}, ad::DType::f64, "z0");
    ad::dist::Zero1 z(c, ad::nn::NamedParameters{{"z0", z0}}, sgd);
    {
      ad::Graph h;
      z.backward(ad::sum(h.param(z0)));
      z.step();
    }
    if (mine) z0.value() = ad::Tensor::zeros({6}, ad::DType::f64);
    ad::Graph h;
    check(throws_with([&] { z.backward(ad::sum(h.param(z0))); }, mine ? "it was f64[4], it is f64[6]" : there),
          "Zero1::backward after a parameter grew on one rank, its old gradient kept", c);
  }
  // a parameter given a larger tensor after DataParallel was made (a heap overflow before): on every
  // rank, then on one rank only (the others learn it from the bucket's flags, not from the timeout)
  for (int who : {-1, p - 1}) {
    ad::Parameter a = ad::Parameter::zeros({4}, ad::DType::f32, "a"), b = ad::Parameter::zeros({4}, ad::DType::f32, "b");
    ad::dist::DataParallel dp(c, {a, b}, /*bucket_bytes=*/16);  // one bucket each
    if (who < 0 || who == r) {
      a.value() = ad::Tensor::ones({1 << 16});
      a.zero_grad();
    }
    const bool mine = who < 0 || who == r;
    ad::Graph g;
    ad::Var loss = ad::add(ad::sum(g.param(a)), ad::mul_scalar(ad::sum(g.param(b)), r + 1.0));
    check(throws_with([&] { dp.backward(loss); }, mine ? "it was f32[4], it is f32[65536] (make a new DataParallel"
                                                       : there),
          fmt::format("DataParallel::backward after a parameter grew on {}", who < 0 ? "every rank" : "one rank"), c);
    check(b.grad().to_vector()[0] == r + 1.0, "no mean gradient written when DataParallel::backward fails", c);
  }
  // all_reduce_gradients (for a custom backward): the same, for a dtype changed on rank 0
  {
    ad::Parameter d = ad::Parameter::zeros({3}, ad::DType::f32, "d");
    ad::dist::DataParallel dp(c, {d});
    if (r == 0) d.value() = ad::Tensor::zeros({3}, ad::DType::f64);
    check(throws_with([&] { dp.all_reduce_gradients(); }, r == 0 ? "it was f32[3], it is f64[3]" : there),
          "DataParallel::all_reduce_gradients after a dtype changed on rank 0", c);
  }
  // the same under Zero1 (trained silently wrong before): in backward, and between backward and step
  for (int who : {-1, p - 1}) {
    ad::Parameter a = ad::Parameter::zeros({4}, ad::DType::f64, "a"), b = ad::Parameter::zeros({4}, ad::DType::f64, "b");
    ad::dist::Zero1 z(c, ad::nn::NamedParameters{{"a", a}, {"b", b}}, sgd);
    const bool mine = who < 0 || who == r;
    if (mine) a.value() = ad::Tensor::zeros({6}, ad::DType::f64);
    {
      ad::Graph g;
      check(throws_with([&] { z.backward(ad::add(ad::sum(g.param(a)), ad::sum(g.param(b)))); },
                       mine ? "it was f64[4], it is f64[6] (make a new Zero1" : there),
            fmt::format("Zero1::backward after a parameter grew on {}", who < 0 ? "every rank" : "one rank"), c);
    }
    ad::Parameter u = ad::Parameter::zeros({4}, ad::DType::f64, "u"), v = ad::Parameter::zeros({5}, ad::DType::f64, "v");
    ad::dist::Zero1 z2(c, ad::nn::NamedParameters{{"u", u}, {"v", v}}, sgd);
    ad::Graph g;
    z2.backward(ad::add(ad::sum(g.param(u)), ad::sum(g.param(v))));
    if (mine) v.value() = ad::Tensor::zeros({2}, ad::DType::f64);
    check(throws_with([&] { z2.step(); }, mine ? "Zero1::step: parameter \"v\" was given" : there),
          fmt::format("Zero1::step after a parameter shrank on {}", who < 0 ? "every rank" : "one rank"), c);
    check(u.value().to_vector() == std::vector<double>(4, 0.0), "no parameter written when Zero1::step fails", c);
  }
  zero1_refusal_keeps_state(c);
  // and the communicator is still usable: these are argument errors, not failures
  ad::Tensor one = ad::Tensor::ones({1}, ad::DType::f64);
  c.all_reduce(one);
  check(one.item() == p, "usable after the errors", c);
  fmt::print("rank {}: changed parameters {}\n", r, failures ? "FAILED" : "ok");
}

// ---- data-parallel training ----
constexpr std::int64_t kIn = 6, kHidden = 16, kOut = 3;

struct Model {
  std::vector<ad::Parameter> p;
  explicit Model(std::uint64_t seed) {
    ad::Rng rng(seed);
    p.push_back(ad::Parameter::randn({kIn, kHidden}, rng, 0.4, ad::DType::f64, "w1"));
    p.push_back(ad::Parameter::zeros({kHidden}, ad::DType::f64, "b1"));
    p.push_back(ad::Parameter::randn({kHidden, kHidden}, rng, 0.3, ad::DType::f64, "w2"));
    p.push_back(ad::Parameter::randn({kHidden, kOut}, rng, 0.3, ad::DType::f64, "w3"));
  }
  ad::Var loss(ad::Graph& g, const ad::Tensor& x, const ad::Tensor& y) const {
    ad::Var h = ad::tanh(ad::add(ad::matmul(g.input(x), p[0]), p[1]));
    h = ad::tanh(ad::matmul(h, p[2]));
    return ad::mse(ad::matmul(h, p[3]), g.input(y));
  }
  void sgd(double lr) const {
    for (const auto& q : p) {
      double* v = q.value().data<double>();
      const double* gr = q.grad().data<double>();
      for (std::int64_t i = 0; i < q.value().numel(); ++i) v[i] -= lr * gr[i];
      q.zero_grad();
    }
  }
};

// Rows `idx` of the dataset (x: [n, kIn], y = sin(x A) [n, kOut]).
void batch(const ad::Tensor& X, const ad::Tensor& Y, const std::vector<std::int64_t>& idx, ad::Tensor& x, ad::Tensor& y) {
  auto n = static_cast<std::int64_t>(idx.size());
  x = ad::Tensor::empty({n, kIn}, ad::DType::f64);
  y = ad::Tensor::empty({n, kOut}, ad::DType::f64);
  for (std::int64_t i = 0; i < n; ++i) {
    std::memcpy(x.data<double>() + i * kIn, X.data<double>() + idx[static_cast<std::size_t>(i)] * kIn, kIn * 8);
    std::memcpy(y.data<double>() + i * kOut, Y.data<double>() + idx[static_cast<std::size_t>(i)] * kOut, kOut * 8);
  }
}

std::uint64_t hash_params(const Model& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& q : m.p) {
    const auto* b = static_cast<const unsigned char*>(q.value().raw());
    for (std::size_t i = 0; i < q.value().nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

// One optimizer over a model's parameters, as the mode asks: plain SGD
// (a loop), ad::nn::Adam, or ZeRO-1 with Adam shards.
struct Opt {
  std::string kind;
  std::unique_ptr<ad::nn::Adam> adam;
  std::unique_ptr<ad::dist::Zero1> zero;
  std::unique_ptr<ad::dist::DataParallel> dp;
  const Model* m = nullptr;
  Opt(const std::string& k, const Model& model, const ad::dist::Communicator* c) : kind(k), m(&model) {
    ad::nn::AdamOptions o;
    o.lr = 0.01;
    ad::nn::NamedParameters named;
    for (const auto& q : model.p) named.emplace_back(q.name(), q);
    if (kind == "zero") {
      zero = std::make_unique<ad::dist::Zero1>(*c, named, [o](ad::nn::NamedParameters shard) {
        return std::make_unique<ad::nn::Adam>(std::move(shard), o);
      });
      return;
    }
    if (c) dp = std::make_unique<ad::dist::DataParallel>(*c, model.p, /*bucket_bytes=*/1024);
    if (kind == "adam") adam = std::make_unique<ad::nn::Adam>(named, o);
  }
  void backward(const ad::Var& loss, const ad::Policy& pol) {
    if (zero) zero->backward(loss, pol);
    else if (dp) dp->backward(loss, pol);
    else ad::backward(loss, pol);
  }
  void step() {
    if (zero) {
      zero->step();
      zero->zero_grad();
    } else if (adam) {
      adam->step();
      adam->zero_grad();
    } else {
      m->sgd(0.1);
    }
  }
};

// Training on a fixed global batch of kGlobal rows per step: rank r of p
// takes kGlobal / p of them (ad::dist::shard_indices), so the global batch of
// every step, and the single-process reference, do not depend on p.
constexpr std::int64_t kGlobal = 16, kRows = kGlobal * 4;

// `io`: "" (no files), "save:<path>@<k>" (after k steps, rank 0 writes the
// parameters and the full ZeRO/Adam state with safetensors; the run goes on),
// or "resume:<path>" (start from such a file, at its step, on this world size).
void train(const ad::dist::Communicator& c, int steps, const std::string& policy_name, const std::string& opt_kind,
           const std::string& io) {
  const int p = c.size(), r = c.rank();
  ad::Rng drng(99);
  ad::Tensor X = ad::Tensor::randn({kRows, kIn}, drng, ad::DType::f64);
  ad::Tensor A = ad::Tensor::randn({kIn, kOut}, drng, ad::DType::f64);
  ad::Tensor Y = ad::Tensor::empty({kRows, kOut}, ad::DType::f64);
  for (std::int64_t i = 0; i < kRows; ++i)
    for (std::int64_t o = 0; o < kOut; ++o) {
      double s = 0;
      for (std::int64_t k = 0; k < kIn; ++k) s += X.data<double>()[i * kIn + k] * A.data<double>()[k * kOut + o];
      Y.data<double>()[i * kOut + o] = std::sin(s);
    }
  ad::Policy pol = policy_name == "sqrt_n" ? ad::policy::sqrt_n() : ad::policy::keep_all();

  Model dist_model(1000 + static_cast<std::uint64_t>(r));  // differs per rank: the broadcast must fix it
  Opt dist_opt(opt_kind, dist_model, &c);
  Model ref(1000);  // rank 0's initial parameters
  Opt ref_opt(opt_kind == "zero" ? "adam" : opt_kind, ref, nullptr);
  const std::int64_t per = kGlobal / p, steps_per_epoch = kRows / kGlobal;
  std::string save_path;
  int save_at = -1, start = 0;
  if (io.rfind("save:", 0) == 0) {
    auto at = io.rfind('@');
    save_path = io.substr(5, at - 5);
    save_at = std::atoi(io.c_str() + at + 1);
  } else if (io.rfind("resume:", 0) == 0) {
    ad::SafeTensors f = ad::load_safetensors(io.substr(7));
    start = std::atoi(f.metadata.at("step").c_str());
    for (const auto& q : dist_model.p) q.value().copy_from(f.at("model." + q.name()));
    ad::NamedTensors st;
    for (const auto& nt : f.tensors)
      if (nt.first.rfind("optim.", 0) == 0) st.emplace_back(nt.first.substr(6), nt.second);
    if (dist_opt.zero) dist_opt.zero->load_state(st);
    else if (dist_opt.adam) dist_opt.adam->load_state(st);
  }
  for (int s = 0; s < steps; ++s) {
    std::int64_t epoch = s / steps_per_epoch, k = s % steps_per_epoch;
    std::vector<std::int64_t> global, local;
    for (int q = 0; q < p; ++q) {
      auto sh = ad::dist::shard_indices(kRows, q, p, 7, epoch);
      std::vector<std::int64_t> part(sh.begin() + k * per, sh.begin() + (k + 1) * per);
      global.insert(global.end(), part.begin(), part.end());
      if (q == r) local = part;
    }
    ad::Tensor x, y;
    if (s >= start) {
      batch(X, Y, local, x, y);
      {
        ad::Graph g;
        dist_opt.backward(dist_model.loss(g, x, y), pol);
      }
      dist_opt.step();
    }
    if (s + 1 == save_at) {
      ad::NamedTensors st = dist_opt.zero ? dist_opt.zero->state() : dist_opt.adam->state();  // collective for ZeRO
      if (r == 0) {
        ad::NamedTensors all;
        for (const auto& q : dist_model.p) all.emplace_back("model." + q.name(), q.value());
        for (const auto& nt : st) all.emplace_back("optim." + nt.first, nt.second);
        ad::save_safetensors(save_path, all, {{"step", std::to_string(save_at)}, {"world", std::to_string(p)}});
      }
      c.barrier();
    }
    batch(X, Y, global, x, y);
    {
      ad::Graph g;
      ref_opt.backward(ref.loss(g, x, y), pol);
    }
    ref_opt.step();
  }
  double worst = 0;
  for (std::size_t i = 0; i < ref.p.size(); ++i) {
    auto a = dist_model.p[i].value().to_vector(), b = ref.p[i].value().to_vector();
    for (std::size_t j = 0; j < a.size(); ++j)
      worst = std::max(worst, std::abs(a[j] - b[j]) / std::max(1e-12, std::abs(b[j])));
  }
  check(worst <= 1e-6, fmt::format("distributed vs global batch: worst relative difference {:.3g}", worst), c);
  ad::Tensor h = ad::Tensor::full({1}, static_cast<double>(hash_params(dist_model) % (1ull << 52)), ad::DType::f64);
  ad::Tensor hsum = h.clone();
  c.all_reduce(hsum);
  check(hsum.item() == h.item() * p, "parameters bit-identical across ranks", c);
  std::string extra;
  if (dist_opt.zero) {
    const auto& z = *dist_opt.zero;
    std::int64_t bound = z.unsharded_state_bytes() / p + z.largest_parameter_bytes();
    check(z.state_bytes() <= bound, fmt::format("ZeRO-1 state {} B > bound {} B", z.state_bytes(), bound), c);
    extra = fmt::format(" zero-state {} B of {} B unsharded (bound {} B)", z.state_bytes(), z.unsharded_state_bytes(),
                        bound);
  }
  if (start > 0) extra += fmt::format(" resumed at step {}", start);
  fmt::print("rank {}: train {} steps policy {} optimizer {} worst-rel {:.3g}{} params-hash {:016x} {}\n", r, steps,
             policy_name, opt_kind, worst, extra, hash_params(dist_model), failures ? "FAILED" : "ok");
}

// ---- a dead rank: the others fail with the timeout error, not hang ----
void kill_one(ad::dist::Communicator& c) {
  Model m(5);
  ad::dist::DataParallel dp(c, m.p);
  ad::Rng rng(3);
  ad::Tensor x = ad::Tensor::randn({4, kIn}, rng, ad::DType::f64), y = ad::Tensor::randn({4, kOut}, rng, ad::DType::f64);
  auto t0 = std::chrono::steady_clock::now();
  try {
    for (int s = 0; s < 10; ++s) {
      if (s == 3 && c.rank() == c.size() - 1) std::raise(SIGKILL);
      ad::Graph g;
      dp.backward(m.loss(g, x, y));
      m.sgd(0.01);
    }
  } catch (const ad::Error& e) {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("rank {}: ad::Error after {:.1f} s: {}\n", c.rank(), secs, e.what());
    std::fflush(stdout);
    c.abort(3);
  }
  fmt::print("rank {}: FAIL no error although a rank died\n", c.rank());
}

// ---- a rank dies with collectives in flight: the error comes after one timeout ----
// (before, each in-flight collective unwound waited a timeout of its own). how:
// "work": both ranks post four async all-reduces of 8 MiB, then the last rank
// dies; "dp": the last rank joins the first three of DataParallel::backward's
// six buckets of 8 MiB, then dies. The survivor checks the error came within
// 3 x the timeout (before: at least 4 x) and a later collective is refused at once (the
// communicator is broken), then ends the job.
void kill_inflight(const ad::dist::Communicator& c, const std::string& how) {
  const int r = c.rank();
  const bool dies = r == c.size() - 1;
  const double timeout = std::chrono::duration<double>(c.options().timeout).count();
  ad::Rng rng(11);
  std::vector<ad::Parameter> ps;
  for (int i = 0; i < 6; ++i)
    ps.push_back(ad::Parameter::randn({1024, 1024}, rng, 0.03, ad::DType::f64, fmt::format("w{}", i)));
  ad::dist::DataParallel dp(c, ps, /*bucket_bytes=*/8 << 20);  // one parameter a bucket
  check(dp.buckets() == 6, "six buckets", c);
  auto t0 = std::chrono::steady_clock::now();
  auto since = [](auto t) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(); };
  try {
    std::vector<ad::Tensor> ts;
    std::vector<ad::dist::Communicator::Work> ws;  // unwound (waited for) before the catch
    if (how == "work") {
      for (int k = 0; k < 4; ++k) {
        ts.push_back(ad::Tensor::ones({1 << 20}, ad::DType::f64));
        ws.push_back(c.all_reduce_async(ts.back()));
      }
      if (dies) std::raise(SIGKILL);
      t0 = std::chrono::steady_clock::now();
      for (auto& w : ws) w.wait();
    } else {
      if (dies) {  // DataParallel's first three buckets: f64[1024 * 1024 + 1] (gradient, flag), mean
        for (int k = 0; k < 3; ++k) {
          ts.push_back(ad::Tensor::zeros({(1 << 20) + 1}, ad::DType::f64));
          ws.push_back(c.all_reduce_async(ts.back(), ad::dist::ReduceOp::mean));
        }
        std::raise(SIGKILL);
      }
      ad::Graph g;
      ad::Var h = g.input(ad::Tensor::randn({4, 1024}, rng, ad::DType::f64));
      for (const auto& q : ps) h = ad::tanh(ad::matmul(h, q));
      ad::Var loss = ad::mean(ad::mul(h, h));
      t0 = std::chrono::steady_clock::now();
      dp.backward(loss);
    }
    fmt::print("rank {}: FAIL no error although a rank died\n", r);
  } catch (const ad::Error& e) {
    const double secs = since(t0);
    auto t1 = std::chrono::steady_clock::now();
    const bool refused = throws_with([&] { c.barrier(); }, "an earlier collective on this communicator timed out");
    const double later = since(t1);
    check(secs <= 3 * timeout, fmt::format("the error came after {:.1f} s, over 3 x the timeout", secs), c);
    check(refused && later < timeout / 2, fmt::format("a later collective refused at once ({:.2f} s)", later), c);
    fmt::print("rank {}: ad::Error after {:.1f} s (timeout {:.0f} s): {}\n", r, secs, timeout, e.what());
    fmt::print("rank {}: kill_inflight {} {}\n", r, how, failures ? "FAILED" : "ok");
    std::fflush(stdout);
    c.abort(3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "collectives";
  try {
    ad::dist::Options opt;
    if (mode == "kill") opt.timeout = std::chrono::seconds(3);
    if (mode == "kill_inflight") opt.timeout = std::chrono::seconds(2);
    auto c = ad::dist::Communicator::from_env(opt);
    if (mode == "collectives") collectives(c);
    else if (mode == "train")
      train(c, argc > 2 ? std::atoi(argv[2]) : 50, argc > 3 ? argv[3] : "keep_all", argc > 4 ? argv[4] : "sgd",
            argc > 5 ? argv[5] : "");
    else if (mode == "kill") kill_one(c);
    else if (mode == "kill_inflight") kill_inflight(c, argc > 2 ? argv[2] : "work");
    else if (mode == "changed") changed(c);
    else { fmt::print("unknown mode {}\n", mode); return 2; }
    c.barrier();
  } catch (const ad::Error& e) {
    fmt::print("FAIL ad::Error: {}\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
}
