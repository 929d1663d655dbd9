// Edge-case input that once crashed or was silently wrong: sizes whose
// element or byte count overflows 64 bits, offsets that overflow a bounds
// check, empty objects, zero-size gradients, padding that holds NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ad/ad.hpp"
#include "test_util.hpp"

namespace {
constexpr std::int64_t kHuge = std::int64_t(1) << 62;
ad::Tensor f32(std::vector<float> v, const ad::Shape& s) { return ad::Tensor::from(std::span<const float>(v), s); }
}  // namespace

TEST_CASE("edge: shapes whose element or byte count overflows 64 bits are an ad::Error") {
  EXPECT_ERROR(ad::Tensor::zeros({kHuge}), "Tensor::empty", "[4611686018427387904]", "64-bit");
  EXPECT_ERROR(ad::Tensor::empty({kHuge + 1, 4}), "Tensor::empty", "64-bit");
  EXPECT_ERROR(ad::Tensor::empty({std::int64_t(1) << 61}, ad::DType::f64), "Tensor::empty");
  EXPECT_ERROR(ad::Parameter::zeros({kHuge}), "Tensor::empty");
  CHECK(ad::Shape{kHuge, kHuge, 0}.numel() == 0);  // a zero dimension anywhere: no elements
  CHECK(ad::Tensor::empty({kHuge, kHuge, 0}).numel() == 0);
  ad::Graph g;
  ad::Var a = g.input(ad::Tensor::ones({4}));
  EXPECT_ERROR(ad::reshape(a, {kHuge + 1, 4}), "reshape", "[4611686018427387905,4]");
  EXPECT_ERROR(ad::reshape(a, {kHuge, 4, -1}), "reshape", "64-bit");
  EXPECT_ERROR(ad::full(a, {kHuge}, 1.0, ad::DType::f32), "full", "64-bit");
  EXPECT_ERROR(ad::broadcast_to(g.input(ad::Tensor::ones({1, 1})), {kHuge + 1, 4}), "broadcast_to");
  // a large but representable size is an allocation failure, not a wrapped count
  CHECK(ad::full(a, {std::int64_t(1) << 40}, 1.0, ad::DType::f32).numel() == std::int64_t(1) << 40);
}

TEST_CASE("edge: part and Tensor::view offsets near INT64_MAX are an ad::Error") {
  ad::Tensor t = f32({1, 2, 3, 4}, {4});
  ad::Graph g;
  ad::Var a = g.input(t);
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  EXPECT_ERROR(ad::part(a, big, {2}), "part", "offset 9223372036854775807 do not fit");
  EXPECT_ERROR(ad::part(a, big - 100000000, {100000003}), "part", "do not fit");
  EXPECT_ERROR(ad::part(a, 0, {-1}), "part", "negative dimension", "[-1]");
  EXPECT_ERROR(ad::part(a, 0, {-2, -2}), "part", "negative dimension");
  EXPECT_ERROR(t.view(big - 1000000, {1000003}), "Tensor::view", "do not fit");
  EXPECT_ERROR(t.view(5, {0}), "Tensor::view", "do not fit");
  CHECK(t.view(4, {0}).numel() == 0);  // an empty view at the end is fine
  CHECK(ad::part(a, 2, {2}).value().to_vector() == std::vector<double>{3, 4});
}

TEST_CASE("edge: a default-constructed Hodlr is an ad::Error, not a crash") {
  ad::Hodlr h;
  EXPECT_ERROR(h.matvec(ad::Tensor::zeros({0}, ad::DType::f64)), "Hodlr::matvec", "empty");
}

TEST_CASE("edge: max over a zero-size tensor differentiates to an empty gradient") {
  ad::Graph g;
  ad::Var x = g.input(ad::Tensor::zeros({2, 0}, ad::DType::f64));
  auto gr = ad::grad(ad::sum(ad::max(x, {0})), {x});
  CHECK(gr[0].value().shape() == ad::Shape{2, 0});
}

TEST_CASE("edge: attention never reads keys and values past key_lengths (NaN padding)") {
  for (ad::DType dt : {ad::DType::f32, ad::DType::f64, ad::DType::bf16}) {
    for (bool causal : {false, true}) {
      const ad::Device cpu = ad::Device::cpu();
      auto clean = ad::test::padded_attention(dt, causal, 0.0, cpu);
      auto nan = ad::test::padded_attention(dt, causal, std::nan(""), cpu);
      auto inf = ad::test::padded_attention(dt, causal, HUGE_VAL, cpu);
      for (std::size_t t = 0; t < clean.size(); ++t) {
        INFO("dtype " << ad::dtype_name(dt) << " causal " << causal << " output " << t);
        for (double x : clean[t]) REQUIRE(std::isfinite(x));
        CHECK(nan[t] == clean[t]);  // bit for bit: the padding is not read
        CHECK(inf[t] == clean[t]);
      }
    }
  }
}

TEST_CASE("edge: an attention scale that overflows f32 is an ad::Error for f32 inputs") {
  ad::Graph g;
  ad::Rng rng(3);
  ad::Var q = g.input(ad::Tensor::randn({1, 1, 2, 4}, rng));
  ad::AttentionOptions o;
  o.scale = 1e300;
  EXPECT_ERROR(ad::attention(q, q, q, o), "attention", "scale", "f32");
  ad::Var q64 = g.input(ad::Tensor::randn({1, 1, 2, 4}, rng, ad::DType::f64));
  CHECK(ad::attention(q64, q64, q64, o).shape() == ad::Shape{1, 1, 2, 4});  // f64 computes in f64
}

TEST_CASE("edge: a non-finite score in semicrf_cumulative is an ad::Error naming b, t and c") {
  for (double bad : {-HUGE_VAL, HUGE_VAL, std::nan("")}) {
    ad::Graph g;
    ad::Var sc = g.input(f32({1, 2, 3, 4, 5, 6, 7, static_cast<float>(bad)}, {2, 2, 2}));
    ad::Var S = ad::semicrf_cumulative(sc);
    EXPECT_ERROR(S.value(), "semicrf_cumulative", "scores[1, 1, 1]", "not finite", "Tr, D or P");
  }
  // forbidding through P works and stays finite
  ad::Graph g;
  ad::Var S = ad::semicrf_cumulative(g.input(f32({1, 0, 2, 3}, {1, 2, 2})));
  ad::Var Tr = g.input(ad::Tensor::zeros({2, 2})), D = g.input(ad::Tensor::zeros({1, 2}));
  ad::Var P = g.input(f32({0, -INFINITY}, {2}));
  std::vector<std::int64_t> lv{2};
  ad::Var L = g.input(ad::Tensor::from(std::span<const std::int64_t>(lv), {1}));
  CHECK(std::isfinite(ad::semicrf_logz(S, Tr, D, P, L).value().item()));
}

TEST_CASE("edge: a dtype outside the enum is an ad::Error") {
  ad::Graph g;
  ad::Var x = g.input(ad::Tensor::ones({2}));
  EXPECT_ERROR(ad::cast(x, static_cast<ad::DType>(42)), "cast");
  EXPECT_ERROR(ad::full(x, {2}, 1.0, static_cast<ad::DType>(9)), "full", "value 9");
  EXPECT_ERROR(ad::Tensor::empty({2}, static_cast<ad::DType>(7)), "Tensor::empty", "invalid dtype");
}

TEST_CASE("edge: a half-precision node read twice is differentiated (gradients summed in f32)") {
  for (ad::DType half : {ad::DType::bf16, ad::DType::f16}) {
    ad::Rng rng(5);
    ad::Parameter p = ad::Parameter::randn({4}, rng);
    ad::Graph g;
    ad::Var qb = ad::cast(g.param(p), half);
    ad::backward(ad::add(ad::sum(ad::cast(qb, ad::DType::f32)), ad::sum(ad::mul_scalar(ad::cast(qb, ad::DType::f32), 2.0))));
    CHECK(p.grad().to_vector() == std::vector<double>(4, 3.0));
    // self-attention on one bf16 tensor: q, k and v are the same node
    ad::Parameter w = ad::Parameter::randn({1, 1, 8, 16}, rng, 0.5);
    ad::Graph g2;
    ad::Var x = ad::cast(g2.param(w), half);
    ad::Var y = ad::attention(x, x, x);
    ad::backward(ad::sum(ad::cast(y, ad::DType::f32)));
    for (double v : w.grad().to_vector()) CHECK(std::isfinite(v));
  }
}

TEST_CASE("edge: f32 sums over leading axes accumulate in double") {
  ad::Graph g;
  const std::int64_t n = (std::int64_t(1) << 24) + 64;  // past 2^24: f32 accumulation would stop at 2^24
  ad::Var x = g.input(ad::Tensor::ones({n, 2}));
  CHECK(ad::sum(x, {0}).value().to_vector() == std::vector<double>{static_cast<double>(n), static_cast<double>(n)});
  CHECK(ad::sum_to(x, {1, 2}).value().to_vector() == std::vector<double>{static_cast<double>(n), static_cast<double>(n)});
  CHECK(ad::mean(x, {0}).value().to_vector() == std::vector<double>{1.0, 1.0});
  // the bias gradient of x + b (a sum_to over the batch) is exact too, and the peak is still predicted
  ad::Parameter b = ad::Parameter::zeros({2});
  ad::Report r = ad::backward(ad::sum(ad::add(x, g.param(b))));
  CHECK(b.grad().to_vector() == std::vector<double>{static_cast<double>(n), static_cast<double>(n)});
  CHECK(r.measured_peak_bytes == r.predicted_peak_bytes);
}

TEST_CASE("edge: random draws and conversions to i64 reject what they cannot represent") {
  ad::Rng rng(1);
  const std::int64_t big = std::int64_t(1) << 40;
  ad::Tensor t = ad::Tensor::randint({4096}, rng, big);
  std::int64_t hi = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const std::int64_t v = t.data<std::int64_t>()[i];
    REQUIRE(v >= 0);
    REQUIRE(v < big);
    hi = std::max(hi, v);
  }
  CHECK(hi > (std::int64_t(1) << 39));  // the upper half is reached (4096 draws: fails with p = 2^-4096)
  ad::Rng r1(2), r2(2);  // n <= 2^32: the stream is unchanged (one draw per value)
  CHECK(ad::Tensor::randint({8}, r1, 10).numel() == 8);
  CHECK(r1.offset() == r2.offset() + 8);
  EXPECT_ERROR(ad::Tensor::full({2}, std::nan(""), ad::DType::i64), "does not convert to i64");
  EXPECT_ERROR(ad::Tensor::full({2}, 1e30, ad::DType::i64), "does not convert to i64");
  std::vector<double> vals{2.0, HUGE_VAL};
  EXPECT_ERROR(ad::Tensor::from(std::span<const double>(vals), {2}).to(ad::DType::i64), "element 1", "i64");
  EXPECT_ERROR(ad::Tensor::randn({2}, rng, ad::DType::i64), "Tensor::randn", "not a float type");
  EXPECT_ERROR(ad::Tensor::randn({2}, rng, ad::DType::f32, 0.0, -1.0), "Tensor::randn", "stddev");
  EXPECT_ERROR(ad::Tensor::randn({2}, rng, ad::DType::f32, 0.0, std::nan("")), "Tensor::randn");
  EXPECT_ERROR(ad::Tensor::uniform({2}, rng, ad::DType::f32, 5.0, 1.0), "Tensor::uniform", "lo <= hi");
  EXPECT_ERROR(ad::Tensor::uniform({2}, rng, ad::DType::i64), "Tensor::uniform", "not a float type");
  EXPECT_ERROR(ad::Tensor::from(std::span<const double>(vals), {-2, -1}), "Tensor::from", "negative");
}

TEST_CASE("edge: layer and factorize options that make no sense are an ad::Error") {
  ad::Rng rng(1);
  ad::nn::LinearOptions lo;
  lo.init_stddev = std::nan("");
  EXPECT_ERROR(ad::nn::Linear(4, 4, rng, lo), "Linear", "init_stddev");
  lo.init_stddev = -1;
  EXPECT_ERROR(ad::nn::Linear(4, 4, rng, lo), "Linear", "init_stddev");
  ad::nn::EmbeddingOptions eo;
  eo.init_stddev = -1;
  EXPECT_ERROR(ad::nn::Embedding(4, 4, rng, eo), "Embedding", "init_stddev");
  ad::Tensor h = ad::Tensor::zeros({3, 3}, ad::DType::f64);
  EXPECT_ERROR(ad::semiseparable_factorize(h, 1, -5), "semiseparable_factorize", "max_iters");
  h.data<double>()[4] = std::nan("");
  EXPECT_ERROR(ad::semiseparable_factorize(h, 1), "semiseparable_factorize", "h[1, 1]", "not finite");
}

TEST_CASE("edge: a default-constructed SemiseparableMixer says it is empty") {
  ad::SemiseparableMixer m;
  ad::Graph g;
  ad::Var x = g.input(ad::Tensor::zeros({1, 4, 8}));
  EXPECT_ERROR(m(x), "SemiseparableMixer", "empty");
}

TEST_CASE("edge: an invalid UTF-8 name is shown escaped in the error") {
  EXPECT_ERROR(ad::save_safetensors("never-written.safetensors", {{"bad\xff", ad::Tensor::ones({1})}}), "not valid UTF-8",
               "\"bad\\xff\"");
}

TEST_CASE("edge: semicrf_cumulative scores whose sums overflow f32 are an ad::Error") {
  ad::Graph g;
  ad::Var sc = g.input(f32({3e38f, -3e38f, 3e38f, -3e38f}, {1, 2, 2}));
  EXPECT_ERROR(ad::semicrf_cumulative(sc).value(), "semicrf_cumulative", "sequence 0 overflow f32");
}
