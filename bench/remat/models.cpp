#include "models.hpp"

#include <cmath>
#include <random>

namespace remat_bench {

Mlp::Mlp(int depth, std::int64_t width, std::int64_t batch, std::uint64_t seed, int mark_every, int residual_every)
    : depth_(depth), mark_every_(mark_every), residual_every_(residual_every), width_(width), batch_(batch) {
  ad::Rng rng(seed);
  for (int i = 0; i < depth; ++i) {
    w_.push_back(ad::Parameter::randn({width, width}, rng, 1.0 / std::sqrt(double(width))));
    b_.push_back(ad::Parameter::zeros({width}));
    params_.push_back(w_.back());
    params_.push_back(b_.back());
  }
  x_ = ad::Tensor::randn({batch, width}, rng);
  y_ = ad::Tensor::randn({batch, width}, rng, ad::DType::f32, 0.0, 0.5);
}

std::string Mlp::name() const {
  return fmt::format("MLP {} x tanh({}), batch {}{}", depth_, width_, batch_,
                     residual_every_ > 0 ? fmt::format(", a skip every {}", residual_every_) : "");
}

ad::Var Mlp::loss(ad::Graph& g, bool checkpoint_marks) const {
  ad::Var h = g.input(x_), skip = h;
  for (int i = 0; i < depth_; ++i) {
    h = ad::add(ad::matmul(h, w_[static_cast<std::size_t>(i)]), b_[static_cast<std::size_t>(i)]);  // [N,W] x [W,W] + [W]
    if (i + 1 < depth_) h = ad::tanh(h);
    if (residual_every_ > 0 && (i + 1) % residual_every_ == 0) {
      h = ad::add(h, skip);
      skip = h;
    }
    if (checkpoint_marks && mark_every_ > 0 && (i + 1) % mark_every_ == 0 && i + 1 < depth_) h = ad::checkpoint(h);
  }
  return ad::mse(h, g.input(y_));
}

Transformer::Transformer(int blocks, std::int64_t batch, std::int64_t seq, std::int64_t dim, std::int64_t heads,
                         std::uint64_t seed)
    : blocks_(blocks), batch_(batch), seq_(seq), dim_(dim), heads_(heads) {
  ad::Rng rng(seed);
  const double s = 1.0 / std::sqrt(double(dim)), s4 = 1.0 / std::sqrt(double(4 * dim));
  auto mat = [&](std::int64_t r, std::int64_t c, double sd) {
    params_.push_back(ad::Parameter::randn({r, c}, rng, sd));
    return params_.back();
  };
  auto vec = [&](std::int64_t n, double v) {
    params_.push_back(ad::Parameter(ad::Tensor::full({n}, v)));
    return params_.back();
  };
  for (int i = 0; i < blocks; ++i) {
    Block b;
    b.ln1_g = vec(dim, 1.0);
    b.ln1_b = vec(dim, 0.0);
    b.wq = mat(dim, dim, s);
    b.bq = vec(dim, 0.0);
    b.wk = mat(dim, dim, s);
    b.bk = vec(dim, 0.0);
    b.wv = mat(dim, dim, s);
    b.bv = vec(dim, 0.0);
    b.wo = mat(dim, dim, s);
    b.bo = vec(dim, 0.0);
    b.ln2_g = vec(dim, 1.0);
    b.ln2_b = vec(dim, 0.0);
    b.w1 = mat(dim, 4 * dim, s);
    b.b1 = vec(4 * dim, 0.0);
    b.w2 = mat(4 * dim, dim, s4);
    b.b2 = vec(dim, 0.0);
    bl_.push_back(b);
  }
  lnf_g_ = vec(dim, 1.0);
  lnf_b_ = vec(dim, 0.0);
  x_ = ad::Tensor::randn({batch, seq, dim}, rng);
  y_ = ad::Tensor::randn({batch, seq, dim}, rng);
  mask_ = ad::Tensor::zeros({seq, seq});
  float* m = mask_.data<float>();
  for (std::int64_t i = 0; i < seq; ++i)
    for (std::int64_t j = i + 1; j < seq; ++j) m[i * seq + j] = -1e9f;  // causal: no attention to later positions
}

std::string Transformer::name() const {
  return fmt::format("Transformer {} blocks, [B,T,C]=[{},{},{}], {} heads, MLP {}", blocks_, batch_, seq_, dim_,
                     heads_, 4 * dim_);
}

ad::Var Transformer::loss(ad::Graph& g, bool checkpoint_marks) const {
  const std::int64_t B = batch_, T = seq_, C = dim_, H = heads_, D = dim_ / heads_;
  ad::Var x = g.input(x_), mask = g.input(mask_);
  // [B,T,C] -> [B,H,T,D]
  auto heads = [&](const ad::Var& t) { return ad::permute(ad::reshape(t, {B, T, H, D}), {0, 2, 1, 3}); };
  for (const Block& b : bl_) {
    ad::Var a = ad::layer_norm(x, b.ln1_g, b.ln1_b);
    ad::Var q = heads(ad::add(ad::matmul(a, b.wq), b.bq));  // [B,T,C] x [C,C] + [C]
    ad::Var k = heads(ad::add(ad::matmul(a, b.wk), b.bk));
    ad::Var v = heads(ad::add(ad::matmul(a, b.wv), b.bv));
    ad::Var s = ad::add(ad::mul_scalar(ad::matmul(q, k, false, true), 1.0 / std::sqrt(double(D))), mask);  // [B,H,T,T]
    ad::Var o = ad::matmul(ad::softmax(s, -1), v);                                              // [B,H,T,D]
    o = ad::reshape(ad::permute(o, {0, 2, 1, 3}), {B, T, C});
    x = ad::add(x, ad::add(ad::matmul(o, b.wo), b.bo));
    ad::Var m = ad::layer_norm(x, b.ln2_g, b.ln2_b);
    m = ad::gelu(ad::add(ad::matmul(m, b.w1), b.b1));  // [B,T,4C]
    x = ad::add(x, ad::add(ad::matmul(m, b.w2), b.b2));
    if (checkpoint_marks) x = ad::checkpoint(x);
  }
  return ad::mse(ad::layer_norm(x, lnf_g_, lnf_b_), g.input(y_));
}

}  // namespace remat_bench

namespace remat_bench {

namespace {
constexpr std::int64_t kSmallBatch = 4;
struct Builder {
  SmallGraph sg;
  ad::Rng rng;
  explicit Builder(std::uint64_t seed, std::string family, std::string name) : rng(seed) {
    sg.family = std::move(family);
    sg.name = std::move(name);
  }
  ad::Var input(std::int64_t w) { return sg.g.input(ad::Tensor::randn({kSmallBatch, w}, rng)); }
  ad::Var linear(const ad::Var& h, std::int64_t out) {  // [N, in] x [in, out]
    sg.params.push_back(ad::Parameter::randn({h.dim(1), out}, rng, 1.0 / std::sqrt(double(h.dim(1)))));
    return ad::matmul(h, sg.params.back());
  }
  SmallGraph finish(const ad::Var& out) {
    sg.loss = ad::mse(out, sg.g.input(ad::Tensor::randn(out.shape(), rng)));
    return std::move(sg);
  }
};
}  // namespace

SmallGraph random_dag(int ops, std::uint64_t seed) {
  Builder b(seed, "random DAG", fmt::format("random(ops={}, seed={})", ops, seed));
  std::mt19937_64 gen(seed * 7919 + 1);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(gen() % n); };
  const std::int64_t widths[] = {4, 8, 16};
  std::vector<ad::Var> vals{b.linear(b.input(8), 8)};  // a parameter the loss depends on
  std::vector<int> reads{0};
  // inputs mostly from the last three values, sometimes from any (long edges)
  auto choose = [&]() { std::size_t n = vals.size(); return pick(4) == 0 ? pick(n) : n - 1 - pick(std::min<std::size_t>(n, 3)); };
  for (int i = 0; i < ops; ++i) {
    std::size_t a = choose();
    ad::Var x = vals[a], y;
    switch (pick(6)) {
      case 0: y = ad::tanh(x); break;
      case 1: y = ad::sigmoid(x); break;
      case 2: y = ad::relu(x); break;
      case 3:
      case 4: {  // add / mul with another value of the same width, else a matmul
        std::vector<std::size_t> same;
        for (std::size_t j = 0; j < vals.size(); ++j)
          if (j != a && vals[j].dim(1) == x.dim(1)) same.push_back(j);
        if (same.empty()) { y = b.linear(x, widths[pick(3)]); break; }
        std::size_t c = same[pick(same.size())];
        y = pick(2) ? ad::add(x, vals[c]) : ad::mul(x, vals[c]);
        ++reads[c];
        break;
      }
      default: y = b.linear(x, widths[pick(3)]); break;
    }
    ++reads[a];
    vals.push_back(y);
    reads.push_back(0);
  }
  ad::Var out = vals.back();
  for (std::size_t j = 1; j + 1 < vals.size(); ++j)
    if (!reads[j]) out = ad::add(out, vals[j].dim(1) == out.dim(1) ? vals[j] : b.linear(vals[j], out.dim(1)));
  return b.finish(out);
}

SmallGraph vgg_like(const std::vector<std::int64_t>& widths, std::uint64_t seed) {
  std::string w;
  for (auto x : widths) w += fmt::format("{}{}", w.empty() ? "" : "-", x);
  Builder b(seed, "VGG-like", fmt::format("vgg({})", w));
  ad::Var h = b.input(widths[0]);
  for (std::size_t i = 1; i < widths.size(); ++i) {
    h = b.linear(h, widths[i]);
    if (i + 1 < widths.size()) h = ad::relu(h);
  }
  return b.finish(h);
}

SmallGraph resnet_like(int blocks, std::int64_t width, std::uint64_t seed) {
  Builder b(seed, "ResNet-like", fmt::format("resnet(blocks={}, width={})", blocks, width));
  ad::Var h = b.linear(b.input(width), width);
  for (int i = 0; i < blocks; ++i) h = ad::add(h, b.linear(ad::relu(b.linear(h, width)), width));
  return b.finish(h);
}

SmallGraph unet_like(int levels, std::int64_t width, std::uint64_t seed) {
  Builder b(seed, "U-Net-like", fmt::format("unet(levels={}, width={})", levels, width));
  ad::Var h = b.input(width);
  std::vector<ad::Var> skips;
  for (int i = 0; i < levels; ++i) {  // encoder: width halves
    h = ad::relu(b.linear(h, h.dim(1) / (i == 0 ? 1 : 2)));
    skips.push_back(h);
  }
  h = ad::relu(b.linear(h, h.dim(1) / 2));  // bottleneck
  for (int i = levels - 1; i >= 0; --i) {  // decoder: back up, plus the skip
    const ad::Var& s = skips[static_cast<std::size_t>(i)];
    h = ad::add(ad::relu(b.linear(h, s.dim(1))), s);
  }
  return b.finish(b.linear(h, width));
}

}  // namespace remat_bench
