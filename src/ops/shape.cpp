// Shape ops: reshape (a view), permute, broadcasting and its inverse, slices,
// concatenation and gathers.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/pointwise.hpp"
#include "ops/sum_layout.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
using kernels::AxisSplit;
using kernels::split_at;
Meta infer_float_or_index(const InferArgs& a) {
  if (a[0].dtype == DType::f16 || a[0].dtype == DType::bf16)
    fail_shapes(a, "f16/bf16 are storage types; cast to f32 first");
  return a[0];
}
}  // namespace

// ---- reshape ----  same elements, new shape (one -1 inferred); a view of x
Meta infer_reshape(const InferArgs& a) {
  Shape s = a.attrs.shape;
  int infer_at = -1;
  std::int64_t known = 1;
  for (int i = 0; i < s.rank(); ++i) {
    if (s[i] == -1) {
      if (infer_at >= 0) fail_shapes(a, fmt::format("more than one -1 in target shape {}", s.str()));
      infer_at = i;
    } else if (s[i] < 0) {
      fail_shapes(a, fmt::format("negative dim in target shape {}", s.str()));
    } else if (__builtin_mul_overflow(known, s[i], &known)) {
      fail_shapes(a, fmt::format("target shape {} has more elements than a 64-bit count holds", s.str()));
    }
  }
  std::int64_t n = a[0].shape.numel();
  if (infer_at >= 0) {
    if (known == 0 || n % known != 0) fail_shapes(a, fmt::format("cannot reshape to {}", s.str()));
    s[infer_at] = n / known;
  }
  if (s.numel() != n) fail_shapes(a, fmt::format("cannot reshape to {} ({} elements)", s.str(), s.numel()));
  return Meta{s, a[0].dtype, a[0].device};
}
void reshape_cpu(const KernelArgs& k) { k.out = k[0].reshape(k.out_meta.shape); }
// a view: the same code on every device
AD_CUDA_ONLY(void reshape_cuda(const KernelArgs& k) { reshape_cpu(k); })
void reshape_bwd(BackwardArgs& a) { a.grad[0] = reshape(a.dout, a.in[0].shape()); }
const OpDef op_def_reshape{.name = "reshape", .args = "x", .arity = 1, .infer = infer_reshape, .cpu = reshape_cpu, .cuda = AD_CUDA_FN(reshape_cuda),
                           .backward = reshape_bwd, .flops = [](const InferArgs&, const Meta&) { return 0.0; },
                           .view = true};
Var reshape(const Operand& x, const Shape& shape) {
  Attrs at;
  at.shape = shape;
  Var v = make_node(OpId::reshape, {x}, at);
  return v;
}

// ---- detach ----  x itself (a view of any dtype), through which no gradient flows
Meta infer_detach(const InferArgs& a) { return a[0]; }
void detach_cpu(const KernelArgs& k) { k.out = k[0]; }
AD_CUDA_ONLY(void detach_cuda(const KernelArgs& k) { detach_cpu(k); })
const OpDef op_def_detach{.name = "detach", .args = "x", .arity = 1, .infer = infer_detach, .cpu = detach_cpu,
                          .cuda = AD_CUDA_FN(detach_cuda), .no_grad = "detach stops the gradient by design",
                          .flops = [](const InferArgs&, const Meta&) { return 0.0; }, .view = true,
                          .stops_gradient = true};
Var detach(const Operand& x) { return make_node(OpId::detach, {x}); }

// ---- permute ----  out.shape[i] = x.shape[perm[i]]
Meta infer_permute(const InferArgs& a) {
  const Shape& p = a.attrs.axes;
  int r = a[0].shape.rank();
  if (p.rank() != r) fail_shapes(a, fmt::format("permutation {} has the wrong length", p.str()));
  bool seen[kMaxRank] = {};
  Meta m = a[0];
  for (int i = 0; i < r; ++i) {
    if (p[i] < 0 || p[i] >= r || seen[p[i]]) fail_shapes(a, fmt::format("{} is not a permutation", p.str()));
    seen[p[i]] = true;
    m.shape[i] = a[0].shape[static_cast<int>(p[i])];
  }
  return m;
}
template <class T> void permute_impl(const T* x, const Shape& xs, const Shape& perm, T* y, const Shape& ys) {
  int r = ys.rank();
  std::int64_t n = ys.numel();
  if (n == 0) return;
  if (r == 0) { y[0] = x[0]; return; }
  std::int64_t xst[kMaxRank], st[kMaxRank];
  kernels::contiguous_strides(xs, xst);
  for (int i = 0; i < r; ++i) st[i] = xst[perm[i]];
  std::int64_t inner = ys[r - 1], is = st[r - 1];
  std::int64_t idx[kMaxRank] = {0};
  std::int64_t off = 0;
  for (std::int64_t o = 0; o < n / inner; ++o) {
    T* yo = y + o * inner;
    for (std::int64_t i = 0; i < inner; ++i) yo[i] = x[off + i * is];
    for (int k = r - 2; k >= 0; --k) {
      if (++idx[k] < ys[k]) { off += st[k]; break; }
      off -= st[k] * (ys[k] - 1);
      idx[k] = 0;
    }
  }
}
void permute_cpu(const KernelArgs& k) {  // moves elements by their size, so every dtype runs (as on the GPU)
  auto run = [&](auto t) {
    using U = decltype(t);
    permute_impl(static_cast<const U*>(k[0].raw()), k[0].shape(), k.attrs.axes, static_cast<U*>(k.out.raw()),
                 k.out.shape());
  };
  switch (dtype_size(k.out.dtype())) {
    case 2: run(std::uint16_t{}); break;
    case 4: run(std::uint32_t{}); break;
    case 8: run(std::uint64_t{}); break;
    default: kernel_fail("permute", fmt::format("no CPU kernel for dtype {}", dtype_name(k.out.dtype())));
  }
}
AD_CUDA_ONLY(void permute_cuda(const KernelArgs& k) {
  cuda_k::permute(dtype_size(k.out.dtype()), k[0].raw(), k[0].shape(), k.attrs.axes, k.out.raw(), k.out.shape());
})
void permute_bwd(BackwardArgs& a) {
  Shape inv = a.attrs.axes;
  for (int i = 0; i < inv.rank(); ++i) inv[static_cast<int>(a.attrs.axes[i])] = i;
  a.grad[0] = permute(a.dout, inv);
}
const OpDef op_def_permute{.name = "permute", .args = "x", .arity = 1, .infer = infer_permute, .cpu = permute_cpu,
                           .cuda = AD_CUDA_FN(permute_cuda), .backward = permute_bwd};
Var permute(const Operand& x, const Shape& perm) {
  Attrs at;
  at.axes = perm;
  return make_node(OpId::permute, {x}, at);
}
Var transpose(const Operand& x, int dim0, int dim1) {
  // resolve the rank through a node-free peek: the operand's shape
  Shape s = operand_shape("transpose", x);
  int r = s.rank();
  auto d0 = norm_axis("transpose", dim0, s), d1 = norm_axis("transpose", dim1, s);
  Shape perm;
  for (int i = 0; i < r; ++i) perm.push_back(i);
  std::swap(perm[static_cast<int>(d0)], perm[static_cast<int>(d1)]);
  return permute(x, perm);
}

// ---- broadcast_to ----  numpy broadcast of x to attrs.shape
Meta infer_broadcast_to(const InferArgs& a) {
  check_float_same(a);
  Shape out;
  bool negative = false;
  for (auto d : a.attrs.shape) negative |= d < 0;
  if (negative || !broadcast_shapes(a[0].shape, a.attrs.shape, out) || !(out == a.attrs.shape))
    fail_shapes(a, fmt::format("cannot broadcast to {}", a.attrs.shape.str()));
  return Meta{a.attrs.shape, a[0].dtype, a[0].device};
}
void broadcast_to_cpu(const KernelArgs& k) {
  kernels::dispatch_float(k.out.dtype(), "broadcast_to", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    kernels::broadcast2(x, k[0].shape(), x, k[0].shape(), k.out.data<T>(), k.out.shape(), [](T u, T) { return u; });
  });
}
AD_CUDA_ONLY(void broadcast_to_cuda(const KernelArgs& k) {
  cuda_k::broadcast2(k.out.dtype(), k[0].raw(), k[0].shape(), k[0].raw(), k[0].shape(), k.out.raw(), k.out.shape(),
                     pw::First{});
})
void broadcast_to_bwd(BackwardArgs& a) { a.grad[0] = sum_to(a.dout, a.in[0].shape()); }
const OpDef op_def_broadcast_to{.name = "broadcast_to", .args = "x", .arity = 1, .infer = infer_broadcast_to,
                                .cpu = broadcast_to_cpu, .cuda = AD_CUDA_FN(broadcast_to_cuda), .backward = broadcast_to_bwd};
Var broadcast_to(const Operand& x, const Shape& shape) {
  Attrs at;
  at.shape = shape;
  return make_node(OpId::broadcast_to, {x}, at);
}

// ---- sum_to ----  sums x down to attrs.shape (which must broadcast to x's shape)
Meta infer_sum_to(const InferArgs& a) {
  check_float_same(a);
  Shape out;
  if (a.attrs.shape.rank() > a[0].shape.rank() || !broadcast_shapes(a.attrs.shape, a[0].shape, out) ||
      !(out == a[0].shape))
    fail_shapes(a, fmt::format("cannot sum to {}", a.attrs.shape.str()));
  return Meta{a.attrs.shape, a[0].dtype, a[0].device};
}
void sum_to_cpu(const KernelArgs& k) {
  kernels::dispatch_float(k.out.dtype(), "sum_to", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    T* y = k.out.data<T>();
    const Shape& xs = k[0].shape();
    const std::int64_t n = xs.numel(), ny = k.out.numel();
    // sums in double: the workspace's one per output for f32, y itself for f64
    double* acc = std::is_same_v<T, double> ? reinterpret_cast<double*>(y) : static_cast<double*>(k.workspace);
    std::fill(acc, acc + ny, 0.0);
    int r = xs.rank();
    if (n > 0 && r == 0) acc[0] = static_cast<double>(x[0]);
    if (n > 0 && r > 0) {
      std::int64_t st[kMaxRank];
      kernels::broadcast_strides(k.out.shape(), xs, st);
      std::int64_t inner = xs[r - 1], is = st[r - 1];
      std::int64_t idx[kMaxRank] = {0};
      std::int64_t off = 0;
      for (std::int64_t o = 0; o < n / inner; ++o) {
        const T* xo = x + o * inner;
        if (is) for (std::int64_t i = 0; i < inner; ++i) acc[off + i] += static_cast<double>(xo[i]);
        else { double s = 0; for (std::int64_t i = 0; i < inner; ++i) s += static_cast<double>(xo[i]); acc[off] += s; }
        for (int q = r - 2; q >= 0; --q) {
          if (++idx[q] < xs[q]) { off += st[q]; break; }
          off -= st[q] * (xs[q] - 1);
          idx[q] = 0;
        }
      }
    }
    if constexpr (!std::is_same_v<T, double>)
      for (std::int64_t i = 0; i < ny; ++i) y[i] = static_cast<T>(acc[i]);
  });
}
// sum over the leading dims and the dims where the target has 1: x's shape with 1 at each summed axis
namespace {
Shape sum_to_keep(const Shape& xs, const Shape& target) {
  Shape keep;
  for (int i = 0; i < xs.rank() - target.rank(); ++i) keep.push_back(1);
  for (auto d : target) keep.push_back(d);
  return keep;
}
}  // namespace
AD_CUDA_ONLY(void sum_to_cuda(const KernelArgs& k) {
  cuda_k::reduce_sum(k.out.dtype(), k[0].raw(), k[0].shape(), sum_to_keep(k[0].shape(), k.out.shape()), k.out.raw(), 1.0,
                     k.workspace);
})
void sum_to_bwd(BackwardArgs& a) { a.grad[0] = broadcast_to(a.dout, a.in[0].shape()); }
// the GPU's f64 partials (ops/sum_layout.hpp); on the CPU, f32 sums add
// into one double per output
std::int64_t sum_to_ws(const InferArgs& a, const Meta& out) {
  if (a[0].device.kind != DeviceKind::cuda) return a[0].dtype == DType::f32 ? out.shape.numel() * 8 : 0;
  return sumlayout::layout(a[0].shape, sum_to_keep(a[0].shape, out.shape)).ws_bytes();
}
const OpDef op_def_sum_to{.name = "sum_to", .args = "x", .arity = 1, .infer = infer_sum_to, .cpu = sum_to_cpu, .cuda = AD_CUDA_FN(sum_to_cuda),
                          .backward = sum_to_bwd, .workspace = sum_to_ws};
Var sum_to(const Operand& x, const Shape& shape) {
  Attrs at;
  at.shape = shape;
  return make_node(OpId::sum_to, {x}, at);
}

// ---- slice ----  x[..., start:stop, ...] along axis
Meta infer_slice(const InferArgs& a) {
  infer_float_or_index(a);
  if (a[0].shape.rank() == 0) fail_shapes(a, "cannot slice a scalar");
  Meta m = a[0];
  m.shape[static_cast<int>(a.attrs.axis)] = a.attrs.stop - a.attrs.start;
  return m;
}
void slice_cpu(const KernelArgs& k) {
  AxisSplit s = split_at(k[0].shape(), k.attrs.axis);
  std::int64_t len = k.attrs.stop - k.attrs.start;
  auto es = dtype_size(k.out.dtype());
  auto* src = static_cast<const char*>(k[0].raw());
  auto* dst = static_cast<char*>(k.out.raw());
  for (std::int64_t o = 0; o < s.outer; ++o)
    std::memcpy(dst + static_cast<std::size_t>(o * len * s.inner) * es,
                src + static_cast<std::size_t>((o * s.len + k.attrs.start) * s.inner) * es,
                static_cast<std::size_t>(len * s.inner) * es);
}
AD_CUDA_ONLY(void slice_cuda(const KernelArgs& k) {
  AxisSplit s = split_at(k[0].shape(), k.attrs.axis);
  std::int64_t len = k.attrs.stop - k.attrs.start;
  cuda_k::copy_axis(dtype_size(k.out.dtype()), k[0].raw(), s.len, k.attrs.start, k.out.raw(), len, 0, s.outer, len,
                    s.inner);
})
void slice_bwd(BackwardArgs& a) {
  Attrs at = a.attrs;
  at.shape = a.in[0].shape();
  a.grad[0] = make_node(OpId::slice_backward, {a.dout}, at);
}
const OpDef op_def_slice{.name = "slice", .args = "x", .arity = 1, .infer = infer_slice, .cpu = slice_cpu,
                         .cuda = AD_CUDA_FN(slice_cuda), .backward = slice_bwd, .defer_in_grad = true};
Var slice(const Operand& x, int axis, std::int64_t start, std::int64_t stop) {
  Shape s = operand_shape("slice", x);
  if (s.rank() == 0) throw Error(fmt::format("slice: cannot slice a scalar {}", s.str()));
  auto ax = norm_axis("slice", axis, s);
  std::int64_t n = s[static_cast<int>(ax)];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  stop = std::min(stop, n);
  if (start < 0 || start > n || stop < start)
    throw Error(fmt::format("slice: range [{}, {}) invalid for dim {} of size {} in {}", start, stop, ax, n, s.str()));
  Attrs at;
  at.axis = ax;
  at.start = start;
  at.stop = stop;
  return make_node(OpId::slice, {x}, at);
}
// ---- slice_backward ----  dy -> zeros of attrs.shape with dy placed at [start, stop); linear, its gradient is slice
Meta infer_slice_backward(const InferArgs& a) {
  check_float_same(a);
  return Meta{a.attrs.shape, a[0].dtype, a[0].device};
}
void slice_backward_cpu(const KernelArgs& k) {
  std::memset(k.out.raw(), 0, k.out.nbytes());
  AxisSplit s = split_at(k.out.shape(), k.attrs.axis);
  std::int64_t len = k.attrs.stop - k.attrs.start;
  auto es = dtype_size(k.out.dtype());
  auto* src = static_cast<const char*>(k[0].raw());
  auto* dst = static_cast<char*>(k.out.raw());
  for (std::int64_t o = 0; o < s.outer; ++o)
    std::memcpy(dst + static_cast<std::size_t>((o * s.len + k.attrs.start) * s.inner) * es,
                src + static_cast<std::size_t>(o * len * s.inner) * es, static_cast<std::size_t>(len * s.inner) * es);
}
AD_CUDA_ONLY(void slice_backward_cuda(const KernelArgs& k) {
  cuda_k::zero(k.out.raw(), k.out.nbytes());
  AxisSplit s = split_at(k.out.shape(), k.attrs.axis);
  std::int64_t len = k.attrs.stop - k.attrs.start;
  cuda_k::copy_axis(dtype_size(k.out.dtype()), k[0].raw(), len, 0, k.out.raw(), s.len, k.attrs.start, s.outer, len,
                    s.inner);
})
void slice_backward_bwd(BackwardArgs& a) {
  a.grad[0] = slice(a.dout, static_cast<int>(a.attrs.axis), a.attrs.start, a.attrs.stop);
}
const OpDef op_def_slice_backward{.name = "slice_backward", .args = "dy", .arity = 1,
                                  .infer = infer_slice_backward, .cpu = slice_backward_cpu,
                                  .cuda = AD_CUDA_FN(slice_backward_cuda),
                                  .backward = slice_backward_bwd, .places_slice = true};

// ---- part ----  numel(shape) elements of x's flat order from element `start`,
// as a view: how an op with several outputs (or a backward op producing
// several gradients) returns them from one buffer without copies.
// Pure data movement: any dtype, f16/bf16 included (attention's half buffers).
Meta infer_part(const InferArgs& a) {
  for (auto d : a.attrs.shape)
    if (d < 0) fail_shapes(a, fmt::format("negative dimension in shape {}", a.attrs.shape.str()));
  const std::int64_t n = a[0].shape.numel();
  if (a.attrs.start < 0 || a.attrs.start > n || a.attrs.shape.numel() > n - a.attrs.start)
    fail_shapes(a, fmt::format("{} elements at offset {} do not fit", a.attrs.shape.str(), a.attrs.start));
  return Meta{a.attrs.shape, a[0].dtype, a[0].device};
}
void part_cpu(const KernelArgs& k) { k.out = k[0].view(k.attrs.start, k.out_meta.shape); }
AD_CUDA_ONLY(void part_cuda(const KernelArgs& k) { part_cpu(k); })  // a view
void part_bwd(BackwardArgs& a) {
  Attrs at;
  at.start = a.attrs.start;
  at.shape = a.in[0].shape();
  a.grad[0] = make_node(OpId::part_backward, {a.dout}, at);
}
const OpDef op_def_part{.name = "part", .args = "x", .arity = 1, .infer = infer_part, .cpu = part_cpu, .cuda = AD_CUDA_FN(part_cuda),
                        .backward = part_bwd, .flops = [](const InferArgs&, const Meta&) { return 0.0; },
                        .view = true};
Var part(const Operand& x, std::int64_t offset, const Shape& shape) {
  Attrs at;
  at.start = offset;
  at.shape = shape;
  return make_node(OpId::part, {x}, at);
}
// ---- part_backward ----  dy -> zeros of attrs.shape with dy's elements at flat offset start
Meta infer_part_backward(const InferArgs& a) {
  if (!is_floating(a[0].dtype)) fail_shapes(a, fmt::format("dy must be floating point, got {}", dtype_name(a[0].dtype)));
  if (a.attrs.start < 0 || a.attrs.start + a[0].shape.numel() > a.attrs.shape.numel())
    fail_shapes(a, fmt::format("does not fit in {} at offset {}", a.attrs.shape.str(), a.attrs.start));
  return Meta{a.attrs.shape, a[0].dtype, a[0].device};
}
void part_backward_cpu(const KernelArgs& k) {
  auto es = dtype_size(k.out.dtype());
  auto* dst = static_cast<char*>(k.out.raw());
  std::size_t at = static_cast<std::size_t>(k.attrs.start) * es, n = k[0].nbytes();
  std::memset(dst, 0, at);
  if (n) std::memcpy(dst + at, k[0].raw(), n);
  std::memset(dst + at + n, 0, k.out.nbytes() - at - n);
}
// the whole buffer zeroed, then dy copied in as one run (outer = inner = 1)
AD_CUDA_ONLY(void part_backward_cuda(const KernelArgs& k) {
  cuda_k::zero(k.out.raw(), k.out.nbytes());
  std::int64_t n = k[0].numel();
  cuda_k::copy_axis(dtype_size(k.out.dtype()), k[0].raw(), n, 0, k.out.raw(), k.out.numel(), k.attrs.start, 1, n, 1);
})
void part_backward_bwd(BackwardArgs& a) { a.grad[0] = part(a.dout, a.attrs.start, a.in[0].shape()); }
const OpDef op_def_part_backward{.name = "part_backward", .args = "dy", .arity = 1,
                                 .infer = infer_part_backward, .cpu = part_backward_cpu,
                                 .cuda = AD_CUDA_FN(part_backward_cuda),
                                 .backward = part_backward_bwd};

// ---- concat ----  joins along axis; other dims equal
Meta infer_concat(const InferArgs& a) {
  if (a[0].dtype != DType::i64) check_float_same(a);
  int r = a[0].shape.rank();
  if (r == 0) fail_shapes(a, "cannot concatenate scalars");
  auto axis = a.attrs.axis;
  Meta m = a[0];
  std::int64_t total = 0;
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    const Shape& s = a[i].shape;
    if (a[i].dtype != a[0].dtype) fail_shapes(a, "dtype mismatch");
    if (s.rank() != r) fail_shapes(a, "ranks differ");
    for (int d = 0; d < r; ++d)
      if (d != axis && s[d] != a[0].shape[d]) fail_shapes(a, fmt::format("dim {} differs", d));
    if (__builtin_add_overflow(total, s[static_cast<int>(axis)], &total))
      fail_shapes(a, fmt::format("the sizes along axis {} overflow int64", axis));
  }
  m.shape[static_cast<int>(axis)] = total;
  return m;
}
void concat_cpu(const KernelArgs& k) {
  AxisSplit so = split_at(k.out.shape(), k.attrs.axis);
  auto es = dtype_size(k.out.dtype());
  auto* dst = static_cast<char*>(k.out.raw());
  std::int64_t off = 0;
  for (const Tensor* t : k.in) {
    std::int64_t len = t->shape()[static_cast<int>(k.attrs.axis)];
    auto* src = static_cast<const char*>(t->raw());
    for (std::int64_t o = 0; o < so.outer; ++o)
      std::memcpy(dst + static_cast<std::size_t>((o * so.len + off) * so.inner) * es,
                  src + static_cast<std::size_t>(o * len * so.inner) * es, static_cast<std::size_t>(len * so.inner) * es);
    off += len;
  }
}
AD_CUDA_ONLY(void concat_cuda(const KernelArgs& k) {
  AxisSplit so = split_at(k.out.shape(), k.attrs.axis);
  std::int64_t off = 0;
  for (const Tensor* t : k.in) {
    std::int64_t len = t->shape()[static_cast<int>(k.attrs.axis)];
    cuda_k::copy_axis(dtype_size(k.out.dtype()), t->raw(), len, 0, k.out.raw(), so.len, off, so.outer, len, so.inner);
    off += len;
  }
})
void concat_bwd(BackwardArgs& a) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    std::int64_t len = a.in[i].shape()[static_cast<int>(a.attrs.axis)];
    if (a.needs[i]) a.grad[i] = slice(a.dout, static_cast<int>(a.attrs.axis), off, off + len);
    off += len;
  }
}
const OpDef op_def_concat{.name = "concat", .args = "...", .arity = -1, .infer = infer_concat, .cpu = concat_cpu,
                          .cuda = AD_CUDA_FN(concat_cuda),
                          .backward = concat_bwd};
Var concat(const std::vector<Var>& xs, int axis) {
  if (xs.empty()) throw Error("concat: no inputs");
  for (const auto& x : xs)
    if (!x.defined()) throw Error("concat: an input is an undefined Var");
  Attrs at;
  at.axis = norm_axis("concat", axis, xs[0].shape());
  std::vector<Operand> ops(xs.begin(), xs.end());
  return make_node(OpId::concat, ops, at);
}

// ---- gather ----  x [..., V, ...] (V at axis), index i64 [I...] -> [..., I..., ...]
Meta infer_gather(const InferArgs& a) {
  infer_float_or_index(a);
  check_index(a, 1);
  const Shape& xs = a[0].shape;
  if (xs.rank() == 0) fail_shapes(a, "cannot gather from a scalar");
  if (xs.rank() - 1 + a[1].shape.rank() > kMaxRank)
    fail_shapes(a, fmt::format("the result would have rank {}, above the maximum of {}",
                               xs.rank() - 1 + a[1].shape.rank(), kMaxRank));
  auto axis = static_cast<int>(a.attrs.axis);
  Shape out;
  for (int i = 0; i < axis; ++i) out.push_back(xs[i]);
  for (auto d : a[1].shape) out.push_back(d);
  for (int i = axis + 1; i < xs.rank(); ++i) out.push_back(xs[i]);
  return Meta{out, a[0].dtype, a[0].device};
}
void gather_cpu(const KernelArgs& k) {
  AxisSplit s = split_at(k[0].shape(), k.attrs.axis);
  const std::int64_t* idx = k[1].data<std::int64_t>();
  std::int64_t ni = k[1].numel();
  auto es = dtype_size(k.out.dtype());
  auto* src = static_cast<const char*>(k[0].raw());
  auto* dst = static_cast<char*>(k.out.raw());
  for (std::int64_t j = 0; j < ni; ++j)
    if (idx[j] < 0 || idx[j] >= s.len)
      kernel_fail("gather", fmt::format("index {} at position {} out of range [0, {}) for x {}", idx[j], j, s.len,
                                        k[0].shape().str()));
  std::size_t row = static_cast<std::size_t>(s.inner) * es;
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t j = 0; j < ni; ++j)
      std::memcpy(dst + static_cast<std::size_t>(o * ni + j) * row, src + static_cast<std::size_t>(o * s.len + idx[j]) * row,
                  row);
}
// Indices live on the GPU: a check kernel finds the first bad one, which is
// thrown here as on the CPU (this waits for the device).
AD_CUDA_ONLY(void gather_cuda(const KernelArgs& k) {
  AxisSplit s = split_at(k[0].shape(), k.attrs.axis);
  const std::int64_t* idx = k[1].data<std::int64_t>();
  std::int64_t ni = k[1].numel(), bad = 0;
  if (std::int64_t j = cuda_k::first_bad_index(idx, ni, s.len, &bad); j >= 0)
    kernel_fail("gather", fmt::format("index {} at position {} out of range [0, {}) for x {}", bad, j, s.len,
                                      k[0].shape().str()));
  cuda_k::gather(dtype_size(k.out.dtype()), k[0].raw(), s.outer, s.len, s.inner, idx, ni, k.out.raw());
})
void gather_bwd(BackwardArgs& a) {
  Attrs at = a.attrs;
  at.shape = a.in[0].shape();
  a.grad[0] = make_node(OpId::gather_backward, {a.dout, a.in[1]}, at);
}
const OpDef op_def_gather{.name = "gather", .args = "x,index", .arity = 2, .infer = infer_gather, .cpu = gather_cpu,
                          .cuda = AD_CUDA_FN(gather_cuda),
                          .backward = gather_bwd, .saves = saves_input(1)};
Var gather(const Operand& x, const Operand& index, int axis) {
  Shape s = operand_shape("gather", x);
  Attrs at;
  at.axis = s.rank() ? norm_axis("gather", axis, s) : 0;
  return make_node(OpId::gather, {x, index}, at);
}
Var embedding(const Operand& table, const Operand& ids) {
  Shape s = operand_shape("embedding", table);
  if (s.rank() != 2) throw Error(fmt::format("embedding: table must be [V, D], got {}", s.str()));
  const Var& iv = ids.var();
  if (iv.defined() && iv.dtype() != DType::i64)
    throw Error(fmt::format("embedding: ids must be i64, got {}{} (table {})", dtype_name(iv.dtype()), iv.shape().str(),
                            s.str()));
  // ids are data: out of range ones throw when gather runs (a graph may be built before its ids are written)
  return gather(table, ids, 0);
}
// ---- gather_backward ----  (dy, index) -> zeros of attrs.shape with dy rows added at index (scatter-add);
// linear in dy, its gradient is gather
Meta infer_gather_backward(const InferArgs& a) {
  if (!is_compute_float(a[0].dtype)) fail_shapes(a, "dy must be f32 or f64");
  check_index(a, 1);
  return Meta{a.attrs.shape, a[0].dtype, a[0].device};
}
void gather_backward_cpu(const KernelArgs& k) {
  AxisSplit s = split_at(k.out.shape(), k.attrs.axis);
  const std::int64_t* idx = k[1].data<std::int64_t>();
  std::int64_t ni = k[1].numel();
  kernels::dispatch_float(k.out.dtype(), "gather_backward", [&](auto t) {
    using T = decltype(t);
    const T* dy = k[0].data<T>();
    T* dx = k.out.data<T>();
    std::fill(dx, dx + k.out.numel(), T(0));
    for (std::int64_t j = 0; j < ni; ++j)
      if (idx[j] < 0 || idx[j] >= s.len)
        kernel_fail("gather_backward", fmt::format("index {} at position {} out of range [0, {})", idx[j], j, s.len));
    for (std::int64_t o = 0; o < s.outer; ++o)
      for (std::int64_t j = 0; j < ni; ++j) {
        T* d = dx + (o * s.len + idx[j]) * s.inner;
        const T* g = dy + (o * ni + j) * s.inner;
        for (std::int64_t i = 0; i < s.inner; ++i) d[i] += g[i];
      }
  });
}
AD_CUDA_ONLY(void gather_backward_cuda(const KernelArgs& k) {
  AxisSplit s = split_at(k.out.shape(), k.attrs.axis);
  const std::int64_t* idx = k[1].data<std::int64_t>();
  std::int64_t ni = k[1].numel(), bad = 0;
  if (std::int64_t j = cuda_k::first_bad_index(idx, ni, s.len, &bad); j >= 0)
    kernel_fail("gather_backward", fmt::format("index {} at position {} out of range [0, {})", bad, j, s.len));
  cuda_k::gather_backward(k.out.dtype(), k[0].raw(), s.outer, s.len, s.inner, idx, ni, k.out.raw());
})
void gather_backward_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = gather(a.dout, a.in[1], static_cast<int>(a.attrs.axis));
}
const OpDef op_def_gather_backward{.name = "gather_backward", .args = "dy,index", .arity = 2,
                                   .infer = infer_gather_backward, .cpu = gather_backward_cpu,
                                   .cuda = AD_CUDA_FN(gather_backward_cuda),
                                   .backward = gather_backward_bwd, .saves = saves_input(1)};

}  // namespace ad
