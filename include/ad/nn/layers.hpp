#pragma once
// Basic layers: Linear, Conv1d, Conv2d, ConvTranspose2d, Embedding, LayerNorm, GroupNorm, RMSNorm, Dropout, MLP.
// Each builds its output from ad ops (so autodiff and rematerialisation see
// ordinary nodes) and initialises its parameters from an ad::Rng; the same
// seed gives the same parameters, bit for bit. Parameter dtype: f32 or f64.
#include <cstdint>
#include <vector>

#include "ad/conv.hpp"
#include "ad/nn/module.hpp"
#include "ad/ops.hpp"
#include "ad/rng.hpp"

namespace ad::nn {

enum class Activation : std::uint8_t { none, relu, gelu, tanh, silu, sigmoid };
// Applies the activation (none: x itself).
Var activate(const Var& x, Activation a);
const char* activation_name(Activation a);

struct LinearOptions {
  bool bias = true;
  DType dtype = DType::f32;
  // 0: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's default,
  // Kaiming-uniform with a = sqrt(5)). > 0: weight ~ N(0, init_stddev^2),
  // bias = 0 (GPT-2 style, e.g. 0.02).
  double init_stddev = 0;
};

// y = x W^T + b. Parameters "weight" [out, in] (PyTorch's layout, so
// safetensors files interchange) and "bias" [out].
// x [..., in] -> [..., out], a single vector [in] included; throws ad::Error
// (from matmul) if x's last dim is not `in`.
class Linear : public Module {
 public:
  Linear() = default;
  Linear(std::int64_t in_features, std::int64_t out_features, Rng& rng, LinearOptions options = {});
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  std::int64_t in_features = 0, out_features = 0;
  Parameter weight, bias;  // bias undefined without options.bias
};

struct Conv2dLayerOptions {
  Conv2dOptions conv;  // stride, padding, dilation, groups
  bool bias = true;
  DType dtype = DType::f32;
};

// y = conv2d(x, W) + b (include/ad/conv.hpp). Parameters "weight" [out,
// in/groups, kh, kw] and "bias" [out] (PyTorch's layout), both ~ U(-k, k)
// with k = 1/sqrt(in/groups * kh * kw) (PyTorch's default).
// x [N, in, H, W] -> [N, out, HO, WO]; throws ad::Error (from conv2d) on a
// shape mismatch, and here when groups does not divide in and out.
class Conv2d : public Module {
 public:
  Conv2d() = default;
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::array<std::int64_t, 2> kernel, Rng& rng,
         Conv2dLayerOptions options = {});
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  std::int64_t in_channels = 0, out_channels = 0;
  Conv2dOptions conv;
  Parameter weight, bias;  // bias undefined without options.bias
};

struct Conv1dLayerOptions {
  Conv1dOptions conv;  // stride, padding, dilation, groups
  bool bias = true;
  DType dtype = DType::f32;
};

// y = conv1d(x, W) + b over sequences: "weight" [out, in/groups, k], "bias"
// [out], init as Conv2d. x [N, in, L] -> [N, out, LO].
class Conv1d : public Module {
 public:
  Conv1d() = default;
  Conv1d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, Rng& rng,
         Conv1dLayerOptions options = {});
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  std::int64_t in_channels = 0, out_channels = 0;
  Conv1dOptions conv;
  Parameter weight, bias;  // bias undefined without options.bias
};

// y = conv_transpose2d(x, W) + b (include/ad/conv.hpp): "weight" [in,
// out/groups, kh, kw] and "bias" [out] (PyTorch's ConvTranspose2d layout and
// init bounds, k = 1/sqrt(out/groups * kh * kw)). x [N, in, H, W] ->
// [N, out, (H - 1) s - 2 p + d (kh - 1) + 1 + output_padding, ...].
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d() = default;
  ConvTranspose2d(std::int64_t in_channels, std::int64_t out_channels, std::array<std::int64_t, 2> kernel, Rng& rng,
                  Conv2dLayerOptions options = {}, std::array<std::int64_t, 2> output_padding = {0, 0});
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  std::int64_t in_channels = 0, out_channels = 0;
  Conv2dOptions conv;
  std::array<std::int64_t, 2> output_padding{0, 0};
  Parameter weight, bias;  // bias undefined without options.bias
};

struct EmbeddingOptions {
  DType dtype = DType::f32;
  double init_stddev = 1.0;  // weight ~ N(0, init_stddev^2) (PyTorch's default: 1)
};

// Lookup table "weight" [num, dim]: ids i64 [...] -> [..., dim]. Ids out of
// range throw ad::Error when the node is computed.
class Embedding : public Module {
 public:
  Embedding() = default;
  Embedding(std::int64_t num, std::int64_t dim, Rng& rng, EmbeddingOptions options = {});
  Var operator()(const Var& ids) const;
  void visit(Visitor& v) const override;

  std::int64_t num = 0, dim = 0;
  Parameter weight;
};

// (x - mean) / sqrt(var + eps) * weight + bias over the last dim.
// "weight" [dim] = 1, "bias" [dim] = 0. x [..., dim] -> [..., dim].
class LayerNorm : public Module {
 public:
  LayerNorm() = default;
  explicit LayerNorm(std::int64_t dim, double eps = 1e-5, DType dtype = DType::f32);
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  std::int64_t dim = 0;
  double eps = 1e-5;
  Parameter weight, bias;
};

// group_norm (ad/ops.hpp) over x [N, channels, ...]: "weight" [channels] = 1,
// "bias" [channels] = 0. The norm for small batches (no batch statistics).
class GroupNorm : public Module {
 public:
  GroupNorm() = default;
  GroupNorm(std::int64_t groups, std::int64_t channels, double eps = 1e-5, DType dtype = DType::f32);
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  std::int64_t groups = 0, channels = 0;
  double eps = 1e-5;
  Parameter weight, bias;
};

// x / sqrt(mean(x^2) + eps) * weight over the last dim; "weight" [dim] = 1.
class RMSNorm : public Module {
 public:
  RMSNorm() = default;
  explicit RMSNorm(std::int64_t dim, double eps = 1e-6, DType dtype = DType::f32);
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  std::int64_t dim = 0;
  double eps = 1e-6;
  Parameter weight;
};

// Zeroes each element with probability p and scales the rest by 1/(1-p) in
// training mode; the identity in evaluation mode or when p = 0. Owns a
// random stream (seed drawn from `rng` at construction), kept in the buffer
// "rng_state" (i64 [2]: seed, offset) so a saved and restored model draws
// the same masks. Each training-mode call reserves numel(x) counters, at
// once (atomically): graphs built on several threads from one model each
// draw their own mask, in the order the calls reach the layer.
// Throws ad::Error unless 0 <= p < 1.
class Dropout : public Module {
 public:
  Dropout() = default;
  Dropout(double p, Rng& rng);
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  double p = 0;
  Tensor rng_state;  // i64 [2]: seed, next offset
};

struct MLPOptions {
  Activation activation = Activation::relu;  // between layers, not after the last
  double dropout = 0;                        // after each activation (training mode); in [0, 1)
  LinearOptions linear;
};

// Linear layers sizes[0] -> sizes[1] -> ... -> sizes.back(), named
// "layers.0", "layers.1", ...; activation (and dropout) between layers.
// Throws ad::Error with fewer than two sizes.
class MLP : public Module {
 public:
  MLP() = default;
  MLP(const std::vector<std::int64_t>& sizes, Rng& rng, MLPOptions options = {});
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  Activation activation = Activation::relu;
  ModuleList<Linear> layers;
  Dropout dropout;
};

}  // namespace ad::nn
