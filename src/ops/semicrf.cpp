// Semi-Markov CRF ops (the model: include/ad/semicrf.hpp, docs/design.md).
// Kernels: semicrf_cpu.cpp (fast path, Tr (C, C)), semicrf_general_cpu.cpp
// (Tr (K, C, C)), semicrf_decode_cpu.cpp (Viterbi, score), semicrf_win.cpp
// (the vectorised window loops), semicrf_math.hpp (per-element math, AD_HD);
// CUDA: src/cuda/semicrf.cu (workspace layout: semicrf_gpu.hpp).
#include "ad/semicrf.hpp"

#include <cmath>
#include <vector>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/semicrf_cpu.hpp"
#include "ops/semicrf_gpu.hpp"
#if AD_HAVE_CUDA
#include "core/device.hpp"
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
// Checks S, Tr, D, P (float, one dtype) and L (i64 (B)); returns the dims.
semicrf::Dims infer_dims(const InferArgs& a) {
  for (std::size_t i = 0; i < 4; ++i) {
    if (!is_compute_float(a[i].dtype))
      fail_shapes(a, fmt::format("{} must be f32 or f64", i == 0 ? "S" : i == 1 ? "Tr" : i == 2 ? "D" : "P"));
    if (a[i].dtype != a[0].dtype) fail_shapes(a, "S, Tr, D and P must share one dtype");
  }
  check_index(a, 4);
  const Shape &S = a[0].shape, &Tr = a[1].shape, &D = a[2].shape, &P = a[3].shape, &L = a[4].shape;
  if (S.rank() != 3 || S[1] < 2 || S[2] < 1)
    fail_shapes(a, "S must be (B, T+1, C) with T >= 1 and C >= 1 (cumulative scores, S[:,0,:] = 0)");
  semicrf::Dims d;
  d.B = S[0];
  d.T = S[1] - 1;
  d.C = S[2];
  if (D.rank() != 2 || D[1] != d.C) fail_shapes(a, fmt::format("D must be (K, C) with C = {}", d.C));
  d.K = D[0];
  if (d.K < 1) fail_shapes(a, "D must have K >= 1 rows (K is the maximum segment length)");
  if (Tr.rank() == 2 && Tr[0] == d.C && Tr[1] == d.C) d.general = false;
  else if (Tr.rank() == 3 && Tr[0] == d.K && Tr[1] == d.C && Tr[2] == d.C) d.general = true;
  else fail_shapes(a, fmt::format("Tr must be (C, C) or (K, C, C) with C = {}, K = {}", d.C, d.K));
  if (P.rank() != 1 || P[0] != d.C) fail_shapes(a, fmt::format("P must be (C) with C = {}", d.C));
  if (L.rank() != 1 || L[0] != d.B) fail_shapes(a, fmt::format("L must be (B) with B = {}", d.B));
  d.esize = dtype_size(a[0].dtype);
  return d;
}
semicrf::Args args_of(const KernelArgs& k) {
  semicrf::Args x;
  const Shape& S = k[0].shape();
  x.d.B = S[0];
  x.d.T = S[1] - 1;
  x.d.C = S[2];
  x.d.K = k[2].shape()[0];
  x.d.general = k[1].rank() == 3;
  x.d.esize = dtype_size(k[0].dtype());
  x.dtype = k[0].dtype();
  x.S = k[0].raw();
  x.Tr = k[1].raw();
  x.D = k[2].raw();
  x.P = k[3].raw();
  x.L = k[4].data<std::int64_t>();
  return x;
}
std::int64_t grads_numel(const semicrf::Dims& d) { return d.B * (d.T + 1) * d.C + d.tr_numel() + d.K * d.C + d.C; }
// Gradients of S, Tr, D, P as parts of one flat buffer.
void grads_from_buffer(BackwardArgs& a, const Var& buf) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    const Shape s = a.in[i].shape();  // a copy: part() adds a node
    if (a.needs[i]) a.grad[i] = part(buf, off, s);
    off += s.numel();
  }
}
double window_flops(const InferArgs& a, double per_term) {
  semicrf::Dims d = infer_dims(a);
  return static_cast<double>(d.B) * static_cast<double>(d.T) * static_cast<double>(d.ke()) *
         static_cast<double>(d.C) * (d.general ? static_cast<double>(d.C) : 1.0) * per_term;
}
// Workspace of a pass: the CPU kernels' layout, or the CUDA kernels' for
// inputs on a GPU (both are exactly what the kernels carve).
std::int64_t pass_workspace(const InferArgs& a, semicrf::Pass pass) {
  semicrf::Dims d = infer_dims(a);
  if (a[0].device.kind == DeviceKind::cuda) return semicrf::gpu::layout(d, pass).total;
  return semicrf::workspace_bytes(d, pass, semicrf::default_threads());
}
AD_CUDA_ONLY(
// An i64 tensor on the GPU copied to the host (lengths, segments: checked
// there with the CPU's messages before any kernel runs).
std::vector<std::int64_t> host_i64(const Tensor& t) {
  std::vector<std::int64_t> h(static_cast<std::size_t>(t.numel()));
  device::copy(h.data(), Device::cpu(), t.raw(), t.device(), h.size() * sizeof(std::int64_t));
  return h;
}
// The launchers' arguments; throws (naming op) unless 1 <= L[b] <= T.
cuda_k::SemicrfArgs gpu_args(const char* op, const KernelArgs& k) {
  semicrf::Args x = args_of(k);
  std::vector<std::int64_t> L = host_i64(k[4]);
  x.L = L.data();
  semicrf::check_lengths(op, x);
  const cuda_k::SemicrfArgs g{x.d.B, x.d.T, x.d.K, x.d.C, x.d.general, x.S, x.Tr, x.D, x.P, k[4].data<std::int64_t>()};
  {  // S checked on the device (its first bad element), then Tr, D and P on the host (small copies)
    double v = 0;
    if (const std::int64_t i = cuda_k::semicrf_first_non_finite_s(x.dtype, g, &v); i >= 0) {
      const std::int64_t C = x.d.C, T1 = x.d.T + 1;
      semicrf::fail_non_finite_s(op, i / (T1 * C), i / C % T1, i % C, v);
    }
    const Tensor tr = k[1].to(Device::cpu()), dd = k[2].to(Device::cpu()), pp = k[3].to(Device::cpu());
    semicrf::Args h = x;
    h.Tr = tr.raw(), h.D = dd.raw(), h.P = pp.raw();
    semicrf::check_scores(op, h, false);
  }
  return g;
}
// Segments checked on the host (the CPU's check_segments and messages).
void check_segments_gpu(const char* op, const KernelArgs& k) {
  semicrf::Args x = args_of(k);
  std::vector<std::int64_t> L = host_i64(k[4]), seg = host_i64(k[5]);
  x.L = L.data();
  semicrf::check_segments(op, x, seg.data());
})
constexpr std::uint32_t kSavesModel = saves_input(0) | saves_input(1) | saves_input(2) | saves_input(3) | saves_input(4);
}  // namespace

// ---- semicrf_cumulative ----  scores [B,T,C] -> S [B,T+1,C]: S[:,0] = 0, S[:,t+1] = S[:,t] + x[:,t] - mean_b(x)
// The optional lengths (i64 (B)) of semicrf_cumulative and its backward, input 1.
void check_cumulative_lengths(const InferArgs& a, std::int64_t B) {
  if (a.in.size() > 2) fail_shapes(a, "takes the scores and, optionally, the lengths L");
  if (a.in.size() == 2 && (a[1].dtype != DType::i64 || a[1].shape.rank() != 1 || a[1].shape[0] != B))
    fail_shapes(a, fmt::format("L must be i64 (B) with B = {}", B));
}
Meta infer_semicrf_cumulative(const InferArgs& a) {
  if (!is_compute_float(a[0].dtype)) fail_shapes(a, "scores must be f32 or f64");
  if (a[0].shape.rank() != 3) fail_shapes(a, "scores must be (B, T, C)");
  check_cumulative_lengths(a, a[0].shape[0]);
  Meta m = a[0];
  m.shape = Shape{a[0].shape[0], a[0].shape[1] + 1, a[0].shape[2]};
  return m;
}
// The first non-finite score of sequence b (xb: its T x C scores, on the
// host): prefix sums cannot hold -inf (the mean shift makes it NaN), so it is
// an error, not a forbidden position.
template <class E> [[noreturn]] void non_finite_score(const E* xb, std::int64_t b, std::int64_t T, std::int64_t C) {
  for (std::int64_t i = 0; i < T * C; ++i)
    if (!std::isfinite(static_cast<double>(xb[i])))
      kernel_fail("semicrf_cumulative",
                  fmt::format("scores[{}, {}, {}] = {} is not finite: cumulative scores cannot hold it (forbid "
                              "segments with -inf in Tr, D or P instead)",
                              b, i / C, i % C, static_cast<double>(xb[i])));
  kernel_fail("semicrf_cumulative", fmt::format("the cumulative scores of sequence {} overflow {} (scores too large)", b,
                                                dtype_name(DTypeOf<E>::value)));
}
// The rows of each sequence that semicrf_cumulative reads: L[b] (checked: 1..T) with lengths, else T.
std::vector<std::int64_t> cumulative_rows(const char* op, const KernelArgs& k, std::int64_t B, std::int64_t T) {
  std::vector<std::int64_t> n(static_cast<std::size_t>(B), T);
  if (k.in.size() < 2) return n;
  const Tensor L = k[1].to(Device::cpu());
  const std::int64_t* l = L.data<std::int64_t>();
  for (std::int64_t b = 0; b < B; ++b) {
    if (l[b] < 1 || l[b] > T) kernel_fail(op, fmt::format("L[{}] = {} is outside 1..T = 1..{}", b, l[b], T));
    n[static_cast<std::size_t>(b)] = l[b];
  }
  return n;
}
void semicrf_cumulative_cpu(const KernelArgs& k) {
  const std::int64_t B = k[0].shape()[0], T = k[0].shape()[1], C = k[0].shape()[2];
  const std::vector<std::int64_t> rows = cumulative_rows("semicrf_cumulative", k, B, T);
  kernels::dispatch_float(k.out.dtype(), "semicrf_cumulative", [&](auto t) {
    using E = decltype(t);
    const E* x = k[0].data<E>();
    E* S = k.out.data<E>();
    std::vector<double> acc(static_cast<std::size_t>(C));
    for (std::int64_t b = 0; b < B; ++b) {
      const E* xb = x + b * T * C;
      E* Sb = S + b * (T + 1) * C;
      const std::int64_t n = rows[static_cast<std::size_t>(b)];  // positions n.. are padding: not read
      double m = 0;
      for (std::int64_t i = 0; i < n * C; ++i) m += static_cast<double>(xb[i]);
      m = n * C > 0 ? m / static_cast<double>(n * C) : 0.0;
      if (!std::isfinite(m)) non_finite_score(xb, b, n, C);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t c = 0; c < C; ++c) Sb[c] = E(0);
      bool finite = true;  // every S in range of E (the GPU checks the last row)
      for (std::int64_t u = 0; u < T; ++u)
        for (std::int64_t c = 0; c < C; ++c) {
          if (u < n) acc[static_cast<std::size_t>(c)] += static_cast<double>(xb[u * C + c]) - m;
          Sb[(u + 1) * C + c] = static_cast<E>(acc[static_cast<std::size_t>(c)]);
          finite &= std::isfinite(static_cast<double>(Sb[(u + 1) * C + c]));
        }
      if (!finite) non_finite_score(xb, b, n, C);
    }
  });
}
AD_CUDA_ONLY(void semicrf_cumulative_cuda(const KernelArgs& k) {
  const Shape& x = k[0].shape();
  const std::vector<std::int64_t> rows = cumulative_rows("semicrf_cumulative", k, x[0], x[1]);
  const std::int64_t* L = k.in.size() > 1 ? k[1].data<std::int64_t>() : nullptr;  // on the device
  std::int64_t b = cuda_k::semicrf_cumulative(k.out.dtype(), x[0], x[1], x[2], k[0].raw(), L, k.out.raw());
  if (b >= 0) {
    Tensor xb = k[0].to(Device::cpu());
    const std::int64_t n = rows[static_cast<std::size_t>(b)];
    kernels::dispatch_float(xb.dtype(), "semicrf_cumulative",
                            [&](auto t) { non_finite_score(xb.data<decltype(t)>() + b * x[1] * x[2], b, n, x[2]); });
  }
})
void semicrf_cumulative_bwd(BackwardArgs& a) {
  if (!a.needs[0]) return;
  a.grad[0] = a.in.size() > 1 ? make_node(OpId::semicrf_cumulative_backward, {a.dout, a.in[1]})
                              : make_node(OpId::semicrf_cumulative_backward, {a.dout});
}
const OpDef op_def_semicrf_cumulative{.name = "semicrf_cumulative", .args = "scores,L", .arity = -1,
                                      .infer = infer_semicrf_cumulative, .cpu = semicrf_cumulative_cpu,
                                      .cuda = AD_CUDA_FN(semicrf_cumulative_cuda),
                                      .backward = semicrf_cumulative_bwd, .saves = saves_input(1)};
Var semicrf_cumulative(const Operand& scores) { return make_node(OpId::semicrf_cumulative, {scores}); }
Var semicrf_cumulative(const Operand& scores, const Operand& L) {
  return make_node(OpId::semicrf_cumulative, {scores, L});
}

// ---- semicrf_cumulative_backward ----  dS [B,T+1,C] -> dx [B,T,C]:
//   dy[t,c] = sum_{u>t} dS[u,c];  dx = dy - mean_b(dy) over t < L[b] (T without lengths), 0 at t >= L[b]
Meta infer_semicrf_cumulative_backward(const InferArgs& a) {
  check_cumulative_lengths(a, a[0].shape[0]);
  Meta m = a[0];
  m.shape = Shape{a[0].shape[0], a[0].shape[1] - 1, a[0].shape[2]};
  return m;
}
void semicrf_cumulative_backward_cpu(const KernelArgs& k) {
  const std::int64_t B = k[0].shape()[0], T = k[0].shape()[1] - 1, C = k[0].shape()[2];
  const std::vector<std::int64_t> rows = cumulative_rows("semicrf_cumulative_backward", k, B, T);
  kernels::dispatch_float(k.out.dtype(), "semicrf_cumulative_backward", [&](auto t) {
    using E = decltype(t);
    const E* dS = k[0].data<E>();
    E* dx = k.out.data<E>();
    std::vector<double> acc(static_cast<std::size_t>(C)), dy(static_cast<std::size_t>(T * C));
    for (std::int64_t b = 0; b < B; ++b) {
      const E* g = dS + b * (T + 1) * C;
      const std::int64_t n = rows[static_cast<std::size_t>(b)];
      std::fill(acc.begin(), acc.end(), 0.0);
      double total = 0;
      for (std::int64_t u = T - 1; u >= 0; --u)
        for (std::int64_t c = 0; c < C; ++c) {
          acc[static_cast<std::size_t>(c)] += static_cast<double>(g[(u + 1) * C + c]);
          dy[static_cast<std::size_t>(u * C + c)] = acc[static_cast<std::size_t>(c)];
        }
      for (std::int64_t i = 0; i < n * C; ++i) total += dy[static_cast<std::size_t>(i)];
      double m = n * C > 0 ? total / static_cast<double>(n * C) : 0.0;
      for (std::int64_t i = 0; i < T * C; ++i)
        dx[b * T * C + i] = i < n * C ? static_cast<E>(dy[static_cast<std::size_t>(i)] - m) : E(0);
    }
  });
}
AD_CUDA_ONLY(void semicrf_cumulative_backward_cuda(const KernelArgs& k) {
  const Shape& g = k[0].shape();
  (void)cumulative_rows("semicrf_cumulative_backward", k, g[0], g[1] - 1);
  const std::int64_t* L = k.in.size() > 1 ? k[1].data<std::int64_t>() : nullptr;  // on the device
  cuda_k::semicrf_cumulative_backward(k.out.dtype(), g[0], g[1] - 1, g[2], k[0].raw(), L, k.out.raw());
})
const OpDef op_def_semicrf_cumulative_backward{.name = "semicrf_cumulative_backward", .args = "dS,L", .arity = -1,
                                               .infer = infer_semicrf_cumulative_backward,
                                               .cpu = semicrf_cumulative_backward_cpu,
                                               .cuda = AD_CUDA_FN(semicrf_cumulative_backward_cuda),
                                               .no_grad = "double backward is not supported"};

// ---- semicrf_logz ----  (S [B,T+1,C], Tr [C,C] | [K,C,C], D [K,C], P [C], L i64 [B]) -> logZ [B]
//   forward sweep with a Ke-slot α ring; saves the inputs (backward recomputes)
Meta infer_semicrf_logz(const InferArgs& a) {
  semicrf::Dims d = infer_dims(a);
  return Meta{Shape{d.B}, a[0].dtype, a[0].device};
}
void semicrf_logz_cpu(const KernelArgs& k) {
  semicrf::logz_cpu(args_of(k), k.out.raw(), k.workspace, semicrf::default_threads());
}
AD_CUDA_ONLY(void semicrf_logz_cuda(const KernelArgs& k) {
  cuda_k::semicrf_logz(k.out.dtype(), gpu_args("semicrf_logz", k), k.out.raw(), k.workspace);
})
void semicrf_logz_bwd(BackwardArgs& a) {
  Var buf = make_node(OpId::semicrf_logz_backward, {a.in[0], a.in[1], a.in[2], a.in[3], a.in[4], a.dout});
  grads_from_buffer(a, buf);
}
const OpDef op_def_semicrf_logz{
    .name = "semicrf_logz", .args = "S,Tr,D,P,L", .arity = 5, .infer = infer_semicrf_logz, .cpu = semicrf_logz_cpu,
    .cuda = AD_CUDA_FN(semicrf_logz_cuda), .backward = semicrf_logz_bwd, .saves = kSavesModel,
    .flops = [](const InferArgs& a, const Meta&) { return window_flops(a, 20); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return pass_workspace(a, semicrf::Pass::logz);
    }};
Var semicrf_logz(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P, const Operand& L) {
  return make_node(OpId::semicrf_logz, {S, Tr, D, P, L});
}

// ---- semicrf_logz_backward ----  (S, Tr, D, P, L, dlogZ [B]) -> [dS | dTr | dD | dP] flat, one pass:
//   forward with ring checkpoints every I positions, then per interval (last
//   to first) α recomputation and the β sweep that forms all gradients
Meta infer_semicrf_logz_backward(const InferArgs& a) {
  semicrf::Dims d = infer_dims(a);
  return Meta{Shape{grads_numel(d)}, a[0].dtype, a[0].device};
}
void semicrf_logz_backward_cpu(const KernelArgs& k) {
  semicrf::logz_backward_cpu(args_of(k), k[5].raw(), k.out.raw(), k.workspace, semicrf::default_threads());
}
AD_CUDA_ONLY(void semicrf_logz_backward_cuda(const KernelArgs& k) {
  cuda_k::semicrf_logz_backward(k.out.dtype(), gpu_args("semicrf_logz_backward", k), k[5].raw(), k.out.raw(),
                                k.workspace);
})
const OpDef op_def_semicrf_logz_backward{
    .name = "semicrf_logz_backward", .args = "S,Tr,D,P,L,dlogz", .arity = 6, .infer = infer_semicrf_logz_backward,
    .cpu = semicrf_logz_backward_cpu, .cuda = AD_CUDA_FN(semicrf_logz_backward_cuda),
    .no_grad = "double backward is not supported",
    .flops = [](const InferArgs& a, const Meta&) { return window_flops(a, 70); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return pass_workspace(a, semicrf::Pass::backward);
    }};

// ---- semicrf_score ----  (S, Tr, D, P, L, segments i64 [B,T]) -> score [B]; saves the inputs
Meta infer_semicrf_score(const InferArgs& a) {
  semicrf::Dims d = infer_dims(a);
  check_index(a, 5);
  if (!(a[5].shape == Shape{d.B, d.T}))
    fail_shapes(a, fmt::format("segments must be (B, T) = ({}, {})", d.B, d.T));
  return Meta{Shape{d.B}, a[0].dtype, a[0].device};
}
void semicrf_score_cpu(const KernelArgs& k) {
  semicrf::score_cpu(args_of(k), k[5].data<std::int64_t>(), k.out.raw());
}
AD_CUDA_ONLY(void semicrf_score_cuda(const KernelArgs& k) {
  check_segments_gpu("semicrf_score", k);
  cuda_k::semicrf_score(k.out.dtype(), gpu_args("semicrf_score", k), k[5].data<std::int64_t>(), k.out.raw());
})
void semicrf_score_bwd(BackwardArgs& a) {
  Var buf = make_node(OpId::semicrf_score_backward, {a.in[0], a.in[1], a.in[2], a.in[3], a.in[4], a.in[5], a.dout});
  grads_from_buffer(a, buf);
}
const OpDef op_def_semicrf_score{.name = "semicrf_score", .args = "S,Tr,D,P,L,segments", .arity = 6,
                                 .infer = infer_semicrf_score, .cpu = semicrf_score_cpu,
                                 .cuda = AD_CUDA_FN(semicrf_score_cuda),
                                 .backward = semicrf_score_bwd, .saves = kSavesModel | saves_input(5)};
Var semicrf_score(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P, const Operand& L,
                  const Operand& segments) {
  return make_node(OpId::semicrf_score, {S, Tr, D, P, L, segments});
}

// ---- semicrf_score_backward ----  (..., segments, dscore [B]) -> [dS | dTr | dD | dP]:
//   +dscore at each segment's end row of S, -dscore at its start row, on its D, P / Tr entries
Meta infer_semicrf_score_backward(const InferArgs& a) {
  semicrf::Dims d = infer_dims(a);
  return Meta{Shape{grads_numel(d)}, a[0].dtype, a[0].device};
}
void semicrf_score_backward_cpu(const KernelArgs& k) {
  semicrf::score_backward_cpu(args_of(k), k[5].data<std::int64_t>(), k[6].raw(), k.out.raw());
}
AD_CUDA_ONLY(void semicrf_score_backward_cuda(const KernelArgs& k) {
  check_segments_gpu("semicrf_score_backward", k);
  cuda_k::semicrf_score_backward(k.out.dtype(), gpu_args("semicrf_score_backward", k), k[5].data<std::int64_t>(),
                                 k[6].raw(), k.out.raw());
})
const OpDef op_def_semicrf_score_backward{.name = "semicrf_score_backward", .args = "S,Tr,D,P,L,segments,dscore",
                                          .arity = 7, .infer = infer_semicrf_score_backward,
                                          .cpu = semicrf_score_backward_cpu,
                                          .cuda = AD_CUDA_FN(semicrf_score_backward_cuda),
                                          .no_grad = "the gradient of a score is piecewise constant"};

// ---- semicrf_viterbi ----  (S, Tr, D, P, L) -> segments i64 [B,T]: max semiring, O(T·C) backpointers
Meta infer_semicrf_viterbi(const InferArgs& a) {
  semicrf::Dims d = infer_dims(a);
  return Meta{Shape{d.B, d.T}, DType::i64, a[0].device};
}
void semicrf_viterbi_cpu(const KernelArgs& k) {
  semicrf::viterbi_cpu(args_of(k), k.out.data<std::int64_t>(), k.workspace, semicrf::default_threads());
}
AD_CUDA_ONLY(void semicrf_viterbi_cuda(const KernelArgs& k) {
  cuda_k::SemicrfArgs g = gpu_args("semicrf_viterbi", k);
  std::int64_t b = cuda_k::semicrf_viterbi(k[0].dtype(), g, k.out.data<std::int64_t>(), k.workspace);
  if (b >= 0) {
    std::int64_t Lb = 0;
    device::copy(&Lb, Device::cpu(), g.L + b, k[4].device(), sizeof Lb);
    kernel_fail("semicrf_viterbi",
                fmt::format("sequence {} (L = {}) has no allowed segmentation (every one scores -inf)", b, Lb));
  }
})
const OpDef op_def_semicrf_viterbi{
    .name = "semicrf_viterbi", .args = "S,Tr,D,P,L", .arity = 5, .infer = infer_semicrf_viterbi,
    .cpu = semicrf_viterbi_cpu, .cuda = AD_CUDA_FN(semicrf_viterbi_cuda), .no_grad = "an argmax (differentiate its score, semicrf_decode().score)",
    .flops = [](const InferArgs& a, const Meta&) { return window_flops(a, 4); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return pass_workspace(a, semicrf::Pass::viterbi);
    }};
Var semicrf_viterbi(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P, const Operand& L) {
  return make_node(OpId::semicrf_viterbi, {S, Tr, D, P, L});
}
SemicrfDecode semicrf_decode(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P,
                             const Operand& L) {
  Var seg = semicrf_viterbi(S, Tr, D, P, L);
  return {seg, semicrf_score(S, Tr, D, P, L, seg)};
}

// ---- semicrf_marginals ----  (S, Tr, D, P, L) -> [B,T,C]: P(t in a segment of label c),
//   the running sum of (end − start) marginals of the backward sweep
Meta infer_semicrf_marginals(const InferArgs& a) {
  semicrf::Dims d = infer_dims(a);
  return Meta{Shape{d.B, d.T, d.C}, a[0].dtype, a[0].device};
}
void semicrf_marginals_cpu(const KernelArgs& k) {
  semicrf::marginals_cpu(args_of(k), k.out.raw(), k.workspace, semicrf::default_threads());
}
AD_CUDA_ONLY(void semicrf_marginals_cuda(const KernelArgs& k) {
  cuda_k::semicrf_marginals(k.out.dtype(), gpu_args("semicrf_marginals", k), k.out.raw(), k.workspace);
})
const OpDef op_def_semicrf_marginals{
    .name = "semicrf_marginals", .args = "S,Tr,D,P,L", .arity = 5, .infer = infer_semicrf_marginals,
    .cpu = semicrf_marginals_cpu, .cuda = AD_CUDA_FN(semicrf_marginals_cuda), .no_grad = "posterior marginals are not differentiated (differentiate semicrf_logz)",
    .flops = [](const InferArgs& a, const Meta&) { return window_flops(a, 50); },
    .workspace = [](const InferArgs& a, const Meta&) {
      return pass_workspace(a, semicrf::Pass::marginals);
    }};
Var semicrf_marginals(const Operand& S, const Operand& Tr, const Operand& D, const Operand& P, const Operand& L) {
  return make_node(OpId::semicrf_marginals, {S, Tr, D, P, L});
}

}  // namespace ad
