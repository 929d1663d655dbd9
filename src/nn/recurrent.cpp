#include "ad/nn/recurrent.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "ad/format.hpp"
#include "ad/policy.hpp"
#include "core/graph_impl.hpp"
#include "nn/layer_checks.hpp"

namespace ad::nn {

namespace {

const char* kind_name(CellKind k) {
  switch (k) {
    case CellKind::rnn: return "RNN";
    case CellKind::gru: return "GRU";
    case CellKind::lstm: return "LSTM";
  }
  return "?";
}
std::int64_t gate_count(CellKind k) { return k == CellKind::rnn ? 1 : k == CellKind::gru ? 3 : 4; }

// Gate g of a [B, gates * H] pre-activation: columns [g H, (g + 1) H).
Var gate(const Var& pre, std::int64_t g, std::int64_t hidden) { return slice(pre, 1, g * hidden, (g + 1) * hidden); }

Var rnn_step(const CellParameters& p, RNNNonlinearity act, const Var& x, const Var& h) {
  Var pre = add(p.input_part(x), p.hidden_part(h));
  return act == RNNNonlinearity::relu ? relu(pre) : ad::tanh(pre);
}
Var gru_step(const CellParameters& p, const Var& x, const Var& h) {
  const std::int64_t H = p.hidden_size;
  Var gi = p.input_part(x), gh = p.hidden_part(h);
  Var r = sigmoid(add(gate(gi, 0, H), gate(gh, 0, H)));
  Var z = sigmoid(add(gate(gi, 1, H), gate(gh, 1, H)));
  Var n = ad::tanh(add(gate(gi, 2, H), mul(r, gate(gh, 2, H))));
  return add(n, mul(z, sub(h, n)));  // (1 - z) n + z h
}
LSTMState lstm_step(const CellParameters& p, const Var& x, const LSTMState& s) {
  const std::int64_t H = p.hidden_size;
  Var pre = add(p.input_part(x), p.hidden_part(s.h));
  Var i = sigmoid(gate(pre, 0, H)), f = sigmoid(gate(pre, 1, H)), g = ad::tanh(gate(pre, 2, H)),
      o = sigmoid(gate(pre, 3, H));
  Var c = add(mul(f, s.c), mul(i, g));
  return {mul(o, ad::tanh(c)), c};
}

std::string shape_of(const Var& v) { return v.defined() ? v.shape().str() : std::string("(undefined)"); }

}  // namespace

// ---- parameters of one cell ----
CellParameters::CellParameters(const char* name, std::int64_t gates, std::int64_t in, std::int64_t hidden, Rng& rng,
                               const RNNCellOptions& o)
    : layer(name), input_size(in), hidden_size(hidden) {
  detail::check_positive(name, "input_size", in);
  detail::check_positive(name, "hidden_size", hidden);
  detail::check_dtype(name, o.dtype);
  const double k = 1.0 / std::sqrt(static_cast<double>(hidden));
  weight_ih = Parameter(Tensor::uniform({gates * hidden, in}, rng, o.dtype, -k, k), "weight_ih");
  weight_hh = Parameter(Tensor::uniform({gates * hidden, hidden}, rng, o.dtype, -k, k), "weight_hh");
  if (o.bias) {
    bias_ih = Parameter(Tensor::uniform({gates * hidden}, rng, o.dtype, -k, k), "bias_ih");
    bias_hh = Parameter(Tensor::uniform({gates * hidden}, rng, o.dtype, -k, k), "bias_hh");
  }
}
void CellParameters::visit(Visitor& v) const {
  v.parameter("weight_ih", weight_ih);
  v.parameter("weight_hh", weight_hh);
  v.parameter("bias_ih", bias_ih);
  v.parameter("bias_hh", bias_hh);
}
void CellParameters::check_step(const Var& x, const Var& h, const char* what) const {
  if (!weight_ih.defined()) throw Error(fmt::format("{}: use of a default-constructed layer", layer));
  const bool ok = x.defined() && h.defined() && x.rank() == 2 && h.rank() == 2 && x.dim(1) == input_size &&
                  h.dim(1) == hidden_size && x.dim(0) == h.dim(0);
  if (!ok)
    throw Error(fmt::format("{}: expected x [B,{}] and {} [B,{}] with the same B, got x {} and {} {}", layer,
                            input_size, what, hidden_size, shape_of(x), what, shape_of(h)));
  check_operand(x, "x");
  check_operand(h, what);
  if (x.graph() != h.graph()) throw Error(fmt::format("{}: x and {} belong to different graphs", layer, what));
}
void CellParameters::check_operand(const Var& v, const char* what) const {
  if (v.dtype() != weight_ih.dtype())
    throw Error(fmt::format("{}: {} is {} {} but the parameters are {} (cast it, or build the layer with that dtype)",
                            layer, what, dtype_name(v.dtype()), v.shape(), dtype_name(weight_ih.dtype())));
}
Var CellParameters::input_part(const Var& x) const {
  Var y = matmul(x, weight_ih, false, true);
  return bias_ih.defined() ? add(y, bias_ih) : y;
}
Var CellParameters::hidden_part(const Var& h) const {
  Var y = matmul(h, weight_hh, false, true);
  return bias_hh.defined() ? add(y, bias_hh) : y;
}

// ---- cells ----
RNNCell::RNNCell(std::int64_t in, std::int64_t hidden, Rng& rng, RNNCellOptions o)
    : nonlinearity(o.nonlinearity), p("RNNCell", 1, in, hidden, rng, o) {}
Var RNNCell::operator()(const Var& x, const Var& h) const {
  p.check_step(x, h, "h");
  return rnn_step(p, nonlinearity, x, h);
}
GRUCell::GRUCell(std::int64_t in, std::int64_t hidden, Rng& rng, RNNCellOptions o) : p("GRUCell", 3, in, hidden, rng, o) {}
Var GRUCell::operator()(const Var& x, const Var& h) const {
  p.check_step(x, h, "h");
  return gru_step(p, x, h);
}
LSTMCell::LSTMCell(std::int64_t in, std::int64_t hidden, Rng& rng, RNNCellOptions o)
    : p("LSTMCell", 4, in, hidden, rng, o) {}
LSTMState LSTMCell::operator()(const Var& x, const LSTMState& s) const {
  p.check_step(x, s.h, "h");
  p.check_step(x, s.c, "c");
  return lstm_step(p, x, s);
}

// ---- sequence modules ----
Recurrent::Recurrent(CellKind k, std::int64_t in, std::int64_t hidden, Rng& rng, RNNOptions o)
    : kind(k), input_size(in), hidden_size(hidden), num_layers(o.num_layers), checkpoint_every(o.checkpoint_every),
      bidirectional(o.bidirectional), nonlinearity(o.nonlinearity) {
  const char* name = kind_name(k);
  detail::check_positive(name, "num_layers", o.num_layers);
  if (o.checkpoint_every < 0)
    throw Error(fmt::format("{}: checkpoint_every must be >= 0 (0: no marks), got {}", name, o.checkpoint_every));
  RNNCellOptions co;
  co.bias = o.bias;
  co.dtype = o.dtype;
  co.nonlinearity = o.nonlinearity;
  // torch.nn.RNN & co. draw each layer's (and direction's) weight_ih, weight_hh, bias_ih, bias_hh in turn, all
  // ~ U(+-1/sqrt(hidden)); a layer above the first reads both directions of the one below
  const std::int64_t D = o.bidirectional ? 2 : 1;
  for (std::int64_t l = 0; l < o.num_layers; ++l)
    for (std::int64_t d = 0; d < D; ++d) layers.emplace_back(name, gate_count(k), l == 0 ? in : D * hidden, hidden, rng, co);
}
void Recurrent::visit(Visitor& v) const {
  const std::size_t D = bidirectional ? 2 : 1;
  for (std::size_t sl = 0; sl < layers.size(); ++sl) {
    const std::string s = "_l" + std::to_string(sl / D) + (sl % D == 1 ? "_reverse" : "");
    v.parameter("weight_ih" + s, layers[sl].weight_ih);
    v.parameter("weight_hh" + s, layers[sl].weight_hh);
    v.parameter("bias_ih" + s, layers[sl].bias_ih);
    v.parameter("bias_hh" + s, layers[sl].bias_hh);
  }
}

RNNResult Recurrent::operator()(const Var& x, const Var& h0, const Var& c0, const Tensor& lengths) const {
  const char* name = kind_name(kind);
  if (layers.empty()) throw Error(fmt::format("{}: use of a default-constructed layer", name));
  if (!x.defined() || x.rank() != 3 || x.dim(2) != input_size || x.dim(1) < 1)
    throw Error(fmt::format("{}: expected x [B,T,{}] with T >= 1 (batch first), got {}", name, input_size,
                            shape_of(x)));
  const std::int64_t B = x.dim(0), T = x.dim(1), L = num_layers, H = hidden_size, D = bidirectional ? 2 : 1,
                     S = L * D;  // state slots
  const Shape state{S, B, H};
  const bool lstm = kind == CellKind::lstm;
  if (!lstm && c0.defined())
    throw Error(fmt::format("{}: c0 is an LSTM's initial cell state; a {} has none", name, name));
  if (lstm && h0.defined() != c0.defined())
    throw Error(fmt::format("LSTM: give both h0 and c0 {} or neither, got h0 {} and c0 {}", state, shape_of(h0),
                            shape_of(c0)));
  layers[0].check_operand(x, "x");
  for (const Var* s : {&h0, &c0}) {
    if (!s->defined()) continue;
    const char* what = s == &h0 ? "h0" : "c0";
    if (s->shape() != state)
      throw Error(fmt::format("{}: expected {} {} ([num_layers * directions,B,hidden]), got {}", name, what, state,
                              s->shape()));
    layers[0].check_operand(*s, what);
    if (s->graph() != x.graph()) throw Error(fmt::format("{}: x and {} belong to different graphs", name, what));
  }

  // with lengths: a constant mask [B, T] in x's dtype and on its device, 1 while step t of sequence b runs
  Var mask;
  if (lengths.defined()) {
    if (lengths.dtype() != DType::i64 || lengths.shape() != Shape{B})
      throw Error(fmt::format("{}: lengths must be i64 [{}] (one per sequence), got {} {}", name, B,
                              dtype_name(lengths.dtype()), lengths.shape()));
    const Tensor lv = lengths.to(Device::cpu());
    const std::int64_t* l = lv.data<std::int64_t>();
    Tensor m = Tensor::zeros({B, T}, DType::f64);
    double* mp = m.data<double>();
    for (std::int64_t b = 0; b < B; ++b) {
      if (l[b] < 0 || l[b] > T)
        throw Error(fmt::format("{}: lengths[{}] = {} is outside [0, T = {}]", name, b, l[b], T));
      std::fill(mp + b * T, mp + b * T + l[b], 1.0);
    }
    Node n;  // a graph input, as Graph::input makes one
    n.op = OpId::input;
    n.value = m.to(x.dtype()).to(x.device());
    n.meta = {n.value.shape(), n.value.dtype(), n.value.device()};
    mask = Var(x.graph(), x.graph()->add_node(std::move(n)));
  }
  // state slot s = l * D + d: layer l, direction d (1: reversed); its initial state a row of h0 / c0, or zeros
  auto initial = [&](const Var& s0, std::int64_t s) {
    return s0.defined() ? reshape(slice(s0, 0, s, s + 1), Shape{B, H}) : full(x, Shape{B, H}, 0.0, x.dtype());
  };
  std::vector<Var> h(static_cast<std::size_t>(S)), c(lstm ? static_cast<std::size_t>(S) : 0);
  for (std::int64_t sl = 0; sl < S; ++sl) {
    h[static_cast<std::size_t>(sl)] = initial(h0, sl);
    if (lstm) c[static_cast<std::size_t>(sl)] = initial(c0, sl);
  }
  // with lengths: 1 where sequence b still runs at step t (made when first needed, near its readers)
  std::vector<Var> lives(mask.defined() ? static_cast<std::size_t>(T) : 0);
  auto live_at = [&](std::int64_t t) {
    if (!mask.defined()) return Var{};
    Var& lv = lives[static_cast<std::size_t>(t)];
    if (!lv.defined()) lv = slice(mask, 1, t, t + 1);
    return lv;
  };
  // x's step t, its padding masked to 0 before any product
  auto x_at = [&](std::int64_t t) {
    Var in = reshape(slice(x, 1, t, t + 1), Shape{B, input_size});
    const Var lv = live_at(t);
    return lv.defined() ? where(lv, in, 0.0) : in;
  };
  // one step of slot sl at time t (the k-th step of its direction, from 1) from input `in`
  auto step = [&](std::int64_t sl, std::int64_t t, std::int64_t k, const Var& in) {
    const auto su = static_cast<std::size_t>(sl);
    const CellParameters& p = layers[su];
    const Var lv = live_at(t);
    auto gate_state = [&](const Var& next, const Var& prev) { return lv.defined() ? where(lv, next, prev) : next; };
    const bool mark = checkpoint_every > 0 && k % checkpoint_every == 0;
    if (lstm) {
      LSTMState st = lstm_step(p, in, {h[su], c[su]});
      h[su] = gate_state(st.h, h[su]), c[su] = gate_state(st.c, c[su]);
      if (mark) checkpoint(c[su]);
    } else {
      h[su] = gate_state(kind == CellKind::gru ? gru_step(p, in, h[su]) : rnn_step(p, nonlinearity, in, h[su]), h[su]);
    }
    if (mark) checkpoint(h[su]);
    return h[su];
  };
  // the output row of step t ([B, 1, D H]): 0 past a sequence's length
  auto output_row = [&](std::int64_t t, const Var& v) {
    const Var lv = live_at(t);
    return reshape(lv.defined() ? where(lv, v, 0.0) : v, Shape{B, 1, D * H});
  };
  std::vector<Var> outputs;
  outputs.reserve(static_cast<std::size_t>(T));
  if (D == 1) {
    // time-major: step t of every layer before step t + 1 (see the header)
    for (std::int64_t t = 0; t < T; ++t) {
      Var in = x_at(t);
      for (std::int64_t l = 0; l < L; ++l) in = step(l, t, t + 1, in);
      outputs.push_back(output_row(t, in));
    }
  } else {
    // bidirectional: layer l + 1 reads both directions of layer l at every
    // step, so layer by layer; within a layer the two directions advance
    // together (forward step i, reverse step T - 1 - i)
    std::vector<Var> below;  // layer l - 1's states per step, [B, 2H]
    for (std::int64_t l = 0; l < L; ++l) {
      std::vector<Var> fw(static_cast<std::size_t>(T)), bw(static_cast<std::size_t>(T));
      auto in_at = [&](std::int64_t t) { return l == 0 ? x_at(t) : below[static_cast<std::size_t>(t)]; };
      for (std::int64_t i = 0; i < T; ++i) {
        const std::int64_t tr = T - 1 - i;
        fw[static_cast<std::size_t>(i)] = step(2 * l, i, i + 1, in_at(i));
        bw[static_cast<std::size_t>(tr)] = step(2 * l + 1, tr, i + 1, in_at(tr));
      }
      below.assign(static_cast<std::size_t>(T), Var{});
      for (std::int64_t t = 0; t < T; ++t) {
        below[static_cast<std::size_t>(t)] = concat({fw[static_cast<std::size_t>(t)], bw[static_cast<std::size_t>(t)]}, 1);
        // the layer above reads every step of both directions: with marks, keep them (as the output is kept),
        // else recomputing a segment of the layer above reran both directions of this one
        if (checkpoint_every > 0 && l + 1 < L) checkpoint(below[static_cast<std::size_t>(t)]);
      }
    }
    for (std::int64_t t = 0; t < T; ++t) outputs.push_back(output_row(t, below[static_cast<std::size_t>(t)]));
  }
  auto stack = [&](const std::vector<Var>& st) {
    std::vector<Var> rows;
    rows.reserve(st.size());
    for (const Var& v : st) rows.push_back(reshape(v, Shape{1, B, H}));
    return rows.size() == 1 ? rows[0] : concat(rows, 0);
  };
  RNNResult r;
  r.output = T == 1 ? outputs[0] : concat(outputs, 1);
  // recomputing the output would rerun every step (it reads every state): a
  // manual plan keeps it with the marked states
  if (checkpoint_every > 0) checkpoint(r.output);
  r.h = stack(h);
  if (lstm) r.c = stack(c);
  return r;
}

}  // namespace ad::nn
