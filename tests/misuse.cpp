// The misuse catalogue: every mistake a user can make is reported by throwing
// ad::Error whose message names the op and the shapes involved. Nothing
// aborts. Data-dependent mistakes (an index out of range) throw at run time
// from eval/backward; everything else throws where the graph is built.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ad/ad.hpp"
#include "test_util.hpp"

namespace {

ad::Tensor randn(const ad::Shape& s, ad::DType t = ad::DType::f32, std::uint64_t seed = 1) {
  ad::Rng rng(seed);
  return ad::Tensor::randn(s, rng, t);
}
ad::Tensor ints(std::vector<std::int64_t> v, const ad::Shape& s) { return ad::Tensor::from(std::span<const std::int64_t>(v), s); }

}  // namespace

TEST_CASE("misuse: binary ops with shapes that do not broadcast") {
  ad::Graph g;
  ad::Var a = g.input(randn({2, 3})), b = g.input(randn({4}));
  EXPECT_ERROR(ad::add(a, b), "add: shapes do not broadcast: a f32[2,3] vs b f32[4]");
  EXPECT_ERROR(ad::sub(a, b), "sub", "f32[2,3]", "f32[4]");
  EXPECT_ERROR(ad::mul(a, b), "mul", "f32[2,3]", "f32[4]");
  EXPECT_ERROR(ad::div(a, b), "div", "f32[2,3]", "f32[4]");
  EXPECT_ERROR(ad::pow(a, b), "pow", "f32[2,3]", "f32[4]");
  EXPECT_ERROR(a + b, "add", "f32[2,3]", "f32[4]");
  ad::Var c = g.input(randn({3, 2}));
  EXPECT_ERROR(a * c, "mul: shapes do not broadcast", "a f32[2,3]", "b f32[3,2]");
  ad::Var d = g.input(randn({5, 3, 1}));
  EXPECT_ERROR(ad::add(d, a), "add", "a f32[5,3,1]", "b f32[2,3]");  // 3 vs 2
  CHECK(ad::add(g.input(randn({5, 2, 1})), a).shape() == ad::Shape{5, 2, 3});
  // broadcast_to / sum_to with incompatible targets
  EXPECT_ERROR(ad::broadcast_to(a, {4, 3}), "broadcast_to", "cannot broadcast to [4,3]", "f32[2,3]");
  EXPECT_ERROR(ad::sum_to(a, {4}), "sum_to", "[4]", "f32[2,3]");
  ad::Var one = g.input(randn({1}));
  EXPECT_ERROR(ad::broadcast_to(one, {-5}), "broadcast_to", "[-5]", "f32[1]");  // not a shape at all
  EXPECT_ERROR(ad::sum_to(one, {-1}), "sum_to", "[-1]", "f32[1]");
  EXPECT_ERROR(ad::full(one, {2, -1}, 0.0, ad::DType::f32), "full", "[2,-1]");
  // an i64 full takes an integer it can hold: refused when built, naming full
  for (double bad : {1.5, std::nan(""), 1e19})
    EXPECT_ERROR(ad::full(one, {2}, bad, ad::DType::i64), "full", "is not an i64");
  CHECK(ad::eval(ad::full(one, {2}, -3.0, ad::DType::i64)).to_vector() == std::vector<double>{-3, -3});
}

TEST_CASE("misuse: dtype mismatch and integer or storage dtypes in float ops") {
  ad::Graph g;
  ad::Var a = g.input(randn({2, 3})), b = g.input(randn({2, 3}, ad::DType::f64));
  EXPECT_ERROR(ad::add(a, b), "add: dtype mismatch", "a f32[2,3]", "b f64[2,3]");
  EXPECT_ERROR(ad::matmul(a, g.input(randn({3, 2}, ad::DType::f64))), "matmul", "dtype mismatch", "f32[2,3]", "f64[3,2]");
  EXPECT_ERROR(ad::mse(a, b), "mse", "f32[2,3]", "f64[2,3]");

  ad::Var i = g.input(ints({1, 2, 3}, {3}));
  EXPECT_ERROR(ad::tanh(i), "tanh", "must be f32 or f64", "i64[3]");
  EXPECT_ERROR(ad::exp(i), "exp", "i64[3]");
  EXPECT_ERROR(ad::add(i, i), "add", "i64[3]");
  EXPECT_ERROR(ad::sum(i), "sum", "i64[3]");
  EXPECT_ERROR(ad::softmax(i), "softmax", "i64[3]");
  EXPECT_ERROR(ad::matmul(g.input(ints({1, 2, 3, 4}, {2, 2})), g.input(ints({1, 2, 3, 4}, {2, 2}))), "matmul", "i64[2,2]");
  EXPECT_ERROR(ad::cast(i, ad::DType::f32), "cast", "i64[3]");
  EXPECT_ERROR(ad::cast(a, ad::DType::i64), "cast", "f32[2,3]");

  // f16/bf16 are storage types: cast before computing
  ad::Var h = ad::cast(a, ad::DType::f16);
  CHECK(h.dtype() == ad::DType::f16);
  EXPECT_ERROR(ad::relu(h), "relu", "f16[2,3]");
  EXPECT_ERROR(ad::add(h, a), "add", "f16[2,3]", "f32[2,3]");
  EXPECT_ERROR(ad::slice(ad::cast(a, ad::DType::bf16), 0, 0, 1), "slice", "bf16[2,3]");
  // a loss that is not f32/f64 cannot be differentiated
  ad::Rng rng(3);
  ad::Parameter w = ad::Parameter::randn({3}, rng);
  ad::Var l16 = ad::cast(ad::sum(ad::mul(g.param(w), g.input(randn({3})))), ad::DType::f16);
  EXPECT_ERROR(ad::backward(l16), "grad", "f16[]");
  // a Parameter must hold a compute dtype
  EXPECT_ERROR(ad::Parameter(ints({1, 2}, {2})), "Parameter", "i64");
}

TEST_CASE("misuse: matmul") {
  ad::Graph g;
  ad::Var a = g.input(randn({32, 64})), b = g.input(randn({65, 10}));
  EXPECT_ERROR(ad::matmul(a, b), "matmul: inner dims differ (64 of a vs 65 of b): a f32[32,64] vs b f32[65,10]");
  EXPECT_ERROR(ad::matmul(g.input(randn({2, 3, 4})), g.input(randn({2, 4, 5})), true, false),
               "inner dims differ (3 of a transposed vs 4 of b)");
  EXPECT_ERROR(ad::matmul(a, g.input(randn({10, 65})), false, true), "matmul: inner dims differ", "f32[10,65]");
  EXPECT_ERROR(ad::matmul(g.input(randn({64, 32})), b, true, false), "matmul: inner dims differ", "f32[64,32]");
  // a scalar has no matrix product; a vector must still match K
  EXPECT_ERROR(ad::matmul(g.input(randn({})), g.input(randn({1, 1}))), "matmul", "rank >= 1", "a f32[]", "b f32[1,1]");
  EXPECT_ERROR(ad::matmul(g.input(randn({3, 4})), g.input(randn({}))), "matmul", "rank >= 1", "b f32[]");
  EXPECT_ERROR(ad::matmul(g.input(randn({3})), g.input(randn({4, 5}))), "matmul: inner dims differ", "a f32[3]",
               "b f32[4,5]");
  EXPECT_ERROR(ad::matmul(g.input(randn({3, 4})), g.input(randn({3}))), "matmul: inner dims differ", "b f32[3]");
  EXPECT_ERROR(ad::matmul(g.input(randn({3})), g.input(randn({4}))), "matmul: inner dims differ", "a f32[3]", "b f32[4]");
  // batch dims that do not broadcast
  EXPECT_ERROR(ad::matmul(g.input(randn({2, 3, 4})), g.input(randn({5, 4, 6}))), "matmul: batch dims differ",
               "a f32[2,3,4]", "b f32[5,4,6]");
  EXPECT_ERROR(ad::matmul(g.input(randn({2, 2, 3, 4})), g.input(randn({3, 4, 5}))), "matmul: batch dims differ",
               "f32[2,2,3,4]", "f32[3,4,5]");
  // the documented broadcasting works
  CHECK(ad::matmul(g.input(randn({2, 3, 4})), g.input(randn({4, 5}))).shape() == ad::Shape{2, 3, 5});
  CHECK(ad::matmul(g.input(randn({3, 4})), g.input(randn({2, 4, 5}))).shape() == ad::Shape{2, 3, 5});
  CHECK(ad::matmul(g.input(randn({2, 2, 3, 4})), g.input(randn({2, 4, 5}))).shape() == ad::Shape{2, 2, 3, 5});
  CHECK(ad::matmul(g.input(randn({7, 1, 3, 4})), g.input(randn({6, 4, 5}))).shape() == ad::Shape{7, 6, 3, 5});
  CHECK(ad::matmul(g.input(randn({2, 3, 4})), g.input(randn({4}))).shape() == ad::Shape{2, 3});
  CHECK(ad::matmul(g.input(randn({4})), g.input(randn({4}))).shape() == ad::Shape{});
}

TEST_CASE("misuse: reshape, permute, transpose") {
  ad::Graph g;
  ad::Var x = g.input(randn({2, 3}));
  EXPECT_ERROR(ad::reshape(x, {4, 2}), "reshape", "[4,2]", "x f32[2,3]");
  EXPECT_ERROR(ad::reshape(x, {-1, -1}), "reshape", "more than one -1", "f32[2,3]");
  EXPECT_ERROR(ad::reshape(x, {4, -1}), "reshape", "[4,-1]", "f32[2,3]");
  EXPECT_ERROR(ad::reshape(x, {-2, -3}), "reshape", "negative", "f32[2,3]");
  EXPECT_ERROR(ad::reshape(x, {0, -1}), "reshape", "f32[2,3]");
  CHECK(ad::reshape(x, {3, -1}).shape() == ad::Shape{3, 2});

  ad::Var y = g.input(randn({2, 3, 4}));
  EXPECT_ERROR(ad::permute(y, {0, 0, 1}), "permute", "not a permutation", "[0,0,1]", "f32[2,3,4]");
  EXPECT_ERROR(ad::permute(y, {0, 3, 1}), "permute", "not a permutation", "f32[2,3,4]");
  EXPECT_ERROR(ad::permute(y, {0, -1, 1}), "permute", "f32[2,3,4]");
  EXPECT_ERROR(ad::permute(y, {1, 0}), "permute", "wrong length", "f32[2,3,4]");
  EXPECT_ERROR(ad::transpose(y, 0, 3), "transpose", "axis 3", "[2,3,4]");
  EXPECT_ERROR(ad::transpose(y, -4, 0), "transpose", "axis -4", "[2,3,4]");
  CHECK(ad::permute(y, {2, 0, 1}).shape() == ad::Shape{4, 2, 3});
  // permute moves elements of every dtype, the 16-bit storage types included
  for (ad::DType dt : {ad::DType::f16, ad::DType::bf16, ad::DType::i64}) {
    std::vector<double> v{1, 2, 3, 4, 5, 6};
    ad::Var h = g.input(ad::Tensor::from(std::span<const double>(v), {2, 3}).to(dt));
    CHECK(ad::eval(ad::transpose(h, 0, 1)).to_vector() == std::vector<double>{1, 4, 2, 5, 3, 6});
  }

  // Tensor-level reshape
  ad::Tensor t = randn({2, 3});
  EXPECT_ERROR(t.reshape({5}), "Tensor::reshape", "[2,3]", "[5]");
  EXPECT_ERROR(t.reshape({-2, -3}), "Tensor::reshape", "[-2,-3]");
}

TEST_CASE("misuse: bad axes") {
  ad::Graph g;
  ad::Var x = g.input(randn({2, 3}));
  EXPECT_ERROR(ad::sum(x, {2}), "sum", "axis 2", "[2,3]");
  EXPECT_ERROR(ad::sum(x, {-3}), "sum", "axis -3", "[2,3]");
  EXPECT_ERROR(ad::mean(x, {5}), "mean", "axis 5", "[2,3]");
  EXPECT_ERROR(ad::max(x, {-7}), "max", "axis -7", "[2,3]");
  EXPECT_ERROR(ad::softmax(x, 2), "softmax", "axis 2", "[2,3]");
  EXPECT_ERROR(ad::softmax(x, -3), "softmax", "axis -3", "[2,3]");
  EXPECT_ERROR(ad::log_softmax(x, 2), "log_softmax", "axis 2", "[2,3]");
  EXPECT_ERROR(ad::logsumexp(x, 2), "logsumexp", "axis 2", "[2,3]");
  EXPECT_ERROR(ad::logsumexp(x, -3), "logsumexp", "axis -3", "[2,3]");
  EXPECT_ERROR(ad::slice(x, 2, 0, 1), "slice", "axis 2", "[2,3]");
  EXPECT_ERROR(ad::part(x, 2, {5}), "part", "[5]", "offset 2", "[2,3]");
  EXPECT_ERROR(ad::part(x, -1, {2}), "part", "offset -1");
  EXPECT_ERROR(ad::slice(x, -3, 0, 1), "slice", "axis -3", "[2,3]");
  EXPECT_ERROR(ad::concat({x, x}, 2), "concat", "axis 2", "[2,3]");
  EXPECT_ERROR(ad::concat({x, x}, -3), "concat", "axis -3", "[2,3]");
  ad::Var idx = g.input(ints({0, 1}, {2}));
  EXPECT_ERROR(ad::gather(x, idx, 2), "gather", "axis 2", "[2,3]");
  EXPECT_ERROR(ad::gather(x, idx, -3), "gather", "axis -3", "[2,3]");
  // a scalar has no axis at all
  ad::Var s = g.input(randn({}));
  EXPECT_ERROR(ad::softmax(s), "softmax", "[]");
  EXPECT_ERROR(ad::log_softmax(s), "log_softmax", "[]");
  EXPECT_ERROR(ad::logsumexp(s), "logsumexp", "[]");
  EXPECT_ERROR(ad::slice(s, 0, 0, 1), "slice", "[]");
  EXPECT_ERROR(ad::gather(s, idx, 0), "gather", "f32[]");
  EXPECT_ERROR(ad::sum(s, {0}), "sum", "[]");
  CHECK(ad::sum(s).shape() == ad::Shape{});  // all axes of a scalar: fine
  // Var::dim
  EXPECT_ERROR(x.dim(2), "dim", "[2,3]");
}

TEST_CASE("misuse: repeated axis in a reduction") {
  ad::Graph g;
  ad::Var x = g.input(randn({2, 3, 4}));
  EXPECT_ERROR(ad::sum(x, {1, -2}), "sum", "repeated", "[2,3,4]");
  EXPECT_ERROR(ad::sum(x, {0, 0}), "sum", "repeated", "[2,3,4]");
  EXPECT_ERROR(ad::mean(x, {2, -1}), "mean", "repeated", "[2,3,4]");
  EXPECT_ERROR(ad::max(x, {1, 1}), "max", "repeated", "[2,3,4]");
  CHECK(ad::sum(x, {2, 0}).shape() == ad::Shape{3});  // unsorted but distinct: fine
}

TEST_CASE("misuse: slice ranges") {
  ad::Graph g;
  ad::Var x = g.input(randn({2, 3}));
  EXPECT_ERROR(ad::slice(x, 1, 2, 1), "slice", "range", "[2, 1)", "[2,3]");
  EXPECT_ERROR(ad::slice(x, 1, 4, 5), "slice", "range", "[2,3]");
  EXPECT_ERROR(ad::slice(x, 1, -5, 2), "slice", "range", "[2,3]");
  EXPECT_ERROR(ad::slice(x, 0, 1, -2), "slice", "range", "[2,3]");  // stop -2 -> 0 < start 1
  CHECK(ad::slice(x, 1, 1, 100).shape() == ad::Shape{2, 2});  // stop clamps to the dim
  CHECK(ad::slice(x, 1, -2, -1).shape() == ad::Shape{2, 1});
  CHECK(ad::slice(x, 1, 3, 3).shape() == ad::Shape{2, 0});    // empty is fine
}

TEST_CASE("misuse: concat") {
  ad::Graph g;
  ad::Var a = g.input(randn({2, 3})), b = g.input(randn({4, 2})), c = g.input(randn({2, 3, 1}));
  EXPECT_ERROR(ad::concat({a, b}, 0), "concat", "dim 1 differs", "f32[2,3]", "f32[4,2]");
  EXPECT_ERROR(ad::concat({a, c}, 0), "concat", "ranks differ", "f32[2,3]", "f32[2,3,1]");
  EXPECT_ERROR(ad::concat({a, g.input(randn({2, 3}, ad::DType::f64))}, 0), "concat", "dtype mismatch", "f32[2,3]",
               "f64[2,3]");
  EXPECT_ERROR(ad::concat({}, 0), "concat", "no inputs");
  EXPECT_ERROR(ad::concat({g.input(randn({})), g.input(randn({}))}, 0), "concat", "[]");
  ad::Graph other;
  EXPECT_ERROR(ad::concat({a, other.input(randn({2, 3}))}, 0), "concat", "different graphs");
  CHECK(ad::concat({a, a, g.input(randn({2, 1}))}, 1).shape() == ad::Shape{2, 7});
  // sizes that each fit but whose sum does not (symbolic: nothing is allocated)
  std::vector<ad::Var> huge(32, ad::full(a, {std::int64_t{1} << 59}, 0.0, ad::DType::f32));
  EXPECT_ERROR(ad::concat(huge, 0), "concat", "overflow", "f32[576460752303423488]");
}

TEST_CASE("misuse: gather and embedding") {
  ad::Graph g;
  ad::Var x = g.input(randn({5, 3}));
  EXPECT_ERROR(ad::gather(x, g.input(randn({3})), 0), "gather", "i64", "x f32[5,3]", "index f32[3]");
  EXPECT_ERROR(ad::embedding(g.input(randn({5, 3, 2})), g.input(ints({0}, {1}))), "embedding", "[5,3,2]");
  EXPECT_ERROR(ad::embedding(x, g.input(randn({2}))), "embedding", "ids must be i64", "f32[2]", "[5,3]");
  CHECK(ad::embedding(x, g.input(ints({4, 0}, {1, 2}))).shape() == ad::Shape{1, 2, 3});
  ad::Var x6 = g.input(randn({2, 1, 1, 1, 1, 3}));
  EXPECT_ERROR(ad::gather(x6, g.input(ints({0, 0, 0, 0}, {1, 1, 2, 2})), 0), "gather", "rank 9", "maximum of 8",
               "x f32[2,1,1,1,1,3]", "index i64[1,1,2,2]");

  // out of range indices are data: they throw at run time, naming gather and the index
  ad::Tensor idx = ints({0, 7, 2}, {3});
  ad::Var y = ad::gather(x, g.input(idx), 0);
  CHECK(y.shape() == ad::Shape{3, 3});
  EXPECT_ERROR(ad::eval(y), "gather", "index 7", "[0, 5)", "[5,3]");
  ad::Var n = ad::gather(x, g.input(ints({-1}, {1})), 0);
  EXPECT_ERROR(ad::eval(n), "gather", "index -1");
  ad::Var col = ad::gather(x, g.input(ints({3}, {1})), 1);
  EXPECT_ERROR(ad::eval(col), "gather", "index 3", "[0, 3)");

  // ... and from backward; the graph stays usable once the data is fixed
  ad::Rng rng(9);
  ad::Parameter table = ad::Parameter::randn({5, 3}, rng);
  ad::Graph g2;
  ad::Tensor ids = ints({1, 5, 4}, {3});
  ad::Var loss = ad::sum(ad::embedding(table, g2.input(ids)));
  EXPECT_ERROR(ad::backward(loss), "gather", "index 5");
  CHECK_FALSE(table.has_grad());
  ids.data<std::int64_t>()[1] = 1;  // the input leaf shares the tensor
  ad::Report r = ad::backward(loss);
  CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  REQUIRE(table.has_grad());
  CHECK(table.grad().to_vector() == std::vector<double>{0, 0, 0, 2, 2, 2, 0, 0, 0, 0, 0, 0, 1, 1, 1});
}

TEST_CASE("misuse: cross_entropy and mse") {
  ad::Graph g;
  ad::Var logits = g.input(randn({4, 5}));
  EXPECT_ERROR(ad::cross_entropy(logits, g.input(ints({0, 1, 2, 3, 4}, {5}))), "cross_entropy", "labels",
               "logits f32[4,5]", "labels i64[5]");
  EXPECT_ERROR(ad::cross_entropy(logits, g.input(ints({0, 1, 2, 3}, {4, 1}))), "cross_entropy", "i64[4,1]");
  EXPECT_ERROR(ad::cross_entropy(logits, g.input(randn({4}))), "cross_entropy", "i64", "labels f32[4]");
  EXPECT_ERROR(ad::cross_entropy(g.input(ints({0, 1}, {1, 2})), g.input(ints({0}, {1}))), "cross_entropy", "i64[1,2]");
  EXPECT_ERROR(ad::cross_entropy(g.input(randn({4, 0})), g.input(ints({0, 0, 0, 0}, {4}))), "cross_entropy",
               "no classes", "f32[4,0]");
  // labels out of range: run time
  ad::Var bad = ad::cross_entropy(logits, g.input(ints({0, 5, 1, 2}, {4})));
  EXPECT_ERROR(ad::eval(bad), "cross_entropy", "label 5", "[0, 5)");
  ad::Var neg = ad::cross_entropy(logits, g.input(ints({0, 1, -1, 2}, {4})), ad::Reduction::sum);
  EXPECT_ERROR(ad::eval(neg), "cross_entropy", "label -1", "position 2");
  ad::Rng rng(4);
  ad::Parameter w = ad::Parameter::randn({3, 5}, rng);
  ad::Graph g2;
  ad::Var l = ad::cross_entropy(ad::matmul(g2.input(randn({4, 3})), w), g2.input(ints({0, 1, 2, 9}, {4})));
  EXPECT_ERROR(ad::backward(l), "cross_entropy", "label 9");
  CHECK_FALSE(w.has_grad());

  EXPECT_ERROR(ad::mse(g.input(randn({2, 3})), g.input(randn({3, 2}))), "mse", "shapes differ", "a f32[2,3]",
               "b f32[3,2]");
  EXPECT_ERROR(ad::mse(g.input(randn({2, 3})), g.input(randn({3}))), "mse", "f32[2,3]", "f32[3]");
}

TEST_CASE("misuse: layer_norm and rms_norm parameters") {
  ad::Graph g;
  ad::Var x = g.input(randn({4, 8}));
  ad::Var g8 = g.input(randn({8})), g7 = g.input(randn({7}));
  EXPECT_ERROR(ad::layer_norm(x, g7, g8), "layer_norm", "x f32[4,8]", "gamma f32[7]", "beta f32[8]");
  EXPECT_ERROR(ad::layer_norm(x, g8, g7), "layer_norm", "beta f32[7]");
  EXPECT_ERROR(ad::layer_norm(x, g.input(randn({1, 8})), g8), "layer_norm", "gamma f32[1,8]");
  EXPECT_ERROR(ad::rms_norm(x, g7), "rms_norm", "x f32[4,8]", "gamma f32[7]");
  EXPECT_ERROR(ad::rms_norm(x, g.input(randn({8}, ad::DType::f64))), "rms_norm", "f64[8]");
  EXPECT_ERROR(ad::rms_norm(g.input(randn({})), g.input(randn({1}))), "rms_norm", "f32[]");
  EXPECT_ERROR(ad::layer_norm(x, g8, g8, -1.0), "layer_norm", "eps");
  EXPECT_ERROR(ad::rms_norm(x, g8, std::numeric_limits<double>::quiet_NaN()), "rms_norm", "eps");
}

TEST_CASE("misuse: dropout probability") {
  ad::Graph g;
  ad::Var x = g.input(randn({2, 3}));
  ad::Rng rng(1);
  EXPECT_ERROR(ad::dropout(x, 1.0, rng), "dropout", "p must be in [0, 1)", "x f32[2,3]");
  EXPECT_ERROR(ad::dropout(x, -0.1, rng), "dropout", "p must be in [0, 1)", "f32[2,3]");
  EXPECT_ERROR(ad::dropout(x, 1.5, 0, 0), "dropout", "f32[2,3]");
  EXPECT_ERROR(ad::dropout(x, std::numeric_limits<double>::quiet_NaN(), 0, 0), "dropout", "f32[2,3]");
  // p = 0 is the identity
  CHECK(ad::bitwise_equal(ad::eval(ad::dropout(x, 0.0, rng)), ad::eval(x)));
}

TEST_CASE("misuse: backward seeds and losses") {
  ad::Rng rng(2);
  ad::Parameter w = ad::Parameter::randn({3, 2}, rng);
  ad::Graph g;
  ad::Var x = g.input(randn({4, 3}));
  ad::Var y = ad::tanh(ad::matmul(x, w));
  EXPECT_ERROR(ad::backward(y), "backward: loss", "not a scalar", "f32[4,2]");
  EXPECT_ERROR(ad::grad(y, {x}), "not a scalar", "f32[4,2]");
  EXPECT_ERROR(ad::backward(y, ad::policy::keep_all(), g.input(randn({2, 4}))), "seed", "f32[2,4]", "f32[4,2]");
  EXPECT_ERROR(ad::backward(y, ad::policy::keep_all(), g.input(randn({4, 2}, ad::DType::f64))), "seed", "f64[4,2]",
               "f32[4,2]");
  ad::Graph other;
  EXPECT_ERROR(ad::backward(y, ad::policy::keep_all(), other.input(randn({4, 2}))), "seed", "another graph");
  CHECK_FALSE(w.has_grad());
  // the right seed works: d/dw sum(seed * y)
  ad::Report r = ad::backward(y, ad::policy::keep_all(), g.input(ad::Tensor::ones({4, 2})));
  CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  CHECK(w.has_grad());
}

TEST_CASE("misuse: a loss that depends on no Parameter") {
  ad::Graph g;
  ad::Var x = g.input(randn({3, 4}, ad::DType::f64)), unused = g.input(randn({2}, ad::DType::f64));
  ad::Var loss = ad::sum(ad::tanh(x));
  EXPECT_ERROR(ad::backward(loss), "backward", "does not depend on any Parameter", "sum#", "f64[]");
  // ad::grad differentiates with respect to anything; an unreachable wrt gets zeros
  ad::Var later = ad::exp(x);  // built after the loss: unreachable too
  auto gs = ad::grad(loss, {x, unused, later});
  REQUIRE(gs.size() == 3);
  CHECK(gs[1].shape() == ad::Shape{2});
  CHECK(gs[1].dtype() == ad::DType::f64);
  CHECK(ad::eval(gs[1]).to_vector() == std::vector<double>{0, 0});
  CHECK(gs[2].shape() == ad::Shape{3, 4});
  CHECK(ad::eval(gs[2]).to_vector() == std::vector<double>(12, 0.0));
  std::vector<double> xv = ad::eval(x).to_vector(), gx = ad::eval(gs[0]).to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) CHECK(gx[i] == doctest::Approx(1 - std::tanh(xv[i]) * std::tanh(xv[i])));
  EXPECT_ERROR(ad::grad(loss, {ad::Var{}}), "grad", "undefined");
}

TEST_CASE("misuse: Vars from two graphs, Parameters only, undefined Vars, empty Parameters") {
  ad::Graph g1, g2;
  ad::Var a = g1.input(randn({2, 3})), b = g2.input(randn({2, 3}));
  EXPECT_ERROR(ad::add(a, b), "add", "different graphs", "f32[2,3]");
  EXPECT_ERROR(ad::matmul(a, ad::transpose(b)), "matmul", "different graphs");
  EXPECT_ERROR(ad::grad(ad::sum(a), {b}), "grad", "another graph");

  ad::Rng rng(5);
  ad::Parameter p = ad::Parameter::randn({2, 3}, rng), q = ad::Parameter::randn({3, 2}, rng);
  EXPECT_ERROR(ad::add(p, p), "add", "every input is a Parameter", "g.param");
  EXPECT_ERROR(ad::matmul(p, q), "matmul", "every input is a Parameter");
  EXPECT_ERROR(ad::tanh(p), "tanh", "every input is a Parameter");
  EXPECT_ERROR(ad::sum(p), "sum", "every input is a Parameter");
  CHECK(ad::matmul(g1.param(p), q).shape() == ad::Shape{2, 2});  // one Var places the rest

  ad::Var u;
  CHECK_FALSE(u.defined());
  EXPECT_ERROR(ad::add(u, u), "add", "undefined");
  EXPECT_ERROR(ad::add(a, u), "add", "undefined", "f32[2,3]");
  EXPECT_ERROR(ad::add(u, a), "add", "undefined");
  EXPECT_ERROR(ad::tanh(u), "tanh", "undefined");
  EXPECT_ERROR(ad::sum(u), "sum", "undefined");
  EXPECT_ERROR(ad::softmax(u), "softmax", "undefined");
  EXPECT_ERROR(ad::transpose(u), "transpose", "undefined");
  EXPECT_ERROR(ad::slice(u, 0, 0, 1), "slice", "undefined");
  EXPECT_ERROR(ad::dropout(u, 0.5, rng), "dropout", "undefined");
  EXPECT_ERROR(ad::concat({a, u}), "concat", "undefined");
  EXPECT_ERROR(ad::full(u, {2}, 0.0, ad::DType::f32), "full", "undefined");
  EXPECT_ERROR(ad::eval(u), "eval", "undefined");
  EXPECT_ERROR(ad::backward(u), "backward", "undefined");
  EXPECT_ERROR(ad::grad(u, {a}), "grad", "undefined");
  EXPECT_ERROR(u.shape(), "undefined");
  EXPECT_ERROR(u.value(), "undefined");
  EXPECT_ERROR(u.str(), "undefined");
  EXPECT_ERROR(g1.input(ad::Tensor()), "Graph::input", "undefined");

  ad::Parameter empty;
  CHECK_FALSE(empty.defined());
  EXPECT_ERROR(empty.value(), "Parameter", "empty");
  EXPECT_ERROR(empty.grad(), "Parameter", "empty");
  EXPECT_ERROR(empty.shape(), "Parameter", "empty");
  EXPECT_ERROR(empty.zero_grad(), "Parameter", "empty");
  EXPECT_ERROR(g1.param(empty), "param", "empty");
  EXPECT_ERROR(ad::add(a, empty), "add", "empty Parameter", "f32[2,3]");
  EXPECT_ERROR(ad::matmul(empty, a), "matmul", "empty Parameter");
  EXPECT_ERROR(ad::sum(empty), "sum", "empty Parameter");
  EXPECT_ERROR(ad::Parameter(ad::Tensor()), "Parameter", "undefined");
}

TEST_CASE("misuse: Tensor construction and access") {
  std::vector<float> five{1, 2, 3, 4, 5};
  EXPECT_ERROR(ad::Tensor::from(std::span<const float>(five), {2, 3}), "Tensor::from", "5 values", "[2,3]");
  std::vector<std::int64_t> two{1, 2};
  EXPECT_ERROR(ad::Tensor::from(std::span<const std::int64_t>(two), {3}), "Tensor::from", "[3]");
  EXPECT_ERROR(ad::Tensor::from(std::span<const float>(five), {5, -1}), "Tensor::from", "[5,-1]");
  ad::Tensor t = randn({2, 3});
  EXPECT_ERROR(t.data<double>(), "data<f64>", "f32", "[2,3]");
  EXPECT_ERROR(t.data<std::int64_t>(), "data<i64>", "f32", "[2,3]");
  EXPECT_ERROR(std::as_const(t).data<double>(), "data<f64>", "[2,3]");
  EXPECT_ERROR(ad::Tensor().data<float>(), "undefined");
  EXPECT_ERROR(t.item(), "Tensor::item", "[2,3]", "6 elements");
  EXPECT_ERROR(ad::Tensor::empty({0}).item(), "Tensor::item", "[0]");
  EXPECT_ERROR(ad::Tensor().item(), "item", "undefined");
  EXPECT_ERROR(ad::Tensor().to_vector(), "undefined");
  EXPECT_ERROR(ad::Tensor().to(ad::DType::f64), "undefined");
  CHECK(ad::Tensor::full({1, 1, 1}, 4.0).item() == 4.0);
  // f16 data has no typed accessor; raw() works
  CHECK(t.to(ad::DType::f16).raw() != nullptr);
}

TEST_CASE("misuse: double backward through an op with no backward rule") {
  ad::Graph g;
  ad::Var x = g.input(randn({2, 4}, ad::DType::f64));
  ad::Var gamma = g.input(randn({4}, ad::DType::f64)), beta = g.input(randn({4}, ad::DType::f64));
  ad::Var gs = ad::grad(ad::sum(ad::mul(ad::layer_norm(x, gamma, beta), x)), {x})[0];  // layer_norm_backward
  ad::Var z = ad::sum(ad::mul(gs, gs));
  EXPECT_ERROR(ad::grad(z, {x}), "grad", "layer_norm_backward", "no backward rule", "f64[2,4]", "double backward");
  // the graph is still usable
  CHECK(std::isfinite(ad::eval(z).item()));

  // the activations' backward ops do have rules (docs/design.md): a gradient
  // penalty through each reaches the Parameter behind it
  ad::Rng rng(3);
  struct Case { const char* name; ad::Var (*f)(const ad::Operand&); };
  for (Case c : {Case{"relu_backward", ad::relu}, Case{"sigmoid_backward", ad::sigmoid}, Case{"gelu_backward", ad::gelu},
                 Case{"silu_backward", ad::silu}, Case{"tanh_backward", ad::tanh}}) {
    CAPTURE(c.name);
    ad::Parameter w = ad::Parameter::randn({4, 4}, rng, 1.0, ad::DType::f64);
    ad::Graph h;
    ad::Var xin = h.input(randn({2, 4}, ad::DType::f64));
    ad::Var hw = ad::matmul(xin, w);
    ad::Var gx = ad::grad(ad::sum(c.f(hw)), {xin})[0];
    ad::backward(ad::sum(ad::mul(gx, gx)));
    REQUIRE(w.has_grad());
    for (double v : w.grad().to_vector()) CHECK(std::isfinite(v));
  }
  // and so do softmax's, log_softmax's and cross_entropy's: a penalty on the input gradient of a
  // classifier's loss reaches its weights (the gradients themselves: tests/gradcheck_cases.cpp)
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    ad::Parameter w = ad::Parameter::randn({4, 3}, rng, 1.0, ad::DType::f64);
    ad::Graph h;
    ad::Var xin = h.input(randn({2, 4}, ad::DType::f64));
    ad::Var logits = ad::matmul(xin, w);
    std::vector<std::int64_t> labels{2, 0};
    ad::Var loss = k == 0   ? ad::cross_entropy(logits, h.input(ad::Tensor::from(labels, {2})))
                   : k == 1 ? ad::sum(ad::mul(ad::softmax(logits), logits))
                            : ad::sum(ad::log_softmax(logits));
    ad::Var gx = ad::grad(loss, {xin})[0];
    ad::backward(ad::sum(ad::mul(gx, gx)));
    REQUIRE(w.has_grad());
    double norm = 0;
    for (double v : w.grad().to_vector()) {
      CHECK(std::isfinite(v));
      norm += v * v;
    }
    CHECK(norm > 0);
  }
}

TEST_CASE("empty tensors: what works") {
  ad::Rng rng(6);
  ad::Parameter w = ad::Parameter::randn({0, 3}, rng);  // zero rows
  ad::Graph g;
  ad::Var e = g.input(ad::Tensor::empty({0, 3}));
  // elementwise: empty in, empty out
  ad::Var t = ad::tanh(e);
  CHECK(t.shape() == ad::Shape{0, 3});
  CHECK(ad::eval(t).numel() == 0);
  ad::Var b = ad::add(e, g.input(randn({3})));  // broadcasting an empty dim
  CHECK(b.shape() == ad::Shape{0, 3});
  CHECK(ad::eval(b).numel() == 0);
  CHECK(ad::eval(ad::softmax(e)).numel() == 0);
  CHECK(ad::eval(ad::layer_norm(e, g.input(randn({3})), g.input(randn({3})))).numel() == 0);
  CHECK(ad::eval(ad::dropout(e, 0.5, rng)).numel() == 0);
  // sum over an empty axis is 0 (an empty sum)
  CHECK(ad::eval(ad::sum(e, {0})).to_vector() == std::vector<double>{0, 0, 0});
  CHECK(ad::eval(ad::sum(e)).item() == 0);
  CHECK(ad::eval(ad::sum(e, {1})).numel() == 0);          // sums over a non-empty axis of nothing
  CHECK(ad::eval(ad::max(e, {1})).shape() == ad::Shape{0});  // max over a non-empty axis: fine
  // logsumexp over an empty axis is log(0) = -inf
  std::vector<double> lse = ad::eval(ad::logsumexp(e, 0)).to_vector();
  REQUIRE(lse.size() == 3);
  for (double v : lse) CHECK(v == -std::numeric_limits<double>::infinity());
  // matmul with K = 0 gives zeros
  ad::Var k0 = ad::matmul(g.input(ad::Tensor::empty({2, 0})), g.input(ad::Tensor::empty({0, 4})));
  CHECK(ad::eval(k0).to_vector() == std::vector<double>(8, 0.0));
  // slicing to nothing, concatenating nothing, gathering nothing
  ad::Var x = g.input(randn({2, 3}));
  CHECK(ad::eval(ad::slice(x, 0, 1, 1)).numel() == 0);
  CHECK(ad::bitwise_equal(ad::eval(ad::concat({x, ad::slice(x, 0, 2, 2)}, 0)), ad::eval(x)));
  CHECK(ad::eval(ad::gather(x, g.input(ad::Tensor::empty({0}, ad::DType::i64)), 0)).shape() == ad::Shape{0, 3});
  CHECK(ad::eval(ad::reshape(e, {-1, 3, 1})).shape() == ad::Shape{0, 3, 1});
  // cross_entropy / mse with sum reduction over nothing: 0
  ad::Var ce = ad::cross_entropy(g.input(ad::Tensor::empty({0, 4})), g.input(ad::Tensor::empty({0}, ad::DType::i64)),
                                 ad::Reduction::sum);
  CHECK(ad::eval(ce).item() == 0);
  CHECK(ad::eval(ad::mse(e, e, ad::Reduction::sum)).item() == 0);
  // backward through empty tensors: empty gradients, exact memory prediction
  ad::Var loss = ad::add(ad::sum(ad::tanh(ad::mul(e, w))), ad::sum(ad::matmul(x, ad::transpose(g.param(w)))));
  ad::Report r = ad::backward(loss);
  CHECK(r.predicted_peak_bytes == r.measured_peak_bytes);
  CHECK(ad::eval(loss).item() == 0);
  REQUIRE(w.has_grad());
  CHECK(w.grad().shape() == ad::Shape{0, 3});
}

TEST_CASE("empty tensors: what throws") {
  ad::Graph g;
  ad::Var e = g.input(ad::Tensor::empty({0, 3}));
  EXPECT_ERROR(ad::max(e, {0}), "max", "empty axis", "f32[0,3]");
  EXPECT_ERROR(ad::max(e), "max", "empty axis", "f32[0,3]");
  // a mean over no elements has no value: thrown at build time, like the losses
  EXPECT_ERROR(ad::mean(e, {0}), "mean", "empty axis", "f32[0,3]");
  EXPECT_ERROR(ad::mean(e), "mean", "f32[0,3]");
  CHECK(ad::mean(e, {1}).shape() == ad::Shape{0});  // a mean of 3 elements, zero times: fine
  EXPECT_ERROR(ad::cross_entropy(g.input(ad::Tensor::empty({0, 4})), g.input(ad::Tensor::empty({0}, ad::DType::i64))),
               "cross_entropy", "empty batch", "f32[0,4]", "i64[0]");
  EXPECT_ERROR(ad::mse(e, e), "mse", "no elements", "f32[0,3]");
  EXPECT_ERROR(ad::reshape(e, {-1, 0}), "reshape", "f32[0,3]");  // ambiguous -1
}

TEST_CASE("misuse: a moved-from Graph throws instead of crashing") {
  ad::Graph g;
  ad::Var x = g.input(ad::Tensor::ones({2}));
  ad::Graph h = std::move(g);
  CHECK(h.num_nodes() == 1);
  CHECK(ad::sum(x).value().item() == 2.0);  // Vars follow the moved graph
  CHECK_THROWS_WITH_AS(g.input(ad::Tensor::ones({2})), "Graph: use of a moved-from Graph", ad::Error);
  CHECK_THROWS_WITH_AS(g.param(ad::Parameter::zeros({2})), "Graph: use of a moved-from Graph", ad::Error);
  CHECK_THROWS_AS(g.num_nodes(), ad::Error);
  CHECK_THROWS_AS(g.live_bytes(), ad::Error);
  CHECK_THROWS_AS(g.record(nullptr), ad::Error);
}

TEST_CASE("a gradient penalty through relu or clamp gives no gradient to a parameter seen only through the mask") {
  // relu_backward(y, dy) reads y only for its mask [y > 0] (clamp_backward x
  // for [lo <= x <= hi]): piecewise constant, so a parameter reaching a
  // penalty only that way gets no gradient, as with a comparison
  ad::Rng rng(8);
  for (int which = 0; which < 2; ++which) {
    CAPTURE(which);
    ad::Parameter w1 = ad::Parameter::randn({3, 4}, rng, 1.0, ad::DType::f64),
                  b1 = ad::Parameter::randn({4}, rng, 1.0, ad::DType::f64),
                  w2 = ad::Parameter::randn({4, 1}, rng, 1.0, ad::DType::f64);
    ad::Graph g;
    ad::Var x = g.input(randn({2, 3}, ad::DType::f64));
    ad::Var pre = ad::add(ad::matmul(x, w1), b1);
    ad::Var h = which == 0 ? ad::relu(pre) : ad::clamp(pre, -0.5, 0.5);
    ad::Var dx = ad::grad(ad::sum(ad::matmul(h, w2)), {x})[0];  // reads b1 only through the mask
    ad::backward(ad::sum(ad::mul(dx, dx)));
    CHECK(w1.has_fresh_grad());
    CHECK(w2.has_fresh_grad());
    CHECK_FALSE(b1.has_fresh_grad());
  }
}
