// Tridiagonal ops: the solve (Thomas algorithm) and the resolvent diagonal
// (ratio form of the theta/phi recurrences), for real and complex shifts. Each backward is one node that
// forms all gradients in one pass into one buffer (handed out with part).
// Kernels: src/ops/tridiag_cpu.cpp.
#include <utility>

#include "ad/semiseparable.hpp"
#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/semiseparable_cpu.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
using i64 = std::int64_t;

// t_diag (N), t_upper (N-1), t_lower (N-1): f32/f64, same dtype and device as
// the other inputs; returns N.
i64 check_tridiag(const InferArgs& a) {
  check_float_same(a);
  if (a[0].shape.rank() != 1 || a[0].shape[0] < 1) fail_shapes(a, "t_diag must be (N) with N >= 1");
  i64 N = a[0].shape[0];
  if (a[1].shape != Shape{N - 1} || a[2].shape != Shape{N - 1})
    fail_shapes(a, fmt::format("t_upper and t_lower must be [{}] (N - 1)", N - 1));
  return N;
}
// b (N), or (..., N, M): the systems run along axis rank-2 (axis 0 for rank 1).
struct Split { i64 outer, inner; };
Split split_b(const Shape& b) {
  if (b.rank() == 1) return {1, 1};
  kernels::AxisSplit s = kernels::split_at(b, b.rank() - 2);
  return {s.outer, s.inner};
}
i64 b_len(const Shape& b) { return b.rank() == 1 ? b[0] : b[b.rank() - 2]; }

// On a GPU: y = T^-1 b (trans: T^-T b) with the op's workspace holding the
// elimination coefficients (cp, den), as on the CPU. A bad pivot is found by
// the factor kernel and thrown here with the CPU's message.
AD_CUDA_ONLY(void tridiag_solve_gpu(const char* op, DType t, i64 N, Split s, const void* d, const void* up,
                                    const void* lo, const void* b, void* y, bool trans, void* ws) {
  if (trans) std::swap(up, lo);
  const i64 bytes = N * static_cast<i64>(dtype_size(t));
  semisep::Carve cv{static_cast<char*>(ws)};
  char* cp = cv.take<char>(bytes);
  char* den = cv.take<char>(bytes);
  double p = 0;
  if (i64 row = cuda_k::tridiag_factor(t, N, d, up, lo, cp, den, &p); row >= 0) semisep::fail_pivot(op, p, row, N);
  cuda_k::tridiag_apply(t, N, s.outer, s.inner, lo, cp, den, b, y);
})
}  // namespace

// ---- tridiag_solve ----  (t_diag, t_upper, t_lower, b) -> y = T^-1 b, b (N) or (..., N, M);
// saves t_* and the output
Meta infer_tridiag_solve(const InferArgs& a) {
  i64 N = check_tridiag(a);
  if (a[3].shape.rank() < 1 || b_len(a[3].shape) != N)
    fail_shapes(a, fmt::format("b must be (N) or (..., N, M) with N = {}", N));
  return a[3];
}
void tridiag_solve_cpu(const KernelArgs& k) {
  i64 N = k[0].shape()[0];
  Split s = split_b(k[3].shape());
  kernels::dispatch_float(k.out.dtype(), "tridiag_solve", [&](auto t) {
    using T = decltype(t);
    semisep::tridiag_solve<T>("tridiag_solve", N, s.outer, s.inner, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(),
                              k[3].data<T>(), k.out.data<T>(), false, k.workspace);
  });
}
AD_CUDA_ONLY(void tridiag_solve_cuda(const KernelArgs& k) {
  tridiag_solve_gpu("tridiag_solve", k.out.dtype(), k[0].shape()[0], split_b(k[3].shape()), k[0].raw(), k[1].raw(),
                    k[2].raw(), k[3].raw(), k.out.raw(), false, k.workspace);
})
void tridiag_solve_bwd(BackwardArgs& a) {
  Var buf = make_node(OpId::tridiag_solve_backward, {a.in[0], a.in[1], a.in[2], a.out, a.dout});
  i64 N = a.in[0].shape()[0], nb = a.in[3].numel();
  const i64 off[4] = {nb + 0, nb + N, nb + 2 * N - 1, 0};
  if (a.needs[3]) a.grad[3] = part(buf, 0, a.in[3].shape());
  for (std::size_t i = 0; i < 3; ++i)
    if (a.needs[i]) a.grad[i] = part(buf, off[i], a.in[i].shape());
}
const OpDef op_def_tridiag_solve{
    .name = "tridiag_solve", .args = "t_diag,t_upper,t_lower,b", .arity = 4, .infer = infer_tridiag_solve,
    .cpu = tridiag_solve_cpu, .cuda = AD_CUDA_FN(tridiag_solve_cuda), .backward = tridiag_solve_bwd,
    .saves = kSavesOutput | saves_input(0) | saves_input(1) | saves_input(2),
    .flops = [](const InferArgs& a, const Meta& out) { return 5.0 * static_cast<double>(out.shape.numel() + a[0].shape[0]); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return static_cast<std::int64_t>(semisep::tridiag_ws_bytes(a[0].shape[0], dtype_size(a[0].dtype)));
    }};
Var tridiag_solve(const Operand& t_diag, const Operand& t_upper, const Operand& t_lower, const Operand& b) {
  return make_node(OpId::tridiag_solve, {t_diag, t_upper, t_lower, b});
}

// ---- tridiag_solve_backward ----  (t_diag, t_upper, t_lower, y, dy) -> one buffer
// [db (b's shape), dt_diag (N), dt_upper (N-1), dt_lower (N-1)]: db = T^-T dy, dT = -db y^T on the band
Meta infer_tridiag_solve_backward(const InferArgs& a) {
  i64 N = check_tridiag(a);
  if (b_len(a[3].shape) != N || a[4].shape != a[3].shape) fail_shapes(a, "y and dy must be (N) or (..., N, M)");
  return Meta{Shape{a[3].shape.numel() + 3 * N - 2}, a[0].dtype, a[0].device};
}
void tridiag_solve_backward_cpu(const KernelArgs& k) {
  i64 N = k[0].shape()[0], nb = k[3].numel();
  Split s = split_b(k[3].shape());
  kernels::dispatch_float(k.out.dtype(), "tridiag_solve_backward", [&](auto t) {
    using T = decltype(t);
    T* o = k.out.data<T>();
    semisep::tridiag_solve_backward<T>("tridiag_solve", N, s.outer, s.inner, k[0].data<T>(), k[1].data<T>(),
                                       k[2].data<T>(), k[3].data<T>(), k[4].data<T>(), o, o + nb, o + nb + N,
                                       o + nb + 2 * N - 1, k.workspace);
  });
}
AD_CUDA_ONLY(void tridiag_solve_backward_cuda(const KernelArgs& k) {
  i64 N = k[0].shape()[0], nb = k[3].numel();
  Split s = split_b(k[3].shape());
  DType t = k.out.dtype();
  char* o = static_cast<char*>(k.out.raw());
  const auto es = static_cast<i64>(dtype_size(t));
  // lam = T^-T dy into the db part, then the band's gradients from lam and y
  tridiag_solve_gpu("tridiag_solve", t, N, s, k[0].raw(), k[1].raw(), k[2].raw(), k[4].raw(), o, true, k.workspace);
  cuda_k::tridiag_band_grads(t, N, s.outer, s.inner, o, k[3].raw(), o + nb * es, o + (nb + N) * es,
                             o + (nb + 2 * N - 1) * es);
})
const OpDef op_def_tridiag_solve_backward{
    .name = "tridiag_solve_backward", .args = "t_diag,t_upper,t_lower,y,dy", .arity = 5,
    .infer = infer_tridiag_solve_backward, .cpu = tridiag_solve_backward_cpu,
    .cuda = AD_CUDA_FN(tridiag_solve_backward_cuda),
    .no_grad = "double backward is not supported",
    .flops = [](const InferArgs& a, const Meta&) { return 11.0 * static_cast<double>(a[3].shape.numel() + a[0].shape[0]); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return static_cast<std::int64_t>(semisep::tridiag_ws_bytes(a[0].shape[0], dtype_size(a[0].dtype)));
    }};

// ---- tridiag_resolvent_diag ----  (t_diag, t_upper, t_lower, z) -> diag((T - z I)^-1):
// z () -> (N); z (K) -> (K, N). Ratio recurrences in double: no overflow or
// underflow at any N. Saves the inputs.
Meta infer_tridiag_resolvent_diag(const InferArgs& a) {
  i64 N = check_tridiag(a);
  if (a[3].shape.rank() > 1) fail_shapes(a, "z must be a scalar () or a vector (K) of shifts");
  Shape out = a[3].shape;
  out.push_back(N);
  return Meta{out, a[0].dtype, a[0].device};
}
void tridiag_resolvent_diag_cpu(const KernelArgs& k) {
  i64 N = k[0].shape()[0], K = k[3].numel();
  kernels::dispatch_float(k.out.dtype(), "tridiag_resolvent_diag", [&](auto t) {
    using T = decltype(t);
    semisep::resolvent_diag<T>(N, K, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(), k[3].data<T>(),
                               k.out.data<T>(), k.workspace);
  });
}
AD_CUDA_ONLY(void tridiag_resolvent_diag_cuda(const KernelArgs& k) {
  cuda_k::resolvent_diag(k.out.dtype(), k[0].shape()[0], k[3].numel(), k[0].raw(), k[1].raw(), k[2].raw(),
                         k[3].raw(), k.out.raw(), static_cast<double*>(k.workspace));
})
void tridiag_resolvent_diag_bwd(BackwardArgs& a) {
  Var buf = make_node(OpId::tridiag_resolvent_diag_backward, {a.in[0], a.in[1], a.in[2], a.in[3], a.dout});
  i64 N = a.in[0].shape()[0];
  const i64 off[4] = {0, N, 2 * N - 1, 3 * N - 2};
  for (std::size_t i = 0; i < 4; ++i)
    if (a.needs[i]) a.grad[i] = part(buf, off[i], a.in[i].shape());
}
const OpDef op_def_tridiag_resolvent_diag{
    .name = "tridiag_resolvent_diag", .args = "t_diag,t_upper,t_lower,z", .arity = 4,
    .infer = infer_tridiag_resolvent_diag, .cpu = tridiag_resolvent_diag_cpu,
    .cuda = AD_CUDA_FN(tridiag_resolvent_diag_cuda), .backward = tridiag_resolvent_diag_bwd,
    .saves = saves_input(0) | saves_input(1) | saves_input(2) | saves_input(3),
    .flops = [](const InferArgs&, const Meta& out) { return 10.0 * static_cast<double>(out.shape.numel()); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return static_cast<std::int64_t>(semisep::resolvent_ws_bytes(a[0].shape[0], a[3].shape.numel()));
    }};
Var tridiag_resolvent_diag(const Operand& t_diag, const Operand& t_upper, const Operand& t_lower, const Operand& z) {
  return make_node(OpId::tridiag_resolvent_diag, {t_diag, t_upper, t_lower, z});
}

// ---- tridiag_resolvent_diag_backward ----  (t_diag, t_upper, t_lower, z, dg) -> one buffer
// [dt_diag (N), dt_upper (N-1), dt_lower (N-1), dz (z's shape)]: reverse mode through the recurrences
Meta infer_tridiag_resolvent_diag_backward(const InferArgs& a) {
  i64 N = check_tridiag(a);
  Shape g = a[3].shape;
  g.push_back(N);
  if (a[4].shape != g) fail_shapes(a, "dg must have the resolvent's shape");
  return Meta{Shape{3 * N - 2 + a[3].shape.numel()}, a[0].dtype, a[0].device};
}
void tridiag_resolvent_diag_backward_cpu(const KernelArgs& k) {
  i64 N = k[0].shape()[0], K = k[3].numel();
  kernels::dispatch_float(k.out.dtype(), "tridiag_resolvent_diag_backward", [&](auto t) {
    using T = decltype(t);
    T* o = k.out.data<T>();
    semisep::resolvent_diag_backward<T>(N, K, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(), k[3].data<T>(),
                                        k[4].data<T>(), o, o + N, o + 2 * N - 1, o + 3 * N - 2, k.workspace);
  });
}
AD_CUDA_ONLY(void tridiag_resolvent_diag_backward_cuda(const KernelArgs& k) {
  i64 N = k[0].shape()[0], K = k[3].numel();
  char* o = static_cast<char*>(k.out.raw());
  const auto es = static_cast<i64>(dtype_size(k.out.dtype()));
  cuda_k::resolvent_diag_backward(k.out.dtype(), N, K, k[0].raw(), k[1].raw(), k[2].raw(), k[3].raw(), k[4].raw(), o,
                                  o + N * es, o + (2 * N - 1) * es, o + (3 * N - 2) * es,
                                  static_cast<double*>(k.workspace));
})
const OpDef op_def_tridiag_resolvent_diag_backward{
    .name = "tridiag_resolvent_diag_backward", .args = "t_diag,t_upper,t_lower,z,dg", .arity = 5,
    .infer = infer_tridiag_resolvent_diag_backward, .cpu = tridiag_resolvent_diag_backward_cpu,
    .cuda = AD_CUDA_FN(tridiag_resolvent_diag_backward_cuda),
    .no_grad = "double backward is not supported",
    .flops = [](const InferArgs& a, const Meta&) { return 30.0 * static_cast<double>(a[4].shape.numel()); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return static_cast<std::int64_t>(semisep::resolvent_backward_ws_bytes(a[0].shape[0], a[3].shape.numel()));
    }};

// ---- tridiag_resolvent_diag_complex ----  (t_diag, t_upper, t_lower, z) -> diag((T - z I)^-1), z complex as
// (re, im): z (2) -> (N, 2); z (K, 2) -> (K, N, 2). Complex ratio recurrences in double. Saves the inputs.
namespace {
void check_complex_z(const InferArgs& a) {
  const Shape& z = a[3].shape;
  if ((z.rank() != 1 && z.rank() != 2) || z.back() != 2)
    fail_shapes(a, "z must be (2) or (K, 2): (re, im) of one complex shift or of K shifts");
}
i64 complex_shifts(const Shape& z) { return z.numel() / 2; }
}  // namespace
Meta infer_tridiag_resolvent_diag_complex(const InferArgs& a) {
  i64 N = check_tridiag(a);
  check_complex_z(a);
  Shape out;
  if (a[3].shape.rank() == 2) out.push_back(a[3].shape[0]);
  out.push_back(N);
  out.push_back(2);
  return Meta{out, a[0].dtype, a[0].device};
}
void tridiag_resolvent_diag_complex_cpu(const KernelArgs& k) {
  i64 N = k[0].shape()[0], K = complex_shifts(k[3].shape());
  kernels::dispatch_float(k.out.dtype(), "tridiag_resolvent_diag_complex", [&](auto t) {
    using T = decltype(t);
    semisep::resolvent_diag_complex<T>(N, K, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(), k[3].data<T>(),
                                       k.out.data<T>(), k.workspace);
  });
}
AD_CUDA_ONLY(void tridiag_resolvent_diag_complex_cuda(const KernelArgs& k) {
  cuda_k::resolvent_diag_complex(k.out.dtype(), k[0].shape()[0], complex_shifts(k[3].shape()), k[0].raw(), k[1].raw(),
                                 k[2].raw(), k[3].raw(), k.out.raw(), k.workspace);
})
void tridiag_resolvent_diag_complex_bwd(BackwardArgs& a) {
  Var buf = make_node(OpId::tridiag_resolvent_diag_complex_backward, {a.in[0], a.in[1], a.in[2], a.in[3], a.dout});
  i64 N = a.in[0].shape()[0];
  const i64 off[4] = {0, N, 2 * N - 1, 3 * N - 2};
  for (std::size_t i = 0; i < 4; ++i)
    if (a.needs[i]) a.grad[i] = part(buf, off[i], a.in[i].shape());
}
const OpDef op_def_tridiag_resolvent_diag_complex{
    .name = "tridiag_resolvent_diag_complex", .args = "t_diag,t_upper,t_lower,z", .arity = 4,
    .infer = infer_tridiag_resolvent_diag_complex, .cpu = tridiag_resolvent_diag_complex_cpu,
    .cuda = AD_CUDA_FN(tridiag_resolvent_diag_complex_cuda), .backward = tridiag_resolvent_diag_complex_bwd,
    .saves = saves_input(0) | saves_input(1) | saves_input(2) | saves_input(3),
    .flops = [](const InferArgs&, const Meta& out) { return 20.0 * static_cast<double>(out.shape.numel()); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return static_cast<std::int64_t>(
          semisep::resolvent_complex_ws_bytes(a[0].shape[0], complex_shifts(a[3].shape)));
    }};
Var tridiag_resolvent_diag_complex(const Operand& t_diag, const Operand& t_upper, const Operand& t_lower,
                                   const Operand& z) {
  return make_node(OpId::tridiag_resolvent_diag_complex, {t_diag, t_upper, t_lower, z});
}

// ---- tridiag_resolvent_diag_complex_backward ----  (t_diag, t_upper, t_lower, z, dg) -> one buffer
// [dt_diag (N), dt_upper (N-1), dt_lower (N-1), dz (z's shape: dL/dRe z, dL/dIm z)]
Meta infer_tridiag_resolvent_diag_complex_backward(const InferArgs& a) {
  i64 N = check_tridiag(a);
  check_complex_z(a);
  Shape g;
  if (a[3].shape.rank() == 2) g.push_back(a[3].shape[0]);
  g.push_back(N);
  g.push_back(2);
  if (a[4].shape != g) fail_shapes(a, "dg must have the resolvent's shape");
  return Meta{Shape{3 * N - 2 + a[3].shape.numel()}, a[0].dtype, a[0].device};
}
void tridiag_resolvent_diag_complex_backward_cpu(const KernelArgs& k) {
  i64 N = k[0].shape()[0], K = complex_shifts(k[3].shape());
  kernels::dispatch_float(k.out.dtype(), "tridiag_resolvent_diag_complex_backward", [&](auto t) {
    using T = decltype(t);
    T* o = k.out.data<T>();
    semisep::resolvent_diag_complex_backward<T>(N, K, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(),
                                                k[3].data<T>(), k[4].data<T>(), o, o + N, o + 2 * N - 1,
                                                o + 3 * N - 2, k.workspace);
  });
}
AD_CUDA_ONLY(void tridiag_resolvent_diag_complex_backward_cuda(const KernelArgs& k) {
  i64 N = k[0].shape()[0], K = complex_shifts(k[3].shape());
  char* o = static_cast<char*>(k.out.raw());
  const auto es = static_cast<i64>(dtype_size(k.out.dtype()));
  semisep::Carve cv{static_cast<char*>(k.workspace)};  // the CPU's layout
  semisep::Cplx* cw = cv.take<semisep::Cplx>(3 * N * K);
  double* ew = cv.take<double>(2 * N * K);
  cuda_k::resolvent_diag_complex_backward(k.out.dtype(), N, K, k[0].raw(), k[1].raw(), k[2].raw(), k[3].raw(),
                                          k[4].raw(), o, o + N * es, o + (2 * N - 1) * es, o + (3 * N - 2) * es, cw,
                                          ew);
})
const OpDef op_def_tridiag_resolvent_diag_complex_backward{
    .name = "tridiag_resolvent_diag_complex_backward", .args = "t_diag,t_upper,t_lower,z,dg", .arity = 5,
    .infer = infer_tridiag_resolvent_diag_complex_backward, .cpu = tridiag_resolvent_diag_complex_backward_cpu,
    .cuda = AD_CUDA_FN(tridiag_resolvent_diag_complex_backward_cuda),
    .no_grad = "double backward is not supported",
    .flops = [](const InferArgs& a, const Meta&) { return 60.0 * static_cast<double>(a[4].shape.numel()); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return static_cast<std::int64_t>(
          semisep::resolvent_complex_backward_ws_bytes(a[0].shape[0], complex_shifts(a[3].shape)));
    }};

}  // namespace ad
