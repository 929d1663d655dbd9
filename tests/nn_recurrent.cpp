// Recurrent layers (RNN, GRU, LSTM; cells and multi-layer sequences) against
// a plain-loop reference in double: forward values, every gradient against
// central differences of the reference, names and layouts, bad input, and
// backpropagation through time under the rematerialisation policies. Also
// the autodiff assembly of slice gradients the sequences rely on.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ad/ad.hpp"

namespace {

using ad::DType;
using ad::Shape;
using ad::Tensor;
namespace nn = ad::nn;

// One training step's backward of mean(layer(x).output) under a policy, in a fresh graph.
template <class Layer> ad::Report step_under(Layer& layer, const Tensor& x, const ad::Policy& p) {
  ad::Graph g;
  return ad::backward(ad::mean(layer(g.input(x)).output), p);
}

// ---- the reference: plain loops over std::vector<double> ----
struct RefLayer {
  std::vector<double> wih, whh, bih, bhh;  // [G H, in], [G H, H], [G H], [G H]; biases empty: none
};
struct RefModel {
  nn::CellKind kind;
  std::int64_t in = 0, H = 0;
  bool relu = false, bidirectional = false;
  std::vector<RefLayer> layers;  // per layer and direction: [l * directions + d]
};
struct RefOut {
  std::vector<double> output, h, c;  // [B, T, D H], [L D, B, H], [L D, B, H] (LSTM)
};
double sigm(double v) { return 1 / (1 + std::exp(-v)); }

// One cell step: state h (and c, LSTM) updated in place from input `in`.
void ref_step(const RefModel& m, const RefLayer& p, const std::vector<double>& in, double* h, double* c) {
  const std::int64_t H = m.H, G = m.kind == nn::CellKind::rnn ? 1 : m.kind == nn::CellKind::gru ? 3 : 4;
  const auto I = static_cast<std::int64_t>(in.size());
  std::vector<double> gi(static_cast<std::size_t>(G * H)), gh(gi.size());
  for (std::int64_t j = 0; j < G * H; ++j) {
    double si = p.bih.empty() ? 0 : p.bih[static_cast<std::size_t>(j)];
    double sh = p.bhh.empty() ? 0 : p.bhh[static_cast<std::size_t>(j)];
    for (std::int64_t k = 0; k < I; ++k) si += p.wih[static_cast<std::size_t>(j * I + k)] * in[static_cast<std::size_t>(k)];
    for (std::int64_t k = 0; k < H; ++k) sh += p.whh[static_cast<std::size_t>(j * H + k)] * h[k];
    gi[static_cast<std::size_t>(j)] = si, gh[static_cast<std::size_t>(j)] = sh;
  }
  auto at = [&](const std::vector<double>& v, std::int64_t g, std::int64_t j) { return v[static_cast<std::size_t>(g * H + j)]; };
  std::vector<double> hn(static_cast<std::size_t>(H));
  for (std::int64_t j = 0; j < H; ++j) {
    const auto ju = static_cast<std::size_t>(j);
    if (m.kind == nn::CellKind::rnn) {
      const double v = at(gi, 0, j) + at(gh, 0, j);
      hn[ju] = m.relu ? std::max(v, 0.0) : std::tanh(v);
    } else if (m.kind == nn::CellKind::gru) {
      const double rr = sigm(at(gi, 0, j) + at(gh, 0, j)), z = sigm(at(gi, 1, j) + at(gh, 1, j));
      const double n = std::tanh(at(gi, 2, j) + rr * at(gh, 2, j));
      hn[ju] = (1 - z) * n + z * h[j];
    } else {
      const double i = sigm(at(gi, 0, j) + at(gh, 0, j)), f = sigm(at(gi, 1, j) + at(gh, 1, j));
      const double g = std::tanh(at(gi, 2, j) + at(gh, 2, j)), o = sigm(at(gi, 3, j) + at(gh, 3, j));
      c[j] = f * c[j] + i * g;
      hn[ju] = o * std::tanh(c[j]);
    }
  }
  for (std::int64_t j = 0; j < H; ++j) h[j] = hn[static_cast<std::size_t>(j)];
}

// Layer by layer, one sequence at a time. lengths (empty: all T): sequence
// b runs lengths[b] steps (the reverse direction from step lengths[b] - 1),
// then its states stay and its outputs are 0; its padding is never read.
RefOut reference(const RefModel& m, const std::vector<double>& x, std::int64_t B, std::int64_t T,
                 const std::vector<double>& h0, const std::vector<double>& c0,
                 const std::vector<std::int64_t>& lengths = {}) {
  const std::int64_t D = m.bidirectional ? 2 : 1, S = static_cast<std::int64_t>(m.layers.size()), L = S / D, H = m.H;
  std::vector<double> h(static_cast<std::size_t>(S * B * H), 0.0), c = h;
  if (!h0.empty()) h = h0;
  if (!c0.empty()) c = c0;
  RefOut r;
  r.output.assign(static_cast<std::size_t>(B * T * D * H), 0.0);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = lengths.empty() ? T : lengths[static_cast<std::size_t>(b)];
    std::vector<std::vector<double>> seq(static_cast<std::size_t>(len));
    for (std::int64_t t = 0; t < len; ++t)
      seq[static_cast<std::size_t>(t)].assign(x.begin() + (b * T + t) * m.in, x.begin() + (b * T + t + 1) * m.in);
    for (std::int64_t l = 0; l < L; ++l) {
      std::vector<std::vector<double>> out(static_cast<std::size_t>(len), std::vector<double>(static_cast<std::size_t>(D * H)));
      for (std::int64_t d = 0; d < D; ++d) {
        const std::int64_t sl = l * D + d;
        double* hs = &h[static_cast<std::size_t>((sl * B + b) * H)];
        double* cs = &c[static_cast<std::size_t>((sl * B + b) * H)];
        for (std::int64_t k = 0; k < len; ++k) {
          const std::int64_t t = d == 0 ? k : len - 1 - k;
          ref_step(m, m.layers[static_cast<std::size_t>(sl)], seq[static_cast<std::size_t>(t)], hs, cs);
          std::copy(hs, hs + H, out[static_cast<std::size_t>(t)].begin() + d * H);
        }
      }
      seq = out;
    }
    for (std::int64_t t = 0; t < len; ++t)
      std::copy(seq[static_cast<std::size_t>(t)].begin(), seq[static_cast<std::size_t>(t)].end(),
                r.output.begin() + (b * T + t) * D * H);
  }
  r.h = h;
  if (m.kind == nn::CellKind::lstm) r.c = c;
  return r;
}

RefModel ref_of(const nn::Recurrent& m) {
  RefModel r{m.kind, m.input_size, m.hidden_size, m.nonlinearity == nn::RNNNonlinearity::relu, m.bidirectional, {}};
  for (const auto& p : m.layers) {
    RefLayer l{p.weight_ih.value().to_vector(), p.weight_hh.value().to_vector(), {}, {}};
    if (p.bias_ih.defined()) l.bih = p.bias_ih.value().to_vector(), l.bhh = p.bias_hh.value().to_vector();
    r.layers.push_back(l);
  }
  return r;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}
Tensor f64(const std::vector<double>& v, const Shape& s) { return ad::test::f64s(v, s); }

// (f(v[i] + eps) - f(v[i] - eps)) / 2 eps, v restored: f reads v
double central_diff(std::vector<double>& v, std::size_t i, const std::function<double()>& f, double eps = 1e-6) {
  const double keep = v[i];
  v[i] = keep + eps;
  const double up = f();
  v[i] = keep - eps;
  const double down = f();
  v[i] = keep;
  return (up - down) / (2 * eps);
}

const char* kind_str(nn::CellKind k) {
  return k == nn::CellKind::rnn ? "rnn" : k == nn::CellKind::gru ? "gru" : "lstm";
}

}  // namespace

TEST_CASE("RNN, GRU and LSTM sequences match a plain-loop reference (values and every gradient)") {
  for (nn::CellKind kind : {nn::CellKind::rnn, nn::CellKind::gru, nn::CellKind::lstm})
    for (int variant = 0; variant < 5; ++variant) {
      // variant 0: one layer, zero initial state; 1: two layers with h0 (and c0), no bias; 2: relu RNN / 3 layers;
      // 3: bidirectional, one layer; 4: bidirectional, two layers with h0 (and c0), no bias
      CAPTURE(kind_str(kind));
      CAPTURE(variant);
      ad::Rng rng(100 + static_cast<std::uint64_t>(variant));
      const std::int64_t B = 2, T = 5, I = 3, H = 4;
      nn::RNNOptions o;
      o.dtype = DType::f64;
      o.num_layers = variant == 0 || variant == 3 ? 1 : variant == 2 ? 3 : 2;
      o.bias = variant != 1 && variant != 4;
      o.bidirectional = variant >= 3;
      if (variant == 2) o.nonlinearity = nn::RNNNonlinearity::relu;
      nn::Recurrent m(kind, I, H, rng, o);
      const std::int64_t D = o.bidirectional ? 2 : 1, L = o.num_layers * D, HO = D * H;
      std::vector<double> x = ad::test::randn64({B, T, I}, rng).to_vector(), h0, c0;
      if (variant == 1 || variant == 4) {
        h0 = ad::test::randn64({L, B, H}, rng, 0, 0.5).to_vector();
        if (kind == nn::CellKind::lstm) c0 = ad::test::randn64({L, B, H}, rng, 0, 0.5).to_vector();
      }
      // weights of the loss: sum(output * wo) + sum(h * wh) (+ sum(c * wc))
      const std::vector<double> wo = ad::test::randn64({B, T, HO}, rng).to_vector(),
                                wh = ad::test::randn64({L, B, H}, rng).to_vector(),
                                wc = ad::test::randn64({L, B, H}, rng).to_vector();
      auto ref_loss = [&](const RefModel& rm, const std::vector<double>& xs, const std::vector<double>& h0s,
                          const std::vector<double>& c0s) {
        RefOut r = reference(rm, xs, B, T, h0s, c0s);
        double s = 0;
        for (std::size_t i = 0; i < r.output.size(); ++i) s += r.output[i] * wo[i];
        for (std::size_t i = 0; i < r.h.size(); ++i) s += r.h[i] * wh[i];
        for (std::size_t i = 0; i < r.c.size(); ++i) s += r.c[i] * wc[i];
        return s;
      };

      ad::Graph g;
      ad::Var xv = g.input(f64(x, {B, T, I})), h0v, c0v;
      if (!h0.empty()) h0v = g.input(f64(h0, {L, B, H}));
      if (!c0.empty()) c0v = g.input(f64(c0, {L, B, H}));
      nn::RNNResult out = m(xv, h0v, c0v);
      const RefModel rm = ref_of(m);
      const RefOut want = reference(rm, x, B, T, h0, c0);
      REQUIRE(out.output.shape() == Shape{B, T, HO});
      REQUIRE(out.h.shape() == Shape{L, B, H});
      check_close(out.output.value().to_vector(), want.output, 1e-12);
      check_close(out.h.value().to_vector(), want.h, 1e-12);
      ad::Var loss = ad::sum(ad::mul(out.output, g.input(f64(wo, {B, T, HO})))) +
                     ad::sum(ad::mul(out.h, g.input(f64(wh, {L, B, H}))));
      if (kind == nn::CellKind::lstm) {
        check_close(out.c.value().to_vector(), want.c, 1e-12);
        loss = loss + ad::sum(ad::mul(out.c, g.input(f64(wc, {L, B, H}))));
      } else {
        CHECK_FALSE(out.c.defined());
      }
      CHECK(loss.value().item() == doctest::Approx(ref_loss(rm, x, h0, c0)).epsilon(1e-12));

      std::vector<ad::Var> wrt{xv};
      if (h0v.defined()) wrt.push_back(h0v);
      if (c0v.defined()) wrt.push_back(c0v);
      m.zero_grad();
      const ad::Report rep = ad::backward_wrt(loss, wrt);
      REQUIRE(rep.grads.size() == wrt.size());

      // central differences of the reference, element by element
      const double eps = 1e-6;
      auto fd = [&](std::vector<double>& v, const std::function<double()>& f) {
        std::vector<double> d(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) d[i] = central_diff(v, i, f, eps);
        return d;
      };
      std::vector<double> xs = x, h0s = h0, c0s = c0;
      auto f_inputs = [&] { return ref_loss(rm, xs, h0s, c0s); };
      check_close(rep.grads[0].to_vector(), fd(xs, f_inputs), 1e-6);
      if (h0v.defined()) check_close(rep.grads[1].to_vector(), fd(h0s, f_inputs), 1e-6);
      if (c0v.defined()) check_close(rep.grads[2].to_vector(), fd(c0s, f_inputs), 1e-6);
      RefModel pm = rm;
      auto f_params = [&] { return ref_loss(pm, x, h0, c0); };
      for (std::size_t l = 0; l < m.layers.size(); ++l) {
        const auto& p = m.layers[l];
        RefLayer& rl = pm.layers[l];
        check_close(p.weight_ih.grad().to_vector(), fd(rl.wih, f_params), 1e-6);
        check_close(p.weight_hh.grad().to_vector(), fd(rl.whh, f_params), 1e-6);
        if (p.bias_ih.defined()) {
          check_close(p.bias_ih.grad().to_vector(), fd(rl.bih, f_params), 1e-6);
          check_close(p.bias_hh.grad().to_vector(), fd(rl.bhh, f_params), 1e-6);
        }
      }
    }
}

TEST_CASE("the cells compute one step of the sequence modules") {
  ad::Rng rng(7);
  const std::int64_t B = 3, I = 2, H = 5;
  nn::RNNCellOptions co;
  co.dtype = DType::f64;
  nn::RNNCell rc(I, H, rng, co);
  nn::GRUCell gc(I, H, rng, co);
  nn::LSTMCell lc(I, H, rng, co);
  const Tensor x = ad::test::randn64({B, I}, rng), h = ad::test::randn64({B, H}, rng),
               c = ad::test::randn64({B, H}, rng);
  // a one-layer sequence of length 1 sharing the cell's parameters
  auto seq = [&](nn::CellKind kind, const nn::CellParameters& p) {
    nn::RNNOptions o;
    o.dtype = DType::f64;
    nn::Recurrent m(kind, I, H, rng, o);
    m.layers[0] = p;
    return m;
  };
  ad::Graph g;
  ad::Var xv = g.input(x), hv = g.input(h), cv = g.input(c);
  ad::Var x1 = ad::reshape(xv, {B, 1, I}), h1 = ad::reshape(hv, {1, B, H}), c1 = ad::reshape(cv, {1, B, H});
  CHECK(ad::test::max_abs_diff(rc(xv, hv).value(), seq(nn::CellKind::rnn, rc.p)(x1, h1).h.value().reshape({B, H})) == 0);
  CHECK(ad::test::max_abs_diff(gc(xv, hv).value(), seq(nn::CellKind::gru, gc.p)(x1, h1).h.value().reshape({B, H})) == 0);
  nn::LSTMState s = lc(xv, {hv, cv});
  nn::RNNResult r = seq(nn::CellKind::lstm, lc.p)(x1, h1, c1);
  CHECK(ad::test::max_abs_diff(s.h.value(), r.h.value().reshape({B, H})) == 0);
  CHECK(ad::test::max_abs_diff(s.c.value(), r.c.value().reshape({B, H})) == 0);
  // and the cell's step matches the reference by hand: GRU with h = 0 is (1 - z) n
  const RefModel gm = [&] {
    nn::Recurrent m = seq(nn::CellKind::gru, gc.p);
    return ref_of(m);
  }();
  const RefOut want = reference(gm, x.to_vector(), B, 1, h.to_vector(), {});
  check_close(gc(xv, hv).value().to_vector(), want.h, 1e-12);
}

TEST_CASE("recurrent parameters: PyTorch's names, layouts and init bounds") {
  ad::Rng rng(1);
  nn::RNNOptions o;
  o.num_layers = 2;
  nn::GRU gru(3, 8, rng, o);
  const nn::NamedParameters ps = gru.named_parameters();
  REQUIRE(ps.size() == 8);
  const std::vector<std::pair<std::string, Shape>> want{
      {"weight_ih_l0", {24, 3}}, {"weight_hh_l0", {24, 8}}, {"bias_ih_l0", {24}}, {"bias_hh_l0", {24}},
      {"weight_ih_l1", {24, 8}}, {"weight_hh_l1", {24, 8}}, {"bias_ih_l1", {24}}, {"bias_hh_l1", {24}}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    CHECK(ps[i].first == want[i].first);
    CHECK(ps[i].second.shape() == want[i].second);
    for (double v : ps[i].second.value().to_vector()) CHECK(std::fabs(v) <= 1 / std::sqrt(8.0));
  }
  // bidirectional: "_reverse" after each layer's forward direction; layer 1 reads both directions
  nn::RNNOptions bo = o;
  bo.bidirectional = true;
  const nn::NamedParameters bp = nn::GRU(3, 8, rng, bo).named_parameters();
  REQUIRE(bp.size() == 16);
  CHECK(bp[4].first == "weight_ih_l0_reverse");
  CHECK(bp[4].second.shape() == Shape{24, 3});
  CHECK(bp[7].first == "bias_hh_l0_reverse");
  CHECK(bp[8].first == "weight_ih_l1");
  CHECK(bp[8].second.shape() == Shape{24, 16});
  CHECK(bp[12].first == "weight_ih_l1_reverse");
  CHECK(bp[12].second.shape() == Shape{24, 16});
  nn::RNNOptions nb;
  nb.bias = false;
  nn::LSTM lstm(3, 4, rng, nb);
  const nn::NamedParameters lp = lstm.named_parameters();
  REQUIRE(lp.size() == 2);
  CHECK(lp[0].second.shape() == Shape{16, 3});
  CHECK(lp[1].second.shape() == Shape{16, 4});
  nn::RNNCellOptions co;
  nn::LSTMCell cell(3, 4, rng, co);
  CHECK(cell.named_parameters()[0].first == "weight_ih");
  CHECK(cell.named_parameters()[3].first == "bias_hh");
  // the same seed gives the same parameters, bit for bit
  ad::Rng r1(9), r2(9);
  nn::GRU a(3, 8, r1, o), b(3, 8, r2, o);
  for (std::size_t i = 0; i < 8; ++i)
    CHECK(ad::test::max_abs_diff(a.named_parameters()[i].second.value(), b.named_parameters()[i].second.value()) == 0);
}

TEST_CASE("recurrent layers: bad input is an ad::Error naming the layer and shapes") {
  ad::Rng rng(2);
  nn::GRU gru(3, 4, rng);
  nn::LSTM lstm(3, 4, rng);
  ad::Graph g;
  ad::Var x = g.input(Tensor::zeros({2, 5, 3}));
  CHECK(ad::test::throws_with([&] { gru(g.input(Tensor::zeros({2, 5, 2}))); }, "GRU: expected x [B,T,3]"));
  CHECK(ad::test::throws_with([&] { gru(g.input(Tensor::zeros({5, 3}))); }, "got [5,3]"));
  CHECK(ad::test::throws_with([&] { gru(g.input(Tensor::zeros({2, 0, 3}))); }, "T >= 1"));
  CHECK(ad::test::throws_with([&] { gru(x, g.input(Tensor::zeros({1, 3, 4}))); }, "expected h0 [1,2,4]"));
  CHECK(ad::test::throws_with([&] { gru(x, {}, g.input(Tensor::zeros({1, 2, 4}))); }, "a GRU has none"));
  CHECK(ad::test::throws_with([&] { lstm(x, g.input(Tensor::zeros({1, 2, 4}))); }, "give both h0 and c0"));
  CHECK(ad::test::throws_with([&] { lstm(x, g.input(Tensor::zeros({1, 2, 4})), g.input(Tensor::zeros({1, 2, 5}))); },
                              "expected c0 [1,2,4]"));
  nn::RNNOptions o;
  o.num_layers = 0;
  CHECK(ad::test::throws_with([&] { nn::LSTM(3, 4, rng, o); }, "LSTM: num_layers must be positive"));
  o.num_layers = 1;
  o.checkpoint_every = -1;
  CHECK(ad::test::throws_with([&] { nn::RNN(3, 4, rng, o); }, "RNN: checkpoint_every"));
  CHECK(ad::test::throws_with([&] { nn::GRU(0, 4, rng); }, "GRU: input_size must be positive"));
  o.checkpoint_every = 0;
  o.dtype = DType::i64;
  CHECK(ad::test::throws_with([&] { nn::GRU(3, 4, rng, o); }, "parameter dtype must be f32 or f64"));
  CHECK(ad::test::throws_with([&] { nn::GRU()(x); }, "default-constructed"));
  nn::GRUCell cell(3, 4, rng);
  CHECK(ad::test::throws_with([&] { cell(g.input(Tensor::zeros({2, 3})), g.input(Tensor::zeros({3, 4}))); },
                              "GRUCell: expected x [B,3] and h [B,4] with the same B, got x [2,3] and h [3,4]"));
  nn::LSTMCell lc(3, 4, rng);
  CHECK(ad::test::throws_with(
      [&] { lc(g.input(Tensor::zeros({2, 3})), {g.input(Tensor::zeros({2, 4})), g.input(Tensor::zeros({2, 5}))}); },
      "LSTMCell: expected x [B,3] and c [B,4]"));
  CHECK(ad::test::throws_with([&] { nn::RNNCell()(x, x); }, "default-constructed"));
  // dtypes and graphs, named by the layer
  CHECK(ad::test::throws_with([&] { gru(g.input(Tensor::zeros({2, 5, 3}, DType::f64))); },
                              "GRU: x is f64 [2,5,3] but the parameters are f32"));
  ad::Graph other;
  CHECK(ad::test::throws_with([&] { gru(x, other.input(Tensor::zeros({1, 2, 4}))); },
                              "GRU: x and h0 belong to different graphs"));
  CHECK(ad::test::throws_with([&] { lstm(x, g.input(Tensor::zeros({1, 2, 4})), g.input(Tensor::zeros({1, 2, 4}, DType::f64))); },
                              "LSTM: c0 is f64"));
  CHECK(ad::test::throws_with([&] { cell(g.input(Tensor::zeros({2, 3})), other.input(Tensor::zeros({2, 4}))); },
                              "GRUCell: x and h belong to different graphs"));
  CHECK(ad::test::throws_with([&] { cell(g.input(Tensor::zeros({2, 3}, DType::f64)), g.input(Tensor::zeros({2, 4}))); },
                              "GRUCell: x is f64"));
}

TEST_CASE("backpropagation through time under the policies: same gradients, less memory") {
  // a 2-layer GRU over 96 steps with a per-step loss: keep_all holds every
  // gate of every step; sqrt_n keeps the states at its boundaries; manual
  // keeps the states the layer marks every 8 steps; budget fits half of
  // keep_all's peak. The gradients are the same bit for bit (recomputation
  // runs the same kernels on the same values).
  ad::Rng rng(5);
  const std::int64_t B = 4, T = 96, I = 6, H = 32;
  nn::RNNOptions o;
  o.num_layers = 2;
  o.checkpoint_every = 8;
  nn::GRU gru(I, H, rng, o);
  nn::Linear head(H, 1, rng);
  const Tensor x = Tensor::randn({B, T, I}, rng), y = Tensor::randn({B, T, 1}, rng);
  auto step = [&](const ad::Policy& p) {
    ad::Graph g;
    ad::Var loss = ad::mse(head(gru(g.input(x)).output), g.input(y));
    gru.zero_grad();
    head.zero_grad();
    ad::Report r = ad::backward(loss, p);
    std::vector<Tensor> grads;
    for (const auto& [name, prm] : gru.named_parameters()) grads.push_back(prm.grad().clone());
    for (const auto& [name, prm] : head.named_parameters()) grads.push_back(prm.grad().clone());
    return std::make_pair(r, grads);
  };
  const auto [all, g_all] = step(ad::policy::keep_all());
  CHECK(all.measured_peak_bytes == all.predicted_peak_bytes);
  for (const ad::Policy& p : {ad::policy::sqrt_n(), ad::policy::manual(), ad::policy::budget(all.measured_peak_bytes / 2)}) {
    CAPTURE(p.name());
    const auto [r, gs] = step(p);
    CHECK(r.measured_peak_bytes == r.predicted_peak_bytes);
    CHECK(r.measured_peak_bytes < all.measured_peak_bytes * 6 / 10);
    ad::test::check_bitwise(g_all, gs);
  }
}

TEST_CASE("the gradient of many slices of one value is assembled with one concat") {
  // loss = sum_t t * sum(x[:, t]^2) over T slices of x [2, T, 3]: the gradient
  // is 2 t x, built as one concat of the T pieces, not T full-size tensors
  // and T - 1 full-size adds.
  const std::int64_t T = 40;
  ad::Rng rng(3);
  const Tensor xt = ad::test::randn64({2, T, 3}, rng);
  ad::Graph g;
  ad::Var x = g.input(xt);
  ad::Var loss;
  for (std::int64_t t = 0; t < T; ++t) {
    ad::Var s = ad::sum(ad::mul_scalar(ad::mul(ad::slice(x, 1, t, t + 1), ad::slice(x, 1, t, t + 1)), static_cast<double>(t)));
    loss = loss.defined() ? loss + s : s;
  }
  const std::size_t nodes_before = g.num_nodes();
  ad::Var dx = ad::grad(loss, {x})[0];
  const std::vector<double> xv = xt.to_vector(), got = dx.value().to_vector();
  for (std::int64_t i = 0; i < 2 * T * 3; ++i) {
    const double t = static_cast<double>((i / 3) % T);
    CHECK(got[static_cast<std::size_t>(i)] == doctest::Approx(2 * t * xv[static_cast<std::size_t>(i)]).epsilon(1e-14));
  }
  CHECK(g.impl().node(dx.id()).op == ad::OpId::concat);
  // no full-size add among the gradient nodes
  for (std::size_t id = nodes_before; id < static_cast<std::size_t>(g.num_nodes()); ++id) {
    const ad::Node& n = g.impl().node(static_cast<std::int32_t>(id));
    CHECK_FALSE((n.op == ad::OpId::add && n.meta.shape.numel() == xt.numel()));
  }
}

TEST_CASE("slice gradients: repeated ranges, gaps, overlaps and two axes sum correctly") {
  ad::Rng rng(4);
  const Tensor xt = ad::test::randn64({6, 5}, rng), wt = ad::test::randn64({6, 5}, rng);
  // slices (axis, start, stop): repeated [1,3) twice, a gap at rows 3-4, an overlapping pair on axis 1,
  // an empty one and the whole range
  const std::vector<std::array<std::int64_t, 3>> cuts{{0, 1, 3}, {0, 1, 3}, {0, 5, 6}, {1, 0, 3},
                                                      {1, 2, 5}, {0, 2, 2}, {0, 0, 6}};
  ad::Graph g;
  ad::Var x = g.input(xt), w = g.input(wt);
  ad::Var loss;
  for (const auto& c : cuts) {
    ad::Var s = ad::sum(ad::mul(ad::slice(x, static_cast<int>(c[0]), c[1], c[2]),
                                ad::slice(w, static_cast<int>(c[0]), c[1], c[2])));
    loss = loss.defined() ? loss + s : s;
  }
  // element (r, c) of a [6, 5] gradient: `v` summed once per slice whose range holds it
  auto check_per_cut = [&](const std::vector<double>& got, const std::vector<double>& v) {
    for (std::int64_t r = 0; r < 6; ++r)
      for (std::int64_t c = 0; c < 5; ++c) {
        double want = 0;
        for (const auto& cut : cuts) {
          const std::int64_t at = cut[0] == 0 ? r : c;
          if (at >= cut[1] && at < cut[2]) want += v[static_cast<std::size_t>(r * 5 + c)];
        }
        CHECK(got[static_cast<std::size_t>(r * 5 + c)] == doctest::Approx(want).epsilon(1e-14));
      }
  };
  check_per_cut(ad::grad(loss, {x})[0].value().to_vector(), wt.to_vector());
  // and the assembled gradient is differentiable again: d/dw of sum(dx * v) = v over each slice's range
  ad::Var dx = ad::grad(loss, {x})[0];
  const Tensor vt = ad::test::randn64({6, 5}, rng);
  check_per_cut(ad::grad(ad::sum(ad::mul(dx, g.input(vt))), {w})[0].value().to_vector(), vt.to_vector());
}

TEST_CASE("sequences of different lengths: frozen states, zero outputs, padding never read") {
  for (nn::CellKind kind : {nn::CellKind::gru, nn::CellKind::lstm, nn::CellKind::rnn})
  for (bool bi : {false, true}) {
    CAPTURE(kind_str(kind));
    CAPTURE(bi);
    ad::Rng rng(21);
    const std::int64_t B = 3, T = 6, I = 2, H = 3, L = bi ? 4 : 2, HO = bi ? 2 * H : H;  // L: state slots
    nn::RNNOptions o;
    o.dtype = DType::f64;
    o.num_layers = 2;
    o.bidirectional = bi;
    nn::Recurrent m(kind, I, H, rng, o);
    const std::vector<std::int64_t> lens{6, 3, 0};
    std::vector<double> x = ad::test::randn64({B, T, I}, rng).to_vector();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = lens[static_cast<std::size_t>(b)]; t < T; ++t)
        for (std::int64_t i = 0; i < I; ++i) x[static_cast<std::size_t>((b * T + t) * I + i)] = std::nan("");
    const std::vector<double> h0 = ad::test::randn64({L, B, H}, rng, 0, 0.5).to_vector(),
                              c0 = kind == nn::CellKind::lstm ? ad::test::randn64({L, B, H}, rng, 0, 0.5).to_vector()
                                                              : std::vector<double>{};
    const std::vector<double> wo = ad::test::randn64({B, T, HO}, rng).to_vector(),
                              wh = ad::test::randn64({L, B, H}, rng).to_vector();
    ad::Graph g;
    ad::Var xv = g.input(f64(x, {B, T, I})), h0v = g.input(f64(h0, {L, B, H})),
            c0v = c0.empty() ? ad::Var{} : g.input(f64(c0, {L, B, H}));
    nn::RNNResult out = m(xv, h0v, c0v, ad::test::index(lens, {B}));
    const RefModel rm = ref_of(m);
    const RefOut want = reference(rm, x, B, T, h0, c0, lens);
    check_close(out.output.value().to_vector(), want.output, 1e-12);
    check_close(out.h.value().to_vector(), want.h, 1e-12);  // sequence 2 (length 0) keeps h0
    if (!c0.empty()) check_close(out.c.value().to_vector(), want.c, 1e-12);
    ad::Var loss = ad::sum(ad::mul(out.output, g.input(f64(wo, {B, T, HO})))) +
                   ad::sum(ad::mul(out.h, g.input(f64(wh, {L, B, H}))));
    m.zero_grad();
    const ad::Report rep = ad::backward_wrt(loss, {xv, h0v});
    auto ref_loss = [&](const RefModel& r, const std::vector<double>& xs, const std::vector<double>& hs) {
      RefOut o2 = reference(r, xs, B, T, hs, c0, lens);
      double sum = 0;
      for (std::size_t i = 0; i < o2.output.size(); ++i) sum += o2.output[i] * wo[i];
      for (std::size_t i = 0; i < o2.h.size(); ++i) sum += o2.h[i] * wh[i];
      return sum;
    };
    // x's gradient: central differences on the valid steps, exactly 0 on the padding (which is NaN)
    const std::vector<double> gx = rep.grads[0].to_vector();
    std::vector<double> xs = x;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) {
        CHECK(gx[i] == 0.0);
        continue;
      }
      CHECK(gx[i] == doctest::Approx(central_diff(xs, i, [&] { return ref_loss(rm, xs, h0); })).epsilon(1e-6).scale(1));
    }
    // every parameter gradient is finite and matches central differences
    RefModel pm = rm;
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
      const std::vector<double> gw = m.layers[l].weight_hh.grad().to_vector();
      std::vector<double>& w = pm.layers[l].whh;
      for (std::size_t i = 0; i < w.size(); ++i)
        CHECK(gw[i] == doctest::Approx(central_diff(w, i, [&] { return ref_loss(pm, x, h0); })).epsilon(1e-6).scale(1));
      CHECK(ad::test::all_finite(m.layers[l].weight_ih.grad()));
      CHECK(ad::test::all_finite(m.layers[l].bias_ih.grad()));
    }
  }
  // bad lengths
  ad::Rng rng(22);
  nn::GRU gru(2, 3, rng);
  ad::Graph g;
  ad::Var x = g.input(Tensor::zeros({2, 4, 2}));
  CHECK(ad::test::throws_with([&] { gru(x, {}, {}, ad::test::index({5, 1}, {2})); },
                              "GRU: lengths[0] = 5 is outside [0, T = 4]"));
  CHECK(ad::test::throws_with([&] { gru(x, {}, {}, ad::test::index({-1, 1}, {2})); }, "lengths[0] = -1"));
  CHECK(ad::test::throws_with([&] { gru(x, {}, {}, ad::test::index({1, 1, 1}, {3})); },
                              "GRU: lengths must be i64 [2] (one per sequence), got i64 [3]"));
  CHECK(ad::test::throws_with([&] { gru(x, {}, {}, Tensor::zeros({2})); }, "got f32 [2]"));
}

TEST_CASE("truncated backpropagation: backward_keep carries the forward pass's final states across chunks") {
  // an LSTM over two chunks of a sequence, the states carried from the first
  // chunk's step into the second's graph as inputs (the gradient stops
  // there). The carried states equal a plain forward of the first chunk,
  // also after the optimizer has changed the weights, and come from the
  // same pass: no node is computed twice under keep_all.
  ad::Rng rng(31);
  const std::int64_t B = 2, T = 12, I = 3, H = 4;
  nn::RNNOptions o;
  o.num_layers = 2;
  nn::LSTM lstm(I, H, rng, o);
  nn::Linear head(H, 1, rng);
  ad::nn::SGDOptions so;
  so.lr = 0.5;
  ad::nn::SGD opt(lstm.named_parameters(), so);
  const Tensor x1 = Tensor::randn({B, T, I}, rng), x2 = Tensor::randn({B, T, I}, rng);
  for (const ad::Policy& pol : {ad::policy::keep_all(), ad::policy::sqrt_n()}) {
    CAPTURE(pol.name());
    Tensor want_h, want_c;  // a plain forward with the current weights
    {
      ad::Graph g0;
      nn::RNNResult r0 = lstm(g0.input(x1));
      want_h = ad::eval(r0.h).clone(), want_c = ad::eval(r0.c).clone();
    }
    ad::Graph g;
    nn::RNNResult r = lstm(g.input(x1));
    ad::Var loss = ad::mean(head(r.output));
    opt.zero_grad();
    const ad::Report rep = ad::backward_keep(loss, {r.h, r.c}, pol);
    if (pol.kind == ad::Policy::Kind::keep_all) CHECK(rep.recomputed_nodes == 0);
    CHECK(rep.measured_peak_bytes == rep.predicted_peak_bytes);
    const Tensor h = rep.values[0], c = rep.values[1];
    CHECK(ad::test::max_abs_diff(h, want_h) == 0);
    CHECK(ad::test::max_abs_diff(c, want_c) == 0);
    // the next chunk starts from them
    ad::Graph g2;
    nn::RNNResult r2 = lstm(g2.input(x2), g2.input(h), g2.input(c));
    CHECK(ad::test::all_finite(ad::eval(r2.output)));
    // an optimizer step does not touch the carried states, only what is computed from the parameters later
    const Tensor before = r.h.value().clone();
    opt.step();
    CHECK(ad::test::max_abs_diff(h, want_h) == 0);
    CHECK(ad::test::max_abs_diff(r.h.value(), before) > 0);  // recomputed from the new weights: why keep exists
  }
}

TEST_CASE("the docs' truncated-backpropagation snippet runs") {
  ad::Rng rng(41);
  nn::LSTM lstm(3, 5, rng);
  nn::Linear head(5, 1, rng);
  ad::nn::Adam opt(lstm.named_parameters());
  const Tensor x1 = Tensor::randn({2, 7, 3}, rng), x2 = Tensor::randn({2, 7, 3}, rng);
  const ad::Policy policy = ad::policy::sqrt_n();
  ad::Graph g;
  ad::nn::RNNResult r = lstm(g.input(x1));
  ad::Var loss = ad::mean(head(r.output));
  Tensor want;
  {
    ad::Graph g0;
    want = ad::eval(lstm(g0.input(x1)).h).clone();
  }
  // [snippet tbptt]
  ad::Report rep = ad::backward_keep(loss, {r.h, r.c}, policy);  // the forward pass's final states
  opt.step();
  ad::Graph next;
  ad::nn::RNNResult r2 = lstm(next.input(x2), next.input(rep.values[0]), next.input(rep.values[1]));
  // [end snippet]
  CHECK(ad::test::max_abs_diff(rep.values[0], want) == 0);
  CHECK(r2.output.shape() == Shape{2, 7, 5});
  CHECK(ad::test::all_finite(ad::eval(r2.output)));
}

TEST_CASE("budget plans any budget the layer's checkpoint marks meet") {
  // the marks' keep set (manual's plan) is one of budget's candidates: a
  // 400-step LSTM marked every 20 steps fits manual's peak under budget,
  // which its other candidates alone did not reach (least peak ~1.4x)
  ad::Rng rng(51);
  nn::RNNOptions o;
  o.checkpoint_every = 20;
  nn::LSTM lstm(4, 16, rng, o);
  const Tensor x = Tensor::randn({4, 400, 4}, rng);
  auto run = [&](const ad::Policy& p) { return step_under(lstm, x, p); };
  const ad::Report manual = run(ad::policy::manual());
  const ad::Report fit = run(ad::policy::budget(manual.predicted_peak_bytes));
  CHECK(fit.measured_peak_bytes <= manual.predicted_peak_bytes);
  CHECK(fit.measured_peak_bytes == fit.predicted_peak_bytes);
  CHECK(fit.recomputed_nodes <= manual.recomputed_nodes);
  // without marks the same budget is refused: the marks are what made it plannable
  nn::LSTM unmarked = lstm;
  unmarked.checkpoint_every = 0;
  ad::Graph g;
  CHECK_THROWS_AS(ad::backward(ad::mean(unmarked(g.input(x)).output), ad::policy::budget(manual.predicted_peak_bytes)),
                  ad::BudgetError);
}

TEST_CASE("recurrent layers are twice differentiable: a gradient penalty's gradient against central differences") {
  // penalty(W) = |d/dx sum(output * w)|^2 through a GRU and an LSTM (sigmoid,
  // tanh: their backward ops have backward rules); its gradient with respect
  // to weight_hh, from ad::grad twice, against central differences of the
  // penalty itself (computed with one ad::grad, checked above)
  for (nn::CellKind kind : {nn::CellKind::gru, nn::CellKind::lstm}) {
    CAPTURE(kind_str(kind));
    ad::Rng rng(61);
    const std::int64_t B = 2, T = 3, I = 2, H = 3;
    nn::RNNOptions o;
    o.dtype = DType::f64;
    nn::Recurrent m(kind, I, H, rng, o);
    const Tensor x = ad::test::randn64({B, T, I}, rng), w = ad::test::randn64({B, T, H}, rng);
    auto penalty = [&](ad::Graph& g) {
      ad::Var xv = g.input(x);
      ad::Var f = ad::sum(ad::mul(m(xv).output, g.input(w)));
      ad::Var gx = ad::grad(f, {xv})[0];
      return ad::sum(ad::mul(gx, gx));
    };
    ad::Graph g;
    ad::Var pen = penalty(g);
    const std::vector<double> got = ad::eval(ad::grad(pen, {g.param(m.layers[0].weight_hh)})[0]).to_vector();
    Tensor& wv = m.layers[0].weight_hh.value();
    double* wp = wv.data<double>();
    for (std::int64_t i = 0; i < wv.numel(); ++i) {
      const double keep = wp[i];
      wp[i] = keep + 1e-6;
      ad::Graph gu;
      const double up = ad::eval(penalty(gu)).item();
      wp[i] = keep - 1e-6;
      ad::Graph gd;
      const double down = ad::eval(penalty(gd)).item();
      wp[i] = keep;
      CHECK(got[static_cast<std::size_t>(i)] == doctest::Approx((up - down) / 2e-6).epsilon(1e-6).scale(1));
    }
  }
}

TEST_CASE("a recurrent layer's output gradient is cut per step just in time, and the head's weight gradient comes first") {
  // two orderings decide sqrt_n's floor on a recurrent layer: concat's
  // backward pieces of the [B, T, H] output gradient were all made at once
  // (held next to the gradient they were cut from), and a Linear head's dx
  // was computed before its dW (so the output, dead after dW, was held next
  // to its own gradient). sqrt_n's peak was 0.39 (GRU) and 0.38 (LSTM) of
  // keep_all's; it is 0.32 now
  for (nn::CellKind kind : {nn::CellKind::gru, nn::CellKind::lstm}) {
    CAPTURE(kind_str(kind));
    ad::Rng rng(5);
    const std::int64_t B = 4, T = 256, I = 8, H = 32;
    nn::Recurrent rnn(kind, I, H, rng);
    nn::Linear head(H, 1, rng);
    const Tensor x = Tensor::randn({B, T, I}, rng), y = Tensor::randn({B, T, 1}, rng);
    auto peak = [&](const ad::Policy& p) {
      ad::Graph g;
      return ad::plan_backward(ad::mse(head(rnn(g.input(x)).output), g.input(y)), p).schedule.predicted_peak_bytes;
    };
    const double ratio = static_cast<double>(peak(ad::policy::sqrt_n())) / static_cast<double>(peak(ad::policy::keep_all()));
    CHECK(ratio < 0.34);
  }
}

TEST_CASE("bidirectional layers with checkpoint marks: manual keeps what the layer above reads") {
  // layer l + 1 reads both directions of layer l at every step: unmarked,
  // manual recomputed them again and again and peaked at 0.9-1.4x keep_all
  // on 2-3 layers (a user's trial); marked, well below
  for (std::int64_t layers : {2, 3}) {
    CAPTURE(layers);
    ad::Rng rng(71);
    nn::RNNOptions o;
    o.num_layers = layers;
    o.bidirectional = true;
    o.checkpoint_every = 10;
    nn::GRU gru(8, 16, rng, o);
    const Tensor x = Tensor::randn({4, 100, 8}, rng);
    auto run = [&](const ad::Policy& p) { return step_under(gru, x, p); };
    const ad::Report all = run(ad::policy::keep_all()), manual = run(ad::policy::manual());
    CHECK(manual.measured_peak_bytes == manual.predicted_peak_bytes);
    CHECK(manual.measured_peak_bytes < all.measured_peak_bytes / 2);
  }
}
