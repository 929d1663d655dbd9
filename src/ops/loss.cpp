// Losses: cross_entropy with integer labels (fused with its softmax) and mse.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/loss_math.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
void check_labels(const char* op, const std::int64_t* y, std::int64_t rows, std::int64_t c) {
  for (std::int64_t r = 0; r < rows; ++r)
    if (y[r] < 0 || y[r] >= c)
      kernel_fail(op, fmt::format("label {} at position {} out of range [0, {})", y[r], r, c));
}
// Labels on a GPU: a check kernel finds the first bad one (this waits for the
// device), thrown with the CPU's message.
AD_CUDA_ONLY(void check_labels_cuda(const char* op, const std::int64_t* y, std::int64_t rows, std::int64_t c) {
  std::int64_t bad = 0;
  if (std::int64_t r = cuda_k::first_bad_index(y, rows, c, &bad); r >= 0)
    kernel_fail(op, fmt::format("label {} at position {} out of range [0, {})", bad, r, c));
})
bool on_gpu(const InferArgs& a) { return a[0].device.kind == DeviceKind::cuda; }
// mse's partial sums on a GPU: one per block of 4096 elements, at most 1024
// (a fixed function of n, so the sum's order is too)
std::int64_t mse_parts(std::int64_t n) { return std::clamp<std::int64_t>((n + 4095) / 4096, 1, 1024); }
}  // namespace

// ---- cross_entropy ----  logits [..., C], labels i64 [...] -> []:
//   loss_r = lse(logits_r) - logits_r[label_r], mean or sum over rows; saves both inputs
Meta infer_cross_entropy(const InferArgs& a) {
  if (!is_compute_float(a[0].dtype)) fail_shapes(a, "logits must be f32 or f64");
  check_index(a, 1);
  const Shape &ls = a[0].shape, &ys = a[1].shape;
  if (ls.rank() < 1) fail_shapes(a, "logits need rank >= 1 ([..., C])");
  bool ok = ys.rank() == ls.rank() - 1;
  for (int i = 0; ok && i < ys.rank(); ++i) ok = ys[i] == ls[i];
  if (!ok) fail_shapes(a, "labels must have logits' shape without the last (class) dim");
  if (ls.back() == 0) fail_shapes(a, "no classes");
  if (a.attrs.reduction == Reduction::mean && ys.numel() == 0) fail_shapes(a, "mean over an empty batch");
  return Meta{Shape{}, a[0].dtype, a[0].device};
}
void cross_entropy_cpu(const KernelArgs& k) {
  std::int64_t c = k[0].shape().back(), rows = k[1].numel();
  const std::int64_t* y = k[1].data<std::int64_t>();
  check_labels("cross_entropy", y, rows, c);
  kernels::dispatch_float(k.out.dtype(), "cross_entropy", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    double total = 0;
    for (std::int64_t r = 0; r < rows; ++r) total += loss::cross_entropy_row(x + r * c, c, y[r]);
    if (k.attrs.reduction == Reduction::mean) total /= static_cast<double>(rows);
    k.out.data<T>()[0] = static_cast<T>(total);
  });
}
AD_CUDA_ONLY(void cross_entropy_cuda(const KernelArgs& k) {
  std::int64_t c = k[0].shape().back(), rows = k[1].numel();
  const std::int64_t* y = k[1].data<std::int64_t>();
  check_labels_cuda("cross_entropy", y, rows, c);
  double divisor = k.attrs.reduction == Reduction::mean ? static_cast<double>(rows) : 1.0;
  cuda_k::cross_entropy(k.out.dtype(), k[0].raw(), y, rows, c, divisor, static_cast<double*>(k.workspace), k.out.raw());
})
// Workspace on a GPU: one f64 loss per row, summed in a fixed order afterwards.
std::int64_t cross_entropy_ws(const InferArgs& a, const Meta&) {
  return on_gpu(a) ? a[1].shape.numel() * static_cast<std::int64_t>(sizeof(double)) : 0;
}
void cross_entropy_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = make_node(OpId::cross_entropy_backward, {a.in[0], a.in[1], a.dout}, a.attrs);
}
const OpDef op_def_cross_entropy{.name = "cross_entropy", .args = "logits,labels", .arity = 2,
                                 .infer = infer_cross_entropy, .cpu = cross_entropy_cpu,
                                 .cuda = AD_CUDA_FN(cross_entropy_cuda), .backward = cross_entropy_bwd,
                                 .saves = saves_input(0) | saves_input(1), .workspace = cross_entropy_ws};
Var cross_entropy(const Operand& logits, const Operand& labels, Reduction reduction) {
  Attrs at;
  at.reduction = reduction;
  return make_node(OpId::cross_entropy, {logits, labels}, at);
}
// ---- cross_entropy_backward ----  (logits, labels, dy) -> (softmax(logits) - onehot(labels)) dy [/ rows]
Meta infer_cross_entropy_backward(const InferArgs& a) { return a[0]; }
void cross_entropy_backward_cpu(const KernelArgs& k) {
  std::int64_t c = k[0].shape().back(), rows = k[1].numel();
  const std::int64_t* y = k[1].data<std::int64_t>();
  check_labels("cross_entropy_backward", y, rows, c);
  kernels::dispatch_float(k.out.dtype(), "cross_entropy_backward", [&](auto t) {
    using T = decltype(t);
    loss::CrossEntropyDx<T> f{k[0].data<T>(), y, k[2].data<T>(), k.out.data<T>(), c, rows,
                              k.attrs.reduction == Reduction::mean};
    for (std::int64_t r = 0; r < rows; ++r) f(r);
  });
}
AD_CUDA_ONLY(void cross_entropy_backward_cuda(const KernelArgs& k) {
  std::int64_t c = k[0].shape().back(), rows = k[1].numel();
  const std::int64_t* y = k[1].data<std::int64_t>();
  check_labels_cuda("cross_entropy_backward", y, rows, c);
  cuda_k::cross_entropy_backward(k.out.dtype(), k[0].raw(), y, k[2].raw(), k.out.raw(), rows, c,
                                 k.attrs.reduction == Reduction::mean);
})
// double backward of z = (softmax(logits) - onehot(labels)) dy [/ rows] (dy a scalar): d/dlogits =
// softmax_backward(softmax(logits), g dy [/ rows]) along the class axis; d/d(dy) = sum(g z) at dy = 1.
// The labels are integers: no gradient.
void cross_entropy_backward_bwd(BackwardArgs& a) {
  const Var &logits = a.in[0], &labels = a.in[1], &dy = a.in[2], &g = a.dout;
  if (a.needs[0]) {
    Var w = mul(g, dy);
    if (a.attrs.reduction == Reduction::mean) w = div_scalar(w, static_cast<double>(labels.shape().numel()));
    Attrs at;
    at.axis = logits.shape().rank() - 1;
    a.grad[0] = make_node(OpId::softmax_backward, {softmax(logits, -1), w}, at);
  }
  if (a.needs[2])
    a.grad[2] = sum(mul(g, make_node(OpId::cross_entropy_backward,
                                     {logits, labels, full(dy, Shape{}, 1.0, dy.dtype())}, a.attrs)));
}
const OpDef op_def_cross_entropy_backward{.name = "cross_entropy_backward", .args = "logits,labels,dy", .arity = 3,
                                          .infer = infer_cross_entropy_backward,
                                          .cpu = cross_entropy_backward_cpu,
                                          .cuda = AD_CUDA_FN(cross_entropy_backward_cuda),
                                          .backward = cross_entropy_backward_bwd};

// ---- mse ----  mean or sum of (a - b)^2 -> []; d/da = 2 (a - b) dy [/ n]; saves both inputs
Meta infer_mse(const InferArgs& a) {
  check_float_same(a);
  if (!(a[0].shape == a[1].shape)) fail_shapes(a, "shapes differ");
  if (a.attrs.reduction == Reduction::mean && a[0].shape.numel() == 0) fail_shapes(a, "mean over no elements");
  return Meta{Shape{}, a[0].dtype, a[0].device};
}
void mse_cpu(const KernelArgs& k) {
  std::int64_t n = k[0].numel();
  kernels::dispatch_float(k.out.dtype(), "mse", [&](auto t) {
    using T = decltype(t);
    const T *a = k[0].data<T>(), *b = k[1].data<T>();
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += loss::squared_diff(a[i], b[i]);
    if (k.attrs.reduction == Reduction::mean) s /= static_cast<double>(n);
    k.out.data<T>()[0] = static_cast<T>(s);
  });
}
AD_CUDA_ONLY(void mse_cuda(const KernelArgs& k) {
  std::int64_t n = k[0].numel();
  double divisor = k.attrs.reduction == Reduction::mean ? static_cast<double>(n) : 1.0;
  cuda_k::mse(k.out.dtype(), k[0].raw(), k[1].raw(), n, divisor, static_cast<double*>(k.workspace), mse_parts(n),
              k.out.raw());
})
std::int64_t mse_ws(const InferArgs& a, const Meta&) {
  return on_gpu(a) ? mse_parts(a[0].shape.numel()) * static_cast<std::int64_t>(sizeof(double)) : 0;
}
void mse_bwd(BackwardArgs& a) {
  double f = a.attrs.reduction == Reduction::mean ? 2.0 / static_cast<double>(a.in[0].numel()) : 2.0;
  Var g = mul(mul_scalar(sub(a.in[0], a.in[1]), f), a.dout);
  if (a.needs[0]) a.grad[0] = g;
  if (a.needs[1]) a.grad[1] = neg(g);
}
const OpDef op_def_mse{.name = "mse", .args = "a,b", .arity = 2, .infer = infer_mse, .cpu = mse_cpu,
                       .cuda = AD_CUDA_FN(mse_cuda), .backward = mse_bwd, .saves = saves_input(0) | saves_input(1),
                       .workspace = mse_ws};
Var mse(const Operand& a, const Operand& b, Reduction reduction) {
  Attrs at;
  at.reduction = reduction;
  return make_node(OpId::mse, {a, b}, at);
}

}  // namespace ad
