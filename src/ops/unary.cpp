// Elementwise unary ops, ops with a scalar operand, casts, and the fused
// backward of the activations.
#include <cmath>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "core/math.hpp"
#include "ops/pointwise.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

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
AD_CUDA_ONLY(template <class F> void unary_cuda(const KernelArgs& k, F f) {
  cuda_k::map1(k.out.dtype(), k[0].raw(), k.out.raw(), k.out.numel(), f);
} template <class F> void binary_same_cuda(const KernelArgs& k, F f) {
  cuda_k::map2(k.out.dtype(), k[0].raw(), k[1].raw(), k.out.raw(), k.out.numel(), f);
})
Var un(OpId op, const Operand& x) { return make_node(op, {x}); }
Var un_s(OpId op, const Operand& x, double s) { Attrs at; at.scalar = s; return make_node(op, {x}, at); }
}  // namespace

// ---- neg ----  d/dx (-x) = -1
void neg_cpu(const KernelArgs& k) { unary(k, "neg", pw::Neg{}); }
AD_CUDA_ONLY(void neg_cuda(const KernelArgs& k) { unary_cuda(k, pw::Neg{}); })
void neg_bwd(BackwardArgs& a) { a.grad[0] = neg(a.dout); }
const OpDef op_def_neg{.name = "neg", .args = "x", .arity = 1, .infer = infer_float1, .cpu = neg_cpu, .cuda = AD_CUDA_FN(neg_cuda), .backward = neg_bwd, .overwrites = 0b01};
Var neg(const Operand& x) { return un(OpId::neg, x); }

// ---- exp ----  d/dx e^x = e^x; saves output
void exp_cpu(const KernelArgs& k) { unary(k, "exp", pw::Exp{}); }
AD_CUDA_ONLY(void exp_cuda(const KernelArgs& k) { unary_cuda(k, pw::Exp{}); })
void exp_bwd(BackwardArgs& a) { a.grad[0] = mul(a.dout, a.out); }
const OpDef op_def_exp{.name = "exp", .args = "x", .arity = 1, .infer = infer_float1, .cpu = exp_cpu, .cuda = AD_CUDA_FN(exp_cuda),
                       .backward = exp_bwd, .saves = kSavesOutput, .overwrites = 0b01};
Var exp(const Operand& x) { return un(OpId::exp, x); }

// ---- log ----  d/dx log x = 1/x; saves input
void log_cpu(const KernelArgs& k) { unary(k, "log", pw::Log{}); }
AD_CUDA_ONLY(void log_cuda(const KernelArgs& k) { unary_cuda(k, pw::Log{}); })
void log_bwd(BackwardArgs& a) { a.grad[0] = div(a.dout, a.in[0]); }
const OpDef op_def_log{.name = "log", .args = "x", .arity = 1, .infer = infer_float1, .cpu = log_cpu, .cuda = AD_CUDA_FN(log_cuda),
                       .backward = log_bwd, .saves = saves_input(0), .overwrites = 0b01};
Var log(const Operand& x) { return un(OpId::log, x); }

// ---- sqrt ----  d/dx sqrt x = 1/(2 sqrt x); saves output
void sqrt_cpu(const KernelArgs& k) { unary(k, "sqrt", pw::Sqrt{}); }
AD_CUDA_ONLY(void sqrt_cuda(const KernelArgs& k) { unary_cuda(k, pw::Sqrt{}); })
void sqrt_bwd(BackwardArgs& a) { a.grad[0] = mul_scalar(div(a.dout, a.out), 0.5); }
const OpDef op_def_sqrt{.name = "sqrt", .args = "x", .arity = 1, .infer = infer_float1, .cpu = sqrt_cpu, .cuda = AD_CUDA_FN(sqrt_cuda),
                        .backward = sqrt_bwd, .saves = kSavesOutput, .overwrites = 0b01};
Var sqrt(const Operand& x) { return un(OpId::sqrt, x); }

// ---- abs ----  d/dx |x| = sign(x) (0 at 0); saves input
void abs_cpu(const KernelArgs& k) { unary(k, "abs", pw::Abs{}); }
AD_CUDA_ONLY(void abs_cuda(const KernelArgs& k) { unary_cuda(k, pw::Abs{}); })
void abs_bwd(BackwardArgs& a) { a.grad[0] = mul(a.dout, sign(a.in[0])); }
const OpDef op_def_abs{.name = "abs", .args = "x", .arity = 1, .infer = infer_float1, .cpu = abs_cpu, .cuda = AD_CUDA_FN(abs_cuda),
                       .backward = abs_bwd, .saves = saves_input(0), .overwrites = 0b01};
Var abs(const Operand& x) { return un(OpId::abs, x); }

// ---- sign ----  piecewise constant: gradient 0 everywhere it is defined
void sign_cpu(const KernelArgs& k) {
  unary(k, "sign", pw::Sign{});
}
AD_CUDA_ONLY(void sign_cuda(const KernelArgs& k) { unary_cuda(k, pw::Sign{}); })
void sign_bwd(BackwardArgs&) {}  // zero gradient
const OpDef op_def_sign{.name = "sign", .args = "x", .arity = 1, .infer = infer_float1, .cpu = sign_cpu, .cuda = AD_CUDA_FN(sign_cuda),
                        .backward = sign_bwd, .overwrites = 0b01};
Var sign(const Operand& x) { return un(OpId::sign, x); }

// ---- tanh ----  d/dx tanh = 1 - y^2; saves output
void tanh_cpu(const KernelArgs& k) { unary(k, "tanh", pw::Tanh{}); }
AD_CUDA_ONLY(void tanh_cuda(const KernelArgs& k) { unary_cuda(k, pw::Tanh{}); })
void tanh_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::tanh_backward, {a.out, a.dout}); }
const OpDef op_def_tanh{.name = "tanh", .args = "x", .arity = 1, .infer = infer_float1, .cpu = tanh_cpu, .cuda = AD_CUDA_FN(tanh_cuda),
                        .backward = tanh_bwd, .saves = kSavesOutput, .overwrites = 0b01};
Var tanh(const Operand& x) { return un(OpId::tanh, x); }
// (y, dy) -> dy (1 - y^2)
void tanh_backward_cpu(const KernelArgs& k) {
  binary_same(k, "tanh_backward", pw::TanhBackward{});
}
AD_CUDA_ONLY(void tanh_backward_cuda(const KernelArgs& k) { binary_same_cuda(k, pw::TanhBackward{}); })
// double backward: d/dy = -2 g dy y, d/d(dy) = tanh_backward(y, g)
void tanh_backward_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = mul_scalar(mul(mul(a.dout, a.in[1]), a.in[0]), -2.0);
  if (a.needs[1]) a.grad[1] = make_node(OpId::tanh_backward, {a.in[0], a.dout});
}
const OpDef op_def_tanh_backward{.name = "tanh_backward", .args = "y,dy", .arity = 2, .infer = infer_float2_same,
                                 .cpu = tanh_backward_cpu, .cuda = AD_CUDA_FN(tanh_backward_cuda),
                                 .backward = tanh_backward_bwd, .overwrites = 0b11};

// ---- sigmoid ----  d/dx s = s (1 - s); saves output
void sigmoid_cpu(const KernelArgs& k) { unary(k, "sigmoid", pw::Sigmoid{}); }
AD_CUDA_ONLY(void sigmoid_cuda(const KernelArgs& k) { unary_cuda(k, pw::Sigmoid{}); })
void sigmoid_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::sigmoid_backward, {a.out, a.dout}); }
const OpDef op_def_sigmoid{.name = "sigmoid", .args = "x", .arity = 1, .infer = infer_float1, .cpu = sigmoid_cpu, .cuda = AD_CUDA_FN(sigmoid_cuda),
                           .backward = sigmoid_bwd, .saves = kSavesOutput, .overwrites = 0b01};
Var sigmoid(const Operand& x) { return un(OpId::sigmoid, x); }
// (y, dy) -> dy y (1 - y)
void sigmoid_backward_cpu(const KernelArgs& k) {
  binary_same(k, "sigmoid_backward", pw::SigmoidBackward{});
}
AD_CUDA_ONLY(void sigmoid_backward_cuda(const KernelArgs& k) { binary_same_cuda(k, pw::SigmoidBackward{}); })
// double backward: d/dy = g dy (1 - 2y), d/d(dy) = sigmoid_backward(y, g)
void sigmoid_backward_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = mul(mul(a.dout, a.in[1]), rsub_scalar(mul_scalar(a.in[0], 2.0), 1.0));
  if (a.needs[1]) a.grad[1] = make_node(OpId::sigmoid_backward, {a.in[0], a.dout});
}
const OpDef op_def_sigmoid_backward{.name = "sigmoid_backward", .args = "y,dy", .arity = 2,
                                    .infer = infer_float2_same, .cpu = sigmoid_backward_cpu, .cuda = AD_CUDA_FN(sigmoid_backward_cuda),
                                    .backward = sigmoid_backward_bwd, .overwrites = 0b11};

// ---- relu ----  d/dx = [x > 0] = [y > 0]; saves output
void relu_cpu(const KernelArgs& k) {
  unary(k, "relu", pw::Relu{});
}
AD_CUDA_ONLY(void relu_cuda(const KernelArgs& k) { unary_cuda(k, pw::Relu{}); })
void relu_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::relu_backward, {a.out, a.dout}); }
const OpDef op_def_relu{.name = "relu", .args = "x", .arity = 1, .infer = infer_float1, .cpu = relu_cpu, .cuda = AD_CUDA_FN(relu_cuda),
                        .backward = relu_bwd, .saves = kSavesOutput, .overwrites = 0b01};
Var relu(const Operand& x) { return un(OpId::relu, x); }
// (y, dy) -> dy [y > 0]
void relu_backward_cpu(const KernelArgs& k) {
  binary_same(k, "relu_backward", pw::ReluBackward{});
}
AD_CUDA_ONLY(void relu_backward_cuda(const KernelArgs& k) { binary_same_cuda(k, pw::ReluBackward{}); })
// double backward: the mask [y > 0] is piecewise constant (zero gradient to y); d/d(dy) = relu_backward(y, g)
void relu_backward_bwd(BackwardArgs& a) {
  if (a.needs[1]) a.grad[1] = make_node(OpId::relu_backward, {a.in[0], a.dout});
}
const OpDef op_def_relu_backward{.name = "relu_backward", .args = "y,dy", .arity = 2, .infer = infer_float2_same,
                                 .cpu = relu_backward_cpu, .cuda = AD_CUDA_FN(relu_backward_cuda),
                                 .backward = relu_backward_bwd, .overwrites = 0b11, .zero_grad_inputs = 0b01};

// ---- gelu ----  x Phi(x); d/dx = Phi(x) + x phi(x); saves input
void gelu_cpu(const KernelArgs& k) { unary(k, "gelu", pw::Gelu{}); }
AD_CUDA_ONLY(void gelu_cuda(const KernelArgs& k) { unary_cuda(k, pw::Gelu{}); })
void gelu_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::gelu_backward, {a.in[0], a.dout}); }
const OpDef op_def_gelu{.name = "gelu", .args = "x", .arity = 1, .infer = infer_float1, .cpu = gelu_cpu, .cuda = AD_CUDA_FN(gelu_cuda),
                        .backward = gelu_bwd, .saves = saves_input(0), .overwrites = 0b01};
Var gelu(const Operand& x) { return un(OpId::gelu, x); }
void gelu_backward_cpu(const KernelArgs& k) {
  binary_same(k, "gelu_backward", pw::GeluBackward{});
}
AD_CUDA_ONLY(void gelu_backward_cuda(const KernelArgs& k) { binary_same_cuda(k, pw::GeluBackward{}); })
// double backward: gelu''(x) = phi(x) (2 - x^2), phi the standard normal density;
// d/dx = g dy gelu''(x), d/d(dy) = gelu_backward(x, g)
void gelu_backward_bwd(BackwardArgs& a) {
  if (a.needs[0]) {
    const Var& x = a.in[0];
    const Var x2 = mul(x, x);
    const Var phi = mul_scalar(exp(mul_scalar(x2, -0.5)), 0.3989422804014327);  // 1 / sqrt(2 pi)
    a.grad[0] = mul(mul(a.dout, a.in[1]), mul(phi, rsub_scalar(x2, 2.0)));
  }
  if (a.needs[1]) a.grad[1] = make_node(OpId::gelu_backward, {a.in[0], a.dout});
}
const OpDef op_def_gelu_backward{.name = "gelu_backward", .args = "x,dy", .arity = 2, .infer = infer_float2_same,
                                 .cpu = gelu_backward_cpu, .cuda = AD_CUDA_FN(gelu_backward_cuda),
                                 .backward = gelu_backward_bwd, .overwrites = 0b11};

// ---- silu ----  x s(x); d/dx = s (1 + x (1 - s)); saves input
void silu_cpu(const KernelArgs& k) { unary(k, "silu", pw::Silu{}); }
AD_CUDA_ONLY(void silu_cuda(const KernelArgs& k) { unary_cuda(k, pw::Silu{}); })
void silu_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::silu_backward, {a.in[0], a.dout}); }
const OpDef op_def_silu{.name = "silu", .args = "x", .arity = 1, .infer = infer_float1, .cpu = silu_cpu, .cuda = AD_CUDA_FN(silu_cuda),
                        .backward = silu_bwd, .saves = saves_input(0), .overwrites = 0b01};
Var silu(const Operand& x) { return un(OpId::silu, x); }
void silu_backward_cpu(const KernelArgs& k) {
  binary_same(k, "silu_backward", pw::SiluBackward{});
}
AD_CUDA_ONLY(void silu_backward_cuda(const KernelArgs& k) { binary_same_cuda(k, pw::SiluBackward{}); })
// double backward: silu''(x) = s (1 - s) (2 + x (1 - 2s)), s = sigmoid(x);
// d/dx = g dy silu''(x), d/d(dy) = silu_backward(x, g)
void silu_backward_bwd(BackwardArgs& a) {
  if (a.needs[0]) {
    const Var& x = a.in[0];
    const Var s = sigmoid(x);
    const Var ds = mul(s, rsub_scalar(s, 1.0));
    const Var second = mul(ds, add_scalar(mul(x, rsub_scalar(mul_scalar(s, 2.0), 1.0)), 2.0));
    a.grad[0] = mul(mul(a.dout, a.in[1]), second);
  }
  if (a.needs[1]) a.grad[1] = make_node(OpId::silu_backward, {a.in[0], a.dout});
}
const OpDef op_def_silu_backward{.name = "silu_backward", .args = "x,dy", .arity = 2, .infer = infer_float2_same,
                                 .cpu = silu_backward_cpu, .cuda = AD_CUDA_FN(silu_backward_cuda),
                                 .backward = silu_backward_bwd, .overwrites = 0b11};

// ---- sin ----  d/dx sin x = cos x; saves input
void sin_cpu(const KernelArgs& k) { unary(k, "sin", pw::Sin{}); }
AD_CUDA_ONLY(void sin_cuda(const KernelArgs& k) { unary_cuda(k, pw::Sin{}); })
void sin_bwd(BackwardArgs& a) { a.grad[0] = mul(a.dout, cos(a.in[0])); }
const OpDef op_def_sin{.name = "sin", .args = "x", .arity = 1, .infer = infer_float1, .cpu = sin_cpu, .cuda = AD_CUDA_FN(sin_cuda),
                       .backward = sin_bwd, .saves = saves_input(0), .overwrites = 0b01};
Var sin(const Operand& x) { return un(OpId::sin, x); }

// ---- cos ----  d/dx cos x = -sin x; saves input
void cos_cpu(const KernelArgs& k) { unary(k, "cos", pw::Cos{}); }
AD_CUDA_ONLY(void cos_cuda(const KernelArgs& k) { unary_cuda(k, pw::Cos{}); })
void cos_bwd(BackwardArgs& a) { a.grad[0] = neg(mul(a.dout, sin(a.in[0]))); }
const OpDef op_def_cos{.name = "cos", .args = "x", .arity = 1, .infer = infer_float1, .cpu = cos_cpu, .cuda = AD_CUDA_FN(cos_cuda),
                       .backward = cos_bwd, .saves = saves_input(0), .overwrites = 0b01};
Var cos(const Operand& x) { return un(OpId::cos, x); }

// ---- clamp ----  min(max(x, lo), hi); d/dx = [lo <= x <= hi]; saves input
Meta infer_clamp(const InferArgs& a) {
  check_float_same(a);
  const double lo = a.attrs.scalar, hi = a.attrs.scalar2;
  if (std::isnan(lo) || std::isnan(hi) || lo > hi)
    fail_shapes(a, fmt::format("bounds lo = {} and hi = {} do not make an interval (lo <= hi, neither NaN)", lo, hi));
  return a[0];
}
void clamp_cpu(const KernelArgs& k) { unary(k, "clamp", pw::Clamp{k.attrs.scalar, k.attrs.scalar2}); }
AD_CUDA_ONLY(void clamp_cuda(const KernelArgs& k) { unary_cuda(k, pw::Clamp{k.attrs.scalar, k.attrs.scalar2}); })
void clamp_bwd(BackwardArgs& a) { a.grad[0] = make_node(OpId::clamp_backward, {a.in[0], a.dout}, a.attrs); }
const OpDef op_def_clamp{.name = "clamp", .args = "x", .arity = 1, .infer = infer_clamp, .cpu = clamp_cpu, .cuda = AD_CUDA_FN(clamp_cuda),
                         .backward = clamp_bwd, .saves = saves_input(0), .overwrites = 0b01};
Var clamp(const Operand& x, double lo, double hi) {
  Attrs at;
  at.scalar = lo;
  at.scalar2 = hi;
  return make_node(OpId::clamp, {x}, at);
}
void clamp_backward_cpu(const KernelArgs& k) {
  binary_same(k, "clamp_backward", pw::ClampBackward{k.attrs.scalar, k.attrs.scalar2});
}
AD_CUDA_ONLY(void clamp_backward_cuda(const KernelArgs& k) {
  binary_same_cuda(k, pw::ClampBackward{k.attrs.scalar, k.attrs.scalar2});
})
// double backward: the mask [lo <= x <= hi] is piecewise constant; d/d(dy) = clamp_backward(x, g)
void clamp_backward_bwd(BackwardArgs& a) {
  if (a.needs[1]) a.grad[1] = make_node(OpId::clamp_backward, {a.in[0], a.dout}, a.attrs);
}
const OpDef op_def_clamp_backward{.name = "clamp_backward", .args = "x,dy", .arity = 2, .infer = infer_float2_same,
                                  .cpu = clamp_backward_cpu, .cuda = AD_CUDA_FN(clamp_backward_cuda),
                                  .backward = clamp_backward_bwd, .overwrites = 0b11, .zero_grad_inputs = 0b01};

// ---- add_scalar ----  x + s; d/dx = 1
void add_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "add_scalar", pw::AddScalar{s});
}
AD_CUDA_ONLY(void add_scalar_cuda(const KernelArgs& k) { unary_cuda(k, pw::AddScalar{k.attrs.scalar}); })
void add_scalar_bwd(BackwardArgs& a) { a.grad[0] = a.dout; }
const OpDef op_def_add_scalar{.name = "add_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                              .cpu = add_scalar_cpu, .cuda = AD_CUDA_FN(add_scalar_cuda), .backward = add_scalar_bwd, .overwrites = 0b01};
Var add_scalar(const Operand& x, double s) { return un_s(OpId::add_scalar, x, s); }

// ---- mul_scalar ----  x s; d/dx = s
void mul_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "mul_scalar", pw::MulScalar{s});
}
AD_CUDA_ONLY(void mul_scalar_cuda(const KernelArgs& k) { unary_cuda(k, pw::MulScalar{k.attrs.scalar}); })
void mul_scalar_bwd(BackwardArgs& a) { a.grad[0] = mul_scalar(a.dout, a.attrs.scalar); }
const OpDef op_def_mul_scalar{.name = "mul_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                              .cpu = mul_scalar_cpu, .cuda = AD_CUDA_FN(mul_scalar_cuda), .backward = mul_scalar_bwd, .overwrites = 0b01};
Var mul_scalar(const Operand& x, double s) { return un_s(OpId::mul_scalar, x, s); }

// ---- div_scalar ----  x / s; d/dx = 1/s (the gradient divides too)
void div_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "div_scalar", pw::DivScalar{s});
}
AD_CUDA_ONLY(void div_scalar_cuda(const KernelArgs& k) { unary_cuda(k, pw::DivScalar{k.attrs.scalar}); })
void div_scalar_bwd(BackwardArgs& a) { a.grad[0] = div_scalar(a.dout, a.attrs.scalar); }
const OpDef op_def_div_scalar{.name = "div_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                              .cpu = div_scalar_cpu, .cuda = AD_CUDA_FN(div_scalar_cuda), .backward = div_scalar_bwd, .overwrites = 0b01};
Var div_scalar(const Operand& x, double s) { return un_s(OpId::div_scalar, x, s); }

// ---- rsub_scalar ----  s - x; d/dx = -1
void rsub_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "rsub_scalar", pw::RsubScalar{s});
}
AD_CUDA_ONLY(void rsub_scalar_cuda(const KernelArgs& k) { unary_cuda(k, pw::RsubScalar{k.attrs.scalar}); })
void rsub_scalar_bwd(BackwardArgs& a) { a.grad[0] = neg(a.dout); }
const OpDef op_def_rsub_scalar{.name = "rsub_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                               .cpu = rsub_scalar_cpu, .cuda = AD_CUDA_FN(rsub_scalar_cuda), .backward = rsub_scalar_bwd, .overwrites = 0b01};
Var rsub_scalar(const Operand& x, double s) { return un_s(OpId::rsub_scalar, x, s); }

// ---- rdiv_scalar ----  y = s / x; d/dx = -s/x^2 = -y/x; saves input and output
void rdiv_scalar_cpu(const KernelArgs& k) {
  double s = k.attrs.scalar;
  unary(k, "rdiv_scalar", pw::RdivScalar{s});
}
AD_CUDA_ONLY(void rdiv_scalar_cuda(const KernelArgs& k) { unary_cuda(k, pw::RdivScalar{k.attrs.scalar}); })
void rdiv_scalar_bwd(BackwardArgs& a) { a.grad[0] = neg(div(mul(a.dout, a.out), a.in[0])); }
const OpDef op_def_rdiv_scalar{.name = "rdiv_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                               .cpu = rdiv_scalar_cpu, .cuda = AD_CUDA_FN(rdiv_scalar_cuda), .backward = rdiv_scalar_bwd,
                               .saves = saves_input(0) | kSavesOutput, .overwrites = 0b01};
Var rdiv_scalar(const Operand& x, double s) { return un_s(OpId::rdiv_scalar, x, s); }

// ---- pow_scalar ----  x^p; d/dx = p x^(p-1); saves input
void pow_scalar_cpu(const KernelArgs& k) {
  unary(k, "pow_scalar", pw::PowScalar{k.attrs.scalar});
}
AD_CUDA_ONLY(void pow_scalar_cuda(const KernelArgs& k) { unary_cuda(k, pw::PowScalar{k.attrs.scalar}); })
void pow_scalar_bwd(BackwardArgs& a) {
  double p = a.attrs.scalar;
  if (p == 0.0) return;  // constant
  if (p == 1.0) { a.grad[0] = a.dout; return; }
  if (p == 2.0) { a.grad[0] = mul(a.dout, mul_scalar(a.in[0], 2.0)); return; }
  a.grad[0] = mul(a.dout, mul_scalar(pow_scalar(a.in[0], p - 1.0), p));
}
const OpDef op_def_pow_scalar{.name = "pow_scalar", .args = "x", .arity = 1, .infer = infer_float1,
                              .cpu = pow_scalar_cpu, .cuda = AD_CUDA_FN(pow_scalar_cuda), .backward = pow_scalar_bwd, .saves = saves_input(0), .overwrites = 0b01};
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
AD_CUDA_ONLY(void cast_cuda(const KernelArgs& k) {
  cuda_k::cast(k[0].dtype(), k.out.dtype(), k[0].raw(), k.out.raw(), k.out.numel());
})
void cast_bwd(BackwardArgs& a) { a.grad[0] = cast(a.dout, a.in[0].dtype()); }
const OpDef op_def_cast{.name = "cast", .args = "x", .arity = 1, .infer = infer_cast, .cpu = cast_cpu, .cuda = AD_CUDA_FN(cast_cuda),
                        .backward = cast_bwd};
Var cast(const Operand& x, DType dtype) { Attrs at; at.dtype = dtype; return make_node(OpId::cast, {x}, at); }

}  // namespace ad
