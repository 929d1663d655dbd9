// Semiseparable matrices H = T + U V^T (T tridiagonal, U and V of rank r) as
// graph ops: the matvec (optionally causal) and the Woodbury solve. Each
// backward is one node that forms the gradients of all wanted inputs in one
// pass into one buffer; the backward rule hands them out with ad::part.
// Kernels: src/ops/semiseparable_cpu.cpp; CUDA: src/cuda/semiseparable.cu.
#include "ad/semiseparable.hpp"
#include "ad/ops.hpp"

#include <array>
#include <algorithm>
#include <atomic>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "cuda/semisep_plan.hpp"
#include "ops/semiseparable_cpu.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace semisep {
namespace {
std::atomic<int> g_gpu_matvec_variant{0};
}  // namespace
int set_gpu_matvec_variant(int v) {
  if (v < 0 || v > 10)
    throw Error(fmt::format("semisep::set_gpu_matvec_variant: variant {} is not one of 0 .. 10", v));
  return g_gpu_matvec_variant.exchange(v);
}
int gpu_matvec_variant() { return g_gpu_matvec_variant.load(); }
}  // namespace semisep

namespace {
using i64 = std::int64_t;

struct SemisepShape { i64 B, N, D, r; };
bool low_precision(DType t) { return t == DType::bf16 || t == DType::f16; }

// x (B, N, D), t_diag (N), t_upper (N-1), t_lower (N-1), u (N, r), v (N, r).
// u and v share a dtype: x's, or bf16/f16 when x is f32 and allow_low.
// `n` inputs are checked (the rest are the caller's).
SemisepShape check_semisep(const InferArgs& a, bool allow_low, std::size_t n = 6) {
  if (a.in.size() < n) fail_shapes(a, fmt::format("expects at least {} inputs, got {}", n, a.in.size()));
  const Meta& x = a[0];
  if (!is_compute_float(x.dtype)) fail_shapes(a, fmt::format("x must be f32 or f64, got {}", dtype_name(x.dtype)));
  for (std::size_t i = 1; i <= 3; ++i)
    if (a[i].dtype != x.dtype) fail_shapes(a, "dtype mismatch: t_diag, t_upper and t_lower must have x's dtype");
  DType uv = a[4].dtype;
  if (a[5].dtype != uv) fail_shapes(a, "dtype mismatch: u and v must share a dtype");
  if (uv != x.dtype && !(allow_low && x.dtype == DType::f32 && low_precision(uv)))
    fail_shapes(a, allow_low ? "dtype mismatch: u and v must have x's dtype, or be bf16/f16 when x is f32"
                             : "dtype mismatch: u and v must have x's dtype");
  if (x.shape.rank() != 3) fail_shapes(a, "x must be (B, N, D)");
  i64 N = x.shape[1];
  if (N < 1) fail_shapes(a, "the sequence length N = x.shape[1] must be >= 1");
  if (a[1].shape != Shape{N}) fail_shapes(a, fmt::format("t_diag must be [{}] (N)", N));
  if (a[2].shape != Shape{N - 1} || a[3].shape != Shape{N - 1})
    fail_shapes(a, fmt::format("t_upper and t_lower must be [{}] (N - 1)", N - 1));
  if (a[4].shape.rank() != 2 || a[4].shape[0] != N || a[5].shape != a[4].shape)
    fail_shapes(a, fmt::format("u and v must both be (N, r) with N = {}", N));
  return {x.shape[0], N, x.shape[2], a[4].shape[1]};
}
semisep::Dims dims_of(const Shape& x, i64 r, const Attrs& at) {
  return semisep::make_dims(x[0], x[1], x[2], r, at.start);
}
// The optional input W = V^T x (B, r, D) at index `i`, from semiseparable_sums.
void check_w(const InferArgs& a, const SemisepShape& s, std::size_t i) {
  if (a.in.size() > i + 1) fail_shapes(a, fmt::format("expects at most {} inputs, got {}", i + 1, a.in.size()));
  if (a.in.size() == i + 1 &&
      (a[i].shape != Shape{s.B, s.r, s.D} || a[i].dtype != a[0].dtype || !(a[i].device == a[0].device)))
    fail_shapes(a, fmt::format("w must be V^T x: ({}, {}, {}) in x's dtype and device", s.B, s.r, s.D));
}

// Calls f(T{}, UV{}) for x's compute type and u's storage type.
template <class F> void dispatch_uv(DType x, DType uv, const char* op, F&& f) {
  if (x == DType::f64) return f(double{}, double{});
  if (x != DType::f32) kernel_fail(op, fmt::format("no CPU kernel for dtype {}", dtype_name(x)));
  switch (uv) {
    case DType::f32: return f(float{}, float{});
    case DType::bf16: return f(float{}, semisep::Bf16{});
    case DType::f16: return f(float{}, semisep::F16{});
    default: kernel_fail(op, fmt::format("no CPU kernel for u, v of dtype {}", dtype_name(uv)));
  }
}

// The gradient buffer of the matvec backward: the wanted parts (bit i of
// `mask` = input i) in input order: dx (B,N,D), dd (N), dup, dlo (N-1), du, dv (N,r).
std::array<i64, 7> grad_offsets(int mask, const std::array<i64, 6>& sizes) {
  std::array<i64, 7> off{};
  i64 at = 0;
  for (int i = 0; i < 6; ++i) {
    off[static_cast<std::size_t>(i)] = (mask >> i) & 1 ? at : -1;
    if ((mask >> i) & 1) at += sizes[static_cast<std::size_t>(i)];
  }
  off[6] = at;
  return off;
}
std::array<i64, 6> grad_sizes(i64 B, i64 N, i64 D, i64 r) { return {B * N * D, N, N - 1, N - 1, N * r, N * r}; }

// On a GPU: f32/f64 with u, v in x's dtype (bf16/f16 U, V run on the CPU only).
AD_CUDA_ONLY(cuda_k::SemisepDims gpu_dims(const char* op, const KernelArgs& k) {
  if (k[4].dtype() != k[0].dtype())
    kernel_fail(op, fmt::format("no CUDA kernel for u, v of dtype {} with x {} (bf16/f16 U, V run on the CPU only)",
                                dtype_name(k[4].dtype()), dtype_name(k[0].dtype())));
  semisep::Dims dm = dims_of(k[0].shape(), k[4].shape()[1], k.attrs);
  return {dm.B, dm.N, dm.D, dm.r, dm.L};
})
}  // namespace

// ---- semiseparable_sums ----  (x (B,N,D), v (N,r)) -> W (B,r,D), W[b] = V^T x[b]: the
// first pass of the full matvec as its own small node (see semiseparable_matvec,
// which forms the gradients through W itself and gives W none). Its own backward
// (dx = V dW, dv = sum_b x[b] dW[b]^T, from core ops) serves any other reader.
Meta infer_semiseparable_sums(const InferArgs& a) {
  const Meta &x = a[0], &v = a[1];
  if (!is_compute_float(x.dtype)) fail_shapes(a, fmt::format("x must be f32 or f64, got {}", dtype_name(x.dtype)));
  if (v.dtype != x.dtype && !(x.dtype == DType::f32 && low_precision(v.dtype)))
    fail_shapes(a, "dtype mismatch: v must have x's dtype, or be bf16/f16 when x is f32");
  if (x.shape.rank() != 3 || v.shape.rank() != 2 || v.shape[0] != x.shape[1])
    fail_shapes(a, "expects x (B, N, D) and v (N, r)");
  if (x.shape[1] < 1) fail_shapes(a, "the sequence length N = x.shape[1] must be >= 1");
  return Meta{Shape{x.shape[0], v.shape[1], x.shape[2]}, x.dtype, x.device};
}
void semiseparable_sums_cpu(const KernelArgs& k) {
  semisep::Dims dm = dims_of(k[0].shape(), k[1].shape()[1], k.attrs);
  dispatch_uv(k[0].dtype(), k[1].dtype(), "semiseparable_sums", [&](auto t, auto uvt) {
    using T = decltype(t);
    using UV = decltype(uvt);
    semisep::sums<T, UV>(dm, k[0].data<T>(), static_cast<const UV*>(k[1].raw()), k.out.data<T>(), k.workspace);
  });
}
// On a GPU (the builder does not split the product there; this serves the op
// table's rule that every op runs on both): one batched GEMM, V shared by every b.
AD_CUDA_ONLY(void semiseparable_sums_cuda(const KernelArgs& k) {
  if (k[1].dtype() != k[0].dtype())
    kernel_fail("semiseparable_sums", fmt::format("no CUDA kernel for v of dtype {} with x {} (bf16/f16 V runs on the "
                                                  "CPU only)", dtype_name(k[1].dtype()), dtype_name(k[0].dtype())));
  const Shape& xs = k[0].shape();
  const i64 B = xs[0], N = xs[1], D = xs[2], r = k[1].shape()[1];
  if (B * r * D == 0) return;
  cuda_k::gemm(k[0].dtype(), true, false, B, r, D, N, k[1].raw(), 0, k[0].raw(), N * D, k.out.raw(), r * D);
})
void semiseparable_sums_bwd(BackwardArgs& a) {
  const Var &x = a.in[0], &v = a.in[1];
  if (a.needs[0]) a.grad[0] = matmul(v.dtype() == x.dtype() ? v : cast(v, x.dtype()), a.dout);
  if (a.needs[1]) {
    Var g = sum_to(matmul(x, a.dout, false, true), v.shape());
    a.grad[1] = v.dtype() == g.dtype() ? g : cast(g, v.dtype());
  }
}
const OpDef op_def_semiseparable_sums{
    .name = "semiseparable_sums", .args = "x,v", .arity = 2, .infer = infer_semiseparable_sums,
    .cpu = semiseparable_sums_cpu, .cuda = AD_CUDA_FN(semiseparable_sums_cuda), .backward = semiseparable_sums_bwd,
    .saves = saves_input(0) | saves_input(1),
    .flops = [](const InferArgs& a, const Meta&) {
      return 2.0 * static_cast<double>(a[0].shape.numel()) * static_cast<double>(a[1].shape[1]);
    },
    .workspace = [](const InferArgs& a, const Meta& out) {
      if (out.device.kind == DeviceKind::cuda) return std::int64_t{0};
      return static_cast<std::int64_t>(
          semisep::sums_ws_bytes(dims_of(a[0].shape, a[1].shape[1], a.attrs), dtype_size(a[0].dtype)));
    }};

// ---- semiseparable_matvec ----  x (B,N,D) -> y (B,N,D), y[b] = (T + U V^T) x[b];
// causal: y_i = lo_{i-1} x_{i-1} + d_i x_i + sum_{j<=i} (u_i . v_j) x_j. Saves all inputs.
// Full (not causal) on the CPU, the builder passes a 7th input, W = V^T x from
// a semiseparable_sums node: the forward then reads x once more (y = T x + U W)
// and the backward reads W instead of forming it again from x and v.
Meta infer_semiseparable_matvec(const InferArgs& a) {
  check_w(a, check_semisep(a, true), 6);
  return a[0];
}
void semiseparable_matvec_cpu(const KernelArgs& k) {
  semisep::Dims dm = dims_of(k[0].shape(), k[4].shape()[1], k.attrs);
  dispatch_uv(k[0].dtype(), k[4].dtype(), "semiseparable_matvec", [&](auto t, auto uvt) {
    using T = decltype(t);
    using UV = decltype(uvt);
    semisep::matvec<T, UV>(dm, k.attrs.causal, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(), k[3].data<T>(),
                           static_cast<const UV*>(k[4].raw()), static_cast<const UV*>(k[5].raw()),
                           k.in.size() > 6 ? k[6].data<T>() : nullptr, k.out.data<T>(), k.workspace);
  });
}
AD_CUDA_ONLY(void semiseparable_matvec_cuda(const KernelArgs& k) {
  cuda_k::SemisepDims dm = gpu_dims("semiseparable_matvec", k);
  cuda_k::semisep_matvec(k[0].dtype(), dm, k.attrs.causal, k[0].raw(), k[1].raw(), k[2].raw(), k[3].raw(), k[4].raw(),
                         k[5].raw(), k.out.raw(), k.workspace, semisep::gpu_matvec_variant());
})
double semiseparable_matvec_flops(const InferArgs& a, const Meta& out) {
  double r = static_cast<double>(a[4].shape[1]);
  return static_cast<double>(out.shape.numel()) * ((a.attrs.causal ? 6 : a.in.size() > 6 ? 2 : 4) * r + 5);
}
// On a GPU the causal f32 product may run in one pass (src/cuda/semiseparable.cu), whose
// look-back over chunks takes flags and two r x D doubles a chunk (at most a quarter of x's size).
std::int64_t semiseparable_matvec_ws(const InferArgs& a, const Meta& out) {
  const semisep::Dims dm = dims_of(a[0].shape, a[4].shape[1], a.attrs);
  auto ws = static_cast<std::int64_t>(semisep::matvec_ws_bytes(dm, dtype_size(a[0].dtype)));
  if (out.device.kind == DeviceKind::cuda && a.attrs.causal && a[0].dtype == DType::f32) {
    ws = std::max(ws, cuda_k::semisep_plan::staged_scan_ws_bytes(dm.B, dm.N, dm.D, dm.r));
  }
  return ws;
}
void semiseparable_matvec_bwd(BackwardArgs& a) {
  int mask = 0;
  for (int i = 0; i < 6; ++i) mask |= a.needs[static_cast<std::size_t>(i)] ? 1 << i : 0;
  if (!mask) return;
  Attrs at = a.attrs;
  at.which = mask;
  // W (input 6, when given) gets no gradient of its own: this node's dx and dv
  // already hold the part that flows through W = V^T x. That holds only for the
  // W of this very x and v.
  if (a.in.size() > 6) {
    const Node& w = a.in[6].graph()->node(a.in[6].id());
    if (w.op != OpId::semiseparable_sums || w.inputs.size() != 2 || w.inputs[0] != a.in[0].id() ||
        w.inputs[1] != a.in[5].id())
      throw Error(fmt::format("semiseparable_matvec: input w ({}) must be semiseparable_sums(x, v) of this node's x and "
                              "v: the backward forms the gradient through W = V^T x itself",
                              describe(w.meta)));
  }
  Var buf = a.in.size() > 6 ? make_node(OpId::semiseparable_matvec_backward,
                                        {a.in[0], a.in[1], a.in[2], a.in[3], a.in[4], a.in[5], a.dout, a.in[6]}, at)
                            : make_node(OpId::semiseparable_matvec_backward,
                                        {a.in[0], a.in[1], a.in[2], a.in[3], a.in[4], a.in[5], a.dout}, at);
  const Shape& x = a.in[0].shape();
  auto off = grad_offsets(mask, grad_sizes(x[0], x[1], x[2], a.in[4].shape()[1]));
  for (std::size_t i = 0; i < 6; ++i) {
    if (off[i] < 0) continue;
    Var g = part(buf, off[i], a.in[i].shape());
    a.grad[i] = a.in[i].dtype() == g.dtype() ? g : cast(g, a.in[i].dtype());  // bf16/f16 u, v
  }
}
const OpDef op_def_semiseparable_matvec{
    .name = "semiseparable_matvec", .args = "x,t_diag,t_upper,t_lower,u,v,w", .arity = -1,
    .infer = infer_semiseparable_matvec, .cpu = semiseparable_matvec_cpu,
    .cuda = AD_CUDA_FN(semiseparable_matvec_cuda), .backward = semiseparable_matvec_bwd,
    .saves = saves_input(0) | saves_input(1) | saves_input(2) | saves_input(3) | saves_input(4) | saves_input(5) |
             saves_input(6),
    .flops = semiseparable_matvec_flops, .workspace = semiseparable_matvec_ws};
Var semiseparable_matvec(const Operand& x, const Operand& t_diag, const Operand& t_upper, const Operand& t_lower,
                         const Operand& u, const Operand& v, bool causal) {
  Attrs at;
  at.causal = causal;
  Var y = make_node(OpId::semiseparable_matvec, {x, t_diag, t_upper, t_lower, u, v}, at);
  // Full, on the CPU: W = V^T x as its own node (B r D values) that the
  // backward reads, so it makes one pass over x and v fewer. (The CUDA kernels
  // form W themselves; the node above has then checked every input.)
  GraphImpl* const g = y.graph();
  const Node& n = g->node(y.id());
  if (causal || n.meta.device.kind != DeviceKind::cpu) return y;
  // the inputs as placed in y's graph (a Parameter operand has its node there
  // now; x and v both Parameters would leave the sums node no graph to go in)
  std::vector<Operand> in;
  for (std::int32_t id : n.inputs) in.emplace_back(Var(g, id));
  g->drop_last(y.id());
  Var w = make_node(OpId::semiseparable_sums, {in[0], in[5]}, at);
  return make_node(OpId::semiseparable_matvec, {in[0], in[1], in[2], in[3], in[4], in[5], w}, at);
}

// ---- semiseparable_matvec_backward ----  (x, t_diag, t_upper, t_lower, u, v, dy (, w)) -> one
// flat buffer holding the gradients selected by attrs.which (bit i = input i), in input order.
Meta infer_semiseparable_matvec_backward(const InferArgs& a) {
  SemisepShape s = check_semisep(a, true);
  if (a.in.size() < 7 || a[6].shape != a[0].shape || a[6].dtype != a[0].dtype || !(a[6].device == a[0].device))
    fail_shapes(a, "dy must match x");
  check_w(a, s, 7);
  auto off = grad_offsets(a.attrs.which, grad_sizes(s.B, s.N, s.D, s.r));
  return Meta{Shape{off[6]}, a[0].dtype, a[0].device};
}
void semiseparable_matvec_backward_cpu(const KernelArgs& k) {
  const Shape& xs = k[0].shape();
  i64 r = k[4].shape()[1];
  semisep::Dims dm = dims_of(xs, r, k.attrs);
  auto off = grad_offsets(k.attrs.which, grad_sizes(xs[0], xs[1], xs[2], r));
  dispatch_uv(k[0].dtype(), k[4].dtype(), "semiseparable_matvec_backward", [&](auto t, auto uvt) {
    using T = decltype(t);
    using UV = decltype(uvt);
    T* base = k.out.data<T>();
    auto at = [&](std::size_t i) { return off[i] < 0 ? nullptr : base + off[i]; };
    semisep::MatvecGrads<T> g{at(0), at(1), at(2), at(3), at(4), at(5)};
    semisep::matvec_backward<T, UV>(dm, k.attrs.causal, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(),
                                    k[3].data<T>(), static_cast<const UV*>(k[4].raw()),
                                    static_cast<const UV*>(k[5].raw()), k.in.size() > 7 ? k[7].data<T>() : nullptr,
                                    k[6].data<T>(), g, k.workspace);
  });
}
// The same buffer layout and workspace (two regions of chunk sums) as the CPU.
AD_CUDA_ONLY(void semiseparable_matvec_backward_cuda(const KernelArgs& k) {
  cuda_k::SemisepDims dm = gpu_dims("semiseparable_matvec_backward", k);
  auto off = grad_offsets(k.attrs.which, grad_sizes(dm.B, dm.N, dm.D, dm.r));
  const std::size_t es = dtype_size(k[0].dtype());
  char* base = static_cast<char*>(k.out.raw());
  auto at = [&](std::size_t i) -> void* { return off[i] < 0 ? nullptr : base + off[i] * static_cast<i64>(es); };
  cuda_k::MatvecGradPtrs g{at(0), at(1), at(2), at(3), at(4), at(5)};
  const i64 region = dm.B * ((dm.N + dm.L - 1) / dm.L) * dm.r * dm.D * static_cast<i64>(es);
  semisep::Carve cv{static_cast<char*>(k.workspace)};
  char* sx = cv.take<char>(region);
  char* sg = cv.take<char>(region);
  cuda_k::semisep_matvec_backward(k[0].dtype(), dm, k.attrs.causal, k[0].raw(), k[1].raw(), k[2].raw(), k[3].raw(),
                                  k[4].raw(), k[5].raw(), k[6].raw(), g, sx, sg);
})
double semiseparable_matvec_backward_flops(const InferArgs& a, const Meta&) {
  double r = static_cast<double>(a[4].shape[1]);
  return static_cast<double>(a[0].shape.numel()) * ((a.attrs.causal ? 10 : a.in.size() > 7 ? 6 : 8) * r + 12);
}
std::int64_t semiseparable_matvec_backward_ws(const InferArgs& a, const Meta&) {
  return static_cast<std::int64_t>(
      semisep::matvec_backward_ws_bytes(dims_of(a[0].shape, a[4].shape[1], a.attrs), dtype_size(a[0].dtype)));
}
const OpDef op_def_semiseparable_matvec_backward{
    .name = "semiseparable_matvec_backward", .args = "x,t_diag,t_upper,t_lower,u,v,dy,w", .arity = -1,
    .infer = infer_semiseparable_matvec_backward, .cpu = semiseparable_matvec_backward_cpu,
    .cuda = AD_CUDA_FN(semiseparable_matvec_backward_cuda),
    .no_grad = "double backward is not supported", .flops = semiseparable_matvec_backward_flops,
    .workspace = semiseparable_matvec_backward_ws};

// ---- semiseparable_solve ----  x (B,N,D) -> y = (T + U V^T)^-1 x[b] by Woodbury, O(N r^2 + B N D r);
// saves t_*, u, v and the output
Meta infer_semiseparable_solve(const InferArgs& a) {
  check_semisep(a, false);
  return a[0];
}
void semiseparable_solve_cpu(const KernelArgs& k) {
  semisep::Dims dm = dims_of(k[0].shape(), k[4].shape()[1], k.attrs);
  kernels::dispatch_float(k.out.dtype(), "semiseparable_solve", [&](auto t) {
    using T = decltype(t);
    semisep::woodbury_solve<T>("semiseparable_solve", dm, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(),
                               k[3].data<T>(), k[4].data<T>(), k[5].data<T>(), k.out.data<T>(), false, k.workspace);
  });
}
// On a GPU (src/cuda/semiseparable.cu): the same steps through the Thomas
// launchers, cuBLAS and a one-thread LU of the capacitance matrix; its own
// workspace (semisep::woodbury_gpu_ws). Failures raise the CPU's errors.
AD_CUDA_ONLY(void throw_solve_status(const char* op, const cuda_k::SolveStatus& st, const cuda_k::SemisepDims& dm) {
  if (st.bad_row >= 0) semisep::fail_pivot(op, st.bad_pivot, st.bad_row, dm.N);
  if (st.singular) semisep::fail_capacitance(op, dm.r);
})
AD_CUDA_ONLY(void semiseparable_solve_cuda(const KernelArgs& k) {
  cuda_k::SemisepDims dm = gpu_dims("semiseparable_solve", k);
  throw_solve_status("semiseparable_solve",
                     cuda_k::semisep_solve(k[0].dtype(), dm, k[0].raw(), k[1].raw(), k[2].raw(), k[3].raw(),
                                           k[4].raw(), k[5].raw(), k.out.raw(), false, k.workspace),
                     dm);
})
double semiseparable_solve_flops(const InferArgs& a, const Meta& out) {
  double r = static_cast<double>(a[4].shape[1]), N = static_cast<double>(a[0].shape[1]);
  return static_cast<double>(out.shape.numel()) * (4 * r + 8) + N * r * (2 * r + 8);
}
std::int64_t semiseparable_solve_ws(const InferArgs& a, const Meta&) {
  const Shape& x = a[0].shape;
  if (a[0].device.kind == DeviceKind::cuda)
    return static_cast<std::int64_t>(
        semisep::woodbury_gpu_ws(x[0], x[1], x[2], a[4].shape[1], dtype_size(a[0].dtype), false).bytes);
  return static_cast<std::int64_t>(
      semisep::woodbury_ws_bytes(dims_of(x, a[4].shape[1], a.attrs), dtype_size(a[0].dtype)));
}
void semiseparable_solve_bwd(BackwardArgs& a) {
  Var buf = make_node(OpId::semiseparable_solve_backward,
                      {a.in[1], a.in[2], a.in[3], a.in[4], a.in[5], a.out, a.dout}, a.attrs);
  const Shape& x = a.in[0].shape();
  auto off = grad_offsets(0x3f, grad_sizes(x[0], x[1], x[2], a.in[4].shape()[1]));
  for (std::size_t i = 0; i < 6; ++i)
    if (a.needs[i]) a.grad[i] = part(buf, off[i], a.in[i].shape());
}
const OpDef op_def_semiseparable_solve{
    .name = "semiseparable_solve", .args = "x,t_diag,t_upper,t_lower,u,v", .arity = 6,
    .infer = infer_semiseparable_solve, .cpu = semiseparable_solve_cpu, .cuda = AD_CUDA_FN(semiseparable_solve_cuda),
    .backward = semiseparable_solve_bwd,
    .saves = kSavesOutput | saves_input(1) | saves_input(2) | saves_input(3) | saves_input(4) | saves_input(5),
    .flops = semiseparable_solve_flops, .workspace = semiseparable_solve_ws};
Var semiseparable_solve(const Operand& x, const Operand& t_diag, const Operand& t_upper, const Operand& t_lower,
                        const Operand& u, const Operand& v) {
  return make_node(OpId::semiseparable_solve, {x, t_diag, t_upper, t_lower, u, v});
}

// ---- semiseparable_solve_backward ----  (t_diag, t_upper, t_lower, u, v, y, dy) -> one buffer
// [dx (B,N,D), dt_diag (N), dt_upper (N-1), dt_lower (N-1), du (N,r), dv (N,r)]:
// lam = H^-T dy (a second Woodbury solve), dH = -lam y^T.
Meta infer_semiseparable_solve_backward(const InferArgs& a) {
  std::array<const Meta*, 6> in{&a[5], &a[0], &a[1], &a[2], &a[3], &a[4]};  // as (x = y, t_*, u, v)
  SemisepShape s = check_semisep(InferArgs{a.def, in, a.attrs}, false);
  if (a[6].shape != a[5].shape || a[6].dtype != a[5].dtype) fail_shapes(a, "dy must match y");
  return Meta{Shape{grad_offsets(0x3f, grad_sizes(s.B, s.N, s.D, s.r))[6]}, a[5].dtype, a[5].device};
}
void semiseparable_solve_backward_cpu(const KernelArgs& k) {
  const Shape& ys = k[5].shape();
  i64 r = k[3].shape()[1];
  semisep::Dims dm = dims_of(ys, r, k.attrs);
  auto off = grad_offsets(0x3f, grad_sizes(ys[0], ys[1], ys[2], r));
  kernels::dispatch_float(k.out.dtype(), "semiseparable_solve_backward", [&](auto t) {
    using T = decltype(t);
    T* o = k.out.data<T>();
    semisep::woodbury_solve_backward<T>("semiseparable_solve", dm, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(),
                                        k[3].data<T>(), k[4].data<T>(), k[5].data<T>(), k[6].data<T>(), o + off[0],
                                        o + off[1], o + off[2], o + off[3], o + off[4], o + off[5], k.workspace);
  });
}
// The same buffer layout as the CPU; lam = H^-T dy goes straight into its dx part.
AD_CUDA_ONLY(void semiseparable_solve_backward_cuda(const KernelArgs& k) {
  const Shape& ys = k[5].shape();
  semisep::Dims sd = dims_of(ys, k[3].shape()[1], k.attrs);
  cuda_k::SemisepDims dm{sd.B, sd.N, sd.D, sd.r, sd.L};
  auto off = grad_offsets(0x3f, grad_sizes(dm.B, dm.N, dm.D, dm.r));
  const auto es = static_cast<i64>(dtype_size(k[5].dtype()));
  char* base = static_cast<char*>(k.out.raw());
  auto at = [&](std::size_t i) -> void* { return base + off[i] * es; };
  cuda_k::MatvecGradPtrs g{at(0), at(1), at(2), at(3), at(4), at(5)};
  throw_solve_status("semiseparable_solve",
                     cuda_k::semisep_solve_backward(k[5].dtype(), dm, k[0].raw(), k[1].raw(), k[2].raw(), k[3].raw(),
                                                    k[4].raw(), k[5].raw(), k[6].raw(), g, k.workspace),
                     dm);
})
std::int64_t semiseparable_solve_backward_ws(const InferArgs& a, const Meta&) {
  const Shape& y = a[5].shape;
  if (a[5].device.kind == DeviceKind::cuda)
    return static_cast<std::int64_t>(
        semisep::woodbury_gpu_ws(y[0], y[1], y[2], a[3].shape[1], dtype_size(a[5].dtype), true).bytes);
  return static_cast<std::int64_t>(
      semisep::woodbury_backward_ws_bytes(dims_of(y, a[3].shape[1], a.attrs), dtype_size(a[5].dtype)));
}
const OpDef op_def_semiseparable_solve_backward{
    .name = "semiseparable_solve_backward", .args = "t_diag,t_upper,t_lower,u,v,y,dy", .arity = 7,
    .infer = infer_semiseparable_solve_backward, .cpu = semiseparable_solve_backward_cpu,
    .cuda = AD_CUDA_FN(semiseparable_solve_backward_cuda), .no_grad = "double backward is not supported",
    .flops = [](const InferArgs& a, const Meta&) {
      double r = static_cast<double>(a[3].shape[1]), N = static_cast<double>(a[5].shape[1]);
      return static_cast<double>(a[5].shape.numel()) * (8 * r + 14) + N * r * (2 * r + 8);
    },
    .workspace = semiseparable_solve_backward_ws};

}  // namespace ad
