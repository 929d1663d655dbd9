#pragma once
// Models for bench_remat, built from core ops only. Each builds its loss in a
// fresh graph per step (as a training loop does), from fixed data made once.
#include <ad/ad.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace remat_bench {

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  // Builds the step's graph in g and returns the scalar loss.
  // checkpoint_marks: mark block / segment boundaries with ad::checkpoint
  // (read only by policy::manual).
  virtual ad::Var loss(ad::Graph& g, bool checkpoint_marks) const = 0;
  const std::vector<ad::Parameter>& params() const { return params_; }
  void zero_grad() const { for (const auto& p : params_) p.zero_grad(); }

 protected:
  std::vector<ad::Parameter> params_;
};

// depth x (matmul, +bias, tanh) of width `width` on a [batch, width] input; mse
// against a random target. manual marks every mark_every-th layer output.
// residual_every = k > 0: every k-th layer's output adds the output k layers
// before it (a skip connection), so the graph is no chain.
class Mlp : public Model {
 public:
  Mlp(int depth, std::int64_t width, std::int64_t batch, std::uint64_t seed, int mark_every = 8, int residual_every = 0);
  std::string name() const override;
  ad::Var loss(ad::Graph& g, bool checkpoint_marks) const override;
  // bytes of one layer's activation, [batch, width] f32
  std::int64_t activation_bytes() const { return batch_ * width_ * 4; }

 private:
  int depth_, mark_every_, residual_every_;
  std::int64_t width_, batch_;
  std::vector<ad::Parameter> w_, b_;
  ad::Tensor x_, y_;
};

// Pre-norm transformer blocks built from core ops:
//   h = x + W_o concat_h(softmax(Q K^T / sqrt(d) + causal mask) V),
//   Q, K, V = layer_norm(x) W_{q,k,v} + b  (heads by reshape + permute),
//   out = h + W_2 gelu(layer_norm(h) W_1 + b_1) + b_2;
// a final layer_norm and mse against a random target. manual marks each
// block's output.
class Transformer : public Model {
 public:
  Transformer(int blocks, std::int64_t batch, std::int64_t seq, std::int64_t dim, std::int64_t heads,
              std::uint64_t seed);
  std::string name() const override;
  ad::Var loss(ad::Graph& g, bool checkpoint_marks) const override;

 private:
  struct Block {
    ad::Parameter ln1_g, ln1_b, wq, bq, wk, bk, wv, bv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2;
  };
  int blocks_;
  std::int64_t batch_, seq_, dim_, heads_;
  std::vector<Block> bl_;
  ad::Parameter lnf_g_, lnf_b_;
  ad::Tensor x_, y_, mask_;
};

// ---- small graphs for the exact oracle (no view ops; widths vary so values
//      differ in size and matmuls dominate the flops) ----
struct SmallGraph {
  std::string family, name;
  ad::Graph g;
  ad::Var loss;
  std::vector<ad::Parameter> params;
};
// A random DAG of `ops` forward ops (tanh, sigmoid, relu, add, mul, matmul by
// a parameter that changes the width), inputs drawn mostly from recent nodes;
// values nothing reads are projected and summed into the output.
SmallGraph random_dag(int ops, std::uint64_t seed);
// VGG-like: a chain of matmul + relu whose width shrinks (like pooling stages).
SmallGraph vgg_like(const std::vector<std::int64_t>& widths, std::uint64_t seed);
// ResNet-like: h = h + relu(h W_a) W_b, `blocks` times.
SmallGraph resnet_like(int blocks, std::int64_t width, std::uint64_t seed);
// U-Net-like: encoder levels that halve the width, a bottleneck, decoder
// levels that double it back and add the encoder's value (long skips).
SmallGraph unet_like(int levels, std::int64_t width, std::uint64_t seed);

}  // namespace remat_bench
