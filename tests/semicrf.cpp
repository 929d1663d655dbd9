// Semi-Markov CRF: logZ, score, Viterbi, marginals and gradients against
// brute-force enumeration and a naive full-table DP (f64, 1e-10), the fast
// path against the general path, K = 1 against a linear-chain CRF, extreme
// and forbidden scores, checkpoint intervals, threads, memory, misuse.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/semicrf_cpu.hpp"
#include "semicrf_accuracy.hpp"
#include "semicrf_ref.hpp"
#include "test_util.hpp"

using namespace ad;
using namespace ad::test;
namespace ref = ad::test::crf;

namespace {


// A random model: S = cumulative sums of N(0, scale) scores.
ref::Model random_model(std::uint64_t seed, std::int64_t B, std::int64_t T, std::int64_t K, std::int64_t C,
                        bool general, std::vector<std::int64_t> L, double scale = 1.0) {
  Rng rng(seed);
  ref::Model m;
  m.B = B; m.T = T; m.K = K; m.C = C; m.general = general; m.L = std::move(L);
  std::vector<double> x = randn64({B, T, C}, rng, 0, scale).to_vector();
  m.S.assign(static_cast<std::size_t>(B * (T + 1) * C), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t c = 0; c < C; ++c)
        m.S[static_cast<std::size_t>((b * (T + 1) + t + 1) * C + c)] =
            m.S[static_cast<std::size_t>((b * (T + 1) + t) * C + c)] + x[static_cast<std::size_t>((b * T + t) * C + c)];
  m.Tr = randn64(general ? Shape{K, C, C} : Shape{C, C}, rng, 0, 0.7).to_vector();
  m.D = randn64({K, C}, rng, 0, 0.7).to_vector();
  m.P = randn64({C}, rng, 0, 0.7).to_vector();
  return m;
}

struct Inputs {
  Tensor S, Tr, D, P, L;
};
Inputs tensors(const ref::Model& m, DType t = DType::f64) {
  Inputs in;
  in.S = f64s(m.S, {m.B, m.T + 1, m.C}).to(t);
  in.Tr = f64s(m.Tr, m.general ? Shape{m.K, m.C, m.C} : Shape{m.C, m.C}).to(t);
  in.D = f64s(m.D, {m.K, m.C}).to(t);
  in.P = f64s(m.P, {m.C}).to(t);
  in.L = index(m.L, {m.B});
  return in;
}

// What the ops give: logZ, gradients of sum_b w[b] logZ[b], marginals.
struct Got {
  std::vector<double> logz, dS, dTr, dD, dP, marg;
};
Got run_ops(const ref::Model& m, const std::vector<double>& w, DType t = DType::f64) {
  Inputs in = tensors(m, t);
  PGraph g;
  Var S = g.input(in.S), Tr = g.input(in.Tr), D = g.input(in.D), P = g.input(in.P), L = g.input(in.L);
  Var z = semicrf_logz(S, Tr, D, P, L);
  Var loss = sum(mul(z, g.input(f64s(w, {m.B}).to(t))));
  std::vector<Var> gr = grad(loss, {S, Tr, D, P});
  Got r;
  r.logz = eval(z).to_vector();
  r.dS = eval(gr[0]).to_vector();
  r.dTr = eval(gr[1]).to_vector();
  r.dD = eval(gr[2]).to_vector();
  r.dP = eval(gr[3]).to_vector();
  r.marg = eval(semicrf_marginals(S, Tr, D, P, L)).to_vector();
  return r;
}

// |a - b| <= tol (1 + |b|) elementwise; equal infinities pass.
void check_close(const std::vector<double>& a, const std::vector<double>& b, double tol, const char* what) {
  REQUIRE_MESSAGE(a.size() == b.size(), what);
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    double e = std::fabs(a[i] - b[i]) / (1 + std::fabs(b[i]));
    if (!(e <= worst)) { worst = e; at = i; }
  }
  INFO(std::string(what) << ": worst relative error " << worst << " at " << at << " (" << a[at] << " vs " << b[at] << ")");
  CHECK(worst <= tol);
}
void check_against(const Got& got, const ref::Result& want, double tol) {
  check_close(got.logz, want.logz, tol, "logZ");
  check_close(got.dS, want.dS, tol, "dS");
  check_close(got.dTr, want.dTr, tol, "dTr");
  check_close(got.dD, want.dD, tol, "dD");
  check_close(got.dP, want.dP, tol, "dP");
  check_close(got.marg, want.marg, tol, "marginals");
}
std::vector<double> weights(std::int64_t B) {
  std::vector<double> w;
  for (std::int64_t b = 0; b < B; ++b) w.push_back(0.5 + 0.75 * static_cast<double>(b));
  return w;
}

// segments encoding of a list of segments
std::vector<std::int64_t> encode(const std::vector<std::vector<ref::Seg>>& segs, std::int64_t T) {
  std::vector<std::int64_t> out;
  for (const auto& s : segs) {
    std::vector<std::int64_t> r(static_cast<std::size_t>(T), -1);
    for (const auto& g : s) r[static_cast<std::size_t>(g.s)] = g.c;
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

}  // namespace

TEST_CASE("semicrf logz, gradients and marginals equal brute force") {
  struct Case { std::int64_t T, K, C; bool general; std::vector<std::int64_t> L; };
  const Case cases[] = {
      {6, 3, 2, false, {6, 4, 1}}, {6, 3, 2, true, {6, 3, 1}},  {7, 2, 3, false, {7, 5}},
      {5, 8, 2, false, {5, 2}},    {5, 8, 2, true, {5, 4}},     {6, 1, 3, false, {6, 2}},
      {5, 5, 1, false, {5, 3}},    {4, 2, 3, true, {4, 4, 2}},  {7, 7, 2, false, {7}},
  };
  std::uint64_t seed = 11;
  for (const Case& c : cases) {
    ref::Model m = random_model(seed++, static_cast<std::int64_t>(c.L.size()), c.T, c.K, c.C, c.general, c.L);
    INFO("T=" << c.T << " K=" << c.K << " C=" << c.C << (c.general ? " general" : " fast"));
    auto w = weights(m.B);
    check_against(run_ops(m, w), ref::brute(m, w), 1e-10);
  }
}

TEST_CASE("semicrf score and viterbi equal brute force, NLL >= 0") {
  for (bool general : {false, true}) {
    ref::Model m = random_model(general ? 31 : 32, 3, 7, 3, 3, general, {7, 5, 1});
    ref::Result want = ref::brute(m, weights(m.B));
    Inputs in = tensors(m);
    PGraph g;
    Var S = g.input(in.S), Tr = g.input(in.Tr), D = g.input(in.D), P = g.input(in.P), L = g.input(in.L);
    SemicrfDecode dec = semicrf_decode(S, Tr, D, P, L);
    std::vector<double> segs = eval(dec.segments).to_vector();
    std::vector<std::int64_t> expect = encode(want.argmax, m.T);
    for (std::size_t i = 0; i < expect.size(); ++i) CHECK(static_cast<std::int64_t>(segs[i]) == expect[i]);
    check_close(eval(dec.score).to_vector(), want.best, 1e-10, "viterbi score");
    // a random gold segmentation: score equals the enumerated score of the same segmentation
    std::vector<std::vector<ref::Seg>> gold(3);
    std::vector<double> gold_score(3);
    for (std::int64_t b = 0; b < m.B; ++b) {
      std::int64_t n = 0, pick = 7 + 13 * b;
      ref::enumerate(m, b, [&](const std::vector<ref::Seg>& s, double sc) {
        if (n++ == pick) { gold[static_cast<std::size_t>(b)] = s; gold_score[static_cast<std::size_t>(b)] = sc; }
      });
      if (gold[static_cast<std::size_t>(b)].empty()) {  // fewer segmentations than pick: take the last
        ref::enumerate(m, b, [&](const std::vector<ref::Seg>& s, double sc) {
          gold[static_cast<std::size_t>(b)] = s;
          gold_score[static_cast<std::size_t>(b)] = sc;
        });
      }
    }
    Var sc = semicrf_score(S, Tr, D, P, L, g.input(index(encode(gold, m.T), {m.B, m.T})));
    check_close(eval(sc).to_vector(), gold_score, 1e-10, "score");
    std::vector<double> nll = eval(sub(semicrf_logz(S, Tr, D, P, L), sc)).to_vector();
    for (double v : nll) CHECK(v >= 0);
  }
}

TEST_CASE("semicrf checkpoint intervals: several intervals and T < I, against the full-table DP") {
  struct Case { std::int64_t T, K, C; bool general; std::vector<std::int64_t> L; };
  const Case cases[] = {
      {120, 3, 3, false, {120, 97, 48, 24, 23, 1}},  // I = 18: 7 intervals for the longest
      {90, 7, 5, false, {90, 64}},                   // I = 25
      {60, 4, 3, true, {60, 33}},                    // I = 15, general path
      {12, 20, 3, false, {12, 7}},                   // K > T: T < I, one interval
      {12, 20, 2, true, {12, 11}},
      {40, 40, 2, false, {40, 39}},                  // K = T
  };
  std::uint64_t seed = 41;
  for (const Case& c : cases) {
    INFO("T=" << c.T << " K=" << c.K << " C=" << c.C << (c.general ? " general" : " fast"));
    std::int64_t I = semicrf::interval(c.T, std::min(c.K, c.T));
    INFO("I=" << I << " checkpoints=" << semicrf::checkpoints(c.T, I));
    ref::Model m = random_model(seed++, static_cast<std::int64_t>(c.L.size()), c.T, c.K, c.C, c.general, c.L, 0.5);
    auto w = weights(m.B);
    check_against(run_ops(m, w), ref::naive(m, w), 1e-10);
  }
  CHECK(semicrf::interval(120, 3) == 18);
  CHECK(semicrf::checkpoints(120, 18) == 6);
  CHECK(semicrf::interval(12, 12) == 12);
  CHECK(semicrf::checkpoints(12, 13) == 0);
}

TEST_CASE("semicrf fast path equals the general path with Tr broadcast over k") {
  ref::Model m = random_model(51, 3, 30, 6, 4, false, {30, 17, 6}, 0.6);
  ref::Model mg = m;
  mg.general = true;
  mg.Tr.clear();
  for (std::int64_t k = 0; k < m.K; ++k) mg.Tr.insert(mg.Tr.end(), m.Tr.begin(), m.Tr.end());
  auto w = weights(m.B);
  Got a = run_ops(m, w), b = run_ops(mg, w);
  check_close(a.logz, b.logz, 1e-12, "logZ");
  check_close(a.dS, b.dS, 1e-12, "dS");
  check_close(a.dD, b.dD, 1e-12, "dD");
  check_close(a.dP, b.dP, 1e-12, "dP");
  check_close(a.marg, b.marg, 1e-12, "marginals");
  std::vector<double> summed(a.dTr.size(), 0.0);  // dTr of the fast path = sum over k of the general one
  for (std::size_t i = 0; i < b.dTr.size(); ++i) summed[i % summed.size()] += b.dTr[i];
  check_close(a.dTr, summed, 1e-12, "dTr");
}

TEST_CASE("semicrf with K = 1 is a linear-chain CRF") {
  ref::Model m = random_model(61, 2, 25, 1, 4, false, {25, 9});
  std::vector<double> z = run_ops(m, weights(m.B)).logz;
  for (std::int64_t b = 0; b < m.B; ++b) {
    // emissions e[t,c] = S[t+1,c] - S[t,c] + D[0,c]; α_0 = P + e_0; α_t = e_t + lse_c' (α_{t-1,c'} + Tr[c',c])
    std::int64_t L = m.L[static_cast<std::size_t>(b)];
    std::vector<double> al(static_cast<std::size_t>(m.C));
    for (std::int64_t c = 0; c < m.C; ++c)
      al[static_cast<std::size_t>(c)] = m.P[static_cast<std::size_t>(c)] + m.s(b, 1, c) - m.s(b, 0, c) + m.d(1, c);
    for (std::int64_t t = 1; t < L; ++t) {
      std::vector<double> nx(static_cast<std::size_t>(m.C));
      for (std::int64_t c = 0; c < m.C; ++c) {
        std::vector<double> v;
        for (std::int64_t cp = 0; cp < m.C; ++cp) v.push_back(al[static_cast<std::size_t>(cp)] + m.tr(1, cp, c));
        nx[static_cast<std::size_t>(c)] = ref::lse(v) + m.s(b, t + 1, c) - m.s(b, t, c) + m.d(1, c);
      }
      al = nx;
    }
    double want = ref::lse(al);
    CHECK(std::fabs(z[static_cast<std::size_t>(b)] - want) <= 1e-10 * (1 + std::fabs(want)));
  }
}

TEST_CASE("semicrf with scores of +-1e4 and forbidden (-inf) scores") {
  // large scores: S steps of N(0, 1e4)
  ref::Model m = random_model(71, 2, 6, 3, 3, false, {6, 4}, 1e4);
  for (double& v : m.Tr) v *= 1e4;
  for (double& v : m.D) v *= 1e4;
  auto w = weights(m.B);
  Got got = run_ops(m, w);
  {
    INFO("scores of 1e4");
    check_against(got, ref::brute(m, w), 1e-10);
  }
  // forbidden transitions and durations
  const double ninf = -std::numeric_limits<double>::infinity();
  for (bool general : {false, true}) {
    ref::Model f = random_model(general ? 72 : 73, 2, 7, 3, 3, general, {7, 5});
    f.Tr[1] = ninf;                   // 0 -> 1 (k = 1 in the general path)
    f.Tr[static_cast<std::size_t>(f.C * f.C - 1)] = ninf;
    f.Tr[static_cast<std::size_t>(f.C)] = ninf;  // 1 -> 0
    f.D[static_cast<std::size_t>(1 * f.C + 2)] = ninf;  // label 2 never lasts 2
    f.P[0] = ninf;                     // label 0 never starts
    INFO("forbidden, general = " << general);
    Got gf = run_ops(f, w);
    for (double v : gf.dS) REQUIRE(std::isfinite(v));
    check_against(gf, ref::brute(f, w), 1e-10);
  }
  // a sequence with no allowed segmentation: logZ = -inf, zero gradients and marginals
  ref::Model n = random_model(74, 2, 5, 2, 2, false, {5, 4});
  for (double& v : n.P) v = ninf;
  Got gn = run_ops(n, w);
  for (double v : gn.logz) CHECK(v == ninf);
  for (const auto* vec : {&gn.dS, &gn.dTr, &gn.dD, &gn.dP, &gn.marg})
    for (double v : *vec) CHECK(v == 0.0);
  // only sequence 1 has none: only it is -inf, sequence 0 matches brute force
  ref::Model h = random_model(75, 2, 6, 2, 2, false, {6, 1});
  h.D[0] = ninf;
  h.D[1] = ninf;  // no segment of length 1: L = 1 is impossible
  Got gh = run_ops(h, w);
  CHECK(gh.logz[1] == ninf);
  check_against(gh, ref::brute(h, w), 1e-10);
}

TEST_CASE("semicrf f32 agrees with f64") {
  ref::Model m = random_model(81, 2, 300, 40, 5, false, {300, 211}, 1.0);
  auto w = weights(m.B);
  Got a = run_ops(m, w, DType::f64), b = run_ops(m, w, DType::f32);
  check_close(b.logz, a.logz, 1e-5, "logZ f32");
  check_close(b.marg, a.marg, 1e-4, "marginals f32");
  check_close(b.dD, a.dD, 1e-4, "dD f32");
  check_close(b.dTr, a.dTr, 1e-4, "dTr f32");
}

TEST_CASE("semicrf f32 marginals and score gradients stay accurate at large K (hi + lo rings)") {
  check_semicrf_f32_large_k(Device::cpu());  // tests/semicrf_accuracy.hpp
}

TEST_CASE("semicrf: a huge finite mask (-1e9, -FLT_MAX) gives what -inf gives") {
  // Users forbid with huge finite values too. A lap of the fast path's rings
  // started at such a value (α near -1e9 where only masked segments end) and
  // stored the next values as +1e9 relative to it: f32 marginals in
  // [-4.3, 6.5] with every odd length masked, -0.025 with P and Tr masked;
  // f64 marginals off by 0.83 with -1e15. The lap's base now moves up
  // (semicrf::lap_base). Two f32 masks of -FLT_MAX stacked on one value gave
  // NaN (its hi was -inf, its lo +inf). Reference: the same model with -inf,
  // in f64. (A sequence with no unmasked segmentation is another matter: a
  // finite mask gives it a finite logZ, -inf gives -inf.)
  const std::int64_t T = 4000, K = 51, C = 3;
  Rng rng(151);
  Tensor x = randn64({1, T, C}, rng, 0, 1.0).to(DType::f32).to(DType::f64);
  Tensor Tr0 = randn64({C, C}, rng, 0, 0.7), D0 = randn64({K, C}, rng, 0, 0.7), P0 = randn64({C}, rng, 0, 0.7);
  struct Out { std::vector<double> marg, dx, dTr, dD, dP; };
  auto run = [&](int mode, double v, DType t) {
    Tensor Tr = Tr0.to(DType::f64), D = D0.to(DType::f64), P = P0.to(DType::f64);
    if (mode == 0)  // odd lengths forbidden
      for (std::int64_t k = 1; k <= K; k += 2)
        for (std::int64_t j = 0; j < C; ++j) D.data<double>()[(k - 1) * C + j] = v;
    else if (mode == 1) {  // label 0 never starts, 0 -> 1 and 1 -> 0 forbidden
      P.data<double>()[0] = v;
      Tr.data<double>()[1] = v;
      Tr.data<double>()[C] = v;
    } else {  // masks stacked (-FLT_MAX twice is -inf in f32): only label 2 starts, no length 1, no 2 -> 2,
      P.data<double>()[0] = v;  // so A[1, 2] = 2 v
      P.data<double>()[1] = v;
      for (std::int64_t j = 0; j < C; ++j) D.data<double>()[j] = v;
      Tr.data<double>()[2 * C + 2] = v;
    }
    Graph g;
    Var xv = g.input(x.to(t)), trv = g.input(Tr.to(t)), dv = g.input(D.to(t)), pv = g.input(P.to(t));
    Var S = semicrf_cumulative(xv), L = g.input(index({T}, {1}));
    std::vector<Var> gr = grad(sum(semicrf_logz(S, trv, dv, pv, L)), {xv, trv, dv, pv});
    return Out{eval(semicrf_marginals(S, trv, dv, pv, L)).to_vector(), eval(gr[0]).to_vector(), eval(gr[1]).to_vector(),
               eval(gr[2]).to_vector(), eval(gr[3]).to_vector()};
  };
  for (int mode = 0; mode < 3; ++mode) {
    const Out want = run(mode, -std::numeric_limits<double>::infinity(), DType::f64);
    for (DType t : {DType::f32, DType::f64})
      for (double v : {-1e9, t == DType::f32 ? -3.4e38 : -1e15, t == DType::f32 ? -1e4 : -1e300}) {
        INFO("mode " << mode << ", " << (t == DType::f32 ? "f32" : "f64") << ", mask " << v);
        const Out got = run(mode, v, t);
        const double tol = t == DType::f32 ? 5e-5 : 1e-9;
        check_close(got.marg, want.marg, tol, "marginals");
        check_close(got.dx, want.dx, tol, "d scores");
        check_close(got.dTr, want.dTr, tol, "dTr");
        check_close(got.dD, want.dD, tol, "dD");
        check_close(got.dP, want.dP, tol, "dP");
      }
  }
}

TEST_CASE("semicrf results do not depend on the thread count") {
  // B = 3: sequences in parallel lanes; B = 1 and 2 with Ke·C >= 16384: labels split over a team per lane
  for (int variant = 0; variant < 4; ++variant) {
    ref::Model m = variant == 0   ? random_model(91, 3, 200, 60, 7, false, {200, 133, 5}, 1.0)
                   : variant == 1 ? random_model(92, 3, 40, 6, 3, true, {40, 33, 5})
                   : variant == 2 ? random_model(93, 1, 300, 260, 64, false, {300}, 0.3)
                                  : random_model(94, 2, 260, 260, 64, false, {260, 157}, 0.3);
    INFO("variant " << variant);
    for (DType t : {DType::f32, DType::f64}) {
      Inputs in = tensors(m, t);
      semicrf::Args a;
      a.d = {m.B, m.T, m.K, m.C, m.general, dtype_size(t)};
      a.dtype = t;
      a.S = in.S.raw(); a.Tr = in.Tr.raw(); a.D = in.D.raw(); a.P = in.P.raw();
      a.L = in.L.data<std::int64_t>();
      a.force_team = true;
      Tensor dz = f64s(weights(m.B), {m.B}).to(t);
      std::int64_t n = in.S.numel() + in.Tr.numel() + in.D.numel() + in.P.numel();
      std::vector<Tensor> outs, margs;
      for (int threads : {1, 2, 4}) {
        Tensor ws = Tensor::empty({semicrf::workspace_bytes(a.d, semicrf::Pass::backward, threads)}, DType::i64);
        Tensor out = Tensor::full({n}, NAN, t);
        semicrf::logz_backward_cpu(a, dz.raw(), out.raw(), ws.raw(), threads);
        outs.push_back(out);
        Tensor wm = Tensor::empty({semicrf::workspace_bytes(a.d, semicrf::Pass::marginals, threads)}, DType::i64);
        Tensor mg = Tensor::full({m.B, m.T, m.C}, NAN, t);
        semicrf::marginals_cpu(a, mg.raw(), wm.raw(), threads);
        margs.push_back(mg);
      }
      if (variant >= 2) CHECK(semicrf::detail::make_layout(a.d, semicrf::Pass::backward, 4).team > 1);
      for (std::size_t i = 1; i < outs.size(); ++i) {
        CHECK(bitwise_equal(outs[0], outs[i]));
        CHECK(bitwise_equal(margs[0], margs[i]));
      }
    }
  }
}

TEST_CASE("semicrf working memory: the bound, and the allocator measures the workspace") {
  for (const auto& tkc : {std::array<std::int64_t, 3>{400000, 3000, 24}, {100000, 1000, 16}, {10000, 100, 24},
                          {50, 200, 3}, {1000, 1000, 4}, {7, 3, 2}}) {
    const std::int64_t T = tkc[0], K = tkc[1], C = tkc[2];
    semicrf::Dims d{1, T, K, C, false, 4};
    double bound = 2 * std::sqrt(static_cast<double>(T) * static_cast<double>(std::min(K, T))) * static_cast<double>(C) +
                   static_cast<double>(std::min(K, T) * C);
    INFO("T=" << T << " K=" << K << " C=" << C);
    // an f32 ring slot is hi (f32) + lo (bf16): the bound holds in slots, 1.5 f32 elements each
    CHECK(static_cast<double>(semicrf::sequence_values(d)) <= 1.5 * (bound + static_cast<double>(C)));
    semicrf::Dims d64{1, T, K, C, false, 8};
    CHECK(static_cast<double>(semicrf::sequence_values(d64)) <= bound + static_cast<double>(C));
  }
  // the backward node's workspace is counted by the graph's allocator: measured peak == predicted
  ref::Model m = random_model(101, 1, 500, 30, 4, false, {500});
  Inputs in = tensors(m, DType::f32);
  Graph g;
  Var S = g.input(in.S), Tr = g.input(in.Tr), D = g.input(in.D), P = g.input(in.P), L = g.input(in.L);
  Var z = semicrf_logz(S, Tr, D, P, L);
  Var loss = sum(z);
  std::vector<Var> gr = grad(loss, {S, D});
  std::int64_t before = g.impl().alloc->live_bytes();
  g.impl().alloc->reset_peak();
  eval(gr[1]);
  std::int64_t ws = semicrf::workspace_bytes({1, 500, 30, 4, false, 4}, semicrf::Pass::backward, semicrf::default_threads());
  std::int64_t grads = static_cast<std::int64_t>((in.S.numel() + in.Tr.numel() + in.D.numel() + in.P.numel()) * 4);
  CHECK(g.impl().alloc->peak_bytes() - before >= ws + grads);
  CHECK(g.impl().alloc->peak_bytes() - before <= ws + grads + 64 + 2 * static_cast<std::int64_t>(sizeof(float)));
}

TEST_CASE("semicrf_cumulative: values and the NLL it leaves unchanged") {
  Rng rng(111);
  Tensor x = randn64({2, 5, 3}, rng, 4.0, 1.0);
  Graph g;
  Var S = semicrf_cumulative(g.input(x));
  CHECK(S.shape() == Shape{2, 6, 3});
  std::vector<double> s = eval(S).to_vector(), xv = x.to_vector();
  for (std::int64_t b = 0; b < 2; ++b) {
    double mean = 0;
    for (std::int64_t i = 0; i < 15; ++i) mean += xv[static_cast<std::size_t>(b * 15 + i)];
    mean /= 15;
    for (std::int64_t c = 0; c < 3; ++c) {
      double acc = 0;
      CHECK(s[static_cast<std::size_t>(b * 18 + c)] == 0.0);
      for (std::int64_t t = 0; t < 5; ++t) {
        acc += xv[static_cast<std::size_t>(b * 15 + t * 3 + c)] - mean;
        CHECK(std::fabs(s[static_cast<std::size_t>(b * 18 + (t + 1) * 3 + c)] - acc) < 1e-12);
      }
    }
  }
}

TEST_CASE("semicrf gradients do not depend on how many nodes the graph held before (its node storage moves)") {
  // the backward rule hands out parts of one buffer; it once kept a reference to an input's shape across
  // adding a part, which read freed memory when that node moved the graph's storage (ASan caught it)
  Rng rng(1);
  Parameter x(randn64({2, 6, 3}, rng)), tr(randn64({3, 3}, rng)), d(randn64({2, 3}, rng)), p(randn64({3}, rng));
  std::vector<std::vector<double>> first;
  for (int pad = 0; pad < 140; ++pad) {
    for (Parameter* q : {&x, &tr, &d, &p}) q->zero_grad();
    Graph g;
    for (int i = 0; i < pad; ++i) (void)g.input(Tensor::zeros({1}));
    Var L = g.input(index({6, 4}, {2}));
    backward(sum(semicrf_logz(semicrf_cumulative(g.param(x)), tr, d, p, L)));
    std::vector<std::vector<double>> got{x.grad().to_vector(), tr.grad().to_vector(), d.grad().to_vector(),
                                         p.grad().to_vector()};
    if (pad == 0) first = got;
    REQUIRE(got == first);
  }
}

TEST_CASE("semicrf_cumulative with lengths: padding is not read, and f32 keeps its accuracy in padded batches") {
  Rng rng(112);
  // values: the mean over t < L[b], S flat from row L[b] on, padding (here NaN) never read
  Tensor x = randn64({2, 5, 3}, rng, 2.0, 1.0);
  std::vector<double> xv = x.to_vector();
  for (std::int64_t t = 3; t < 5; ++t)
    for (std::int64_t c = 0; c < 3; ++c) x.data<double>()[15 + t * 3 + c] = std::nan("");  // b = 1 past L = 3
  Graph g;
  Var S = semicrf_cumulative(g.input(x), g.input(index({5, 3}, {2})));
  std::vector<double> s = eval(S).to_vector();
  const std::int64_t Ls[] = {5, 3};
  for (std::int64_t b = 0; b < 2; ++b) {
    const std::int64_t n = Ls[b];
    double mean = 0;
    for (std::int64_t i = 0; i < n * 3; ++i) mean += xv[static_cast<std::size_t>(b * 15 + i)];
    mean /= static_cast<double>(n * 3);
    for (std::int64_t c = 0; c < 3; ++c) {
      double acc = 0;
      for (std::int64_t t = 0; t < 5; ++t) {
        if (t < n) acc += xv[static_cast<std::size_t>(b * 15 + t * 3 + c)] - mean;
        CHECK(std::fabs(s[static_cast<std::size_t>(b * 18 + (t + 1) * 3 + c)] - acc) < 1e-12);
      }
    }
  }
  EXPECT_ERROR(eval(semicrf_cumulative(g.input(x), g.input(index({5, 6}, {2})))), "semicrf_cumulative",
               "L[1] = 6 is outside 1..T = 1..5");
  EXPECT_ERROR(semicrf_cumulative(g.input(x), g.input(index({5}, {1}))), "semicrf_cumulative", "L must be i64 (B)",
               "B = 2");
  EXPECT_ERROR(semicrf_cumulative(g.input(x), g.input(randn64({2}, rng))), "semicrf_cumulative", "L must be i64");

  // a padded batch: the second sequence's real part, alone and padded with large scores, gives the same NLL and
  // marginals; in f32 the marginals stay near f64's (the padding used to move the shift; 0.73 off at -1e4)
  const std::int64_t T = 2000, L = 1000, K = 20, C = 4;
  Tensor real = randn64({1, L, C}, rng, 0.0, 1.0);
  Tensor padded = Tensor::full({2, T, C}, -1e4, DType::f64);
  for (std::int64_t i = 0; i < L * C; ++i) {
    padded.data<double>()[i] = real.data<double>()[i];          // b = 0: real part, padding after L
    padded.data<double>()[T * C + i] = real.data<double>()[i];  // b = 1: the same, its own length L too
  }
  Tensor tr = randn64({C, C}, rng, 0, 0.5), d = randn64({K, C}, rng, 0, 0.5), p = randn64({C}, rng, 0, 0.5);
  auto marginals = [&](const Tensor& sc, std::vector<std::int64_t> lens, DType dt) {
    Graph h;
    Var cum = semicrf_cumulative(h.input(sc.to(dt)), h.input(index(lens, {static_cast<std::int64_t>(lens.size())})));
    return eval(semicrf_marginals(cum, h.input(tr.to(dt)), h.input(d.to(dt)), h.input(p.to(dt)),
                                  h.input(index(lens, {static_cast<std::int64_t>(lens.size())}))))
        .to(DType::f64)
        .to_vector();
  };
  std::vector<double> alone = marginals(real, {L}, DType::f64), m64 = marginals(padded, {L, L}, DType::f64),
                      m32 = marginals(padded, {L, L}, DType::f32);
  double err64 = 0, err32 = 0;
  for (std::int64_t i = 0; i < L * C; ++i) {
    const auto u = static_cast<std::size_t>(i);
    err64 = std::max(err64, std::fabs(m64[u] - alone[u]));
    err32 = std::max(err32, std::fabs(m32[u] - alone[u]));
  }
  CHECK(err64 < 1e-10);
  CHECK(err32 < 2e-5);
}

TEST_CASE("semicrf misuse") {
  Graph g;
  Rng rng(121);
  auto in = [&](const Shape& s, DType t = DType::f32) { return g.input(Tensor::randn(s, rng, t)); };
  Var S = in({2, 6, 3}), Tr = in({3, 3}), D = in({4, 3}), P = in({3});
  Var L = g.input(index({5, 3}, {2}));
  EXPECT_ERROR(semicrf_logz(in({2, 6}), Tr, D, P, L), "semicrf_logz", "S must be (B, T+1, C)", "f32[2,6]");
  EXPECT_ERROR(semicrf_logz(in({2, 1, 3}), Tr, D, P, L), "semicrf_logz", "T >= 1");
  EXPECT_ERROR(semicrf_logz(S, in({3, 4}), D, P, L), "semicrf_logz", "Tr must be (C, C) or (K, C, C)", "Tr f32[3,4]");
  EXPECT_ERROR(semicrf_logz(S, in({5, 3, 3}), D, P, L), "semicrf_logz", "Tr must be", "K = 4");
  EXPECT_ERROR(semicrf_logz(S, Tr, in({4, 2}), P, L), "semicrf_logz", "D must be (K, C)", "D f32[4,2]");
  EXPECT_ERROR(semicrf_logz(S, Tr, in({0, 3}), P, L), "semicrf_logz", "K >= 1", "D f32[0,3]");
  EXPECT_ERROR(semicrf_logz(S, Tr, D, in({2}), L), "semicrf_logz", "P must be (C)", "P f32[2]");
  EXPECT_ERROR(semicrf_logz(S, Tr, D, P, g.input(index({5, 3, 1}, {3}))), "semicrf_logz", "L must be (B)", "L i64[3]");
  EXPECT_ERROR(semicrf_logz(S, Tr, D, P, in({2})), "semicrf_logz", "L must be i64");
  EXPECT_ERROR(semicrf_logz(S, in({3, 3}, DType::f64), D, P, L), "semicrf_logz", "one dtype");
  EXPECT_ERROR(semicrf_score(S, Tr, D, P, L, g.input(index({0, 1}, {2, 1}))), "semicrf_score", "segments must be (B, T)");
  EXPECT_ERROR(semicrf_cumulative(in({2, 3})), "semicrf_cumulative", "scores must be (B, T, C)");
  // data-dependent: lengths and segments, at run time
  EXPECT_ERROR(eval(semicrf_logz(S, Tr, D, P, g.input(index({6, 3}, {2})))), "semicrf_logz", "L[0] = 6", "1..5");
  EXPECT_ERROR(eval(semicrf_logz(S, Tr, D, P, g.input(index({2, 0}, {2})))), "semicrf_logz", "L[1] = 0");
  EXPECT_ERROR(eval(semicrf_marginals(S, Tr, D, P, g.input(index({2, -1}, {2})))), "semicrf_marginals", "L[1] = -1");
  EXPECT_ERROR(eval(semicrf_viterbi(S, Tr, D, P, g.input(index({9, 1}, {2})))), "semicrf_viterbi", "L[0] = 9");
  auto seg = [&](std::vector<std::int64_t> v) { return g.input(index(std::move(v), {2, 5})); };
  CHECK(std::isfinite(eval(semicrf_score(S, Tr, D, P, L, seg({0, -1, 2, -1, -1, 1, -1, 0, -1, -1}))).to_vector()[0]));
  EXPECT_ERROR(eval(semicrf_score(S, Tr, D, P, L, seg({-1, -1, 2, -1, -1, 1, -1, 0, -1, -1}))), "semicrf_score",
                   "segments[0, 0] = -1", "gap");
  EXPECT_ERROR(eval(semicrf_score(S, Tr, D, P, L, seg({0, -1, 3, -1, -1, 1, -1, 0, -1, -1}))), "semicrf_score",
                   "segments[0, 2] = 3", "0..2");
  EXPECT_ERROR(eval(semicrf_score(S, Tr, D, P, L, seg({0, -1, -2, -1, -1, 1, -1, 0, -1, -1}))), "semicrf_score",
                   "segments[0, 2] = -2");
  EXPECT_ERROR(eval(semicrf_score(S, Tr, D, P, L, seg({0, -1, 2, -1, -1, 1, -1, 0, 1, -1}))), "semicrf_score",
                   "segments[1, 3] = 1", "beyond L[1] = 3");
  Var D2 = in({2, 3});  // K = 2
  EXPECT_ERROR(eval(semicrf_score(S, Tr, D2, P, L, seg({0, -1, -1, 1, -1, 1, -1, 0, -1, -1}))), "semicrf_score",
                   "segments[0]", "length 3 > K = 2");
  EXPECT_ERROR(eval(semicrf_score(S, Tr, D2, P, L, seg({0, -1, 1, -1, 0, 1, -1, -1, -1, -1}))), "semicrf_score",
                   "segments[1]", "length 3 > K = 2");
  // gradient of the score validates too
  Var sc = semicrf_score(S, Tr, D2, P, L, seg({0, -1, -1, 1, -1, 1, -1, 0, -1, -1}));
  EXPECT_ERROR(eval(grad(sum(sc), {S})[0]), "semicrf_score", "K = 2");
  // viterbi of a sequence with no allowed segmentation
  Var Pinf = g.input(Tensor::full({3}, -INFINITY, DType::f32));
  EXPECT_ERROR(eval(semicrf_viterbi(S, Tr, D, Pinf, L)), "semicrf_viterbi", "sequence 0", "no allowed segmentation");
}

// ---- gradcheck cases (tests/gradcheck.cpp runs them) ----
namespace ad::test {
void semicrf_gradcheck_cases(std::vector<GradCase>& out, Rng& rng) {
  struct C { std::int64_t B, T, K, C; bool general; std::vector<std::int64_t> L; };
  const C cs[] = {{2, 5, 3, 2, false, {5, 3}}, {1, 6, 2, 3, true, {6}}, {3, 4, 6, 2, false, {4, 2, 1}},
                  {2, 9, 3, 2, false, {9, 7}}};
  for (const C& c : cs) {
    Shape tr = c.general ? Shape{c.K, c.C, c.C} : Shape{c.C, c.C};
    std::vector<Tensor> in = {randn64({c.B, c.T + 1, c.C}, rng), randn64(tr, rng, 0, 0.5), randn64({c.K, c.C}, rng, 0, 0.5),
                              randn64({c.C}, rng, 0, 0.5), index(c.L, {c.B})};
    std::string label = fmt::format("B={} T={} K={} C={}{}", c.B, c.T, c.K, c.C, c.general ? " Tr (K,C,C)" : "");
    out.push_back({OpId::semicrf_logz, label, in,
                   [](const std::vector<Var>& v) { return semicrf_logz(v[0], v[1], v[2], v[3], v[4]); }});
    // score of a fixed segmentation: segments of length min(2, K) cycling labels
    std::vector<std::int64_t> seg;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t t = 0; t < c.T; ++t)
        seg.push_back(t < c.L[static_cast<std::size_t>(b)] && t % std::min<std::int64_t>(2, c.K) == 0 ? (t / 2) % c.C : -1);
    std::vector<Tensor> in2 = in;
    in2.push_back(index(seg, {c.B, c.T}));
    out.push_back({OpId::semicrf_score, label, in2,
                   [](const std::vector<Var>& v) { return semicrf_score(v[0], v[1], v[2], v[3], v[4], v[5]); }});
  }
  for (const Shape& s : {Shape{2, 5, 3}, Shape{1, 7, 2}, Shape{3, 2, 4}})
    out.push_back({OpId::semicrf_cumulative, s.str(), {randn64(s, rng)},
                   [](const std::vector<Var>& v) { return semicrf_cumulative(v[0]); }});
  // with lengths: the padding's gradient is 0, the mean is over the real positions
  out.push_back({OpId::semicrf_cumulative, "[2,5,3] L {5, 2}", {randn64({2, 5, 3}, rng), index({5, 2}, {2})},
                 [](const std::vector<Var>& v) { return semicrf_cumulative(v[0], v[1]); }});
  out.push_back({OpId::semicrf_cumulative, "[3,4,2] L {1, 4, 3}", {randn64({3, 4, 2}, rng), index({1, 4, 3}, {3})},
                 [](const std::vector<Var>& v) { return semicrf_cumulative(v[0], v[1]); }});
}
}  // namespace ad::test

namespace ad::test {
// NaN or +inf in S, Tr, D or P reached the kernels: a NaN was taken as -inf
// in some places and ignored in others (a finite logZ, a Viterbi answer next
// to a logZ of -inf), +inf gave a NaN logZ. Now an ad::Error names the element.
TEST_CASE("semicrf: NaN and +inf scores are an ad::Error naming the element; -inf still forbids") {
  auto run = [](int which, double v, int op) {
    Tensor S = Tensor::full({2, 5, 3}, 0.1, DType::f64), Tr = Tensor::full({3, 3}, 0.1, DType::f64),
           D = Tensor::full({2, 3}, 0.1, DType::f64), P = Tensor::full({3}, 0.1, DType::f64);
    const std::int64_t lv[2] = {4, 3};
    Tensor L = Tensor::from(std::span<const std::int64_t>(lv, 2), {2});
    Tensor* t[] = {&S, &Tr, &D, &P};
    t[which]->data<double>()[which == 0 ? 4 : 0] = v;  // S[0, 1, 1], else Tr[0, 0] / D[0, 0] / P[0]
    Graph g;
    Var s = g.input(S), tr = g.input(Tr), d = g.input(D), p = g.input(P), l = g.input(L);
    if (op == 0) return eval(semicrf_logz(s, tr, d, p, l));
    if (op == 1) return eval(semicrf_viterbi(s, tr, d, p, l));
    if (op == 2) return eval(semicrf_marginals(s, tr, d, p, l));
    return eval(grad(sum(semicrf_logz(s, tr, d, p, l)), {p})[0]);
  };
  const char* names[] = {"S[0, 1, 1]", "Tr[0, 0]", "D[0, 0]", "P[0]"};
  for (int which = 0; which < 4; ++which)
    for (double v : {std::nan(""), std::numeric_limits<double>::infinity()})
      for (int op = 0; op < 4; ++op) {
        INFO(names[which] << " = " << v << ", op " << op);
        CHECK_THROWS_WITH_AS(run(which, v, op), doctest::Contains(names[which]), Error);
      }
  for (int which = 1; which < 4; ++which) {  // -inf forbids: a finite logZ while some segmentation remains
    const std::vector<double> z = run(which, -std::numeric_limits<double>::infinity(), 0).to_vector();
    CHECK(std::isfinite(z[0]));
    CHECK(std::isfinite(z[1]));
  }
  CHECK_THROWS_WITH_AS(run(0, -std::numeric_limits<double>::infinity(), 0), doctest::Contains("is not finite"), Error);
}
}  // namespace ad::test
