// Reductions (sum, mean, max over axes) and the per-axis softmax family.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/rows.hpp"
#include "ops/sum_layout.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif
#include "core/math.hpp"

namespace ad {

namespace {
// Sorted, unique, non-negative axes; empty means all.
Shape norm_axes(const char* op, const Shape& axes, const Shape& s) {
  bool on[kMaxRank] = {};
  if (axes.empty()) for (int i = 0; i < s.rank(); ++i) on[i] = true;
  for (auto a : axes) {
    auto n = norm_axis(op, a, s);
    if (on[n] && !axes.empty()) throw Error(fmt::format("{}: axis {} repeated in {} for shape {}", op, a, axes.str(), s.str()));
    on[n] = true;
  }
  Shape r;
  for (int i = 0; i < s.rank(); ++i) if (on[i]) r.push_back(i);
  return r;
}
bool has_axis(const Shape& axes, int i) { return std::find(axes.begin(), axes.end(), i) != axes.end(); }
Shape keepdim_shape(const Shape& s, const Shape& axes) {
  Shape k = s;
  for (auto a : axes) k[static_cast<int>(a)] = 1;
  return k;
}
Meta infer_reduce(const InferArgs& a) {
  check_float_same(a);
  Meta m = a[0];
  m.shape = Shape{};
  for (int i = 0; i < a[0].shape.rank(); ++i) {
    if (!has_axis(a.attrs.axes, i)) m.shape.push_back(a[0].shape[i]);
    else if (a.attrs.keepdim) m.shape.push_back(1);
  }
  return m;
}
Attrs reduce_attrs(const char* op, const Operand& x, const Shape& axes, bool keepdim) {
  Shape s = operand_shape(op, x);
  Attrs at;
  at.axes = norm_axes(op, axes, s);
  at.keepdim = keepdim;
  return at;
}
// Calls f(i, o) for every element i of x (shape xs) in order, with o its
// element of the reduced output (keepdim shape ks): an odometer over xs.
template <class F> void for_each_reduced(const Shape& xs, const Shape& ks, F f) {
  const std::int64_t n = xs.numel();
  const int r = xs.rank();
  std::int64_t st[kMaxRank];
  kernels::broadcast_strides(ks, xs, st);
  std::int64_t idx[kMaxRank] = {0};
  std::int64_t off = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (int q = r - 1; q >= 0; --q) {
      if (++idx[q] < xs[q]) { off += st[q]; break; }
      off -= st[q] * (xs[q] - 1);
      idx[q] = 0;
    }
  }
}
bool suffix_axes(const Shape& xs, const Shape& axes) {
  for (int i = 0; i < axes.rank(); ++i)
    if (axes[i] != xs.rank() - axes.rank() + i) return false;
  return true;
}
// Reduces x over `axes` into y (laid out as the keepdim shape) with
// init/step/finish, accumulating in double. Suffix reductions (rows) keep
// one double per row; other patterns walk x once in order, into `sums` (one
// double per output: the op's workspace) where given, else into y itself
// (exact for T = double; for max, any T). Deterministic either way.
template <class T, class Step>
void reduce_into(const T* x, const Shape& xs, const Shape& axes, T* y, double init, Step step, double* sums = nullptr) {
  std::int64_t n = xs.numel();
  Shape ks = keepdim_shape(xs, axes);
  std::int64_t ny = ks.numel();
  if (suffix_axes(xs, axes)) {
    std::int64_t len = ny ? n / ny : 0;
    for (std::int64_t r = 0; r < ny; ++r) {
      double acc = init;
      const T* row = x + r * len;
      for (std::int64_t j = 0; j < len; ++j) acc = step(acc, static_cast<double>(row[j]));
      y[r] = static_cast<T>(acc);
    }
    return;
  }
  auto walk = [&](auto* into) {
    using A = std::remove_pointer_t<decltype(into)>;
    for (std::int64_t i = 0; i < ny; ++i) into[i] = static_cast<A>(init);
    if (n == 0) return;
    for_each_reduced(xs, ks, [&](std::int64_t i, std::int64_t o) {
      into[o] = static_cast<A>(step(static_cast<double>(into[o]), static_cast<double>(x[i])));
    });
  };
  if (sums) {
    walk(sums);
    for (std::int64_t i = 0; i < ny; ++i) y[i] = static_cast<T>(sums[i]);
  } else {
    walk(y);
  }
}
std::int64_t reduced_count(const Shape& xs, const Shape& axes) {
  std::int64_t c = 1;
  for (auto a : axes) c *= xs[static_cast<int>(a)];
  return c;
}
// dy (reduced shape) -> broadcast back to x's shape
Var expand_back(const Var& dy, const Var& x, const Shape& axes) {
  const Shape xs = x.shape();  // a copy: reshape() below may reallocate the graph's nodes
  return broadcast_to(reshape(dy, keepdim_shape(xs, axes)), xs);
}

// ---- per-axis layout: (outer, len, inner) ----
using Rows = kernels::AxisSplit;
Rows rows_of(const Shape& s, std::int64_t axis) { return kernels::split_at(s, axis); }
Meta infer_axis_same(const InferArgs& a) {
  check_float_same(a);
  if (a[0].shape.rank() == 0) fail_shapes(a, "needs rank >= 1");
  return a[0];
}
// Calls f(x_row, stride, len, out_index) for every row along the axis.
AD_CUDA_ONLY(cuda_k::RowGeom geom(const Rows& r) { return {r.outer, r.len, r.inner}; })
template <class F> void for_rows(const Rows& r, F f) {
  for (std::int64_t o = 0; o < r.outer; ++o)
    for (std::int64_t i = 0; i < r.inner; ++i) f(o * r.len * r.inner + i, r.inner, o * r.inner + i);
}
}  // namespace

// ---- sum ----  over axes; d/dx = broadcast of dy
void sum_cpu(const KernelArgs& k) {
  kernels::dispatch_float(k.out.dtype(), "sum", [&](auto t) {
    using T = decltype(t);
    reduce_into(k[0].data<T>(), k[0].shape(), k.attrs.axes, k.out.data<T>(), 0.0, [](double a, double v) { return a + v; },
                static_cast<double*>(k.workspace));
  });
}
AD_CUDA_ONLY(void sum_cuda(const KernelArgs& k) {
  cuda_k::reduce_sum(k.out.dtype(), k[0].raw(), k[0].shape(), keepdim_shape(k[0].shape(), k.attrs.axes), k.out.raw(), 1.0,
                     k.workspace);
})
void sum_bwd(BackwardArgs& a) { a.grad[0] = expand_back(a.dout, a.in[0], a.attrs.axes); }
// On a GPU, few outputs over many terms sum in parts: f64 partials
// (ops/sum_layout.hpp). On the CPU an f32 sum over other than the last axes
// adds into one double per output (in f32, 2^24 + 1 would be 2^24).
std::int64_t sum_ws(const InferArgs& a, const Meta& out) {
  if (a[0].device.kind != DeviceKind::cuda)
    return a[0].dtype == DType::f32 && !suffix_axes(a[0].shape, a.attrs.axes) ? out.shape.numel() * 8 : 0;
  return sumlayout::layout(a[0].shape, keepdim_shape(a[0].shape, a.attrs.axes)).ws_bytes();
}
const OpDef op_def_sum{.name = "sum", .args = "x", .arity = 1, .infer = infer_reduce, .cpu = sum_cpu, .cuda = AD_CUDA_FN(sum_cuda), .backward = sum_bwd,
                       .workspace = sum_ws};
Var sum(const Operand& x, const Shape& axes, bool keepdim) {
  return make_node(OpId::sum, {x}, reduce_attrs("sum", x, axes, keepdim));
}

// ---- mean ----  sum / n; d/dx = dy / n
void mean_cpu(const KernelArgs& k) {
  double c = static_cast<double>(reduced_count(k[0].shape(), k.attrs.axes));
  kernels::dispatch_float(k.out.dtype(), "mean", [&](auto t) {
    using T = decltype(t);
    T* y = k.out.data<T>();
    reduce_into(k[0].data<T>(), k[0].shape(), k.attrs.axes, y, 0.0, [](double a, double v) { return a + v; },
                static_cast<double*>(k.workspace));
    for (std::int64_t i = 0; i < k.out.numel(); ++i) y[i] = static_cast<T>(static_cast<double>(y[i]) / c);
  });
}
AD_CUDA_ONLY(void mean_cuda(const KernelArgs& k) {
  double c = static_cast<double>(reduced_count(k[0].shape(), k.attrs.axes));
  cuda_k::reduce_sum(k.out.dtype(), k[0].raw(), k[0].shape(), keepdim_shape(k[0].shape(), k.attrs.axes), k.out.raw(),
                     1.0 / c, k.workspace);
})
void mean_bwd(BackwardArgs& a) {
  double c = static_cast<double>(reduced_count(a.in[0].shape(), a.attrs.axes));
  a.grad[0] = mul_scalar(expand_back(a.dout, a.in[0], a.attrs.axes), 1.0 / c);
}
// A mean over no elements has no value (0/0): thrown at build time, like the
// mean reductions of mse and cross_entropy, rather than a silent NaN.
Meta infer_mean(const InferArgs& a) {
  Meta m = infer_reduce(a);
  for (auto ax : a.attrs.axes)
    if (a[0].shape[static_cast<int>(ax)] == 0) fail_shapes(a, fmt::format("mean over empty axis {}", ax));
  return m;
}
const OpDef op_def_mean{.name = "mean", .args = "x", .arity = 1, .infer = infer_mean, .cpu = mean_cpu, .cuda = AD_CUDA_FN(mean_cuda),
                        .backward = mean_bwd, .workspace = sum_ws};
Var mean(const Operand& x, const Shape& axes, bool keepdim) {
  return make_node(OpId::mean, {x}, reduce_attrs("mean", x, axes, keepdim));
}

// ---- max ----  over axes (NaN propagates); gradient to the first maximal element; saves input and output
Meta infer_max(const InferArgs& a) {
  Meta m = infer_reduce(a);
  for (auto ax : a.attrs.axes)
    if (a[0].shape[static_cast<int>(ax)] == 0) fail_shapes(a, fmt::format("max over empty axis {}", ax));
  return m;
}
void max_cpu(const KernelArgs& k) {
  kernels::dispatch_float(k.out.dtype(), "max", [&](auto t) {
    using T = decltype(t);
    reduce_into(k[0].data<T>(), k[0].shape(), k.attrs.axes, k.out.data<T>(), -std::numeric_limits<double>::infinity(),
                [](double a, double v) { return (v > a || v != v) ? v : a; });
  });
}
AD_CUDA_ONLY(void max_cuda(const KernelArgs& k) {
  cuda_k::reduce_max(k.out.dtype(), k[0].raw(), k[0].shape(), keepdim_shape(k[0].shape(), k.attrs.axes), k.out.raw());
})
// The backward finds each group's maximum again from the x it reads rather
// than taking the forward's y: x may reach it rounded (an activation stored
// compressed) or recomputed while y was not, and no element of a rounded x
// equals an exact y (every gradient of the max was zero).
void max_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::max_backward, {a.in[0], a.dout}, a.attrs); }
const OpDef op_def_max{.name = "max", .args = "x", .arity = 1, .infer = infer_max, .cpu = max_cpu,
                       .cuda = AD_CUDA_FN(max_cuda), .backward = max_bwd, .saves = saves_input(0)};
Var max(const Operand& x, const Shape& axes, bool keepdim) {
  return make_node(OpId::max, {x}, reduce_attrs("max", x, axes, keepdim));
}
// ---- max_backward ----  (x, dy) -> dx: dy at the first element of each group
// equal to the group's maximum (max's scan: the first NaN where the group has
// one), else 0. Workspace (CPU): each group's maximum (a double) and a flag
// ("already given"); the CUDA kernel needs none.
Meta infer_max_backward(const InferArgs& a) {
  check_float_same(a);
  if (a[1].shape.numel() != keepdim_shape(a[0].shape, a.attrs.axes).numel())
    fail_shapes(a, "dy does not have one element per group of x");
  return a[0];
}
std::int64_t max_backward_ws(const InferArgs& a, const Meta&) {
  return a[0].device.kind == DeviceKind::cuda ? 0 : a[1].shape.numel() * static_cast<std::int64_t>(sizeof(double) + 1);
}
void max_backward_cpu(const KernelArgs& k) {
  kernels::dispatch_float(k.out.dtype(), "max_backward", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    const T* dy = k[1].data<T>();
    T* dx = k.out.data<T>();
    const Shape& xs = k[0].shape();
    std::int64_t n = xs.numel();
    if (n == 0) return;  // (no workspace then)
    const std::int64_t ny = k[1].numel();
    auto* y = static_cast<double*>(k.workspace);
    auto* given = reinterpret_cast<unsigned char*>(y + ny);
    std::fill(y, y + ny, -std::numeric_limits<double>::infinity());
    std::memset(given, 0, static_cast<std::size_t>(ny));
    const Shape ks = keepdim_shape(xs, k.attrs.axes);
    for_each_reduced(xs, ks, [&](std::int64_t i, std::int64_t o) {  // max's own scan
      const auto v = static_cast<double>(x[i]);
      if (v > y[o] || v != v) y[o] = v;
    });
    for_each_reduced(xs, ks, [&](std::int64_t i, std::int64_t o) {
      const auto v = static_cast<double>(x[i]);
      bool hit = !given[o] && (v == y[o] || (v != v && y[o] != y[o]));
      dx[i] = hit ? dy[o] : T(0);
      if (hit) given[o] = 1;
    });
  });
}
AD_CUDA_ONLY(void max_backward_cuda(const KernelArgs& k) {
  cuda_k::max_backward(k.out.dtype(), k[0].raw(), k[0].shape(), keepdim_shape(k[0].shape(), k.attrs.axes), k[1].raw(),
                       k.out.raw());
})
const OpDef op_def_max_backward{.name = "max_backward", .args = "x,dy", .arity = 2, .infer = infer_max_backward,
                                .cpu = max_backward_cpu, .cuda = AD_CUDA_FN(max_backward_cuda),
                                .no_grad = "double backward is not supported",
                                .workspace = max_backward_ws};

// ---- logsumexp ----  over one axis; all -inf row -> -inf; saves input and output
Meta infer_logsumexp(const InferArgs& a) {
  Meta m = infer_axis_same(a);
  if (a.attrs.keepdim) m.shape[static_cast<int>(a.attrs.axis)] = 1;
  else {
    Shape s;
    for (int i = 0; i < m.shape.rank(); ++i) if (i != a.attrs.axis) s.push_back(m.shape[i]);
    m.shape = s;
  }
  return m;
}
void logsumexp_cpu(const KernelArgs& k) {
  Rows r = rows_of(k[0].shape(), k.attrs.axis);
  kernels::dispatch_float(k.out.dtype(), "logsumexp", [&](auto t) {
    using T = decltype(t);
    for_rows(r, rows::Logsumexp<T>{k[0].data<T>(), k.out.data<T>(), r.len});
  });
}
AD_CUDA_ONLY(void logsumexp_cuda(const KernelArgs& k) {
  cuda_k::for_rows(k.out.dtype(), geom(rows_of(k[0].shape(), k.attrs.axis)), rows::Op::logsumexp, {k[0].raw()}, k.out.raw());
})
void logsumexp_bwd(BackwardArgs& a) {
  a.grad[0] = make_node(OpId::logsumexp_backward, {a.in[0], a.out, a.dout}, a.attrs);
}
const OpDef op_def_logsumexp{.name = "logsumexp", .args = "x", .arity = 1, .infer = infer_logsumexp,
                             .cpu = logsumexp_cpu, .cuda = AD_CUDA_FN(logsumexp_cuda), .backward = logsumexp_bwd, .saves = saves_input(0) | kSavesOutput};
Var logsumexp(const Operand& x, int axis, bool keepdim) {
  Shape s = operand_shape("logsumexp", x);
  Attrs at;
  at.axis = norm_axis("logsumexp", axis, s);
  at.keepdim = keepdim;
  return make_node(OpId::logsumexp, {x}, at);
}
// ---- logsumexp_backward ----  (x, y, dy) -> dy exp(x - y); 0 where y = -inf
Meta infer_logsumexp_backward(const InferArgs& a) { check_float_same(a); return a[0]; }
void logsumexp_backward_cpu(const KernelArgs& k) {
  Rows r = rows_of(k[0].shape(), k.attrs.axis);
  kernels::dispatch_float(k.out.dtype(), "logsumexp_backward", [&](auto t) {
    using T = decltype(t);
    for_rows(r, rows::LogsumexpBackward<T>{k[0].data<T>(), k[1].data<T>(), k[2].data<T>(), k.out.data<T>(), r.len});
  });
}
AD_CUDA_ONLY(void logsumexp_backward_cuda(const KernelArgs& k) {
  cuda_k::for_rows(k.out.dtype(), geom(rows_of(k[0].shape(), k.attrs.axis)), rows::Op::logsumexp_backward,
                   {k[0].raw(), k[1].raw(), k[2].raw()}, k.out.raw());
})
// double backward of z = dy exp(x - y) along the axis (y free; z = 0 where y = -inf): d/dx = g z,
// d/dy = -sum(g z), d/d(dy) = sum(g e) with e the op at dy = 1 (its -inf guard included); sums over the
// axis, kept or not as logsumexp kept it
void logsumexp_backward_bwd(BackwardArgs& a) {
  const Var &x = a.in[0], &y = a.in[1], &dy = a.in[2], &g = a.dout;
  const Shape ax{a.attrs.axis};
  const Var gz = mul(g, a.out);
  if (a.needs[0]) a.grad[0] = gz;
  if (a.needs[1]) a.grad[1] = neg(sum(gz, ax, a.attrs.keepdim));
  if (a.needs[2])
    a.grad[2] = sum(mul(g, make_node(OpId::logsumexp_backward, {x, y, ones_like(dy)}, a.attrs)), ax, a.attrs.keepdim);
}
const OpDef op_def_logsumexp_backward{.name = "logsumexp_backward", .args = "x,y,dy", .arity = 3,
                                      .infer = infer_logsumexp_backward, .cpu = logsumexp_backward_cpu, .cuda = AD_CUDA_FN(logsumexp_backward_cuda),
                                      .backward = logsumexp_backward_bwd};

// ---- softmax ----  exp(x - lse) along axis; all -inf row -> 0; saves output
void softmax_cpu(const KernelArgs& k) {
  Rows r = rows_of(k[0].shape(), k.attrs.axis);
  kernels::dispatch_float(k.out.dtype(), "softmax", [&](auto t) {
    using T = decltype(t);
    for_rows(r, rows::Softmax<T>{k[0].data<T>(), k.out.data<T>(), r.len});
  });
}
AD_CUDA_ONLY(void softmax_cuda(const KernelArgs& k) {
  cuda_k::for_rows(k.out.dtype(), geom(rows_of(k[0].shape(), k.attrs.axis)), rows::Op::softmax, {k[0].raw()}, k.out.raw());
})
void softmax_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::softmax_backward, {a.out, a.dout}, a.attrs); }
const OpDef op_def_softmax{.name = "softmax", .args = "x", .arity = 1, .infer = infer_axis_same, .cpu = softmax_cpu, .cuda = AD_CUDA_FN(softmax_cuda),
                           .backward = softmax_bwd, .saves = kSavesOutput};
Var softmax(const Operand& x, int axis) {
  Shape s = operand_shape("softmax", x);
  Attrs at;
  at.axis = norm_axis("softmax", axis, s);
  return make_node(OpId::softmax, {x}, at);
}
// ---- softmax_backward ----  (y, dy) -> y (dy - sum(dy y)) along axis
Meta infer_softmax_backward(const InferArgs& a) {
  check_float_same(a);
  if (!(a[0].shape == a[1].shape)) fail_shapes(a, "shapes differ");
  return a[0];
}
void softmax_backward_cpu(const KernelArgs& k) {
  Rows r = rows_of(k[0].shape(), k.attrs.axis);
  kernels::dispatch_float(k.out.dtype(), "softmax_backward", [&](auto t) {
    using T = decltype(t);
    for_rows(r, rows::SoftmaxBackward<T>{k[0].data<T>(), k[1].data<T>(), k.out.data<T>(), r.len});
  });
}
AD_CUDA_ONLY(void softmax_backward_cuda(const KernelArgs& k) {
  cuda_k::for_rows(k.out.dtype(), geom(rows_of(k[0].shape(), k.attrs.axis)), rows::Op::softmax_backward, {k[0].raw(), k[1].raw()}, k.out.raw());
})
// double backward, for g = d/dz of z = y (dy - s), s = sum(dy y) along the axis (y taken as a free input;
// its gradient flows on through softmax's own backward): d/d(dy) = softmax_backward(y, g),
// d/dy = g (dy - s) - dy sum(g y)
void softmax_backward_bwd(BackwardArgs& a) {
  const Var &y = a.in[0], &dy = a.in[1], &g = a.dout;
  const Shape ax{a.attrs.axis};
  if (a.needs[1]) a.grad[1] = make_node(OpId::softmax_backward, {y, g}, a.attrs);
  if (a.needs[0]) a.grad[0] = sub(mul(g, sub(dy, sum(mul(dy, y), ax, true))), mul(dy, sum(mul(g, y), ax, true)));
}
const OpDef op_def_softmax_backward{.name = "softmax_backward", .args = "y,dy", .arity = 2,
                                    .infer = infer_softmax_backward, .cpu = softmax_backward_cpu, .cuda = AD_CUDA_FN(softmax_backward_cuda),
                                    .backward = softmax_backward_bwd};

// ---- log_softmax ----  x - lse along axis; all -inf row -> -inf; saves output
void log_softmax_cpu(const KernelArgs& k) {
  Rows r = rows_of(k[0].shape(), k.attrs.axis);
  kernels::dispatch_float(k.out.dtype(), "log_softmax", [&](auto t) {
    using T = decltype(t);
    for_rows(r, rows::LogSoftmax<T>{k[0].data<T>(), k.out.data<T>(), r.len});
  });
}
AD_CUDA_ONLY(void log_softmax_cuda(const KernelArgs& k) {
  cuda_k::for_rows(k.out.dtype(), geom(rows_of(k[0].shape(), k.attrs.axis)), rows::Op::log_softmax, {k[0].raw()}, k.out.raw());
})
void log_softmax_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::log_softmax_backward, {a.out, a.dout}, a.attrs); }
const OpDef op_def_log_softmax{.name = "log_softmax", .args = "x", .arity = 1, .infer = infer_axis_same,
                               .cpu = log_softmax_cpu, .cuda = AD_CUDA_FN(log_softmax_cuda), .backward = log_softmax_bwd, .saves = kSavesOutput};
Var log_softmax(const Operand& x, int axis) {
  Shape s = operand_shape("log_softmax", x);
  Attrs at;
  at.axis = norm_axis("log_softmax", axis, s);
  return make_node(OpId::log_softmax, {x}, at);
}
// ---- log_softmax_backward ----  (y, dy) -> dy - exp(y) sum(dy); 0 on an all -inf row
void log_softmax_backward_cpu(const KernelArgs& k) {
  Rows r = rows_of(k[0].shape(), k.attrs.axis);
  kernels::dispatch_float(k.out.dtype(), "log_softmax_backward", [&](auto t) {
    using T = decltype(t);
    for_rows(r, rows::LogSoftmaxBackward<T>{k[0].data<T>(), k[1].data<T>(), k.out.data<T>(), r.len});
  });
}
AD_CUDA_ONLY(void log_softmax_backward_cuda(const KernelArgs& k) {
  cuda_k::for_rows(k.out.dtype(), geom(rows_of(k[0].shape(), k.attrs.axis)), rows::Op::log_softmax_backward, {k[0].raw(), k[1].raw()}, k.out.raw());
})
// double backward of z = dy - e sum(dy), e = exp(y) along the axis (z = 0 on a row of y all -inf, where
// e is all 0): d/d(dy) = g - sum(g e), 0 on such a row (the kernel's test: every y == -inf, so a NaN keeps
// a row live); d/dy = -g e sum(dy)
void log_softmax_backward_bwd(BackwardArgs& a) {
  const Var &y = a.in[0], &dy = a.in[1], &g = a.dout;
  const Shape ax{a.attrs.axis};
  const Var e = exp(y);
  const Var live = sum(not_equal(y, -std::numeric_limits<double>::infinity()), ax, true);  // 0: a dead row
  if (a.needs[1]) a.grad[1] = where(live, sub(g, sum(mul(g, e), ax, true)), 0.0);
  if (a.needs[0]) a.grad[0] = neg(mul(mul(g, e), sum(dy, ax, true)));
}
const OpDef op_def_log_softmax_backward{.name = "log_softmax_backward", .args = "y,dy", .arity = 2,
                                        .infer = infer_softmax_backward, .cpu = log_softmax_backward_cpu, .cuda = AD_CUDA_FN(log_softmax_backward_cuda),
                                        .backward = log_softmax_backward_bwd};

}  // namespace ad
