// ad::nn transformer modules: MultiHeadAttention against the same attention
// composed from matmul and softmax with the module's own weights (f64, GQA and
// causal), the block's residual structure, DecoderLM's parameter names and
// shapes, and misuse.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "ad/ad.hpp"

namespace {
double max_diff(const ad::Tensor& a, const ad::Tensor& b) {
  auto x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}
// x W^T + b with the module's Linear weights, on a [B, T, in] input
ad::Var lin(const ad::nn::Linear& l, const ad::Var& x) { return ad::add(ad::matmul(x, l.weight, false, true), l.bias); }
}  // namespace

TEST_CASE("nn MultiHeadAttention equals attention composed from matmul and softmax") {
  for (std::int64_t kvh : {4, 2}) {
    CAPTURE(kvh);
    ad::Rng rng(3);
    ad::nn::LinearOptions lo;
    lo.dtype = ad::DType::f64;
    ad::nn::MultiHeadAttention mha(16, 4, kvh, rng, true, lo);
    const std::int64_t B = 2, T = 5, H = 4, dh = 4;
    ad::Tensor xt = ad::Tensor::randn({B, T, 16}, rng, ad::DType::f64);
    ad::Graph g;
    ad::Var x = g.input(xt);
    ad::Tensor got = ad::eval(mha(x));
    // composed: heads [B, H, T, dh], k/v heads repeated for GQA, causal mask as -inf
    auto split = [&](const ad::Var& y, std::int64_t h) { return ad::permute(ad::reshape(y, {B, T, h, dh}), {0, 2, 1, 3}); };
    ad::Var q = split(lin(mha.q, x), H), k = split(lin(mha.k, x), kvh), v = split(lin(mha.v, x), kvh);
    if (kvh < H) {
      std::vector<ad::Var> ks, vs;
      for (std::int64_t h = 0; h < H; ++h) {
        ks.push_back(ad::slice(k, 1, h / (H / kvh), h / (H / kvh) + 1));
        vs.push_back(ad::slice(v, 1, h / (H / kvh), h / (H / kvh) + 1));
      }
      k = ad::concat(ks, 1);
      v = ad::concat(vs, 1);
    }
    std::vector<double> mask(static_cast<std::size_t>(T * T));
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t j = 0; j < T; ++j) mask[static_cast<std::size_t>(i * T + j)] = j <= i ? 0.0 : -INFINITY;
    ad::Var s = ad::add(ad::mul_scalar(ad::matmul(q, k, false, true), 1.0 / std::sqrt(4.0)),
                        g.input(ad::Tensor::from(std::span<const double>(mask), {T, T})));
    ad::Var a = ad::matmul(ad::softmax(s, -1), v);
    ad::Tensor want = ad::eval(lin(mha.o, ad::reshape(ad::permute(a, {0, 2, 1, 3}), {B, T, 16})));
    CHECK(max_diff(got, want) < 1e-12);
  }
}

TEST_CASE("nn TransformerBlock is two residual branches and DecoderLM names its parameters") {
  ad::Rng rng(4);
  ad::nn::TransformerBlockOptions bo;
  bo.heads = 2;
  bo.kv_heads = 1;
  ad::nn::TransformerBlock blk(8, rng, bo);
  ad::Graph g;
  ad::Var x = g.input(ad::Tensor::randn({1, 3, 8}, rng));
  ad::Var h = ad::add(x, blk.attn(blk.ln1(x)));
  ad::Var want = ad::add(h, blk.down(ad::gelu(blk.up(blk.ln2(h)))));
  CHECK(max_diff(ad::eval(blk(x)), ad::eval(want)) == 0);

  ad::nn::DecoderLMOptions o;
  o.vocab = 11;
  o.max_len = 7;
  o.dim = 8;
  o.layers = 2;
  o.block = bo;
  ad::nn::DecoderLM lm(o, rng);
  auto named = lm.named_parameters();
  CHECK(named.front().first == "tok.weight");
  CHECK(named.back().first == "head.bias");
  bool found = false;
  for (const auto& np : named) found |= np.first == "blocks.1.attn.k.weight" && np.second.shape() == ad::Shape{4, 8};
  CHECK(found);
  ad::Graph g2;
  std::vector<std::int64_t> toks = {1, 2, 3, 4, 5, 6};
  ad::Var logits = lm(g2, ad::Tensor::from(std::span<const std::int64_t>(toks), {2, 3}));
  CHECK(logits.shape() == ad::Shape{2, 3, 11});
  ad::Tensor lt = ad::eval(logits);
  for (double v : lt.to_vector()) CHECK(std::isfinite(v));
  std::vector<std::int64_t> long_toks(8, 1);
  CHECK_THROWS_WITH_AS(lm(g2, ad::Tensor::from(std::span<const std::int64_t>(long_toks), {1, 8})),
                       doctest::Contains("exceed max_len 7"), ad::Error);
  CHECK_THROWS_WITH_AS(ad::nn::MultiHeadAttention(10, 3, 1, rng), doctest::Contains("multiple of heads"), ad::Error);
}

TEST_CASE("nn SemiCRFHead: nll is logZ - gold score, decode gives a valid segmentation, training lowers the nll") {
  ad::Rng rng(9);
  ad::nn::SemiCRFHead head(4, 3, 5, rng);
  const std::int64_t B = 2, T = 12;
  ad::Tensor feats = ad::Tensor::randn({B, T, 4}, rng);
  std::vector<std::int64_t> lens = {12, 9};
  // gold: label at each segment start, -1 elsewhere
  std::vector<std::int64_t> seg(static_cast<std::size_t>(B * T), -1);
  for (std::int64_t t : {0, 4, 7}) seg[static_cast<std::size_t>(t)] = t % 3;
  for (std::int64_t t : {0, 3, 6}) seg[static_cast<std::size_t>(T + t)] = (t + 1) % 3;
  ad::Tensor L = ad::Tensor::from(std::span<const std::int64_t>(lens), {B});
  ad::Tensor S = ad::Tensor::from(std::span<const std::int64_t>(seg), {B, T});
  double first = 0, last = 0;
  ad::nn::AdamOptions ao;
  ao.lr = 0.1;
  ad::nn::Adam opt(head.named_parameters(), ao);
  for (int step = 0; step < 30; ++step) {
    ad::Graph g;
    ad::Var nll = head.nll(g.input(feats), g.input(L), g.input(S));
    ad::backward(nll);
    double v = nll.value().item();
    CHECK(v >= 0);
    if (step == 0) first = v;
    last = v;
    opt.step();
    opt.zero_grad();
  }
  CHECK(last < 0.8 * first);
  ad::Graph g;
  ad::Tensor best = ad::eval(head.decode(g.input(feats), g.input(L)));
  CHECK(best.shape() == ad::Shape{B, T});
  CHECK(best.at({0, 0}) >= 0);  // a segment starts at position 0
  ad::Tensor m = ad::eval(head.marginals(g.input(feats), g.input(L)));
  for (std::int64_t t = 0; t < 9; ++t) {
    double sum = 0;
    for (std::int64_t c = 0; c < 3; ++c) sum += m.at({1, t, c});
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
  }
  auto named = head.named_parameters();
  CHECK(named.size() == 5);
}
