#pragma once
// Recurrent layers: Elman RNN, GRU and LSTM cells, and multi-layer sequence
// modules over them, with PyTorch's parameter layouts, names, gate orders and
// initialisation (so safetensors files interchange with torch.nn.GRU & co.).
//
// A sequence module unrolls its cell over the T steps of the input, one
// small group of ordinary graph nodes per step and layer, built time-major
// (step t of every layer before step t + 1): the values crossing any point of
// the unrolled graph are then the layers' states, which is what the
// rematerialisation policies look for. Backpropagation through T steps keeps
// every gate of every step under keep_all (about 8 hidden-sized values per
// step and layer for a GRU, 9 for an LSTM: bench_rnn); sqrt_n keeps the
// states at ~sqrt(nodes) boundaries and recomputes the steps between them
// (0.34-0.39 of keep_all's peak there), and budget(bytes) fits a byte budget.
// To carry the final states into the next chunk of truncated
// backpropagation, keep them in the step: ad::backward_keep(loss, {r.h, r.c},
// policy) returns their forward values (Report::values).
// The input projection is computed per step (x_t W_ih^T), not for the whole
// sequence in one product: a [B, T, gates * hidden] product would be one
// value every step reads, held (or recomputed whole) through all of backward.
#include <cstdint>
#include <vector>

#include "ad/nn/module.hpp"
#include "ad/ops.hpp"
#include "ad/rng.hpp"

namespace ad::nn {

enum class RNNNonlinearity : std::uint8_t { tanh, relu };

struct RNNCellOptions {
  bool bias = true;
  DType dtype = DType::f32;
  RNNNonlinearity nonlinearity = RNNNonlinearity::tanh;  // RNNCell / RNN only
};

// The parameters of one cell, named as PyTorch's *Cell modules name them:
// "weight_ih" [gates * hidden, input], "weight_hh" [gates * hidden, hidden],
// "bias_ih" and "bias_hh" [gates * hidden] (without options.bias: none), all
// ~ U(-k, k) with k = 1/sqrt(hidden). gates: 1 (RNN), 3 (GRU), 4 (LSTM).
// Throws ad::Error for input or hidden < 1 or a dtype other than f32/f64.
class CellParameters : public Module {
 public:
  CellParameters() = default;
  CellParameters(const char* layer, std::int64_t gates, std::int64_t input, std::int64_t hidden, Rng& rng,
                 const RNNCellOptions& options);
  void visit(Visitor& v) const override;
  // x W_ih^T + b_ih and h W_hh^T + b_hh: [B, gates * hidden] each. Throws
  // ad::Error naming `layer` unless x is [B, input] and h [B, hidden].
  Var input_part(const Var& x) const;
  Var hidden_part(const Var& h) const;
  // The common checks of a cell step (x [B, input], h [B, hidden], same
  // batch, the parameters' dtype, one graph), as ad::Errors naming `layer`.
  void check_step(const Var& x, const Var& h, const char* what) const;
  // v has the parameters' dtype, else an ad::Error naming `layer` and `what`.
  void check_operand(const Var& v, const char* what) const;

  const char* layer = "";
  std::int64_t input_size = 0, hidden_size = 0;
  Parameter weight_ih, weight_hh, bias_ih, bias_hh;  // biases undefined without options.bias
};

// h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), act tanh or relu.
class RNNCell : public Module {
 public:
  RNNCell() = default;
  RNNCell(std::int64_t input, std::int64_t hidden, Rng& rng, RNNCellOptions options = {});
  // x [B, input], h [B, hidden] -> h' [B, hidden].
  Var operator()(const Var& x, const Var& h) const;
  void visit(Visitor& v) const override { p.visit(v); }

  RNNNonlinearity nonlinearity = RNNNonlinearity::tanh;
  CellParameters p;
};

// PyTorch's GRU step, gates in the order r, z, n:
//   r = sigmoid(x W_ir^T + b_ir + h W_hr^T + b_hr)
//   z = sigmoid(x W_iz^T + b_iz + h W_hz^T + b_hz)
//   n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn))
//   h' = (1 - z) * n + z * h
class GRUCell : public Module {
 public:
  GRUCell() = default;
  GRUCell(std::int64_t input, std::int64_t hidden, Rng& rng, RNNCellOptions options = {});
  Var operator()(const Var& x, const Var& h) const;
  void visit(Visitor& v) const override { p.visit(v); }

  CellParameters p;
};

// An LSTM state: h and c, [B, hidden] each.
struct LSTMState {
  Var h, c;
};

// PyTorch's LSTM step, gates in the order i, f, g, o:
//   i, f, o = sigmoid(...), g = tanh(...) of x W_i*^T + b_i* + h W_h*^T + b_h*
//   c' = f * c + i * g,  h' = o * tanh(c')
class LSTMCell : public Module {
 public:
  LSTMCell() = default;
  LSTMCell(std::int64_t input, std::int64_t hidden, Rng& rng, RNNCellOptions options = {});
  LSTMState operator()(const Var& x, const LSTMState& state) const;
  void visit(Visitor& v) const override { p.visit(v); }

  CellParameters p;
};

struct RNNOptions {
  std::int64_t num_layers = 1;
  bool bias = true;
  DType dtype = DType::f32;
  RNNNonlinearity nonlinearity = RNNNonlinearity::tanh;  // RNN only
  // A second direction per layer, run from the last step to the first; the
  // output concatenates both ([B, T, 2 hidden]) and a layer above the first
  // reads it. Parameters of the reverse direction end in "_reverse", states
  // are [num_layers * 2, B, hidden] (layer 0 forward, layer 0 reverse, ...),
  // as torch.nn's bidirectional layers have them.
  bool bidirectional = false;
  // > 0: marks every layer's state after every k-th step, and the output,
  // with ad::checkpoint(), for policy::manual() (budget also tries the
  // marks' keep set among its candidates; the other policies ignore marks).
  // The output is marked because it reads every step's state: recomputing
  // it would rerun the whole sequence; bidirectional, so are the per-step
  // outputs of every layer but the last, which the layer above reads at
  // every step (unmarked, manual peaked at 0.9-1.4x keep_all on 2-3 layers).
  std::int64_t checkpoint_every = 0;
};

// What a sequence module returns.
struct RNNResult {
  Var output;  // [B, T, hidden] (bidirectional: [B, T, 2 hidden]): the last layer's state after each step
  Var h;       // [num_layers * directions, B, hidden]: each layer's (and direction's) state after its last step
  Var c;       // LSTM: the cell states, as h; others: undefined
};

enum class CellKind : std::uint8_t { rnn, gru, lstm };

// A stack of num_layers cells of one kind over a batch-first sequence
// x [B, T, input] (layer l > 0 reads layer l - 1's states). Parameters are
// named as torch.nn.RNN / GRU / LSTM name them: "weight_ih_l0",
// "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", ("weight_ih_l0_reverse", ...
// when bidirectional), "weight_ih_l1", ... The initial states h0 (and c0 for
// the LSTM) are [num_layers * directions, B, hidden], zeros when undefined.
// Bidirectional with lengths: each sequence's reverse direction starts at
// its own last step, as with packed sequences.
// Sequences of different lengths in one batch: `lengths` (a tensor, i64
// [B], data known when the graph is built, as PyTorch's packed sequences
// want their lengths on the host) stops sequence b after lengths[b] steps:
// its states stay those of step lengths[b] - 1 (so h and c are each
// sequence's last valid states), its output rows from lengths[b] on are 0,
// and its padding x[b, lengths[b]:] may hold anything, NaN included (masked
// to 0 before any product, so no gradient reads it). Each length must be in
// [0, T], else ad::Error.
// T = 0 is an ad::Error (there is no step to run); so are num_layers < 1, a
// negative checkpoint_every, a wrong x, h0, c0 or lengths shape or dtype, c0
// given to a GRU or RNN, and h0 without c0 (or the reverse) for the LSTM.
class Recurrent : public Module {
 public:
  Recurrent() = default;
  Recurrent(CellKind kind, std::int64_t input, std::int64_t hidden, Rng& rng, RNNOptions options = {});
  RNNResult operator()(const Var& x, const Var& h0 = {}, const Var& c0 = {}, const Tensor& lengths = {}) const;
  void visit(Visitor& v) const override;

  CellKind kind = CellKind::gru;
  std::int64_t input_size = 0, hidden_size = 0, num_layers = 0, checkpoint_every = 0;
  bool bidirectional = false;
  RNNNonlinearity nonlinearity = RNNNonlinearity::tanh;
  // one per layer and direction: layers[l * directions + d]
  std::vector<CellParameters> layers;
};

// The three sequence modules by name (a Recurrent of that kind).
class RNN : public Recurrent {
 public:
  RNN() = default;
  RNN(std::int64_t input, std::int64_t hidden, Rng& rng, RNNOptions options = {})
      : Recurrent(CellKind::rnn, input, hidden, rng, options) {}
};
class GRU : public Recurrent {
 public:
  GRU() = default;
  GRU(std::int64_t input, std::int64_t hidden, Rng& rng, RNNOptions options = {})
      : Recurrent(CellKind::gru, input, hidden, rng, options) {}
};
class LSTM : public Recurrent {
 public:
  LSTM() = default;
  LSTM(std::int64_t input, std::int64_t hidden, Rng& rng, RNNOptions options = {})
      : Recurrent(CellKind::lstm, input, hidden, rng, options) {}
};

}  // namespace ad::nn
