#pragma once
// Shared test helpers: seeded random tensors in an op's smooth domain, graphs
// with poisoned outputs, and the float64 central-difference gradcheck.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "ad/ad.hpp"
#include "core/graph_impl.hpp"

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

}  // namespace ad::test
