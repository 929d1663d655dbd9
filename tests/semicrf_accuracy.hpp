#pragma once
// The semi-CRF's f32 accuracy at large K, shared by the CPU test
// (tests/semicrf.cpp) and the GPU one (tests/cuda.cpp): f32 on `dev` against
// f64 on the CPU, on the same f32-rounded inputs. The marginals and the
// gradient w.r.t. the raw scores are running sums over the whole sequence of
// per-position differences; with f32 ring values rounded at the lap's growth
// (hundreds of nats) they drifted: 3e-3 (values outside [0, 1]) at
// T = K = 300 with scores of scale 3, 2e-2 at T = 20,000, K = 1,000 (the
// rings keep each slot's rounding error as a bf16 low part since). The third
// case allows even segment lengths only (-inf in D): α and β are -inf at
// every other position, so some laps of the rings start at -inf; a lap's
// base is its first finite value (taking the lap's first value kept a stale
// base there: 3e-3, values outside [0, 1]).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ad/ad.hpp"
#include "test_util.hpp"

namespace ad::test {

inline void check_semicrf_f32_large_k(const Device& dev) {
  struct Case {
    std::int64_t T, K, C;
    double scale;
    bool even;
  };
  for (const Case& c : {Case{300, 300, 3, 3.0, false}, Case{20000, 1000, 8, 1.0, false}, Case{60000, 51, 3, 1.0, true}}) {
    INFO("T=" << c.T << " K=" << c.K << " C=" << c.C << " scale " << c.scale << " even lengths " << c.even);
    Rng rng(141);
    Tensor x = randn64({1, c.T, c.C}, rng, 0, c.scale).to(DType::f32);
    Tensor Tr = randn64({c.C, c.C}, rng, 0, 0.7).to(DType::f32), D = randn64({c.K, c.C}, rng, 0, 0.7).to(DType::f32),
           P = randn64({c.C}, rng, 0, 0.7).to(DType::f32);
    if (c.even)
      for (std::int64_t k = 1; k <= c.K; k += 2)
        for (std::int64_t j = 0; j < c.C; ++j) D.data<float>()[(k - 1) * c.C + j] = -INFINITY;
    std::vector<double> marg[2], dx[2];
    for (int i = 0; i < 2; ++i) {  // 0: f32 on dev, 1: f64 on the CPU
      const DType t = i ? DType::f64 : DType::f32;
      const Device on = i ? Device::cpu() : dev;
      Graph g;
      Var xv = g.input(x.to(t).to(on));
      Var S = semicrf_cumulative(xv);
      Var L = g.input(index({c.T}, {1}).to(on));
      std::vector<Var> in{g.input(Tr.to(t).to(on)), g.input(D.to(t).to(on)), g.input(P.to(t).to(on))};
      marg[i] = eval(semicrf_marginals(S, in[0], in[1], in[2], L)).to(Device::cpu()).to_vector();
      dx[i] = eval(grad(sum(semicrf_logz(S, in[0], in[1], in[2], L)), {xv})[0]).to(Device::cpu()).to_vector();
    }
    double em = 0, eg = 0, lo = 1, hi = 0;
    for (std::size_t j = 0; j < marg[0].size(); ++j) {
      em = std::max(em, std::fabs(marg[0][j] - marg[1][j]));
      eg = std::max(eg, std::fabs(dx[0][j] - dx[1][j]));
      lo = std::min(lo, marg[0][j]);
      hi = std::max(hi, marg[0][j]);
    }
    CHECK(em <= 5e-5);
    CHECK(eg <= 5e-5);
    CHECK(lo >= -1e-6);
    CHECK(hi <= 1 + 1e-6);
  }
}

}  // namespace ad::test
