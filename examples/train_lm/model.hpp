#pragma once
// A small decoder-only transformer built from ad's public ops: token and
// position embeddings, pre-norm blocks (x + mixer(norm(x)), x + mlp(norm(x))),
// a final norm and an LM head. Self-contained (public API only) so it can move
// into an ad::nn library as is. The sequence mixer is pluggable: a Mixer maps
// [B, T, D] -> [B, T, D] causally; make_mixer() picks one by name.
#include <ad/ad.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace lm {

struct Config {
  std::int64_t vocab = 0, max_len = 0;  // tokens, positions
  std::int64_t dim = 64, heads = 4, kv_heads = 4, layers = 2, mlp_hidden = 256;
  std::string mixer = "attention";
};

// Collects the parameters of the layers, in creation order.
struct ParamList {
  std::vector<ad::Parameter> all;
  ad::Parameter add(ad::Parameter p) {
    all.push_back(p);
    return p;
  }
};

// y = x W + b: x [..., in], W [in, out], b [out].
struct Linear {
  ad::Parameter w, b;
  Linear() = default;
  Linear(std::int64_t in, std::int64_t out, ad::Rng& rng, ParamList& ps, const std::string& name, double gain = 1.0) {
    w = ps.add(ad::Parameter::randn({in, out}, rng, gain / std::sqrt(static_cast<double>(in)), ad::DType::f32, name + ".w"));
    b = ps.add(ad::Parameter::zeros({out}, ad::DType::f32, name + ".b"));
  }
  ad::Var operator()(const ad::Var& x) const { return ad::add(ad::matmul(x, w), b); }
};

// layer_norm over the last dim with gain and bias.
struct Norm {
  ad::Parameter gamma, beta;
  Norm() = default;
  Norm(std::int64_t dim, ParamList& ps, const std::string& name) {
    gamma = ps.add(ad::Parameter::zeros({dim}, ad::DType::f32, name + ".gamma"));
    gamma.value().fill(1.0);
    beta = ps.add(ad::Parameter::zeros({dim}, ad::DType::f32, name + ".beta"));
  }
  ad::Var operator()(const ad::Var& x) const { return ad::layer_norm(x, gamma, beta); }
};

// A causal sequence mixer: [B, T, D] -> [B, T, D].
class Mixer {
 public:
  virtual ~Mixer() = default;
  virtual ad::Var operator()(const ad::Var& x) const = 0;
};

// Multi-head causal self-attention through ad::attention (grouped-query when
// kv_heads < heads): q, k, v projections, the fused attention op, output
// projection.
class AttentionMixer : public Mixer {
 public:
  AttentionMixer(const Config& c, ad::Rng& rng, ParamList& ps, const std::string& name)
      : heads_(c.heads), kv_heads_(c.kv_heads), head_dim_(c.dim / c.heads) {
    if (c.dim % c.heads != 0 || c.heads % c.kv_heads != 0)
      throw ad::Error(fmt::format("AttentionMixer: dim {} must be a multiple of heads {}, and heads of kv_heads {}",
                                  c.dim, c.heads, c.kv_heads));
    q_ = Linear(c.dim, c.dim, rng, ps, name + ".q");
    k_ = Linear(c.dim, kv_heads_ * head_dim_, rng, ps, name + ".k");
    v_ = Linear(c.dim, kv_heads_ * head_dim_, rng, ps, name + ".v");
    o_ = Linear(c.dim, c.dim, rng, ps, name + ".o", 0.5);
  }
  ad::Var operator()(const ad::Var& x) const override {
    const std::int64_t B = x.dim(0), T = x.dim(1);
    // [B, T, h * dh] -> [B, h, T, dh]
    auto heads = [&](const ad::Var& y, std::int64_t h) { return ad::permute(ad::reshape(y, {B, T, h, head_dim_}), {0, 2, 1, 3}); };
    ad::AttentionOptions opt;
    opt.causal = true;
    ad::Var a = ad::attention(heads(q_(x), heads_), heads(k_(x), kv_heads_), heads(v_(x), kv_heads_), opt);
    return o_(ad::reshape(ad::permute(a, {0, 2, 1, 3}), {B, T, heads_ * head_dim_}));
  }

 private:
  std::int64_t heads_, kv_heads_, head_dim_;
  Linear q_, k_, v_, o_;
};

// Builds the mixer named by c.mixer ("attention"); throws ad::Error for an unknown name.
inline std::unique_ptr<Mixer> make_mixer(const Config& c, ad::Rng& rng, ParamList& ps, const std::string& name) {
  if (c.mixer == "attention") return std::make_unique<AttentionMixer>(c, rng, ps, name);
  throw ad::Error(fmt::format("unknown mixer '{}' (known: attention)", c.mixer));
}

// x + mixer(norm(x)), then x + W2 gelu(W1 norm(x)).
struct Block {
  Norm n1, n2;
  std::unique_ptr<Mixer> mixer;
  Linear up, down;
  Block(const Config& c, ad::Rng& rng, ParamList& ps, const std::string& name)
      : n1(c.dim, ps, name + ".n1"), n2(c.dim, ps, name + ".n2"), mixer(make_mixer(c, rng, ps, name + ".mix")),
        up(c.dim, c.mlp_hidden, rng, ps, name + ".up"), down(c.mlp_hidden, c.dim, rng, ps, name + ".down", 0.5) {}
  ad::Var operator()(ad::Var x) const {
    x = ad::add(x, (*mixer)(n1(x)));
    return ad::add(x, down(ad::gelu(up(n2(x)))));
  }
};

// tokens i64 [B, T] -> logits [B, T, vocab].
struct DecoderLM {
  Config cfg;
  ParamList params;
  ad::Parameter tok, pos;
  std::vector<std::unique_ptr<Block>> blocks;
  Norm final_norm;
  Linear head;
  // checkpoint_blocks: mark each block's output with ad::checkpoint (for policy::manual)
  bool checkpoint_blocks = false;

  DecoderLM(const Config& c, ad::Rng& rng) : cfg(c) {
    tok = params.add(ad::Parameter::randn({c.vocab, c.dim}, rng, 0.5, ad::DType::f32, "tok"));
    pos = params.add(ad::Parameter::randn({c.max_len, c.dim}, rng, 0.5, ad::DType::f32, "pos"));
    for (std::int64_t l = 0; l < c.layers; ++l)
      blocks.push_back(std::make_unique<Block>(c, rng, params, fmt::format("block{}", l)));
    final_norm = Norm(c.dim, params, "final");
    head = Linear(c.dim, c.vocab, rng, params, "head");
  }
  ad::Var operator()(ad::Graph& g, const ad::Tensor& tokens) const {
    const std::int64_t T = tokens.dim(1);
    if (T > cfg.max_len) throw ad::Error(fmt::format("DecoderLM: {} tokens exceed max_len {}", T, cfg.max_len));
    ad::Var x = ad::embedding(tok, g.input(tokens));                 // [B, T, D]
    x = ad::add(x, ad::slice(g.param(pos), 0, 0, T));                // + positions [T, D]
    for (const auto& b : blocks) {
      x = (*b)(x);
      if (checkpoint_blocks) x = ad::checkpoint(x);
    }
    return head(final_norm(x));
  }
};

}  // namespace lm
