// Elementwise binary ops (arithmetic, extrema, comparisons) and the
// three-operand select `where`, with numpy broadcasting. Gradients are
// summed back to each input's shape with sum_to.
#include <cmath>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/pointwise.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
// [2,1,4] op [3,1] -> [2,3,4]
Meta infer_broadcast(const InferArgs& a) {
  check_float_same(a);
  Meta m = a[0];
  if (!broadcast_shapes(a[0].shape, a[1].shape, m.shape)) fail_shapes(a, "shapes do not broadcast");
  return m;
}
template <class Fn> void binary(const KernelArgs& k, const char* op, Fn fn) {
  kernels::dispatch_float(k.out.dtype(), op, [&](auto t) {
    using T = decltype(t);
    kernels::broadcast2(k[0].data<T>(), k[0].shape(), k[1].data<T>(), k[1].shape(), k.out.data<T>(), k.out.shape(),
                        [&](T x, T y) { return fn(x, y); });
  });
}
AD_CUDA_ONLY(template <class F> void binary_cuda(const KernelArgs& k, F f) {
  cuda_k::broadcast2(k.out.dtype(), k[0].raw(), k[0].shape(), k[1].raw(), k[1].shape(), k.out.raw(), k.out.shape(), f);
})
// d/d(input) summed over the dims the input was broadcast along
Var unbroadcast(const Var& g, const Var& like) { return g.shape() == like.shape() ? g : sum_to(g, like.shape()); }
}  // namespace

// ---- add ----  d/da = d/db = 1
void add_cpu(const KernelArgs& k) { binary(k, "add", pw::Add{}); }
AD_CUDA_ONLY(void add_cuda(const KernelArgs& k) { binary_cuda(k, pw::Add{}); })
void add_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = unbroadcast(a.dout, a.in[0]);
  if (a.needs[1]) a.grad[1] = unbroadcast(a.dout, a.in[1]);
}
const OpDef op_def_add{.name = "add", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = add_cpu, .cuda = AD_CUDA_FN(add_cuda),
                       .backward = add_bwd, .overwrites = 0b11};
Var add(const Operand& a, const Operand& b) { return make_node(OpId::add, {a, b}); }

// ---- sub ----  d/da = 1, d/db = -1
void sub_cpu(const KernelArgs& k) { binary(k, "sub", pw::Sub{}); }
AD_CUDA_ONLY(void sub_cuda(const KernelArgs& k) { binary_cuda(k, pw::Sub{}); })
void sub_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = unbroadcast(a.dout, a.in[0]);
  if (a.needs[1]) a.grad[1] = unbroadcast(neg(a.dout), a.in[1]);
}
const OpDef op_def_sub{.name = "sub", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = sub_cpu, .cuda = AD_CUDA_FN(sub_cuda),
                       .backward = sub_bwd, .overwrites = 0b11};
Var sub(const Operand& a, const Operand& b) { return make_node(OpId::sub, {a, b}); }

// ---- mul ----  d/da = b, d/db = a; saves both inputs
void mul_cpu(const KernelArgs& k) { binary(k, "mul", pw::Mul{}); }
AD_CUDA_ONLY(void mul_cuda(const KernelArgs& k) { binary_cuda(k, pw::Mul{}); })
void mul_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = unbroadcast(mul(a.dout, a.in[1]), a.in[0]);
  if (a.needs[1]) a.grad[1] = unbroadcast(mul(a.dout, a.in[0]), a.in[1]);
}
const OpDef op_def_mul{.name = "mul", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = mul_cpu, .cuda = AD_CUDA_FN(mul_cuda),
                       .backward = mul_bwd, .saves = saves_input(0) | saves_input(1), .overwrites = 0b11};
Var mul(const Operand& a, const Operand& b) { return make_node(OpId::mul, {a, b}); }

// ---- div ----  y = a/b; d/da = 1/b, d/db = -y/b; saves b and output
void div_cpu(const KernelArgs& k) { binary(k, "div", pw::Div{}); }
AD_CUDA_ONLY(void div_cuda(const KernelArgs& k) { binary_cuda(k, pw::Div{}); })
void div_bwd(BackwardArgs& a) {
  if (a.needs[0]) a.grad[0] = unbroadcast(div(a.dout, a.in[1]), a.in[0]);
  if (a.needs[1]) a.grad[1] = unbroadcast(neg(div(mul(a.dout, a.out), a.in[1])), a.in[1]);
}
const OpDef op_def_div{.name = "div", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = div_cpu, .cuda = AD_CUDA_FN(div_cuda),
                       .backward = div_bwd, .saves = saves_input(1) | kSavesOutput, .overwrites = 0b11};
Var div(const Operand& a, const Operand& b) { return make_node(OpId::div, {a, b}); }

// ---- pow ----  y = a^b; d/da = b a^(b-1) (0 where b = 0), d/db = y log a (defined for a > 0)
void pow_cpu(const KernelArgs& k) { binary(k, "pow", pw::Pow{}); }
AD_CUDA_ONLY(void pow_cuda(const KernelArgs& k) { binary_cuda(k, pw::Pow{}); })
void pow_bwd(BackwardArgs& a) {
  // d/da = b a^(b - sign|b|): the exponent is b - 1, except 0 where b = 0, so that a = 0, b = 0 gives
  // 0 a^0 = 0 rather than 0 * inf = NaN
  if (a.needs[0])
    a.grad[0] = unbroadcast(mul(a.dout, mul(a.in[1], pow(a.in[0], sub(a.in[1], sign(abs(a.in[1])))))), a.in[0]);
  if (a.needs[1]) a.grad[1] = unbroadcast(mul(a.dout, mul(a.out, log(a.in[0]))), a.in[1]);
}
const OpDef op_def_pow{.name = "pow", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = pow_cpu, .cuda = AD_CUDA_FN(pow_cuda),
                       .backward = pow_bwd, .saves = saves_input(0) | saves_input(1) | kSavesOutput, .overwrites = 0b11};
Var pow(const Operand& a, const Operand& b) { return make_node(OpId::pow, {a, b}); }

// ---- maximum / minimum ----  the gradient goes to the larger (smaller)
// operand, half to each on a tie; NaN in either gives NaN, and NaN gradients.
void maximum_cpu(const KernelArgs& k) { binary(k, "maximum", pw::Maximum{}); }
AD_CUDA_ONLY(void maximum_cuda(const KernelArgs& k) { binary_cuda(k, pw::Maximum{}); })
void minimum_cpu(const KernelArgs& k) { binary(k, "minimum", pw::Minimum{}); }
AD_CUDA_ONLY(void minimum_cuda(const KernelArgs& k) { binary_cuda(k, pw::Minimum{}); })
namespace {
Var maximum_backward(const Var& a, const Var& b) { return make_node(OpId::maximum_backward, {a, b}); }
}  // namespace
// maximum: a's share is share(a, b), b's share(b, a); minimum the other way round
void extremum_bwd(BackwardArgs& a, bool is_max) {
  const Var &x = a.in[0], &y = a.in[1];
  if (a.needs[0]) a.grad[0] = unbroadcast(mul(a.dout, is_max ? maximum_backward(x, y) : maximum_backward(y, x)), x);
  if (a.needs[1]) a.grad[1] = unbroadcast(mul(a.dout, is_max ? maximum_backward(y, x) : maximum_backward(x, y)), y);
}
void maximum_bwd(BackwardArgs& a) { extremum_bwd(a, true); }
void minimum_bwd(BackwardArgs& a) { extremum_bwd(a, false); }
const OpDef op_def_maximum{.name = "maximum", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = maximum_cpu,
                           .cuda = AD_CUDA_FN(maximum_cuda), .backward = maximum_bwd,
                           .saves = saves_input(0) | saves_input(1), .overwrites = 0b11};
const OpDef op_def_minimum{.name = "minimum", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = minimum_cpu,
                           .cuda = AD_CUDA_FN(minimum_cuda), .backward = minimum_bwd,
                           .saves = saves_input(0) | saves_input(1), .overwrites = 0b11};
Var maximum(const Operand& a, const Operand& b) { return make_node(OpId::maximum, {a, b}); }
Var minimum(const Operand& a, const Operand& b) { return make_node(OpId::minimum, {a, b}); }
// maximum's backward: the share of its gradient that goes to a: 1 where
// a > b, 1/2 where a == b, 0 where a < b (NaN where either is)
void maximum_backward_cpu(const KernelArgs& k) { binary(k, "maximum_backward", pw::MaximumBackward{}); }
AD_CUDA_ONLY(void maximum_backward_cuda(const KernelArgs& k) { binary_cuda(k, pw::MaximumBackward{}); })
const OpDef op_def_maximum_backward{.name = "maximum_backward", .args = "a,b", .arity = 2, .infer = infer_broadcast,
                                 .cpu = maximum_backward_cpu, .cuda = AD_CUDA_FN(maximum_backward_cuda),
                                 .no_grad = "double backward is not supported", .overwrites = 0b11};

// ---- greater, greater_equal, less, less_equal, equal, not_equal ----
// 1 where a op b holds, else 0, in the operands' dtype (IEEE: a NaN compares
// false, except for not_equal; -0 == 0). Piecewise constant: the gradient is
// zero wherever it is defined, so the rule gives none and backward() does not
// reach a Parameter through them (zero_grad_inputs); saves nothing.
void compare_bwd(BackwardArgs&) {}  // zero gradient for a and b
void greater_cpu(const KernelArgs& k) { binary(k, "greater", pw::Greater{}); }
AD_CUDA_ONLY(void greater_cuda(const KernelArgs& k) { binary_cuda(k, pw::Greater{}); })
const OpDef op_def_greater{.name = "greater", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = greater_cpu,
                           .cuda = AD_CUDA_FN(greater_cuda), .backward = compare_bwd, .overwrites = 0b11,
                           .zero_grad_inputs = 0b11};
Var greater(const Operand& a, const Operand& b) { return make_node(OpId::greater, {a, b}); }

void greater_equal_cpu(const KernelArgs& k) { binary(k, "greater_equal", pw::GreaterEqual{}); }
AD_CUDA_ONLY(void greater_equal_cuda(const KernelArgs& k) { binary_cuda(k, pw::GreaterEqual{}); })
const OpDef op_def_greater_equal{.name = "greater_equal", .args = "a,b", .arity = 2, .infer = infer_broadcast,
                                 .cpu = greater_equal_cpu, .cuda = AD_CUDA_FN(greater_equal_cuda),
                                 .backward = compare_bwd, .overwrites = 0b11, .zero_grad_inputs = 0b11};
Var greater_equal(const Operand& a, const Operand& b) { return make_node(OpId::greater_equal, {a, b}); }

void less_cpu(const KernelArgs& k) { binary(k, "less", pw::Less{}); }
AD_CUDA_ONLY(void less_cuda(const KernelArgs& k) { binary_cuda(k, pw::Less{}); })
const OpDef op_def_less{.name = "less", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = less_cpu,
                        .cuda = AD_CUDA_FN(less_cuda), .backward = compare_bwd, .overwrites = 0b11,
                        .zero_grad_inputs = 0b11};
Var less(const Operand& a, const Operand& b) { return make_node(OpId::less, {a, b}); }

void less_equal_cpu(const KernelArgs& k) { binary(k, "less_equal", pw::LessEqual{}); }
AD_CUDA_ONLY(void less_equal_cuda(const KernelArgs& k) { binary_cuda(k, pw::LessEqual{}); })
const OpDef op_def_less_equal{.name = "less_equal", .args = "a,b", .arity = 2, .infer = infer_broadcast,
                              .cpu = less_equal_cpu, .cuda = AD_CUDA_FN(less_equal_cuda), .backward = compare_bwd,
                              .overwrites = 0b11, .zero_grad_inputs = 0b11};
Var less_equal(const Operand& a, const Operand& b) { return make_node(OpId::less_equal, {a, b}); }

void equal_cpu(const KernelArgs& k) { binary(k, "equal", pw::Equal{}); }
AD_CUDA_ONLY(void equal_cuda(const KernelArgs& k) { binary_cuda(k, pw::Equal{}); })
const OpDef op_def_equal{.name = "equal", .args = "a,b", .arity = 2, .infer = infer_broadcast, .cpu = equal_cpu,
                         .cuda = AD_CUDA_FN(equal_cuda), .backward = compare_bwd, .overwrites = 0b11,
                         .zero_grad_inputs = 0b11};
Var equal(const Operand& a, const Operand& b) { return make_node(OpId::equal, {a, b}); }

void not_equal_cpu(const KernelArgs& k) { binary(k, "not_equal", pw::NotEqual{}); }
AD_CUDA_ONLY(void not_equal_cuda(const KernelArgs& k) { binary_cuda(k, pw::NotEqual{}); })
const OpDef op_def_not_equal{.name = "not_equal", .args = "a,b", .arity = 2, .infer = infer_broadcast,
                             .cpu = not_equal_cpu, .cuda = AD_CUDA_FN(not_equal_cuda), .backward = compare_bwd,
                             .overwrites = 0b11, .zero_grad_inputs = 0b11};
Var not_equal(const Operand& a, const Operand& b) { return make_node(OpId::not_equal, {a, b}); }

// ---- where ----  cond != 0 (NaN included) ? a : b, cond, a and b broadcast
// together: [3,1] , [2,3,4] , [4] -> [2,3,4]. A select, not a blend: the
// operand not taken never reaches the output, nor its gradient.
// d/da = sum_to(where(cond, dout, 0)), d/db = sum_to(where(cond, 0, dout)),
// none for cond (piecewise constant in it); saves cond only.
Meta infer_where(const InferArgs& a) {
  check_float_same(a);
  Meta m = a[0];
  Shape ab;
  if (!broadcast_shapes(a[1].shape, a[2].shape, ab) || !broadcast_shapes(a[0].shape, ab, m.shape))
    fail_shapes(a, "shapes do not broadcast");
  return m;
}
void where_cpu(const KernelArgs& k) {
  kernels::dispatch_float(k.out.dtype(), "where", [&](auto t) {
    using T = decltype(t);
    kernels::broadcast3(k[0].data<T>(), k[0].shape(), k[1].data<T>(), k[1].shape(), k[2].data<T>(), k[2].shape(),
                        k.out.data<T>(), k.out.shape(), pw::Where{});
  });
}
AD_CUDA_ONLY(void where_cuda(const KernelArgs& k) {
  cuda_k::broadcast3(k.out.dtype(), k[0].raw(), k[0].shape(), k[1].raw(), k[1].shape(), k[2].raw(), k[2].shape(),
                     k.out.raw(), k.out.shape(), pw::Where{});
})
void where_bwd(BackwardArgs& a) {
  const Var zero = full(a.dout, {}, 0.0, a.dout.dtype());  // rank 0: broadcasts
  if (a.needs[1]) a.grad[1] = unbroadcast(where(a.in[0], a.dout, zero), a.in[1]);
  if (a.needs[2]) a.grad[2] = unbroadcast(where(a.in[0], zero, a.dout), a.in[2]);
}
const OpDef op_def_where{.name = "where", .args = "cond,a,b", .arity = 3, .infer = infer_where, .cpu = where_cpu,
                         .cuda = AD_CUDA_FN(where_cuda), .backward = where_bwd, .saves = saves_input(0),
                         .overwrites = 0b111, .zero_grad_inputs = 0b001};
Var where(const Operand& cond, const Operand& a, const Operand& b) { return make_node(OpId::where, {cond, a, b}); }
namespace {
// The scalar operand `value` of where(cond, x, value) / where(cond, value, x)
// as a rank-0 constant of x's dtype, in the graph of x (or cond).
Var where_scalar(const Operand& cond, const Operand& x, const char* x_name, double value) {
  const Var& like = x.var().defined() ? x.var() : cond.var();
  if (!like.defined())
    throw Error(fmt::format("where: neither cond nor {} is a Var of a graph (each is a Parameter or undefined), so "
                            "no graph is known for the scalar {}; place a Parameter in a graph with g.param(p)",
                            x_name, value));
  auto dtype_of = [](const Operand& o) {
    return o.param() ? o.param()->value.dtype() : o.var().defined() ? o.var().dtype() : DType::f32;
  };
  // x's dtype; else cond's or f32, so that where's own check names x and its dtype
  DType t = dtype_of(x);
  if (!is_compute_float(t)) t = dtype_of(cond);
  if (!is_compute_float(t)) t = DType::f32;
  return full(like, {}, value, t);
}
}  // namespace
Var where(const Operand& cond, const Operand& a, double b) { return where(cond, a, where_scalar(cond, a, "a", b)); }

// a comparison with a number: the number as a rank-0 constant of a's dtype
namespace {
Var compare_scalar(const char* op, const Operand& a, double b) {
  const Shape as = operand_shape(op, a);
  if (!a.var().defined())
    throw Error(fmt::format("{}: a is a Parameter {}, so no graph is known for the number {}; place it in a graph "
                            "with g.param(p)",
                            op, as.str(), b));
  return full(a.var(), {}, b, a.var().dtype());
}
}  // namespace
Var greater(const Operand& a, double b) { return greater(a, compare_scalar("greater", a, b)); }
Var greater_equal(const Operand& a, double b) { return greater_equal(a, compare_scalar("greater_equal", a, b)); }
Var less(const Operand& a, double b) { return less(a, compare_scalar("less", a, b)); }
Var less_equal(const Operand& a, double b) { return less_equal(a, compare_scalar("less_equal", a, b)); }
Var equal(const Operand& a, double b) { return equal(a, compare_scalar("equal", a, b)); }
Var not_equal(const Operand& a, double b) { return not_equal(a, compare_scalar("not_equal", a, b)); }
Var where(const Operand& cond, double a, const Operand& b) { return where(cond, where_scalar(cond, b, "b", a), b); }

}  // namespace ad
