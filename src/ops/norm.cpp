// Normalisation over the last dim D: layer_norm and rms_norm. Row statistics
// are accumulated in double; backward recomputes them from x (no residuals).
#include <cmath>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/norm_math.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
// x [..., D], params [D] each
Meta infer_norm(const InferArgs& a) {
  check_float_same(a);
  if (a[0].shape.rank() == 0) fail_shapes(a, "x needs rank >= 1");
  std::int64_t d = a[0].shape.back();
  for (std::size_t i = 1; i < a.in.size(); ++i)
    if (a[i].shape.rank() != 1 || a[i].shape[0] != d) fail_shapes(a, "parameters must be [D] with D = x's last dim");
  return a[0];
}
// (x, gamma, dy) -> dx (which 0, shape of x) or dgamma (which 1, [D])
Meta infer_norm_backward(const InferArgs& a) {
  check_float_same(a);
  Meta m = a[0];
  if (a.attrs.which == 1) m.shape = Shape{a[0].shape.back()};
  return m;
}
// Workspace of dgamma on a GPU: `per_row` doubles of statistics per row (the
// CUDA kernel stores them, then sums columns); the CPU needs none.
std::int64_t norm_dgamma_ws(const InferArgs& a, std::int64_t per_row) {
  if (a.attrs.which != 1 || a[0].device.kind != DeviceKind::cuda) return 0;
  std::int64_t d = a[0].shape.back(), rows = d ? a[0].shape.numel() / d : 0;
  return rows * per_row * static_cast<std::int64_t>(sizeof(double));
}
std::int64_t layer_norm_backward_ws(const InferArgs& a, const Meta&) { return norm_dgamma_ws(a, 2); }  // mean, rstd
std::int64_t rms_norm_backward_ws(const InferArgs& a, const Meta&) { return norm_dgamma_ws(a, 1); }    // 1/rms
}  // namespace

// ---- layer_norm ----  y = (x - mu) rstd gamma + beta; saves x and gamma
void layer_norm_cpu(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  kernels::dispatch_float(k.out.dtype(), "layer_norm", [&](auto t) {
    using T = decltype(t);
    norm::LayerNorm<T> f{k[0].data<T>(), k[1].data<T>(), k[2].data<T>(), k.out.data<T>(), d, k.attrs.scalar};
    for (std::int64_t r = 0; r < rows; ++r) f(r);
  });
}
AD_CUDA_ONLY(void layer_norm_cuda(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  cuda_k::layer_norm(k.out.dtype(), k[0].raw(), k[1].raw(), k[2].raw(), k.out.raw(), rows, d, k.attrs.scalar);
})
void layer_norm_bwd(BackwardArgs& a) {
  Attrs at = a.attrs;
  if (a.needs[0]) { at.which = 0; a.grad[0] = make_node(OpId::layer_norm_backward, {a.in[0], a.in[1], a.dout}, at); }
  if (a.needs[1]) { at.which = 1; a.grad[1] = make_node(OpId::layer_norm_backward, {a.in[0], a.in[1], a.dout}, at); }
  if (a.needs[2]) a.grad[2] = sum_to(a.dout, a.in[2].shape());
}
const OpDef op_def_layer_norm{.name = "layer_norm", .args = "x,gamma,beta", .arity = 3, .infer = infer_norm,
                              .cpu = layer_norm_cpu, .cuda = AD_CUDA_FN(layer_norm_cuda), .backward = layer_norm_bwd,
                              .saves = saves_input(0) | saves_input(1)};
Var layer_norm(const Operand& x, const Operand& gamma, const Operand& beta, double eps) {
  if (!(eps >= 0)) throw Error(fmt::format("layer_norm: eps must be >= 0, got {}", eps));
  Attrs at;
  at.scalar = eps;
  return make_node(OpId::layer_norm, {x, gamma, beta}, at);
}
// ---- layer_norm_backward ----  xh = (x - mu) rstd, gd = dy gamma:
//   dx = rstd (gd - mean(gd) - xh mean(gd xh));  dgamma = sum_rows dy xh
void layer_norm_backward_cpu(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  kernels::dispatch_float(k.out.dtype(), "layer_norm_backward", [&](auto t) {
    using T = decltype(t);
    const T *x = k[0].data<T>(), *g = k[1].data<T>(), *dy = k[2].data<T>();
    T* out = k.out.data<T>();
    if (k.attrs.which == 0) {
      norm::LayerNormDx<T> f{x, g, dy, out, d, k.attrs.scalar};
      for (std::int64_t r = 0; r < rows; ++r) f(r);
      return;
    }
    for (std::int64_t j = 0; j < d; ++j) out[j] = T(0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T *xr = x + r * d, *dyr = dy + r * d;
      double mu, rstd;
      norm::row_stats(xr, d, k.attrs.scalar, mu, rstd);
      for (std::int64_t j = 0; j < d; ++j) out[j] += norm::layer_norm_dgamma_term(xr[j], dyr[j], mu, rstd);
    }
  });
}
AD_CUDA_ONLY(void layer_norm_backward_cuda(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  cuda_k::layer_norm_backward(k.out.dtype(), k.attrs.which, k[0].raw(), k[1].raw(), k[2].raw(), k.out.raw(), rows, d,
                              k.attrs.scalar, static_cast<double*>(k.workspace));
})
const OpDef op_def_layer_norm_backward{.name = "layer_norm_backward", .args = "x,gamma,dy", .arity = 3,
                                       .infer = infer_norm_backward, .cpu = layer_norm_backward_cpu,
                                       .cuda = AD_CUDA_FN(layer_norm_backward_cuda),
                                       .no_grad = "double backward is not supported",
                                       .workspace = layer_norm_backward_ws};

// ---- rms_norm ----  y = x r gamma, r = 1/sqrt(mean(x^2) + eps); saves x and gamma
void rms_norm_cpu(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  kernels::dispatch_float(k.out.dtype(), "rms_norm", [&](auto t) {
    using T = decltype(t);
    norm::RmsNorm<T> f{k[0].data<T>(), k[1].data<T>(), k.out.data<T>(), d, k.attrs.scalar};
    for (std::int64_t r = 0; r < rows; ++r) f(r);
  });
}
AD_CUDA_ONLY(void rms_norm_cuda(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  cuda_k::rms_norm(k.out.dtype(), k[0].raw(), k[1].raw(), k.out.raw(), rows, d, k.attrs.scalar);
})
void rms_norm_bwd(BackwardArgs& a) {
  Attrs at = a.attrs;
  if (a.needs[0]) { at.which = 0; a.grad[0] = make_node(OpId::rms_norm_backward, {a.in[0], a.in[1], a.dout}, at); }
  if (a.needs[1]) { at.which = 1; a.grad[1] = make_node(OpId::rms_norm_backward, {a.in[0], a.in[1], a.dout}, at); }
}
const OpDef op_def_rms_norm{.name = "rms_norm", .args = "x,gamma", .arity = 2, .infer = infer_norm,
                            .cpu = rms_norm_cpu, .cuda = AD_CUDA_FN(rms_norm_cuda), .backward = rms_norm_bwd, .saves = saves_input(0) | saves_input(1)};
Var rms_norm(const Operand& x, const Operand& gamma, double eps) {
  if (!(eps >= 0)) throw Error(fmt::format("rms_norm: eps must be >= 0, got {}", eps));
  Attrs at;
  at.scalar = eps;
  return make_node(OpId::rms_norm, {x, gamma}, at);
}
// ---- group_norm ----  a composition: layer_norm over each (image, group) row of
// x viewed as [N, G, C/G * rest], then the per-channel affine
Var group_norm(const Operand& x, std::int64_t groups, const Operand& gamma, const Operand& beta, double eps) {
  const Shape xs = operand_shape("group_norm", x);
  const Shape gs = operand_shape("group_norm", gamma), bs = operand_shape("group_norm", beta);
  auto shapes = [&] { return fmt::format("x {} gamma {} beta {}", xs.str(), gs.str(), bs.str()); };
  if (!x.var().defined())
    throw Error("group_norm: x is a Parameter, so no graph is known; place it in a graph with g.param(p)");
  if (xs.rank() < 2) throw Error(fmt::format("group_norm: x needs rank >= 2 [N, C, ...]: {}", shapes()));
  if (!(eps >= 0)) throw Error(fmt::format("group_norm: eps must be >= 0, got {}", eps));
  const std::int64_t n = xs[0], c = xs[1];
  if (groups < 1 || c % groups != 0)
    throw Error(fmt::format("group_norm: groups ({}) must be >= 1 and divide the {} channels: {}", groups, c, shapes()));
  if (!(gs == Shape{c}) || !(bs == Shape{c}))
    throw Error(fmt::format("group_norm: gamma and beta must be [C] = [{}]: {}", c, shapes()));
  const Var& xv = x.var();
  const std::int64_t row = n * c == 0 ? 0 : xs.numel() / (n * groups);
  Var z = reshape(xv, Shape{n, groups, row});
  z = layer_norm(z, full(xv, Shape{row}, 1.0, xv.dtype()), full(xv, Shape{row}, 0.0, xv.dtype()), eps);
  Shape per_channel{c};
  for (int d = 2; d < xs.rank(); ++d) per_channel.push_back(1);
  return add(mul(reshape(z, xs), reshape(operand_var(gamma, xv), per_channel)),
             reshape(operand_var(beta, xv), per_channel));
}
// ---- rms_norm_backward ----  gd = dy gamma: dx = r (gd - x r^2 mean(gd x)); dgamma = sum_rows dy x r
void rms_norm_backward_cpu(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  kernels::dispatch_float(k.out.dtype(), "rms_norm_backward", [&](auto t) {
    using T = decltype(t);
    const T *x = k[0].data<T>(), *g = k[1].data<T>(), *dy = k[2].data<T>();
    T* out = k.out.data<T>();
    if (k.attrs.which == 0) {
      norm::RmsNormDx<T> f{x, g, dy, out, d, k.attrs.scalar};
      for (std::int64_t r = 0; r < rows; ++r) f(r);
      return;
    }
    for (std::int64_t j = 0; j < d; ++j) out[j] = T(0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T *xr = x + r * d, *dyr = dy + r * d;
      double rs = norm::row_rms(xr, d, k.attrs.scalar);
      for (std::int64_t j = 0; j < d; ++j) out[j] += norm::rms_norm_dgamma_term(xr[j], dyr[j], rs);
    }
  });
}
AD_CUDA_ONLY(void rms_norm_backward_cuda(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  cuda_k::rms_norm_backward(k.out.dtype(), k.attrs.which, k[0].raw(), k[1].raw(), k[2].raw(), k.out.raw(), rows, d,
                            k.attrs.scalar, static_cast<double*>(k.workspace));
})
const OpDef op_def_rms_norm_backward{.name = "rms_norm_backward", .args = "x,gamma,dy", .arity = 3,
                                     .infer = infer_norm_backward, .cpu = rms_norm_backward_cpu,
                                     .cuda = AD_CUDA_FN(rms_norm_backward_cuda),
                                     .no_grad = "double backward is not supported",
                                     .workspace = rms_norm_backward_ws};

}  // namespace ad
