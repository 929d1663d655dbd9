// Transformer layers: multi-head attention over ad::attention, the pre-norm
// block and a decoder-only LM.
#include "ad/nn/transformer.hpp"

#include <fmt/format.h>

#include <cmath>

#include "ad/error.hpp"
#include "ad/policy.hpp"

namespace ad::nn {

// ---- MultiHeadAttention ----
MultiHeadAttention::MultiHeadAttention(std::int64_t d, std::int64_t h, std::int64_t kvh, Rng& rng, bool c,
                                       LinearOptions linear)
    : dim(d), heads(h), kv_heads(kvh), causal(c) {
  if (h < 1 || kvh < 1)
    throw Error(fmt::format("MultiHeadAttention: heads {} and kv_heads {} must be >= 1", h, kvh));
  if (d % h != 0) throw Error(fmt::format("MultiHeadAttention: dim {} must be a multiple of heads {}", d, h));
  if (h % kvh != 0)
    throw Error(fmt::format("MultiHeadAttention: heads {} must be a multiple of kv_heads {} (grouped-query attention)",
                            h, kvh));
  head_dim = d / h;
  q = Linear(d, d, rng, linear);
  k = Linear(d, kvh * head_dim, rng, linear);
  v = Linear(d, kvh * head_dim, rng, linear);
  o = Linear(d, d, rng, linear);
}
// [B, T, h * dh] -> [B, h, T, dh] for the op, and back
Var MultiHeadAttention::operator()(const Var& x, const Var& key_lengths) const {
  if (x.rank() != 3 || x.dim(2) != dim)
    throw Error(fmt::format("MultiHeadAttention: input {} is not [B, T, {}]", x.str(), dim));
  const std::int64_t B = x.dim(0), T = x.dim(1);
  auto split = [&](const Var& y, std::int64_t n) { return permute(reshape(y, {B, T, n, head_dim}), {0, 2, 1, 3}); };
  AttentionOptions opt;
  opt.causal = causal;
  opt.key_lengths = key_lengths;
  Var a = attention(split(q(x), heads), split(k(x), kv_heads), split(v(x), kv_heads), opt);
  return o(reshape(permute(a, {0, 2, 1, 3}), {B, T, dim}));
}
void MultiHeadAttention::visit(Visitor& vis) const {
  vis.module("q", q);
  vis.module("k", k);
  vis.module("v", v);
  vis.module("o", o);
}

// ---- TransformerBlock ----
TransformerBlock::TransformerBlock(std::int64_t dim, Rng& rng, TransformerBlockOptions opt)
    : ln1(dim), ln2(dim) {
  LinearOptions lin;
  lin.init_stddev = opt.init_stddev;
  mixer = opt.mixer;
  if (mixer == Mixer::attention) {
    attn = MultiHeadAttention(dim, opt.heads, opt.kv_heads, rng, opt.causal, lin);
  } else {
    if (!opt.causal) throw Error("TransformerBlock: the semiseparable mixer is causal only");
    semiseparable = SemiseparableMixer::make(opt.max_len, dim, opt.mixer_rank, rng);
  }
  if (opt.mlp_hidden < 0) throw Error(fmt::format("TransformerBlock: mlp_hidden must be >= 0 (0: 4 * dim), got {}", opt.mlp_hidden));
  std::int64_t hidden = opt.mlp_hidden > 0 ? opt.mlp_hidden : 4 * dim;
  up = Linear(dim, hidden, rng, lin);
  down = Linear(hidden, dim, rng, lin);
}
Var TransformerBlock::operator()(const Var& x) const {
  Var h = add(x, mixer == Mixer::attention ? attn(ln1(x)) : semiseparable(ln1(x)));
  return add(h, down(gelu(up(ln2(h)))));
}
void TransformerBlock::visit(Visitor& v) const {
  v.module("ln1", ln1);
  if (mixer == Mixer::attention) {
    v.module("attn", attn);
  } else {
    v.parameter("mix.t_diag", semiseparable.t_diag);
    v.parameter("mix.t_lower", semiseparable.t_lower);
    v.parameter("mix.u", semiseparable.u);
    v.parameter("mix.v", semiseparable.v);
    v.parameter("mix.w_in", semiseparable.w_in);
    v.parameter("mix.w_out", semiseparable.w_out);
  }
  v.module("ln2", ln2);
  v.module("up", up);
  v.module("down", down);
}

// ---- DecoderLM ----
DecoderLM::DecoderLM(const DecoderLMOptions& o, Rng& rng) : options(o), ln_f(o.dim) {
  if (o.vocab < 1 || o.max_len < 1 || o.dim < 1 || o.layers < 0)
    throw Error(fmt::format("DecoderLM: vocab {}, max_len {}, dim {}, layers {}", o.vocab, o.max_len, o.dim, o.layers));
  EmbeddingOptions emb;
  emb.init_stddev = o.embed_init_stddev;
  tok = Embedding(o.vocab, o.dim, rng, emb);
  pos = Embedding(o.max_len, o.dim, rng, emb);
  TransformerBlockOptions bo = o.block;
  if (bo.max_len == 0) bo.max_len = o.max_len;
  for (std::int64_t l = 0; l < o.layers; ++l) blocks.push_back(TransformerBlock(o.dim, rng, bo));
  LinearOptions lin;
  lin.init_stddev = o.block.init_stddev;
  head = Linear(o.dim, o.vocab, rng, lin);
}
Var DecoderLM::operator()(Graph& g, const Tensor& tokens) const {
  if (tokens.rank() != 2 || tokens.dtype() != DType::i64)
    throw Error(fmt::format("DecoderLM: tokens must be i64 [B, T], got {}{}", dtype_name(tokens.dtype()),
                            tokens.shape().str()));
  const std::int64_t T = tokens.dim(1);
  if (T > options.max_len) throw Error(fmt::format("DecoderLM: {} tokens exceed max_len {}", T, options.max_len));
  Var x = tok(g.input(tokens));                                    // [B, T, D]
  x = add(x, slice(g.param(pos.weight), 0, 0, T));                 // + positions [T, D]
  for (const auto& b : blocks) {
    x = b(x);
    if (options.checkpoint_blocks) x = checkpoint(x);
  }
  return head(ln_f(x));
}
void DecoderLM::visit(Visitor& v) const {
  v.module("tok", tok);
  v.module("pos", pos);
  v.module("blocks", blocks);
  v.module("ln_f", ln_f);
  v.module("head", head);
}

// ---- SemiCRFHead ----
SemiCRFHead::SemiCRFHead(std::int64_t features, std::int64_t c, std::int64_t k, Rng& rng)
    : labels(c), max_duration(k) {
  if (features < 1 || c < 1 || k < 1)
    throw Error(fmt::format("SemiCRFHead: features {}, labels {}, max_duration {} must be >= 1", features, c, k));
  emission = Linear(features, c, rng);
  transitions = Parameter::zeros({c, c}, DType::f32, "transitions");
  durations = Parameter::zeros({k, c}, DType::f32, "durations");
  start = Parameter::zeros({c}, DType::f32, "start");
}
Var SemiCRFHead::cumulative(const Var& features, const Var& lengths) const {
  return semicrf_cumulative(emission(features), lengths);  // padding past a length does not shift the sums
}
Var SemiCRFHead::nll(const Var& features, const Var& lengths, const Var& segments) const {
  Var s = cumulative(features, lengths);
  return mean(sub(semicrf_logz(s, transitions, durations, start, lengths),
                  semicrf_score(s, transitions, durations, start, lengths, segments)));
}
Var SemiCRFHead::decode(const Var& features, const Var& lengths) const {
  return semicrf_viterbi(cumulative(features, lengths), transitions, durations, start, lengths);
}
Var SemiCRFHead::marginals(const Var& features, const Var& lengths) const {
  return semicrf_marginals(cumulative(features, lengths), transitions, durations, start, lengths);
}
void SemiCRFHead::visit(Visitor& v) const {
  v.module("emission", emission);
  v.parameter("transitions", transitions);
  v.parameter("durations", durations);
  v.parameter("start", start);
}

}  // namespace ad::nn
