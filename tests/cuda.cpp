// The CUDA backend. On a machine without a GPU (or a build without CUDA) the
// error paths are tested and the GPU comparisons report themselves skipped.
// With a GPU, every gradcheck case whose op has a CUDA kernel is run on the
// GPU and compared with the CPU: forward values and every gradient, in f64
// and f32, plus predicted == measured peak on the device.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"
#include "ops/semiseparable_cpu.hpp"
#include "semicrf_accuracy.hpp"
#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

namespace {
bool gpu() {
  static const bool has = cuda::available();
  return has;
}
// Prints ctest's skip marker (see tests/CMakeLists.txt) with the reason.
bool skip_without_gpu() {
  if (gpu()) return false;
  std::printf("[ad-skip] %s\n", cuda::built() ? "no usable GPU on this machine" : "this build has no CUDA backend");
  return true;
}

// True when `op` and every op of its gradient graph have CUDA kernels.
bool all_cuda(const Var& v) {
  for (const Node& n : v.graph()->nodes)
    if (n.op != OpId::input && n.op != OpId::parameter && !op_def(n.op).cuda) return false;
  return true;
}

struct Run {
  Tensor out;
  std::vector<Tensor> grads;
  std::int64_t predicted = 0, measured = 0;
  bool covered = true;
};
// forward and d(sum(out * w))/d(inputs) on `dev`, inputs cast to `t`
Run run_case(const GradCase& c, Device dev, DType t, std::uint64_t seed) {
  Run r;
  PGraph g;
  std::vector<Var> vs, wrt;
  for (const auto& x : c.inputs) {
    Tensor y = x.dtype() == DType::f64 ? x.to(t) : x;
    vs.push_back(g.input(y.to(dev)));
    if (x.dtype() == DType::f64) wrt.push_back(vs.back());
  }
  Var out = c.build(vs);
  Rng wr(seed);
  // weights in the output's dtype: a case may end in a fixed dtype (cast chains end in f64 whatever t is)
  Var loss = sum(mul(out, g.input(Tensor::randn(out.shape(), wr, out.dtype()).to(dev))));
  auto grads = grad(loss, wrt);
  if (!all_cuda(loss)) {
    r.covered = false;
    return r;
  }
  std::vector<std::int32_t> targets{out.id()};
  for (auto& gv : grads) targets.push_back(gv.id());
  Schedule s = plan(g.impl(), targets, {}, policy::keep_all());
  RunStats st = execute(g.impl(), s);
  r.predicted = s.predicted_peak_bytes;
  r.measured = st.measured_peak_bytes;
  r.out = g.impl().node(out.id()).value.to(Device::cpu());
  for (auto& gv : grads) r.grads.push_back(g.impl().node(gv.id()).value.to(Device::cpu()));
  return r;
}
// Equal values with equal signs (so +0 vs -0 differs), any NaN equal to any NaN
// (the GPU may canonicalise NaN payloads in conversions): bitwise otherwise.
bool same_values(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector(), y = b.to_vector();
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    if (!(x[i] == y[i]) || std::signbit(x[i]) != std::signbit(y[i])) return false;
  }
  return true;
}
double max_rel(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector(), y = b.to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) != std::isnan(y[i])) return INFINITY;
    if (std::isnan(x[i]) || x[i] == y[i]) continue;
    worst = std::max(worst, std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i])));
  }
  return worst;
}
// f32 on the GPU against f32 on the CPU where the two add in different orders
// or fuse multiply-adds differently: each is measured against the CPU's f64
// result with `metric`, and the GPU's error may be at most 4 times the CPU's
// plus 1e-6. The GPU must be as accurate as the CPU, not reproduce its rounding.
bool f32_as_accurate(const Tensor& gpu, const Tensor& cpu, const Tensor& ref,
                     double (*metric)(const Tensor&, const Tensor&)) {
  const double eg = metric(gpu, ref), ec = metric(cpu, ref);
  INFO("f32 error against f64: GPU " << eg << ", CPU " << ec);
  CHECK(eg <= 4 * ec + 1e-6);
  return eg <= 4 * ec + 1e-6;
}
}  // namespace

TEST_CASE("cuda: asking for a GPU that is not there is a clear ad::Error") {
  if (gpu()) return;  // covered by the GPU tests below
  CHECK(cuda::device_count() == 0);
  CHECK_FALSE(cuda::available());
  Tensor x = Tensor::ones({2, 3});
  const char* why = cuda::built() ? "no usable GPU" : "no CUDA backend";
  CHECK_THROWS_WITH_AS(x.to(Device::cuda(0)), doctest::Contains(why), Error);
  CHECK_THROWS_WITH_AS(cuda::require(0), doctest::Contains(why), Error);
  if (cuda::built()) CHECK_THROWS_AS(cuda::memory_stats(0), Error);
  CHECK_THROWS_AS(Tensor::empty({4}, DType::f32, Device::cuda(0)), Error);
  CHECK(x.to(Device::cpu()).to_vector() == std::vector<double>(6, 1.0));
  dist::Options o;
  o.backend = dist::Backend::nccl;
  CHECK_THROWS_WITH_AS(dist::Communicator::from_env(o), doctest::Contains(dist::have_nccl() ? why : "no NCCL backend"),
                       Error);
}

TEST_CASE("cuda: inputs on different devices are an ad::Error naming both") {
  // checked for every op when a node is built (make_node), from the metas: no GPU needed. Nodes that only
  // claim a GPU (never run). Model parameters, lengths (semicrf, attention's key_lengths) and indices were
  // once let through by the ops' own checks.
  Graph g;
  auto claim = [&g](Meta m) {
    Node fake;
    fake.op = OpId::input;
    fake.meta = std::move(m);
    return Var{&g.impl(), g.impl().add_node(fake)};
  };
  Var a = g.input(Tensor::zeros({2, 3})), b = claim(Meta{{2, 3}, DType::f32, Device::cuda(1)});
  EXPECT_ERROR(add(a, b), "add", "inputs on different devices", "a f32[2,3]", "b f32[2,3]@cuda:1");
  // indices too: a kernel reads them where it runs
  Var x = claim(Meta{{5, 3}, DType::f32, Device::cuda(0)}), ids = g.input(Tensor::zeros({4}, DType::i64));
  EXPECT_ERROR(gather(x, ids, 0), "gather: inputs on different devices", "index i64[4]");
  Var gpu_lengths = claim(Meta{{2}, DType::i64, Device::cuda(0)});
  Var scores = g.input(Tensor::zeros({2, 4, 3}));
  EXPECT_ERROR(semicrf_cumulative(scores, gpu_lengths), "semicrf_cumulative", "inputs on different devices",
               "scores f32[2,4,3]", "L i64[2]@cuda:0");
  Var q = g.input(Tensor::zeros({2, 1, 4, 8}));
  AttentionOptions opt;
  opt.key_lengths = gpu_lengths;
  EXPECT_ERROR(attention(q, q, q, opt), "attention", "inputs on different devices", "i64[2]@cuda:0");
  // semiseparable: one coefficient on another device
  Var xs = g.input(Tensor::zeros({1, 8, 2})), d = g.input(Tensor::zeros({8})), e = g.input(Tensor::zeros({7}));
  Var u = g.input(Tensor::zeros({8, 2})), v = claim(Meta{{8, 2}, DType::f32, Device::cuda(0)});
  EXPECT_ERROR(semiseparable_matvec(xs, d, e, e, u, v), "semiseparable_matvec", "inputs on different devices",
               "f32[8,2]@cuda:0");
}

// Every op a graph can compute (one with a CPU kernel) has a CUDA kernel
// too; the executor's "no CUDA kernel for this op yet" error is left for ops
// added later. Dtype- and size-specific refusals are tested with their ops.
TEST_CASE("cuda: every op with a CPU kernel has a CUDA kernel") {
  if (!cuda::built()) {
    std::printf("[ad-skip] this build has no CUDA backend\n");
    return;
  }
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& def = op_def(static_cast<OpId>(i));
    INFO(def.name);
    if (def.cpu) CHECK(static_cast<bool>(def.cuda));
  }
}

TEST_CASE("cuda: dropout draws the same mask as the CPU, bit for bit") {
  if (skip_without_gpu()) return;
  Rng rng(31);
  for (DType t : {DType::f32, DType::f64}) {
    Tensor x = Tensor::randn({37, 129}, rng, t);  // odd sizes: counters not aligned to Philox blocks of 4
    for (std::uint64_t offset : {0ull, 3ull, 1000001ull}) {
      Graph gc, gg;
      Tensor cpu = eval(dropout(gc.input(x), 0.4, 1234, offset));
      Tensor gpu = eval(dropout(gg.input(x.to(Device::cuda(0))), 0.4, 1234, offset)).to(Device::cpu());
      REQUIRE(gpu.nbytes() == cpu.nbytes());
      CHECK(std::memcmp(gpu.raw(), cpu.raw(), cpu.nbytes()) == 0);
      auto v = cpu.to_vector();
      auto kept = std::count_if(v.begin(), v.end(), [](double e) { return e != 0; });
      CHECK(kept > 0);
      CHECK(kept < static_cast<long>(v.size()));
    }
  }
}

TEST_CASE("cuda: an index out of range on the GPU is an ad::Error naming the op and the index") {
  if (skip_without_gpu()) return;
  Device dev = Device::cuda(0);
  Rng rng(41);
  Tensor table = Tensor::randn({5, 3}, rng).to(dev);
  std::vector<std::int64_t> ids{1, 4, 7, 0, -2};  // position 2 is the first bad one
  Tensor bad = Tensor::from(ids, {5}).to(dev);
  {
    Graph g;
    CHECK_THROWS_WITH_AS(eval(embedding(g.input(table), g.input(bad))),
                         doctest::Contains("gather: index 7 at position 2 out of range [0, 5)"), Error);
  }
  {
    Graph g;
    Attrs at;
    at.shape = Shape{5, 3};
    Var dy = g.input(Tensor::randn({5, 3}, rng).to(dev));
    CHECK_THROWS_WITH_AS(eval(make_node(OpId::gather_backward, {dy, g.input(bad)}, at)),
                         doctest::Contains("gather_backward: index 7 at position 2 out of range [0, 5)"), Error);
  }
  {
    Graph g;
    std::vector<std::int64_t> labels{0, 2, 1, 3, 5};  // C = 3: position 3 is the first bad one
    Var logits = g.input(Tensor::randn({5, 3}, rng).to(dev));
    CHECK_THROWS_WITH_AS(eval(cross_entropy(logits, g.input(Tensor::from(labels, {5}).to(dev)))),
                         doctest::Contains("cross_entropy: label 3 at position 3 out of range [0, 3)"), Error);
  }
  // the device is still usable afterwards (no sticky error): a good index works
  {
    Graph g;
    std::vector<std::int64_t> good{4, 0, 4};
    Tensor out = eval(embedding(g.input(table), g.input(Tensor::from(good, {3}).to(dev)))).to(Device::cpu());
    Tensor ref = table.to(Device::cpu());
    auto o = out.to_vector(), r = ref.to_vector();
    for (int j = 0; j < 3; ++j) {
      CHECK(o[static_cast<std::size_t>(j)] == r[static_cast<std::size_t>(12 + j)]);
      CHECK(o[static_cast<std::size_t>(3 + j)] == r[static_cast<std::size_t>(j)]);
    }
  }
}

TEST_CASE("cuda: every op with a CUDA kernel matches the CPU, forward and gradients") {
  if (skip_without_gpu()) return;
  const auto cases = gradcheck_cases();
  int compared = 0, uncovered = 0;
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const GradCase& c = cases[k];
    if (!op_def(c.op).cuda) continue;
    INFO(fmt::format("{} {}", op_name(c.op), c.label));
    for (DType t : {DType::f64, DType::f32}) {
      Run cpu = run_case(c, Device::cpu(), t, 500 + k);
      Run gpu_run = run_case(c, Device::cuda(0), t, 500 + k);
      if (!gpu_run.covered) {
        ++uncovered;
        continue;
      }
      double tol = t == DType::f64 ? 1e-10 : 1e-5;
      CHECK(max_rel(gpu_run.out, cpu.out) <= tol);
      REQUIRE(gpu_run.grads.size() == cpu.grads.size());
      for (std::size_t i = 0; i < cpu.grads.size(); ++i) CHECK(max_rel(gpu_run.grads[i], cpu.grads[i]) <= tol);
      CHECK(gpu_run.measured == gpu_run.predicted);
      ++compared;
    }
  }
  MESSAGE(fmt::format("{} case x dtype runs compared with the CPU; {} skipped (an op of their gradient graph has no "
                      "CUDA kernel yet)", compared, uncovered));
  CHECK(compared > 0);
}

// The gradcheck cases are tiny; these shapes give the kernels' threads several
// elements, chunks and columns each (gather_backward: > 256 index positions
// and > 256 columns; max: runs of several elements, ties, -0 and NaN; sums of
// more partials than threads). Ops whose GPU kernel does the CPU's arithmetic
// in the CPU's order are compared bit for bit.
TEST_CASE("cuda: larger shapes match the CPU (bitwise where the order is the CPU's)") {
  if (skip_without_gpu()) return;
  Rng rng(51);
  std::vector<std::int64_t> ids(1000);
  for (auto& v : ids) v = static_cast<std::int64_t>(rng.reserve(1) * 7919 % 37);  // many repeats of 37 values
  // ties everywhere (small integers), signed zeros, a NaN row
  std::vector<double> tv(3 * 700);
  for (std::size_t i = 0; i < tv.size(); ++i) tv[i] = std::floor(randn64({1}, rng).item() * 2);
  for (std::size_t i = 0; i < 700; ++i) tv[i] = i % 2 ? 0.0 : -0.0;
  tv[1400 + 333] = NAN;
  Tensor ties = Tensor::from(tv, {3, 700});
  struct Big {
    GradCase c;
    bool bitwise;
  };
  std::vector<Big> big;
  auto add = [&](OpId op, std::string label, std::vector<Tensor> in, std::function<Var(const std::vector<Var>&)> f,
                 bool bitwise) { big.push_back({GradCase{op, std::move(label), std::move(in), std::move(f)}, bitwise}); };
  add(OpId::gather, "embedding [37,300] ids [1000]", {randn64({37, 300}, rng), index(ids, {1000})},
      [](const std::vector<Var>& v) { return embedding(v[0], v[1]); }, true);
  add(OpId::gather, "gather [4,37,3] axis 1 ids [1000]", {randn64({4, 37, 3}, rng), index(ids, {1000})},
      [](const std::vector<Var>& v) { return gather(v[0], v[1], 1); }, true);
  add(OpId::max, "max ties [3,700] axis 1", {ties}, [](const std::vector<Var>& v) { return max(v[0], {1}); }, true);
  add(OpId::max, "max ties [3,700] axis 0", {ties}, [](const std::vector<Var>& v) { return max(v[0], {0}); }, true);
  add(OpId::max, "max [6,50,40] axes (0, 2)", {randn64({6, 50, 40}, rng)},
      [](const std::vector<Var>& v) { return max(v[0], {0, 2}, true); }, true);
  add(OpId::permute, "permute [3,4,5,6] (2,0,3,1)", {randn64({3, 4, 5, 6}, rng)},
      [](const std::vector<Var>& v) { return permute(v[0], {2, 0, 3, 1}); }, true);
  add(OpId::concat, "concat [5,70,3] [5,1,3] axis 1", {randn64({5, 70, 3}, rng), randn64({5, 1, 3}, rng)},
      [](const std::vector<Var>& v) { return slice(concat({v[0], v[1]}, 1), 1, 3, 60); }, true);
  add(OpId::dropout, "dropout [300,301]", {randn64({300, 301}, rng)},
      [](const std::vector<Var>& v) { return dropout(v[0], 0.25, 5, 17); }, true);
  add(OpId::layer_norm, "layer_norm [300,257]", {randn64({300, 257}, rng), randn64({257}, rng), randn64({257}, rng)},
      [](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2]); }, false);
  add(OpId::rms_norm, "rms_norm [300,257]", {randn64({300, 257}, rng), randn64({257}, rng)},
      [](const std::vector<Var>& v) { return rms_norm(v[0], v[1]); }, false);
  std::vector<std::int64_t> labels(700);
  for (auto& v : labels) v = static_cast<std::int64_t>(rng.reserve(1) * 31 % 11);
  add(OpId::cross_entropy, "cross_entropy [700,11]", {randn64({700, 11}, rng), index(labels, {700})},
      [](const std::vector<Var>& v) { return cross_entropy(v[0], v[1]); }, false);
  // sums in parts on the GPU (f64 partials in the op's workspace: ops/sum_layout.hpp)
  add(OpId::sum, "sum [3,70000] axis 1", {randn64({3, 70000}, rng)},
      [](const std::vector<Var>& v) { return sum(v[0], {1}); }, false);
  add(OpId::sum, "sum [5000,7] axis 0", {randn64({5000, 7}, rng)},
      [](const std::vector<Var>& v) { return sum(v[0], {0}); }, false);
  add(OpId::mean, "mean [200,300] all", {randn64({200, 300}, rng)},
      [](const std::vector<Var>& v) { return mean(v[0], {0, 1}); }, false);
  add(OpId::sum_to, "sum_to [4,3000,5] -> [5]", {randn64({4, 3000, 5}, rng)},
      [](const std::vector<Var>& v) { return sum_to(v[0], {5}); }, false);
  add(OpId::sum, "sum [40,6,300] axes (0, 2)", {randn64({40, 6, 300}, rng)},  // not [O][R][I]: one block per output
      [](const std::vector<Var>& v) { return sum(v[0], {0, 2}); }, false);
  add(OpId::mse, "mse [3,5000] sum", {randn64({3, 5000}, rng), randn64({3, 5000}, rng)},
      [](const std::vector<Var>& v) { return mse(v[0], v[1], Reduction::sum); }, false);
  // conv2d over several chunks of images (64 MiB of columns each: 14 images in f64, 28 in f32), grouped
  Conv2dOptions co;
  co.padding = {1, 1};
  co.groups = 2;
  add(OpId::conv2d, "conv2d [36,64,32,32] x [32,32,3,3] groups 2, chunks", {randn64({36, 64, 32, 32}, rng),
      randn64({32, 32, 3, 3}, rng, 0, 0.1)}, [co](const std::vector<Var>& v) { return conv2d(v[0], v[1], co); }, false);
  Pool2dOptions po;
  po.kernel = {3, 3}, po.stride = {2, 2}, po.padding = {1, 1};
  add(OpId::max_pool2d, "max_pool2d [8,16,33,31] 3x3 stride 2", {distinct({8, 16, 33, 31}, rng, 1e-3)},
      [po](const std::vector<Var>& v) { return max_pool2d(v[0], po); }, true);
  for (std::size_t k = 0; k < big.size(); ++k) {
    const GradCase& c = big[k].c;
    Run ref;  // the CPU's f64 run: the reference for the f32 runs that are not bitwise
    for (DType t : {DType::f64, DType::f32}) {
      INFO(fmt::format("{} {}", c.label, dtype_name(t)));
      Run cpu = run_case(c, Device::cpu(), t, 900 + k), gpu_run = run_case(c, Device::cuda(0), t, 900 + k);
      REQUIRE(gpu_run.covered);
      REQUIRE(gpu_run.grads.size() == cpu.grads.size());
      if (t == DType::f64) ref = cpu;
      std::vector<std::pair<Tensor*, Tensor*>> pairs{{&gpu_run.out, &cpu.out}};
      for (std::size_t i = 0; i < cpu.grads.size(); ++i) pairs.push_back({&gpu_run.grads[i], &cpu.grads[i]});
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        auto [g, h] = pairs[i];
        const std::string what = i == 0 ? std::string("output") : fmt::format("gradient of input {}", i - 1);
        INFO(what);
        REQUIRE(g->nbytes() == h->nbytes());
        if (big[k].bitwise) CHECK(same_values(*g, *h));
        else if (t == DType::f64) CHECK(max_rel(*g, *h) <= 1e-10);
        else f32_as_accurate(*g, *h, i == 0 ? ref.out : ref.grads[i - 1], max_rel);
      }
      CHECK(gpu_run.measured == gpu_run.predicted);
    }
  }
}

// Largest |a - b| over largest |b|: the semiseparable ops sum thousands of
// rows in a different order on the GPU (cuBLAS, chunk sums), so single
// entries near zero are not compared relative to themselves.
namespace {
double max_rel_to_max(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector(), y = b.to_vector();
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) != std::isnan(y[i])) return INFINITY;
    worst = std::max(worst, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return worst / std::max(scale, 1e-300);
}
// One case on the GPU against the CPU, each value measured relative to the
// largest: in f64 the output and every gradient within 1e-10 of the CPU's; in
// f32 within 1e-5 of the CPU's or as accurate as the CPU's against the CPU's
// f64 result (f32_as_accurate's bound: an ill-conditioned tridiagonal system
// at N = 5,000 puts both near 1e-5);
// predicted == measured peak on the device; grads >= 0: the number of
// gradients both must have.
void check_gpu_matches_cpu(const GradCase& c, DType t, std::uint64_t seed, std::ptrdiff_t grads = -1) {
  Run cpu = run_case(c, Device::cpu(), t, seed), gpu_run = run_case(c, Device::cuda(0), t, seed);
  REQUIRE(gpu_run.covered);
  REQUIRE(gpu_run.grads.size() == cpu.grads.size());
  if (grads >= 0) REQUIRE(cpu.grads.size() == static_cast<std::size_t>(grads));
  if (t == DType::f64) {
    CHECK(max_rel_to_max(gpu_run.out, cpu.out) <= 1e-10);
    for (std::size_t i = 0; i < cpu.grads.size(); ++i) {
      INFO("gradient of input " << i);
      CHECK(max_rel_to_max(gpu_run.grads[i], cpu.grads[i]) <= 1e-10);
    }
  } else {
    const Run ref = run_case(c, Device::cpu(), DType::f64, seed);
    REQUIRE(ref.grads.size() == cpu.grads.size());
    auto near = [](const Tensor& g, const Tensor& h, const Tensor& f) {
      const double d = max_rel_to_max(g, h), eg = max_rel_to_max(g, f), ec = max_rel_to_max(h, f);
      INFO("GPU - CPU " << d << "; f32 error against f64: GPU " << eg << ", CPU " << ec);
      CHECK((d <= 1e-5 || eg <= 4 * ec + 1e-6));
    };
    near(gpu_run.out, cpu.out, ref.out);
    for (std::size_t i = 0; i < cpu.grads.size(); ++i) {
      INFO("gradient of input " << i);
      near(gpu_run.grads[i], cpu.grads[i], ref.grads[i]);
    }
  }
  CHECK(gpu_run.measured == gpu_run.predicted);
}
}  // namespace

// semiseparable_matvec (causal and not; r = 8 and r = 20, which takes two
// register blocks of the state), tridiag_solve and tridiag_resolvent_diag (real and complex shifts) at
// N in the thousands, several chunks with a partial last one: forward and
// every gradient on the GPU against the CPU (f64 <= 1e-10, f32 <= 1e-5 of the
// largest value), predicted == measured peak on the device.
TEST_CASE("cuda: semiseparable and tridiagonal ops at large N match the CPU") {
  if (skip_without_gpu()) return;
  Rng rng(77);
  std::vector<GradCase> cases;
  struct M { std::int64_t B, N, D, r, chunk; bool causal; };
  const M ms[] = {{2, 3000, 16, 8, 0, false}, {2, 3000, 16, 8, 0, true},   {1, 2500, 16, 20, 0, true},
                  {1, 2500, 16, 20, 0, false}, {3, 2049, 20, 8, 300, true}, {2, 1500, 5, 3, 256, false},
                  // r = 32 with D = 1 (the widest state, the most chunks per block); r = 40 (past the
                  // tiled kernels: the generic sweeps)
                  {1, 3000, 1, 32, 0, true},    {2, 1100, 3, 40, 0, true},   {2, 1100, 3, 40, 0, false},
                  // r = 28, D = 3, full: in f64 the rows kernel's plan is over 48 KB (tests/gpu_plans.cpp), so
                  // the first tiled kernel runs (added after the last GPU run: not yet run on one)
                  {1, 1200, 3, 28, 0, false},
                  // the staged kernels (f32, D % 4 == 0): odd r, the widest D and r they take, fewer rows than
                  // one tile
                  {2, 1777, 12, 5, 0, false},   {2, 1777, 12, 5, 0, true},  {1, 1030, 64, 32, 0, false},
                  {1, 1030, 64, 32, 0, true},   {1, 70, 4, 1, 0, false},    {1, 70, 4, 1, 0, true},
                  // the one-pass causal kernel (D a power of two from 8): odd r, D = 8 and 32, many chunks
                  {2, 5000, 8, 7, 0, true},     {1, 3000, 32, 3, 0, true},  {1, 9000, 16, 22, 0, true},
                  // many chunks in three batches: the look-back stops at each batch's first chunk
                  {3, 20000, 16, 22, 0, true},
                  // more than 32 clusters of 8 chunks (variants 5 and 6): the clusters' look-back crosses
                  // windows of 32; the last cluster padded
                  {1, 131149, 16, 22, 0, true},
                  // odd r past a multiple of 8 at D = 16, r = 1 at D = 8 (its plan takes more shared memory
                  // than r = 3 and 4, which share its kernel: the clusters' launch once failed here)
                  {2, 1001, 16, 17, 0, true},   {1, 777, 8, 1, 0, true}};
  for (const M& m : ms) {
    const bool causal = m.causal;
    const std::int64_t chunk = m.chunk;
    cases.push_back({OpId::semiseparable_matvec,
                     fmt::format("x[{},{},{}] r {} chunk {}{}", m.B, m.N, m.D, m.r, chunk, causal ? " causal" : ""),
                     {randn64({m.B, m.N, m.D}, rng), randn64({m.N}, rng), randn64({m.N - 1}, rng),
                      randn64({m.N - 1}, rng), randn64({m.N, m.r}, rng, 0, 0.1), randn64({m.N, m.r}, rng, 0, 0.1)},
                     [causal, chunk](const std::vector<Var>& v) {
                       Attrs at;
                       at.causal = causal;
                       at.start = chunk;
                       return make_node(OpId::semiseparable_matvec, {v[0], v[1], v[2], v[3], v[4], v[5]}, at);
                     }});
  }
  cases.push_back({OpId::tridiag_solve, "b [2,5000,7]",
                   {randn64({5000}, rng, 4.0), randn64({4999}, rng), randn64({4999}, rng), randn64({2, 5000, 7}, rng)},
                   [](const std::vector<Var>& v) { return tridiag_solve(v[0], v[1], v[2], v[3]); }});
  cases.push_back({OpId::tridiag_solve, "b [4000]",
                   {randn64({4000}, rng, 4.0), randn64({3999}, rng), randn64({3999}, rng), randn64({4000}, rng)},
                   [](const std::vector<Var>& v) { return tridiag_solve(v[0], v[1], v[2], v[3]); }});
  cases.push_back({OpId::tridiag_resolvent_diag, "N 3000 z [5]",
                   {randn64({3000}, rng, 2.5), randn64({2999}, rng, 0, 0.7), randn64({2999}, rng, 0, 0.7),
                    uniform64({5}, rng, -0.5, 0.5)},
                   [](const std::vector<Var>& v) { return tridiag_resolvent_diag(v[0], v[1], v[2], v[3]); }});
  cases.push_back({OpId::tridiag_resolvent_diag_complex, "N 3000 z [4,2]",
                   {randn64({3000}, rng, 2.5), randn64({2999}, rng, 0, 0.7), randn64({2999}, rng, 0, 0.7),
                    uniform64({4, 2}, rng, -0.5, 0.5)},
                   [](const std::vector<Var>& v) { return tridiag_resolvent_diag_complex(v[0], v[1], v[2], v[3]); }});
  // the matvec's forward on the GPU has several sets of kernels (semisep::set_gpu_matvec_variant: the
  // default, the first tiled, the warp-level, the staged ones, those with bulk copies, the causal product in
  // clusters of 8 and 4 chunks, in rounds): all run
  for (int variant : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
    const int was = semisep::set_gpu_matvec_variant(variant);
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const GradCase& c = cases[k];
      if (variant != 0 && c.op != OpId::semiseparable_matvec) continue;
      for (DType t : {DType::f64, DType::f32}) {
        INFO(fmt::format("{} {} {} (GPU matvec kernels {})", op_name(c.op), c.label, dtype_name(t), variant));
        check_gpu_matches_cpu(c, t, 700 + k);
      }
    }
    semisep::set_gpu_matvec_variant(was);
  }
}

TEST_CASE("cuda: semiseparable and tridiagonal errors on the GPU") {
  if (skip_without_gpu()) return;
  const Device dev = Device::cuda(0);
  Rng rng(78);
  {  // a zero pivot at row 1: d_1 - lo_0 up_0 / d_0 = 1 - 1 = 0
    Graph g;
    Var y = tridiag_solve(g.input(Tensor::full({3}, 1.0).to(dev)), g.input(Tensor::full({2}, 1.0).to(dev)),
                          g.input(Tensor::full({2}, 1.0).to(dev)), g.input(Tensor::randn({3, 2}, rng).to(dev)));
    CHECK_THROWS_WITH_AS(eval(y), doctest::Contains("tridiag_solve: zero or non-finite pivot 0 at row 1"), Error);
  }
  {  // bf16 U, V run on the CPU only
    Graph g;
    Var y = semiseparable_matvec(g.input(Tensor::randn({1, 6, 2}, rng).to(dev)), g.input(Tensor::randn({6}, rng).to(dev)),
                                 g.input(Tensor::randn({5}, rng).to(dev)), g.input(Tensor::randn({5}, rng).to(dev)),
                                 g.input(Tensor::randn({6, 2}, rng).to(DType::bf16).to(dev)),
                                 g.input(Tensor::randn({6, 2}, rng).to(DType::bf16).to(dev)));
    CHECK_THROWS_WITH_AS(eval(y), doctest::Contains("semiseparable_matvec: no CUDA kernel for u, v of dtype bf16"),
                         Error);
  }
  {  // the device works afterwards
    Graph g;
    Tensor b = Tensor::randn({4}, rng);
    Tensor y = eval(tridiag_solve(g.input(Tensor::full({4}, 2.0).to(dev)), g.input(Tensor::zeros({3}).to(dev)),
                                  g.input(Tensor::zeros({3}).to(dev)), g.input(b.to(dev))))
                   .to(Device::cpu());
    auto yv = y.to_vector(), bv = b.to_vector();
    for (std::size_t i = 0; i < 4; ++i) CHECK(yv[i] == bv[i] / 2);
  }
}

// semiseparable_solve (Woodbury, src/cuda/semiseparable.cu; compiled, not run
// on a GPU when written): forward and the gradients of all six inputs on the
// GPU against the CPU, f64 (<= 1e-10) and f32 (<= 1e-5) of the largest value,
// predicted == measured peak on the device (the op reports its GPU workspace).
// r = 1, 3, 8 and 20 (20 > the sweep's 16 register rows), B > 1, D > 1 and
// D = 1, several chunks. T is strictly diagonally dominant (|d| >= 3 >
// |lo| + |up|) and U, V small, so H and the capacitance matrix are well
// conditioned and f32 rounding is not amplified.
TEST_CASE("cuda: semiseparable_solve matches the CPU, forward and every gradient") {
  if (skip_without_gpu()) return;
  Rng rng(79);
  struct M { std::int64_t B, N, D, r, chunk; };
  const M ms[] = {{2, 3000, 16, 8, 0}, {3, 2049, 5, 20, 300}, {2, 1500, 3, 1, 256},
                  {1, 700, 1, 3, 0},   {4, 257, 33, 20, 0},   {2, 1, 4, 1, 0}};
  for (std::size_t k = 0; k < std::size(ms); ++k) {
    const M& m = ms[k];
    const std::int64_t chunk = m.chunk;
    GradCase c{OpId::semiseparable_solve, fmt::format("x[{},{},{}] r {} chunk {}", m.B, m.N, m.D, m.r, chunk),
               {randn64({m.B, m.N, m.D}, rng), uniform64({m.N}, rng, 3, 5), uniform64({m.N - 1}, rng, -1, 1),
                uniform64({m.N - 1}, rng, -1, 1), randn64({m.N, m.r}, rng, 0, 0.1), randn64({m.N, m.r}, rng, 0, 0.1)},
               [chunk](const std::vector<Var>& v) {
                 Attrs at;
                 at.start = chunk;
                 return make_node(OpId::semiseparable_solve, {v[0], v[1], v[2], v[3], v[4], v[5]}, at);
               }};
    for (DType t : {DType::f64, DType::f32}) {
      INFO(fmt::format("{} {}", c.label, dtype_name(t)));
      check_gpu_matches_cpu(c, t, 800 + k, 6);
    }
  }
}

// A zero Thomas pivot and a singular capacitance matrix raise, on the GPU,
// the very ad::Error the CPU raises (forward, and the backward op run
// directly); bf16 U, V are refused at graph build on any device; the device
// works afterwards.
TEST_CASE("cuda: semiseparable_solve errors on the GPU are the CPU's") {
  if (skip_without_gpu()) return;
  auto ones = [](std::int64_t n) { return Tensor::full({n}, 1.0, DType::f64); };
  auto zeros = [](std::int64_t n) { return Tensor::zeros({n}, DType::f64); };
  Tensor eu = Tensor::zeros({5, 1}, DType::f64), ev = Tensor::zeros({5, 1}, DType::f64);
  eu.data<double>()[0] = 1;
  ev.data<double>()[0] = -1;
  Tensor half = Tensor::full({5, 1}, 0.5, DType::f64), x = Tensor::full({2, 5, 3}, 1.0, DType::f64);
  struct Bad {
    const char* what;
    std::vector<Tensor> in;  // x (or y), t_diag, t_upper, t_lower, u, v
    const char* expect;
  };
  // T = tridiag(1, 1, 1): pivots 1, 0 -> row 1; T = I, U = e_0, V = -e_0: I + V^T T^-1 U = 0
  const Bad bads[] = {{"zero pivot", {x, ones(5), ones(4), ones(4), half, half}, "at row 1"},
                      {"singular capacitance", {x, ones(5), zeros(4), zeros(4), eu, ev}, "capacitance"}};
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  for (const Bad& b : bads) {
    for (DType t : {DType::f64, DType::f32}) {
      for (bool backward : {false, true}) {
        INFO(b.what << " " << dtype_name(t) << (backward ? " backward" : " forward"));
        std::string msg[2];
        for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
          const Device dev = on_gpu ? Device::cuda(0) : Device::cpu();
          msg[on_gpu] = message([&] {
            Graph g;
            std::vector<Var> v;
            for (const Tensor& a : b.in) v.push_back(g.input(a.to(t).to(dev)));
            if (!backward) {
              eval(semiseparable_solve(v[0], v[1], v[2], v[3], v[4], v[5]));
            } else {  // (t_diag, t_upper, t_lower, u, v, y, dy), y = dy = x
              eval(make_node(OpId::semiseparable_solve_backward, {v[1], v[2], v[3], v[4], v[5], v[0], v[0]}));
            }
          });
        }
        CHECK(msg[0].find("semiseparable_solve: ") != std::string::npos);
        CHECK(msg[0].find(b.expect) != std::string::npos);
        CHECK(msg[1] == msg[0]);
      }
    }
  }
  Rng rng(80);
  const Device dev = Device::cuda(0);
  {  // bf16 U, V: the solve has no mixed-precision form on any device
    Graph g;
    CHECK_THROWS_WITH_AS(semiseparable_solve(g.input(Tensor::randn({1, 6, 2}, rng).to(dev)),
                                             g.input(Tensor::randn({6}, rng).to(dev)),
                                             g.input(Tensor::randn({5}, rng).to(dev)),
                                             g.input(Tensor::randn({5}, rng).to(dev)),
                                             g.input(Tensor::randn({6, 2}, rng).to(DType::bf16).to(dev)),
                                             g.input(Tensor::randn({6, 2}, rng).to(DType::bf16).to(dev))),
                         doctest::Contains("semiseparable_solve: dtype mismatch: u and v must have x's dtype"),
                         Error);
  }
  {  // the device works afterwards: T = 2 I, U V^T = 0 -> y = x / 2
    Graph g;
    Tensor xb = Tensor::randn({1, 4, 2}, rng);
    Tensor y = eval(semiseparable_solve(g.input(xb.to(dev)), g.input(Tensor::full({4}, 2.0).to(dev)),
                                        g.input(Tensor::zeros({3}).to(dev)), g.input(Tensor::zeros({3}).to(dev)),
                                        g.input(Tensor::zeros({4, 1}).to(dev)), g.input(Tensor::zeros({4, 1}).to(dev))))
                   .to(Device::cpu());
    auto yv = y.to_vector(), xv = xb.to_vector();
    for (std::size_t i = 0; i < yv.size(); ++i) CHECK(yv[i] == xv[i] / 2);
  }
}

// Semi-Markov CRF (src/cuda/semicrf.cu) against the CPU kernels, f64 and f32,
// both paths, awkward sizes: C = 5 and 3 (not powers of two), K > T, windows
// longer than a warp, several checkpoint intervals and ring laps, variable
// lengths in one batch, -inf (forbidden) transitions and durations, and a
// sequence with no allowed segmentation. logZ and all its gradients, the
// score of the Viterbi segmentation and its gradients, predicted == measured
// peak on the device; marginals; Viterbi segments exactly (its arithmetic is
// f64 with the CPU's expressions); the cumulative helper and its gradient.
// Tolerances (largest |difference| over the largest |value|): f64 1e-9;
// f32: the GPU's error against the CPU's f64 at most 4x the CPU f32's plus
// 1e-3. The f32 rings keep each slot's rounding error as a bf16 low part
// (the CPU since 2026-11-26; the GPU since 2026-11-27, not yet run: the
// plain f32 rings' errors here were about 1e-4 of the largest value); the
// next test holds both to the CPU's own f32 accuracy at a large K.
namespace {
struct CrfCase {
  std::int64_t B, T, K, C;
  bool general;
  std::vector<std::int64_t> L;
  bool forbid;  // -inf entries in Tr and D
};
std::vector<Tensor> crf_inputs(const CrfCase& c, Rng& rng) {
  std::vector<double> x = randn64({c.B, c.T, c.C}, rng).to_vector(), S(static_cast<std::size_t>(c.B * (c.T + 1) * c.C));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t k = 0; k < c.C; ++k)
        S[static_cast<std::size_t>((b * (c.T + 1) + t + 1) * c.C + k)] =
            S[static_cast<std::size_t>((b * (c.T + 1) + t) * c.C + k)] + x[static_cast<std::size_t>((b * c.T + t) * c.C + k)];
  Shape trs = c.general ? Shape{c.K, c.C, c.C} : Shape{c.C, c.C};
  std::vector<double> tr = randn64(trs, rng, 0, 0.7).to_vector(), d = randn64({c.K, c.C}, rng, 0, 0.7).to_vector();
  if (c.forbid) {
    for (std::size_t i = 0; i < tr.size(); i += 4) tr[i] = -INFINITY;  // some transitions (incl. c -> c for C = 5)
    for (std::int64_t k = 0; k < c.C; ++k) d[static_cast<std::size_t>(k)] = -INFINITY;  // no segment of length 1
  }
  return {Tensor::from(S, {c.B, c.T + 1, c.C}), Tensor::from(tr, trs), Tensor::from(d, {c.K, c.C}),
          randn64({c.C}, rng, 0, 0.7), index(c.L, {c.B})};
}
}  // namespace

TEST_CASE("cuda: semi-Markov CRF ops match the CPU") {
  if (skip_without_gpu()) return;
  const Device dev = Device::cuda(0);
  const CrfCase cases[] = {
      {3, 7, 10, 5, false, {7, 3, 1}, false},     // K > T, L = 1
      {3, 7, 10, 5, true, {7, 4, 2}, false},      // the same, Tr (K, C, C)
      {2, 300, 17, 3, false, {300, 151}, false},  // several intervals (I = 71), ring laps
      {2, 60, 9, 4, true, {60, 33}, true},        // general path, forbidden entries
      {2, 2000, 300, 5, false, {2000, 1299}, false},  // windows of 300 (> 32 lanes), I = 774
      {1, 700, 40, 5, true, {700}, false},        // general path, several intervals
      {2, 50, 6, 5, false, {50, 17}, true},       // fast path, forbidden entries
  };
  Rng rng(90);
  for (std::size_t n = 0; n < std::size(cases); ++n) {
    const CrfCase& cc = cases[n];
    std::vector<Tensor> in = crf_inputs(cc, rng);
    Run ref;        // the CPU's f64 run: the reference for f32
    Tensor ref_m;   // the CPU's f64 marginals
    for (DType t : {DType::f64, DType::f32}) {
      INFO(fmt::format("case {}: B={} T={} K={} C={}{}{} {}", n, cc.B, cc.T, cc.K, cc.C, cc.general ? " general" : "",
                       cc.forbid ? " forbidden" : "", dtype_name(t)));
      const bool f64 = t == DType::f64;
      // f64: the GPU within 1e-9 of the CPU; f32: as accurate as the CPU's f32 against the CPU's f64 (the
      // log-space sums over windows of K terms round differently in another order)
      auto close = [&](const Tensor& g, const Tensor& c, const Tensor& r) {
        if (f64) {
          CHECK(max_rel_to_max(g, c) <= 1e-9);
        } else {
          const double eg = max_rel_to_max(g, r), ec = max_rel_to_max(c, r);
          INFO("f32 error against f64: GPU " << eg << ", CPU " << ec);
          CHECK(eg <= 4 * ec + 1e-3);
        }
      };
      // logZ and its gradients
      GradCase lz{OpId::semicrf_logz, "logz", in,
                  [](const std::vector<Var>& v) { return semicrf_logz(v[0], v[1], v[2], v[3], v[4]); }};
      Run cpu = run_case(lz, Device::cpu(), t, 60 + n), gpu_run = run_case(lz, dev, t, 60 + n);
      REQUIRE(gpu_run.covered);
      REQUIRE(gpu_run.grads.size() == cpu.grads.size());
      if (f64) ref = cpu;
      close(gpu_run.out, cpu.out, ref.out);
      for (std::size_t i = 0; i < cpu.grads.size(); ++i) {
        INFO("logz gradient of input " << i);
        close(gpu_run.grads[i], cpu.grads[i], ref.grads[i]);
      }
      CHECK(gpu_run.measured == gpu_run.predicted);
      // marginals and Viterbi
      Graph gc, gg;
      std::vector<Var> vc, vg;
      for (const Tensor& x : in) {
        Tensor y = x.dtype() == DType::f64 ? x.to(t) : x;
        vc.push_back(gc.input(y));
        vg.push_back(gg.input(y.to(dev)));
      }
      Tensor mc = eval(semicrf_marginals(vc[0], vc[1], vc[2], vc[3], vc[4]));
      Tensor mg = eval(semicrf_marginals(vg[0], vg[1], vg[2], vg[3], vg[4])).to(Device::cpu());
      if (f64) ref_m = mc;
      close(mg, mc, ref_m);
      Tensor sc = eval(semicrf_viterbi(vc[0], vc[1], vc[2], vc[3], vc[4]));
      Tensor sg = eval(semicrf_viterbi(vg[0], vg[1], vg[2], vg[3], vg[4])).to(Device::cpu());
      CHECK(sg.to_vector() == sc.to_vector());
      // the score of that segmentation and its gradients
      std::vector<Tensor> in2 = in;
      in2.push_back(sc);
      GradCase scs{OpId::semicrf_score, "score", in2,
                   [](const std::vector<Var>& v) { return semicrf_score(v[0], v[1], v[2], v[3], v[4], v[5]); }};
      Run c2 = run_case(scs, Device::cpu(), t, 80 + n), g2 = run_case(scs, dev, t, 80 + n);
      REQUIRE(g2.covered);
      CHECK(same_values(g2.out, c2.out));  // f64 sums in the CPU's order
      for (std::size_t i = 0; i < c2.grads.size(); ++i) CHECK(same_values(g2.grads[i], c2.grads[i]));
      CHECK(g2.measured == g2.predicted);
    }
  }
  // the cumulative helper and its gradient, without and with lengths (padding not read, its gradient 0)
  std::vector<GradCase> cums;
  for (const Shape& s : {Shape{3, 1000, 5}, Shape{1, 7, 600}})
    cums.push_back({OpId::semicrf_cumulative, s.str(), {randn64(s, rng, 0.3)},
                    [](const std::vector<Var>& v) { return semicrf_cumulative(v[0]); }});
  cums.push_back({OpId::semicrf_cumulative, "[3,1000,5] L {1000, 1, 517}",
                  {randn64({3, 1000, 5}, rng, 0.3), index({1000, 1, 517}, {3})},
                  [](const std::vector<Var>& v) { return semicrf_cumulative(v[0], v[1]); }});
  for (const GradCase& cu : cums) {
    for (DType t : {DType::f64, DType::f32}) {
      INFO(fmt::format("semicrf_cumulative {} {}", cu.label, dtype_name(t)));
      Run cpu = run_case(cu, Device::cpu(), t, 95), gpu_run = run_case(cu, dev, t, 95);
      REQUIRE(gpu_run.covered);
      const double tol = t == DType::f64 ? 1e-12 : 1e-5;
      CHECK(max_rel_to_max(gpu_run.out, cpu.out) <= tol);
      CHECK(max_rel_to_max(gpu_run.grads[0], cpu.grads[0]) <= tol);
    }
  }
}

TEST_CASE("cuda: semi-Markov CRF errors on the GPU name the op and the argument") {
  if (skip_without_gpu()) return;
  const Device dev = Device::cuda(0);
  Rng rng(91);
  CrfCase c{2, 5, 3, 3, false, {5, 1}, true};  // no segment of length 1: sequence 1 (L = 1) has none at all
  std::vector<Tensor> in = crf_inputs(c, rng);
  Graph g;
  std::vector<Var> v;
  for (const Tensor& x : in) v.push_back(g.input(x.to(dev)));
  // logZ = -inf with zero gradients for the impossible sequence, no NaN
  Tensor z = eval(semicrf_logz(v[0], v[1], v[2], v[3], v[4])).to(Device::cpu());
  CHECK(std::isfinite(z.to_vector()[0]));
  CHECK(z.to_vector()[1] == -INFINITY);
  auto dS = eval(grad(sum(semicrf_logz(v[0], v[1], v[2], v[3], v[4])), {v[0]})[0]).to(Device::cpu()).to_vector();
  for (double x : dS) CHECK(!std::isnan(x));
  for (std::size_t i = 6 * 3; i < dS.size(); ++i) CHECK(dS[i] == 0.0);
  CHECK_THROWS_WITH_AS(eval(semicrf_viterbi(v[0], v[1], v[2], v[3], v[4])),
                       doctest::Contains("sequence 1 (L = 1) has no allowed segmentation"), Error);
  Var bad = g.input(index({5, 0}, {2}).to(dev));
  CHECK_THROWS_WITH_AS(eval(semicrf_logz(v[0], v[1], v[2], v[3], bad)), doctest::Contains("L[1] = 0 is outside"),
                       Error);
  Var seg = g.input(index({0, -1, -1, -1, -1, 0, -1, -1, -1, -1}, {2, 5}).to(dev));  // a segment of 5 > K = 3
  CHECK_THROWS_WITH_AS(eval(semicrf_score(v[0], v[1], v[2], v[3], v[4], seg)), doctest::Contains("length 5 > K = 3"),
                       Error);
}

TEST_CASE("cuda: a training step on the GPU equals the CPU step") {
  if (skip_without_gpu()) return;
  Rng rng(8);
  Tensor x = Tensor::randn({32, 16}, rng), y = Tensor::randn({32, 4}, rng);
  Tensor w1 = Tensor::randn({16, 32}, rng, DType::f32, 0, 0.3), w2 = Tensor::randn({32, 4}, rng, DType::f32, 0, 0.3);
  std::vector<Tensor> grads[2];
  std::int64_t peaks[2][2];
  for (int d = 0; d < 2; ++d) {
    Device dev = d ? Device::cuda(0) : Device::cpu();
    Parameter p1(w1.to(dev), "w1"), p2(w2.to(dev), "w2");
    Graph g;
    Var h = tanh(matmul(g.input(x.to(dev)), p1));
    Var loss = mean(mul(sub(matmul(h, p2), g.input(y.to(dev))), sub(matmul(h, p2), g.input(y.to(dev)))));
    Report r = backward(loss, policy::sqrt_n());
    peaks[d][0] = r.predicted_peak_bytes;
    peaks[d][1] = r.measured_peak_bytes;
    grads[d] = {p1.grad().to(Device::cpu()), p2.grad().to(Device::cpu())};
  }
  CHECK(peaks[1][0] == peaks[1][1]);
  CHECK(peaks[1][0] == peaks[0][0]);
  for (int i = 0; i < 2; ++i) CHECK(max_rel(grads[1][static_cast<std::size_t>(i)], grads[0][static_cast<std::size_t>(i)]) <= 1e-5);
  auto st = cuda::memory_stats(0);
  CHECK(st.reserved_bytes >= st.live_bytes);
  cuda::empty_cache();
}

// Host offload on the GPU: kept values copied to pinned host memory on the
// copy stream and brought back before backward reads them. Gradients are
// bitwise equal to the same policy without offload, the device peak is
// predicted exactly and lower, and repeated steps (blocks reused while
// copies may still be in flight) stay exact.
TEST_CASE("cuda: host offload gives bitwise equal gradients and the predicted, lower device peak") {
  if (skip_without_gpu()) return;
  Rng rng(9);
  const Device dev = Device::cuda(0);
  Tensor x = Tensor::randn({256, 128}, rng).to(dev);
  std::vector<Parameter> w;
  for (int i = 0; i < 16; ++i) w.emplace_back(Tensor::randn({128, 128}, rng, DType::f32, 0, 0.1).to(dev));
  auto step = [&](const Policy& pol) {
    Graph g;
    Var h = g.input(x);
    for (std::size_t i = 0; i < w.size(); ++i) {
      Var z = tanh(matmul(h, w[i]));
      h = i % 2 ? add(h, z) : z;
    }
    Report r = backward(mean(mul(h, h)), pol);
    std::vector<std::vector<double>> gs;
    for (auto& p : w) {
      gs.push_back(p.grad().to(Device::cpu()).to_vector());
      p.zero_grad();
    }
    return std::make_pair(r, gs);
  };
  for (const Policy& base : {policy::keep_all(), policy::sqrt_n()}) {
    CAPTURE(base.name());
    auto [r0, g0] = step(base);
    const Policy off = base.offloaded();
    for (int rep = 0; rep < 3; ++rep) {
      auto [r, gs] = step(off);
      CHECK(gs == g0);
      CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
      CHECK(r.offload_peak_bytes > 0);
      CHECK(r.measured_peak_bytes <= r0.measured_peak_bytes);
      if (base.kind == Policy::Kind::keep_all) CHECK(r.measured_peak_bytes < r0.measured_peak_bytes);
    }
  }
  cuda::synchronize(0);
  cuda::empty_cache();  // waits for copies still in flight, returns pinned and device blocks
  CHECK(cuda::memory_stats(0).reserved_bytes >= cuda::memory_stats(0).live_bytes);
}

TEST_CASE("cuda: an NCCL world of one trains like plain backward") {
  if (skip_without_gpu()) return;
  if (!dist::have_nccl()) {
    std::printf("[ad-skip] this build has no NCCL backend\n");
    return;
  }
  dist::Options o;
  o.backend = dist::Backend::nccl;
  o.device = 0;
  auto comm = dist::Communicator::from_env(o);
  CHECK(std::string(comm.backend()) == "nccl");
  CHECK(comm.size() == 1);
  Rng rng(12);
  Tensor x = Tensor::randn({16, 8}, rng), w0 = Tensor::randn({8, 4}, rng, DType::f32, 0, 0.5);
  Parameter ref(w0.clone()), gpu(w0.to(Device::cuda(0)));
  {
    Graph g;
    backward(mean(tanh(matmul(g.input(x), ref))));
  }
  dist::DataParallel dp(comm, {gpu});
  {
    Graph g;
    dp.backward(mean(tanh(matmul(g.input(x.to(Device::cuda(0))), gpu))), policy::sqrt_n());
  }
  CHECK(max_rel(gpu.grad().to(Device::cpu()), ref.grad()) <= 1e-5);
  Tensor t = Tensor::full({5}, 3.0).to(Device::cuda(0));
  comm.all_reduce(t, dist::ReduceOp::mean);
  CHECK(t.to_vector() == std::vector<double>(5, 3.0));
  Tensor cpu_t = Tensor::ones({2});
  CHECK_THROWS_WITH_AS(comm.all_reduce(cpu_t), doctest::Contains("is not on cuda:0"), Error);
}

// ---- attention on the GPU ----
namespace {
struct AttnCase {
  std::int64_t B, H, Hkv, Nq, Nk, d;
  bool causal;
  std::vector<std::int64_t> lens;  // empty: no padding
  std::string str() const {
    return fmt::format("B={} H={} Hkv={} Nq={} Nk={} d={}{}{}", B, H, Hkv, Nq, Nk, d, causal ? " causal" : "",
                       lens.empty() ? "" : fmt::format(" lens={}", fmt::join(lens, ",")));
  }
};
struct AttnRun {
  std::vector<Tensor> vals;  // out, dq, dk, dv as f64 on the CPU
  std::int64_t predicted = 0, measured = 0;
};
// attention in dtype t on dev, and the gradients of sum(out * w) (bf16/f16: of
// sum(cast(out, f32) * w)); `in` = q, k, v, w in f64.
AttnRun attn_run(const AttnCase& c, const std::vector<Tensor>& in, Device dev, DType t) {
  PGraph g;
  Var q = g.input(in[0].to(t).to(dev)), k = g.input(in[1].to(t).to(dev)), v = g.input(in[2].to(t).to(dev));
  AttentionOptions o;
  o.causal = c.causal;
  if (!c.lens.empty()) o.key_lengths = g.input(index(c.lens, {c.B}).to(dev));
  Var out = attention(q, k, v, o);
  const DType lt = is_compute_float(t) ? t : DType::f32;
  Var loss = sum(mul(lt == t ? out : cast(out, lt), g.input(in[3].to(lt).to(dev))));
  std::vector<Var> gr = grad(loss, {q, k, v});
  std::vector<std::int32_t> targets{out.id()};
  for (auto& x : gr) targets.push_back(x.id());
  Schedule s = plan(g.impl(), targets, {}, policy::keep_all());
  RunStats st = execute(g.impl(), s);
  AttnRun r;
  r.predicted = s.predicted_peak_bytes;
  r.measured = st.measured_peak_bytes;
  for (auto id : targets) r.vals.push_back(g.impl().node(id).value.to(Device::cpu()).to(DType::f64));
  return r;
}
std::vector<Tensor> attn_inputs(const AttnCase& c, std::uint64_t seed) {
  Rng rng(seed);
  return {randn64({c.B, c.H, c.Nq, c.d}, rng), randn64({c.B, c.Hkv, c.Nk, c.d}, rng),
          randn64({c.B, c.Hkv, c.Nk, c.d}, rng), randn64({c.B, c.H, c.Nq, c.d}, rng)};
}
std::vector<AttnCase> attn_cases() {
  return {
      {2, 4, 4, 128, 128, 64, false, {}},     // tiles exactly
      {2, 4, 4, 128, 128, 64, true, {}},
      {2, 4, 2, 100, 77, 32, true, {77, 0}},  // GQA, Nq > Nk, odd N, a batch with no keys
      {2, 2, 1, 77, 200, 128, true, {200, 31}},  // GQA, Nq < Nk, padding, several key tiles
      {1, 2, 2, 65, 65, 128, false, {}},      // one row past a tile
      {2, 3, 3, 50, 90, 40, false, {0, 90}},  // d padded to 64; a batch with no keys
      {1, 1, 1, 33, 20, 7, true, {}},         // odd d; first rows see no key
      {1, 2, 1, 300, 300, 64, true, {257}},
  };
}
}  // namespace

// f32 and f64 kernels against the CPU kernels: forward and every gradient,
// within 1e-5 (f32) / 1e-10 (f64) of each tensor's largest value (the orders
// of the sums differ), fully masked rows exactly zero, predicted == measured
// peak on the device.
TEST_CASE("cuda: attention matches the CPU (f32, f64), forward and all gradients") {
  if (skip_without_gpu()) return;
  std::uint64_t seed = 700;
  for (const AttnCase& c : attn_cases()) {
    auto in = attn_inputs(c, ++seed);
    for (DType t : {DType::f64, DType::f32}) {
      INFO(c.str(), " ", dtype_name(t));
      AttnRun cpu = attn_run(c, in, Device::cpu(), t), gpu_run = attn_run(c, in, Device::cuda(0), t);
      const double tol = t == DType::f64 ? 1e-10 : 1e-5;
      for (std::size_t i = 0; i < 4; ++i) {
        CHECK(all_finite(gpu_run.vals[i]));
        CHECK(max_rel_to_max(gpu_run.vals[i], cpu.vals[i]) <= tol);
      }
      CHECK(gpu_run.measured == gpu_run.predicted);
    }
  }
}

// bf16/f16 on tensor cores against f64 on the same rounded inputs: max error
// over max value <= 4 u (bf16 2^-6, f16 2^-9), the bound the CPU's half path
// meets in tests/attention.cpp and below what naive half attention gets.
TEST_CASE("cuda: bf16 and f16 attention against an f64 reference") {
  if (skip_without_gpu()) return;
  std::uint64_t seed = 800;
  for (const AttnCase& c : attn_cases()) {
    auto in = attn_inputs(c, ++seed);
    for (DType t : {DType::bf16, DType::f16}) {
      INFO(c.str(), " ", dtype_name(t));
      std::vector<Tensor> rin;
      for (const Tensor& x : in) rin.push_back(x.to(t).to(DType::f64));
      AttnRun ref = attn_run(c, rin, Device::cpu(), DType::f64), gpu_run = attn_run(c, in, Device::cuda(0), t);
      const double tol = t == DType::bf16 ? 1.0 / 64 : 1.0 / 512;
      for (std::size_t i = 0; i < 4; ++i) {
        CHECK(all_finite(gpu_run.vals[i]));
        CHECK(max_rel_to_max(gpu_run.vals[i], ref.vals[i]) <= tol);
      }
      CHECK(gpu_run.measured == gpu_run.predicted);
    }
  }
}

TEST_CASE("cuda: attention never reads keys and values past key_lengths (NaN padding)") {
  if (skip_without_gpu()) return;
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (bool causal : {false, true}) {
      auto clean = test::padded_attention(dt, causal, 0.0, Device::cuda(0));
      auto nan = test::padded_attention(dt, causal, std::nan(""), Device::cuda(0));
      for (std::size_t t = 0; t < clean.size(); ++t) {
        INFO("dtype " << dtype_name(dt) << " causal " << causal << " output " << t);
        for (double x : clean[t]) REQUIRE(std::isfinite(x));
        CHECK(nan[t] == clean[t]);
      }
    }
  }
}

TEST_CASE("cuda: semi-CRF f32 marginals and score gradients stay accurate at large K (hi + lo rings)") {
  // The CPU's test of the same name, the GPU's f32 against the CPU's f64: the GPU's rings keep the low part
  // too (written after the last GPU run; plain f32 rings were off by 3e-3 and 2e-2 on the CPU).
  if (skip_without_gpu()) return;
  check_semicrf_f32_large_k(Device::cuda(0));  // tests/semicrf_accuracy.hpp
}

TEST_CASE("cuda: a non-finite semicrf score is an ad::Error naming b, t and c") {
  if (skip_without_gpu()) return;
  std::vector<float> xs{1, 2, 3, 4, 5, 6, 7, -INFINITY};
  Graph g;
  Var S = semicrf_cumulative(g.input(Tensor::from(std::span<const float>(xs), {2, 2, 2}).to(Device::cuda(0))));
  CHECK_THROWS_WITH_AS(eval(S), doctest::Contains("scores[1, 1, 1] = -inf is not finite"), Error);
  // sums that overflow f32 in a column other than the first, or only in a middle row, as the CPU finds them
  // (the GPU once checked S[b, T, 0] only; added after the last GPU run); padding past a length is not read
  // [1, 2, 3]: S[0, 2] = {0, inf, -inf}; [1, 3, 2]: S[0, 2, 1] = inf, the last row finite
  for (const auto& [v, shape] : {std::pair{std::vector<float>{0, 3e38f, -3e38f, 0, 3e38f, -3e38f}, Shape{1, 2, 3}},
                                 std::pair{std::vector<float>{0, 3e38f, 0, 3e38f, 0, -3e38f}, Shape{1, 3, 2}}}) {
    Graph o;
    Var So = semicrf_cumulative(o.input(Tensor::from(std::span<const float>(v), shape).to(Device::cuda(0))));
    CHECK_THROWS_WITH_AS(eval(So), doctest::Contains("the cumulative scores of sequence 0 overflow f32"), Error);
  }
  std::vector<float> padded{1, 2, 3, 4, NAN, INFINITY};
  Graph pg;
  Var Sp = semicrf_cumulative(pg.input(Tensor::from(std::span<const float>(padded), {1, 3, 2}).to(Device::cuda(0))),
                              pg.input(index({2}, {1}).to(Device::cuda(0))));
  CHECK(eval(Sp).to(Device::cpu()).to_vector() == std::vector<double>{0, 0, -1.5, -0.5, -1, 1, -1, 1});
  // a NaN transition (checked on the host from a copy of Tr, D and P; added after the last GPU run)
  const Device dev = Device::cuda(0);
  Tensor tr = Tensor::full({2, 2}, 0.1);
  tr.data<float>()[3] = NAN;
  Graph h;
  Var z = semicrf_logz(h.input(Tensor::zeros({1, 4, 2}).to(dev)), h.input(tr.to(dev)),
                       h.input(Tensor::full({2, 2}, 0.1).to(dev)), h.input(Tensor::full({2}, 0.1).to(dev)),
                       h.input(Tensor::full({1}, 3.0, DType::i64).to(dev)));
  CHECK_THROWS_WITH_AS(eval(z), doctest::Contains("Tr[1, 1] = nan"), Error);
  // a NaN or infinite S within a sequence's length (checked on the device; added after the last GPU run), in every
  // op that reads S; one past the length is not read
  auto run = [&](std::int64_t t, float v, int op) {
    Tensor Sh = Tensor::zeros({2, 5, 2});
    Sh.data<float>()[(5 + t) * 2 + 1] = v;  // S[1, t, 1]
    Graph q;
    Var s = q.input(Sh.to(dev)), trv = q.input(Tensor::full({2, 2}, 0.1).to(dev)),
        dv = q.input(Tensor::full({2, 2}, 0.1).to(dev)), pv = q.input(Tensor::full({2}, 0.1).to(dev)),
        lv = q.input(index({4, 2}, {2}).to(dev));
    if (op == 0) return eval(semicrf_logz(s, trv, dv, pv, lv));
    if (op == 1) return eval(semicrf_viterbi(s, trv, dv, pv, lv));
    if (op == 2) return eval(semicrf_marginals(s, trv, dv, pv, lv));
    return eval(grad(sum(semicrf_logz(s, trv, dv, pv, lv)), {pv})[0]);
  };
  for (int op = 0; op < 4; ++op) {
    INFO("op " << op);
    CHECK_THROWS_WITH_AS(run(2, NAN, op), doctest::Contains("S[1, 2, 1] = nan is not finite"), Error);
    CHECK_THROWS_WITH_AS(run(1, -INFINITY, op), doctest::Contains("S[1, 1, 1] = -inf is not finite"), Error);
    CHECK_NOTHROW(run(3, NAN, op));  // L[1] = 2: S[1, 3] is past the sequence
  }
}

TEST_CASE("cuda: attention errors on the GPU name the op") {
  if (skip_without_gpu()) return;
  Rng rng(9);
  Device dev = Device::cuda(0);
  {
    Graph g;
    Var q = g.input(Tensor::randn({1, 1, 4, 160}, rng).to(dev)), k = g.input(Tensor::randn({1, 1, 4, 160}, rng).to(dev));
    CHECK_THROWS_WITH_AS(attention(q, k, k), doctest::Contains("attention: no CUDA kernel for head size d = 160"), Error);
  }
  {
    Graph g;
    Var q = g.input(Tensor::randn({2, 1, 4, 8}, rng).to(dev)), k = g.input(Tensor::randn({2, 1, 4, 8}, rng).to(dev));
    AttentionOptions o;
    o.key_lengths = g.input(index({4, 5}, {2}).to(dev));
    CHECK_THROWS_WITH_AS(eval(attention(q, k, k, o)), doctest::Contains("key_lengths[1] = 5 is outside [0, Nk = 4]"),
                         Error);
  }
  {  // more query tiles than a grid's y holds (65,535 tiles of 64 f32 rows): said, not a failed launch
    Graph g;
    const std::int64_t n = 65536 * 64 + 1;
    Var q = g.input(Tensor::zeros({1, 1, n, 8}).to(dev)), k = g.input(Tensor::zeros({1, 1, 4, 8}).to(dev));
    CHECK_THROWS_WITH_AS(eval(attention(q, k, k)), doctest::Contains("over the CUDA grid's limit of 65535"), Error);
  }
}

// f16 holds at most 65504: on the GPU the compress steps count what became
// infinite on the device and the run fails once, at the end of its steps,
// naming the values (added after the last GPU run: not yet run on one).
TEST_CASE("cuda: a value compressed beyond f16's range on the GPU is an ad::Error") {
  if (skip_without_gpu()) return;
  const Device dev = Device::cuda(0);
  Tensor w0 = Tensor::zeros({1, 4});
  for (int i = 0; i < 4; ++i) w0.data<float>()[i] = 10.0f + static_cast<float>(i);
  Parameter w(w0.to(dev), "w");
  auto run = [&](const Policy& pol) {
    Graph g;
    Var e = exp(mul_scalar(g.param(w), 1.0));
    backward(sum(mul(e, e)), pol);
  };
  CHECK_THROWS_WITH_AS(run(policy::keep_all().compressed(DType::f16)),
                       doctest::Contains("finite elements beyond the storage dtype's range (f16: largest finite 65504) became infinite"), Error);
  CHECK(!w.has_grad());
  run(policy::keep_all().compressed(DType::bf16));
  const std::vector<double> gr = w.grad().to(Device::cpu()).to_vector();
  for (int i = 0; i < 4; ++i) CHECK(std::isfinite(gr[static_cast<std::size_t>(i)]));
  // and a run after the failed one starts from a zero count
  w.zero_grad();
  run(policy::keep_all().compressed(DType::bf16));
}

// cuBLAS with K = 0 must zero each output matrix, stride apart with gaps
// between them: a grouped conv2d with no input channels, and the input
// gradient of one with no output channels.
TEST_CASE("cuda: conv2d with no input or no output channels gives zeros on the GPU") {
  if (skip_without_gpu()) return;
  Conv2dOptions two;
  two.groups = 2;
  for (DType t : {DType::f32, DType::f64}) {
    PGraph g;
    Var y = conv2d(g.input(Tensor::zeros({3, 0, 5, 5}, t).to(Device::cuda(0))),
                   g.input(Tensor::zeros({4, 0, 3, 3}, t).to(Device::cuda(0))), two);
    Tensor yv = eval(y).to(Device::cpu());
    CHECK(yv.shape() == Shape{3, 4, 3, 3});
    CHECK(std::ranges::all_of(yv.to_vector(), [](double v) { return v == 0; }));
    PGraph h;
    Var x = h.input(Tensor::ones({3, 4, 5, 5}, t).to(Device::cuda(0)));
    Var z = conv2d(x, h.input(Tensor::zeros({0, 2, 3, 3}, t).to(Device::cuda(0))), two);
    Tensor dx = eval(grad(sum(z), {x})[0]).to(Device::cpu());
    CHECK(std::ranges::all_of(dx.to_vector(), [](double v) { return v == 0; }));
  }
}
