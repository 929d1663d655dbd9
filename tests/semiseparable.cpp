// Semiseparable matrices and tridiagonal systems: every op against a dense
// reference built explicitly here (f64), forward and all gradients, causal
// and not; the gradcheck cases (semiseparable_gradcheck_cases); mixed
// precision; misuse.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/semiseparable_cpu.hpp"
#include "test_util.hpp"

using namespace ad;
using namespace ad::test;

namespace {
using i64 = std::int64_t;

struct Sys {
  i64 B, N, D, r;
  Tensor x, d, up, lo, u, v;
};
// Random H = T + U V^T. diag_shift > 0 makes T diagonally dominant (for solves).
Sys random_sys(i64 B, i64 N, i64 D, i64 r, Rng& rng, double diag_shift = 0) {
  Sys s{B, N, D, r, randn64({B, N, D}, rng), randn64({N}, rng, diag_shift), randn64({N - 1}, rng),
        randn64({N - 1}, rng), randn64({N, r}, rng, 0, 0.5), randn64({N, r}, rng, 0, 0.5)};
  return s;
}
// H (N x N, row-major) built entry by entry.
std::vector<double> dense_h(const Sys& s, bool causal) {
  auto d = s.d.to_vector(), up = s.up.to_vector(), lo = s.lo.to_vector(), u = s.u.to_vector(), v = s.v.to_vector();
  std::vector<double> h(static_cast<std::size_t>(s.N * s.N), 0.0);
  for (i64 i = 0; i < s.N; ++i)
    for (i64 j = 0; j < s.N; ++j) {
      if (causal && j > i) continue;
      double a = 0;
      for (i64 k = 0; k < s.r; ++k) a += u[static_cast<std::size_t>(i * s.r + k)] * v[static_cast<std::size_t>(j * s.r + k)];
      if (i == j) a += d[static_cast<std::size_t>(i)];
      if (j == i + 1 && !causal) a += up[static_cast<std::size_t>(i)];
      if (i == j + 1) a += lo[static_cast<std::size_t>(j)];
      h[static_cast<std::size_t>(i * s.N + j)] = a;
    }
  return h;
}
// out[b] = op(H) x[b] with op = identity or transpose.
std::vector<double> apply(const std::vector<double>& h, i64 N, const std::vector<double>& x, i64 B, i64 D, bool trans) {
  std::vector<double> y(static_cast<std::size_t>(B * N * D), 0.0);
  for (i64 b = 0; b < B; ++b)
    for (i64 i = 0; i < N; ++i)
      for (i64 j = 0; j < N; ++j) {
        double hij = trans ? h[static_cast<std::size_t>(j * N + i)] : h[static_cast<std::size_t>(i * N + j)];
        if (hij == 0) continue;
        for (i64 c = 0; c < D; ++c)
          y[static_cast<std::size_t>((b * N + i) * D + c)] += hij * x[static_cast<std::size_t>((b * N + j) * D + c)];
      }
  return y;
}
// Dense LU solve with partial pivoting, in place on M (N x N) and rhs (N x K).
void dense_solve(std::vector<double> M, i64 N, std::vector<double>& rhs, i64 K) {
  for (i64 k = 0; k < N; ++k) {
    i64 p = k;
    for (i64 i = k + 1; i < N; ++i)
      if (std::fabs(M[static_cast<std::size_t>(i * N + k)]) > std::fabs(M[static_cast<std::size_t>(p * N + k)])) p = i;
    for (i64 j = 0; j < N; ++j) std::swap(M[static_cast<std::size_t>(k * N + j)], M[static_cast<std::size_t>(p * N + j)]);
    for (i64 j = 0; j < K; ++j) std::swap(rhs[static_cast<std::size_t>(k * K + j)], rhs[static_cast<std::size_t>(p * K + j)]);
    for (i64 i = k + 1; i < N; ++i) {
      double f = M[static_cast<std::size_t>(i * N + k)] / M[static_cast<std::size_t>(k * N + k)];
      for (i64 j = k; j < N; ++j) M[static_cast<std::size_t>(i * N + j)] -= f * M[static_cast<std::size_t>(k * N + j)];
      for (i64 j = 0; j < K; ++j) rhs[static_cast<std::size_t>(i * K + j)] -= f * rhs[static_cast<std::size_t>(k * K + j)];
    }
  }
  for (i64 i = N - 1; i >= 0; --i)
    for (i64 j = 0; j < K; ++j) {
      double a = rhs[static_cast<std::size_t>(i * K + j)];
      for (i64 l = i + 1; l < N; ++l) a -= M[static_cast<std::size_t>(i * N + l)] * rhs[static_cast<std::size_t>(l * K + j)];
      rhs[static_cast<std::size_t>(i * K + j)] = a / M[static_cast<std::size_t>(i * N + i)];
    }
}
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
  return a.size() != b.size() ? INFINITY : std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}
// The dense gradients of L = sum(w * (H x)) with respect to d, up, lo, u, v, given dH = sum_b w_b x_b^T.
struct DenseGrads { std::vector<double> dx, dd, dup, dlo, du, dv; };
DenseGrads dense_grads(const Sys& s, bool causal, const std::vector<double>& w) {
  DenseGrads g;
  auto h = dense_h(s, causal);
  auto x = s.x.to_vector(), u = s.u.to_vector(), v = s.v.to_vector();
  g.dx = apply(h, s.N, w, s.B, s.D, true);
  std::vector<double> dH(static_cast<std::size_t>(s.N * s.N), 0.0);
  for (i64 b = 0; b < s.B; ++b)
    for (i64 i = 0; i < s.N; ++i)
      for (i64 j = 0; j < s.N; ++j)
        for (i64 c = 0; c < s.D; ++c)
          dH[static_cast<std::size_t>(i * s.N + j)] +=
              w[static_cast<std::size_t>((b * s.N + i) * s.D + c)] * x[static_cast<std::size_t>((b * s.N + j) * s.D + c)];
  auto at = [&](i64 i, i64 j) { return (causal && j > i) ? 0.0 : dH[static_cast<std::size_t>(i * s.N + j)]; };
  for (i64 i = 0; i < s.N; ++i) g.dd.push_back(at(i, i));
  for (i64 i = 0; i + 1 < s.N; ++i) { g.dup.push_back(at(i, i + 1)); g.dlo.push_back(at(i + 1, i)); }
  g.du.assign(static_cast<std::size_t>(s.N * s.r), 0.0);
  g.dv.assign(static_cast<std::size_t>(s.N * s.r), 0.0);
  for (i64 i = 0; i < s.N; ++i)
    for (i64 j = 0; j < s.N; ++j)
      for (i64 k = 0; k < s.r; ++k) {
        g.du[static_cast<std::size_t>(i * s.r + k)] += at(i, j) * v[static_cast<std::size_t>(j * s.r + k)];
        g.dv[static_cast<std::size_t>(j * s.r + k)] += at(i, j) * u[static_cast<std::size_t>(i * s.r + k)];
      }
  return g;
}
// semiseparable_matvec with an explicit chunk length (0 = automatic).
// with_w: W = V^T x from a semiseparable_sums node of the same chunking, as
// ad::semiseparable_matvec builds the full product on the CPU
Var matvec_chunked(const std::vector<Var>& in, bool causal, i64 chunk, bool with_w = false) {
  Attrs at;
  at.causal = causal;
  at.start = chunk;
  if (with_w)
    return make_node(OpId::semiseparable_matvec,
                     {in[0], in[1], in[2], in[3], in[4], in[5], make_node(OpId::semiseparable_sums, {in[0], in[5]}, at)},
                     at);
  return make_node(OpId::semiseparable_matvec, {in[0], in[1], in[2], in[3], in[4], in[5]}, at);
}
void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double e = rel_err(got, want);
  CHECK_MESSAGE(e <= tol, what << ": relative error " << e);
}
}  // namespace

TEST_CASE("semiseparable_matvec matches a dense H, forward and all gradients") {
  Rng rng(71);
  struct C { i64 B, N, D, r, chunk; };
  const C cases[] = {{2, 1, 3, 2, 0}, {1, 2, 2, 1, 0}, {3, 7, 4, 3, 0}, {2, 64, 5, 4, 0}, {2, 64, 5, 4, 5},
                     {1, 300, 3, 6, 0}, {2, 300, 6, 5, 37}, {1, 40, 3, 0, 0},
                     // D >= 8 and r > 8: the register-blocked sweeps (8 doubles per block, 8 rows of M per block)
                     {2, 200, 19, 11, 23}, {1, 70, 16, 8, 0},
                     // an empty batch: every gradient of the band and of U, V is 0 (none left unwritten)
                     {0, 5, 3, 2, 0}, {0, 64, 5, 4, 7}};
  for (const C& c : cases)
    for (bool causal : {false, true}) {
      INFO("B " << c.B << " N " << c.N << " D " << c.D << " r " << c.r << " chunk " << c.chunk << " causal " << causal);
      Sys s = random_sys(c.B, c.N, c.D, c.r, rng);
      PGraph g;
      std::vector<Var> in{g.input(s.x), g.input(s.d), g.input(s.up), g.input(s.lo), g.input(s.u), g.input(s.v)};
      Var y = matvec_chunked(in, causal, c.chunk);
      auto h = dense_h(s, causal);
      check_close(eval(y).to_vector(), apply(h, c.N, s.x.to_vector(), c.B, c.D, false), 1e-13, "y");
      Tensor w = randn64({c.B, c.N, c.D}, rng);
      auto gr = grad(sum(mul(y, g.input(w))), in);
      DenseGrads dg = dense_grads(s, causal, w.to_vector());
      check_close(eval(gr[0]).to_vector(), dg.dx, 1e-13, "dx");
      check_close(eval(gr[1]).to_vector(), dg.dd, 1e-13, "dt_diag");
      if (c.N > 1) {
        if (causal) {
          for (double e : eval(gr[2]).to_vector()) CHECK(e == 0.0);
        } else {
          check_close(eval(gr[2]).to_vector(), dg.dup, 1e-13, "dt_upper");
        }
        check_close(eval(gr[3]).to_vector(), dg.dlo, 1e-13, "dt_lower");
      }
      if (c.r > 0) {
        check_close(eval(gr[4]).to_vector(), dg.du, 1e-13, "du");
        check_close(eval(gr[5]).to_vector(), dg.dv, 1e-13, "dv");
      }
      // one backward node forms all six gradients
      CHECK(count_op(y, OpId::semiseparable_matvec_backward) == 1);
      if (causal) continue;
      // W = V^T x handed in by a semiseparable_sums node: the same bits for y
      // and every gradient (the sums are formed the same way, then copied)
      Var yw = matvec_chunked(in, false, c.chunk, true);
      auto grw = grad(sum(mul(yw, g.input(w))), in);
      CHECK(bitwise_equal(eval(yw), eval(y)));
      for (std::size_t i = 0; i < 6; ++i) {
        INFO("gradient " << i);
        CHECK(bitwise_equal(eval(grw[i]), eval(gr[i])));
      }
      CHECK(count_op(y, OpId::semiseparable_sums) == 1);
    }
}

TEST_CASE("semiseparable_matvec full on the CPU: W = V^T x is its own node, read by the backward") {
  Rng rng(78);
  Sys s = random_sys(2, 700, 5, 4, rng);
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    Graph g;
    std::vector<Var> in{g.input(s.x), g.input(s.d), g.input(s.up), g.input(s.lo), g.input(s.u), g.input(s.v)};
    Var y = semiseparable_matvec(in[0], in[1], in[2], in[3], in[4], in[5], causal);
    // the causal product forms its prefix sums in one pass: no W node
    CHECK(count_op(y, OpId::semiseparable_sums) == (causal ? 0u : 1u));
    CHECK(g.impl().node(y.id()).inputs.size() == (causal ? 6u : 7u));
    auto gr = grad(sum(mul(y, y)), in);
    for (const Node& n : g.impl().nodes)
      if (n.op == OpId::semiseparable_matvec_backward) CHECK(n.inputs.size() == (causal ? 7u : 8u));
    // the same bits as the single node that forms W itself
    Var y6 = matvec_chunked(in, causal, 0);
    auto gr6 = grad(sum(mul(y6, y6)), in);
    CHECK(bitwise_equal(eval(y), eval(y6)));
    for (std::size_t i = 0; i < 6; ++i) {
      INFO("gradient " << i);
      CHECK(bitwise_equal(eval(gr[i]), eval(gr6[i])));
    }
  }
}

TEST_CASE("semiseparable_matvec full: every policy gives keep_all's bits and its predicted peak") {
  Rng rng(80);
  Sys s = random_sys(2, 600, 6, 5, rng);
  Tensor ref_u, ref_v, ref_d;
  std::int64_t keep_all_peak = 0;
  for (int pol = 0; pol < 4; ++pol) {
    INFO("policy " << pol);
    Graph g;
    Parameter pu(s.u.clone()), pv(s.v.clone()), pd(s.d.clone());
    Var h = g.input(s.x), up = g.input(s.up), lo = g.input(s.lo);
    // six layers: the policies free and recompute the inner layers' W and y
    for (int l = 0; l < 6; ++l) h = tanh(semiseparable_matvec(h, pd, up, lo, pu, pv));
    Var loss = sum(mul(h, h));
    Policy p = pol == 0 ? policy::keep_all() : pol == 1 ? policy::manual() : pol == 2 ? policy::sqrt_n()
                                                                                          : policy::budget(keep_all_peak * 3 / 4);
    Report r = backward(loss, p);
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    if (pol == 0) {
      keep_all_peak = r.measured_peak_bytes;
      ref_u = pu.grad().clone();
      ref_v = pv.grad().clone();
      ref_d = pd.grad().clone();
      continue;
    }
    if (pol != 2) CHECK(r.recomputed_nodes > 0);
    if (pol == 3) CHECK(r.measured_peak_bytes <= keep_all_peak * 3 / 4);
    CHECK(bitwise_equal(pu.grad(), ref_u));
    CHECK(bitwise_equal(pv.grad(), ref_v));
    CHECK(bitwise_equal(pd.grad(), ref_d));
  }
}

TEST_CASE("semiseparable_matvec gradient uses T^T and V U^T: a non-symmetric T") {
  Rng rng(72);
  Sys s = random_sys(1, 12, 2, 2, rng);
  // t_upper and t_lower very different, U != V: H is far from symmetric
  for (double& e : std::span<double>(s.up.data<double>(), 11)) e += 3.0;
  for (double& e : std::span<double>(s.lo.data<double>(), 11)) e -= 3.0;
  PGraph g;
  Var x = g.input(s.x);
  Var y = semiseparable_matvec(x, g.input(s.d), g.input(s.up), g.input(s.lo), g.input(s.u), g.input(s.v));
  Tensor w = randn64({1, 12, 2}, rng);
  auto dx = eval(grad(sum(mul(y, g.input(w))), {x})[0]).to_vector();
  auto h = dense_h(s, false);
  double e_t = rel_err(dx, apply(h, 12, w.to_vector(), 1, 2, true));   // H^T w: right
  double e_n = rel_err(dx, apply(h, 12, w.to_vector(), 1, 2, false));  // H w: what a symmetric assumption gives
  CHECK(e_t < 1e-13);
  CHECK(e_n > 0.1);
}

TEST_CASE("semiseparable_matvec is deterministic and f32 tracks f64 at N = 4096") {
  Rng rng(73);
  Sys s = random_sys(2, 4096, 20, 10, rng);  // f32: one 16-column block + 4 tail columns
  auto run = [&](DType t, bool causal) {
    Graph g;
    Var y = semiseparable_matvec(g.input(s.x.to(t)), g.input(s.d.to(t)), g.input(s.up.to(t)), g.input(s.lo.to(t)),
                                 g.input(s.u.to(t)), g.input(s.v.to(t)), causal);
    return eval(y).clone();
  };
  for (bool causal : {false, true}) {
    Tensor a = run(DType::f32, causal), b = run(DType::f32, causal), ref = run(DType::f64, causal);
    CHECK(bitwise_equal(a, b));
    double e = rel_err(a.to_vector(), ref.to_vector());
    CHECK_MESSAGE(e < 1e-5, "f32 vs f64 relative error " << e);
  }
}

TEST_CASE("semiseparable_matvec f32 gradients match a dense H in f64 (r <= 4: du and dv as dot products)") {
  // f32, D a multiple of 8 and r <= 4: the full backward forms du and dv
  // together as dots over D (sweep_du_dv), rows summed over b; r < 4 pads
  // to four rows; with every gradient wanted, all in one sweep per chunk
  // (bwd_rows) or in three: both forced in turn (modes 1 and 2), whatever
  // this host would pick by default. Several chunks (N a multiple of the chunk or not: the sequence's
  // last row has no next row), with and without W handed in.
  Rng rng(74);
  struct C { i64 B, N, D, r, chunk; };
  const C cases[] = {{1, 500, 8, 4, 64}, {2, 500, 16, 4, 100}, {2, 333, 16, 1, 50}, {3, 257, 24, 2, 0},
                     {2, 400, 8, 3, 70}, {2, 300, 16, 5, 60}, {2, 130, 128, 4, 40}, {1, 1, 16, 4, 0}};
  for (int mode : {1, 2}) {
    const int was = ad::semisep::set_cpu_backward_sweeps(mode);
    for (const C& c : cases)
      for (bool causal : {false, true})
        for (bool with_w : {false, true}) {
          if (causal && with_w) continue;
          INFO("B " << c.B << " N " << c.N << " D " << c.D << " r " << c.r << " chunk " << c.chunk << " causal "
                    << causal << " W given " << with_w << " sweeps mode " << mode);
          Sys s = random_sys(c.B, c.N, c.D, c.r, rng);
          Tensor w = randn64({c.B, c.N, c.D}, rng);
          PGraph g;
          std::vector<Var> in;
          for (const Tensor* t : {&s.x, &s.d, &s.up, &s.lo, &s.u, &s.v}) in.push_back(g.input(t->to(DType::f32)));
          Var y = matvec_chunked(in, causal, c.chunk, with_w);
          auto gr = grad(sum(mul(y, g.input(w.to(DType::f32)))), in);
          DenseGrads dg = dense_grads(s, causal, w.to_vector());
          check_close(eval(gr[0]).to_vector(), dg.dx, 1e-5, "dx");
          check_close(eval(gr[1]).to_vector(), dg.dd, 1e-5, "dt_diag");
          if (!causal) check_close(eval(gr[2]).to_vector(), dg.dup, 1e-5, "dt_upper");
          check_close(eval(gr[3]).to_vector(), dg.dlo, 1e-5, "dt_lower");
          check_close(eval(gr[4]).to_vector(), dg.du, 1e-5, "du");
          check_close(eval(gr[5]).to_vector(), dg.dv, 1e-5, "dv");
          // only some gradients wanted (not the one-sweep case)
          auto some = grad(sum(mul(y, g.input(w.to(DType::f32)))), {in[0], in[4]});
          check_close(eval(some[0]).to_vector(), dg.dx, 1e-5, "dx alone with du");
          check_close(eval(some[1]).to_vector(), dg.du, 1e-5, "du alone with dx");
        }
    ad::semisep::set_cpu_backward_sweeps(was);
  }
}

TEST_CASE("semiseparable_matvec causal at N = 300000 (several cache groups) matches a sequential prefix scan") {
  Rng rng(70);
  const i64 B = 2, N = 300000, D = 4, r = 2;
  Sys s = random_sys(B, N, D, r, rng);
  Graph g;
  Tensor y = eval(semiseparable_matvec(g.input(s.x), g.input(s.d), g.input(s.up), g.input(s.lo), g.input(s.u),
                                       g.input(s.v), true));
  const double *x = s.x.data<double>(), *d = s.d.data<double>(), *lo = s.lo.data<double>(), *u = s.u.data<double>(),
               *v = s.v.data<double>(), *py = y.data<double>();
  double worst = 0;
  for (i64 b = 0; b < B; ++b) {
    std::vector<double> P(static_cast<std::size_t>(r * D), 0.0);
    for (i64 i = 0; i < N; ++i) {
      const double* xi = x + (b * N + i) * D;
      for (i64 k = 0; k < r; ++k)
        for (i64 c = 0; c < D; ++c) P[static_cast<std::size_t>(k * D + c)] += v[i * r + k] * xi[c];
      for (i64 c = 0; c < D; ++c) {
        double want = d[i] * xi[c] + (i > 0 ? lo[i - 1] * xi[c - D] : 0.0);
        for (i64 k = 0; k < r; ++k) want += u[i * r + k] * P[static_cast<std::size_t>(k * D + c)];
        double got = py[(b * N + i) * D + c];
        worst = std::max(worst, std::fabs(got - want) / (1.0 + std::fabs(want)));
      }
    }
  }
  CHECK(worst < 1e-10);
}

namespace {
// Every output of the matvec kernels and their backward (full and causal),
// run at the kernel level with U, V stored as UV; returned concatenated.
template <class T, class UV> std::vector<T> matvec_kernel_outputs(i64 B, i64 N, i64 D, i64 r) {
  using namespace ad::semisep;
  std::vector<T> x(static_cast<std::size_t>(B * N * D)), dy(x.size()), d(static_cast<std::size_t>(N)), up(d.size()),
      lo(d.size());
  std::vector<UV> u(static_cast<std::size_t>(N * r)), v(u.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<T>(std::sin(0.37 * static_cast<double>(i)));
    dy[i] = static_cast<T>(std::cos(0.11 * static_cast<double>(i)));
  }
  for (i64 i = 0; i < N; ++i) {
    d[static_cast<std::size_t>(i)] = static_cast<T>(std::cos(static_cast<double>(i)));
    up[static_cast<std::size_t>(i)] = static_cast<T>(0.1 * std::sin(2.0 * static_cast<double>(i)));
    lo[static_cast<std::size_t>(i)] = static_cast<T>(0.2 * std::cos(3.0 * static_cast<double>(i)));
  }
  for (std::size_t i = 0; i < u.size(); ++i) {
    auto put = [](double a) {
      if constexpr (std::is_same_v<UV, Bf16>) return Bf16{f32_to_bf16(static_cast<float>(a))};
      else return static_cast<UV>(a);
    };
    u[i] = put(0.1 * std::sin(1.3 * static_cast<double>(i)));
    v[i] = put(0.1 * std::cos(0.7 * static_cast<double>(i)));
  }
  Dims dm = make_dims(B, N, D, r, 0);
  std::vector<char> ws(std::max(matvec_ws_bytes(dm, sizeof(T)), matvec_backward_ws_bytes(dm, sizeof(T))) + 64);
  std::vector<T> out;
  for (bool causal : {false, true}) {
    std::vector<T> y(x.size()), dx(x.size(), T(7)), dd(d.size(), T(7)), dup(d.size(), T(7)), dlo(d.size(), T(7)),
        du(u.size(), T(7)), dv(u.size(), T(7));
    matvec(dm, causal, x.data(), d.data(), up.data(), lo.data(), u.data(), v.data(), static_cast<const T*>(nullptr), y.data(), ws.data());
    MatvecGrads<T> g{dx.data(), dd.data(), dup.data(), dlo.data(), du.data(), dv.data()};
    // the full backward given W, as the graph op runs it
    std::vector<T> w(static_cast<std::size_t>(B * r * D));
    if (!causal) sums(dm, x.data(), v.data(), w.data(), ws.data());
    matvec_backward(dm, causal, x.data(), d.data(), up.data(), lo.data(), u.data(), v.data(),
                    causal ? static_cast<const T*>(nullptr) : w.data(), dy.data(), g, ws.data());
    for (const auto* a : {&y, &dx, &dd, &dup, &dlo, &du, &dv}) out.insert(out.end(), a->begin(), a->end());
  }
  return out;
}
template <class T, class UV> void check_streamed_same_bits(i64 B, i64 N, i64 D, i64 r) {
  INFO("B " << B << " N " << N << " D " << D << " r " << r << " T " << sizeof(T) << " UV " << sizeof(UV));
  const std::size_t keep = ad::semisep::stream_min_bytes();
  ad::semisep::set_stream_min_bytes(std::size_t{1} << 62);  // stores through the cache
  std::vector<T> cached = matvec_kernel_outputs<T, UV>(B, N, D, r);
  ad::semisep::set_stream_min_bytes(1);  // every aligned output streamed
  std::vector<T> streamed = matvec_kernel_outputs<T, UV>(B, N, D, r);
  ad::semisep::set_stream_min_bytes(keep);
  REQUIRE(cached.size() == streamed.size());
  i64 differ = 0;
  for (std::size_t i = 0; i < cached.size(); ++i)
    if (std::memcmp(&cached[i], &streamed[i], sizeof(T)) != 0) ++differ;
  CHECK(differ == 0);
  CHECK(std::all_of(cached.begin(), cached.end(), [](T e) { return std::isfinite(static_cast<double>(e)); }));
}
}  // namespace

TEST_CASE("semiseparable kernels: rows written with streaming stores are the same bits as through the cache") {
  // aligned rows (streamed): D = 16 / 32, r = 4, 16, 24; unaligned rows (not
  // streamed) alongside: D = 13, r = 7; several chunks, B > 1 (du, dv sum over b)
  for (int mode : {1, 2}) {  // the full backward at r = 4 in one sweep, then in three
    const int was = ad::semisep::set_cpu_backward_sweeps(mode);
    check_streamed_same_bits<float, float>(2, 3001, 16, 4);
    check_streamed_same_bits<float, float>(1, 700, 128, 3);
    ad::semisep::set_cpu_backward_sweeps(was);
  }
  check_streamed_same_bits<float, float>(1, 2500, 16, 16);
  check_streamed_same_bits<float, float>(1, 2100, 32, 24);
  check_streamed_same_bits<float, float>(2, 1999, 13, 7);
  check_streamed_same_bits<float, float>(3, 1500, 16, 7);
  check_streamed_same_bits<float, ad::semisep::Bf16>(2, 2000, 16, 8);
  check_streamed_same_bits<double, double>(2, 1800, 16, 4);
  check_streamed_same_bits<double, double>(1, 1200, 5, 3);
}

TEST_CASE("semiseparable_matvec mixed precision: bf16/f16 U, V with f32 products") {
  Rng rng(74);
  Sys s = random_sys(2, 1000, 18, 6, rng);
  for (DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    for (bool causal : {false, true}) {
      Graph g;
      Var x = g.input(s.x.to(DType::f32));
      Var d = g.input(s.d.to(DType::f32)), up = g.input(s.up.to(DType::f32)), lo = g.input(s.lo.to(DType::f32));
      Tensor u16 = s.u.to(low), v16 = s.v.to(low);
      Var u = g.input(u16), v = g.input(v16);
      Var y = semiseparable_matvec(x, d, up, lo, u, v, causal);
      // identical bits to the f32 op on the rounded U, V (conversion is exact, same order of operations)
      Var y32 = semiseparable_matvec(x, d, up, lo, g.input(u16.to(DType::f32)), g.input(v16.to(DType::f32)), causal);
      CHECK(bitwise_equal(eval(y), eval(y32)));
      // the error the storage rounding adds, against f64 with exact U, V
      Graph g64;
      Var y64 = semiseparable_matvec(g64.input(s.x), g64.input(s.d), g64.input(s.up), g64.input(s.lo),
                                     g64.input(s.u), g64.input(s.v), causal);
      double e = rel_err(eval(y).to_vector(), eval(y64).to_vector());
      double bound = low == DType::bf16 ? 1e-2 : 2e-3;  // unit roundoff 2^-9 / 2^-12, times a small factor
      CHECK_MESSAGE(e < bound, "relative error " << e);
      CHECK(e > 1e-6);  // the rounding is really there
      // gradients come back in the storage dtype
      Tensor wt = Tensor::randn({2, 1000, 18}, rng);
      Var u32 = g.input(u16.to(DType::f32)), v32 = g.input(v16.to(DType::f32));
      auto gr = grad(sum(mul(y, g.input(wt))), {u, v, x});
      auto gr32 = grad(sum(mul(semiseparable_matvec(x, d, up, lo, u32, v32, causal), g.input(wt))), {u32, v32, x});
      CHECK(gr[0].dtype() == low);
      CHECK(gr[1].dtype() == low);
      // the same gradients as the f32 op on the rounded U, V (then rounded to the storage dtype)
      CHECK(bitwise_equal(eval(gr[0]), eval(gr32[0]).to(low)));
      CHECK(bitwise_equal(eval(gr[1]), eval(gr32[1]).to(low)));
      CHECK(bitwise_equal(eval(gr[2]), eval(gr32[2])));
    }
  }
}

namespace {
// Dense T (N x N) of a system.
std::vector<double> dense_t(const Tensor& d, const Tensor& up, const Tensor& lo) {
  i64 N = d.numel();
  auto vd = d.to_vector(), vu = up.to_vector(), vl = lo.to_vector();
  std::vector<double> t(static_cast<std::size_t>(N * N), 0.0);
  for (i64 i = 0; i < N; ++i) {
    t[static_cast<std::size_t>(i * N + i)] = vd[static_cast<std::size_t>(i)];
    if (i + 1 < N) {
      t[static_cast<std::size_t>(i * N + i + 1)] = vu[static_cast<std::size_t>(i)];
      t[static_cast<std::size_t>((i + 1) * N + i)] = vl[static_cast<std::size_t>(i)];
    }
  }
  return t;
}
std::vector<double> transpose(const std::vector<double>& a, i64 N) {
  std::vector<double> t(a.size());
  for (i64 i = 0; i < N; ++i)
    for (i64 j = 0; j < N; ++j) t[static_cast<std::size_t>(j * N + i)] = a[static_cast<std::size_t>(i * N + j)];
  return t;
}
// X (B, N, D) flat -> per b a column block (N, D) solved with M; returns the flat result.
std::vector<double> solve_batched(const std::vector<double>& M, i64 N, const std::vector<double>& x, i64 B, i64 D) {
  std::vector<double> y(x.size());
  for (i64 b = 0; b < B; ++b) {
    std::vector<double> rhs(x.begin() + b * N * D, x.begin() + (b + 1) * N * D);
    dense_solve(M, N, rhs, D);
    std::copy(rhs.begin(), rhs.end(), y.begin() + b * N * D);
  }
  return y;
}
// dM = -sum_b lam_b y_b^T (N x N)
std::vector<double> outer_neg(const std::vector<double>& lam, const std::vector<double>& y, i64 B, i64 N, i64 D) {
  std::vector<double> m(static_cast<std::size_t>(N * N), 0.0);
  for (i64 b = 0; b < B; ++b)
    for (i64 i = 0; i < N; ++i)
      for (i64 j = 0; j < N; ++j)
        for (i64 c = 0; c < D; ++c)
          m[static_cast<std::size_t>(i * N + j)] -=
              lam[static_cast<std::size_t>((b * N + i) * D + c)] * y[static_cast<std::size_t>((b * N + j) * D + c)];
  return m;
}
void band_of(const std::vector<double>& m, i64 N, std::vector<double>& dd, std::vector<double>& dup,
             std::vector<double>& dlo) {
  for (i64 i = 0; i < N; ++i) dd.push_back(m[static_cast<std::size_t>(i * N + i)]);
  for (i64 i = 0; i + 1 < N; ++i) {
    dup.push_back(m[static_cast<std::size_t>(i * N + i + 1)]);
    dlo.push_back(m[static_cast<std::size_t>((i + 1) * N + i)]);
  }
}
}  // namespace

TEST_CASE("tridiag_solve matches a dense solve, forward and gradients") {
  Rng rng(75);
  const Shape shapes[] = {{1}, {5}, {64, 3}, {2, 64, 4}, {500, 2}, {3, 2, 7, 1}};
  for (const Shape& bs : shapes) {
    INFO("b " << bs.str());
    i64 N = bs.rank() == 1 ? bs[0] : bs[bs.rank() - 2];
    i64 M = bs.rank() == 1 ? 1 : bs.back(), B = bs.numel() / (N * M);
    Tensor d = randn64({N}, rng, 4.0), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng), b = randn64(bs, rng);
    PGraph g;
    std::vector<Var> in{g.input(d), g.input(up), g.input(lo), g.input(b)};
    Var y = tridiag_solve(in[0], in[1], in[2], in[3]);
    auto T = dense_t(d, up, lo);
    auto want = solve_batched(T, N, b.to_vector(), B, M);
    check_close(eval(y).to_vector(), want, 1e-13, "y");
    Tensor w = randn64(bs, rng);
    auto gr = grad(sum(mul(y, g.input(w))), in);
    auto lam = solve_batched(transpose(T, N), N, w.to_vector(), B, M);
    std::vector<double> dd, dup, dlo;
    band_of(outer_neg(lam, want, B, N, M), N, dd, dup, dlo);
    check_close(eval(gr[3]).to_vector(), lam, 1e-13, "db");
    check_close(eval(gr[0]).to_vector(), dd, 1e-12, "dt_diag");
    if (N > 1) {
      check_close(eval(gr[1]).to_vector(), dup, 1e-12, "dt_upper");
      check_close(eval(gr[2]).to_vector(), dlo, 1e-12, "dt_lower");
    }
    CHECK(count_op(y, OpId::tridiag_solve_backward) == 1);
  }
}

TEST_CASE("tridiag_resolvent_diag matches a dense inverse") {
  Rng rng(76);
  for (i64 N : {1, 2, 30, 300}) {
    Tensor d = randn64({N}, rng, 0.0, 2.0), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng);
    Tensor z = f64s({0.1, -0.7, 2.5}, {3});
    Graph g;
    Var G = tridiag_resolvent_diag(g.input(d), g.input(up), g.input(lo), g.input(z));
    CHECK(G.shape() == Shape{3, N});
    auto got = eval(G).to_vector();
    auto T = dense_t(d, up, lo);
    for (i64 k = 0; k < 3; ++k) {
      auto A = T;
      for (i64 i = 0; i < N; ++i) A[static_cast<std::size_t>(i * N + i)] -= z.to_vector()[static_cast<std::size_t>(k)];
      std::vector<double> inv(static_cast<std::size_t>(N * N), 0.0);
      for (i64 i = 0; i < N; ++i) inv[static_cast<std::size_t>(i * N + i)] = 1.0;
      dense_solve(A, N, inv, N);
      std::vector<double> want, have(got.begin() + k * N, got.begin() + (k + 1) * N);
      for (i64 i = 0; i < N; ++i) want.push_back(inv[static_cast<std::size_t>(i * N + i)]);
      INFO("N " << N << " z " << k);
      check_close(have, want, 1e-9, "diag");  // non-dominant T: a dense inverse is itself only ~1e-12 accurate
    }
    // a scalar z gives (N)
    Var g1 = tridiag_resolvent_diag(g.input(d), g.input(up), g.input(lo), g.input(f64s({0.1}, {1}).reshape({})));
    CHECK(g1.shape() == Shape{N});
    CHECK(max_abs_diff(eval(g1), eval(G).view(0, {N})) == 0.0);
  }
}

TEST_CASE("tridiag_resolvent_diag gradients match the dense formula dG_ii = -G_ij G_ki dT_jk, dG_ii/dz = (G^2)_ii") {
  Rng rng(79);
  const i64 N = 40;
  Tensor d = randn64({N}, rng, 0.0, 2.0), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng);
  const std::vector<double> zs{0.3, -1.1};
  Tensor z = f64s(zs, {2}), w = randn64({2, N}, rng);
  Graph g;
  std::vector<Var> in{g.input(d), g.input(up), g.input(lo), g.input(z)};
  Var L = sum(mul(tridiag_resolvent_diag(in[0], in[1], in[2], in[3]), g.input(w)));
  std::vector<Var> gr = grad(L, in);
  auto gd = eval(gr[0]).to_vector(), gu = eval(gr[1]).to_vector(), gl = eval(gr[2]).to_vector(),
       gz = eval(gr[3]).to_vector();
  std::vector<double> wd(static_cast<std::size_t>(N), 0.0), wu(static_cast<std::size_t>(N - 1), 0.0),
      wl(static_cast<std::size_t>(N - 1), 0.0), wz(2, 0.0);
  const auto T = dense_t(d, up, lo);
  const auto wv = w.to_vector();
  for (std::size_t k = 0; k < 2; ++k) {
    auto A = T;
    for (i64 i = 0; i < N; ++i) A[static_cast<std::size_t>(i * N + i)] -= zs[k];
    std::vector<double> G(static_cast<std::size_t>(N * N), 0.0);
    for (i64 i = 0; i < N; ++i) G[static_cast<std::size_t>(i * N + i)] = 1.0;
    dense_solve(A, N, G, N);
    auto at = [&](i64 i, i64 j) { return G[static_cast<std::size_t>(i * N + j)]; };
    for (i64 i = 0; i < N; ++i) {
      const double wi = wv[k * static_cast<std::size_t>(N) + static_cast<std::size_t>(i)];
      for (i64 j = 0; j < N; ++j) {
        wd[static_cast<std::size_t>(j)] -= wi * at(i, j) * at(j, i);
        wz[k] += wi * at(i, j) * at(j, i);
        if (j + 1 < N) {
          wu[static_cast<std::size_t>(j)] -= wi * at(i, j) * at(j + 1, i);  // T[j][j+1]
          wl[static_cast<std::size_t>(j)] -= wi * at(i, j + 1) * at(j, i);  // T[j+1][j]
        }
      }
    }
  }
  check_close(gd, wd, 1e-8, "dd");
  check_close(gu, wu, 1e-8, "dup");
  check_close(gl, wl, 1e-8, "dlo");
  check_close(gz, wz, 1e-8, "dz");
}

TEST_CASE("tridiag_resolvent_diag is finite at N = 10^6 where theta_N overflows") {
  // d_i in [4, 5]: theta_N grows like ~4^N (overflows double past N ~ 512),
  // yet the ratios stay O(1). G_ii of an interior row depends only on a
  // neighbourhood (|G_ij| decays like ~4^-|i-j|): compare it with a dense
  // inverse of a 61-row window.
  const i64 N = 1000000;
  Rng rng(77);
  Tensor d = uniform64({N}, rng, 4.0, 5.0), up = uniform64({N - 1}, rng, -1, 1), lo = uniform64({N - 1}, rng, -1, 1);
  Graph g;
  Var G = tridiag_resolvent_diag(g.input(d), g.input(up), g.input(lo), g.input(f64s({0.5}, {1}).reshape({})));
  Tensor gv = eval(G);
  CHECK(all_finite(gv));
  const double* pg = gv.data<double>();
  for (i64 c : {i64{30}, N / 2, N - 31}) {
    const i64 W = 30;
    Tensor wd = d.view(c - W, {2 * W + 1}), wu = up.view(c - W, {2 * W}), wl = lo.view(c - W, {2 * W});
    auto A = dense_t(wd, wu, wl);
    for (i64 i = 0; i <= 2 * W; ++i) A[static_cast<std::size_t>(i * (2 * W + 1) + i)] -= 0.5;
    std::vector<double> e(static_cast<std::size_t>(2 * W + 1), 0.0);
    e[static_cast<std::size_t>(W)] = 1.0;
    dense_solve(A, 2 * W + 1, e, 1);
    CHECK(pg[c] == doctest::Approx(e[static_cast<std::size_t>(W)]).epsilon(1e-12));
  }
  // and the gradient is finite too
  Graph g2;
  Var dv = g2.input(d);
  Var G2 = tridiag_resolvent_diag(dv, g2.input(up), g2.input(lo), g2.input(f64s({0.5}, {1}).reshape({})));
  CHECK(all_finite(eval(grad(sum(G2), {dv})[0])));
}

namespace {
using cplx = std::complex<double>;
// The full inverse of T - zI (N x N, row-major) by Gaussian elimination with
// partial pivoting on the dense complex matrix.
std::vector<cplx> dense_complex_inverse(const Tensor& d, const Tensor& up, const Tensor& lo, cplx z) {
  i64 N = d.numel();
  auto t = dense_t(d, up, lo);
  auto at = [N](std::vector<cplx>& m, i64 i, i64 j) -> cplx& { return m[static_cast<std::size_t>(i * N + j)]; };
  std::vector<cplx> A(t.begin(), t.end()), X(static_cast<std::size_t>(N * N), 0.0);
  for (i64 i = 0; i < N; ++i) { at(A, i, i) -= z; at(X, i, i) = 1.0; }
  for (i64 c = 0; c < N; ++c) {
    i64 p = c;
    for (i64 i = c + 1; i < N; ++i) if (std::abs(at(A, i, c)) > std::abs(at(A, p, c))) p = i;
    for (i64 j = 0; j < N; ++j) { std::swap(at(A, c, j), at(A, p, j)); std::swap(at(X, c, j), at(X, p, j)); }
    for (i64 i = c + 1; i < N; ++i) {
      cplx f = at(A, i, c) / at(A, c, c);
      if (f == 0.0) continue;
      for (i64 j = c; j < N; ++j) at(A, i, j) -= f * at(A, c, j);
      for (i64 j = 0; j < N; ++j) at(X, i, j) -= f * at(X, c, j);
    }
  }
  for (i64 c = N - 1; c >= 0; --c)
    for (i64 j = 0; j < N; ++j) {
      cplx v = at(X, c, j);
      for (i64 k = c + 1; k < N; ++k) v -= at(A, c, k) * at(X, k, j);
      at(X, c, j) = v / at(A, c, c);
    }
  return X;
}
}  // namespace

TEST_CASE("tridiag_resolvent_diag_complex matches a dense complex inverse, forward and gradients") {
  Rng rng(81);
  const std::vector<double> zs{0.1, 0.3, -0.7, -1.2, 2.5, 0.05};  // three shifts (re, im)
  for (i64 N : {1, 2, 30, 200}) {
    Tensor d = randn64({N}, rng, 0.0, 2.0), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng);
    Graph g;
    std::vector<Var> in{g.input(d), g.input(up), g.input(lo), g.input(f64s(zs, {3, 2}))};
    Var G = tridiag_resolvent_diag_complex(in[0], in[1], in[2], in[3]);
    CHECK(G.shape() == Shape{3, N, 2});
    auto got = eval(G).to_vector();
    Tensor w = randn64({3, N, 2}, rng);
    auto gr = grad(sum(mul(G, g.input(w))), in);
    auto wv = w.to_vector();
    std::vector<double> dd(static_cast<std::size_t>(N), 0.0), dup(static_cast<std::size_t>(N - 1), 0.0),
        dlo(dup.size(), 0.0), dz;
    for (i64 k = 0; k < 3; ++k) {
      INFO("N " << N << " shift " << k);
      cplx z(zs[static_cast<std::size_t>(2 * k)], zs[static_cast<std::size_t>(2 * k + 1)]);
      auto X = dense_complex_inverse(d, up, lo, z);
      auto x = [&](i64 i, i64 j) { return X[static_cast<std::size_t>(i * N + j)]; };
      std::vector<double> want, have(got.begin() + 2 * k * N, got.begin() + 2 * (k + 1) * N);
      for (i64 i = 0; i < N; ++i) { want.push_back(x(i, i).real()); want.push_back(x(i, i).imag()); }
      check_close(have, want, 1e-10, "G");
      // dG_ii = -G_ij G_ki dT_jk and dG_ii / dz = (G^2)_ii; with gbar_i = w_re - i w_im,
      // dL/dT_jk = Re sum_i gbar_i (-G_ij G_ki), dL/dRe z = Re s, dL/dIm z = -Im s, s = sum_i gbar_i (G^2)_ii.
      cplx s = 0;
      for (i64 i = 0; i < N; ++i) {
        cplx gbar(wv[static_cast<std::size_t>(2 * (k * N + i))], -wv[static_cast<std::size_t>(2 * (k * N + i) + 1)]);
        for (i64 j = 0; j < N; ++j) {
          s += gbar * x(i, j) * x(j, i);
          dd[static_cast<std::size_t>(j)] -= (gbar * x(i, j) * x(j, i)).real();
          if (j + 1 < N) {
            dup[static_cast<std::size_t>(j)] -= (gbar * x(i, j) * x(j + 1, i)).real();
            dlo[static_cast<std::size_t>(j)] -= (gbar * x(i, j + 1) * x(j, i)).real();
          }
        }
      }
      dz.push_back(s.real());
      dz.push_back(-s.imag());
    }
    check_close(eval(gr[0]).to_vector(), dd, 1e-10, "dt_diag");
    check_close(eval(gr[3]).to_vector(), dz, 1e-10, "dz");
    if (N > 1) {
      check_close(eval(gr[1]).to_vector(), dup, 1e-10, "dt_upper");
      check_close(eval(gr[2]).to_vector(), dlo, 1e-10, "dt_lower");
    }
    CHECK(count_op(G, OpId::tridiag_resolvent_diag_complex_backward) == 1);
    // a single shift (2) gives (N, 2), the same values as row 0
    Var g1 = tridiag_resolvent_diag_complex(in[0], in[1], in[2], g.input(f64s({0.1, 0.3}, {2})));
    CHECK(g1.shape() == Shape{N, 2});
    CHECK(max_abs_diff(eval(g1), eval(G).view(0, {N, 2})) == 0.0);
  }
}

TEST_CASE("tridiag_resolvent_diag and its complex form are exact under power-of-two scaling of T and z") {
  // a 2^k scale of every entry and of z is exact, so 2^k G(2^k T, 2^k z) must equal G(T, z) bit for
  // bit; forming e_i = up_i lo_i lost the coupling (entries below ~1e-154) or gave NaN (above ~1e154)
  Rng rng(91);
  const i64 N = 2000;
  Tensor d = randn64({N}, rng, 0.0, 2.0), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng);
  auto scaled = [](const Tensor& t, int k) {
    Tensor o = t.clone();
    for (i64 i = 0; i < o.numel(); ++i) o.data<double>()[i] = std::ldexp(o.data<double>()[i], k);
    return o;
  };
  auto run = [&](int k, bool complex) {
    Graph g;
    Tensor z = complex ? f64s({0.3, 0.2}, {2}) : f64s({0.3}, {1}).reshape({});
    Var out = complex ? tridiag_resolvent_diag_complex(g.input(scaled(d, k)), g.input(scaled(up, k)),
                                                       g.input(scaled(lo, k)), g.input(scaled(z, k)))
                      : tridiag_resolvent_diag(g.input(scaled(d, k)), g.input(scaled(up, k)), g.input(scaled(lo, k)),
                                               g.input(scaled(z, k)));
    std::vector<double> v = eval(out).to_vector();
    for (double& x : v) x = std::ldexp(x, k);
    return v;
  };
  for (bool complex : {false, true}) {
    const std::vector<double> ref = run(0, complex);
    CHECK(std::all_of(ref.begin(), ref.end(), [](double x) { return std::isfinite(x); }));
    for (int k : {-600, -540, -300, 300, 520, 600}) {
      INFO((complex ? "complex" : "real") << " scale 2^" << k);
      CHECK(run(k, complex) == ref);
    }
  }
}
TEST_CASE("tridiag_resolvent_diag gradients are exact under power-of-two scaling and similarity") {
  // G(c T, c z) = G(T, z) / c and G depends on up_i lo_i only, so with c = 2^k and up, lo scaled
  // by c 2^j and c 2^-j: dd = 2^-2k dd0, dup = 2^(-2k-j) dup0, dlo = 2^(-2k+j) dlo0, dz = 2^-2k dz0,
  // bit for bit while they are normal doubles. Forming up lo, r^2 or G^2 at T's scale gave NaN
  // here (entries past ~1e154) where these are finite.
  Rng rng(92);
  const i64 N = 500;
  Tensor d = randn64({N}, rng, 0.0, 2.0), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng);
  Tensor w = randn64({N}, rng);
  auto scaled = [](const Tensor& t, int k) {
    Tensor o = t.clone();
    for (i64 i = 0; i < o.numel(); ++i) o.data<double>()[i] = std::ldexp(o.data<double>()[i], k);
    return o;
  };
  auto grads = [&](int k, int j, bool complex) {
    Graph g;
    Tensor z = complex ? f64s({0.3, 0.2}, {2}) : f64s({0.3}, {1}).reshape({});
    std::vector<Var> in{g.input(scaled(d, k)), g.input(scaled(up, k + j)), g.input(scaled(lo, k - j)),
                        g.input(scaled(z, k))};
    Var G = complex ? tridiag_resolvent_diag_complex(in[0], in[1], in[2], in[3])
                    : tridiag_resolvent_diag(in[0], in[1], in[2], in[3]);
    Tensor wg = complex ? Tensor::zeros({N, 2}, DType::f64) : w;
    if (complex)
      for (i64 i = 0; i < N; ++i) {
        wg.data<double>()[2 * i] = w.data<double>()[i];
        wg.data<double>()[2 * i + 1] = 0.5 * w.data<double>()[(i + 7) % N];
      }
    std::vector<std::vector<double>> out;
    for (const Var& v : grad(sum(mul(G, g.input(wg))), in)) out.push_back(eval(v).to_vector());
    return out;
  };
  for (bool complex : {false, true}) {
    const auto ref = grads(0, 0, complex);
    for (const auto& v : ref) CHECK(std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x) && x != 0; }));
    struct S { int k, j; };
    for (S sc : {S{300, 0}, S{-300, 0}, S{500, 0}, S{530, 170}, S{-400, -100}}) {
      const std::string what = std::string(complex ? "complex" : "real") + " scale 2^" + std::to_string(sc.k) +
                               ", up 2^" + std::to_string(sc.j) + ", lo 2^" + std::to_string(-sc.j);
      INFO(what);
      const auto got = grads(sc.k, sc.j, complex);
      const int shift[4] = {2 * sc.k, 2 * sc.k + sc.j, 2 * sc.k - sc.j, 2 * sc.k};
      for (std::size_t i = 0; i < 4; ++i) {
        INFO("gradient " << i);
        std::size_t compared = 0, equal = 0;
        for (std::size_t e = 0; e < ref[i].size(); ++e) {
          const double want = std::ldexp(ref[i][e], -shift[i]);
          if (std::fabs(want) < DBL_MIN) continue;  // subnormal or 0: fewer bits, no exact claim
          ++compared;
          equal += got[i][e] == want;
        }
        CHECK(equal == compared);
        // at 2^530 with up 2^700, lo 2^360: dup (2^-1230 times dup0) underflows, dd and dz are
        // subnormal; dlo (2^-890 times dlo0) is normal and exact
        if (!(sc.k == 530 && i != 2)) CHECK(compared == ref[i].size());
      }
    }
  }
}
TEST_CASE("tridiag_resolvent_diag of a split T (a zero coupling) at an eigenvalue of one block") {
  // T = diag(3, 1, 5) at z = 1: row 1 is infinite, rows 0 and 2 are 1/2 and 1/4 (0/0 in the
  // ratio after the zero minor made every later row NaN)
  auto f = [](std::vector<double> v) { return f64s(v, {static_cast<i64>(v.size())}); };
  Graph g;
  Var d = g.input(f({3, 1, 5})), zero = g.input(f({0, 0}));
  CHECK(eval(tridiag_resolvent_diag(d, zero, zero, g.input(f64s({1.0}, {1}).reshape({})))).to_vector() ==
        std::vector<double>{0.5, INFINITY, 0.25});
  CHECK(eval(tridiag_resolvent_diag_complex(d, zero, zero, g.input(f({1.0, 0.0})))).to_vector() ==
        std::vector<double>{0.5, 0.0, INFINITY, 0.0, 0.25, 0.0});
  // blocks [[1, 2], [2, 1]] (eigenvalues 3, -1) and [[4, 1], [1, 6]], coupled by up = 0 only
  // (lo nonzero), at z = 3: the second block's rows are those of its own resolvent
  Var d2 = g.input(f({1, 1, 4, 6})), up2 = g.input(f({2, 0, 1})), lo2 = g.input(f({2, 0.7, 1}));
  for (bool complex : {false, true}) {
    INFO((complex ? "complex" : "real"));
    auto v = complex ? eval(tridiag_resolvent_diag_complex(d2, up2, lo2, g.input(f({3.0, 0.0})))).to_vector()
                     : eval(tridiag_resolvent_diag(d2, up2, lo2, g.input(f64s({3.0}, {1}).reshape({})))).to_vector();
    const std::size_t st = complex ? 2 : 1;
    // (B - 3I)^-1 for B = [[4, 1], [1, 6]]: [[1, 1], [1, 3]]^-1 = [[3, -1], [-1, 1]] / 2
    CHECK(v[2 * st] == doctest::Approx(1.5).epsilon(1e-15));
    CHECK(v[3 * st] == doctest::Approx(0.5).epsilon(1e-15));
    for (double x : v) CHECK(!std::isnan(x));
  }
}
TEST_CASE("tridiag_resolvent_diag_complex with Im z -> 0 is the real op") {
  Rng rng(82);
  const i64 N = 300;
  Tensor d = randn64({N}, rng, 0.0, 2.0), up = randn64({N - 1}, rng), lo = randn64({N - 1}, rng);
  const double x = 0.37;
  Graph g;
  std::vector<Var> in{g.input(d), g.input(up), g.input(lo)};
  Var zr = g.input(f64s({x}, {1}).reshape({}));
  Var gr = tridiag_resolvent_diag(in[0], in[1], in[2], zr);
  auto real = eval(gr).to_vector();
  for (double y : {0.0, 1e-13, -1e-13}) {
    INFO("Im z " << y);
    Var zc = g.input(f64s({x, y}, {2}));
    Var gc = tridiag_resolvent_diag_complex(in[0], in[1], in[2], zc);
    auto c = eval(gc).to_vector();
    std::vector<double> re, im;
    for (i64 i = 0; i < N; ++i) { re.push_back(c[static_cast<std::size_t>(2 * i)]); im.push_back(c[static_cast<std::size_t>(2 * i + 1)]); }
    if (y == 0.0) {
      CHECK(re == real);  // bit for bit
      for (double v : im) CHECK(v == 0.0);
    } else {
      check_close(re, real, 1e-9, "re");
    }
    // gradients through the real parts only: those of the real op
    auto w = randn64({N}, rng);
    auto wc = Tensor::zeros({N, 2}, DType::f64);
    for (i64 i = 0; i < N; ++i) wc.data<double>()[2 * i] = w.to_vector()[static_cast<std::size_t>(i)];
    auto g_real = grad(sum(mul(gr, g.input(w))), {in[0], in[1], in[2], zr});
    auto g_cplx = grad(sum(mul(gc, g.input(wc))), {in[0], in[1], in[2], zc});
    for (std::size_t i = 0; i < 3; ++i) check_close(eval(g_cplx[i]).to_vector(), eval(g_real[i]).to_vector(), 1e-9, "dT");
    CHECK(eval(g_cplx[3]).to_vector()[0] == doctest::Approx(eval(g_real[3]).item()).epsilon(1e-9));
  }
}

TEST_CASE("tridiag_resolvent_diag_complex is finite at N = 10^6") {
  const i64 N = 1000000;
  Rng rng(83);
  // dominant T (theta_N overflows): interior rows against a dense window inverse, as for the real op
  Tensor d = uniform64({N}, rng, 4.0, 5.0), up = uniform64({N - 1}, rng, -1, 1), lo = uniform64({N - 1}, rng, -1, 1);
  const cplx z(0.5, 0.8);
  Graph g;
  std::vector<Var> in{g.input(d), g.input(up), g.input(lo), g.input(f64s({z.real(), z.imag()}, {2}))};
  Var G = tridiag_resolvent_diag_complex(in[0], in[1], in[2], in[3]);
  Tensor gv = eval(G);
  CHECK(all_finite(gv));
  const double* pg = gv.data<double>();
  for (i64 c : {i64{30}, N / 2, N - 31}) {
    const i64 W = 30;
    auto X = dense_complex_inverse(d.view(c - W, {2 * W + 1}), up.view(c - W, {2 * W}), lo.view(c - W, {2 * W}), z);
    cplx want = X[static_cast<std::size_t>(W * (2 * W + 1) + W)];
    CHECK(std::abs(cplx(pg[2 * c], pg[2 * c + 1]) - want) <= 1e-12 * std::abs(want));
  }
  for (const Var& v : grad(sum(G), in)) CHECK(all_finite(eval(v)));
  // T far from dominant (spectrum real: e_i > 0), |z| moderate: the minors grow and shrink by
  // turns, the ratios stay finite
  Tensor d2 = randn64({N}, rng), up2 = uniform64({N - 1}, rng, 0.2, 1), lo2 = uniform64({N - 1}, rng, 0.2, 1);
  Graph g2;
  std::vector<Var> in2{g2.input(d2), g2.input(up2), g2.input(lo2), g2.input(f64s({0.2, 0.5, -1.5, 0.1}, {2, 2}))};
  Var G2 = tridiag_resolvent_diag_complex(in2[0], in2[1], in2[2], in2[3]);
  CHECK(all_finite(eval(G2)));
  for (const Var& v : grad(sum(G2), in2)) CHECK(all_finite(eval(v)));
}

TEST_CASE("tridiag_resolvent_diag_complex at an eigenvalue is infinite, as the real op") {
  auto f = [](std::vector<double> v) { return f64s(v, {static_cast<i64>(v.size())}); };
  Graph g;
  // T = [[2, 1], [1, 2]], eigenvalues 1 and 3: both ops give +inf (no error)
  Var d = g.input(f({2, 2})), up = g.input(f({1})), lo = g.input(f({1}));
  auto real = eval(tridiag_resolvent_diag(d, up, lo, g.input(f64s({1.0}, {1}).reshape({})))).to_vector();
  auto c = eval(tridiag_resolvent_diag_complex(d, up, lo, g.input(f({1.0, 0.0})))).to_vector();
  CHECK(real == std::vector<double>{INFINITY, INFINITY});
  CHECK(c == std::vector<double>{INFINITY, 0.0, INFINITY, 0.0});
  // T = [[0, 1], [-1, 0]], eigenvalues +-i: z = i gives (+inf, 0) too, never NaN
  Var rot = tridiag_resolvent_diag_complex(g.input(f({0, 0})), up, g.input(f({-1})), g.input(f({0.0, 1.0})));
  CHECK(eval(rot).to_vector() == std::vector<double>{INFINITY, 0.0, INFINITY, 0.0});
}

TEST_CASE("semiseparable_solve matches a dense solve, forward and gradients") {
  Rng rng(78);
  struct C { i64 B, N, D, r, chunk; };
  const C cases[] = {{2, 1, 3, 1, 0}, {1, 10, 2, 3, 0}, {2, 64, 3, 4, 0}, {2, 300, 4, 5, 37}, {1, 20, 2, 0, 0}};
  for (const C& c : cases) {
    INFO("B " << c.B << " N " << c.N << " D " << c.D << " r " << c.r << " chunk " << c.chunk);
    Sys s = random_sys(c.B, c.N, c.D, c.r, rng, 4.0);
    PGraph g;
    std::vector<Var> in{g.input(s.x), g.input(s.d), g.input(s.up), g.input(s.lo), g.input(s.u), g.input(s.v)};
    Attrs at;
    at.start = c.chunk;
    Var y = make_node(OpId::semiseparable_solve, {in[0], in[1], in[2], in[3], in[4], in[5]}, at);
    auto H = dense_h(s, false);
    auto want = solve_batched(H, c.N, s.x.to_vector(), c.B, c.D);
    check_close(eval(y).to_vector(), want, 1e-12, "y");
    Tensor w = randn64({c.B, c.N, c.D}, rng);
    auto gr = grad(sum(mul(y, g.input(w))), in);
    auto lam = solve_batched(transpose(H, c.N), c.N, w.to_vector(), c.B, c.D);
    auto dH = outer_neg(lam, want, c.B, c.N, c.D);
    std::vector<double> dd, dup, dlo, du(static_cast<std::size_t>(c.N * c.r), 0.0), dv(du.size(), 0.0);
    band_of(dH, c.N, dd, dup, dlo);
    auto u = s.u.to_vector(), v = s.v.to_vector();
    for (i64 i = 0; i < c.N; ++i)
      for (i64 j = 0; j < c.N; ++j)
        for (i64 k = 0; k < c.r; ++k) {
          du[static_cast<std::size_t>(i * c.r + k)] += dH[static_cast<std::size_t>(i * c.N + j)] * v[static_cast<std::size_t>(j * c.r + k)];
          dv[static_cast<std::size_t>(j * c.r + k)] += dH[static_cast<std::size_t>(i * c.N + j)] * u[static_cast<std::size_t>(i * c.r + k)];
        }
    check_close(eval(gr[0]).to_vector(), lam, 1e-12, "dx");
    check_close(eval(gr[1]).to_vector(), dd, 1e-11, "dt_diag");
    if (c.N > 1) {
      check_close(eval(gr[2]).to_vector(), dup, 1e-11, "dt_upper");
      check_close(eval(gr[3]).to_vector(), dlo, 1e-11, "dt_lower");
    }
    if (c.r > 0) {
      check_close(eval(gr[4]).to_vector(), du, 1e-11, "du");
      check_close(eval(gr[5]).to_vector(), dv, 1e-11, "dv");
    }
    CHECK(count_op(y, OpId::semiseparable_solve_backward) == 1);
  }
}

TEST_CASE("semiseparable ops: predicted peak equals measured peak under keep_all and a budget") {
  Rng rng(79);
  Sys s = random_sys(2, 500, 4, 3, rng, 4.0);
  for (int pol = 0; pol < 2; ++pol) {
    Graph g;
    Parameter pu(s.u.clone()), pv(s.v.clone()), pd(s.d.clone()), plo(s.lo.clone());
    Var up = g.input(s.up);
    Var h = semiseparable_matvec(g.input(s.x), pd, up, plo, pu, pv, true);
    Var y = semiseparable_solve(tanh(h), pd, up, plo, pu, pv);
    Var z = tridiag_solve(pd, up, plo, y);
    Var loss = sum(mul(z, z)) + sum(tridiag_resolvent_diag(pd, up, plo, g.input(f64s({0.2, 0.4}, {2})))) +
               sum(tridiag_resolvent_diag_complex(pd, up, plo, g.input(f64s({0.2, 0.1, 0.4, -0.3}, {2, 2}))));
    Report r = backward(loss, pol == 0 ? policy::keep_all() : policy::budget(400_KiB));
    CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
    CHECK(pu.has_grad());
    CHECK(all_finite(pu.grad()));
  }
}

TEST_CASE("semiseparable misuse: shapes, dtypes, singular systems") {
  Rng rng(80);
  Graph g;
  auto in = [&](const Shape& s, DType t = DType::f32) { return g.input(Tensor::randn(s, rng, t)); };
  Var x = in({2, 5, 3}), d = in({5}), up = in({4}), lo = in({4}), u = in({5, 2}), v = in({5, 2});
  auto expect = [](auto&& f, std::vector<std::string> needles) {
    std::string msg;
    try { f(); } catch (const Error& e) { msg = e.what(); }
    INFO("message: " << msg);
    CHECK_FALSE(msg.empty());
    for (const auto& n : needles) CHECK_MESSAGE(msg.find(n) != std::string::npos, "lacks " << n);
  };
  expect([&] { semiseparable_matvec(in({5, 3}), d, up, lo, u, v); }, {"semiseparable_matvec", "x must be (B, N, D)", "x f32[5,3]"});
  expect([&] { semiseparable_matvec(x, in({4}), up, lo, u, v); }, {"semiseparable_matvec", "t_diag must be [5]", "t_diag f32[4]"});
  expect([&] { semiseparable_matvec(x, d, in({5}), lo, u, v); }, {"semiseparable_matvec", "t_upper and t_lower", "t_upper f32[5]"});
  expect([&] { semiseparable_matvec(x, d, up, lo, in({5, 2}), in({5, 3})); }, {"semiseparable_matvec", "u and v", "v f32[5,3]"});
  expect([&] { semiseparable_matvec(x, d, up, lo, in({4, 2}), in({4, 2})); }, {"semiseparable_matvec", "u f32[4,2]"});
  expect([&] { semiseparable_matvec(x, d, up, lo, u, in({5, 2}, DType::f64)); }, {"semiseparable_matvec", "dtype mismatch"});
  expect([&] { semiseparable_matvec(x, in({5}, DType::f64), up, lo, u, v); }, {"semiseparable_matvec", "dtype mismatch", "t_diag f64[5]"});
  // W = V^T x, the full product's internal 7th input: its shape is checked too
  expect([&] { make_node(OpId::semiseparable_matvec, {x, d, up, lo, u, v, in({2, 3, 2})}); },
         {"semiseparable_matvec", "w must be V^T x: (2, 2, 3)", "w f32[2,3,2]"});
  expect([&] { make_node(OpId::semiseparable_sums, {x, in({4, 2})}); }, {"semiseparable_sums", "v f32[4,2]"});
  // a W that is not V^T x of the node's own x and v: its gradient would be wrong, so backward refuses
  Var wrong_w = make_node(OpId::semiseparable_matvec, {x, d, up, lo, u, v, in({2, 2, 3})});
  expect([&] { grad(sum(wrong_w), {x}); }, {"semiseparable_matvec", "must be semiseparable_sums(x, v)", "f32[2,2,3]"});
  // a failed build leaves no node behind (the builder takes its first node back only when it succeeded)
  const std::size_t before = g.impl().nodes.size();
  expect([&] { semiseparable_matvec(x, d, up, in({3}), u, v); }, {"semiseparable_matvec", "t_lower f32[3]"});
  CHECK(g.impl().nodes.size() == before + 1);  // the t_lower input only
  Var xd = in({2, 5, 3}, DType::f64);
  Var ub = g.input(Tensor::randn({5, 2}, rng).to(DType::bf16));
  expect([&] { semiseparable_matvec(xd, in({5}, DType::f64), in({4}, DType::f64), in({4}, DType::f64), ub, ub); },
         {"semiseparable_matvec", "bf16/f16 when x is f32", "u bf16[5,2]"});
  expect([&] { semiseparable_solve(x, d, up, lo, ub, ub); }, {"semiseparable_solve", "u and v must have x's dtype"});
  expect([&] { semiseparable_matvec(in({2, 0, 3}), in({0}), in({0}), in({0}), in({0, 1}), in({0, 1})); },
         {"semiseparable_matvec", "N = x.shape[1] must be >= 1"});
  expect([&] { semiseparable_solve(x, d, up, in({3}), u, v); }, {"semiseparable_solve", "t_lower f32[3]"});
  expect([&] { tridiag_solve(d, up, lo, in({4, 2})); }, {"tridiag_solve", "b must be (N) or (..., N, M) with N = 5", "b f32[4,2]"});
  expect([&] { tridiag_solve(d, in({3}), lo, in({5})); }, {"tridiag_solve", "t_upper f32[3]"});
  expect([&] { tridiag_solve(d, up, lo, in({5}, DType::f64)); }, {"tridiag_solve", "dtype mismatch"});
  expect([&] { tridiag_resolvent_diag(d, up, lo, in({2, 2})); }, {"tridiag_resolvent_diag", "z must be", "z f32[2,2]"});
  for (const Shape& z : {Shape{3}, Shape{}, Shape{4, 3}, Shape{2, 2, 2}})
    expect([&] { tridiag_resolvent_diag_complex(d, up, lo, in(z)); },
           {"tridiag_resolvent_diag_complex", "z must be (2) or (K, 2)", "z f32" + z.str()});
  expect([&] { tridiag_resolvent_diag_complex(d, up, lo, in({2}, DType::f64)); },
         {"tridiag_resolvent_diag_complex", "dtype mismatch", "z f64[2]"});
  expect([&] { tridiag_resolvent_diag_complex(d, up, lo, g.input(Tensor::zeros({2}, DType::i64))); },
         {"tridiag_resolvent_diag_complex", "z must be f32 or f64"});
  expect([&] { tridiag_resolvent_diag_complex(d, in({3}), lo, in({3, 2})); },
         {"tridiag_resolvent_diag_complex", "t_upper and t_lower", "t_upper f32[3]"});
  // zero pivots, at run time, naming the op and the row
  auto ones = [](i64 n) { return Tensor::full({n}, 1.0, DType::f64); };
  {
    Graph h;  // T = tridiag(1, 1, 1): pivots 1, 0 -> row 1
    Var y = tridiag_solve(h.input(ones(5)), h.input(ones(4)), h.input(ones(4)), h.input(ones(5)));
    expect([&] { eval(y); }, {"tridiag_solve", "pivot", "at row 1"});
    Tensor dz = ones(5);
    dz.data<double>()[0] = 0;
    Var y0 = tridiag_solve(h.input(dz), h.input(ones(4)), h.input(ones(4)), h.input(ones(5)));
    expect([&] { eval(y0); }, {"tridiag_solve", "at row 0"});
    Var s = semiseparable_solve(h.input(Tensor::full({1, 5, 2}, 1.0, DType::f64)), h.input(ones(5)),
                                h.input(ones(4)), h.input(ones(4)), h.input(Tensor::full({5, 1}, 0.5, DType::f64)),
                                h.input(Tensor::full({5, 1}, 0.5, DType::f64)));
    expect([&] { eval(s); }, {"semiseparable_solve", "at row 1"});
    // T = I, U = e_0, V = -e_0: I + V^T T^-1 U = 0
    Tensor eu = Tensor::zeros({5, 1}, DType::f64), ev = Tensor::zeros({5, 1}, DType::f64);
    eu.data<double>()[0] = 1;
    ev.data<double>()[0] = -1;
    Var sc = semiseparable_solve(h.input(Tensor::full({1, 5, 2}, 1.0, DType::f64)), h.input(ones(5)),
                                 h.input(Tensor::zeros({4}, DType::f64)), h.input(Tensor::zeros({4}, DType::f64)),
                                 h.input(eu), h.input(ev));
    expect([&] { eval(sc); }, {"semiseparable_solve", "capacitance", "singular"});
  }
  // H = t (I - 1 1^T / N) (T = t I, U = 1, V = -t/N 1) is singular, but C = 1 + V^T T^-1 U rounds
  // to about 1e-16 rather than 0: singular to working precision is an error too (it returned
  // y ~ 1e15 before), in both dtypes; a well-conditioned neighbour (V = -t/(2N) 1) solves
  for (DType dt : {DType::f64, DType::f32})
    for (i64 N : {5, 7, 10, 33}) {
      INFO(dtype_name(dt) << " N " << N);
      const double t = 0.3;
      Graph h;
      auto xs = h.input(Tensor::full({1, N, 2}, 1.0, dt));
      auto ds = h.input(Tensor::full({N}, t, dt)), z = h.input(Tensor::zeros({N - 1}, dt));
      auto us = h.input(Tensor::full({N, 1}, 1.0, dt));
      Var bad = semiseparable_solve(xs, ds, z, z, us, h.input(Tensor::full({N, 1}, -t / static_cast<double>(N), dt)));
      expect([&] { eval(bad); }, {"semiseparable_solve", "capacitance", "singular to working precision"});
      Var good = semiseparable_solve(xs, ds, z, z, us, h.input(Tensor::full({N, 1}, -t / (2.0 * static_cast<double>(N)), dt)));
      // (t I - t/(2N) 1 1^T) y = 1 has y = 2/t for every entry
      for (double e : eval(good).to_vector()) CHECK(e == doctest::Approx(2.0 / t).epsilon(1e-5));
    }
}

// ---- gradcheck cases ----
namespace ad::test {
void semiseparable_gradcheck_cases(std::vector<GradCase>& out, Rng& rng) {
  struct M { i64 B, N, D, r, chunk; bool causal; };
  const M ms[] = {{2, 5, 3, 2, 0, false}, {1, 6, 2, 3, 0, true}, {2, 1, 2, 1, 0, false},
                  {1, 9, 2, 2, 4, false}, {2, 9, 1, 2, 4, true}, {1, 6, 9, 9, 0, true}};
  for (const M& m : ms) {
    Sys s = random_sys(m.B, m.N, m.D, m.r, rng);
    bool causal = m.causal;
    i64 chunk = m.chunk;
    out.push_back({OpId::semiseparable_matvec,
                   fmt::format("x[{},{},{}] r {} chunk {}{}", m.B, m.N, m.D, m.r, chunk, causal ? " causal" : ""),
                   {s.x, s.d, s.up, s.lo, s.u, s.v},
                   [causal, chunk](const std::vector<Var>& v) { return matvec_chunked(v, causal, chunk); }});
    if (causal) continue;
    // full, given W = V^T x from a semiseparable_sums node (as built on the CPU)
    out.push_back({OpId::semiseparable_matvec,
                   fmt::format("x[{},{},{}] r {} chunk {} given W", m.B, m.N, m.D, m.r, chunk),
                   {s.x, s.d, s.up, s.lo, s.u, s.v},
                   [chunk](const std::vector<Var>& v) { return matvec_chunked(v, false, chunk, true); }});
  }
  // W = V^T x on its own (its backward rule, used when something else reads W)
  const M ws[] = {{2, 5, 3, 2, 0, false}, {1, 9, 2, 3, 4, false}, {3, 1, 1, 1, 0, false}};
  for (const M& m : ws) {
    Sys s = random_sys(m.B, m.N, m.D, m.r, rng);
    i64 chunk = m.chunk;
    out.push_back({OpId::semiseparable_sums, fmt::format("x[{},{},{}] r {} chunk {}", m.B, m.N, m.D, m.r, chunk),
                   {s.x, s.v}, [chunk](const std::vector<Var>& v) {
                     Attrs at;
                     at.start = chunk;
                     return make_node(OpId::semiseparable_sums, {v[0], v[1]}, at);
                   }});
  }
  const M ss[] = {{2, 5, 3, 2, 0, false}, {1, 1, 2, 1, 0, false}, {1, 9, 2, 3, 4, false}};
  for (const M& m : ss) {
    Sys s = random_sys(m.B, m.N, m.D, m.r, rng, 4.0);
    i64 chunk = m.chunk;
    out.push_back({OpId::semiseparable_solve, fmt::format("x[{},{},{}] r {} chunk {}", m.B, m.N, m.D, m.r, chunk),
                   {s.x, s.d, s.up, s.lo, s.u, s.v}, [chunk](const std::vector<Var>& v) {
                     Attrs at;
                     at.start = chunk;
                     return make_node(OpId::semiseparable_solve, {v[0], v[1], v[2], v[3], v[4], v[5]}, at);
                   }});
  }
  const Shape bs[] = {{6}, {5, 3}, {2, 4, 2}, {1}};
  for (const Shape& b : bs) {
    i64 N = b.rank() == 1 ? b[0] : b[b.rank() - 2];
    out.push_back({OpId::tridiag_solve, "b " + b.str(),
                   {randn64({N}, rng, 3.0), randn64({N - 1}, rng), randn64({N - 1}, rng), randn64(b, rng)},
                   [](const std::vector<Var>& v) { return tridiag_solve(v[0], v[1], v[2], v[3]); }});
  }
  const std::pair<i64, Shape> rs[] = {{6, Shape{}}, {5, Shape{3}}, {1, Shape{}}, {8, Shape{2}}};
  for (const auto& [N, zs] : rs) {
    Tensor z = uniform64(zs, rng, -0.5, 0.5);
    out.push_back({OpId::tridiag_resolvent_diag, fmt::format("N {} z {}", N, zs.str()),
                   {randn64({N}, rng, 2.5), randn64({N - 1}, rng, 0, 0.7), randn64({N - 1}, rng, 0, 0.7), z},
                   [](const std::vector<Var>& v) { return tridiag_resolvent_diag(v[0], v[1], v[2], v[3]); }});
  }
  const std::pair<i64, Shape> cs[] = {{6, Shape{2}}, {5, Shape{3, 2}}, {1, Shape{2}}, {8, Shape{2, 2}}};
  for (const auto& [N, zs] : cs) {
    Tensor z = uniform64(zs, rng, -0.5, 0.5);
    out.push_back({OpId::tridiag_resolvent_diag_complex, fmt::format("N {} z {}", N, zs.str()),
                   {randn64({N}, rng, 2.5), randn64({N - 1}, rng, 0, 0.7), randn64({N - 1}, rng, 0, 0.7), z},
                   [](const std::vector<Var>& v) { return tridiag_resolvent_diag_complex(v[0], v[1], v[2], v[3]); }});
  }
}

TEST_CASE("semisep::set_gpu_matvec_variant takes 0 .. 10 and names anything else") {
  const int was = semisep::set_gpu_matvec_variant(3);
  CHECK(semisep::gpu_matvec_variant() == 3);
  CHECK(semisep::set_gpu_matvec_variant(10) == 3);
  CHECK(semisep::set_gpu_matvec_variant(3) == 10);
  // 11 on are the benchmark's timing-only kernels (y not the product): never the op's
  for (int bad : {-1, 11, 12, 15})
    CHECK_THROWS_WITH_AS(semisep::set_gpu_matvec_variant(bad), doctest::Contains((std::to_string(bad) + " is not one of 0 .. 10").c_str()),
                         Error);
  CHECK(semisep::gpu_matvec_variant() == 3);  // a refused value changes nothing
  CHECK(semisep::set_gpu_matvec_variant(was) == 3);
}
}  // namespace ad::test
namespace ad::test {
TEST_CASE("semiseparable_matvec (full, CPU) with x and v both Parameters places them in the others' graph") {
  Rng rng(77);
  Parameter x(Tensor::randn({1, 6, 2}, rng, DType::f64)), u(Tensor::randn({6, 2}, rng, DType::f64)),
      v(Tensor::randn({6, 2}, rng, DType::f64));
  Tensor d = Tensor::randn({6}, rng, DType::f64), up = Tensor::randn({5}, rng, DType::f64),
         lo = Tensor::randn({5}, rng, DType::f64);
  Graph g;
  Var y = semiseparable_matvec(x, g.input(d), g.input(up), g.input(lo), u, v);  // threw: the sums node had no graph
  Graph g2;
  Var y2 = semiseparable_matvec(g2.param(x), g2.input(d), g2.input(up), g2.input(lo), g2.param(u), g2.param(v));
  CHECK(bitwise_equal(y.value(), y2.value()));
  backward(sum(y));
  CHECK(x.has_grad());
  CHECK(v.has_grad());
}
}  // namespace ad::test
namespace ad::test {
TEST_CASE("semiseparable_solve: a Woodbury result that lost its digits (T far worse conditioned than H) is an ad::Error") {
  // H = d + u v = 1 + 1e-17: perfectly conditioned, but T^-1 = 1e17 and the two Woodbury terms cancel (y was 0)
  for (DType t : {DType::f64, DType::f32}) {
    const double tiny = t == DType::f64 ? 1e-17 : 1e-9;
    Graph g;
    Var y = semiseparable_solve(g.input(Tensor::full({1, 1, 1}, 1.0, t)), g.input(Tensor::full({1}, tiny, t)),
                                g.input(Tensor::zeros({0}, t)), g.input(Tensor::zeros({0}, t)),
                                g.input(Tensor::ones({1, 1}, t)), g.input(Tensor::ones({1, 1}, t)));
    CHECK_THROWS_WITH_AS(eval(y), doctest::Contains("semiseparable_solve: the Woodbury solve lost its accuracy"), Error);
  }
  // N = 2: T = diag(1e-17, 1), u = v = e_1; H = diag(1 + 1e-17, 1) (y was (0, 1), not (1, 1))
  Graph g;
  Tensor u = Tensor::zeros({2, 1}, DType::f64);
  u.data<double>()[0] = 1;
  Tensor d = Tensor::ones({2}, DType::f64);
  d.data<double>()[0] = 1e-17;
  Var y = semiseparable_solve(g.input(Tensor::ones({1, 2, 1}, DType::f64)), g.input(d),
                              g.input(Tensor::zeros({1}, DType::f64)), g.input(Tensor::zeros({1}, DType::f64)),
                              g.input(u), g.input(u.clone()));
  CHECK_THROWS_WITH_AS(eval(y), doctest::Contains("relative residual"), Error);
  // the same H with a well-scaled split (T = H, no rank term needed: u = 0) solves
  Graph g2;
  Var y2 = semiseparable_solve(g2.input(Tensor::ones({1, 2, 1}, DType::f64)), g2.input(Tensor::ones({2}, DType::f64)),
                               g2.input(Tensor::zeros({1}, DType::f64)), g2.input(Tensor::zeros({1}, DType::f64)),
                               g2.input(Tensor::zeros({2, 1}, DType::f64)), g2.input(Tensor::zeros({2, 1}, DType::f64)));
  CHECK(eval(y2).to_vector() == std::vector<double>{1.0, 1.0});
}
}  // namespace ad::test
