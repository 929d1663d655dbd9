#pragma once
// Transformer layers as ad::nn modules: multi-head (grouped-query) causal
// self-attention over the fused ad::attention op, a pre-norm block, and a
// decoder-only language model.
#include <cstdint>

#include "ad/attention.hpp"
#include "ad/nn/layers.hpp"
#include "ad/semicrf.hpp"
#include "ad/semiseparable.hpp"

namespace ad::nn {

// [B, T, dim] -> [B, T, dim]: q, k, v projections (k and v with kv_heads
// heads of dim / heads each; grouped-query attention when kv_heads < heads),
// ad::attention (causal, optional per-sequence key lengths), output
// projection. Throws ad::Error unless heads divides dim and kv_heads divides
// heads.
class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention() = default;
  MultiHeadAttention(std::int64_t dim, std::int64_t heads, std::int64_t kv_heads, Rng& rng, bool causal = true,
                     LinearOptions linear = {});
  Var operator()(const Var& x, const Var& key_lengths = {}) const;
  void visit(Visitor& v) const override;

  std::int64_t dim = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = true;
  Linear q, k, v, o;
};

// The block's sequence mixer: causal multi-head attention, or a learned
// causal semiseparable matrix (ad::SemiseparableMixer: T + U V^T learned per
// position, rank `mixer_rank`, at most `max_len` positions) — O(N) instead of
// O(N^2) in the sequence length; causal only (causal = false with it is an
// ad::Error).
enum class Mixer : std::uint8_t { attention, semiseparable };

struct TransformerBlockOptions {
  std::int64_t heads = 4, kv_heads = 4, mlp_hidden = 0;  // mlp_hidden 0: 4 * dim
  Mixer mixer = Mixer::attention;
  std::int64_t mixer_rank = 8, max_len = 0;  // semiseparable mixer only
  bool causal = true;
  // attention and MLP projections ~ N(0, s^2) (GPT-2 style), biases 0; 0: U(+-1/sqrt(in)). The semiseparable
  // mixer keeps its own init (SemiseparableMixer::make: w_in, w_out ~ N(0, 1/dim)), whatever this is.
  double init_stddev = 0.02;
};

// Pre-norm block: x + attn(ln1(x)), then x + W2 gelu(W1 ln2(x)).
class TransformerBlock : public Module {
 public:
  TransformerBlock() = default;
  TransformerBlock(std::int64_t dim, Rng& rng, TransformerBlockOptions options = {});
  Var operator()(const Var& x) const;
  void visit(Visitor& v) const override;

  LayerNorm ln1, ln2;
  MultiHeadAttention attn;           // Mixer::attention
  SemiseparableMixer semiseparable;  // Mixer::semiseparable
  Mixer mixer = Mixer::attention;
  Linear up, down;
};

struct DecoderLMOptions {
  std::int64_t vocab = 0, max_len = 0, dim = 64, layers = 2;
  double embed_init_stddev = 0.02;  // token and position embeddings ~ N(0, s^2)
  TransformerBlockOptions block;
  bool checkpoint_blocks = false;  // mark each block's output with ad::checkpoint (policy::manual)
};

// tokens i64 [B, T] -> logits [B, T, vocab]: token + position embeddings,
// blocks, final layer norm, linear head. Throws ad::Error if T > max_len.
class DecoderLM : public Module {
 public:
  DecoderLM() = default;
  DecoderLM(const DecoderLMOptions& options, Rng& rng);
  Var operator()(Graph& g, const Tensor& tokens) const;
  void visit(Visitor& v) const override;

  DecoderLMOptions options;
  Embedding tok, pos;
  ModuleList<TransformerBlock> blocks;
  LayerNorm ln_f;
  Linear head;
};

// A semi-Markov CRF output layer: features (B, T, F) -> per-position label
// scores (B, T, C) through a linear map, then the segment model of
// ad::semicrf_logz with learned transitions Tr (C, C), duration biases D
// (K, C) and start scores P (C). Lengths are i64 (B); segments use the
// encoding of ad::semicrf_score.
class SemiCRFHead : public Module {
 public:
  SemiCRFHead() = default;
  SemiCRFHead(std::int64_t features, std::int64_t labels, std::int64_t max_duration, Rng& rng);
  // Mean over the batch of logZ - score(segments) (>= 0): the negative log-likelihood.
  Var nll(const Var& features, const Var& lengths, const Var& segments) const;
  // The best segmentation, i64 (B, T).
  Var decode(const Var& features, const Var& lengths) const;
  // P(position t in a segment of label c), (B, T, C).
  Var marginals(const Var& features, const Var& lengths) const;
  void visit(Visitor& v) const override;

  std::int64_t labels = 0, max_duration = 0;
  Linear emission;
  Parameter transitions, durations, start;

 private:
  Var cumulative(const Var& features, const Var& lengths) const;
};

}  // namespace ad::nn
