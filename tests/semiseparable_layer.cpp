// Semiseparable utilities (dense H, factorisation, HODLR) and the learned
// causal mixer layer.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

namespace {
using i64 = std::int64_t;
double rel_fro(const Tensor& a, const Tensor& b) {
  auto va = a.to_vector(), vb = b.to_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < va.size(); ++i) { num += (va[i] - vb[i]) * (va[i] - vb[i]); den += vb[i] * vb[i]; }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}
Tensor matmul_dense(const Tensor& h, const Tensor& x) {  // (N, N) x (N, D) in f64
  Graph g;
  return eval(matmul(g.input(h), g.input(x))).clone();
}
std::string error_of(auto&& f) {
  try { f(); } catch (const Error& e) { return e.what(); }
  return {};
}
}  // namespace

TEST_CASE("semiseparable_dense agrees with semiseparable_matvec") {
  Rng rng(81);
  const i64 N = 37, r = 3;
  Tensor d = randn64({N}, rng), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng), u = randn64({N, r}, rng),
         v = randn64({N, r}, rng), x = randn64({1, N, 4}, rng);
  for (bool causal : {false, true}) {
    Graph g;
    Tensor y = eval(semiseparable_matvec(g.input(x), g.input(d), g.input(up), g.input(lo), g.input(u), g.input(v), causal));
    Tensor h = semiseparable_dense(d, up, lo, u, v, causal);
    CHECK(rel_fro(y.reshape({N, 4}), matmul_dense(h, x.reshape({N, 4}))) < 1e-13);
  }
}

TEST_CASE("semiseparable_factorize recovers an exactly semiseparable H to 1e-10") {
  Rng rng(82);
  for (i64 N : {1, 16, 64, 150}) {
    const i64 r = N < 16 ? std::min<i64>(2, N) : 4;  // small N: few enough unknowns for a unique split
    Tensor d = randn64({N}, rng), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng), u = randn64({N, r}, rng),
           v = randn64({N, r}, rng);
    Tensor h = semiseparable_dense(d, up, lo, u, v);
    SemiseparableFactors f = semiseparable_factorize(h, r);
    INFO("N " << N << " iterations " << f.iterations << " rel_error " << f.rel_error);
    CHECK(f.rel_error < 1e-10);
    Tensor back = semiseparable_dense(f.t_diag, f.t_upper, f.t_lower, f.u, f.v);
    double e = rel_fro(back, h);
    CHECK(e < 1e-10);
    CHECK(e == doctest::Approx(f.rel_error).epsilon(1e-3).scale(1e-14));  // the reported error is the real one
    CHECK(f.u.shape() == Shape{N, r});
  }
  // rank 0: a tridiagonal H is its own band
  Tensor d = randn64({6}, rng), up = randn64({5}, rng), lo = randn64({5}, rng);
  Tensor h = semiseparable_dense(d, up, lo, Tensor::zeros({6, 0}, DType::f64), Tensor::zeros({6, 0}, DType::f64));
  SemiseparableFactors f = semiseparable_factorize(h, 0);
  CHECK(f.rel_error == 0.0);
  CHECK(max_abs_diff(f.t_upper, up) == 0.0);
}

TEST_CASE("semiseparable_factorize of a general matrix reports the error it reaches") {
  Rng rng(83);
  Tensor h = randn64({40, 40}, rng);
  SemiseparableFactors f2 = semiseparable_factorize(h, 2), f10 = semiseparable_factorize(h, 10);
  CHECK(f2.rel_error > 0.3);  // a random matrix is not low rank
  CHECK(f10.rel_error < f2.rel_error);
  CHECK(rel_fro(semiseparable_dense(f10.t_diag, f10.t_upper, f10.t_lower, f10.u, f10.v), h) ==
        doctest::Approx(f10.rel_error).epsilon(1e-9));
  CHECK(error_of([&] { semiseparable_factorize(randn64({3, 4}, rng), 1); }).find("semiseparable_factorize: h must be a square") == 0);
  CHECK(error_of([&] { semiseparable_factorize(h, 41); }).find("rank 41 out of range [0, 40]") != std::string::npos);
}

TEST_CASE("semiseparable Hodlr matvec matches the dense matvec") {
  Rng rng(84);
  // T + U V^T with r = 3 is exact in HODLR form at rank r + 1 (each
  // off-diagonal block is U_1 V_2^T plus one corner entry of T)
  const i64 N = 300, r = 3;
  Tensor d = randn64({N}, rng), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng), u = randn64({N, r}, rng),
         v = randn64({N, r}, rng);
  Tensor h = semiseparable_dense(d, up, lo, u, v);
  Tensor x = randn64({N, 5}, rng);
  Hodlr m = Hodlr::build(h, r + 1, 16);
  CHECK(m.size() == N);
  CHECK(m.levels() == 6);  // 300 -> 150 -> 75 -> 37/38 -> 18/19 -> 9/10
  CHECK(rel_fro(m.matvec(x), matmul_dense(h, x)) < 1e-12);
  Tensor x1 = randn64({N}, rng);
  CHECK(rel_fro(m.matvec(x1), matmul_dense(h, x1.reshape({N, 1})).reshape({N})) < 1e-12);
  // rank r - 1 is not enough
  CHECK(rel_fro(Hodlr::build(h, r - 1, 16).matvec(x), matmul_dense(h, x)) > 1e-3);
  // a smooth kernel: the error falls with the rank; storage well below N^2
  const i64 M = 512;
  Tensor k = Tensor::empty({M, M}, DType::f64);
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < M; ++j) k.data<double>()[i * M + j] = 1.0 / (1.0 + 0.1 * std::fabs(static_cast<double>(i - j)));
  Tensor xk = randn64({M, 2}, rng);
  double prev = INFINITY;
  for (i64 rk : {1, 4, 12}) {
    Hodlr hk = Hodlr::build(k, rk, 32);
    double e = rel_fro(hk.matvec(xk), matmul_dense(k, xk));
    INFO("rank " << rk << " error " << e);
    CHECK(e < prev);
    prev = e;
    CHECK(hk.stored_elements() < M * M / 2);
  }
  CHECK(prev < 1e-6);
  CHECK(error_of([&] { (void)m.matvec(randn64({N + 1}, rng)); }).find("Hodlr::matvec") == 0);
  CHECK(error_of([&] { Hodlr::build(randn64({4, 5}, rng), 2); }).find("Hodlr::build") == 0);
}

TEST_CASE("semiseparable mixer layer is causal, differentiable and trains") {
  Rng rng(85);
  const i64 B = 2, N = 16, C = 8;
  SemiseparableMixer mix = SemiseparableMixer::make(32, C, 4, rng);
  Tensor xt = Tensor::randn({B, N, C}, rng);
  auto forward = [&](const Tensor& in) {
    Graph g;
    return eval(mix(g.input(in))).clone();
  };
  // causality: changing position 10 leaves positions < 10 unchanged
  Tensor x2 = xt.clone();
  for (i64 c = 0; c < C; ++c) x2.data<float>()[(0 * N + 10) * C + c] += 1.0f;
  Tensor y1 = forward(xt), y2 = forward(x2);
  CHECK(y1.shape() == Shape{B, N, C});
  double before = 0, after = 0;
  for (i64 i = 0; i < N; ++i)
    for (i64 c = 0; c < C; ++c) {
      double dlt = std::fabs(y1.data<float>()[i * C + c] - y2.data<float>()[i * C + c]);
      (i < 10 ? before : after) = std::max(i < 10 ? before : after, dlt);
    }
  CHECK(before == 0.0);
  CHECK(after > 1e-3);
  // train on y_i = x_{i-1} (a causal shift): the loss falls
  Tensor target = Tensor::zeros({B, N, C});
  for (i64 b = 0; b < B; ++b)
    for (i64 i = 1; i < N; ++i)
      for (i64 c = 0; c < C; ++c) target.data<float>()[(b * N + i) * C + c] = xt.data<float>()[(b * N + i - 1) * C + c];
  auto step = [&](float lr) {
    Graph g;
    Var loss = mse(mix(g.input(xt)), g.input(target));
    backward(loss);
    double l = loss.value().item();
    for (const Parameter& p : mix.parameters()) {
      REQUIRE(p.has_grad());
      REQUIRE(all_finite(p.grad()));
      float* w = p.value().data<float>();
      const float* gr = p.grad().data<float>();
      for (i64 i = 0; i < p.value().numel(); ++i) w[i] -= lr * gr[i];
      p.zero_grad();
    }
    return l;
  };
  double l0 = step(0.05f), l = l0;
  for (int it = 0; it < 60; ++it) l = step(0.05f);
  INFO("loss " << l0 << " -> " << l);
  CHECK(l < 0.8 * l0);
  // mixed precision: U, V cast to bf16 for the product, gradients reach the f32 parameters
  mix.uv_dtype = DType::bf16;
  Tensor yb = forward(xt);
  CHECK(rel_fro(yb, forward(xt)) == 0.0);
  mix.uv_dtype = DType::f32;
  CHECK(rel_fro(yb, forward(xt)) < 2e-2);
  // misuse
  Graph g;
  CHECK(error_of([&] { mix(g.input(Tensor::randn({1, 33, C}, rng))); }).find("SemiseparableMixer: x must be (B, N, 8) with 1 <= N <= 32") == 0);
  CHECK(error_of([&] { mix(g.input(Tensor::randn({1, 4, C + 1}, rng))); }).find("SemiseparableMixer") == 0);
  CHECK(error_of([&] { SemiseparableMixer::make(0, 4, 2, rng); }).find("SemiseparableMixer") == 0);
}

TEST_CASE("semiseparable mixer in f64 runs (U, V in their own dtype) and agrees with f32") {
  // make(..., f64) left uv_dtype at f32: U and V were cast to f32 and the product refused x f64
  Rng r64(86), r32(86);
  SemiseparableMixer m64 = SemiseparableMixer::make(12, 4, 2, r64, DType::f64);
  SemiseparableMixer m32 = SemiseparableMixer::make(12, 4, 2, r32, DType::f32);
  CHECK(m64.uv_dtype == DType::f64);
  Rng rx(87);
  Tensor x = Tensor::randn({2, 9, 4}, rx, DType::f64);
  Graph g;
  Var xv = g.input(x);
  Var y = m64(xv);
  Tensor y64 = eval(y);
  CHECK(y64.dtype() == DType::f64);
  Graph g32;
  Tensor y32 = eval(m32(g32.input(x.to(DType::f32))));
  CHECK(rel_fro(y64, y32.to(DType::f64)) < 1e-5);  // the same draws, rounded
  backward(sum(y));
  for (const Parameter& p : m64.parameters()) CHECK(p.has_grad());
  m64.uv_dtype = DType::f32;  // f32 / f64: the parameters' own dtype, still runs
  Graph g2;
  CHECK(eval(m64(g2.input(x))).dtype() == DType::f64);
}
