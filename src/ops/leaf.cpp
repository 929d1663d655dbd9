// Leaves (user data and parameters: values attached, never computed) and
// constant sources.
#include <cmath>

#include "core/graph_impl.hpp"

namespace ad {

namespace {
Meta infer_leaf(const InferArgs& a) { fail(a, "leaves are made with Graph::input / Graph::param"); }
}  // namespace

// ---- input ----  a data leaf; its value is the user's tensor
const OpDef op_def_input{.name = "input", .args = "", .arity = 0, .infer = infer_leaf, .cpu = nullptr,
                         .no_grad = "a leaf: gradients stop here"};

// ---- parameter ----  a Parameter's leaf; its value is the parameter's tensor
const OpDef op_def_parameter{.name = "parameter", .args = "", .arity = 0, .infer = infer_leaf, .cpu = nullptr,
                             .no_grad = "a leaf: gradients stop here"};

// ---- full ----  () -> shape filled with a value (a source: recomputable, never saved)
Meta infer_full(const InferArgs& a) {
  for (auto d : a.attrs.shape)
    if (d < 0) fail(a, fmt::format("negative dimension in shape {}", a.attrs.shape.str()));
  if (!is_floating(a.attrs.dtype) && a.attrs.dtype != DType::i64)
    fail(a, fmt::format("dtype {} (value {}) is not f32, f64, f16, bf16 or i64", dtype_name(a.attrs.dtype),
                        static_cast<int>(a.attrs.dtype)));
  const double v = a.attrs.scalar;
  if (a.attrs.dtype == DType::i64 && !(v >= -9223372036854775808.0 && v < 9223372036854775808.0 && v == std::trunc(v)))
    fail(a, fmt::format("value {} is not an i64 (not an integer, not finite or out of range)", v));
  if (!a.attrs.shape.fits_bytes(static_cast<std::int64_t>(dtype_size(a.attrs.dtype))))
    fail(a, fmt::format("shape {} has more bytes than a 64-bit count holds", a.attrs.shape.str()));
  return Meta{a.attrs.shape, a.attrs.dtype, Device::cpu()};
}
void full_cpu(const KernelArgs& k) { k.out.fill(k.attrs.scalar); }
AD_CUDA_ONLY(void full_cuda(const KernelArgs& k) { k.out.fill(k.attrs.scalar); })  // Tensor::fill is device-aware
const OpDef op_def_full{.name = "full", .args = "", .arity = 0, .infer = infer_full, .cpu = full_cpu, .cuda = AD_CUDA_FN(full_cuda),
                        .no_grad = "a constant"};

Var full(const Var& like, const Shape& shape, double value, DType dtype) {
  if (!like.defined()) throw Error("full: `like` is an undefined Var");
  Attrs at;
  at.shape = shape;
  at.scalar = value;
  at.dtype = dtype;
  GraphImpl& g = *like.graph();
  Node n;
  n.op = OpId::full;
  n.attrs = at;
  InferArgs a{op_def_full, {}, n.attrs};
  n.meta = infer_full(a);
  n.meta.device = like.device();
  return {&g, g.add_node(std::move(n))};
}
Var zeros_like(const Var& x) { return full(x, x.shape(), 0.0, x.dtype()); }
Var ones_like(const Var& x) { return full(x, x.shape(), 1.0, x.dtype()); }

}  // namespace ad
