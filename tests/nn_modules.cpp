// Modules: each forward against plain loops over the same parameters, names
// of nested parameters, seeded initialisation, train/eval, Dropout's stream.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "ad/ad.hpp"

namespace {

using ad::DType;
using ad::Tensor;
namespace nn = ad::nn;

std::vector<double> vals(const Tensor& t) { return t.to_vector(); }

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << " want " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

// A module made of others, as a transformer block would be.
struct DropBlock : nn::Module {
  nn::LayerNorm ln;
  nn::MLP mlp;
  nn::Dropout drop;
  DropBlock(std::int64_t d, ad::Rng& rng) : ln(d), mlp({d, 2 * d, d}, rng), drop(0.5, rng) {}
  void visit(nn::Visitor& v) const override {
    v.module("ln", ln);
    v.module("mlp", mlp);
    v.module("drop", drop);
  }
};
struct Net : nn::Module {
  nn::Embedding emb;
  nn::ModuleList<DropBlock> blocks;
  nn::RMSNorm norm;
  Net(ad::Rng& rng) : emb(10, 4, rng), norm(4) {
    for (int i = 0; i < 2; ++i) blocks.push_back(DropBlock(4, rng));
  }
  void visit(nn::Visitor& v) const override {
    v.module("emb", emb);
    v.module("blocks", blocks);
    v.module("norm", norm);
  }
};

// The residual block of docs/training.md.
// [snippet block]
struct Block : ad::nn::Module {
  ad::nn::LayerNorm ln;
  ad::nn::MLP mlp;
  Block(std::int64_t d, ad::Rng& rng) : ln(d), mlp({d, 4 * d, d}, rng) {}
  ad::Var operator()(const ad::Var& x) const { return ad::add(x, mlp(ln(x))); }
  void visit(ad::nn::Visitor& v) const override { v.module("ln", ln); v.module("mlp", mlp); }
};
// [end snippet]

}  // namespace

TEST_CASE("nn docs residual block") {
  ad::Rng rng(19);
  ad::nn::ModuleList<Block> blocks;
  blocks.push_back(Block(4, rng));
  blocks.push_back(Block(4, rng));
  auto ps = blocks.named_parameters();
  REQUIRE(ps.size() == 12);
  CHECK(ps[0].first == "0.ln.weight");
  CHECK(ps[11].first == "1.mlp.layers.1.bias");
  CHECK(ps[2].second.shape() == ad::Shape{16, 4});
  ad::Graph g;
  ad::Var x = g.input(Tensor::randn({3, 4}, rng));
  ad::Var y = blocks[1](blocks[0](x));
  CHECK(y.shape() == ad::Shape{3, 4});
  ad::backward(ad::sum(y));
  for (auto& np : ps) CHECK(np.second.has_grad());
}

TEST_CASE("nn Linear forward matches loops") {
  ad::Rng rng(11);
  nn::LinearOptions o;
  o.dtype = DType::f64;
  nn::Linear lin(4, 3, rng, o);
  CHECK(lin.weight.shape() == ad::Shape{3, 4});
  CHECK(lin.bias.shape() == ad::Shape{3});
  Tensor x = Tensor::randn({2, 5, 4}, rng, DType::f64);
  ad::Graph g;
  ad::Var y = lin(g.input(x));
  REQUIRE(y.shape() == ad::Shape{2, 5, 3});
  auto xv = vals(x), w = vals(lin.weight.value()), b = vals(lin.bias.value());
  std::vector<double> want(30);
  for (int r = 0; r < 10; ++r)
    for (int j = 0; j < 3; ++j) {
      double s = b[static_cast<std::size_t>(j)];
      for (int k = 0; k < 4; ++k) s += xv[static_cast<std::size_t>(r * 4 + k)] * w[static_cast<std::size_t>(j * 4 + k)];
      want[static_cast<std::size_t>(r * 3 + j)] = s;
    }
  check_close(vals(y.value()), want, 1e-13);

  // PyTorch's default init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias
  for (double v : w) CHECK(std::fabs(v) <= 0.5);
  for (double v : b) CHECK(std::fabs(v) <= 0.5);

  // gradient of sum(y): dW[j,k] = sum_r x[r,k], db[j] = rows
  ad::backward(ad::sum(y));
  auto gw = vals(lin.weight.grad());
  for (int k = 0; k < 4; ++k) {
    double s = 0;
    for (int r = 0; r < 10; ++r) s += xv[static_cast<std::size_t>(r * 4 + k)];
    for (int j = 0; j < 3; ++j) CHECK(gw[static_cast<std::size_t>(j * 4 + k)] == doctest::Approx(s).epsilon(1e-12));
  }
  for (double v : vals(lin.bias.grad())) CHECK(v == 10.0);
}

TEST_CASE("nn Linear and MLP take a single vector [in]") {
  ad::Rng rng(12);
  nn::LinearOptions o;
  o.dtype = DType::f64;
  nn::Linear lin(4, 3, rng, o);
  Tensor x = Tensor::randn({4}, rng, DType::f64);
  ad::Graph g;
  ad::Var y = lin(g.input(x));
  REQUIRE(y.shape() == ad::Shape{3});
  auto xv = vals(x), w = vals(lin.weight.value()), b = vals(lin.bias.value());
  std::vector<double> want(3);
  for (int j = 0; j < 3; ++j) {
    double s = b[static_cast<std::size_t>(j)];
    for (int k = 0; k < 4; ++k) s += xv[static_cast<std::size_t>(k)] * w[static_cast<std::size_t>(j * 4 + k)];
    want[static_cast<std::size_t>(j)] = s;
  }
  check_close(vals(y.value()), want, 1e-13);
  ad::backward(ad::sum(y));
  auto gw = vals(lin.weight.grad());
  for (int j = 0; j < 3; ++j)
    for (int k = 0; k < 4; ++k) CHECK(gw[static_cast<std::size_t>(j * 4 + k)] == doctest::Approx(xv[static_cast<std::size_t>(k)]).epsilon(1e-12));

  nn::MLP mlp({4, 7, 2}, rng);
  ad::Graph g2;
  CHECK(mlp(g2.input(Tensor::randn({4}, rng))).shape() == ad::Shape{2});
  ad::Graph g3;  // the last dim is still checked
  CHECK_THROWS_WITH_AS(lin(g3.input(Tensor::randn({5}, rng, DType::f64))), doctest::Contains("matmul"), ad::Error);
}

TEST_CASE("nn Linear without bias, stddev init, seeded") {
  ad::Rng a(5), b(5);
  nn::LinearOptions o;
  o.bias = false;
  o.init_stddev = 0.02;
  nn::Linear l1(64, 32, a, o), l2(64, 32, b, o);
  CHECK_FALSE(l1.bias.defined());
  CHECK(l1.named_parameters().size() == 1);
  CHECK(ad::bitwise_equal(l1.weight.value(), l2.weight.value()));
  double ss = 0;
  for (double v : vals(l1.weight.value())) ss += v * v;
  CHECK(std::sqrt(ss / (64 * 32)) == doctest::Approx(0.02).epsilon(0.1));
  ad::Rng c(6);
  nn::Linear l3(64, 32, c, o);
  CHECK_FALSE(ad::bitwise_equal(l1.weight.value(), l3.weight.value()));
}

TEST_CASE("nn Embedding forward matches loops") {
  ad::Rng rng(12);
  nn::Embedding emb(7, 3, rng);
  Tensor ids = Tensor::from(std::vector<std::int64_t>{6, 0, 3, 3, 1, 5}, {2, 3});
  ad::Graph g;
  ad::Var y = emb(g.input(ids));
  REQUIRE(y.shape() == ad::Shape{2, 3, 3});
  auto w = vals(emb.weight.value()), got = vals(y.value());
  const std::int64_t* id = ids.data<std::int64_t>();
  for (int i = 0; i < 6; ++i)
    for (int d = 0; d < 3; ++d)
      CHECK(got[static_cast<std::size_t>(i * 3 + d)] == w[static_cast<std::size_t>(id[i] * 3 + d)]);
}

TEST_CASE("nn LayerNorm and RMSNorm forward match loops") {
  ad::Rng rng(13);
  const int rows = 6, d = 5;
  nn::LayerNorm ln(d, 1e-5, DType::f64);
  nn::RMSNorm rms(d, 1e-6, DType::f64);
  // default init: weight 1, bias 0; then random values to test the affine part
  for (double v : vals(ln.weight.value())) CHECK(v == 1.0);
  for (double v : vals(ln.bias.value())) CHECK(v == 0.0);
  ln.weight.value().copy_from(Tensor::randn({d}, rng, DType::f64));
  ln.bias.value().copy_from(Tensor::randn({d}, rng, DType::f64));
  rms.weight.value().copy_from(Tensor::randn({d}, rng, DType::f64));
  Tensor x = Tensor::randn({rows, d}, rng, DType::f64, 0.5, 2.0);
  ad::Graph g;
  auto yl = vals(ln(g.input(x)).value()), yr = vals(rms(g.input(x)).value());
  auto xv = vals(x), gw = vals(ln.weight.value()), gb = vals(ln.bias.value()), rw = vals(rms.weight.value());
  std::vector<double> wl(rows * d), wr(rows * d);
  for (int r = 0; r < rows; ++r) {
    double mean = 0, ms = 0;
    for (int k = 0; k < d; ++k) mean += xv[static_cast<std::size_t>(r * d + k)] / d;
    double var = 0;
    for (int k = 0; k < d; ++k) {
      double c = xv[static_cast<std::size_t>(r * d + k)] - mean;
      var += c * c / d;
      ms += xv[static_cast<std::size_t>(r * d + k)] * xv[static_cast<std::size_t>(r * d + k)] / d;
    }
    for (int k = 0; k < d; ++k) {
      auto i = static_cast<std::size_t>(r * d + k);
      wl[i] = (xv[i] - mean) / std::sqrt(var + 1e-5) * gw[static_cast<std::size_t>(k)] + gb[static_cast<std::size_t>(k)];
      wr[i] = xv[i] / std::sqrt(ms + 1e-6) * rw[static_cast<std::size_t>(k)];
    }
  }
  check_close(yl, wl, 1e-12);
  check_close(yr, wr, 1e-12);
}

TEST_CASE("nn MLP forward matches loops") {
  ad::Rng rng(14);
  nn::MLPOptions o;
  o.activation = nn::Activation::tanh;
  o.linear.dtype = DType::f64;
  nn::MLP mlp({3, 4, 2}, rng, o);
  auto names = mlp.named_parameters();
  REQUIRE(names.size() == 4);
  CHECK(names[0].first == "layers.0.weight");
  CHECK(names[3].first == "layers.1.bias");
  CHECK(mlp.num_parameters() == 3 * 4 + 4 + 4 * 2 + 2);
  Tensor x = Tensor::randn({5, 3}, rng, DType::f64);
  ad::Graph g;
  auto got = vals(mlp(g.input(x)).value());
  auto xv = vals(x), w0 = vals(mlp.layers[0].weight.value()), b0 = vals(mlp.layers[0].bias.value());
  auto w1 = vals(mlp.layers[1].weight.value()), b1 = vals(mlp.layers[1].bias.value());
  std::vector<double> want;
  for (int r = 0; r < 5; ++r) {
    double h[4];
    for (int j = 0; j < 4; ++j) {
      double s = b0[static_cast<std::size_t>(j)];
      for (int k = 0; k < 3; ++k) s += xv[static_cast<std::size_t>(r * 3 + k)] * w0[static_cast<std::size_t>(j * 3 + k)];
      h[j] = std::tanh(s);
    }
    for (int j = 0; j < 2; ++j) {
      double s = b1[static_cast<std::size_t>(j)];
      for (int k = 0; k < 4; ++k) s += h[k] * w1[static_cast<std::size_t>(j * 4 + k)];
      want.push_back(s);
    }
  }
  check_close(got, want, 1e-12);
}

TEST_CASE("nn activations") {
  ad::Rng rng(15);
  Tensor x = Tensor::randn({8}, rng, DType::f64);
  ad::Graph g;
  ad::Var v = g.input(x);
  auto xv = vals(x);
  auto relu = vals(nn::activate(v, nn::Activation::relu).value());
  auto silu = vals(nn::activate(v, nn::Activation::silu).value());
  auto sig = vals(nn::activate(v, nn::Activation::sigmoid).value());
  auto gelu = vals(nn::activate(v, nn::Activation::gelu).value());
  CHECK(nn::activate(v, nn::Activation::none).id() == v.id());
  for (std::size_t i = 0; i < xv.size(); ++i) {
    double s = 1 / (1 + std::exp(-xv[i]));
    CHECK(relu[i] == std::max(0.0, xv[i]));
    CHECK(sig[i] == doctest::Approx(s).epsilon(1e-12));
    CHECK(silu[i] == doctest::Approx(xv[i] * s).epsilon(1e-12));
    CHECK(gelu[i] == doctest::Approx(0.5 * xv[i] * (1 + std::erf(xv[i] / std::sqrt(2.0)))).epsilon(1e-12));
  }
  CHECK(std::string(nn::activation_name(nn::Activation::gelu)) == "gelu");
}

TEST_CASE("nn Dropout: train masks, eval identity, stream in a buffer") {
  ad::Rng rng(16);
  nn::Dropout drop(0.25, rng);
  Tensor x = Tensor::uniform({4000}, rng, DType::f64, 1.0, 2.0);
  ad::Graph g;
  ad::Var v = g.input(x);
  Tensor saved = drop.rng_state.clone();
  auto y1 = vals(drop(v).value());
  auto y2 = vals(drop(v).value());
  auto xv = vals(x);
  int zeros = 0, differ = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    CHECK((y1[i] == 0.0 || y1[i] == xv[i] * (1.0 / 0.75)));
    zeros += y1[i] == 0.0;
    differ += (y1[i] == 0.0) != (y2[i] == 0.0);
  }
  CHECK(zeros > 850);
  CHECK(zeros < 1150);
  CHECK(differ > 0);  // the stream advanced between calls
  CHECK(drop.rng_state.data<std::int64_t>()[1] == 8000);
  // restoring the buffer replays the first mask
  drop.rng_state.copy_from(saved);
  CHECK(vals(drop(v).value()) == y1);
  drop.eval();
  CHECK_FALSE(drop.is_training());
  CHECK(drop(v).id() == v.id());
  drop.train();
  CHECK(drop(v).id() != v.id());
  // two dropout layers from one rng draw different streams
  nn::Dropout other(0.25, rng);
  CHECK(other.rng_state.data<std::int64_t>()[0] != drop.rng_state.data<std::int64_t>()[0]);
}

TEST_CASE("nn nested names, buffers, train and eval reach submodules") {
  ad::Rng rng(17);
  Net net(rng);
  auto ps = net.named_parameters();
  std::vector<std::string> names;
  for (auto& np : ps) names.push_back(np.first);
  std::vector<std::string> want{"emb.weight",
                                "blocks.0.ln.weight",
                                "blocks.0.ln.bias",
                                "blocks.0.mlp.layers.0.weight",
                                "blocks.0.mlp.layers.0.bias",
                                "blocks.0.mlp.layers.1.weight",
                                "blocks.0.mlp.layers.1.bias",
                                "blocks.1.ln.weight",
                                "blocks.1.ln.bias",
                                "blocks.1.mlp.layers.0.weight",
                                "blocks.1.mlp.layers.0.bias",
                                "blocks.1.mlp.layers.1.weight",
                                "blocks.1.mlp.layers.1.bias",
                                "norm.weight"};
  CHECK(names == want);
  auto bs = net.named_buffers();
  REQUIRE(bs.size() == 2);
  CHECK(bs[0].first == "blocks.0.drop.rng_state");
  CHECK(bs[1].first == "blocks.1.drop.rng_state");
  // Parameters are shared handles: the module's copy is the same parameter
  ps[0].second.value().fill(3.0);
  CHECK(net.emb.weight.value().at({0, 0}) == 3.0);
  CHECK(net.blocks[1].drop.is_training());
  net.eval();
  CHECK_FALSE(net.blocks[1].drop.is_training());
  CHECK_FALSE(net.blocks[0].mlp.layers[1].is_training());
  net.train();
  CHECK(net.blocks[1].drop.is_training());

  // zero_grad after a backward through the whole net
  ad::Graph g;
  ad::Var h = net.emb(g.input(Tensor::from(std::vector<std::int64_t>{1, 2, 3}, {3})));
  for (const DropBlock& b : net.blocks) h = b.drop(b.mlp(b.ln(h)));
  ad::backward(ad::sum(net.norm(h)));
  for (auto& np : net.named_parameters()) CHECK(np.second.has_grad());
  net.zero_grad();
  for (auto& np : net.named_parameters())
    for (double v : vals(np.second.grad())) CHECK(v == 0.0);
}

TEST_CASE("nn module misuse") {
  ad::Rng rng(18);
  auto has = [](auto&& f, const std::string& needle) { return ad::test::throws_with(f, needle); };
  CHECK(has([&] { nn::Linear(0, 3, rng); }, "Linear: in_features must be positive, got 0"));
  CHECK(has([&] {
    nn::LinearOptions o;
    o.dtype = DType::i64;
    nn::Linear(2, 3, rng, o);
  }, "Linear: parameter dtype must be f32 or f64, got i64"));
  CHECK(has([&] { nn::MLP({3}, rng); }, "MLP: needs at least two sizes"));
  CHECK(has([&] { nn::Dropout(1.0, rng); }, "Dropout: p must be in [0, 1), got 1"));
  CHECK(has([&] { nn::LayerNorm(-1); }, "LayerNorm: dim must be positive, got -1"));
  CHECK(has([&] { nn::Embedding(3, 0, rng); }, "Embedding: dim must be positive"));
  CHECK(has([&] {
    ad::Graph g;
    nn::Linear()(g.input(Tensor::zeros({2, 2})));
  }, "Linear: use of a default-constructed layer"));
  nn::Linear lin(4, 3, rng);
  CHECK(has([&] {
    ad::Graph g;
    lin(g.input(Tensor::zeros({2, 5})));
  }, "matmul: inner dims differ"));
}

namespace {
// An embedding whose weight the output head uses too (tied weights).
struct Tied : nn::Module {
  nn::Embedding emb;
  Tied(ad::Rng& rng) : emb(40, 8, rng) {}
  void visit(nn::Visitor& v) const override {
    v.module("emb", emb);
    v.parameter("head.weight", emb.weight);
  }
};
}  // namespace

TEST_CASE("nn num_parameters counts a tied parameter once") {
  ad::Rng rng(31);
  Tied t(rng);
  CHECK(t.named_parameters().size() == 2);
  CHECK(t.num_parameters() == 40 * 8);
  nn::MLP mlp({3, 4}, rng);
  CHECK(mlp.num_parameters() == 3 * 4 + 4);
}

TEST_CASE("nn MLP dropout below 0, at or above 1, or NaN is an ad::Error") {
  ad::Rng rng(32);
  for (double p : {-0.5, 1.0, 2.0, std::nan("")}) {
    nn::MLPOptions o;
    o.dropout = p;
    CHECK_THROWS_WITH_AS((nn::MLP({3, 4, 2}, rng, o)), doctest::Contains("MLP: dropout must be in [0, 1)"), ad::Error);
  }
  nn::MLPOptions ok;
  ok.dropout = 0.25;
  CHECK((nn::MLP({3, 4, 2}, rng, ok).dropout.p == 0.25));
}

TEST_CASE("nn load_module_state with sources sharing the module's storage (two layers swapped) loses nothing") {
  ad::Rng rng(33);
  nn::ModuleList<nn::Linear> layers;
  for (int i = 0; i < 3; ++i) layers.push_back(nn::Linear(4, 4, rng));
  const auto before = nn::module_state(layers);  // handles sharing the parameters' storage
  std::vector<std::vector<double>> v;
  for (const auto& nt : before) v.push_back(nt.second.to_vector());
  nn::NamedTensors swapped;
  for (const auto& nt : before) {
    std::string n = nt.first;
    if (n[0] == '0') n[0] = '1';
    else if (n[0] == '1') n[0] = '0';
    swapped.emplace_back(n, nt.second);
  }
  nn::load_module_state(layers, swapped);
  // before: 0.weight, 0.bias, 1.weight, 1.bias, 2.weight, 2.bias (the module's order)
  const auto after = nn::module_state(layers);
  REQUIRE(after.size() == 6);
  CHECK(after[0].second.to_vector() == v[2]);
  CHECK(after[1].second.to_vector() == v[3]);
  CHECK(after[2].second.to_vector() == v[0]);
  CHECK(after[3].second.to_vector() == v[1]);
  CHECK(after[4].second.to_vector() == v[4]);  // loaded from itself
  CHECK(after[5].second.to_vector() == v[5]);
}
