#include "ad/nn/layers.hpp"
#include "core/graph_impl.hpp"
#include "nn/layer_checks.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cmath>

namespace ad::nn {

using detail::check_dtype;
using detail::check_positive;

Var activate(const Var& x, Activation a) {
  switch (a) {
    case Activation::none: return x;
    case Activation::relu: return relu(x);
    case Activation::gelu: return gelu(x);
    case Activation::tanh: return ad::tanh(x);
    case Activation::silu: return silu(x);
    case Activation::sigmoid: return sigmoid(x);
  }
  return x;
}
const char* activation_name(Activation a) {
  switch (a) {
    case Activation::none: return "none";
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::tanh: return "tanh";
    case Activation::silu: return "silu";
    case Activation::sigmoid: return "sigmoid";
  }
  return "?";
}

// ---- Linear ----
// x [..., in] x W[out, in]^T + b[out] -> [..., out]
Linear::Linear(std::int64_t in, std::int64_t out, Rng& rng, LinearOptions o) : in_features(in), out_features(out) {
  check_positive("Linear", "in_features", in);
  check_positive("Linear", "out_features", out);
  check_dtype("Linear", o.dtype);
  if (!(o.init_stddev >= 0) || !std::isfinite(o.init_stddev))
    throw Error(fmt::format("Linear: init_stddev must be finite and >= 0 (0: uniform init), got {}", o.init_stddev));
  if (o.init_stddev > 0) {
    weight = Parameter(Tensor::randn({out, in}, rng, o.dtype, 0.0, o.init_stddev), "weight");
    if (o.bias) bias = Parameter(Tensor::zeros({out}, o.dtype), "bias");
  } else {
    double k = 1.0 / std::sqrt(static_cast<double>(in));
    weight = Parameter(Tensor::uniform({out, in}, rng, o.dtype, -k, k), "weight");
    if (o.bias) bias = Parameter(Tensor::uniform({out}, rng, o.dtype, -k, k), "bias");
  }
}
Var Linear::operator()(const Var& x) const {
  if (!weight.defined()) throw Error("Linear: use of a default-constructed layer");
  // a single vector [in] is a batch of one row for matmul (rank >= 2), and back
  const bool vec = x.defined() && x.rank() == 1;
  Var y = matmul(vec ? reshape(x, Shape{1, x.shape()[0]}) : x, weight, false, true);
  if (vec) y = reshape(y, Shape{out_features});
  return bias.defined() ? add(y, bias) : y;
}
namespace {
void check_conv_options(const char* layer, const Conv2dOptions& c) {
  for (std::size_t i = 0; i < 2; ++i)
    if (c.stride[i] < 1 || c.dilation[i] < 1 || c.padding[i] < 0)
      throw Error(fmt::format("{}: stride and dilation must be >= 1 and padding >= 0, got stride ({}, {}), padding "
                              "({}, {}), dilation ({}, {})",
                              layer, c.stride[0], c.stride[1], c.padding[0], c.padding[1], c.dilation[0],
                              c.dilation[1]));
}
// The checks and parameters both conv layers share: weight [in, out/g, kh,
// kw] (transposed) or [out, in/g, kh, kw] ~ U(-k, k), k = 1/sqrt(fan_in),
// fan_in = weight dim 1 * kh * kw (PyTorch's), and bias [out].
void init_conv(const char* layer, std::int64_t in, std::int64_t out, std::array<std::int64_t, 2> kernel, Rng& rng,
               const Conv2dLayerOptions& o, bool transposed, Parameter& weight, Parameter& bias) {
  check_positive(layer, "in_channels", in);
  check_positive(layer, "out_channels", out);
  check_positive(layer, "kernel height", kernel[0]);
  check_positive(layer, "kernel width", kernel[1]);
  check_positive(layer, "groups", o.conv.groups);
  check_conv_options(layer, o.conv);
  check_dtype(layer, o.dtype);
  if (in % o.conv.groups != 0 || out % o.conv.groups != 0)
    throw Error(fmt::format("{}: groups ({}) must divide in_channels ({}) and out_channels ({})", layer, o.conv.groups,
                            in, out));
  const Shape ws = transposed ? Shape{in, out / o.conv.groups, kernel[0], kernel[1]}
                              : Shape{out, in / o.conv.groups, kernel[0], kernel[1]};
  const double k = 1.0 / std::sqrt(static_cast<double>(ws[1] * kernel[0] * kernel[1]));
  weight = Parameter(Tensor::uniform(ws, rng, o.dtype, -k, k), "weight");
  if (o.bias) bias = Parameter(Tensor::uniform({out}, rng, o.dtype, -k, k), "bias");
}
}  // namespace
Conv2d::Conv2d(std::int64_t in, std::int64_t out, std::array<std::int64_t, 2> kernel, Rng& rng, Conv2dLayerOptions o)
    : in_channels(in), out_channels(out), conv(o.conv) {
  init_conv("Conv2d", in, out, kernel, rng, o, false, weight, bias);
}
Var Conv2d::operator()(const Var& x) const {
  if (!weight.defined()) throw Error("Conv2d: use of a default-constructed layer");
  Var y = conv2d(x, weight, conv);
  if (!bias.defined()) return y;
  return add(y, reshape(operand_var(bias, y), Shape{out_channels, 1, 1}));  // [out] over every position
}
void Conv2d::visit(Visitor& v) const {
  v.parameter("weight", weight);
  v.parameter("bias", bias);
}
Conv1d::Conv1d(std::int64_t in, std::int64_t out, std::int64_t kernel, Rng& rng, Conv1dLayerOptions o)
    : in_channels(in), out_channels(out), conv(o.conv) {
  Conv2dLayerOptions c2;  // the same checks and init as a conv2d over rows of height 1
  c2.conv.stride = {1, o.conv.stride};
  c2.conv.padding = {0, o.conv.padding};
  c2.conv.dilation = {1, o.conv.dilation};
  c2.conv.groups = o.conv.groups;
  c2.bias = o.bias;
  c2.dtype = o.dtype;
  Parameter w4;
  init_conv("Conv1d", in, out, {1, kernel}, rng, c2, false, w4, bias);
  weight = Parameter(w4.value().reshape({out, in / o.conv.groups, kernel}), "weight");
}
Var Conv1d::operator()(const Var& x) const {
  if (!weight.defined()) throw Error("Conv1d: use of a default-constructed layer");
  Var y = conv1d(x, weight, conv);
  return bias.defined() ? add(y, reshape(operand_var(bias, y), Shape{out_channels, 1})) : y;
}
void Conv1d::visit(Visitor& v) const {
  v.parameter("weight", weight);
  v.parameter("bias", bias);
}
ConvTranspose2d::ConvTranspose2d(std::int64_t in, std::int64_t out, std::array<std::int64_t, 2> kernel, Rng& rng,
                                 Conv2dLayerOptions o, std::array<std::int64_t, 2> op)
    : in_channels(in), out_channels(out), conv(o.conv), output_padding(op) {
  init_conv("ConvTranspose2d", in, out, kernel, rng, o, true, weight, bias);
}
Var ConvTranspose2d::operator()(const Var& x) const {
  if (!weight.defined()) throw Error("ConvTranspose2d: use of a default-constructed layer");
  Var y = conv_transpose2d(x, weight, conv, output_padding);
  return bias.defined() ? add(y, reshape(operand_var(bias, y), Shape{out_channels, 1, 1})) : y;
}
void ConvTranspose2d::visit(Visitor& v) const {
  v.parameter("weight", weight);
  v.parameter("bias", bias);
}
void Linear::visit(Visitor& v) const {
  v.parameter("weight", weight);
  v.parameter("bias", bias);
}

// ---- Embedding ----
// weight [num, dim], ids [...] -> [..., dim]
Embedding::Embedding(std::int64_t n, std::int64_t d, Rng& rng, EmbeddingOptions o) : num(n), dim(d) {
  check_positive("Embedding", "num", n);
  check_positive("Embedding", "dim", d);
  check_dtype("Embedding", o.dtype);
  if (!(o.init_stddev >= 0) || !std::isfinite(o.init_stddev))
    throw Error(fmt::format("Embedding: init_stddev must be finite and >= 0, got {}", o.init_stddev));
  weight = Parameter(Tensor::randn({n, d}, rng, o.dtype, 0.0, o.init_stddev), "weight");
}
Var Embedding::operator()(const Var& ids) const {
  if (!weight.defined()) throw Error("Embedding: use of a default-constructed layer");
  return embedding(weight, ids);
}
void Embedding::visit(Visitor& v) const { v.parameter("weight", weight); }

// ---- LayerNorm ----
LayerNorm::LayerNorm(std::int64_t d, double e, DType dtype) : dim(d), eps(e) {
  check_positive("LayerNorm", "dim", d);
  check_dtype("LayerNorm", dtype);
  weight = Parameter(Tensor::ones({d}, dtype), "weight");
  bias = Parameter(Tensor::zeros({d}, dtype), "bias");
}
Var LayerNorm::operator()(const Var& x) const {
  if (!weight.defined()) throw Error("LayerNorm: use of a default-constructed layer");
  return layer_norm(x, weight, bias, eps);
}
void LayerNorm::visit(Visitor& v) const {
  v.parameter("weight", weight);
  v.parameter("bias", bias);
}

// ---- GroupNorm ----
GroupNorm::GroupNorm(std::int64_t g, std::int64_t c, double e, DType dtype) : groups(g), channels(c), eps(e) {
  check_positive("GroupNorm", "groups", g);
  check_positive("GroupNorm", "channels", c);
  check_dtype("GroupNorm", dtype);
  if (c % g != 0) throw Error(fmt::format("GroupNorm: groups ({}) must divide channels ({})", g, c));
  weight = Parameter(Tensor::ones({c}, dtype), "weight");
  bias = Parameter(Tensor::zeros({c}, dtype), "bias");
}
Var GroupNorm::operator()(const Var& x) const {
  if (!weight.defined()) throw Error("GroupNorm: use of a default-constructed layer");
  if (x.defined() && x.rank() >= 2 && x.dim(1) != channels)
    throw Error(fmt::format("GroupNorm: x {} has {} channels (dim 1), the layer {}", x.shape().str(), x.dim(1), channels));
  return group_norm(x, groups, weight, bias, eps);
}
void GroupNorm::visit(Visitor& v) const {
  v.parameter("weight", weight);
  v.parameter("bias", bias);
}

// ---- RMSNorm ----
RMSNorm::RMSNorm(std::int64_t d, double e, DType dtype) : dim(d), eps(e) {
  check_positive("RMSNorm", "dim", d);
  check_dtype("RMSNorm", dtype);
  weight = Parameter(Tensor::ones({d}, dtype), "weight");
}
Var RMSNorm::operator()(const Var& x) const {
  if (!weight.defined()) throw Error("RMSNorm: use of a default-constructed layer");
  return rms_norm(x, weight, eps);
}
void RMSNorm::visit(Visitor& v) const { v.parameter("weight", weight); }

// ---- Dropout ----
// The stream's seed is two draws of rng, so dropout layers made from one rng
// get distinct streams.
Dropout::Dropout(double prob, Rng& rng) : p(prob) {
  if (!(prob >= 0.0 && prob < 1.0)) throw Error(fmt::format("Dropout: p must be in [0, 1), got {}", prob));
  std::uint64_t o = rng.reserve(2);
  std::uint64_t seed = (static_cast<std::uint64_t>(philox_u32(rng.seed(), o)) << 32) | philox_u32(rng.seed(), o + 1);
  rng_state = Tensor::zeros({2}, DType::i64);
  rng_state.data<std::int64_t>()[0] = static_cast<std::int64_t>(seed);
}
Var Dropout::operator()(const Var& x) const {
  if (!is_training() || p == 0.0) return x;
  if (!rng_state.defined()) throw Error("Dropout: use of a default-constructed layer");
  Tensor s = rng_state;  // shares the buffer: the offset advances for every copy
  std::int64_t* st = s.data<std::int64_t>();
  // The range is reserved atomically (as Rng::reserve, before the node is
  // built): graphs built on several threads from one model each draw their
  // own mask. A plain read and write gave two calls one offset (the same
  // mask) about one time in six when they met.
  const auto offset = static_cast<std::uint64_t>(std::atomic_ref<std::int64_t>(st[1]).fetch_add(x.numel()));
  return dropout(x, p, static_cast<std::uint64_t>(st[0]), offset);
}
void Dropout::visit(Visitor& v) const { v.buffer("rng_state", rng_state); }

// ---- MLP ----
MLP::MLP(const std::vector<std::int64_t>& sizes, Rng& rng, MLPOptions o) : activation(o.activation) {
  if (sizes.size() < 2) throw Error(fmt::format("MLP: needs at least two sizes (in and out), got {}", sizes.size()));
  if (!(o.dropout >= 0.0 && o.dropout < 1.0))
    throw Error(fmt::format("MLP: dropout must be in [0, 1), got {}", o.dropout));
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) layers.push_back(Linear(sizes[i], sizes[i + 1], rng, o.linear));
  if (o.dropout > 0) dropout = Dropout(o.dropout, rng);
}
Var MLP::operator()(const Var& x) const {
  if (layers.empty()) throw Error("MLP: use of a default-constructed layer");
  Var h = x;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    h = layers[i](h);
    if (i + 1 < layers.size()) {
      h = activate(h, activation);
      if (dropout.p > 0) h = dropout(h);
    }
  }
  return h;
}
void MLP::visit(Visitor& v) const {
  v.module("layers", layers);
  if (dropout.p > 0) v.module("dropout", dropout);
}

}  // namespace ad::nn
