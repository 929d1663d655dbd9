// Elementwise unary ops, ops with a scalar operand, casts, and the fused
// backward of the activations.
#include <cmath>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "core/math.hpp"
#include "ops/pointwise.hpp"

namespace ad {

namespace {
Meta infer_float1(const InferArgs& a) { check_float_same(a); return a[0]; }
// (saved, dy): same float dtype and shape
Meta infer_float2_same(const InferArgs& a) {
  check_float_same(a);
  if (!(a[0].shape == a[1].shape)) fail_shapes(a, "shapes differ");
  return a[0];
}
template <class Fn> void unary(const KernelArgs& k, const char* op, Fn fn) {
  kernels::dispatch_float(k.out.dtype(), op, [&](auto t) {
    using T = decltype(t);
    kernels::map1(k[0].data<T>(), k.out.data<T>(), k.out.numel(), [&](T x) { return fn(x); });
  });
}
template <class Fn> void binary_same(const KernelArgs& k, const char* op, Fn fn) {
  kernels::dispatch_float(k.out.dtype(), op, [&](auto t) {
    using T = decltype(t);
    kernels::map2(k[0].data<T>(), k[1].data<T>(), k.out.data<T>(), k.out.numel(), [&](T a, T b) { return fn(a, b); });
  });
}
Var un(OpId op, const Operand& x) { return make_node(op, {x}); }
Var un_s(OpId op, const Operand& x, double s) { Attrs at; at.scalar = s; return make_node(op, {x}, at); }
constexpr const char* kDoubleBackward = "double backward is not supported";
}  // namespace

// ---- neg ----  d/dx (-x) = -1
void neg_cpu(const KernelArgs& k) { unary(k, "neg", pw::Neg{}); }
void neg_bwd(BackwardArgs& a) { a.grad[0] = neg(a.dout); }
const OpDef op_def_neg{.name = "neg", .args = "x", .arity = 1, .infer = infer_float1, .cpu = neg_cpu, .backward = neg_bwd};
Var neg(const Operand& x) { return un(OpId::neg, x); }

// ---- exp ----  d/dx e^x = e^x; saves output
void exp_cpu(const KernelArgs& k) { unary(k, "exp", pw::Exp{}); }
void exp_bwd(BackwardArgs& a) { a.grad[0] = mul(a.dout, a.out); }
const OpDef op_def_exp{.name = "exp", .args = "x", .arity = 1, .infer = infer_float1, .cpu = exp_cpu,
                       .backward = exp_bwd, .saves = kSavesOutput};
Var exp(const Operand& x) { return un(OpId::exp, x); }

// ---- log ----  d/dx log x = 1/x; saves input
void log_cpu(const KernelArgs& k) { unary(k, "log", pw::Log{}); }
void log_bwd(BackwardArgs& a) { a.grad[0] = div(a.dout, a.in[0]); }
const OpDef op_def_log{.name = "log", .args = "x", .arity = 1, .infer = infer_float1, .cpu = log_cpu,
                       .backward = log_bwd, .saves = saves_input(0)};
Var log(const Operand& x) { return un(OpId::log, x); }

// ---- sqrt ----  d/dx sqrt x = 1/(2 sqrt x); saves output
void sqrt_cpu(const KernelArgs& k) { unary(k, "sqrt", pw::Sqrt{}); }
void sqrt_bwd(BackwardArgs& a) { a.grad[0] = mul_scalar(div(a.dout, a.out), 0.5); }
const OpDef op_def_sqrt{.name = "sqrt", .args = "x", .arity = 1, .infer = infer_float1, .cpu = sqrt_cpu,
                        .backward = sqrt_bwd, .saves = kSavesOutput};
Var sqrt(const Operand& x) { return un(OpId::sqrt, x); }

// ---- abs ----  d/dx |x| = sign(x) (0 at 0); saves input
void abs_cpu(const KernelArgs& k) { unary(k, "abs", pw::Abs{}); }
void abs_bwd(BackwardArgs& a) { a.grad[0] = mul(a.dout, sign(a.in[0])); }
const OpDef op_def_abs{.name = "abs", .args = "x", .arity = 1, .infer = infer_float1, .cpu = abs_cpu,
                       .backward = abs_bwd, .saves = saves_input(0)};
Var abs(const Operand& x) { return un(OpId::abs, x); }

// ---- sign ----  piecewise constant: gradient 0 everywhere it is defined
void sign_cpu(const KernelArgs& k) {
  unary(k, "sign", pw::Sign{});
}
void sign_bwd(BackwardArgs&) {}  // zero gradient
const OpDef op_def_sign{.name = "sign", .args = "x", .arity = 1, .infer = infer_float1, .cpu = sign_cpu,
                        .backward = sign_bwd};
Var sign(const Operand& x) { return un(OpId::sign, x); }

// ---- tanh ----  d/dx tanh = 1 - y^2; saves output
void tanh_cpu(const KernelArgs& k) { unary(k, "tanh", pw::Tanh{}); }
void tanh_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::tanh_backward, {a.out, a.dout}); }
const OpDef op_def_tanh{.name = "tanh", .args = "x", .arity = 1, .infer = infer_float1, .cpu = tanh_cpu,
                        .backward = tanh_bwd, .saves = kSavesOutput};
Var tanh(const Operand& x) { return un(OpId::tanh, x); }
// (y, dy) -> dy (1 - y^2)
void tanh_backward_cpu(const KernelArgs& k) {
  binary_same(k, "tanh_backward", pw::TanhBackward{});
}
const OpDef op_def_tanh_backward{.name = "tanh_backward", .args = "y,dy", .arity = 2, .infer = infer_float2_same,
                                 .cpu = tanh_backward_cpu, .no_grad = kDoubleBackward};

// ---- sigmoid ----  d/dx s = s (1 - s); saves output
void sigmoid_cpu(const KernelArgs& k) { unary(k, "sigmoid", pw::Sigmoid{}); }
void sigmoid_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::sigmoid_backward, {a.out, a.dout}); }
const OpDef op_def_sigmoid{.name = "sigmoid", .args = "x", .arity = 1, .infer = infer_float1, .cpu = sigmoid_cpu,
                           .backward = sigmoid_bwd, .saves = kSavesOutput};
Var sigmoid(const Operand& x) { return un(OpId::sigmoid, x); }
// (y, dy) -> dy y (1 - y)
void sigmoid_backward_cpu(const KernelArgs& k) {
  binary_same(k, "sigmoid_backward", pw::SigmoidBackward{});
}
const OpDef op_def_sigmoid_backward{.name = "sigmoid_backward", .args = "y,dy", .arity = 2,
                                    .infer = infer_float2_same, .cpu = sigmoid_backward_cpu,
                                    .no_grad = kDoubleBackward};

// ---- relu ----  d/dx = [x > 0] = [y > 0]; saves output
void relu_cpu(const KernelArgs& k) {
  unary(k, "relu", pw::Relu{});
}
void relu_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::relu_backward, {a.out, a.dout}); }
const OpDef op_def_relu{.name = "relu", .args = "x", .arity = 1, .infer = infer_float1, .cpu = relu_cpu,
                        .backward = relu_bwd, .saves = kSavesOutput};
Var relu(const Operand& x) { return un(OpId::relu, x); }
// (y, dy) -> dy [y > 0]
void relu_backward_cpu(const KernelArgs& k) {
  binary_same(k, "relu_backward", pw::ReluBackward{});
}
const OpDef op_def_relu_backward{.name = "relu_backward", .args = "y,dy", .arity = 2, .infer = infer_float2_same,
                                 .cpu = relu_backward_cpu, .no_grad = kDoubleBackward};

// ---- gelu ----  x Phi(x); d/dx = Phi(x) + x phi(x); saves input
void gelu_cpu(const KernelArgs& k) { unary(k, "gelu", pw::Gelu{}); }
void gelu_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::gelu_backward, {a.in[0], a.dout}); }
const OpDef op_def_gelu{.name = "gelu", .args = "x", .arity = 1, .infer = infer_float1, .cpu = gelu_cpu,
                        .backward = gelu_bwd, .saves = saves_input(0)};
Var gelu(const Operand& x) { return un(OpId::gelu, x); }
void gelu_backward_cpu(const KernelArgs& k) {
  binary_same(k, "gelu_backward", pw::GeluBackward{});
}
const OpDef op_def_gelu_backward{.name = "gelu_backward", .args = "x,dy", .arity = 2, .infer = infer_float2_same,
                                 .cpu = gelu_backward_cpu, .no_grad = kDoubleBackward};

// ---- silu ----  x s(x); d/dx = s (1 + x (1 - s)); saves input
void silu_cpu(const KernelArgs& k) { unary(k, "silu", pw::Silu{}); }
void silu_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::silu_backward, {a.in[0], a.dout}); }
const OpDef op_def_silu{.name = "silu", .args = "x", .arity = 1, .infer = infer_float1, .cpu = silu_cpu,
                        .backward = silu_bwd, .saves = saves_input(0)};
Var silu(const Operand& x) { return un(OpId::silu, x); }
void silu_backward_cpu(const KernelArgs& k) {
  binary_same(k, "silu_backward", pw::SiluBackward{});
}
const OpDef op_def_silu_backward{.name = "silu_backward", .args = "x,dy", .arity = 2, .infer = infer_float2_same,
                                 .cpu = silu_backward_cpu, .no_grad = kDoubleBackward};

// ---- add_scalar ----  x + s; d/dx = 1
void add_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "add_scalar", pw::AddScalar{s});
}
void add_scalar_bwd(BackwardArgs& a) { a.grad[0] = a.dout; }
const OpDef op_def_add_scalar{.name = "add_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                              .cpu = add_scalar_cpu, .backward = add_scalar_bwd};
Var add_scalar(const Operand& x, double s) { return un_s(OpId::add_scalar, x, s); }

// ---- mul_scalar ----  x s; d/dx = s
void mul_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "mul_scalar", pw::MulScalar{s});
}
void mul_scalar_bwd(BackwardArgs& a) { a.grad[0] = mul_scalar(a.dout, a.attrs.scalar); }
const OpDef op_def_mul_scalar{.name = "mul_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                              .cpu = mul_scalar_cpu, .backward = mul_scalar_bwd};
Var mul_scalar(const Operand& x, double s) { return un_s(OpId::mul_scalar, x, s); }

// ---- rsub_scalar ----  s - x; d/dx = -1
void rsub_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "rsub_scalar", pw::RsubScalar{s});
}
void rsub_scalar_bwd(BackwardArgs& a) { a.grad[0] = neg(a.dout); }
const OpDef op_def_rsub_scalar{.name = "rsub_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                               .cpu = rsub_scalar_cpu, .backward = rsub_scalar_bwd};
Var rsub_scalar(const Operand& x, double s) { return un_s(OpId::rsub_scalar, x, s); }

// ---- rdiv_scalar ----  y = s / x; d/dx = -s/x^2 = -y/x; saves input and output
void rdiv_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "rdiv_scalar", pw::RdivScalar{s});
}
void rdiv_scalar_bwd(BackwardArgs& a) { a.grad[0] = neg(div(mul(a.dout, a.out), a.in[0])); }
const OpDef op_def_rdiv_scalar{.name = "rdiv_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                               .cpu = rdiv_scalar_cpu, .backward = rdiv_scalar_bwd,
                               .saves = saves_input(0) | kSavesOutput};
Var rdiv_scalar(const Operand& x, double s) { return un_s(OpId::rdiv_scalar, x, s); }

// ---- pow_scalar ----  x^p; d/dx = p x^(p-1); saves input
void pow_scalar_cpu(const KernelArgs& k) {
  unary(k, "pow_scalar", pw::PowScalar{k.attrs.scalar});
}
void pow_scalar_bwd(BackwardArgs& a) {
  double p = a.attrs.scalar;
  if (p == 0.0) return;  // constant
  if (p == 1.0) { a.grad[0] = a.dout; return; }
  if (p == 2.0) { a.grad[0] = mul(a.dout, mul_scalar(a.in[0], 2.0)); return; }
  a.grad[0] = mul(a.dout, mul_scalar(pow_scalar(a.in[0], p - 1.0), p));
}
const OpDef op_def_pow_scalar{.name = "pow_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                              .cpu = pow_scalar_cpu, .backward = pow_scalar_bwd, .saves = saves_input(0)};
Var pow_scalar(const Operand& x, double p) { return un_s(OpId::pow_scalar, x, p); }

// ---- cast ----  f32/f64/f16/bf16 -> f32/f64/f16/bf16; gradient cast back
Meta infer_cast(const InferArgs& a) {
  if (!is_floating(a[0].dtype) || !is_floating(a.attrs.dtype))
    fail_shapes(a, fmt::format("only float dtypes convert (to {})", dtype_name(a.attrs.dtype)));
  Meta m = a[0];
  m.dtype = a.attrs.dtype;
  return m;
}
void cast_cpu(const KernelArgs& k) { k.out.copy_from(k[0]); }
void cast_bwd(BackwardArgs& a) { a.grad[0] = cast(a.dout, a.in[0].dtype()); }
const OpDef op_def_cast{.name = "cast", .args = "x", .arity = 1, .infer = infer_cast, .cpu = cast_cpu,
                        .backward = cast_bwd};
Var cast(const Operand& x, DType dtype) { Attrs at; at.dtype = dtype; return make_node(OpId::cast, {x}, at); }

}  // namespace ad
