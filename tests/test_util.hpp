#pragma once
// Shared test helpers: seeded random tensors in an op's smooth domain, graphs
// with poisoned outputs, the float64 central-difference gradcheck, seeded
// random DAGs and chains, and bitwise gradient comparison.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"

// AD_TEST_SANITIZED: built with AddressSanitizer (about 10x slower), where
// the heaviest tests run a smaller sample.
#if defined(__SANITIZE_ADDRESS__)
#define AD_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AD_TEST_SANITIZED 1
#endif
#endif

namespace ad::test {

// ---- random tensors (f64 unless said otherwise) ----
inline Tensor randn64(const Shape& s, Rng& rng, double mean = 0, double stddev = 1) {
  return Tensor::randn(s, rng, DType::f64, mean, stddev);
}
inline Tensor uniform64(const Shape& s, Rng& rng, double lo, double hi) {
  return Tensor::uniform(s, rng, DType::f64, lo, hi);
}
// |x| in (lo, hi] with a random sign: away from the kink of abs/relu/sign and the pole of 1/x.
inline Tensor away_from_zero(const Shape& s, Rng& rng, double lo = 0.2, double hi = 2.0) {
  Tensor m = uniform64(s, rng, lo, hi);
  Tensor u = uniform64(s, rng, 0, 1);
  double* pm = m.data<double>();
  const double* pu = u.data<double>();
  for (std::int64_t i = 0; i < m.numel(); ++i) pm[i] = pu[i] > 0.5 ? pm[i] : -pm[i];
  return m;
}
// Values pairwise at least `gap` apart, in random order (no ties for max).
inline Tensor distinct(const Shape& s, Rng& rng, double gap = 0.1) {
  std::int64_t n = s.numel();
  Tensor keys = uniform64(s, rng, 0, 1), jitter = uniform64(s, rng, 0, 0.2 * gap);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const double* k = keys.data<double>();
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return k[a] < k[b]; });
  Tensor t = Tensor::empty(s, DType::f64);
  double* p = t.data<double>();
  const double* j = jitter.data<double>();
  for (std::int64_t r = 0; r < n; ++r) {
    auto i = order[static_cast<std::size_t>(r)];
    p[i] = (static_cast<double>(r) - 0.5 * static_cast<double>(n)) * gap + j[i];
  }
  return t;
}
inline Tensor index(std::vector<std::int64_t> v, const Shape& s) { return Tensor::from(std::span<const std::int64_t>(v), s); }
inline Tensor f64s(std::vector<double> v, const Shape& s) { return Tensor::from(std::span<const double>(v), s); }

// A graph whose kernels see poisoned (NaN-filled) outputs, so unwritten elements show.
struct PGraph : Graph {
  PGraph() { impl().poison_outputs = true; }
};

inline bool all_finite(const Tensor& t) {
  for (double v : t.to_vector()) if (!std::isfinite(v)) return false;
  return true;
}
inline std::size_t count_op(const Var& v, OpId op) {
  std::size_t c = 0;
  for (const Node& n : v.graph()->nodes) c += n.op == op;
  return c;
}

// ---- misuse: the exception type and what its message names ----
// Runs f again, catches the ad::Error and checks that its message contains
// every needle. (CHECK_THROWS_AS in the macro has already checked the type.)
template <class F> void check_message(F&& f, std::initializer_list<const char*> needles, const char* expr) {
  std::string msg;
  try {
    f();
  } catch (const ad::Error& e) {
    msg = e.what();
  } catch (...) {
  }
  INFO("expression: " << std::string(expr));
  INFO("message: " << msg);
  for (const char* n : needles) {
    std::string needle(n);
    CHECK_MESSAGE(msg.find(needle) != std::string::npos, "message lacks \"" << needle << "\"");
  }
}

#define EXPECT_ERROR(expr, ...)                                              \
  do {                                                                       \
    CHECK_THROWS_AS((void)(expr), ad::Error);                                \
    ::ad::test::check_message([&] { (void)(expr); }, {__VA_ARGS__}, #expr);  \
  } while (0)

// True when f() throws an ad::Error whose message contains `needle` (the
// message is shown if the check fails).
template <class F> bool throws_with(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    INFO(e.what());
    return std::string(e.what()).find(needle) != std::string::npos;
  }
  return false;
}

// ---- gradcheck ----
inline constexpr double kEps = 1e-6, kAtol = 1e-5, kRtol = 1e-3;

// One gradcheck case of op `op`: inputs (f64 are differentiated, i64 are not)
// and how to build the op from their leaves.
struct GradCase {
  OpId op;
  std::string label;  // shapes and attrs, for messages
  std::vector<Tensor> inputs;
  std::function<Var(const std::vector<Var>&)> build;
};

// The registered gradcheck cases (tests/gradcheck_cases.cpp), fresh tensors every call.
std::vector<GradCase> gradcheck_cases();
// Cases of op families kept in their own test files, appended by gradcheck_cases().
void attention_gradcheck_cases(std::vector<GradCase>& out, Rng& rng);
// Cases of the semi-Markov CRF ops (tests/semicrf.cpp).
void semicrf_gradcheck_cases(std::vector<GradCase>& out, Rng& rng);
// Cases of the semiseparable ops (tests/semiseparable.cpp).
void semiseparable_gradcheck_cases(std::vector<GradCase>& out, Rng& rng);
// Cases of conv2d, its gradients and max_pool2d (tests/conv.cpp).
void conv_gradcheck_cases(std::vector<GradCase>& out, Rng& rng);

struct Mismatch {
  std::size_t input;
  std::int64_t element;
  double analytic, numeric;
};
struct GradcheckResult {
  std::int64_t checked = 0;          // gradient elements compared
  std::vector<Mismatch> mismatches;  // |a - n| > atol + rtol |n| (or non-finite)
  std::string problem;               // structural failure (op missing, bad shape, NaN forward)
  bool ok() const { return problem.empty() && mismatches.empty() && checked > 0; }
  std::string str() const {
    std::string s = fmt::format("{} gradient elements checked, {} mismatches. {}", checked, mismatches.size(), problem);
    for (std::size_t i = 0; i < mismatches.size() && i < 6; ++i) {
      const auto& m = mismatches[i];
      s += fmt::format("\n  input {} element {}: analytic {:.10g} vs numeric {:.10g}", m.input, m.element, m.analytic,
                       m.numeric);
    }
    if (mismatches.size() > 6) s += fmt::format("\n  ... {} mismatches in all", mismatches.size());
    return s;
  }
};

// loss = sum(op(inputs) * w), in a fresh poisoned graph.
inline double weighted_loss(const GradCase& c, const std::vector<Tensor>& inputs, const Tensor& w) {
  PGraph g;
  std::vector<Var> vs;
  for (const auto& t : inputs) vs.push_back(g.input(t));
  Var out = c.build(vs);
  return eval(sum(mul(out, g.input(w)))).item();
}

// Compares ad::grad of sum(op(inputs) * w) (w fixed random) with central
// differences of the same loss, for every element of every f64 input.
inline GradcheckResult gradcheck(const GradCase& c, std::uint64_t weight_seed) {
  GradcheckResult r;
  PGraph g;
  std::vector<Var> vs, wrt;
  std::vector<std::size_t> wrt_index;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    if (t.dtype() != DType::f64 && t.dtype() != DType::i64) {
      r.problem = fmt::format("input {} is {}, expected f64 (differentiated) or i64", i, dtype_name(t.dtype()));
      return r;
    }
    vs.push_back(g.input(t));
    if (t.dtype() == DType::f64) { wrt.push_back(vs.back()); wrt_index.push_back(i); }
  }
  Var out = c.build(vs);
  if (count_op(out, c.op) == 0) { r.problem = fmt::format("the graph has no {} node", op_name(c.op)); return r; }
  if (out.dtype() != DType::f64) { r.problem = fmt::format("output is {}, expected f64", out.str()); return r; }
  Rng wr(weight_seed);
  Tensor w = randn64(out.shape(), wr);
  Var loss = sum(mul(out, g.input(w)));
  std::vector<Var> grads = grad(loss, wrt);
  if (!all_finite(eval(out))) { r.problem = "forward output is not finite (poisoned element left unwritten?)"; return r; }
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    const Tensor& ga = eval(grads[k]);
    const Tensor& x = c.inputs[wrt_index[k]];
    if (!(ga.shape() == x.shape()) || ga.dtype() != DType::f64) {
      r.problem = fmt::format("gradient of input {} is {}{}, expected f64{}", wrt_index[k], dtype_name(ga.dtype()),
                              ga.shape().str(), x.shape().str());
      return r;
    }
    std::vector<double> a = ga.to_vector();
    std::vector<Tensor> in = c.inputs;
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      Tensor xp = x.clone();
      in[wrt_index[k]] = xp;
      double* p = xp.data<double>();
      double x0 = p[j];
      p[j] = x0 + kEps;
      double lp = weighted_loss(c, in, w);
      p[j] = x0 - kEps;
      double lm = weighted_loss(c, in, w);
      double num = (lp - lm) / (2 * kEps);
      double an = a[static_cast<std::size_t>(j)];
      ++r.checked;
      if (!(std::fabs(an - num) <= kAtol + kRtol * std::fabs(num))) r.mismatches.push_back({wrt_index[k], j, an, num});
    }
  }
  return r;
}

// Largest |a - b| over two tensors of equal shape (inf if shapes differ, a value is NaN or
// only one side is infinite).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape())) return INFINITY;
  auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (va[i] == vb[i]) continue;  // equal infinities too
    double d = std::fabs(va[i] - vb[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// ---- random graphs ----
// splitmix64 picks: uniform enough for choosing ops and operands.
struct Picker {
  std::uint64_t state;
  explicit Picker(std::uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t operator()(std::uint64_t n) {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (z ^ (z >> 31)) % n;
  }
};

// A seeded random graph: its parameters (fresh each build, same values for
// the same seed), the values it made, and a scalar loss.
struct RandomDag {
  std::vector<Parameter> params;
  std::vector<Var> pool;
  Var loss;
};

// A random DAG over [R, C] values (R in 2..6, C in 2..7, f64 for a third of
// the seeds, else f32): a mix of ops, fan-out up to 4 (a value and the
// subgraph behind it shared by up to 4 consumers), parameters used several
// times, views, workspaces, dropout, casts to the other dtype.
// target_nodes = 0: 6..25 random ops. Otherwise ops are added while the
// graph stays within target_nodes nodes once the loss is built (at least one op).
inline RandomDag random_dag(Graph& g, std::uint64_t seed, std::int64_t target_nodes = 0) {
  Picker next(seed);
  const std::int64_t R = 2 + static_cast<std::int64_t>(next(5)), C = 2 + static_cast<std::int64_t>(next(6));
  const DType t = next(3) == 0 ? DType::f64 : DType::f32;
  const DType other = t == DType::f32 ? DType::f64 : DType::f32;
  Rng rng(seed + 1000);
  RandomDag d;
  auto param = [&](const Shape& s) {
    d.params.push_back(Parameter::randn(s, rng, 0.5, t));
    return d.params.back();
  };
  Parameter W1 = param({C, C}), W2 = param({C, C}), bias = param({C}), gamma = param({C}), beta = param({C});
  Parameter P1 = param({R, C}), P2 = param({R, C});
  std::vector<int> uses;
  auto push = [&](Var v) { REQUIRE(v.shape() == Shape{R, C}); d.pool.push_back(v); uses.push_back(0); };
  push(g.input(Tensor::randn({R, C}, rng, t)));
  push(g.input(Tensor::randn({R, C}, rng, t)));
  push(g.param(P1));
  push(g.param(P2));
  auto pick = [&]() -> Var {
    std::size_t n = d.pool.size();
    for (;;) {
      std::size_t i = next(3) == 0 ? next(n) : n - 1 - next(std::min<std::size_t>(n, 4));
      if (uses[i] < 4) { ++uses[i]; return d.pool[i]; }
    }
  };
  // one op adds at most 5 nodes (4 + a parameter leaf), the loss at most 6
  const int n_ops = target_nodes > 0 ? -1 : 6 + static_cast<int>(next(20));
  for (int k = 0; n_ops < 0 ? (k == 0 || g.num_nodes() + 11 <= target_nodes) : k < n_ops; ++k) {
    switch (next(22)) {
      case 0: push(pick() + pick()); break;
      case 1: push(pick() - pick()); break;
      case 2: push(pick() * pick()); break;
      case 3: push(tanh(pick())); break;
      case 4: push(sigmoid(pick())); break;
      case 5: push(relu(pick())); break;
      case 6: push(next(2) ? gelu(pick()) : silu(pick())); break;
      case 7: push(matmul(pick(), next(2) ? W1 : W2)); break;
      case 8: push(add(pick(), bias)); break;
      case 9: push(reshape(tanh(reshape(pick(), {C, R})), {R, C})); break;  // views around a compute
      case 10: push(reshape(reshape(pick(), {-1}), {R, C})); break;         // a view of a view
      case 11: { Var a = pick(); push(a - max(a, {1}, true)); break; }      // max: workspace
      case 12: push(mul(pick(), max(pick(), {0}, true))); break;            // non-suffix max
      case 13: push(softmax(pick(), static_cast<int>(next(2)))); break;
      case 14: push(dropout(pick(), 0.3, rng)); break;
      case 15: {
        std::int64_t s = 1 + static_cast<std::int64_t>(next(static_cast<std::uint64_t>(C - 1)));
        push(concat({slice(pick(), 1, 0, s), slice(pick(), 1, s, C)}, 1));
        break;
      }
      case 16: push(transpose(exp(mul_scalar(transpose(pick()), 0.5)))); break;
      case 17: push(layer_norm(pick(), gamma, beta)); break;
      case 18: push(gather(pick(), g.input(Tensor::randint({R}, rng, R)), 0)); break;
      case 19: push(mul(sum(pick(), {1}, true), pick())); break;
      case 20: push(cast(mul_scalar(cast(pick(), other), 0.75), t)); break;
      default: push(log_softmax(add_scalar(pick(), 0.25), -1)); break;
    }
  }
  d.loss = add(sum(d.pool.back()), mean(mul(pick(), matmul(pick(), W1))));
  return d;
}

// A random chain x0 -> x1 -> ... -> loss over [R, C] values: every op reads
// only the previous op's value and leaves (parameters, index inputs), so the
// forward graph is a chain (optimal_chain applies). Ops: matmul with shared
// weights, unary activations, bias, elementwise parameter products, dropout,
// layer_norm, softmax, views (reshape), dtype round trips, gather. The first
// op is a matmul (the loss depends on a parameter); the last is sum.
// Adds ops while the graph stays within target_nodes nodes (at least one op).
inline RandomDag random_chain(Graph& g, std::uint64_t seed, std::int64_t target_nodes) {
  Picker next(seed ^ 0xC4A1Eull);
  const std::int64_t R = 2 + static_cast<std::int64_t>(next(5)), C = 2 + static_cast<std::int64_t>(next(6));
  const DType t = next(3) == 0 ? DType::f64 : DType::f32;
  const DType other = t == DType::f32 ? DType::f64 : DType::f32;
  Rng rng(seed + 2000);
  RandomDag d;
  auto param = [&](const Shape& s) {
    d.params.push_back(Parameter::randn(s, rng, 0.5, t));
    return d.params.back();
  };
  Parameter W1 = param({C, C}), W2 = param({C, C}), bias = param({C}), gamma = param({C}), beta = param({C});
  Parameter P1 = param({R, C});
  Var h = matmul(g.input(Tensor::randn({R, C}, rng, t)), W1);
  d.pool.push_back(h);
  // one op adds at most 2 nodes + a parameter leaf; the loss 1
  while (g.num_nodes() + 4 <= target_nodes) {
    switch (next(16)) {
      case 0: h = matmul(h, next(2) ? W1 : W2); break;
      case 1: h = tanh(h); break;
      case 2: h = sigmoid(h); break;
      case 3: h = relu(h); break;
      case 4: h = next(2) ? gelu(h) : silu(h); break;
      case 5: h = add(h, bias); break;
      case 6: h = mul(h, P1); break;
      case 7: h = dropout(h, 0.3, rng); break;
      case 8: h = layer_norm(h, gamma, beta); break;
      case 9: h = softmax(h, static_cast<int>(next(2))); break;
      case 10: h = reshape(tanh(reshape(h, {C, R})), {R, C}); break;
      case 11: h = cast(mul_scalar(cast(h, other), 0.75), t); break;
      case 12: h = gather(h, g.input(Tensor::randint({R}, rng, R)), 0); break;
      case 13: h = exp(mul_scalar(h, 0.5)); break;
      case 14: h = log_softmax(h, -1); break;
      default: h = add_scalar(mul(h, h), 0.1); break;  // reads the previous value twice: still one step
    }
    REQUIRE(h.shape() == Shape{R, C});
    d.pool.push_back(h);
  }
  d.loss = sum(h);
  return d;
}

// Copies of the parameters' gradients (undefined where a parameter has none).
inline std::vector<Tensor> grads_of(const std::vector<Parameter>& ps) {
  std::vector<Tensor> out;
  for (const auto& p : ps) out.push_back(p.has_grad() ? p.grad().clone() : Tensor());
  return out;
}
inline void check_bitwise(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(bitwise_equal(a[i], b[i]));
  }
}

// ---- rematerialisation ----
namespace remat {

// What one backward() under a policy produced.
struct Outcome {
  Report report;              // report.plan is reset: its graph is gone
  std::vector<Tensor> grads;  // copies of the parameters' gradients
  Tensor loss;                // copy of the loss value
  std::int64_t forward_nodes = 0;  // nodes up to the loss (leaves included)
};
inline Outcome run(Graph& g, const RandomDag& d, const Policy& pol) {
  Outcome o;
  o.report = backward(d.loss, pol);
  o.report.plan.reset();
  o.grads = grads_of(d.params);
  o.loss = d.loss.value().clone();
  o.forward_nodes = d.loss.id() + 1;
  (void)g;
  return o;
}

// The least peak a budget error states (-1 if it is not an ad::BudgetError).
// Its message must name the same figure, and the budget it failed.
inline std::int64_t parse_min_peak(const ad::Error& e) {
  const auto* be = dynamic_cast<const ad::BudgetError*>(&e);
  if (!be) return -1;
  const std::string msg = e.what();
  const bool names_least = msg.find(", " + std::to_string(be->least_peak) + " B") != std::string::npos ||
                           msg.find("of " + std::to_string(be->least_peak) + " B") != std::string::npos;
  const bool names_budget = msg.find(std::to_string(be->budget) + " B is below") != std::string::npos;
  CHECK_MESSAGE(names_least, msg);
  CHECK_MESSAGE(names_budget, msg);
  CHECK(be->least_peak > be->budget);
  return be->least_peak;
}

// Whether the nodes the loss depends on form a chain: ordered by id, each
// non-leaf node reads only leaves and the previous non-leaf node.
inline bool is_forward_chain(const GraphImpl& g, std::int32_t loss) {
  std::vector<char> reach(static_cast<std::size_t>(loss) + 1, 0);
  reach[static_cast<std::size_t>(loss)] = 1;
  for (std::int32_t id = loss; id >= 0; --id)
    if (reach[static_cast<std::size_t>(id)])
      for (auto in : g.node(id).inputs) reach[static_cast<std::size_t>(in)] = 1;
  std::int32_t prev = -1;
  for (std::int32_t id = 0; id <= loss; ++id) {
    if (!reach[static_cast<std::size_t>(id)] || g.is_leaf(id)) continue;
    for (auto in : g.node(id).inputs)
      if (!g.is_leaf(in) && in != prev) return false;
    prev = id;
  }
  return true;
}

}  // namespace remat

// Attention over a batch of two (B = 2, H = 2, N = 70: two key tiles, d = 8)
// whose first element holds 37 keys, the rest padding filled with `pad`:
// the output and the gradients of q, k and v (loss: sum of out * w), on
// `dev`, as doubles. Padding is never read, so they do not depend on `pad`.
inline std::vector<std::vector<double>> padded_attention(DType dt, bool causal, double pad, Device dev) {
  const std::int64_t B = 2, H = 2, N = 70, d = 8, len0 = 37;
  Rng rng(11);
  Tensor q = Tensor::randn({B, H, N, d}, rng, DType::f64), k = Tensor::randn({B, H, N, d}, rng, DType::f64),
         v = Tensor::randn({B, H, N, d}, rng, DType::f64), w = Tensor::randn({B, H, N, d}, rng, DType::f64);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t j = len0; j < N; ++j)
      for (std::int64_t c = 0; c < d; ++c) {
        const std::int64_t at = (h * N + j) * d + c;  // batch element 0
        k.data<double>()[at] = pad;
        v.data<double>()[at] = pad;
      }
  std::vector<std::int64_t> lv{len0, N};
  Graph g;
  auto in = [&](const Tensor& t) { return g.input(t.to(dt).to(dev)); };
  Var qv = in(q), kv = in(k), vv = in(v);
  AttentionOptions o;
  o.causal = causal;
  o.key_lengths = g.input(Tensor::from(std::span<const std::int64_t>(lv), {B}).to(dev));
  Var out = attention(qv, kv, vv, o);
  Var loss = sum(cast(mul(cast(out, DType::f64), g.input(w.to(dev))), DType::f64));
  auto grads = grad(loss, {qv, kv, vv});
  std::vector<std::vector<double>> r{out.value().to(Device::cpu()).to_vector()};
  for (auto& gv : grads) r.push_back(gv.value().to(Device::cpu()).to_vector());
  return r;
}

}  // namespace ad::test
