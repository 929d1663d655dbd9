// attention: the fused op against the same attention composed from core ops
// (matmul, softmax, matmul, masks as -inf constants) in f64 — forward and the
// gradients of q, k, v — causal and not, padding, grouped-query heads,
// Nq != Nk, sizes that are not multiples of the tiles; f32 against f64;
// fully masked rows; misuse; memory linear in N (predicted == measured);
// determinism (repeat runs, remat policies, 1/2/3 kernel threads). Gradcheck
// cases are registered for tests/gradcheck.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/attention_cpu.hpp"
#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

namespace {

struct Cfg {
  std::int64_t B = 1, H = 1, Hkv = 1, Nq = 1, Nk = 1, d = 8;
  bool causal = false;
  std::vector<std::int64_t> lens;  // empty: no padding
  double scale = 0;                // 0: the default 1/sqrt(d)
  std::string str() const {
    std::string s = fmt::format("B={} H={} Hkv={} Nq={} Nk={} d={}{}", B, H, Hkv, Nq, Nk, d, causal ? " causal" : "");
    if (!lens.empty()) s += " lens=" + fmt::format("{}", fmt::join(lens, ","));
    if (scale != 0) s += fmt::format(" scale={}", scale);
    return s;
  }
};

AttentionOptions options_of(const Cfg& c, Graph& g) {
  AttentionOptions o;
  o.causal = c.causal;
  if (c.scale != 0) o.scale = c.scale;
  if (!c.lens.empty()) o.key_lengths = g.input(index(c.lens, {c.B}));
  return o;
}

// The additive mask [B, 1, Nq, Nk]: 0 where query i may see key j, -inf elsewhere.
// Written from the definition, independently of the kernel's key_end.
Tensor mask_of(const Cfg& c, DType t) {
  Tensor m = Tensor::zeros({c.B, 1, c.Nq, c.Nk}, DType::f64);
  double* p = m.data<double>();
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t i = 0; i < c.Nq; ++i)
      for (std::int64_t j = 0; j < c.Nk; ++j) {
        bool visible = c.lens.empty() || j < c.lens[static_cast<std::size_t>(b)];
        if (c.causal) visible = visible && j <= i + (c.Nk - c.Nq);
        p[(b * c.Nq + i) * c.Nk + j] = visible ? 0.0 : -std::numeric_limits<double>::infinity();
      }
  return m.to(t);
}

// The same attention from core ops: k, v broadcast to the query heads,
// softmax(scale q k^T + mask) over keys, times v.
Var attention_composed(const Cfg& c, Graph& g, Var q, Var k, Var v) {
  if (c.Hkv != c.H) {
    std::int64_t G = c.H / c.Hkv;
    auto expand = [&](Var x) {
      return reshape(broadcast_to(reshape(x, {c.B, c.Hkv, 1, c.Nk, c.d}), {c.B, c.Hkv, G, c.Nk, c.d}),
                     {c.B, c.H, c.Nk, c.d});
    };
    k = expand(k);
    v = expand(v);
  }
  double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
  Var s = mul_scalar(matmul(q, k, false, true), scale);  // [B,H,Nq,Nk]
  if (c.causal || !c.lens.empty()) s = add(s, g.input(mask_of(c, q.dtype())));
  return matmul(softmax(s, -1), v);
}

struct Inputs {
  Tensor q, k, v, w;  // w: weights of the loss sum(out * w)
};
Inputs draw_inputs(const Cfg& c, std::uint64_t seed) {
  Rng rng(seed);
  return {randn64({c.B, c.H, c.Nq, c.d}, rng), randn64({c.B, c.Hkv, c.Nk, c.d}, rng),
          randn64({c.B, c.Hkv, c.Nk, c.d}, rng), randn64({c.B, c.H, c.Nq, c.d}, rng)};
}

struct Result {
  Tensor out, dq, dk, dv;
};
// out and d(sum(out * w))/d(q, k, v), with the fused op or composed from core ops, in dtype t.
Result run(const Cfg& c, const Inputs& in, bool composed, DType t = DType::f64) {
  PGraph g;
  Var q = g.input(in.q.to(t)), k = g.input(in.k.to(t)), v = g.input(in.v.to(t));
  Var out;
  if (composed) {
    out = attention_composed(c, g, q, k, v);
  } else {
    out = attention(q, k, v, options_of(c, g));
    REQUIRE(count_op(out, OpId::attention) == 1);
  }
  REQUIRE(out.shape() == Shape{c.B, c.H, c.Nq, c.d});
  Var loss = sum(mul(out, g.input(in.w.to(t))));
  std::vector<Var> gr = grad(loss, {q, k, v});
  if (!composed) REQUIRE(count_op(loss, OpId::attention_backward) + count_op(gr[0], OpId::attention_backward) >= 1);
  return {eval(out).clone(), eval(gr[0]).clone(), eval(gr[1]).clone(), eval(gr[2]).clone()};
}

// Largest |a - b| / (1 + |b|).
double max_rel_diff(const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape())) return INFINITY;
  auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    double d = std::fabs(va[i] - vb[i]) / (1 + std::fabs(vb[i]));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

void check_against_composed(const Cfg& c, std::uint64_t seed) {
  INFO(c.str());
  Inputs in = draw_inputs(c, seed);
  Result f = run(c, in, false), r = run(c, in, true);
  CHECK(max_abs_diff(f.out, r.out) < 1e-12);
  CHECK(max_abs_diff(f.dq, r.dq) < 1e-11);
  CHECK(max_abs_diff(f.dk, r.dk) < 1e-11);
  CHECK(max_abs_diff(f.dv, r.dv) < 1e-11);
  CHECK(all_finite(f.out));
  CHECK(all_finite(f.dq));
  CHECK(all_finite(f.dk));
  CHECK(all_finite(f.dv));
}

// Rows/keys of a head in a [B, H, N, d] tensor.
double row_abs_sum(const Tensor& t, std::int64_t b, std::int64_t h, std::int64_t i) {
  const Shape& s = t.shape();
  const double* p = t.data<double>() + ((b * s[1] + h) * s[2] + i) * s[3];
  double a = 0;
  for (std::int64_t j = 0; j < s[3]; ++j) a += std::fabs(p[j]);
  return a;
}

}  // namespace

namespace ad::test {
void attention_gradcheck_cases(std::vector<GradCase>& out, Rng& rng) {
  std::vector<Cfg> cs;
  {
    Cfg c;
    c.B = 1; c.H = 2; c.Hkv = 2; c.Nq = 5; c.Nk = 5; c.d = 3;
    cs.push_back(c);
  }
  {  // causal, grouped-query heads, padding, Nq < Nk
    Cfg c;
    c.B = 2; c.H = 2; c.Hkv = 1; c.Nq = 4; c.Nk = 6; c.d = 2; c.causal = true; c.lens = {6, 3};
    cs.push_back(c);
  }
  {  // causal with Nq > Nk: the first rows see no key; a custom scale
    Cfg c;
    c.B = 1; c.H = 1; c.Hkv = 1; c.Nq = 6; c.Nk = 4; c.d = 3; c.causal = true; c.scale = 0.7;
    cs.push_back(c);
  }
  {  // several query and key tiles, the last ones partial
    Cfg c;
    attn::Tiles t = attn::tiles_for(2);
    c.B = 1; c.H = 1; c.Hkv = 1; c.Nq = t.br + 5; c.Nk = t.bc + 7; c.d = 2; c.causal = true;
    cs.push_back(c);
  }
  for (const Cfg& c : cs) {
    std::vector<Tensor> in{randn64({c.B, c.H, c.Nq, c.d}, rng), randn64({c.B, c.Hkv, c.Nk, c.d}, rng),
                           randn64({c.B, c.Hkv, c.Nk, c.d}, rng)};
    if (!c.lens.empty()) in.push_back(index(c.lens, {c.B}));
    Cfg cc = c;
    out.push_back({OpId::attention, c.str(), in, [cc](const std::vector<Var>& v) {
                     AttentionOptions o;
                     o.causal = cc.causal;
                     if (cc.scale != 0) o.scale = cc.scale;
                     if (v.size() > 3) o.key_lengths = v[3];
                     return attention(v[0], v[1], v[2], o);
                   }});
  }
}
}  // namespace ad::test

TEST_CASE("attention: forward and gradients equal the composed ops (f64)") {
  const attn::Tiles t32 = attn::tiles_for(32);
  const std::int64_t N = 2 * t32.bc + 13;  // not a multiple of either tile size
  std::vector<Cfg> cs;
  auto add = [&](Cfg c) { cs.push_back(c); };
  Cfg base;
  base.B = 2; base.H = 2; base.Hkv = 2; base.Nq = N; base.Nk = N; base.d = 32;
  add(base);
  { Cfg c = base; c.causal = true; add(c); }
  { Cfg c = base; c.lens = {N, 37}; add(c); }
  { Cfg c = base; c.lens = {N - 1, 37}; c.causal = true; add(c); }
  { Cfg c = base; c.H = 4; c.Hkv = 2; c.causal = true; add(c); }                  // GQA
  { Cfg c = base; c.H = 4; c.Hkv = 1; c.lens = {20, N}; add(c); }                 // MQA + padding
  { Cfg c = base; c.Nq = 70; c.causal = true; add(c); }                          // Nq < Nk, decoding-aligned
  { Cfg c = base; c.Nk = 70; add(c); }                                           // Nq > Nk
  { Cfg c = base; c.Nk = 70; c.causal = true; add(c); }                          // first rows fully masked
  { Cfg c = base; c.Nq = 1; c.causal = true; c.lens = {N, 5}; add(c); }         // one query (decoding step)
  { Cfg c = base; c.scale = 0.3; c.B = 1; add(c); }
  { Cfg c = base; c.B = 1; c.d = 64; c.Nq = 75; c.Nk = 150; c.causal = true; add(c); }
  { Cfg c = base; c.B = 1; c.d = 128; c.Nq = 150; c.Nk = 75; c.H = 2; c.Hkv = 1; add(c); }
  { Cfg c = base; c.B = 1; c.d = 7; c.Nq = 33; c.Nk = 100; add(c); }            // an odd d
  std::uint64_t seed = 100;
  for (const Cfg& c : cs) check_against_composed(c, ++seed);
}

TEST_CASE("attention: f32 agrees with f64") {
  Cfg c;
  c.B = 1; c.H = 4; c.Hkv = 2; c.Nq = 200; c.Nk = 150; c.d = 64; c.causal = true; c.lens = {140};
  Inputs in = draw_inputs(c, 7);
  Result f = run(c, in, false, DType::f32), r = run(c, in, false, DType::f64);
  CHECK(f.out.dtype() == DType::f32);
  CHECK(max_rel_diff(f.out.to(DType::f64), r.out) < 2e-5);
  CHECK(max_rel_diff(f.dq.to(DType::f64), r.dq) < 1e-4);
  CHECK(max_rel_diff(f.dk.to(DType::f64), r.dk) < 1e-4);
  CHECK(max_rel_diff(f.dv.to(DType::f64), r.dv) < 1e-4);
}

namespace {
// bf16 / f16 inputs: out and the gradients of sum(cast(out, f32) * w) in the
// input dtype, against the f64 kernel on the same (rounded) inputs and weights.
// Bound: max |a - b| over max |b| per tensor <= 4 u, u the unit roundoff of
// the input type (bf16 2^-8, f16 2^-11): below what naive attention in that
// type gets (rounding a score s of size ~4 moves e^s by ~4 u already). The CPU
// computes in f32 and rounds once (<= u); the GPU's tensor-core path (P and dS
// rounded too) is held to the same bound in tests/cuda.cpp.
double max_err_over_max(const Tensor& a, const Tensor& b) {
  auto x = a.to(DType::f64).to_vector(), y = b.to(DType::f64).to_vector();
  if (x.size() != y.size()) return INFINITY;
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    worst = std::max(worst, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return worst / std::max(scale, 1e-300);
}
Result run_half(const Cfg& c, const Inputs& in, DType t) {
  PGraph g;
  Var q = g.input(in.q.to(t)), k = g.input(in.k.to(t)), v = g.input(in.v.to(t));
  Var out = attention(q, k, v, options_of(c, g));
  REQUIRE(out.dtype() == t);
  Var loss = sum(mul(cast(out, DType::f32), g.input(in.w.to(DType::f32))));
  std::vector<Var> gr = grad(loss, {q, k, v});
  return {eval(out).clone(), eval(gr[0]).clone(), eval(gr[1]).clone(), eval(gr[2]).clone()};
}
Inputs rounded(const Inputs& in, DType t) {
  return {in.q.to(t).to(DType::f64), in.k.to(t).to(DType::f64), in.v.to(t).to(DType::f64),
          in.w.to(t).to(DType::f64)};
}
}  // namespace

TEST_CASE("attention: bf16 and f16 inputs against f64 (f32 accumulation)") {
  std::vector<Cfg> cs;
  {
    Cfg c;
    c.B = 2; c.H = 4; c.Hkv = 2; c.Nq = 130; c.Nk = 97; c.d = 64; c.causal = true; c.lens = {97, 40};
    cs.push_back(c);
  }
  {
    Cfg c;
    c.B = 1; c.H = 2; c.Hkv = 2; c.Nq = 70; c.Nk = 150; c.d = 32;
    cs.push_back(c);
  }
  {  // odd d and odd B H Nq d: the f32 lse starts after one element of padding
    Cfg c;
    c.B = 1; c.H = 1; c.Hkv = 1; c.Nq = 33; c.Nk = 33; c.d = 7; c.causal = true;
    cs.push_back(c);
  }
  std::uint64_t seed = 300;
  for (const Cfg& c : cs)
    for (DType t : {DType::bf16, DType::f16}) {
      INFO(c.str(), " ", dtype_name(t));
      Inputs in = draw_inputs(c, ++seed);
      Result h = run_half(c, in, t), r = run(c, rounded(in, t), false, DType::f64);
      const double tol = t == DType::bf16 ? 1.0 / 64 : 1.0 / 512;
      CHECK(h.dq.dtype() == t);
      CHECK(max_err_over_max(h.out, r.out) <= tol);
      CHECK(max_err_over_max(h.dq, r.dq) <= tol);
      CHECK(max_err_over_max(h.dk, r.dk) <= tol);
      CHECK(max_err_over_max(h.dv, r.dv) <= tol);
    }
  // peaked softmax (logits of tens): the backward's D = dO . O cancels against dP. Taken from the
  // output rounded to bf16 it put errors of 50-150 u into dq and dk (CPU; D now comes from the
  // output recomputed in f32)
  for (DType t : {DType::bf16, DType::f16}) {
    Cfg c;
    c.B = 1; c.H = 2; c.Hkv = 2; c.Nq = 40; c.Nk = 2; c.d = 4;
    INFO("peaked ", dtype_name(t));
    Inputs in = draw_inputs(c, 900);
    // every row's logits near 4 and -0.5 (scale 1/2): softmax about (0.99, 0.01)
    for (std::int64_t i = 0; i < in.q.numel(); ++i) in.q.data<double>()[i] = 2.0 + 0.05 * in.q.data<double>()[i];
    for (std::int64_t i = 0; i < in.k.numel(); ++i) in.k.data<double>()[i] = (i / c.d) % 2 == 0 ? 1.0 : -0.25;
    Result h = run_half(c, in, t), r = run(c, rounded(in, t), false, DType::f64);
    const double tol = t == DType::bf16 ? 1.0 / 64 : 1.0 / 512;
    CHECK(max_err_over_max(h.out, r.out) <= tol);
    CHECK(max_err_over_max(h.dq, r.dq) <= tol);
    CHECK(max_err_over_max(h.dk, r.dk) <= tol);
    CHECK(max_err_over_max(h.dv, r.dv) <= tol);
  }
}

TEST_CASE("attention: bf16 memory is counted exactly (predicted == measured)") {
  Cfg c;
  c.B = 1; c.H = 3; c.Hkv = 1; c.Nq = 65; c.Nk = 80; c.d = 5; c.causal = true;
  Inputs in = draw_inputs(c, 5);
  PGraph g;
  Var q = g.input(in.q.to(DType::bf16)), k = g.input(in.k.to(DType::bf16)), v = g.input(in.v.to(DType::bf16));
  Var out = attention(q, k, v, options_of(c, g));
  Var loss = sum(mul(cast(out, DType::f32), g.input(in.w.to(DType::f32))));
  std::vector<Var> gr = grad(loss, {q, k, v});
  std::vector<std::int32_t> targets{loss.id()};
  for (auto& x : gr) targets.push_back(x.id());
  Schedule s = plan(g.impl(), targets, {}, policy::keep_all());
  RunStats st = execute(g.impl(), s);
  CHECK(st.measured_peak_bytes == s.predicted_peak_bytes);
}

TEST_CASE("attention: fully masked rows give zero output and zero gradients") {
  Cfg c;
  c.B = 2; c.H = 2; c.Hkv = 1; c.Nq = 90; c.Nk = 70; c.d = 32; c.causal = true; c.lens = {0, 70};
  for (DType t : {DType::f64, DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    Inputs in = draw_inputs(c, 11);
    Result f = t == DType::bf16 ? run_half(c, in, t) : run(c, in, false, t);
    Result f64r{f.out.to(DType::f64), f.dq.to(DType::f64), f.dk.to(DType::f64), f.dv.to(DType::f64)};
    CHECK(all_finite(f64r.out));
    CHECK(all_finite(f64r.dq));
    CHECK(all_finite(f64r.dk));
    CHECK(all_finite(f64r.dv));
    for (std::int64_t h = 0; h < c.H; ++h) {
      // batch 0 has no keys: every row is zero, and so are all gradients
      for (std::int64_t i = 0; i < c.Nq; ++i) {
        CHECK(row_abs_sum(f64r.out, 0, h, i) == 0.0);
        CHECK(row_abs_sum(f64r.dq, 0, h, i) == 0.0);
      }
      // batch 1, causal with Nq > Nk: rows i < Nq - Nk see no key
      for (std::int64_t i = 0; i < c.Nq; ++i) {
        bool masked = i < c.Nq - c.Nk;
        CHECK((row_abs_sum(f64r.out, 1, h, i) == 0.0) == masked);
        // (a row that sees exactly one key has dS = dP - D = 0 in exact arithmetic: bf16's f32 sums hit it)
        if (masked || t != DType::bf16) CHECK((row_abs_sum(f64r.dq, 1, h, i) == 0.0) == masked);
      }
    }
    for (std::int64_t j = 0; j < c.Nk; ++j) {
      CHECK(row_abs_sum(f64r.dk, 0, 0, j) == 0.0);
      CHECK(row_abs_sum(f64r.dv, 0, 0, j) == 0.0);
    }
    if (t == DType::f64) check_against_composed(c, 11);
  }
  // no keys at all
  Cfg e;
  e.B = 1; e.H = 1; e.Hkv = 1; e.Nq = 3; e.Nk = 0; e.d = 4;
  Inputs in = draw_inputs(e, 12);
  Result f = run(e, in, false);
  for (double x : f.out.to_vector()) CHECK(x == 0.0);
  for (double x : f.dq.to_vector()) CHECK(x == 0.0);
}

TEST_CASE("attention: misuse is reported with the op and the shapes") {
  Graph g;
  Rng rng(3);
  auto in = [&](const Shape& s, DType t = DType::f32) { return g.input(Tensor::randn(s, rng, t)); };
  Var q = in({2, 4, 8, 16}), k = in({2, 2, 6, 16}), v = in({2, 2, 6, 16});
  auto expect = [](auto&& f, std::initializer_list<const char*> needles) {
    std::string msg;
    try {
      f();
    } catch (const Error& e) {
      msg = e.what();
    }
    INFO("message: " << msg);
    CHECK_FALSE(msg.empty());
    for (const char* n : needles) CHECK_MESSAGE(msg.find(n) != std::string::npos, "message lacks \"" << n << "\"");
  };
  expect([&] { attention(in({2, 4, 8}), k, v); }, {"attention:", "q f32[2,4,8]", "k f32[2,2,6,16]"});
  expect([&] { attention(q, k, in({2, 2, 7, 16})); }, {"attention: k and v shapes differ", "v f32[2,2,7,16]"});
  expect([&] { attention(q, in({3, 2, 6, 16}), in({3, 2, 6, 16})); }, {"attention: batch sizes differ", "q f32[2,4,8,16]"});
  expect([&] { attention(q, in({2, 2, 6, 8}), in({2, 2, 6, 8})); }, {"attention: head sizes d differ", "k f32[2,2,6,8]"});
  expect([&] { attention(q, in({2, 3, 6, 16}), in({2, 3, 6, 16})); },
         {"attention: key/value heads Hkv = 3 do not divide query heads H = 4", "k f32[2,3,6,16]"});
  expect([&] { attention(q, in({2, 8, 6, 16}), in({2, 8, 6, 16})); }, {"Hkv = 8 do not divide query heads H = 4"});
  expect([&] { attention(in({2, 4, 8, 0}), in({2, 2, 6, 0}), in({2, 2, 6, 0})); }, {"attention: head size d is 0"});
  expect([&] { attention(q, in({2, 2, 6, 16}, DType::f64), v); }, {"attention: dtype mismatch", "k f64[2,2,6,16]"});
  expect([&] { attention(g.input(Tensor::randint({2, 4, 8, 16}, rng, 3)), k, v); }, {"attention: q must be f32, f64, bf16 or f16"});
  {
    AttentionOptions o;
    o.key_lengths = in({2});
    expect([&] { attention(q, k, v, o); }, {"attention: key_lengths must be i64", "key_lengths f32[2]"});
    o.key_lengths = g.input(index({1, 2, 3}, {3}));
    expect([&] { attention(q, k, v, o); }, {"attention: key_lengths must be [B] = [2]", "key_lengths i64[3]"});
  }
  {
    AttentionOptions o;
    o.scale = std::numeric_limits<double>::quiet_NaN();
    expect([&] { attention(q, k, v, o); }, {"attention: scale must be finite"});
  }
  // key lengths are data: out of range is reported when the op runs
  {
    AttentionOptions o;
    o.key_lengths = g.input(index({6, 7}, {2}));
    Var out = attention(q, k, v, o);
    expect([&] { eval(out); }, {"attention", "key_lengths[1] = 7 is outside [0, Nk = 6]"});
    o.key_lengths = g.input(index({-1, 2}, {2}));
    Var out2 = attention(q, k, v, o);
    expect([&] { eval(out2); }, {"key_lengths[0] = -1"});
  }
  // double backward is refused with a reason
  {
    Graph g2;
    Var a = g2.input(Tensor::randn({1, 1, 3, 4}, rng, DType::f64));
    Var y = attention(a, a, a);
    Var ga = grad(sum(y), {a})[0];
    expect([&] { grad(sum(ga), {a}); }, {"attention_backward", "double backward is not supported"});
  }
}

TEST_CASE("attention: memory is linear in N, predicted == measured") {
  // forward + backward of sum(attention(q, k, v) * w), q, k, v parameters, f32
  constexpr std::int64_t kHeads = 1, kD = 16;
  auto peak = [](std::int64_t N, bool composed) {
    Cfg c;
    c.B = 1; c.H = kHeads; c.Hkv = kHeads; c.Nq = N; c.Nk = N; c.d = kD; c.causal = true;
    Rng rng(static_cast<std::uint64_t>(N));
    Parameter q = Parameter::randn({c.B, c.H, N, c.d}, rng), k = Parameter::randn({c.B, c.H, N, c.d}, rng),
              v = Parameter::randn({c.B, c.H, N, c.d}, rng);
    Graph g;
    Var out;
    if (composed) {
      out = attention_composed(c, g, g.param(q), g.param(k), g.param(v));
    } else {
      out = attention(g.param(q), k, v, options_of(c, g));
    }
    Var loss = sum(mul(out, g.input(Tensor::randn(out.shape(), rng))));
    Report r = backward(loss, policy::keep_all());
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    CHECK(q.has_grad());
    CHECK(all_finite(q.grad()));
    return r.measured_peak_bytes;
  };
  // O(N d): a few [N, d] buffers per head (the [O | lse] buffer, its gradient, dq dk dv, the loss's
  // product) and the tile scratch; never N x N
  const std::int64_t N = 2048, row = kHeads * kD * 4;
  std::int64_t p1 = peak(N / 2, false), p2 = peak(N, false);
  INFO("fused peaks " << p1 << " " << p2);
  CHECK(p2 < N * N / 4);                      // far below N^2 bytes
  CHECK(p2 < 10 * N * row);                   // a handful of [N, d] values
  CHECK(p2 < 2.2 * static_cast<double>(p1));  // linear: doubling N at most doubles the peak (+ fixed scratch)
  std::int64_t c1 = peak(N / 2, true);        // the composed version holds N x N scores per head
  INFO("composed peak " << c1);
  CHECK(c1 >= kHeads * (N / 2) * (N / 2) * 4);
}

TEST_CASE("attention: runs are bit-identical, and remat policies match keep_all") {
  Cfg c;
  c.B = 2; c.H = 4; c.Hkv = 2; c.Nq = 300; c.Nk = 300; c.d = 64; c.causal = true; c.lens = {300, 201};
  auto grads = [&](const Policy& pol) {
    Rng rng(21);
    Parameter q = Parameter::randn({c.B, c.H, c.Nq, c.d}, rng), k = Parameter::randn({c.B, c.Hkv, c.Nk, c.d}, rng),
              v = Parameter::randn({c.B, c.Hkv, c.Nk, c.d}, rng), wo = Parameter::randn({c.d, c.d}, rng, 0.1);
    Graph g;
    Var h = attention(g.param(q), k, v, options_of(c, g));
    h = tanh(matmul(h, wo));
    Var loss = sum(mul(h, g.input(Tensor::randn(h.shape(), rng))));
    Report r = backward(loss, pol);
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    return grads_of({q, k, v, wo});
  };
  auto a = grads(policy::keep_all()), b = grads(policy::keep_all());
  check_bitwise(a, b);
  check_bitwise(a, grads(policy::sqrt_n()));
  check_bitwise(a, grads(policy::uniform(2)));
}

TEST_CASE("attention: kernels give the same bits for 1, 2 and 3 threads") {
  // the kernels directly (the op picks its own thread count): f32, GQA, causal, padding
  attn::Dims dm;
  dm.B = 2; dm.H = 4; dm.Hkv = 2; dm.Nq = 150; dm.Nk = 130; dm.d = 32; dm.causal = true;
  dm.scale = 0.2;
  const std::vector<std::int64_t> lens{130, 77};
  Rng rng(5);
  const std::int64_t nq = dm.B * dm.H * dm.Nq * dm.d, nk = dm.B * dm.Hkv * dm.Nk * dm.d, nl = dm.B * dm.H * dm.Nq;
  Tensor q = Tensor::randn({nq}, rng), k = Tensor::randn({nk}, rng), v = Tensor::randn({nk}, rng);
  Tensor dout = Tensor::randn({nq}, rng), dlse = Tensor::randn({nl}, rng, DType::f32, 0, 0.1);
  auto run_with = [&](int threads) {
    dm.threads = threads;
    std::vector<float> ws(static_cast<std::size_t>(
        std::max(attn::forward_workspace_bytes(dm, 4), attn::backward_workspace_bytes(dm, 4)) / 4));
    Tensor o = Tensor::empty({nq}), lse = Tensor::empty({nl}), g = Tensor::empty({nq + 2 * nk});
    attn::forward_cpu<float>(dm, q.data<float>(), k.data<float>(), v.data<float>(), lens.data(), o.data<float>(),
                             lse.data<float>(), ws.data());
    float* gp = g.data<float>();
    attn::backward_cpu<float>(dm, q.data<float>(), k.data<float>(), v.data<float>(), o.data<float>(), lse.data<float>(),
                              dout.data<float>(), dlse.data<float>(), lens.data(), gp, gp + nq, gp + nq + nk,
                              ws.data());
    return std::vector<Tensor>{o, lse, g};
  };
  auto one = run_with(1);
  CHECK(all_finite(one[0]));
  CHECK(all_finite(one[2]));
  check_bitwise(one, run_with(2));
  check_bitwise(one, run_with(3));
}

TEST_CASE("attention: the cost model counts the visible pairs exactly") {
  for (std::int64_t nq = 0; nq <= 9; ++nq)
    for (std::int64_t nk = 0; nk <= 9; ++nk)
      for (bool causal : {false, true}) {
        attn::Dims dm;
        dm.Nq = nq; dm.Nk = nk; dm.causal = causal;
        std::int64_t brute = 0;
        for (std::int64_t i = 0; i < nq; ++i)
          for (std::int64_t j = 0; j < nk; ++j) brute += !causal || j <= i + (nk - nq);
        INFO("Nq=" << nq << " Nk=" << nk << " causal=" << causal);
        CHECK(attn::visible_pairs(dm) == static_cast<double>(brute));
      }
}
