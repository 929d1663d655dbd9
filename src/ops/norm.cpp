// Normalisation over the last dim D: layer_norm and rms_norm. Row statistics
// are accumulated in double; backward recomputes them from x (no residuals).
#include <cmath>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"

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
template <class T> void row_stats(const T* x, std::int64_t d, double eps, double& mu, double& rstd) {
  double s = 0;
  for (std::int64_t j = 0; j < d; ++j) s += x[j];
  mu = s / static_cast<double>(d);
  double v = 0;
  for (std::int64_t j = 0; j < d; ++j) { double c = x[j] - mu; v += c * c; }
  rstd = 1.0 / std::sqrt(v / static_cast<double>(d) + eps);
}
template <class T> double row_rms(const T* x, std::int64_t d, double eps) {
  double s = 0;
  for (std::int64_t j = 0; j < d; ++j) s += static_cast<double>(x[j]) * x[j];
  return 1.0 / std::sqrt(s / static_cast<double>(d) + eps);
}
}  // namespace

// ---- layer_norm ----  y = (x - mu) rstd gamma + beta; saves x and gamma
void layer_norm_cpu(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  kernels::dispatch_float(k.out.dtype(), "layer_norm", [&](auto t) {
    using T = decltype(t);
    const T *x = k[0].data<T>(), *g = k[1].data<T>(), *b = k[2].data<T>();
    T* y = k.out.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      double mu, rstd;
      row_stats(x + r * d, d, k.attrs.scalar, mu, rstd);
      T m = static_cast<T>(mu), s = static_cast<T>(rstd);
      for (std::int64_t j = 0; j < d; ++j) y[r * d + j] = (x[r * d + j] - m) * s * g[j] + b[j];
    }
  });
}
void layer_norm_bwd(BackwardArgs& a) {
  Attrs at = a.attrs;
  if (a.needs[0]) { at.which = 0; a.grad[0] = make_node(OpId::layer_norm_backward, {a.in[0], a.in[1], a.dout}, at); }
  if (a.needs[1]) { at.which = 1; a.grad[1] = make_node(OpId::layer_norm_backward, {a.in[0], a.in[1], a.dout}, at); }
  if (a.needs[2]) a.grad[2] = sum_to(a.dout, a.in[2].shape());
}
const OpDef op_def_layer_norm{.name = "layer_norm", .args = "x,gamma,beta", .arity = 3, .infer = infer_norm,
                              .cpu = layer_norm_cpu, .backward = layer_norm_bwd,
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
    if (k.attrs.which == 1) for (std::int64_t j = 0; j < d; ++j) out[j] = T(0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T *xr = x + r * d, *dyr = dy + r * d;
      double mu, rstd;
      row_stats(xr, d, k.attrs.scalar, mu, rstd);
      if (k.attrs.which == 1) {
        for (std::int64_t j = 0; j < d; ++j) out[j] += dyr[j] * static_cast<T>((xr[j] - mu) * rstd);
        continue;
      }
      double s1 = 0, s2 = 0;
      for (std::int64_t j = 0; j < d; ++j) {
        double gd = static_cast<double>(dyr[j]) * g[j];
        s1 += gd;
        s2 += gd * (xr[j] - mu) * rstd;
      }
      double m1 = s1 / static_cast<double>(d), m2 = s2 / static_cast<double>(d);
      for (std::int64_t j = 0; j < d; ++j) {
        double xh = (xr[j] - mu) * rstd;
        out[r * d + j] = static_cast<T>(rstd * (static_cast<double>(dyr[j]) * g[j] - m1 - xh * m2));
      }
    }
  });
}
const OpDef op_def_layer_norm_backward{.name = "layer_norm_backward", .args = "x,gamma,dy", .arity = 3,
                                       .infer = infer_norm_backward, .cpu = layer_norm_backward_cpu,
                                       .no_grad = "double backward is not supported"};

// ---- rms_norm ----  y = x r gamma, r = 1/sqrt(mean(x^2) + eps); saves x and gamma
void rms_norm_cpu(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  kernels::dispatch_float(k.out.dtype(), "rms_norm", [&](auto t) {
    using T = decltype(t);
    const T *x = k[0].data<T>(), *g = k[1].data<T>();
    T* y = k.out.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      T s = static_cast<T>(row_rms(x + r * d, d, k.attrs.scalar));
      for (std::int64_t j = 0; j < d; ++j) y[r * d + j] = x[r * d + j] * s * g[j];
    }
  });
}
void rms_norm_bwd(BackwardArgs& a) {
  Attrs at = a.attrs;
  if (a.needs[0]) { at.which = 0; a.grad[0] = make_node(OpId::rms_norm_backward, {a.in[0], a.in[1], a.dout}, at); }
  if (a.needs[1]) { at.which = 1; a.grad[1] = make_node(OpId::rms_norm_backward, {a.in[0], a.in[1], a.dout}, at); }
}
const OpDef op_def_rms_norm{.name = "rms_norm", .args = "x,gamma", .arity = 2, .infer = infer_norm,
                            .cpu = rms_norm_cpu, .backward = rms_norm_bwd, .saves = saves_input(0) | saves_input(1)};
Var rms_norm(const Operand& x, const Operand& gamma, double eps) {
  if (!(eps >= 0)) throw Error(fmt::format("rms_norm: eps must be >= 0, got {}", eps));
  Attrs at;
  at.scalar = eps;
  return make_node(OpId::rms_norm, {x, gamma}, at);
}
// ---- rms_norm_backward ----  gd = dy gamma: dx = r (gd - x r^2 mean(gd x)); dgamma = sum_rows dy x r
void rms_norm_backward_cpu(const KernelArgs& k) {
  std::int64_t d = k[0].shape().back(), rows = d ? k[0].numel() / d : 0;
  kernels::dispatch_float(k.out.dtype(), "rms_norm_backward", [&](auto t) {
    using T = decltype(t);
    const T *x = k[0].data<T>(), *g = k[1].data<T>(), *dy = k[2].data<T>();
    T* out = k.out.data<T>();
    if (k.attrs.which == 1) for (std::int64_t j = 0; j < d; ++j) out[j] = T(0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T *xr = x + r * d, *dyr = dy + r * d;
      double rs = row_rms(xr, d, k.attrs.scalar);
      if (k.attrs.which == 1) {
        for (std::int64_t j = 0; j < d; ++j) out[j] += dyr[j] * static_cast<T>(xr[j] * rs);
        continue;
      }
      double s = 0;
      for (std::int64_t j = 0; j < d; ++j) s += static_cast<double>(dyr[j]) * g[j] * xr[j];
      double m = s / static_cast<double>(d);
      for (std::int64_t j = 0; j < d; ++j)
        out[r * d + j] = static_cast<T>(rs * (static_cast<double>(dyr[j]) * g[j] - xr[j] * rs * rs * m));
    }
  });
}
const OpDef op_def_rms_norm_backward{.name = "rms_norm_backward", .args = "x,gamma,dy", .arity = 3,
                                     .infer = infer_norm_backward, .cpu = rms_norm_backward_cpu,
                                     .no_grad = "double backward is not supported"};

}  // namespace ad
