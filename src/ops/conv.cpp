// Convolutions and poolings over NCHW images (include/ad/conv.hpp): conv2d,
// its two gradients (each an op with gradients of its own), max_pool2d and
// its gradient. The index math is shared with the CUDA kernels
// (ops/conv_math.hpp); the products run through BLAS / cuBLAS.
#include <algorithm>
#include <cmath>

#include "ad/conv.hpp"
#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/blas_cpu.hpp"
#include "ops/conv_math.hpp"
#include "ops/parallel.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
using conv::Geom;

// The geometry of x [N,C,H,W] under a window of kh x kw, o output channels and the attrs.
Geom geom_of(const Shape& xs, std::int64_t o, std::int64_t kh, std::int64_t kw, const Attrs& at) {
  Geom g{};
  g.n = xs[0], g.c = xs[1], g.h = xs[2], g.w = xs[3];
  g.o = o, g.kh = kh, g.kw = kw;
  g.sh = at.stride[0], g.sw = at.stride[1], g.ph = at.pad[0], g.pw = at.pad[1];
  g.dh = at.dilation[0], g.dw = at.dilation[1], g.g = at.groups;
  g.ho = conv::out_size(g.h, kh, g.sh, g.ph, g.dh);
  g.wo = conv::out_size(g.w, kw, g.sw, g.pw, g.dw);
  return g;
}
std::string pair_str(const std::int64_t* v) { return fmt::format("({}, {})", v[0], v[1]); }

// The options every op here takes (stride >= 1, padding >= 0, dilation >= 1).
void check_options(const InferArgs& a) {
  const Attrs& at = a.attrs;
  constexpr std::int64_t kMax = std::int64_t{1} << 31;  // keeps the size arithmetic far from overflow
  for (int i = 0; i < 2; ++i)
    for (std::int64_t v : {at.stride[i], at.pad[i], at.dilation[i], at.window[i]})
      if (v >= kMax)
        fail(a, fmt::format("stride, padding, dilation and kernel must each be below 2^31, got stride {}, padding {}, "
                            "dilation {}, kernel {}",
                            pair_str(at.stride), pair_str(at.pad), pair_str(at.dilation), pair_str(at.window)));
  for (int i = 0; i < 2; ++i) {
    if (at.stride[i] < 1) fail(a, fmt::format("stride must be >= 1, got {}", pair_str(at.stride)));
    if (at.pad[i] < 0) fail(a, fmt::format("padding must be >= 0, got {}", pair_str(at.pad)));
    if (at.dilation[i] < 1) fail(a, fmt::format("dilation must be >= 1, got {}", pair_str(at.dilation)));
  }
}
void check_rank4(const InferArgs& a, const Shape& s, const char* what, const char* layout) {
  if (s.rank() != 4) fail_shapes(a, fmt::format("{} must be rank 4 {}, got rank {}", what, layout, s.rank()));
}
void check_fits(const InferArgs& a, const Geom& g) {
  if (g.ho <= 0 || g.wo <= 0)
    fail_shapes(a, fmt::format("the window ({} x {}, dilation {}) is larger than the padded input ({} x {})", g.kh,
                               g.kw, pair_str(a.attrs.dilation), g.h + 2 * g.ph, g.w + 2 * g.pw));
}

// conv2d's geometry from x's shape and w's, checked: the errors of conv2d and of its gradients.
Geom check_conv(const InferArgs& a, const Shape& xs, const Shape& ws) {
  check_options(a);
  check_rank4(a, xs, "x", "[N, C, H, W]");
  check_rank4(a, ws, "w", "[O, C/groups, KH, KW]");
  const std::int64_t G = a.attrs.groups;
  if (G < 1 || G >= (std::int64_t{1} << 31)) fail(a, fmt::format("groups must be >= 1 and below 2^31, got {}", G));
  if (xs[1] != ws[1] * G)
    fail_shapes(a, fmt::format("x has {} channels but w expects {} ({} per group x {} groups)", xs[1], ws[1] * G, ws[1], G));
  if (ws[0] % G != 0) fail_shapes(a, fmt::format("groups ({}) must divide w's output channels ({})", G, ws[0]));
  if (ws[2] < 1 || ws[3] < 1) fail_shapes(a, "w's window must be at least 1 x 1");
  Geom g = geom_of(xs, ws[0], ws[2], ws[3], a.attrs);
  check_fits(a, g);
  return g;
}
Shape out_shape(const Geom& g) { return Shape{g.n, g.o, g.ho, g.wo}; }
void check_dy(const InferArgs& a, std::size_t i, const Geom& g) {
  if (!(a[i].shape == out_shape(g)))
    fail_shapes(a, fmt::format("dy must be the conv2d's output shape {}", out_shape(g).str()));
}

// One input channel per group (depthwise, with any multiplier O/G): the CPU
// runs it as shifted multiply-adds over planes, not as G GEMMs of one row.
bool depthwise(const Geom& g) { return g.cg() == 1 && g.g > 1; }

// The columns of the images processed at once: CPU one image; CUDA up to
// 64 MiB of them (at least one). 0 when the columns are x itself, or on the
// CPU for a depthwise conv.
std::int64_t chunk_images(const Geom& g, DeviceKind dev, std::size_t es) {
  if (g.direct() || g.n == 0) return 0;
  if (dev != DeviceKind::cuda) return depthwise(g) ? 0 : 1;
  const std::int64_t per = g.cols_elems() * static_cast<std::int64_t>(es);
  constexpr std::int64_t kChunkBytes = std::int64_t{64} << 20;
  return std::clamp<std::int64_t>(per > 0 ? kChunkBytes / per : g.n, 1, g.n);
}
std::int64_t cols_workspace(const Geom& g, const Meta& out) {
  return chunk_images(g, out.device.kind, dtype_size(out.dtype)) * g.cols_elems() *
         static_cast<std::int64_t>(dtype_size(out.dtype));
}

// ---- CPU parts ----
// The outputs ow in [lo, hi) of a row whose tap x = x0 + ow * sw falls inside [0, w).
struct Span {
  std::int64_t lo, hi;
};
Span inside(std::int64_t x0, std::int64_t sw, std::int64_t w, std::int64_t wo) {
  const std::int64_t lo = std::min(wo, x0 >= 0 ? 0 : (-x0 + sw - 1) / sw);
  const std::int64_t hi = x0 > w - 1 ? 0 : std::min(wo, (w - 1 - x0) / sw + 1);
  return {lo, std::max(lo, hi)};
}
// im2col_at's values a row segment at a time (the CUDA kernel evaluates
// im2col_at per element; the tests compare both against plain loops).
template <class T> void im2col_cpu(const Geom& g, const T* x_img, T* cols) {
  const std::int64_t L = g.l();
  parallel::parallel_for(g.rows(), static_cast<double>(g.cols_elems()), [&](std::int64_t r) {
    const std::int64_t j = r % g.kw, i = (r / g.kw) % g.kh, c = r / g.kk();
    const T* plane = x_img + c * g.plane();
    const std::int64_t x0 = j * g.dw - g.pw;
    const Span sp = inside(x0, g.sw, g.w, g.wo);
    for (std::int64_t oh = 0; oh < g.ho; ++oh) {
      T* o = cols + r * L + oh * g.wo;
      const std::int64_t y = oh * g.sh - g.ph + i * g.dh;
      if (y < 0 || y >= g.h) {
        std::fill(o, o + g.wo, T(0));
        continue;
      }
      const T* row = plane + y * g.w;  // tap x0 + ow * sw of this row (x0 may be < 0; ow >= lo keeps it inside)
      std::fill(o, o + sp.lo, T(0));
      if (g.sw == 1) std::copy(row + x0 + sp.lo, row + x0 + sp.hi, o + sp.lo);
      else
        for (std::int64_t ow = sp.lo; ow < sp.hi; ++ow) o[ow] = row[x0 + ow * g.sw];
      std::fill(o + sp.hi, o + g.wo, T(0));
    }
  });
}
// col2im as a scatter per channel, its rows in order: each dx element gets
// its terms in (i, j) order, from 0 — col2im_at's sum, the same bits.
template <class T> void col2im_cpu(const Geom& g, const T* cols, T* dx_img) {
  const std::int64_t L = g.l();
  parallel::parallel_for(g.c, static_cast<double>(g.cols_elems()), [&](std::int64_t c) {
    T* plane = dx_img + c * g.plane();
    std::fill(plane, plane + g.plane(), T(0));
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const T* in = cols + ((c * g.kh + i) * g.kw + j) * L;
        const std::int64_t x0 = j * g.dw - g.pw;
        const Span sp = inside(x0, g.sw, g.w, g.wo);
        for (std::int64_t oh = 0; oh < g.ho; ++oh) {
          const std::int64_t y = oh * g.sh - g.ph + i * g.dh;
          if (y < 0 || y >= g.h) continue;
          T* row = plane + y * g.w;
          const T* src = in + oh * g.wo;
          for (std::int64_t ow = sp.lo; ow < sp.hi; ++ow) row[x0 + ow * g.sw] += src[ow];
        }
      }
  });
}

// ---- depthwise on the CPU ----  f(i, j, oh, lo, hi, y, x0) for every tap row (i, j) and output
// row oh whose input row y lies inside x: outputs ow in [lo, hi) meet x at x0 + ow * sw.
template <class F> void for_taps(const Geom& g, F f) {
  for (std::int64_t i = 0; i < g.kh; ++i)
    for (std::int64_t j = 0; j < g.kw; ++j) {
      const std::int64_t x0 = j * g.dw - g.pw;
      const Span sp = inside(x0, g.sw, g.w, g.wo);
      for (std::int64_t oh = 0; oh < g.ho; ++oh) {
        const std::int64_t y = oh * g.sh - g.ph + i * g.dh;
        if (y >= 0 && y < g.h) f(i, j, oh, sp.lo, sp.hi, y, x0);
      }
    }
}
// y[n,o] = sum over taps of w[o,0,i,j] times x[n, o / (O/G)] shifted
template <class T> void depthwise_forward(const Geom& g, const T* x, const T* w, T* y) {
  const std::int64_t L = g.l();
  parallel::parallel_for(g.n * g.o, static_cast<double>(g.n * g.o * L * g.kk()), [&](std::int64_t p) {
    const std::int64_t n = p / g.o, o = p % g.o;
    const T* plane = x + (n * g.c + o / g.og()) * g.plane();
    T* out = y + p * L;
    std::fill(out, out + L, T(0));
    for_taps(g, [&](std::int64_t i, std::int64_t j, std::int64_t oh, std::int64_t lo, std::int64_t hi, std::int64_t yy,
                    std::int64_t x0) {
      const T wv = w[o * g.kk() + i * g.kw + j];
      const T* row = plane + yy * g.w;
      T* dst = out + oh * g.wo;
      if (g.sw == 1)  // contiguous: vectorises
        for (std::int64_t ow = lo; ow < hi; ++ow) dst[ow] += wv * row[x0 + ow];
      else
        for (std::int64_t ow = lo; ow < hi; ++ow) dst[ow] += wv * row[x0 + ow * g.sw];
    });
  });
}
// dx[n,c] = sum over the group's outputs o and the taps of w[o,0,i,j] times dy[n,o] scattered back
template <class T> void depthwise_backward_input(const Geom& g, const T* dy, const T* w, T* dx) {
  const std::int64_t L = g.l();
  parallel::parallel_for(g.n * g.c, static_cast<double>(g.n * g.o * L * g.kk()), [&](std::int64_t p) {
    const std::int64_t n = p / g.c, c = p % g.c;
    T* plane = dx + p * g.plane();
    std::fill(plane, plane + g.plane(), T(0));
    for (std::int64_t o = c * g.og(); o < (c + 1) * g.og(); ++o) {
      const T* src = dy + (n * g.o + o) * L;
      for_taps(g, [&](std::int64_t i, std::int64_t j, std::int64_t oh, std::int64_t lo, std::int64_t hi,
                      std::int64_t yy, std::int64_t x0) {
        const T wv = w[o * g.kk() + i * g.kw + j];
        T* row = plane + yy * g.w;
        const T* d = src + oh * g.wo;
        if (g.sw == 1)
          for (std::int64_t ow = lo; ow < hi; ++ow) row[x0 + ow] += wv * d[ow];
        else
          for (std::int64_t ow = lo; ow < hi; ++ow) row[x0 + ow * g.sw] += wv * d[ow];
      });
    }
  });
}
// dw[o,0,i,j] = sum over images and outputs of dy[n,o] times x[n, o / (O/G)] shifted
template <class T> void depthwise_backward_weight(const Geom& g, const T* x, const T* dy, T* dw) {
  const std::int64_t L = g.l();
  parallel::parallel_for(g.o, static_cast<double>(g.n * g.o * L * g.kk()), [&](std::int64_t o) {
    T* out = dw + o * g.kk();
    std::fill(out, out + g.kk(), T(0));
    for (std::int64_t n = 0; n < g.n; ++n) {
      const T* plane = x + (n * g.c + o / g.og()) * g.plane();
      const T* src = dy + (n * g.o + o) * L;
      for_taps(g, [&](std::int64_t i, std::int64_t j, std::int64_t oh, std::int64_t lo, std::int64_t hi,
                      std::int64_t yy, std::int64_t x0) {
        const T* row = plane + yy * g.w;
        const T* d = src + oh * g.wo;
        T s = T(0);
        for (std::int64_t ow = lo; ow < hi; ++ow) s += d[ow] * row[x0 + ow * g.sw];
        out[i * g.kw + j] += s;
      });
    }
  });
}

// The columns of image n of x: x itself for a direct conv, else formed in ws.
template <class T> const T* columns_cpu(const Geom& g, const T* x, std::int64_t n, void* ws) {
  const T* x_img = x + n * g.c * g.plane();
  if (g.direct()) return x_img;
  im2col_cpu(g, x_img, static_cast<T*>(ws));
  return static_cast<const T*>(ws);
}

Geom conv_geom(const KernelArgs& k, const Shape& xs, const Shape& ws) {
  return geom_of(xs, ws[0], ws[2], ws[3], k.attrs);
}
#if AD_HAVE_CUDA
char* at_elem(const void* p, std::int64_t elems, DType t) {
  return static_cast<char*>(const_cast<void*>(p)) + elems * static_cast<std::int64_t>(dtype_size(t));
}
#endif
}  // namespace

// ---- conv2d ----  x [N,C,H,W], w [O,C/G,KH,KW] -> [N,O,HO,WO]; per image and group y_g = W_g cols_g
Meta infer_conv2d(const InferArgs& a) {
  check_float_same(a);
  Geom g = check_conv(a, a[0].shape, a[1].shape);
  return Meta{out_shape(g), a[0].dtype, a[0].device};
}
void conv2d_cpu(const KernelArgs& k) {
  const Geom g = conv_geom(k, k[0].shape(), k[1].shape());
  const std::int64_t L = g.l(), K = g.cg() * g.kk(), og = g.og();
  kernels::dispatch_float(k.out.dtype(), "conv2d", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    const T* w = k[1].data<T>();
    T* y = k.out.data<T>();
    if (depthwise(g)) return depthwise_forward(g, x, w, y);
    for (std::int64_t n = 0; n < g.n; ++n) {
      const T* cols = columns_cpu(g, x, n, k.workspace);
      for (std::int64_t gi = 0; gi < g.g; ++gi)
        blas::gemm("conv2d", false, false, og, L, K, w + gi * og * K, cols + gi * K * L, y + (n * g.o + gi * og) * L);
    }
  });
}
// Per chunk of images: one strided-batched GEMM per group over the chunk.
AD_CUDA_ONLY(void conv2d_cuda(const KernelArgs& k) {
  const Geom g = conv_geom(k, k[0].shape(), k[1].shape());
  const DType t = k.out.dtype();
  const std::int64_t L = g.l(), K = g.cg() * g.kk(), og = g.og();
  const std::int64_t nb = g.direct() ? g.n : chunk_images(g, DeviceKind::cuda, dtype_size(t));
  for (std::int64_t n0 = 0; n0 < g.n; n0 += nb) {
    const std::int64_t cnt = std::min(nb, g.n - n0);
    const void* cols = at_elem(k[0].raw(), n0 * g.c * g.plane(), t);
    std::int64_t stride = g.c * g.plane();
    if (!g.direct()) {
      cuda_k::im2col(t, g, k[0].raw(), n0, cnt, k.workspace);
      cols = k.workspace;
      stride = g.cols_elems();
    }
    for (std::int64_t gi = 0; gi < g.g; ++gi)
      cuda_k::gemm(t, false, false, cnt, og, L, K, at_elem(k[1].raw(), gi * og * K, t), 0, at_elem(cols, gi * K * L, t),
                   stride, at_elem(k.out.raw(), (n0 * g.o + gi * og) * L, t), g.o * L);
  }
})
// d/dx = conv2d_backward_input(dy, w); d/dw = conv2d_backward_weight(x, dy)
void conv2d_bwd(BackwardArgs& a) {
  if (a.needs[0]) {
    Attrs at = a.attrs;
    at.shape = a.in[0].shape();
    a.grad[0] = make_node(OpId::conv2d_backward_input, {a.dout, a.in[1]}, at);
  }
  if (a.needs[1]) {
    Attrs at = a.attrs;
    at.shape = a.in[1].shape();
    a.grad[1] = make_node(OpId::conv2d_backward_weight, {a.in[0], a.dout}, at);
  }
}
double conv2d_flops(const InferArgs& a, const Meta& out) {
  const Shape& ws = a[1].shape;
  return 2.0 * static_cast<double>(out.shape.numel()) * static_cast<double>(ws[1] * ws[2] * ws[3]);
}
const OpDef op_def_conv2d{.name = "conv2d", .args = "x,w", .arity = 2, .infer = infer_conv2d, .cpu = conv2d_cpu,
                          .cuda = AD_CUDA_FN(conv2d_cuda), .backward = conv2d_bwd,
                          .saves = saves_input(0) | saves_input(1), .flops = conv2d_flops,
                          .workspace = [](const InferArgs& a, const Meta& out) -> std::int64_t {
                            return cols_workspace(geom_of(a[0].shape, a[1].shape[0], a[1].shape[2], a[1].shape[3],
                                                          a.attrs), out);
                          }};

// ---- conv2d_backward_input ----  (dy, w) -> dx [attrs.shape]: per image and group
// cols_g = W_g^T dy_g, then dx = col2im(cols). Linear in dy and in w:
// d/d(dy) = conv2d(G, w), d/dw = conv2d_backward_weight(G, dy).
Meta infer_conv2d_backward_input(const InferArgs& a) {
  check_float_same(a);
  Geom g = check_conv(a, a.attrs.shape, a[1].shape);
  check_dy(a, 0, g);
  return Meta{a.attrs.shape, a[0].dtype, a[0].device};
}
void conv2d_backward_input_cpu(const KernelArgs& k) {
  const Geom g = conv_geom(k, k.attrs.shape, k[1].shape());
  const std::int64_t L = g.l(), K = g.cg() * g.kk(), og = g.og();
  kernels::dispatch_float(k.out.dtype(), "conv2d_backward_input", [&](auto t) {
    using T = decltype(t);
    const T* dy = k[0].data<T>();
    const T* w = k[1].data<T>();
    T* dx = k.out.data<T>();
    if (depthwise(g)) return depthwise_backward_input(g, dy, w, dx);
    for (std::int64_t n = 0; n < g.n; ++n) {
      T* dx_img = dx + n * g.c * g.plane();
      T* cols = g.direct() ? dx_img : static_cast<T*>(k.workspace);
      for (std::int64_t gi = 0; gi < g.g; ++gi)
        blas::gemm("conv2d_backward_input", true, false, K, L, og, w + gi * og * K, dy + (n * g.o + gi * og) * L,
                   cols + gi * K * L);
      if (!g.direct()) col2im_cpu(g, static_cast<const T*>(cols), dx_img);
    }
  });
}
AD_CUDA_ONLY(void conv2d_backward_input_cuda(const KernelArgs& k) {
  const Geom g = conv_geom(k, k.attrs.shape, k[1].shape());
  const DType t = k.out.dtype();
  const std::int64_t L = g.l(), K = g.cg() * g.kk(), og = g.og();
  const std::int64_t nb = g.direct() ? g.n : chunk_images(g, DeviceKind::cuda, dtype_size(t));
  for (std::int64_t n0 = 0; n0 < g.n; n0 += nb) {
    const std::int64_t cnt = std::min(nb, g.n - n0);
    void* cols = g.direct() ? at_elem(k.out.raw(), n0 * g.c * g.plane(), t) : k.workspace;
    const std::int64_t stride = g.direct() ? g.c * g.plane() : g.cols_elems();
    for (std::int64_t gi = 0; gi < g.g; ++gi)
      cuda_k::gemm(t, true, false, cnt, K, L, og, at_elem(k[1].raw(), gi * og * K, t), 0,
                   at_elem(k[0].raw(), (n0 * g.o + gi * og) * L, t), g.o * L, at_elem(cols, gi * K * L, t), stride);
    if (!g.direct()) cuda_k::col2im(t, g, k.workspace, cnt, at_elem(k.out.raw(), n0 * g.c * g.plane(), t));
  }
})
void conv2d_backward_input_bwd(BackwardArgs& a) {
  Attrs at = a.attrs;
  if (a.needs[0]) a.grad[0] = make_node(OpId::conv2d, {a.dout, a.in[1]}, at);
  if (a.needs[1]) {
    at.shape = a.in[1].shape();
    a.grad[1] = make_node(OpId::conv2d_backward_weight, {a.dout, a.in[0]}, at);
  }
}
const OpDef op_def_conv2d_backward_input{
    .name = "conv2d_backward_input", .args = "dy,w", .arity = 2, .infer = infer_conv2d_backward_input,
    .cpu = conv2d_backward_input_cpu, .cuda = AD_CUDA_FN(conv2d_backward_input_cuda),
    .backward = conv2d_backward_input_bwd, .saves = saves_input(0) | saves_input(1),
    .flops = [](const InferArgs& a, const Meta&) {
      const Shape& ws = a[1].shape;
      return 2.0 * static_cast<double>(a[0].shape.numel()) * static_cast<double>(ws[1] * ws[2] * ws[3]);
    },
    .workspace = [](const InferArgs& a, const Meta& out) -> std::int64_t {
      return cols_workspace(geom_of(a.attrs.shape, a[1].shape[0], a[1].shape[2], a[1].shape[3], a.attrs), out);
    }};

// ---- conv2d_backward_weight ----  (x, dy) -> dw [attrs.shape] = sum over images of
// dy_g cols_g^T per group. Linear in x and in dy: d/dx = conv2d_backward_input(dy, G),
// d/d(dy) = conv2d(x, G).
Meta infer_conv2d_backward_weight(const InferArgs& a) {
  check_float_same(a);
  Geom g = check_conv(a, a[0].shape, a.attrs.shape);
  check_dy(a, 1, g);
  return Meta{a.attrs.shape, a[0].dtype, a[0].device};
}
void conv2d_backward_weight_cpu(const KernelArgs& k) {
  const Geom g = conv_geom(k, k[0].shape(), k.attrs.shape);
  const std::int64_t L = g.l(), K = g.cg() * g.kk(), og = g.og();
  if (g.n == 0) {
    k.out.fill(0.0);
    return;
  }
  kernels::dispatch_float(k.out.dtype(), "conv2d_backward_weight", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    const T* dy = k[1].data<T>();
    T* dw = k.out.data<T>();
    if (depthwise(g)) return depthwise_backward_weight(g, x, dy, dw);
    for (std::int64_t n = 0; n < g.n; ++n) {
      const T* cols = columns_cpu(g, x, n, k.workspace);
      for (std::int64_t gi = 0; gi < g.g; ++gi)
        blas::gemm("conv2d_backward_weight", false, true, og, K, L, dy + (n * g.o + gi * og) * L, cols + gi * K * L,
                   dw + gi * og * K, n == 0 ? T(0) : T(1));
    }
  });
}
// Per image: one strided-batched GEMM over the groups, accumulating into dw.
AD_CUDA_ONLY(void conv2d_backward_weight_cuda(const KernelArgs& k) {
  const Geom g = conv_geom(k, k[0].shape(), k.attrs.shape);
  const DType t = k.out.dtype();
  const std::int64_t L = g.l(), K = g.cg() * g.kk(), og = g.og();
  if (g.n == 0) {
    k.out.fill(0.0);
    return;
  }
  const std::int64_t nb = g.direct() ? g.n : chunk_images(g, DeviceKind::cuda, dtype_size(t));
  for (std::int64_t n0 = 0; n0 < g.n; n0 += nb) {
    const std::int64_t cnt = std::min(nb, g.n - n0);
    if (!g.direct()) cuda_k::im2col(t, g, k[0].raw(), n0, cnt, k.workspace);
    for (std::int64_t n = n0; n < n0 + cnt; ++n) {
      const void* cols = g.direct() ? at_elem(k[0].raw(), n * g.c * g.plane(), t)
                                    : at_elem(k.workspace, (n - n0) * g.cols_elems(), t);
      cuda_k::gemm(t, false, true, g.g, og, K, L, at_elem(k[1].raw(), n * g.o * L, t), og * L, cols, K * L,
                   k.out.raw(), og * K, n > 0);
    }
  }
})
void conv2d_backward_weight_bwd(BackwardArgs& a) {
  Attrs at = a.attrs;
  if (a.needs[0]) {
    at.shape = a.in[0].shape();
    a.grad[0] = make_node(OpId::conv2d_backward_input, {a.in[1], a.dout}, at);
  }
  if (a.needs[1]) a.grad[1] = make_node(OpId::conv2d, {a.in[0], a.dout}, a.attrs);
}
const OpDef op_def_conv2d_backward_weight{
    .name = "conv2d_backward_weight", .args = "x,dy", .arity = 2, .infer = infer_conv2d_backward_weight,
    .cpu = conv2d_backward_weight_cpu, .cuda = AD_CUDA_FN(conv2d_backward_weight_cuda),
    .backward = conv2d_backward_weight_bwd, .saves = saves_input(0) | saves_input(1),
    .flops = [](const InferArgs& a, const Meta& out) {  // dy elements x the weights one output channel has
      return 2.0 * static_cast<double>(a[1].shape.numel()) *
             static_cast<double>(out.shape[1] * out.shape[2] * out.shape[3]);
    },
    .workspace = [](const InferArgs& a, const Meta& out) -> std::int64_t {
      return cols_workspace(geom_of(a[0].shape, a.attrs.shape[0], a.attrs.shape[2], a.attrs.shape[3], a.attrs), out);
    }};

Var conv2d(const Operand& x, const Operand& w, const Conv2dOptions& o) {
  Attrs at;
  for (int i = 0; i < 2; ++i) {
    at.stride[i] = o.stride[static_cast<std::size_t>(i)];
    at.pad[i] = o.padding[static_cast<std::size_t>(i)];
    at.dilation[i] = o.dilation[static_cast<std::size_t>(i)];
  }
  at.groups = o.groups;
  return make_node(OpId::conv2d, {x, w}, at);
}

Var conv_transpose2d(const Operand& x, const Operand& w, const Conv2dOptions& o,
                     std::array<std::int64_t, 2> output_padding) {
  const Shape xs = operand_shape("conv_transpose2d", x), ws = operand_shape("conv_transpose2d", w);
  auto shapes = [&] { return fmt::format("x {} w {}", xs.str(), ws.str()); };
  if (xs.rank() != 4 || ws.rank() != 4)
    throw Error(fmt::format("conv_transpose2d: x must be rank 4 [N, Cin, H, W] and w rank 4 [Cin, Cout/groups, KH, KW]: "
                            "{}",
                            shapes()));
  if (o.groups < 1 || ws[0] % o.groups != 0)
    throw Error(fmt::format("conv_transpose2d: groups ({}) must be >= 1 and divide w's dim 0: {}", o.groups, shapes()));
  if (xs[1] != ws[0])
    throw Error(fmt::format("conv_transpose2d: x has {} channels but w expects {} (its dim 0): {}", xs[1], ws[0],
                            shapes()));
  Attrs at;
  Shape out{xs[0], ws[1] * o.groups, 0, 0};
  for (std::size_t i = 0; i < 2; ++i) {
    const std::int64_t s = o.stride[i], p = o.padding[i], d = o.dilation[i], op = output_padding[i];
    if (s < 1 || d < 1 || p < 0 || s >= (std::int64_t{1} << 31) || d >= (std::int64_t{1} << 31) ||
        p >= (std::int64_t{1} << 31))
      throw Error(fmt::format("conv_transpose2d: stride and dilation must be >= 1 and padding >= 0 (each below 2^31), "
                              "got stride ({}, {}), padding ({}, {}), dilation ({}, {})",
                              o.stride[0], o.stride[1], o.padding[0], o.padding[1], o.dilation[0], o.dilation[1]));
    if (op < 0 || (op >= s && op >= d))
      throw Error(fmt::format("conv_transpose2d: output_padding ({}, {}) must be >= 0 and below the stride or the "
                              "dilation: {}",
                              output_padding[0], output_padding[1], shapes()));
    const std::int64_t n = (xs[2 + static_cast<int>(i)] - 1) * s - 2 * p + d * (ws[2 + static_cast<int>(i)] - 1) + 1 + op;
    if (n < 1)
      throw Error(fmt::format("conv_transpose2d: the output would have {} {} (the padding removes more than the "
                              "stride and the window give): {}",
                              i == 0 ? "height" : "width", n, shapes()));
    out[2 + static_cast<int>(i)] = n;
    at.stride[i] = s, at.pad[i] = p, at.dilation[i] = d;
  }
  at.groups = o.groups;
  at.shape = out;
  return make_node(OpId::conv2d_backward_input, {x, w}, at);
}

Var upsample_nearest2d(const Operand& x, std::array<std::int64_t, 2> f) {
  const Shape xs = operand_shape("upsample_nearest2d", x);
  if (xs.rank() != 4) throw Error(fmt::format("upsample_nearest2d: x must be rank 4 [N, C, H, W], got {}", xs.str()));
  if (f[0] < 1 || f[1] < 1)
    throw Error(fmt::format("upsample_nearest2d: factors must be >= 1, got ({}, {})", f[0], f[1]));
  Var y = broadcast_to(reshape(x, {xs[0], xs[1], xs[2], 1, xs[3], 1}), {xs[0], xs[1], xs[2], f[0], xs[3], f[1]});
  return reshape(y, {xs[0], xs[1], xs[2] * f[0], xs[3] * f[1]});
}

Var conv1d(const Operand& x, const Operand& w, const Conv1dOptions& o) {
  const Shape xs = operand_shape("conv1d", x), ws = operand_shape("conv1d", w);
  if (xs.rank() != 3 || ws.rank() != 3)
    throw Error(fmt::format("conv1d: x must be rank 3 [N, C, L] and w rank 3 [O, C/groups, K], got x {} and w {}",
                            xs.str(), ws.str()));
  Conv2dOptions c;
  c.stride = {1, o.stride};
  c.padding = {0, o.padding};
  c.dilation = {1, o.dilation};
  c.groups = o.groups;
  const Var like = x.var().defined() ? x.var() : w.var();
  if (!like.defined())
    throw Error("conv1d: x and w are both Parameters, so no graph is known; place one in a graph with g.param(p)");
  Var y = conv2d(reshape(operand_var(x, like), {xs[0], xs[1], 1, xs[2]}),
                 reshape(operand_var(w, like), {ws[0], ws[1], 1, ws[2]}), c);
  return reshape(y, {y.dim(0), y.dim(1), y.dim(3)});
}

// ---- max_pool2d ----  x [N,C,H,W] -> [N,C,HO,WO]: the largest tap of each window
namespace {
Geom check_pool(const InferArgs& a, const Shape& xs) {
  const Attrs& at = a.attrs;
  if (at.window[0] < 1 || at.window[1] < 1) fail(a, fmt::format("kernel must be >= 1, got {}", pair_str(at.window)));
  check_options(a);
  check_rank4(a, xs, "x", "[N, C, H, W]");
  Attrs one = at;
  one.groups = 1;
  Geom g = geom_of(xs, xs[1], at.window[0], at.window[1], one);
  g.g = g.c;
  check_fits(a, g);
  // every window needs a tap inside x: the last output along each dim starts furthest out
  auto inside = [](std::int64_t out, std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p, std::int64_t d) {
    for (std::int64_t o = 0; o < out; ++o) {
      bool any = false;
      for (std::int64_t i = 0; i < k && !any; ++i) {
        const std::int64_t y = o * s - p + i * d;
        any = y >= 0 && y < in;
      }
      if (!any) return o;
    }
    return std::int64_t{-1};
  };
  const std::int64_t bh = inside(g.ho, g.h, g.kh, g.sh, g.ph, g.dh), bw = inside(g.wo, g.w, g.kw, g.sw, g.pw, g.dw);
  if (bh >= 0 || bw >= 0)
    fail_shapes(a, fmt::format("the window at output {} {} lies wholly in the padding {} (kernel {}, stride {}, "
                               "dilation {})",
                               bh >= 0 ? "row" : "column", bh >= 0 ? bh : bw, pair_str(at.pad), pair_str(at.window),
                               pair_str(at.stride), pair_str(at.dilation)));
  return g;
}
Geom pool_geom(const KernelArgs& k) {
  Geom g = geom_of(k[0].shape(), k[0].shape()[1], k.attrs.window[0], k.attrs.window[1], k.attrs);
  g.g = g.c;
  return g;
}
}  // namespace
Meta infer_max_pool2d(const InferArgs& a) {
  check_float_same(a);
  Geom g = check_pool(a, a[0].shape);
  return Meta{out_shape(g), a[0].dtype, a[0].device};
}
void max_pool2d_cpu(const KernelArgs& k) {
  const Geom g = pool_geom(k);
  kernels::dispatch_float(k.out.dtype(), "max_pool2d", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    T* y = k.out.data<T>();
    parallel::parallel_for(g.n * g.c, static_cast<double>(k.out.numel() * g.kk()), [&](std::int64_t p) {
      for (std::int64_t l = 0; l < g.l(); ++l)
        y[p * g.l() + l] = conv::max_pool_at(g, x + p * g.plane(), l / g.wo, l % g.wo);
    });
  });
}
AD_CUDA_ONLY(void max_pool2d_cuda(const KernelArgs& k) {
  cuda_k::max_pool2d(k.out.dtype(), pool_geom(k), k[0].raw(), k.out.raw());
})
void max_pool2d_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = make_node(OpId::max_pool2d_backward, {a.in[0], a.dout}, a.attrs);
}
const OpDef op_def_max_pool2d{.name = "max_pool2d", .args = "x", .arity = 1, .infer = infer_max_pool2d,
                              .cpu = max_pool2d_cpu, .cuda = AD_CUDA_FN(max_pool2d_cuda), .backward = max_pool2d_bwd,
                              .saves = saves_input(0),
                              .flops = [](const InferArgs& a, const Meta& out) {
                                return static_cast<double>(out.shape.numel() * a.attrs.window[0] * a.attrs.window[1]);
                              }};

// ---- max_pool2d_backward ----  (x, dy) -> dx: each window's dy goes to its winning tap
// (found again from x), summed where windows overlap.
Meta infer_max_pool2d_backward(const InferArgs& a) {
  check_float_same(a);
  Geom g = check_pool(a, a[0].shape);
  check_dy(a, 1, g);
  return a[0];
}
void max_pool2d_backward_cpu(const KernelArgs& k) {
  const Geom g = pool_geom(k);
  kernels::dispatch_float(k.out.dtype(), "max_pool2d_backward", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    const T* dy = k[1].data<T>();
    T* dx = k.out.data<T>();
    parallel::parallel_for(g.n * g.c, static_cast<double>(k.out.numel() * g.kk() * g.kk()), [&](std::int64_t p) {
      for (std::int64_t e = 0; e < g.plane(); ++e)
        dx[p * g.plane() + e] = conv::max_pool_grad_at(g, x + p * g.plane(), dy + p * g.l(), e / g.w, e % g.w);
    });
  });
}
AD_CUDA_ONLY(void max_pool2d_backward_cuda(const KernelArgs& k) {
  cuda_k::max_pool2d_backward(k.out.dtype(), pool_geom(k), k[0].raw(), k[1].raw(), k.out.raw());
})
const OpDef op_def_max_pool2d_backward{
    .name = "max_pool2d_backward", .args = "x,dy", .arity = 2, .infer = infer_max_pool2d_backward,
    .cpu = max_pool2d_backward_cpu, .cuda = AD_CUDA_FN(max_pool2d_backward_cuda),
    .no_grad = "double backward is not supported",
    .flops = [](const InferArgs& a, const Meta& out) {
      return static_cast<double>(out.shape.numel() * a.attrs.window[0] * a.attrs.window[1] * a.attrs.window[0] *
                                 a.attrs.window[1]);
    }};

namespace {
Attrs pool_attrs(const char* op, const Pool2dOptions& o) {
  Attrs at;
  for (std::size_t i = 0; i < 2; ++i) {
    if (o.stride[i] < 0) throw Error(fmt::format("{}: stride must be >= 1 (or 0 for the kernel size), got ({}, {})", op,
                                                 o.stride[0], o.stride[1]));
    at.window[i] = o.kernel[i];
    at.stride[i] = o.stride[i] == 0 ? o.kernel[i] : o.stride[i];
    at.pad[i] = o.padding[i];
    at.dilation[i] = o.dilation[i];
  }
  return at;
}
}  // namespace

Var max_pool2d(const Operand& x, const Pool2dOptions& o) {
  return make_node(OpId::max_pool2d, {x}, pool_attrs("max_pool2d", o));
}

Var avg_pool2d(const Operand& x, const Pool2dOptions& o) {
  const Shape xs = operand_shape("avg_pool2d", x);
  if (!x.var().defined())
    throw Error("avg_pool2d: x is a Parameter, so no graph is known; place it in a graph with g.param(p)");
  const Var& xv = x.var();
  if (xs.rank() != 4) throw Error(fmt::format("avg_pool2d: x must be rank 4 [N, C, H, W], got {}", xs.str()));
  if (xv.dtype() != DType::f32 && xv.dtype() != DType::f64)
    throw Error(fmt::format("avg_pool2d: x must be f32 or f64, got {}", describe(Meta{xs, xv.dtype(), xv.device()})));
  const Attrs at = pool_attrs("avg_pool2d", o);
  for (std::size_t i = 0; i < 2; ++i) {
    if (o.dilation[i] != 1)
      throw Error(fmt::format("avg_pool2d: dilation must be 1, got ({}, {})", o.dilation[0], o.dilation[1]));
    if (o.kernel[i] < 1)
      throw Error(fmt::format("avg_pool2d: kernel must be >= 1, got ({}, {})", o.kernel[0], o.kernel[1]));
    if (o.padding[i] < 0)
      throw Error(fmt::format("avg_pool2d: padding must be >= 0, got ({}, {})", o.padding[0], o.padding[1]));
    if (!o.count_padding && o.padding[i] >= o.kernel[i])
      throw Error(fmt::format("avg_pool2d: without count_padding the padding ({}, {}) must be below the kernel ({}, {}), "
                              "or a window could lie wholly in it",
                              o.padding[0], o.padding[1], o.kernel[0], o.kernel[1]));
    if (o.kernel[i] > xs[2 + static_cast<int>(i)] + 2 * o.padding[i])
      throw Error(fmt::format("avg_pool2d: the window ({} x {}) is larger than the padded input ({} x {}): x {}",
                              o.kernel[0], o.kernel[1], xs[2] + 2 * o.padding[0], xs[3] + 2 * o.padding[1], xs.str()));
  }
  // depthwise: weight [C, 1, KH, KW]; with no channels, one group of none
  const std::int64_t c = xs[1];
  Var w = full(xv, Shape{c, c == 0 ? 0 : 1, o.kernel[0], o.kernel[1]},
               1.0 / static_cast<double>(o.kernel[0] * o.kernel[1]), xv.dtype());
  Conv2dOptions co;
  co.stride = {at.stride[0], at.stride[1]};
  co.padding = {at.pad[0], at.pad[1]};
  co.groups = c == 0 ? 1 : c;
  Var y = conv2d(xv, w, co);
  if (o.count_padding || (o.padding[0] == 0 && o.padding[1] == 0)) return y;
  // each window's share of taps inside x: the same pooling of a plane of ones (a constant, [1, 1, HO, WO])
  Conv2dOptions one = co;
  one.groups = 1;
  Var inside = conv2d(full(xv, Shape{1, 1, xs[2], xs[3]}, 1.0, xv.dtype()),
                      full(xv, Shape{1, 1, o.kernel[0], o.kernel[1]},
                           1.0 / static_cast<double>(o.kernel[0] * o.kernel[1]), xv.dtype()),
                      one);
  return div(y, inside);
}

}  // namespace ad
