// Tensor basics: shapes, dtypes, storage sharing, conversions, the byte-exact
// allocator, the counter-based Rng (Philox known answer) and fmt printing.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ad/ad.hpp"

namespace {

std::vector<std::uint16_t> bits16(const ad::Tensor& t) {
  REQUIRE(ad::dtype_size(t.dtype()) == 2);
  std::vector<std::uint16_t> v(static_cast<std::size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.raw(), v.size() * 2);
  return v;
}
ad::Tensor f32(std::vector<float> v) { return ad::Tensor::from(std::span<const float>(v), {static_cast<std::int64_t>(v.size())}); }
float from_bits(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

}  // namespace

TEST_CASE("tensor: shapes and dtype sizes") {
  CHECK(ad::dtype_size(ad::DType::f32) == 4);
  CHECK(ad::dtype_size(ad::DType::f64) == 8);
  CHECK(ad::dtype_size(ad::DType::f16) == 2);
  CHECK(ad::dtype_size(ad::DType::bf16) == 2);
  CHECK(ad::dtype_size(ad::DType::i64) == 8);
  CHECK(std::string(ad::dtype_name(ad::DType::bf16)) == "bf16");

  ad::Tensor t = ad::Tensor::zeros({2, 3, 4}, ad::DType::f64);
  CHECK(t.defined());
  CHECK(t.rank() == 3);
  CHECK(t.numel() == 24);
  CHECK(t.nbytes() == 192);
  CHECK(t.dim(0) == 2);
  CHECK(t.dim(-1) == 4);
  CHECK(t.dim(-3) == 2);
  CHECK_THROWS_AS(t.dim(3), ad::Error);
  CHECK_THROWS_AS(t.dim(-4), ad::Error);
  CHECK(t.shape() == ad::Shape{2, 3, 4});
  CHECK(t.shape().str() == "[2,3,4]");
  CHECK(t.device() == ad::Device::cpu());

  ad::Tensor s = ad::Tensor::full({}, 2.5, ad::DType::f32);  // rank 0: one element
  CHECK(s.rank() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item() == 2.5);
  CHECK(s.shape().str() == "[]");

  ad::Tensor e = ad::Tensor::empty({3, 0, 2});
  CHECK(e.numel() == 0);
  CHECK(e.nbytes() == 0);
  CHECK(e.defined());
  CHECK(e.to_vector().empty());

  CHECK_FALSE(ad::Tensor().defined());
  CHECK_THROWS_AS(ad::Tensor::empty({2, -1}), ad::Error);
}

TEST_CASE("tensor: from, to_vector, at, item, data<T>") {
  std::vector<double> v{1, 2, 3, 4, 5, 6};
  ad::Tensor t = ad::Tensor::from(std::span<const double>(v), {2, 3});
  CHECK(t.dtype() == ad::DType::f64);
  CHECK(t.to_vector() == v);
  CHECK(t.at({1, 2}) == 6);
  CHECK(t.at({0, 1}) == 2);
  CHECK(t.data<double>()[4] == 5);
  CHECK_THROWS_AS(t.at({2, 0}), ad::Error);
  CHECK_THROWS_AS(t.at({0}), ad::Error);

  std::vector<std::int64_t> iv{7, -3, 0};
  ad::Tensor it = ad::Tensor::from(std::span<const std::int64_t>(iv), {3});
  CHECK(it.dtype() == ad::DType::i64);
  CHECK(it.to_vector() == std::vector<double>{7, -3, 0});

  ad::Tensor ft = f32({0.5f, -1.25f});
  CHECK(ft.dtype() == ad::DType::f32);
  CHECK(ft.to_vector() == std::vector<double>{0.5, -1.25});

  // fill and full
  ad::Tensor ones = ad::Tensor::ones({2, 2}, ad::DType::f64);
  CHECK(ones.to_vector() == std::vector<double>(4, 1.0));
  ones.fill(-3);
  CHECK(ones.to_vector() == std::vector<double>(4, -3.0));
}

TEST_CASE("tensor: reshape shares storage, clone does not") {
  std::vector<float> v{1, 2, 3, 4, 5, 6};
  ad::Tensor t = ad::Tensor::from(std::span<const float>(v), {2, 3});
  ad::Tensor r = t.reshape({3, 2});
  CHECK(r.same_storage(t));
  CHECK(r.shape() == ad::Shape{3, 2});
  r.data<float>()[5] = 60;
  CHECK(t.at({1, 2}) == 60);  // a write through the view shows in the original

  ad::Tensor c = t.clone();
  CHECK_FALSE(c.same_storage(t));
  CHECK(ad::bitwise_equal(c, t));
  c.data<float>()[0] = 100;
  CHECK(t.at({0, 0}) == 1);

  ad::Tensor copy = t;  // copies share, like shared_ptr
  CHECK(copy.same_storage(t));

  CHECK_THROWS_AS(t.reshape({4, 2}), ad::Error);
  CHECK_FALSE(ad::bitwise_equal(t, t.reshape({6})));  // shapes differ
  CHECK_FALSE(ad::bitwise_equal(t, t.to(ad::DType::f64)));  // dtypes differ
  CHECK(ad::bitwise_equal(ad::Tensor(), ad::Tensor()));
}

TEST_CASE("tensor: copy_from converts and checks shape") {
  ad::Tensor a = ad::Tensor::full({2, 2}, 1.5, ad::DType::f64);
  ad::Tensor b = ad::Tensor::zeros({2, 2}, ad::DType::f32);
  b.copy_from(a);
  CHECK(b.to_vector() == std::vector<double>(4, 1.5));
  ad::Tensor c = ad::Tensor::zeros({4}, ad::DType::f32);
  CHECK_THROWS_AS(c.copy_from(a), ad::Error);
  // a float that does not convert to i64 fails the copy before anything is written
  std::vector<double> src{1, 2, std::nan("")};
  ad::Tensor d = ad::Tensor::full({3}, 7.0, ad::DType::i64);
  CHECK_THROWS_WITH_AS(d.copy_from(ad::Tensor::from(std::span<const double>(src), {3})),
                       doctest::Contains("(element 2) does not convert to i64"), ad::Error);
  CHECK(d.to_vector() == std::vector<double>{7, 7, 7});
}

TEST_CASE("tensor: f32 <-> f16 conversions, known values") {
  const float inf = std::numeric_limits<float>::infinity();
  ad::Tensor t = f32({1.0f, -2.5f, 65504.0f, 1e-8f, 0.0f, -0.0f, inf, -inf, 65520.0f, 65519.0f,
                      5.9604645e-8f /* 2^-24, smallest subnormal */, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0.5f});
  ad::Tensor h = t.to(ad::DType::f16);
  CHECK(h.dtype() == ad::DType::f16);
  CHECK(h.nbytes() == 2 * static_cast<std::size_t>(t.numel()));
  auto b = bits16(h);
  CHECK(b[0] == 0x3C00);   // 1.0
  CHECK(b[1] == 0xC100);   // -2.5
  CHECK(b[2] == 0x7BFF);   // 65504, the largest finite f16
  CHECK(b[3] == 0x0000);   // 1e-8 underflows to +0
  CHECK(b[4] == 0x0000);
  CHECK(b[5] == 0x8000);   // -0 keeps its sign
  CHECK(b[6] == 0x7C00);   // +inf
  CHECK(b[7] == 0xFC00);   // -inf
  CHECK(b[8] == 0x7C00);   // 65520 is halfway to 2^16: rounds (to even) to inf
  CHECK(b[9] == 0x7BFF);   // 65519 rounds down to 65504
  CHECK(b[10] == 0x0001);  // 2^-24 survives as the smallest subnormal
  CHECK(b[11] == 0x3C00);  // 1 + half an ulp: ties to even -> 1
  CHECK(b[12] == 0x3C02);  // 1 + 1.5 ulp: ties to even -> 1 + 2 ulp
  CHECK(b[13] == 0x3800);  // 0.5

  std::vector<double> back = h.to(ad::DType::f32).to_vector();
  CHECK(back[0] == 1.0);
  CHECK(back[1] == -2.5);
  CHECK(back[2] == 65504.0);
  CHECK(back[3] == 0.0);
  CHECK(std::signbit(back[5]));
  CHECK(back[6] == inf);
  CHECK(back[7] == -inf);
  CHECK(back[10] == std::ldexp(1.0, -24));

  ad::Tensor n = f32({std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()});
  auto nb = bits16(n.to(ad::DType::f16));
  CHECK((nb[0] & 0x7C00) == 0x7C00);
  CHECK((nb[0] & 0x03FF) != 0);  // NaN, not inf
  CHECK(std::isnan(n.to(ad::DType::f16).to(ad::DType::f32).to_vector()[0]));
  CHECK(std::isnan(n.to(ad::DType::f16).to(ad::DType::f32).to_vector()[1]));
}

TEST_CASE("tensor: f32 <-> bf16 conversions, round to nearest even") {
  const float inf = std::numeric_limits<float>::infinity();
  ad::Tensor t = f32({1.0f, -2.5f, 65504.0f, 1e-8f, inf, -inf, from_bits(0x3F808000u) /* 1 + 2^-8: tie */,
                      from_bits(0x3F818000u) /* 1 + 3*2^-8: tie */, from_bits(0x3F808001u) /* just above the tie */,
                      from_bits(0x3F807FFFu) /* just below the tie */});
  ad::Tensor h = t.to(ad::DType::bf16);
  auto b = bits16(h);
  CHECK(b[0] == 0x3F80);
  CHECK(b[1] == 0xC020);
  CHECK(b[2] == 0x4780);  // 65504 rounds up to 65536 in bf16
  CHECK(b[4] == 0x7F80);
  CHECK(b[5] == 0xFF80);
  CHECK(b[6] == 0x3F80);  // tie, 0x3F80 is even: stays
  CHECK(b[7] == 0x3F82);  // tie, 0x3F81 is odd: rounds up to even
  CHECK(b[8] == 0x3F81);
  CHECK(b[9] == 0x3F80);
  std::vector<double> back = h.to(ad::DType::f32).to_vector();
  CHECK(back[0] == 1.0);
  CHECK(back[1] == -2.5);
  CHECK(back[2] == 65536.0);
  // bf16 keeps f32's exponent range: 1e-8 does not underflow (8 bits of mantissa)
  CHECK(back[3] == doctest::Approx(1e-8).epsilon(1.0 / 256));
  CHECK(back[3] > 0);
  CHECK(back[4] == inf);
  CHECK(back[5] == -inf);

  ad::Tensor n = f32({std::numeric_limits<float>::quiet_NaN(), from_bits(0x7F800001u) /* signalling NaN */});
  ad::Tensor nb = n.to(ad::DType::bf16);
  for (auto u : bits16(nb)) {
    CHECK((u & 0x7F80) == 0x7F80);
    CHECK((u & 0x007F) != 0);  // still a NaN (a low-payload NaN must not collapse to inf)
  }
  for (double d : nb.to(ad::DType::f64).to_vector()) CHECK(std::isnan(d));
}

TEST_CASE("tensor: f64 <-> f32 <-> f16 <-> bf16 chains") {
  std::vector<double> v{1.0, -2.5, 0.1, 3.0e38, 1e-300};
  ad::Tensor d = ad::Tensor::from(std::span<const double>(v), {5});
  std::vector<double> f = d.to(ad::DType::f32).to_vector();
  CHECK(f[0] == 1.0);
  CHECK(f[1] == -2.5);
  CHECK(f[2] == static_cast<double>(0.1f));
  CHECK(f[3] == static_cast<double>(3.0e38f));
  CHECK(f[4] == 0.0);  // underflows in f32
  std::vector<double> h = d.to(ad::DType::f16).to_vector();
  CHECK(h[0] == 1.0);
  CHECK(h[1] == -2.5);
  CHECK(h[2] == doctest::Approx(0.1).epsilon(1e-3));
  CHECK(std::isinf(h[3]));
  std::vector<double> bh = d.to(ad::DType::bf16).to(ad::DType::f16).to(ad::DType::f64).to_vector();
  CHECK(bh[0] == 1.0);
  CHECK(bh[1] == -2.5);
  // same dtype: an independent copy
  ad::Tensor same = d.to(ad::DType::f64);
  CHECK(ad::bitwise_equal(same, d));
  CHECK_FALSE(same.same_storage(d));
  // i64 <-> float
  CHECK(ad::Tensor::full({2}, 3.0, ad::DType::f32).to(ad::DType::i64).to_vector() == std::vector<double>{3, 3});
  CHECK(ad::Tensor::full({2}, 7.0, ad::DType::i64).to(ad::DType::f64).to_vector() == std::vector<double>{7, 7});
}

TEST_CASE("allocator: live and peak bytes, exact to the byte") {
  auto a = std::make_shared<ad::Allocator>();
  CHECK(a->live_bytes() == 0);
  CHECK(a->peak_bytes() == 0);
  {
    ad::Tensor t = ad::Tensor::empty({3, 5}, ad::DType::f32, ad::Device::cpu(), a);
    CHECK(a->live_bytes() == 60);
    CHECK(reinterpret_cast<std::uintptr_t>(t.raw()) % 64 == 0);
    ad::Tensor z = ad::Tensor::empty({0, 7}, ad::DType::f64, ad::Device::cpu(), a);  // zero bytes
    CHECK(z.raw() != nullptr);
    CHECK(z.raw() != t.raw());
    CHECK(a->live_bytes() == 60);
    CHECK(a->allocations() == 2);
    {
      ad::Tensor odd = ad::Tensor::empty({3}, ad::DType::f16, ad::Device::cpu(), a);  // 6 bytes, not rounded
      CHECK(a->live_bytes() == 66);
      ad::Tensor view = odd.reshape({1, 3});  // a view allocates nothing
      CHECK(a->live_bytes() == 66);
      CHECK(a->allocations() == 3);
      ad::Tensor c = t.clone(a);
      CHECK(a->live_bytes() == 126);
      CHECK(a->peak_bytes() == 126);
    }
    CHECK(a->live_bytes() == 60);
    CHECK(a->peak_bytes() == 126);
    CHECK(a->reset_peak() == 60);
    CHECK(a->peak_bytes() == 60);
  }
  CHECK(a->live_bytes() == 0);
  CHECK(a->peak_bytes() == 60);

  // The default (user) allocator counts too; compare deltas (other tensors live).
  auto d = ad::default_allocator();
  std::int64_t before = d->live_bytes();
  {
    ad::Tensor t = ad::Tensor::zeros({10}, ad::DType::f64);
    CHECK(d->live_bytes() - before == 80);
    ad::Tensor h = t.to(ad::DType::bf16);
    CHECK(d->live_bytes() - before == 100);
  }
  CHECK(d->live_bytes() == before);
}

TEST_CASE("rng: Philox-4x32-10 known answer (Random123)") {
  // Random123 kat_vectors: philox4x32 10 rounds, ctr {0,0,0,0}, key {0,0}
  ad::Philox4 r = ad::philox4x32_10(0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  // the stream view: draws 0..3 are the lanes of block 0
  for (unsigned i = 0; i < 4; ++i) CHECK(ad::philox_u32(0, i) == r.v[i]);
  // a different counter or key changes every lane
  ad::Philox4 c1 = ad::philox4x32_10(1, 0), k1 = ad::philox4x32_10(0, 1);
  for (int i = 0; i < 4; ++i) {
    CHECK(c1.v[i] != r.v[i]);
    CHECK(k1.v[i] != r.v[i]);
  }
  // uniform01 maps to (0, 1]
  CHECK(ad::uniform01(0) > 0.0f);
  CHECK(ad::uniform01(0xffffffffu) == 1.0f);
  CHECK(ad::uniform01_f64(0, 0) > 0.0);
  CHECK(ad::uniform01_f64(0xffffffffu, 0xffffffffu) == 1.0);
}

TEST_CASE("rng: determinism and non-overlapping reservations") {
  ad::Rng r(42);
  CHECK(r.seed() == 42);
  CHECK(r.offset() == 0);
  CHECK(r.reserve(10) == 0);
  CHECK(r.reserve(5) == 10);
  CHECK(r.offset() == 15);

  ad::Rng a(7), b(7), c(8);
  ad::Tensor ta = ad::Tensor::randn({64}, a), tb = ad::Tensor::randn({64}, b), tc = ad::Tensor::randn({64}, c);
  CHECK(ad::bitwise_equal(ta, tb));   // same seed, same offset
  CHECK_FALSE(ad::bitwise_equal(ta, tc));
  CHECK(a.offset() == 128);           // Box-Muller: two draws per element
  ad::Tensor ta2 = ad::Tensor::randn({64}, a);
  CHECK_FALSE(ad::bitwise_equal(ta, ta2));  // the next range, not the same numbers
  // the second tensor depends only on (seed, offset): skip the first range by hand
  ad::Rng d(7);
  d.reserve(128);
  CHECK(ad::bitwise_equal(ad::Tensor::randn({64}, d), ta2));
  // f64 draws use the same stream
  ad::Rng e(7);
  ad::Tensor td = ad::Tensor::randn({64}, e, ad::DType::f64);
  CHECK(td.to(ad::DType::f32).to_vector() == ta.to_vector());

  ad::Rng u1(3), u2(3);
  CHECK(ad::bitwise_equal(ad::Tensor::uniform({100}, u1), ad::Tensor::uniform({100}, u2)));
  ad::Rng i1(3), i2(3);
  CHECK(ad::bitwise_equal(ad::Tensor::randint({100}, i1, 10), ad::Tensor::randint({100}, i2, 10)));
}

TEST_CASE("rng: randn, uniform, randint statistics") {
  constexpr std::int64_t kN = 100000;
  ad::Rng r(2024);
  std::vector<double> v = ad::Tensor::randn({kN}, r, ad::DType::f64).to_vector();
  double s = 0, s2 = 0, s4 = 0;
  std::int64_t neg = 0, beyond3 = 0;
  for (double x : v) {
    REQUIRE(std::isfinite(x));
    s += x;
    s2 += x * x;
    s4 += x * x * x * x;
    neg += x < 0;
    beyond3 += std::fabs(x) > 3;
  }
  double n = static_cast<double>(kN), mean = s / n, var = s2 / n - mean * mean, kurt = s4 / n;
  // 5-sigma bounds: se(mean) = 0.0032, se(var) = 0.0045, se(E x^4) ~ 0.031
  CHECK(std::fabs(mean) < 0.016);
  CHECK(std::fabs(var - 1) < 0.023);
  CHECK(std::fabs(kurt - 3) < 0.16);
  CHECK(std::fabs(static_cast<double>(neg) / n - 0.5) < 0.008);
  CHECK(std::fabs(static_cast<double>(beyond3) / n - 0.0027) < 0.0009);

  ad::Rng r2(5);
  std::vector<double> m = ad::Tensor::randn({kN}, r2, ad::DType::f32, 3.0, 0.5).to_vector();
  double ms = 0, ms2 = 0;
  for (double x : m) { ms += x; ms2 += x * x; }
  CHECK(std::fabs(ms / n - 3.0) < 0.008);
  CHECK(std::fabs(ms2 / n - 9.0 - 0.25) < 0.05);

  ad::Rng r3(11);
  std::vector<double> u = ad::Tensor::uniform({kN}, r3, ad::DType::f64, -1.0, 3.0).to_vector();
  double us = 0, lo = 10, hi = -10;
  for (double x : u) { us += x; lo = std::min(lo, x); hi = std::max(hi, x); }
  CHECK(lo > -1.0);
  CHECK(hi <= 3.0);
  CHECK(std::fabs(us / n - 1.0) < 0.02);  // se 0.0037

  ad::Rng r4(13);
  ad::Tensor ri = ad::Tensor::randint({kN}, r4, 7);
  CHECK(ri.dtype() == ad::DType::i64);
  std::vector<std::int64_t> count(7, 0);
  for (double x : ri.to_vector()) {
    REQUIRE(x >= 0);
    REQUIRE(x < 7);
    ++count[static_cast<std::size_t>(x)];
  }
  for (auto c : count) CHECK(std::fabs(static_cast<double>(c) / n - 1.0 / 7) < 0.006);
  CHECK_THROWS_AS(ad::Tensor::randint({2}, r4, 0), ad::Error);
}

TEST_CASE("format: tensors, shapes, dtypes") {
  std::vector<float> v{1, 2, 3, 4, 5, 6};
  ad::Tensor t = ad::Tensor::from(std::span<const float>(v), {2, 3});
  CHECK(fmt::format("{}", t) == "Tensor f32[2,3]\n[[1, 2, 3],\n [4, 5, 6]]");
  CHECK(fmt::format("{}", ad::Tensor::full({}, 2.5, ad::DType::f64)) == "Tensor f64[]\n2.5");
  std::vector<std::int64_t> iv{1, -2, 3};
  CHECK(fmt::format("{}", ad::Tensor::from(std::span<const std::int64_t>(iv), {3})) == "Tensor i64[3]\n[1, -2, 3]");
  CHECK(fmt::format("{}", ad::Tensor()) == "Tensor(undefined)");
  // i64 values print as themselves, not through a double (2^63 - 1 and 2^53 + 1 have no double)
  std::vector<std::int64_t> i64s{9223372036854775807, 9007199254740993, -9223372036854775807 - 1};
  CHECK(fmt::format("{}", ad::Tensor::from(std::span<const std::int64_t>(i64s), {3})) ==
        "Tensor i64[3]\n[9223372036854775807, 9007199254740993, -9223372036854775808]");
  CHECK(fmt::format("{}", ad::Tensor::empty({0})) == "Tensor f32[0]\n[]");
  CHECK(fmt::format("{}", ad::Shape{2, 3}) == "[2,3]");
  CHECK(fmt::format("{}", ad::DType::bf16) == "bf16");

  // six per dim print in full; seven and more elide the middle
  std::vector<double> six{0, 1, 2, 3, 4, 5}, seven{0, 1, 2, 3, 4, 5, 6};
  CHECK(fmt::format("{}", ad::Tensor::from(std::span<const double>(six), {6})) == "Tensor f64[6]\n[0, 1, 2, 3, 4, 5]");
  CHECK(fmt::format("{}", ad::Tensor::from(std::span<const double>(seven), {7})) ==
        "Tensor f64[7]\n[0, 1, 2, ..., 4, 5, 6]");

  std::vector<double> big(100 * 100);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<double>(i);
  std::string s = fmt::format("{}", ad::Tensor::from(std::span<const double>(big), {100, 100}));
  CHECK(s.rfind("Tensor f64[100,100]\n", 0) == 0);
  CHECK(s.find("[[0, 1, 2, ..., 97, 98, 99],") != std::string::npos);
  CHECK(s.find("[9900, 9901, 9902, ..., 9997, 9998, 9999]]") != std::string::npos);
  CHECK(s.find(" ...,\n") != std::string::npos);  // the elided rows
  CHECK(s.find("5000") == std::string::npos);     // nothing from the middle
  CHECK(s.size() < 400);

  // values print with 6 significant digits
  CHECK(fmt::format("{}", ad::Tensor::full({1}, 1.0 / 3.0, ad::DType::f64)) == "Tensor f64[1]\n[0.333333]");

  ad::Graph g;
  ad::Var x = g.input(t);
  ad::Var y = ad::tanh(x);
  CHECK(fmt::format("{}", y) == "tanh#1 f32[2,3]");
  ad::Report r;
  r.policy = "keep_all";
  r.predicted_peak_bytes = r.measured_peak_bytes = 1024;
  std::string rs = fmt::format("{}", r);
  CHECK(rs.find("keep_all") != std::string::npos);
  CHECK(rs.find("1024 B") != std::string::npos);
}

TEST_CASE("shape: rank limit") {
  ad::Shape s{1, 2, 3, 4, 5, 6, 7, 8};
  CHECK(s.rank() == ad::kMaxRank);
  CHECK(s.numel() == 40320);
  try {
    s.push_back(9);
    FAIL("no throw");
  } catch (const ad::Error& e) {
    CHECK(std::string(e.what()).find("rank") != std::string::npos);
    CHECK(std::string(e.what()).find("8") != std::string::npos);
  }
  CHECK_THROWS_AS((ad::Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}), ad::Error);
  CHECK_THROWS_AS(ad::Shape(std::vector<std::int64_t>(9, 1)), ad::Error);
  CHECK(ad::Shape{}.numel() == 1);
  CHECK(ad::Shape{3, 0}.numel() == 0);
}

TEST_CASE("tensor: i64 above 2^53 converts to f32, bf16 and f16 with one rounding") {
  const std::int64_t two60 = std::int64_t{1} << 60;
  const std::vector<std::int64_t> v{two60 + (std::int64_t{1} << 36) + 1, two60 + (std::int64_t{1} << 52) + 1,
                                    std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(),
                                    -(two60 + (std::int64_t{1} << 36) + 1), 65519, 65520};
  ad::Tensor t = ad::Tensor::empty({static_cast<std::int64_t>(v.size())}, ad::DType::i64);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<std::int64_t>()[i] = v[i];
  const auto f = t.to(ad::DType::f32).to_vector(), b = t.to(ad::DType::bf16).to_vector(),
             h = t.to(ad::DType::f16).to_vector(), d = t.to(ad::DType::f64).to_vector();
  const double p60 = 1152921504606846976.0;
  CHECK(f[0] == p60 + 137438953472.0);  // 2^60 + 2^37: above the tie (was 2^60, rounded twice)
  CHECK(b[1] == p60 + 9007199254740992.0);  // 2^60 + 2^53 (was 2^60)
  for (std::size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i);
    CHECK(f[i] == static_cast<double>(static_cast<float>(v[i])));  // the hardware's correctly rounded conversion
    CHECK(d[i] == static_cast<double>(v[i]));
  }
  CHECK(f[2] == 9223372036854775808.0);
  CHECK(f[3] == -9223372036854775808.0);
  CHECK(f[4] == -f[0]);
  CHECK(h[5] == 65504.0);  // below the f16 overflow threshold 65520
  CHECK(std::isinf(h[6]));
}

namespace ad::test {
TEST_CASE("tensor: full and fill of an i64 tensor refuse values that are not integers it holds") {
  CHECK(Tensor::full({2}, 3.0, DType::i64).to_vector() == std::vector<double>{3, 3});
  for (double bad : {1.5, -0.25, 1e-300})
    CHECK_THROWS_WITH_AS(Tensor::full({2}, bad, DType::i64), doctest::Contains("does not convert to i64: not an integer"), Error);
  for (double bad : {std::nan(""), 1e19, -1e300, 9223372036854775808.0})
    CHECK_THROWS_WITH_AS(Tensor::full({2}, bad, DType::i64), doctest::Contains("does not convert to i64"), Error);
  CHECK(Tensor::full({1}, -9223372036854775808.0, DType::i64).at({0}) == -9223372036854775808.0);
}
TEST_CASE("tensor: rows is a bounds-checked view of a range of dim 0") {
  Tensor t = Tensor::from(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {4, 3});
  Tensor r = t.rows(1, 2);
  CHECK(r.shape() == Shape{2, 3});
  CHECK(r.to_vector() == std::vector<double>{3, 4, 5, 6, 7, 8});
  r.data<double>()[0] = 42;  // a view: the write shows in t
  CHECK(t.data<double>()[3] == 42);
  CHECK(t.rows(4, 0).shape() == Shape{0, 3});
  CHECK_THROWS_WITH_AS(t.rows(3, 2), doctest::Contains("rows [3, 3 + 2) are outside the 4 rows of [4,3]"), Error);
  CHECK_THROWS_AS(t.rows(-1, 1), Error);
  CHECK_THROWS_WITH_AS(Tensor::full({}, 1.0).rows(0, 1), doctest::Contains("a scalar has no rows"), Error);
}

}  // namespace ad::test
