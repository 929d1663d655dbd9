// conv2d, conv1d, max_pool2d, avg_pool2d and group_norm against plain-loop
// references in f64 (values and gradients), their gradcheck cases, errors,
// and small CNNs under rematerialisation policies and training.
#include <limits>

#include "test_util.hpp"

namespace ad::test {

namespace {
struct ConvCase {
  Shape x, w;
  Conv2dOptions o;
};
std::string conv_label(const ConvCase& c) {
  return fmt::format("x {} w {} stride ({},{}) pad ({},{}) dil ({},{}) groups {}", c.x.str(), c.w.str(), c.o.stride[0],
                     c.o.stride[1], c.o.padding[0], c.o.padding[1], c.o.dilation[0], c.o.dilation[1], c.o.groups);
}
const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cs = [] {
    std::vector<ConvCase> v;
    auto add = [&](Shape x, Shape w, std::array<std::int64_t, 2> s, std::array<std::int64_t, 2> p,
                   std::array<std::int64_t, 2> d, std::int64_t g) {
      ConvCase c{x, w, {}};
      c.o.stride = s, c.o.padding = p, c.o.dilation = d, c.o.groups = g;
      v.push_back(c);
    };
    add({2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1);  // plain
    add({1, 2, 7, 5}, {3, 2, 3, 2}, {2, 2}, {1, 1}, {1, 1}, 1);  // stride and padding
    add({2, 2, 6, 7}, {2, 2, 2, 3}, {1, 1}, {2, 1}, {2, 1}, 1);  // dilation, padding wider than needed
    add({2, 4, 5, 5}, {6, 2, 3, 3}, {1, 2}, {1, 0}, {1, 1}, 2);  // two groups
    add({1, 3, 4, 4}, {3, 1, 2, 2}, {1, 1}, {1, 1}, {1, 1}, 3);  // depthwise
    add({2, 3, 4, 4}, {5, 3, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1);  // 1x1: the columns are x
    add({1, 4, 3, 5}, {4, 2, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 2);  // 1x1 with groups
    add({1, 2, 5, 5}, {2, 2, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1);  // 1x1 strided: not direct
    add({2, 2, 3, 3}, {1, 2, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1);  // the window is the whole image
    add({3, 6, 9, 8}, {4, 3, 3, 2}, {2, 3}, {2, 1}, {1, 2}, 2);  // everything at once
    add({1, 4, 7, 6}, {8, 1, 3, 2}, {2, 1}, {1, 1}, {1, 2}, 4);  // depthwise x 2, strided, dilated
    add({1, 3, 4, 4}, {6, 1, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 3);  // depthwise 1x1 x 2
    return v;
  }();
  return cs;
}

// y[n,o,oh,ow] = sum w[o,c,i,j] x[n, g C/G + c, oh sh - ph + i dh, ow sw - pw + j dw]
struct Ref {
  Tensor y, dx, dw;  // dx, dw: the gradients of sum(y * r)
};
Ref conv_ref(const Tensor& x, const Tensor& w, const Tensor& r, const Conv2dOptions& o) {
  const Shape &xs = x.shape(), &ws = w.shape();
  const std::int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], Cg = ws[1], KH = ws[2], KW = ws[3];
  const std::int64_t G = o.groups, Og = O / G;
  auto osz = [](std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p, std::int64_t d) {
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
  };
  const std::int64_t HO = osz(H, KH, o.stride[0], o.padding[0], o.dilation[0]);
  const std::int64_t WO = osz(W, KW, o.stride[1], o.padding[1], o.dilation[1]);
  Ref ref{Tensor::zeros({N, O, HO, WO}, DType::f64), Tensor::zeros(xs, DType::f64), Tensor::zeros(ws, DType::f64)};
  const double *px = x.data<double>(), *pw = w.data<double>(), *pr = r.data<double>();
  double *py = ref.y.data<double>(), *pdx = ref.dx.data<double>(), *pdw = ref.dw.data<double>();
  (void)C;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t oc = 0; oc < O; ++oc)
      for (std::int64_t oh = 0; oh < HO; ++oh)
        for (std::int64_t ow = 0; ow < WO; ++ow) {
          const std::int64_t yi = ((n * O + oc) * HO + oh) * WO + ow;
          for (std::int64_t c = 0; c < Cg; ++c)
            for (std::int64_t i = 0; i < KH; ++i)
              for (std::int64_t j = 0; j < KW; ++j) {
                const std::int64_t yy = oh * o.stride[0] - o.padding[0] + i * o.dilation[0];
                const std::int64_t xx = ow * o.stride[1] - o.padding[1] + j * o.dilation[1];
                if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
                const std::int64_t xi = ((n * C + (oc / Og) * Cg + c) * H + yy) * W + xx;
                const std::int64_t wi = ((oc * Cg + c) * KH + i) * KW + j;
                py[yi] += pw[wi] * px[xi];
                pdx[xi] += pw[wi] * pr[yi];
                pdw[wi] += px[xi] * pr[yi];
              }
        }
  return ref;
}
double max_abs(const Tensor& a) {
  Tensor a64 = a.to(DType::f64);
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a64.data<double>()[i]));
  return m;
}
}  // namespace

TEST_CASE("conv2d: values and both gradients equal a plain-loop reference (f64 and f32)") {
  Rng rng(31);
  for (const ConvCase& c : conv_cases()) {
    INFO(conv_label(c));
    Tensor x = randn64(c.x, rng), w = randn64(c.w, rng);
    Graph g0;
    const Shape ys = conv2d(g0.input(x), g0.input(w), c.o).shape();
    Tensor r = randn64(ys, rng);
    Ref ref = conv_ref(x, w, r, c.o);
    for (DType t : {DType::f64, DType::f32}) {
      INFO(dtype_name(t));
      const double tol = t == DType::f64 ? 1e-12 : 2e-5;
      Graph g;
      Var xv = g.input(x.to(t)), wv = g.input(w.to(t));
      Var y = conv2d(xv, wv, c.o);
      std::vector<Var> gr = grad(sum(mul(y, g.input(r.to(t)))), {xv, wv});
      CHECK(max_abs_diff(eval(y), ref.y) <= tol * (1 + max_abs(ref.y)));
      CHECK(max_abs_diff(eval(gr[0]), ref.dx) <= tol * (1 + max_abs(ref.dx)));
      CHECK(max_abs_diff(eval(gr[1]), ref.dw) <= tol * (1 + max_abs(ref.dw)));
    }
  }
}

TEST_CASE("conv1d is conv2d over sequences") {
  Rng rng(32);
  Tensor x = randn64({2, 4, 11}, rng), w = randn64({6, 2, 3}, rng);
  Graph g;
  Conv1dOptions o;
  o.stride = 2, o.padding = 1, o.dilation = 2, o.groups = 2;
  Var y = conv1d(g.input(x), g.input(w), o);
  CHECK(y.shape() == Shape{2, 6, 5});  // (11 + 2 - 2*2 - 1) / 2 + 1
  Conv2dOptions c;
  c.stride = {1, 2}, c.padding = {0, 1}, c.dilation = {1, 2}, c.groups = 2;
  Tensor r = Tensor::zeros({2, 6, 1, 5}, DType::f64);
  Ref ref = conv_ref(x.reshape({2, 4, 1, 11}), w.reshape({6, 2, 1, 3}), r, c);
  CHECK(max_abs_diff(eval(y), ref.y.reshape({2, 6, 5})) <= 1e-12);
  EXPECT_ERROR(conv1d(g.input(x), g.input(Tensor::zeros({6, 2, 3, 1}, DType::f64))), "conv1d", "rank 3", "[6,2,3,1]");
}

TEST_CASE("conv2d: bad input is an ad::Error naming conv2d, the option and the shapes") {
  Graph g;
  Var x = g.input(Tensor::zeros({2, 4, 5, 5})), w = g.input(Tensor::zeros({6, 2, 3, 3}));
  Conv2dOptions two;
  two.groups = 2;
  CHECK(conv2d(x, w, two).shape() == Shape{2, 6, 3, 3});
  EXPECT_ERROR(conv2d(x, w), "conv2d", "x has 4 channels but w expects 2", "f32[2,4,5,5]", "f32[6,2,3,3]");
  Conv2dOptions four;
  four.groups = 4;
  EXPECT_ERROR(conv2d(x, g.input(Tensor::zeros({6, 1, 3, 3})), four), "conv2d", "groups (4) must divide", "(6)");
  EXPECT_ERROR(conv2d(g.input(Tensor::zeros({4, 5, 5})), w), "conv2d", "x must be rank 4", "[4,5,5]");
  EXPECT_ERROR(conv2d(x, g.input(Tensor::zeros({6, 4, 3}))), "conv2d", "w must be rank 4");
  Conv2dOptions bad;
  bad.stride = {0, 1};
  EXPECT_ERROR(conv2d(x, w, bad), "conv2d", "stride must be >= 1", "(0, 1)");
  bad = {};
  bad.padding = {-1, 0};
  EXPECT_ERROR(conv2d(x, w, bad), "conv2d", "padding must be >= 0");
  bad = {};
  bad.dilation = {1, 0};
  EXPECT_ERROR(conv2d(x, w, bad), "conv2d", "dilation must be >= 1");
  bad = two;
  bad.dilation = {3, 1};  // a window spanning 7 rows of a 5-row image
  EXPECT_ERROR(conv2d(x, w, bad), "conv2d", "larger than the padded input", "(5 x 5)");
  bad.padding = {1, 0};   // 7 <= 5 + 2 fits
  CHECK(conv2d(x, w, bad).shape() == Shape{2, 6, 1, 3});
  EXPECT_ERROR(conv2d(x, g.input(Tensor::zeros({6, 2, 3, 3}, DType::f64)), two), "conv2d", "f64");
  EXPECT_ERROR(conv2d(g.input(Tensor::zeros({2, 4, 5, 5}, DType::i64)), w), "conv2d", "i64");
}

// ---- pooling ----
namespace {
// y and the gradient of sum(y * r) by loops: the first largest tap (or first NaN) wins
std::pair<Tensor, Tensor> max_pool_ref(const Tensor& x, const Tensor& r, const Pool2dOptions& o) {
  const Shape& xs = x.shape();
  const std::int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  const std::int64_t sh = o.stride[0] ? o.stride[0] : o.kernel[0], sw = o.stride[1] ? o.stride[1] : o.kernel[1];
  const std::int64_t HO = (H + 2 * o.padding[0] - o.dilation[0] * (o.kernel[0] - 1) - 1) / sh + 1;
  const std::int64_t WO = (W + 2 * o.padding[1] - o.dilation[1] * (o.kernel[1] - 1) - 1) / sw + 1;
  Tensor y = Tensor::zeros({N, C, HO, WO}, DType::f64), dx = Tensor::zeros(xs, DType::f64);
  const double* px = x.data<double>();
  for (std::int64_t p = 0; p < N * C; ++p)
    for (std::int64_t oh = 0; oh < HO; ++oh)
      for (std::int64_t ow = 0; ow < WO; ++ow) {
        std::int64_t best = -1;
        for (std::int64_t i = 0; i < o.kernel[0]; ++i)
          for (std::int64_t j = 0; j < o.kernel[1]; ++j) {
            const std::int64_t yy = oh * sh - o.padding[0] + i * o.dilation[0];
            const std::int64_t xx = ow * sw - o.padding[1] + j * o.dilation[1];
            if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
            const std::int64_t e = (p * H + yy) * W + xx;
            if (best < 0 || (!std::isnan(px[best]) && (px[e] > px[best] || std::isnan(px[e])))) best = e;
          }
        const std::int64_t yi = (p * HO + oh) * WO + ow;
        y.data<double>()[yi] = px[best];
        dx.data<double>()[best] += r.data<double>()[yi];
      }
  return {y, dx};
}
}  // namespace

TEST_CASE("max_pool2d: values and gradient equal a loop reference; ties go to the first tap, NaN wins") {
  Rng rng(33);
  struct P { Shape x; Pool2dOptions o; };
  std::vector<P> ps;
  auto add = [&](Shape x, std::array<std::int64_t, 2> k, std::array<std::int64_t, 2> s, std::array<std::int64_t, 2> p,
                 std::array<std::int64_t, 2> d) {
    P q{x, {}};
    q.o.kernel = k, q.o.stride = s, q.o.padding = p, q.o.dilation = d;
    ps.push_back(q);
  };
  add({2, 3, 4, 6}, {2, 2}, {0, 0}, {0, 0}, {1, 1});  // stride = kernel
  add({1, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1});  // overlapping windows, padding
  add({1, 1, 6, 6}, {2, 3}, {1, 1}, {0, 1}, {2, 1});  // dilation
  add({2, 2, 5, 3}, {5, 3}, {1, 1}, {0, 0}, {1, 1});  // one window: the whole plane
  for (const P& q : ps) {
    INFO(q.x.str(), " kernel ", q.o.kernel[0], "x", q.o.kernel[1]);
    // integer values (ties certain in windows of 6+ taps) and random ones
    for (int kind = 0; kind < 2; ++kind) {
      Tensor x = kind == 0 ? randn64(q.x, rng) : Tensor::randint(q.x, rng, 3).to(DType::f64);
      Graph g0;
      Tensor r = randn64(max_pool2d(g0.input(x), q.o).shape(), rng);
      auto [y_ref, dx_ref] = max_pool_ref(x, r, q.o);
      for (DType t : {DType::f64, DType::f32}) {
        Graph g;
        Var xv = g.input(x.to(t));
        Var y = max_pool2d(xv, q.o);
        Var dx = grad(sum(mul(y, g.input(r.to(t)))), {xv})[0];
        CHECK(max_abs_diff(eval(y), y_ref.to(t)) == 0);
        CHECK(max_abs_diff(eval(dx), dx_ref) <= (t == DType::f64 ? 1e-13 : 1e-5));
      }
    }
  }
  // NaN: the window's value and its gradient's destination
  Graph g;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Var x = g.input(f64s({1, nan, 3, 4, 5, 6, nan, 8}, {1, 1, 2, 4}));
  Pool2dOptions o;  // 2x2, stride 2
  Var y = max_pool2d(x, o);
  Tensor yv = eval(y);
  CHECK(std::isnan(yv.data<double>()[0]));
  CHECK(std::isnan(yv.data<double>()[1]));
  Tensor dx = eval(grad(sum(mul(y, g.input(f64s({10, 20}, {1, 1, 1, 2})))), {x})[0]);
  const double want[] = {0, 10, 0, 0, 0, 0, 20, 0};
  for (int i = 0; i < 8; ++i) CHECK(dx.data<double>()[i] == want[i]);
}

namespace {
// avg_pool2d by loops: each window's taps inside x summed, divided by the
// window's size (count_padding) or by the taps inside
Tensor avg_pool_ref(const Tensor& x, const Pool2dOptions& o) {
  const Shape& xs = x.shape();
  const std::int64_t H = xs[2], W = xs[3], KH = o.kernel[0], KW = o.kernel[1];
  const std::int64_t sh = o.stride[0] ? o.stride[0] : KH, sw = o.stride[1] ? o.stride[1] : KW;
  const std::int64_t HO = (H + 2 * o.padding[0] - KH) / sh + 1, WO = (W + 2 * o.padding[1] - KW) / sw + 1;
  Tensor y = Tensor::zeros({xs[0], xs[1], HO, WO}, DType::f64);
  for (std::int64_t p = 0; p < xs[0] * xs[1]; ++p)
    for (std::int64_t oh = 0; oh < HO; ++oh)
      for (std::int64_t ow = 0; ow < WO; ++ow) {
        double s = 0;
        int taps = 0;
        for (std::int64_t i = 0; i < KH; ++i)
          for (std::int64_t j = 0; j < KW; ++j) {
            const std::int64_t yy = oh * sh - o.padding[0] + i, xx = ow * sw - o.padding[1] + j;
            if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
            s += x.data<double>()[(p * H + yy) * W + xx];
            ++taps;
          }
        y.data<double>()[(p * HO + oh) * WO + ow] = s / (o.count_padding ? static_cast<double>(KH * KW) : taps);
      }
  return y;
}
}  // namespace

TEST_CASE("avg_pool2d is the windows' mean (padding's zeros counted); pooling errors") {
  Rng rng(34);
  Tensor x = randn64({2, 3, 5, 4}, rng);
  Graph g;
  Var xv = g.input(x);
  Pool2dOptions o;
  o.kernel = {3, 2}, o.stride = {2, 1}, o.padding = {1, 0};
  Var y = avg_pool2d(xv, o);
  REQUIRE(y.shape() == Shape{2, 3, 3, 3});
  CHECK(max_abs_diff(eval(y), avg_pool_ref(x, o)) <= 1e-14);
  // its gradient: each window spreads dy / 6 over its taps
  Tensor dx = eval(grad(sum(y), {xv})[0]);
  CHECK(dx.data<double>()[0] == doctest::Approx(1.0 / 6));  // x (0, 0) lies in one window
  CHECK(dx.data<double>()[5] == doctest::Approx(4.0 / 6));  // x (1, 1) in four
  // errors
  Pool2dOptions bad;
  bad.kernel = {0, 2};
  EXPECT_ERROR(max_pool2d(xv, bad), "max_pool2d", "kernel must be >= 1", "(0, 2)");
  bad = {};
  bad.kernel = {2, 2}, bad.padding = {2, 0};  // the first window would lie wholly in the padding
  EXPECT_ERROR(max_pool2d(xv, bad), "max_pool2d", "wholly in the padding", "row 0");
  bad = {};
  bad.stride = {-1, 1};
  EXPECT_ERROR(max_pool2d(xv, bad), "max_pool2d", "stride must be >= 1");
  EXPECT_ERROR(max_pool2d(g.input(Tensor::zeros({3, 5, 4})), {}), "max_pool2d", "rank 4");
  bad = {};
  bad.kernel = {6, 2};
  EXPECT_ERROR(max_pool2d(xv, bad), "max_pool2d", "larger than the padded input");
  bad = {};
  bad.dilation = {2, 1};
  EXPECT_ERROR(avg_pool2d(xv, bad), "avg_pool2d", "dilation must be 1");
  EXPECT_ERROR(avg_pool2d(g.input(Tensor::zeros({5, 4})), {}), "avg_pool2d", "rank 4");
}

TEST_CASE("a small CNN under every policy: keep_all's gradients, measured peak within the prediction") {
  Rng rng(35);
  Parameter w1 = Parameter::randn({8, 3, 3, 3}, rng, 0.3), w2 = Parameter::randn({8, 4, 3, 3}, rng, 0.2);
  Parameter w3 = Parameter::randn({8 * 3 * 3, 5}, rng, 0.1);
  Tensor x = Tensor::randn({4, 3, 12, 12}, rng);
  Tensor labels = Tensor::randint({4}, rng, 5);
  std::vector<Parameter> mid;
  for (int i = 0; i < 6; ++i) mid.push_back(Parameter::randn({8, 4, 3, 3}, rng, 0.2));
  auto build = [&](Graph& g) {
    Var h = relu(conv2d(g.input(x), w1, Conv2dOptions{{1, 1}, {1, 1}, {1, 1}, 1}));  // [4,8,12,12]
    Pool2dOptions p;
    h = max_pool2d(h, p);  // [4,8,6,6]
    h = relu(conv2d(h, w2, Conv2dOptions{{1, 1}, {1, 1}, {1, 1}, 2}));
    for (auto& w : mid) h = h + tanh(conv2d(h, w, Conv2dOptions{{1, 1}, {1, 1}, {1, 1}, 2}));  // residual blocks
    Pool2dOptions a;
    h = avg_pool2d(h, a);  // [4,8,3,3]
    return cross_entropy(matmul(reshape(h, {4, 72}), w3), g.input(labels));
  };
  std::vector<Parameter> ps{w1, w2, w3};
  ps.insert(ps.end(), mid.begin(), mid.end());
  auto run = [&](Policy pol) {
    for (auto& p : ps) p.zero_grad();
    Graph g;
    Report r = backward(build(g), pol);
    std::vector<Tensor> out;
    for (auto& p : ps) out.push_back(p.grad().clone());
    return std::make_pair(r, out);
  };
  // save_matmuls keeps the products: conv2d's outputs as matmul's
  CHECK(save_matmuls(NodeInfo{0, OpId::conv2d, 0, 0, false}));
  CHECK_FALSE(save_matmuls(NodeInfo{0, OpId::max_pool2d, 0, 0, false}));
  auto [r0, g0] = run(policy::keep_all());
  CHECK(r0.measured_peak_bytes == r0.predicted_peak_bytes);
  for (Policy pol : {policy::sqrt_n(), policy::uniform(2), policy::budget(r0.measured_peak_bytes * 3 / 4),
                     policy::selective(save_matmuls)}) {
    auto [r, gs] = run(pol);
    INFO(pol.name());
    CHECK(r.measured_peak_bytes <= r.predicted_peak_bytes);
    check_bitwise(g0, gs);
  }
}

TEST_CASE("nn::Conv2d: PyTorch's layout and init bounds, bias over every position, a CNN learns") {
  Rng rng(36);
  nn::Conv2dLayerOptions lo;
  lo.conv.padding = {1, 1};
  lo.conv.groups = 2;
  nn::Conv2d conv(4, 6, {3, 3}, rng, lo);
  CHECK(conv.weight.value().shape() == Shape{6, 2, 3, 3});
  CHECK(conv.bias.value().shape() == Shape{6});
  auto names = conv.named_parameters();
  REQUIRE(names.size() == 2);
  CHECK(names[0].first == "weight");
  const double k = 1.0 / std::sqrt(2.0 * 9.0);
  CHECK(max_abs(conv.weight.value()) <= k);
  CHECK(max_abs(conv.weight.value()) > 0.5 * k);
  {
    Graph g;
    Tensor x = randn64({2, 4, 5, 5}, rng).to(DType::f32);
    Var xv = g.input(x);
    Tensor y = eval(conv(xv)), y0 = eval(conv2d(xv, conv.weight, lo.conv));
    const float* py = y.data<float>();
    const float* p0 = y0.data<float>();
    const float* pb = conv.bias.value().data<float>();
    bool ok = true;
    for (std::int64_t i = 0; i < y.numel(); ++i) ok &= py[i] == p0[i] + pb[(i / 25) % 6];
    CHECK(ok);
  }
  EXPECT_ERROR(nn::Conv2d(4, 5, {3, 3}, rng, lo), "Conv2d", "groups (2) must divide", "(5)");
  EXPECT_ERROR(nn::Conv2d(4, 6, {0, 3}, rng), "Conv2d", "kernel height");
  nn::Conv2dLayerOptions bad_stride;
  bad_stride.conv.stride = {0, 1};
  EXPECT_ERROR(nn::Conv2d(4, 6, {3, 3}, rng, bad_stride), "Conv2d", "stride and dilation must be >= 1", "(0, 1)");

  // a bright 3x3 blob in one of the four quadrants of a noisy 8x8 image: which one?
  const std::int64_t B = 32;
  auto batch = [&](Rng& r, Tensor& x, Tensor& y) {
    x = Tensor::randn({B, 1, 8, 8}, r, DType::f32, 0, 0.3);
    y = Tensor::randint({B}, r, 4);
    for (std::int64_t n = 0; n < B; ++n) {
      const std::int64_t q = y.data<std::int64_t>()[n], oy = (q / 2) * 4, ox = (q % 2) * 4;
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 3; ++j) x.data<float>()[n * 64 + (oy + i) * 8 + ox + j] += 1.0f;
    }
  };
  nn::Conv2dLayerOptions pad1;
  pad1.conv.padding = {1, 1};
  nn::Conv2d c1(1, 4, {3, 3}, rng, pad1);
  nn::Linear head(4 * 4 * 4, 4, rng);
  std::vector<Parameter> ps{c1.weight, c1.bias, head.weight, head.bias};
  nn::AdamOptions ao;
  ao.lr = 0.02;
  nn::Adam opt(ps, ao);
  Rng data(37);
  double first = 0, last = 0;
  const int steps = 60;
  for (int step = 0; step < steps; ++step) {
    Tensor x, y;
    batch(data, x, y);
    Graph g;
    Var h = max_pool2d(relu(c1(g.input(x))));  // [B,4,4,4]
    Var loss = cross_entropy(head(reshape(h, {B, 64})), g.input(y));
    opt.zero_grad();
    Report r = backward(loss, policy::sqrt_n());
    CHECK(r.measured_peak_bytes <= r.predicted_peak_bytes);
    const double l = loss.value().item();
    if (step == 0) first = l;
    if (step >= steps - 5) last += l / 5;
    opt.step();
  }
  INFO("loss first ", first, " last five ", last);
  CHECK(first > 1.0);
  CHECK(last < 0.25 * first);
}

TEST_CASE("group_norm: each (image, group) normalised over its channels and positions, then the affine") {
  Rng rng(38);
  const std::int64_t N = 2, C = 6, H = 3, W = 4;
  Tensor x = randn64({N, C, H, W}, rng, 0.5, 2.0), gamma = randn64({C}, rng), beta = randn64({C}, rng);
  for (std::int64_t G : {1, 2, 3, 6}) {
    INFO("groups ", G);
    Graph g;
    Tensor y = eval(group_norm(g.input(x), G, g.input(gamma), g.input(beta), 1e-5));
    const std::int64_t per = C / G * H * W;
    double worst = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t gi = 0; gi < G; ++gi) {
        const double* px = x.data<double>() + (n * C + gi * (C / G)) * H * W;
        double m = 0, v = 0;
        for (std::int64_t e = 0; e < per; ++e) m += px[e] / static_cast<double>(per);
        for (std::int64_t e = 0; e < per; ++e) v += (px[e] - m) * (px[e] - m) / static_cast<double>(per);
        for (std::int64_t e = 0; e < per; ++e) {
          const std::int64_t c = gi * (C / G) + e / (H * W);
          const double want = (px[e] - m) / std::sqrt(v + 1e-5) * gamma.data<double>()[c] + beta.data<double>()[c];
          worst = std::max(worst, std::abs(want - y.data<double>()[(n * C + gi * (C / G)) * H * W + e]));
        }
      }
    CHECK(worst <= 1e-12);
    // gradients of x, gamma and beta against central differences
    GradCase gc{OpId::layer_norm, fmt::format("group_norm G = {}", G), {x, gamma, beta},
                [G](const std::vector<Var>& v) { return group_norm(v[0], G, v[1], v[2], 1e-5); }};
    GradcheckResult r = gradcheck(gc, static_cast<std::uint64_t>(G));
    CHECK_MESSAGE(r.ok(), r.str());
  }
  nn::GroupNorm gn(2, C);
  Graph g;
  Var xv = g.input(x.to(DType::f32));
  CHECK(max_abs_diff(eval(gn(xv)), eval(group_norm(xv, 2, g.input(Tensor::ones({C})), g.input(Tensor::zeros({C}))))) == 0);
  EXPECT_ERROR(group_norm(xv, 4, gn.weight, gn.bias), "group_norm", "groups (4) must be >= 1 and divide the 6",
               "[2,6,3,4]");
  EXPECT_ERROR(group_norm(xv, 2, Parameter::zeros({5}), gn.bias), "group_norm", "gamma and beta must be [C] = [6]");
  EXPECT_ERROR(group_norm(g.input(Tensor::zeros({6})), 2, gn.weight, gn.bias), "group_norm", "rank >= 2");
  EXPECT_ERROR(nn::GroupNorm(4, 6), "GroupNorm", "groups (4) must divide channels (6)");
  EXPECT_ERROR(nn::GroupNorm(2, 8)(xv), "GroupNorm", "x [2,6,3,4] has 6 channels (dim 1), the layer 8");
}

TEST_CASE("conv2d and pooling with empty dims; conv1d with Parameters; huge options are errors") {
  Rng rng(39);
  Conv2dOptions two;
  two.groups = 2;
  {  // no output channels: y and both gradients are empty, nothing divides by O
    Graph g;
    Var x = g.input(randn64({2, 4, 5, 5}, rng)), w = g.input(Tensor::zeros({0, 2, 3, 3}, DType::f64));
    Var y = conv2d(x, w, two);
    CHECK(y.shape() == Shape{2, 0, 3, 3});
    std::vector<Var> gr = grad(sum(y), {x, w});
    Tensor dx = eval(gr[0]);
    CHECK(dx.shape() == Shape{2, 4, 5, 5});
    CHECK(max_abs(dx) == 0);
    CHECK(eval(gr[1]).numel() == 0);
  }
  {  // no input channels: y is zeros, with groups
    Graph g;
    Var x = g.input(Tensor::zeros({3, 0, 5, 5}, DType::f64));
    PGraph pg;  // poisoned outputs: an unwritten element would show
    Var y = conv2d(pg.input(Tensor::zeros({3, 0, 5, 5}, DType::f64)), pg.input(Tensor::zeros({4, 0, 3, 3}, DType::f64)),
                   two);
    Tensor yv = eval(y);
    CHECK(yv.shape() == Shape{3, 4, 3, 3});
    CHECK(max_abs(yv) == 0);
    Pool2dOptions p;
    CHECK(eval(avg_pool2d(x, p)).shape() == Shape{3, 0, 2, 2});
    CHECK(eval(max_pool2d(x, p)).shape() == Shape{3, 0, 2, 2});
  }
  {  // conv1d with a Parameter weight (or input)
    Graph g;
    Parameter w = Parameter::randn({4, 3, 3}, rng, 0.5, DType::f64);
    Tensor x = randn64({2, 3, 9}, rng);
    Var y = conv1d(g.input(x), w);
    CHECK(y.shape() == Shape{2, 4, 7});
    Var y2 = conv1d(Parameter(x), g.input(w.value()));
    CHECK(max_abs_diff(eval(y), eval(y2)) == 0);
    EXPECT_ERROR(conv1d(Parameter(x), w), "conv1d", "both Parameters");
  }
  Graph g;
  Var x = g.input(Tensor::zeros({1, 2, 5, 5})), w = g.input(Tensor::zeros({2, 2, 3, 3}));
  Conv2dOptions huge;
  huge.padding = {std::int64_t{1} << 62, 0};
  EXPECT_ERROR(conv2d(x, w, huge), "conv2d", "below 2^31");
  huge = {};
  huge.groups = std::int64_t{1} << 40;
  EXPECT_ERROR(conv2d(x, w, huge), "conv2d", "groups must be >= 1 and below 2^31");
  // avg_pool2d's errors are its own, not its conv2d's
  Pool2dOptions bad;
  bad.padding = {-1, 0};
  EXPECT_ERROR(avg_pool2d(x, bad), "avg_pool2d", "padding must be >= 0");
  bad = {};
  bad.kernel = {8, 2};
  EXPECT_ERROR(avg_pool2d(x, bad), "avg_pool2d", "larger than the padded input", "[1,2,5,5]");
  EXPECT_ERROR(avg_pool2d(g.input(Tensor::zeros({1, 2, 5, 5}, DType::i64)), {}), "avg_pool2d", "f32 or f64");
}

TEST_CASE("conv_transpose2d scatters each input through the window (a loop reference); upsample_nearest2d") {
  Rng rng(40);
  struct T {
    Shape x, w;
    std::array<std::int64_t, 2> s, p, d, op;
    std::int64_t g;
  };
  const T ts[] = {{{2, 3, 4, 5}, {3, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1},   // doubles the size (U-Net)
                  {{1, 4, 3, 3}, {4, 3, 2, 3}, {1, 2}, {0, 1}, {2, 1}, {0, 1}, 2},   // groups, dilation
                  {{2, 2, 5, 4}, {2, 5, 3, 2}, {3, 1}, {2, 0}, {1, 1}, {2, 0}, 1},   // stride 3, output_padding 2
                  {{1, 6, 2, 2}, {6, 1, 4, 4}, {2, 2}, {1, 1}, {1, 1}, {0, 0}, 6}};  // depthwise
  for (const T& t : ts) {
    INFO(t.x.str(), " w ", t.w.str());
    Conv2dOptions o;
    o.stride = t.s, o.padding = t.p, o.dilation = t.d, o.groups = t.g;
    Tensor x = randn64(t.x, rng), w = randn64(t.w, rng);
    const std::int64_t N = t.x[0], Ci = t.x[1], H = t.x[2], W = t.x[3], Cg = t.w[1], KH = t.w[2], KW = t.w[3];
    const std::int64_t Co = Cg * t.g, per = Ci / t.g;
    const std::int64_t HO = (H - 1) * t.s[0] - 2 * t.p[0] + t.d[0] * (KH - 1) + 1 + t.op[0];
    const std::int64_t WO = (W - 1) * t.s[1] - 2 * t.p[1] + t.d[1] * (KW - 1) + 1 + t.op[1];
    Tensor want = Tensor::zeros({N, Co, HO, WO}, DType::f64);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t ci = 0; ci < Ci; ++ci)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t ww = 0; ww < W; ++ww)
            for (std::int64_t c = 0; c < Cg; ++c)
              for (std::int64_t i = 0; i < KH; ++i)
                for (std::int64_t j = 0; j < KW; ++j) {
                  const std::int64_t yy = h * t.s[0] - t.p[0] + i * t.d[0], xx = ww * t.s[1] - t.p[1] + j * t.d[1];
                  if (yy < 0 || yy >= HO || xx < 0 || xx >= WO) continue;
                  want.data<double>()[((n * Co + (ci / per) * Cg + c) * HO + yy) * WO + xx] +=
                      w.data<double>()[((ci * Cg + c) * KH + i) * KW + j] *
                      x.data<double>()[((n * Ci + ci) * H + h) * W + ww];
                }
    Graph g;
    Var y = conv_transpose2d(g.input(x), g.input(w), o, t.op);
    REQUIRE(y.shape() == Shape{N, Co, HO, WO});
    CHECK(max_abs_diff(eval(y), want) <= 1e-12 * (1 + max_abs(want)));
    GradCase gc{OpId::conv2d_backward_input, "conv_transpose2d", {x, w},
                [o, t](const std::vector<Var>& v) { return conv_transpose2d(v[0], v[1], o, t.op); }};
    GradcheckResult r = gradcheck(gc, 41);
    CHECK_MESSAGE(r.ok(), r.str());
  }
  // a stride-2 conv and its transpose with output_padding 1 give back an odd size
  {
    Graph g;
    Conv2dOptions o;
    o.stride = {2, 2}, o.padding = {1, 1};
    Var x = g.input(Tensor::zeros({1, 2, 7, 7}));
    Var down = conv2d(x, g.input(Tensor::zeros({4, 2, 3, 3})), o);
    CHECK(down.shape() == Shape{1, 4, 4, 4});
    CHECK(conv_transpose2d(down, g.input(Tensor::zeros({4, 2, 3, 3})), o).shape() == Shape{1, 2, 7, 7});
    CHECK(conv_transpose2d(down, g.input(Tensor::zeros({4, 2, 3, 3})), o, {1, 1}).shape() == Shape{1, 2, 8, 8});
    EXPECT_ERROR(conv_transpose2d(down, g.input(Tensor::zeros({4, 2, 3, 3})), o, {2, 0}), "conv_transpose2d",
                 "output_padding (2, 0) must be >= 0 and below the stride");
    EXPECT_ERROR(conv_transpose2d(down, g.input(Tensor::zeros({3, 2, 3, 3})), o), "conv_transpose2d",
                 "x has 4 channels but w expects 3");
    Conv2dOptions big;
    big.padding = {5, 0};
    EXPECT_ERROR(conv_transpose2d(down, g.input(Tensor::zeros({4, 2, 3, 3})), big), "conv_transpose2d",
                 "the output would have height -4");
    nn::Conv2dLayerOptions lo;
    lo.conv = o;
    Rng r2(3);
    nn::ConvTranspose2d up(4, 2, {3, 3}, r2, lo, {1, 1});
    CHECK(up.weight.value().shape() == Shape{4, 2, 3, 3});
    CHECK(up(down).shape() == Shape{1, 2, 8, 8});
  }
  // upsample_nearest2d: each value repeated over a block; its gradient the block's sum
  Graph g;
  Tensor x = randn64({2, 3, 2, 3}, rng);
  Var xv = g.input(x);
  Var y = upsample_nearest2d(xv, {2, 3});
  REQUIRE(y.shape() == Shape{2, 3, 4, 9});
  Tensor yv = eval(y);
  bool same = true;
  for (std::int64_t p = 0; p < 6; ++p)
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < 9; ++j)
        same &= yv.data<double>()[(p * 4 + i) * 9 + j] == x.data<double>()[(p * 2 + i / 2) * 3 + j / 3];
  CHECK(same);
  Tensor r = randn64({2, 3, 4, 9}, rng);
  Tensor dx = eval(grad(sum(mul(y, g.input(r))), {xv})[0]);
  double worst = 0;
  for (std::int64_t p = 0; p < 6; ++p)
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 3; ++j) {
        double s = 0;
        for (std::int64_t a = 0; a < 2; ++a)
          for (std::int64_t b = 0; b < 3; ++b) s += r.data<double>()[(p * 4 + i * 2 + a) * 9 + j * 3 + b];
        worst = std::max(worst, std::abs(s - dx.data<double>()[(p * 2 + i) * 3 + j]));
      }
  CHECK(worst <= 1e-13);
  EXPECT_ERROR(upsample_nearest2d(xv, {0, 2}), "upsample_nearest2d", "factors must be >= 1");
  EXPECT_ERROR(upsample_nearest2d(g.input(Tensor::zeros({3, 4})), {2, 2}), "upsample_nearest2d", "rank 4");
}

// A user's trial: on a depthwise-separable net, budget(b) refused a b that
// sqrt_n() met (sqrt_n's window was not on budget's ladder of windows).
TEST_CASE("budget at sqrt_n's peak plans, on a depthwise-separable CNN") {
  for (std::int64_t B : {1, 4, 8}) {
    INFO("batch ", B);
    Rng rng(101);
    std::vector<nn::Conv2d> convs;
    std::vector<nn::GroupNorm> norms;
    auto opts = [](std::int64_t pad, std::int64_t stride, std::int64_t groups) {
      nn::Conv2dLayerOptions o;
      o.conv.padding = {pad, pad}, o.conv.stride = {stride, stride}, o.conv.groups = groups;
      return o;
    };
    convs.emplace_back(3, 32, std::array<std::int64_t, 2>{3, 3}, rng, opts(1, 1, 1));
    for (int i = 0; i < 3; ++i) {
      convs.emplace_back(32, 32, std::array<std::int64_t, 2>{3, 3}, rng, opts(1, i == 1 ? 2 : 1, 32));
      convs.emplace_back(32, 32, std::array<std::int64_t, 2>{1, 1}, rng, opts(0, 1, 1));
    }
    for (int i = 0; i < 7; ++i) norms.emplace_back(8, 32);
    nn::Linear head(32, 4, rng);
    Tensor x = Tensor::randn({B, 3, 20, 20}, rng), y = Tensor::randint({B}, rng, 4);
    auto step = [&](const Policy& pol) {
      Graph g;
      Var h = g.input(x);
      for (std::size_t i = 0; i < convs.size(); ++i) {
        Var c = silu(norms[i](convs[i](h)));
        h = i > 0 && i % 2 == 0 && c.shape() == h.shape() ? h + c : c;
      }
      Pool2dOptions all;
      all.kernel = {h.dim(2), h.dim(3)};
      h = avg_pool2d(h, all);
      return backward(cross_entropy(head(reshape(h, {B, 32})), g.input(y)), pol);
    };
    const std::int64_t peak = step(policy::sqrt_n()).measured_peak_bytes;
    Report r = step(policy::budget(peak));
    CHECK(r.measured_peak_bytes <= peak);
  }
}

TEST_CASE("avg_pool2d without counting the padding; nn::Conv1d; Var op Parameter") {
  Rng rng(42);
  Tensor x = randn64({2, 3, 5, 4}, rng);
  Graph g;
  Var xv = g.input(x);
  Pool2dOptions o;
  o.kernel = {3, 2}, o.stride = {2, 1}, o.padding = {1, 1}, o.count_padding = false;
  Tensor y = eval(avg_pool2d(xv, o));
  REQUIRE(y.shape() == Shape{2, 3, 3, 5});
  CHECK(max_abs_diff(y, avg_pool_ref(x, o)) <= 1e-14);
  GradCase gc{OpId::conv2d, "avg_pool2d without padding counted", {x},
              [o](const std::vector<Var>& v) { return avg_pool2d(v[0], o); }};
  GradcheckResult r = gradcheck(gc, 43);
  CHECK_MESSAGE(r.ok(), r.str());
  Pool2dOptions bad = o;
  bad.padding = {3, 0};
  EXPECT_ERROR(avg_pool2d(xv, bad), "avg_pool2d", "without count_padding the padding (3, 0) must be below the kernel");

  // nn::Conv1d: conv1d plus the bias over every position
  nn::Conv1dLayerOptions lo;
  lo.conv.padding = 1, lo.conv.groups = 2, lo.dtype = DType::f64;
  nn::Conv1d c(4, 6, 3, rng, lo);
  CHECK(c.weight.value().shape() == Shape{6, 2, 3});
  CHECK(max_abs(c.weight.value()) <= 1.0 / std::sqrt(6.0));
  Tensor s = randn64({2, 4, 9}, rng);
  Var sv = g.input(s);
  Tensor got = eval(c(sv)), plain = eval(conv1d(sv, c.weight, lo.conv));
  REQUIRE(got.shape() == Shape{2, 6, 9});
  bool ok = true;
  for (std::int64_t i = 0; i < got.numel(); ++i)
    ok &= got.data<double>()[i] == plain.data<double>()[i] + c.bias.value().data<double>()[(i / 9) % 6];
  CHECK(ok);
  EXPECT_ERROR(nn::Conv1d(4, 5, 3, rng, lo), "Conv1d", "groups (2) must divide");

  // a Var and a Parameter combine with the operators, either side
  Parameter b = Parameter::randn({4}, rng, 1.0, DType::f64);
  Var h = g.input(randn64({3, 4}, rng));
  CHECK(max_abs_diff(eval(h + b), eval(add(h, b))) == 0);
  CHECK(max_abs_diff(eval(b * h), eval(mul(b, h))) == 0);
  CHECK(max_abs_diff(eval(b - h), eval(sub(b, h))) == 0);
  CHECK(max_abs_diff(eval(h / b), eval(div(h, b))) == 0);
}

void conv_gradcheck_cases(std::vector<GradCase>& out, Rng& rng) {
  for (const ConvCase& c : conv_cases()) {
    if (c.x.numel() > 200) continue;  // the largest are left to the reference test
    Conv2dOptions o = c.o;
    out.push_back({OpId::conv2d, conv_label(c), {randn64(c.x, rng), randn64(c.w, rng)},
                   [o](const std::vector<Var>& v) { return conv2d(v[0], v[1], o); }});
  }
  // the gradients as functions of their own inputs (conv2d differentiated twice)
  for (std::size_t k : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{5}}) {
    const ConvCase& c = conv_cases()[k];
    Conv2dOptions o = c.o;
    Shape xs = c.x, ws = c.w;
    Graph g0;
    const Shape ys = conv2d(g0.input(Tensor::zeros(xs)), g0.input(Tensor::zeros(ws)), o).shape();
    out.push_back({OpId::conv2d_backward_input, "dx(dy, w) of " + conv_label(c), {randn64(ys, rng), randn64(ws, rng)},
                   [o, xs](const std::vector<Var>& v) {
                     Var x0 = full(v[0], xs, 0.5, v[0].dtype());  // the run's dtype (tests/cuda.cpp runs these in f32 too)
                     return grad(sum(mul(conv2d(x0, v[1], o), v[0])), {x0})[0];
                   }});
    out.push_back({OpId::conv2d_backward_weight, "dw(x, dy) of " + conv_label(c), {randn64(xs, rng), randn64(ys, rng)},
                   [o, ws](const std::vector<Var>& v) {
                     Var w0 = full(v[0], ws, 0.3, v[0].dtype());
                     return grad(sum(mul(conv2d(v[0], w0, o), v[1])), {w0})[0];
                   }});
  }
  // max_pool2d on values at least 0.1 apart (no tie a finite difference could flip)
  struct P { Shape x; std::array<std::int64_t, 2> k, s, p, d; };
  const P ps[] = {{{2, 2, 4, 6}, {2, 2}, {0, 0}, {0, 0}, {1, 1}},
                  {{1, 2, 5, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
                  {{1, 1, 6, 5}, {2, 3}, {1, 1}, {0, 1}, {2, 1}}};
  for (const P& q : ps) {
    Pool2dOptions o;
    o.kernel = q.k, o.stride = q.s, o.padding = q.p, o.dilation = q.d;
    out.push_back({OpId::max_pool2d, fmt::format("{} kernel ({},{}) stride ({},{})", q.x.str(), q.k[0], q.k[1], q.s[0], q.s[1]),
                   {distinct(q.x, rng)}, [o](const std::vector<Var>& v) { return max_pool2d(v[0], o); }});
  }
}

}  // namespace ad::test
