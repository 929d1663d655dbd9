// The gradcheck cases, at least 3 per differentiable op, with shapes that
// exercise broadcasting, rank 1 / rank 3-4, size-1 dims, non-last axes,
// transposes and batches. Inputs are kept in each op's smooth domain.
// tests/gradcheck.cpp runs them and checks that every op of the table has them.
#include <cmath>
#include <limits>

#include "test_util.hpp"

namespace ad::test {

namespace {
using Build = std::function<Var(const std::vector<Var>&)>;

struct CaseList {
  std::vector<GradCase> v;
  void add(OpId op, std::string label, std::vector<Tensor> in, Build b) {
    v.push_back({op, std::move(label), std::move(in), std::move(b)});
  }
};

// Values k + off + jitter (k an integer in [-3, 3), jitter in [0, 0.1)): two
// grids at offsets 0.2 and 0.6 are never within 0.3 of each other, so no
// comparison or max between them flips within a finite difference's eps.
Tensor offset_grid(const Shape& s, double off, Rng& rng) {
  Tensor k = uniform64(s, rng, -3, 3), j = uniform64(s, rng, 0, 0.1);
  double* p = k.data<double>();
  const double* q = j.data<double>();
  for (std::int64_t i = 0; i < k.numel(); ++i) p[i] = std::floor(p[i]) + off + q[i];
  return k;
}

enum class Domain { any, positive, away_from_zero, small };  // small: |x| in [1e-3, 4e-3]
Tensor draw(Domain d, const Shape& s, Rng& rng) {
  switch (d) {
    case Domain::any: return randn64(s, rng);
    case Domain::positive: return uniform64(s, rng, 0.2, 3.0);
    case Domain::away_from_zero: return away_from_zero(s, rng, 0.2, 2.0);
    case Domain::small: return away_from_zero(s, rng, 1e-3, 4e-3);
  }
  return {};
}
const Shape kUnaryShapes[] = {{3, 4}, {7}, {2, 3, 4}, {1, 5, 1}};

// ---- elementwise: unary, with a scalar, binary ----
void elementwise(CaseList& c, Rng& rng) {
  struct U { OpId op; Var (*fn)(const Operand&); Domain d; };
  const U unary[] = {
      {OpId::neg, ad::neg, Domain::any},       {OpId::exp, ad::exp, Domain::any},
      {OpId::log, ad::log, Domain::positive},  {OpId::sqrt, ad::sqrt, Domain::positive},
      {OpId::abs, ad::abs, Domain::away_from_zero}, {OpId::sign, ad::sign, Domain::away_from_zero},
      {OpId::tanh, ad::tanh, Domain::any},     {OpId::sigmoid, ad::sigmoid, Domain::any},
      {OpId::relu, ad::relu, Domain::away_from_zero}, {OpId::gelu, ad::gelu, Domain::any},
      {OpId::silu, ad::silu, Domain::any},
  };
  for (const U& u : unary)
    for (const Shape& s : kUnaryShapes) {
      auto fn = u.fn;
      c.add(u.op, s.str(), {draw(u.d, s, rng)}, [fn](const std::vector<Var>& v) { return fn(v[0]); });
    }
  // the activations on a wider range (saturated tails of tanh/sigmoid, negative tail of gelu/silu)
  for (const U& u : {U{OpId::tanh, ad::tanh, Domain::any}, U{OpId::sigmoid, ad::sigmoid, Domain::any},
                     U{OpId::gelu, ad::gelu, Domain::any}, U{OpId::silu, ad::silu, Domain::any},
                     U{OpId::exp, ad::exp, Domain::any}}) {
    auto fn = u.fn;
    c.add(u.op, "[4,5] x in (-6, 6]", {uniform64({4, 5}, rng, -6, 6)}, [fn](const std::vector<Var>& v) { return fn(v[0]); });
  }

  // cast: f64 -> f32 -> f64 round trip on |x| <= 4e-3, where the f32 rounding
  // (<= 2.4e-10) is far below eps; and the identity cast f64 -> f64
  for (const Shape& s : {Shape{3, 4}, Shape{2, 3, 4}, Shape{7}})
    c.add(OpId::cast, "f64->f32->f64 " + s.str(), {draw(Domain::small, s, rng)},
          [](const std::vector<Var>& v) { return cast(cast(v[0], DType::f32), DType::f64); });
  c.add(OpId::cast, "f64->f64 [2,1,3]", {randn64({2, 1, 3}, rng)},
        [](const std::vector<Var>& v) { return cast(v[0], DType::f64); });

  // with a scalar
  for (double s : {0.7, -2.5}) {
    c.add(OpId::add_scalar, fmt::format("[3,4] + {}", s), {randn64({3, 4}, rng)},
          [s](const std::vector<Var>& v) { return add_scalar(v[0], s); });
    c.add(OpId::mul_scalar, fmt::format("[2,3,4] * {}", s), {randn64({2, 3, 4}, rng)},
          [s](const std::vector<Var>& v) { return mul_scalar(v[0], s); });
    c.add(OpId::div_scalar, fmt::format("[2,3] / {}", s), {randn64({2, 3}, rng)},
          [s](const std::vector<Var>& v) { return div_scalar(v[0], s); });
    c.add(OpId::rsub_scalar, fmt::format("{} - [7]", s), {randn64({7}, rng)},
          [s](const std::vector<Var>& v) { return rsub_scalar(v[0], s); });
    c.add(OpId::rdiv_scalar, fmt::format("{} / [3,4]", s), {away_from_zero({3, 4}, rng, 0.5, 2.0)},
          [s](const std::vector<Var>& v) { return rdiv_scalar(v[0], s); });
  }
  c.add(OpId::add_scalar, "[1,5,1] + 3", {randn64({1, 5, 1}, rng)}, [](const std::vector<Var>& v) { return v[0] + 3.0; });
  c.add(OpId::mul_scalar, "4 * [7]", {randn64({7}, rng)}, [](const std::vector<Var>& v) { return 4.0 * v[0]; });
  c.add(OpId::div_scalar, "[7] / 4", {randn64({7}, rng)}, [](const std::vector<Var>& v) { return v[0] / 4.0; });
  c.add(OpId::rsub_scalar, "1 - [2,3,4]", {randn64({2, 3, 4}, rng)}, [](const std::vector<Var>& v) { return 1.0 - v[0]; });
  c.add(OpId::rdiv_scalar, "1 / [2,1,3]", {away_from_zero({2, 1, 3}, rng, 0.5, 2.0)},
        [](const std::vector<Var>& v) { return 1.0 / v[0]; });
  // pow_scalar: the general path, the p == 2 / 1 / 0 shortcuts, and p = 3 on both signs
  for (double p : {0.5, -1.5, 2.0, 1.0, 0.0})
    c.add(OpId::pow_scalar, fmt::format("[3,4] ^ {}", p), {uniform64({3, 4}, rng, 0.3, 2.0)},
          [p](const std::vector<Var>& v) { return pow_scalar(v[0], p); });
  c.add(OpId::pow_scalar, "[2,3,4] ^ 3 (both signs)", {randn64({2, 3, 4}, rng)},
        [](const std::vector<Var>& v) { return pow_scalar(v[0], 3.0); });

  // binary, with broadcasting on either side and on both
  struct Bn { OpId op; Var (*fn)(const Operand&, const Operand&); Domain da, db; };
  const Bn binary[] = {
      {OpId::add, ad::add, Domain::any, Domain::any},
      {OpId::sub, ad::sub, Domain::any, Domain::any},
      {OpId::mul, ad::mul, Domain::any, Domain::any},
      {OpId::div, ad::div, Domain::any, Domain::away_from_zero},
      {OpId::pow, ad::pow, Domain::positive, Domain::any},
  };
  const std::pair<Shape, Shape> shapes[] = {
      {{3, 4}, {3, 4}}, {{2, 3, 4}, {3, 1}}, {{4}, {2, 3, 4}},    {{2, 1}, {1, 3}},
      {{1}, {5}},       {{2, 3, 4}, {2, 1, 4}}, {{3, 1, 5}, {1, 4, 1}}, {{}, {3, 2}}};
  // maximum / minimum: a on a grid of k + 0.2, b of k + 0.6 (k integer, small jitter): never within
  // 0.3 of each other, in either order, however they broadcast
  auto grid = [&rng](const Shape& s, double off) { return offset_grid(s, off, rng); };
  for (const auto& [sa, sb] : {std::pair<Shape, Shape>{{3, 4}, {3, 4}}, {{2, 3, 4}, {3, 1}}, {{2, 1}, {1, 3}}, {{}, {3, 2}}}) {
    c.add(OpId::maximum, sa.str() + " , " + sb.str(), {grid(sa, 0.2), grid(sb, 0.6)},
          [](const std::vector<Var>& v) { return maximum(v[0], v[1]); });
    c.add(OpId::minimum, sa.str() + " , " + sb.str(), {grid(sa, 0.6), grid(sb, 0.2)},
          [](const std::vector<Var>& v) { return minimum(v[0], v[1]); });
  }
  // sin, cos; clamp with x on a grid of k/2 + 1/4 (never within 0.2 of a bound at a multiple of 1/2)
  for (const Shape& s : {Shape{3, 4}, Shape{2, 3, 5}, Shape{7}}) {
    c.add(OpId::sin, s.str(), {randn64(s, rng, 0, 2)}, [](const std::vector<Var>& v) { return sin(v[0]); });
    c.add(OpId::cos, s.str(), {randn64(s, rng, 0, 2)}, [](const std::vector<Var>& v) { return cos(v[0]); });
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& bounds : {std::pair<double, double>{-0.5, 0.5}, {-inf, 0.5}, {-1.0, inf}, {0.0, 0.0}}) {
    const double lo = bounds.first, hi = bounds.second;  // not structured bindings: clang 14 lambdas cannot capture them
    Tensor x = grid({4, 5}, 0.2);
    double* p = x.data<double>();
    for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] * 0.5 + 0.025;  // k/2 + 0.125 .. 0.175
    c.add(OpId::clamp, fmt::format("[4,5] to [{}, {}]", lo, hi), {x},
          [lo, hi](const std::vector<Var>& v) { return clamp(v[0], lo, hi); });
  }
  // the activations' backward ops (y or x, dy): their own gradients are the second derivatives
  {
    auto bwd = [](OpId op) { return [op](const std::vector<Var>& v) { return make_node(op, {v[0], v[1]}); }; };
    for (const Shape& s : {Shape{3, 4}, Shape{2, 3, 2}, Shape{7}}) {
      c.add(OpId::tanh_backward, "y in (-0.9, 0.9) " + s.str(), {uniform64(s, rng, -0.9, 0.9), randn64(s, rng)},
            bwd(OpId::tanh_backward));
      c.add(OpId::sigmoid_backward, "y in (0.05, 0.95) " + s.str(), {uniform64(s, rng, 0.05, 0.95), randn64(s, rng)},
            bwd(OpId::sigmoid_backward));
      c.add(OpId::relu_backward, "y away from 0 " + s.str(), {away_from_zero(s, rng), randn64(s, rng)},
            bwd(OpId::relu_backward));
      c.add(OpId::gelu_backward, s.str(), {randn64(s, rng, 0, 2), randn64(s, rng)}, bwd(OpId::gelu_backward));
      c.add(OpId::silu_backward, s.str(), {randn64(s, rng, 0, 2), randn64(s, rng)}, bwd(OpId::silu_backward));
    }
    const double big = std::numeric_limits<double>::infinity();
    for (const auto& bounds : {std::pair<double, double>{-0.5, 0.5}, {-big, 0.5}, {-1.0, big}}) {
      Tensor x = grid({4, 5}, 0.2);
      double* p = x.data<double>();
      for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = p[i] * 0.5 + 0.025;  // away from the bounds, as clamp's
      Attrs at;
      at.scalar = bounds.first;
      at.scalar2 = bounds.second;
      c.add(OpId::clamp_backward, fmt::format("[4,5] to [{}, {}]", bounds.first, bounds.second),
            {x, randn64({4, 5}, rng)},
            [at](const std::vector<Var>& v) { return make_node(OpId::clamp_backward, {v[0], v[1]}, at); });
    }
  }
  for (const Bn& b : binary)
    for (const auto& [sa, sb] : shapes) {
      auto fn = b.fn;
      c.add(b.op, sa.str() + " , " + sb.str(), {draw(b.da, sa, rng), draw(b.db, sb, rng)},
            [fn](const std::vector<Var>& v) { return fn(v[0], v[1]); });
    }
}

// ---- matmul ----
void linalg(CaseList& c, Rng& rng) {
  struct M { Shape a, b; bool ta, tb; };
  const M ms[] = {
      {{3, 4}, {4, 5}, false, false},         {{4, 3}, {4, 5}, true, false},
      {{3, 4}, {5, 4}, false, true},          {{4, 3}, {5, 4}, true, true},
      {{2, 3, 4}, {2, 4, 5}, false, false},   {{2, 3, 4}, {4, 5}, false, false},  // folded batch
      {{2, 3, 4}, {5, 4}, false, true},       {{2, 4, 3}, {4, 5}, true, false},
      {{3, 4}, {2, 4, 5}, false, false},      {{4, 3}, {2, 5, 4}, true, true},
      {{2, 2, 3, 4}, {2, 2, 5, 4}, false, true}, {{1, 4}, {4, 1}, false, false},
      {{2, 1, 3, 4}, {3, 4, 2}, false, false}, {{1, 4, 3}, {2, 2, 5, 4}, true, true},  // broadcast batch dims
      {{2, 2, 3, 4}, {2, 1, 4, 5}, false, false},  // an inner batch dim broadcast: several cuBLAS runs
      {{4}, {4, 5}, false, false},            {{2, 3, 4}, {4}, false, false},        // vectors
      {{4}, {2, 5, 4}, false, true},          {{4}, {4}, false, false},
  };
  for (const M& m : ms) {
    bool ta = m.ta, tb = m.tb;
    c.add(OpId::matmul, fmt::format("{}{} x {}{}", m.a.str(), ta ? "^T" : "", m.b.str(), tb ? "^T" : ""),
          {randn64(m.a, rng), randn64(m.b, rng)},
          [ta, tb](const std::vector<Var>& v) { return matmul(v[0], v[1], ta, tb); });
  }
}

// ---- shape ops ----
void shape_ops(CaseList& c, Rng& rng) {
  const std::pair<Shape, Shape> reshapes[] = {{{2, 3, 4}, {6, 4}}, {{12}, {3, -1}}, {{3, 4}, {2, 1, 6}}, {{1, 5}, {5}}};
  for (const auto& [s, t] : reshapes) {
    Shape to = t;
    c.add(OpId::reshape, s.str() + " -> " + t.str(), {randn64(s, rng)},
          [to](const std::vector<Var>& v) { return reshape(v[0], to); });
  }
  const std::pair<Shape, Shape> perms[] = {{{2, 3, 4}, {2, 0, 1}}, {{3, 4}, {1, 0}}, {{2, 1, 3, 2}, {3, 1, 0, 2}}, {{5}, {0}}};
  for (const auto& [s, p] : perms) {
    Shape perm = p;
    c.add(OpId::permute, s.str() + " perm " + p.str(), {randn64(s, rng)},
          [perm](const std::vector<Var>& v) { return permute(v[0], perm); });
  }
  c.add(OpId::permute, "transpose [2,3,4] (0, 2)", {randn64({2, 3, 4}, rng)},
        [](const std::vector<Var>& v) { return transpose(v[0], 0, 2); });
  const std::pair<Shape, Shape> bcasts[] = {{{3, 1}, {2, 3, 4}}, {{4}, {3, 4}}, {{1}, {2, 2}}, {{2, 1, 3}, {2, 4, 3}}};
  for (const auto& [s, t] : bcasts) {
    Shape to = t;
    c.add(OpId::broadcast_to, s.str() + " -> " + t.str(), {randn64(s, rng)},
          [to](const std::vector<Var>& v) { return broadcast_to(v[0], to); });
  }
  const std::pair<Shape, Shape> sums[] = {{{2, 3, 4}, {3, 1}}, {{3, 4}, {4}}, {{2, 3}, {}}, {{2, 3, 4}, {2, 1, 4}}};
  for (const auto& [s, t] : sums) {
    Shape to = t;
    c.add(OpId::sum_to, s.str() + " -> " + t.str(), {randn64(s, rng)},
          [to](const std::vector<Var>& v) { return sum_to(v[0], to); });
  }
  struct Sl { Shape s; int axis; std::int64_t start, stop; };
  const Sl slices[] = {{{5, 3}, 0, 1, 4}, {{2, 6, 3}, 1, -4, -1}, {{4, 5}, -1, 2, 100}, {{7}, 0, 0, 7}};
  for (const Sl& s : slices) {
    int axis = s.axis;
    std::int64_t b = s.start, e = s.stop;
    c.add(OpId::slice, fmt::format("{} axis {} [{}, {})", s.s.str(), axis, b, e), {randn64(s.s, rng)},
          [axis, b, e](const std::vector<Var>& v) { return slice(v[0], axis, b, e); });
  }
  // slice_backward has its own backward rule (slice), so its own gradcheck: dy -> x-shaped zeros + dy
  struct SlB { Shape dy, x; std::int64_t axis, start, stop; };
  const SlB sbs[] = {{{3, 3}, {5, 3}, 0, 1, 4}, {{2, 3, 3}, {2, 6, 3}, 1, 2, 5}, {{4, 3}, {4, 5}, 1, 2, 5}, {{7}, {7}, 0, 0, 7}};
  for (const SlB& s : sbs) {
    Attrs at;
    at.shape = s.x;
    at.axis = s.axis;
    at.start = s.start;
    at.stop = s.stop;
    c.add(OpId::slice_backward, fmt::format("{} into {} axis {} [{}, {})", s.dy.str(), s.x.str(), s.axis, s.start, s.stop),
          {randn64(s.dy, rng)}, [at](const std::vector<Var>& v) { return make_node(OpId::slice_backward, {v[0]}, at); });
  }
  // part: a flat view at an offset; two overlapping parts of one tensor feed one op
  c.add(OpId::part, "[4,5] 12 at 3 as [2,6]", {randn64({4, 5}, rng)},
        [](const std::vector<Var>& v) { return part(v[0], 3, {2, 6}); });
  c.add(OpId::part, "[6] whole as [2,3]", {randn64({6}, rng)},
        [](const std::vector<Var>& v) { return part(v[0], 0, {2, 3}); });
  c.add(OpId::part, "[2,4] overlapping parts multiplied", {randn64({2, 4}, rng)},
        [](const std::vector<Var>& v) { return part(v[0], 0, {5}) * part(v[0], 3, {5}); });
  struct PB { Shape dy, x; std::int64_t start; };
  const PB pbs[] = {{{2, 3}, {4, 5}, 7}, {{6}, {6}, 0}, {{3}, {2, 4}, 5}};
  for (const PB& s : pbs) {
    Attrs at;
    at.shape = s.x;
    at.start = s.start;
    c.add(OpId::part_backward, fmt::format("{} into {} at {}", s.dy.str(), s.x.str(), s.start), {randn64(s.dy, rng)},
          [at](const std::vector<Var>& v) { return make_node(OpId::part_backward, {v[0]}, at); });
  }
  // concat of 3, of 2 along the last axis, along a middle axis, and of 1
  c.add(OpId::concat, "[2,3] [1,3] [4,3] axis 0", {randn64({2, 3}, rng), randn64({1, 3}, rng), randn64({4, 3}, rng)},
        [](const std::vector<Var>& v) { return concat({v[0], v[1], v[2]}, 0); });
  c.add(OpId::concat, "[2,1,4] [2,3,4] [2,2,4] axis 1",
        {randn64({2, 1, 4}, rng), randn64({2, 3, 4}, rng), randn64({2, 2, 4}, rng)},
        [](const std::vector<Var>& v) { return concat({v[0], v[1], v[2]}, 1); });
  c.add(OpId::concat, "[3,2] [3,5] axis -1", {randn64({3, 2}, rng), randn64({3, 5}, rng)},
        [](const std::vector<Var>& v) { return concat({v[0], v[1]}, -1); });
  c.add(OpId::concat, "[4,2] alone", {randn64({4, 2}, rng)}, [](const std::vector<Var>& v) { return concat({v[0]}, 0); });
  // gather with repeated indices (the scatter-add in backward must accumulate), along axes 0, 1, -1; embedding
  struct G { Shape x; std::vector<std::int64_t> idx; Shape is; int axis; };
  const G gs[] = {{{5, 3}, {0, 2, 2, 4, 0, 2}, {6}, 0},
                  {{3, 6}, {1, 5, 5, 0}, {2, 2}, 1},
                  {{2, 4, 3}, {3, 3, 0, 1, 3}, {5}, 1},
                  {{2, 3, 4}, {3, 0, 3}, {3}, -1}};
  for (const G& gc : gs) {
    int axis = gc.axis;
    c.add(OpId::gather, fmt::format("{} axis {} index {} (repeats)", gc.x.str(), axis, gc.is.str()),
          {randn64(gc.x, rng), index(gc.idx, gc.is)},
          [axis](const std::vector<Var>& v) { return gather(v[0], v[1], axis); });
  }
  c.add(OpId::gather, "embedding [7,4] ids [2,3] (repeats)", {randn64({7, 4}, rng), index({6, 0, 6, 3, 3, 6}, {2, 3})},
        [](const std::vector<Var>& v) { return embedding(v[0], v[1]); });
  c.add(OpId::gather, "embedding [5,3] ids [4]", {randn64({5, 3}, rng), index({4, 1, 1, 0}, {4})},
        [](const std::vector<Var>& v) { return embedding(v[0], v[1]); });
  // gather_backward has its own backward rule (gather): dy -> scatter-add into x's shape
  struct GB { Shape dy, x; std::vector<std::int64_t> idx; Shape is; std::int64_t axis; };
  const GB gbs[] = {{{6, 3}, {5, 3}, {0, 2, 2, 4, 0, 2}, {6}, 0},
                    {{3, 2, 2}, {3, 6}, {1, 5, 5, 0}, {2, 2}, 1},
                    {{2, 5, 3}, {2, 4, 3}, {3, 3, 0, 1, 3}, {5}, 1}};
  for (const GB& gb : gbs) {
    Attrs at;
    at.shape = gb.x;
    at.axis = gb.axis;
    c.add(OpId::gather_backward, fmt::format("{} into {} axis {} (repeats)", gb.dy.str(), gb.x.str(), gb.axis),
          {randn64(gb.dy, rng), index(gb.idx, gb.is)},
          [at](const std::vector<Var>& v) { return make_node(OpId::gather_backward, {v[0], v[1]}, at); });
  }
}

// ---- reductions and the softmax family ----
void reductions(CaseList& c, Rng& rng) {
  struct R { Shape s, axes; bool keepdim; };
  const R rs[] = {{{3, 4}, {}, false},     {{3, 4, 2}, {1}, true},  {{2, 3, 4}, {0, 2}, false},
                  {{7}, {0}, false},       {{2, 3, 4}, {-1}, true}, {{2, 3, 4}, {0}, false},
                  {{2, 3, 4}, {}, true},   {{2, 3, 4}, {0, 2}, true}};
  for (const R& r : rs) {
    Shape axes = r.axes;
    bool kd = r.keepdim;
    auto label = fmt::format("{} axes {}{}", r.s.str(), axes.str(), kd ? " keepdim" : "");
    c.add(OpId::sum, label, {randn64(r.s, rng)}, [axes, kd](const std::vector<Var>& v) { return sum(v[0], axes, kd); });
    c.add(OpId::mean, label, {randn64(r.s, rng)}, [axes, kd](const std::vector<Var>& v) { return mean(v[0], axes, kd); });
    // distinct values 0.1 apart: no ties, and eps never changes which element is maximal
    c.add(OpId::max, label, {distinct(r.s, rng)}, [axes, kd](const std::vector<Var>& v) { return max(v[0], axes, kd); });
  }
  struct A { Shape s; int axis; bool keepdim; };
  const A as[] = {{{3, 5}, -1, false}, {{3, 5}, 0, true}, {{2, 3, 4}, 1, false}, {{6}, 0, false}, {{2, 3, 4}, 1, true}};
  for (const A& a : as) {
    int axis = a.axis;
    bool kd = a.keepdim;
    auto label = fmt::format("{} axis {}", a.s.str(), axis);
    c.add(OpId::logsumexp, label + (kd ? " keepdim" : ""), {randn64(a.s, rng, 0, 2)},
          [axis, kd](const std::vector<Var>& v) { return logsumexp(v[0], axis, kd); });
    if (kd && a.s.rank() == 3) continue;  // softmax has no keepdim: the same case once is enough
    c.add(OpId::softmax, label, {randn64(a.s, rng, 0, 2)},
          [axis](const std::vector<Var>& v) { return softmax(v[0], axis); });
    c.add(OpId::log_softmax, label, {randn64(a.s, rng, 0, 2)},
          [axis](const std::vector<Var>& v) { return log_softmax(v[0], axis); });
  }
  // logsumexp_backward (x, y, dy), y free around the rows' logsumexp, kept dim or not
  struct L { Shape x, y; int axis; bool keepdim; };
  for (const L& l : {L{{3, 5}, {3}, 1, false}, L{{3, 5}, {1, 5}, 0, true}, L{{2, 3, 4}, {2, 4}, 1, false}}) {
    Attrs at;
    at.axis = l.axis;
    at.keepdim = l.keepdim;
    c.add(OpId::logsumexp_backward, fmt::format("{} axis {}{}", l.x.str(), l.axis, l.keepdim ? " keepdim" : ""),
          {randn64(l.x, rng), uniform64(l.y, rng, 1.0, 2.0), randn64(l.y, rng)},
          [at](const std::vector<Var>& v) { return make_node(OpId::logsumexp_backward, {v[0], v[1], v[2]}, at); });
  }
  // their backward ops (y, dy) along an axis: the second derivatives (y free, as a double backward sees it)
  struct B { Shape s; int axis; };
  for (const B& b : {B{{3, 5}, 1}, B{{3, 5}, 0}, B{{2, 3, 4}, 1}, B{{6}, 0}}) {
    Attrs at;
    at.axis = b.axis;
    auto label = fmt::format("{} axis {}", b.s.str(), b.axis);
    c.add(OpId::softmax_backward, label, {uniform64(b.s, rng, 0.05, 0.6), randn64(b.s, rng)},
          [at](const std::vector<Var>& v) { return make_node(OpId::softmax_backward, {v[0], v[1]}, at); });
    c.add(OpId::log_softmax_backward, label, {uniform64(b.s, rng, -3.0, -0.2), randn64(b.s, rng)},
          [at](const std::vector<Var>& v) { return make_node(OpId::log_softmax_backward, {v[0], v[1]}, at); });
  }
}

// ---- normalisation, losses, dropout ----
void nn_ops(CaseList& c, Rng& rng) {
  for (const Shape& s : {Shape{4, 6}, Shape{2, 3, 5}, Shape{1, 8}, Shape{5}}) {
    Shape d{s.back()};
    c.add(OpId::layer_norm, s.str(), {randn64(s, rng, 0.5, 1.5), randn64(d, rng, 1, 0.5), randn64(d, rng)},
          [](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2]); });
    c.add(OpId::rms_norm, s.str(), {randn64(s, rng, 0.5, 1.5), randn64(d, rng, 1, 0.5)},
          [](const std::vector<Var>& v) { return rms_norm(v[0], v[1]); });
  }
  c.add(OpId::rms_norm, "[3,1,4]", {randn64({3, 1, 4}, rng), randn64({4}, rng)},
        [](const std::vector<Var>& v) { return rms_norm(v[0], v[1]); });
  // cross_entropy differentiates the logits only (labels are i64)
  struct CE { Shape logits; Reduction red; };
  const CE ces[] = {{{4, 5}, Reduction::mean}, {{4, 5}, Reduction::sum}, {{2, 3, 4}, Reduction::mean},
                    {{1, 6}, Reduction::sum},  {{6, 2}, Reduction::mean}};
  for (const CE& ce : ces) {
    Shape ls = ce.logits, ys = ls;
    ys.pop_back();
    Reduction red = ce.red;
    c.add(OpId::cross_entropy, fmt::format("{} {}", ls.str(), red == Reduction::mean ? "mean" : "sum"),
          {randn64(ls, rng, 0, 2), Tensor::randint(ys, rng, ls.back())},
          [red](const std::vector<Var>& v) { return cross_entropy(v[0], v[1], red); });
  }
  // cross_entropy_backward (logits, labels, dy): its gradients in the logits and in dy, and the same
  // reached as grad() of cross_entropy inside a larger graph (a gradient penalty)
  for (const CE& ce : {CE{{4, 5}, Reduction::mean}, CE{{2, 3, 4}, Reduction::sum}, CE{{1, 6}, Reduction::mean}}) {
    Shape ls = ce.logits, ys = ls;
    ys.pop_back();
    Attrs at;
    at.reduction = ce.red;
    c.add(OpId::cross_entropy_backward, fmt::format("{} {}", ls.str(), ce.red == Reduction::mean ? "mean" : "sum"),
          {randn64(ls, rng, 0, 2), Tensor::randint(ys, rng, ls.back()), randn64({}, rng, 1, 0.5)},
          [at](const std::vector<Var>& v) { return make_node(OpId::cross_entropy_backward, {v[0], v[1], v[2]}, at); });
  }
  c.add(OpId::cross_entropy_backward, "grad of cross_entropy(x W) in W, squared",
        {randn64({3, 4}, rng), randn64({4, 5}, rng, 0, 0.7), Tensor::randint({3}, rng, 5)},
        [](const std::vector<Var>& v) {
          Var gw = grad(cross_entropy(matmul(v[0], v[1]), v[2]), {v[1]})[0];
          return mul(gw, gw);
        });
  struct MS { Shape s; Reduction red; };
  const MS mses[] = {{{3, 4}, Reduction::mean}, {{3, 4}, Reduction::sum}, {{2, 3, 2}, Reduction::mean}, {{7}, Reduction::sum}};
  for (const MS& m : mses) {
    Reduction red = m.red;
    c.add(OpId::mse, fmt::format("{} {}", m.s.str(), red == Reduction::mean ? "mean" : "sum"),
          {randn64(m.s, rng), randn64(m.s, rng)}, [red](const std::vector<Var>& v) { return mse(v[0], v[1], red); });
  }
  // dropout: the mask is a pure function of (seed, offset, i), so every re-evaluation draws the same mask
  const std::pair<Shape, std::uint64_t> ds[] = {{{4, 5}, 7}, {{3, 2, 4}, 1000}, {{17}, 123456789}};
  for (const auto& [s, off] : ds) {
    std::uint64_t o = off;
    c.add(OpId::dropout, fmt::format("{} p=0.3 offset {}", s.str(), o), {randn64(s, rng)},
          [o](const std::vector<Var>& v) { return dropout(v[0], 0.3, 42, o); });
  }
}
// ---- comparisons and where: appended last, with their own Rng, so the
//      cases before them keep their inputs and weight seeds ----
void comparisons_and_where(CaseList& c) {
  Rng rng(20261128);
  // a grid of k + off (k integer in [-3, 3), jitter below 0.1): grids at offsets 0.2 and 0.6 are never within
  // 0.3 of each other, so no comparison flips within eps
  auto grid = [&rng](const Shape& s, double off) { return offset_grid(s, off, rng); };
  struct Cmp { OpId op; Var (*fn)(const Operand&, const Operand&); };
  const Cmp cmps[] = {{OpId::greater, ad::greater}, {OpId::greater_equal, ad::greater_equal}, {OpId::less, ad::less},
                      {OpId::less_equal, ad::less_equal}, {OpId::equal, ad::equal}, {OpId::not_equal, ad::not_equal}};
  const std::pair<Shape, Shape> shapes[] = {{{3, 4}, {3, 4}}, {{2, 3, 4}, {3, 1}}, {{2, 1}, {1, 3}}, {{}, {3, 2}}};
  for (const Cmp& cm : cmps) {
    auto fn = cm.fn;
    for (const auto& sh : shapes)
      c.add(cm.op, sh.first.str() + " , " + sh.second.str(), {grid(sh.first, 0.2), grid(sh.second, 0.6)},
            [fn](const std::vector<Var>& v) { return fn(v[0], v[1]); });
    // ties that stay ties under any perturbation: a against maximum(a, b) (equal where a > b), and x against itself
    c.add(cm.op, "a , maximum(a, b) [2,3,4] [3,1]", {grid({2, 3, 4}, 0.2), grid({3, 1}, 0.6)},
          [fn](const std::vector<Var>& v) { return fn(v[0], maximum(v[0], v[1])); });
    c.add(cm.op, "x , x [5]", {randn64({5}, rng)}, [fn](const std::vector<Var>& v) { return fn(v[0], v[0]); });
  }
  // where: cond = (c > 0) with c away from 0; each operand broadcast in turn, then all three
  auto positive = [](const Var& x) { return greater(x, full(x, {}, 0.0, x.dtype())); };
  struct W { Shape sc, sa, sb; };
  const W ws[] = {{{3, 4}, {3, 4}, {3, 4}},       {{3, 1}, {2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {3, 1}, {2, 3, 4}},
                  {{2, 3, 4}, {2, 3, 4}, {4}},    {{2, 1, 4}, {2, 3, 4}, {}},     {{1, 4}, {3, 1}, {2, 1, 1}},
                  {{}, {2, 3}, {3}},              {{5}, {1}, {5}}};
  for (const W& w : ws)
    c.add(OpId::where, fmt::format("cond {} a {} b {}", w.sc.str(), w.sa.str(), w.sb.str()),
          {away_from_zero(w.sc, rng), randn64(w.sa, rng), randn64(w.sb, rng)},
          [positive](const std::vector<Var>& v) { return where(positive(v[0]), v[1], v[2]); });
  // the scalar forms, and cond from the operands themselves (minimum and maximum without ties)
  c.add(OpId::where, "where(cond [3,4], x [3,4], 0.0)", {away_from_zero({3, 4}, rng), randn64({3, 4}, rng)},
        [positive](const std::vector<Var>& v) { return where(positive(v[0]), v[1], 0.0); });
  c.add(OpId::where, "where(cond [2,1], -1.5, x [2,3])", {away_from_zero({2, 1}, rng), randn64({2, 3}, rng)},
        [positive](const std::vector<Var>& v) { return where(positive(v[0]), -1.5, v[1]); });
  c.add(OpId::where, "where(a < b, a, b) [2,3,4] [3,1]", {grid({2, 3, 4}, 0.2), grid({3, 1}, 0.6)},
        [](const std::vector<Var>& v) { return where(less(v[0], v[1]), v[0], v[1]); });
}
}  // namespace

std::vector<GradCase> gradcheck_cases() {
  Rng rng(20240611);
  CaseList c;
  elementwise(c, rng);
  linalg(c, rng);
  shape_ops(c, rng);
  reductions(c, rng);
  nn_ops(c, rng);
  attention_gradcheck_cases(c.v, rng);
  semicrf_gradcheck_cases(c.v, rng);
  semiseparable_gradcheck_cases(c.v, rng);
  conv_gradcheck_cases(c.v, rng);
  comparisons_and_where(c);
  return std::move(c.v);
}

}  // namespace ad::test
