// Matrix products through OpenBLAS.
#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/blas_cpu.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
// How a matmul lays out: a rank-1 a is a row [1,K], a rank-1 b a column
// [K,1] (their dim is dropped from the output); the batch dims (all but the
// last two) broadcast as in numpy. off_a[i] / off_b[i] are the matrix indices
// of a and b that output matrix i reads.
struct MatmulDims {
  std::int64_t batch, m, n, k;
  std::vector<std::int64_t> off_a, off_b;
  // every output matrix reads the next matrix of a and the same b: the batch
  // folds into M (one GEMM) when a is not transposed
  bool a_walks_b_fixed() const {
    for (std::int64_t i = 0; i < batch; ++i)
      if (off_a[static_cast<std::size_t>(i)] != i || off_b[static_cast<std::size_t>(i)] != 0) return false;
    return true;
  }
};
Shape batch_of(const Shape& s) {
  Shape b;
  for (int i = 0; i + 2 < s.rank(); ++i) b.push_back(s[i]);
  return b;
}
// For output batch index i (row-major over `out`), the row-major index into
// `in`'s batch dims, right-aligned, dims of 1 broadcast.
std::vector<std::int64_t> batch_offsets(const Shape& in, const Shape& out) {
  std::int64_t total = out.numel();
  std::vector<std::int64_t> off(static_cast<std::size_t>(total));
  int lead = out.rank() - in.rank();
  std::vector<std::int64_t> idx(static_cast<std::size_t>(out.rank()), 0);
  for (std::int64_t i = 0; i < total; ++i) {
    std::int64_t o = 0;
    for (int d = 0; d < in.rank(); ++d) o = o * in[d] + (in[d] == 1 ? 0 : idx[static_cast<std::size_t>(lead + d)]);
    off[static_cast<std::size_t>(i)] = o;
    for (int d = out.rank() - 1; d >= 0; --d) {  // odometer
      if (++idx[static_cast<std::size_t>(d)] < out[d]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
  return off;
}
MatmulDims matmul_dims(const Shape& a, const Shape& b, bool ta, bool tb) {
  MatmulDims d{};
  d.m = a.rank() == 1 ? 1 : ta ? a[a.rank() - 1] : a[a.rank() - 2];
  d.k = a.rank() == 1 ? a[0] : ta ? a[a.rank() - 2] : a[a.rank() - 1];
  d.n = b.rank() == 1 ? 1 : tb ? b[b.rank() - 2] : b[b.rank() - 1];
  Shape ba = batch_of(a), bb = batch_of(b), out;
  broadcast_shapes(ba, bb, out);  // checked by infer_matmul
  d.batch = out.numel();
  d.off_a = batch_offsets(ba, out);
  d.off_b = batch_offsets(bb, out);
  return d;
}
template <class T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c) {
  blas::gemm("matmul", ta, tb, m, n, k, a, b, c);
}
}  // namespace

// ---- matmul ----  [..., M, K] x [..., K, N] -> [..., M, N], numpy's rules (see ops.hpp)
Meta infer_matmul(const InferArgs& a) {
  check_float_same(a);
  const Shape &sa = a[0].shape, &sb = a[1].shape;
  if (sa.rank() < 1 || sb.rank() < 1) fail_shapes(a, "operands need rank >= 1 (a scalar has no matrix product)");
  bool ta = a.attrs.trans_a && sa.rank() > 1, tb = a.attrs.trans_b && sb.rank() > 1;
  std::int64_t m = sa.rank() == 1 ? 1 : ta ? sa.back() : sa[sa.rank() - 2];
  std::int64_t ka = sa.rank() == 1 ? sa[0] : ta ? sa[sa.rank() - 2] : sa.back();
  std::int64_t kb = sb.rank() == 1 ? sb[0] : tb ? sb.back() : sb[sb.rank() - 2];
  std::int64_t n = sb.rank() == 1 ? 1 : tb ? sb[sb.rank() - 2] : sb.back();
  if (ka != kb)
    fail_shapes(a, fmt::format("inner dims differ ({} of a{} vs {} of b{})", ka, ta ? " transposed" : "", kb,
                               tb ? " transposed" : ""));
  Shape out;
  if (!broadcast_shapes(batch_of(sa), batch_of(sb), out))
    fail_shapes(a, "batch dims differ (aligned from the right, each pair must be equal or one of them 1)");
  if (sa.rank() > 1) out.push_back(m);
  if (sb.rank() > 1) out.push_back(n);
  return Meta{out, a[0].dtype, a[0].device};
}
void matmul_cpu(const KernelArgs& k) {
  bool ta = k.attrs.trans_a && k[0].shape().rank() > 1, tb = k.attrs.trans_b && k[1].shape().rank() > 1;
  MatmulDims d = matmul_dims(k[0].shape(), k[1].shape(), ta, tb);
  kernels::dispatch_float(k.out.dtype(), "matmul", [&](auto t) {
    using T = decltype(t);
    const T* A = k[0].data<T>();
    const T* B = k[1].data<T>();
    T* C = k.out.data<T>();
    if (!ta && d.a_walks_b_fixed()) {  // [B,M,K] x [K,N]: fold the batch into M, one GEMM
      gemm(false, tb, d.batch * d.m, d.n, d.k, A, B, C);
      return;
    }
    for (std::int64_t i = 0; i < d.batch; ++i) {
      auto u = static_cast<std::size_t>(i);
      gemm(ta, tb, d.m, d.n, d.k, A + d.off_a[u] * d.m * d.k, B + d.off_b[u] * d.k * d.n, C + i * d.m * d.n);
    }
  });
}
// One strided-batched cuBLAS call per run of output matrices whose a and b
// indices advance by constant steps (one run unless the batch broadcasts in
// an inner dim); [B,M,K] x [K,N] folds the batch into M.
AD_CUDA_ONLY(void matmul_cuda(const KernelArgs& k) {
  bool ta = k.attrs.trans_a && k[0].shape().rank() > 1, tb = k.attrs.trans_b && k[1].shape().rank() > 1;
  MatmulDims d = matmul_dims(k[0].shape(), k[1].shape(), ta, tb);
  DType t = k.out.dtype();
  if (!ta && d.a_walks_b_fixed()) {
    cuda_k::gemm(t, false, tb, 1, d.batch * d.m, d.n, d.k, k[0].raw(), 0, k[1].raw(), 0, k.out.raw(), 0);
    return;
  }
  auto at = [&](const Tensor& x, std::int64_t elems) {
    return static_cast<char*>(x.raw()) + elems * static_cast<std::int64_t>(dtype_size(t));
  };
  for (std::int64_t i = 0; i < d.batch;) {
    auto u = [](std::int64_t v) { return static_cast<std::size_t>(v); };
    std::int64_t j = i + 1;
    std::int64_t step_a = j < d.batch ? d.off_a[u(j)] - d.off_a[u(i)] : 0;
    std::int64_t step_b = j < d.batch ? d.off_b[u(j)] - d.off_b[u(i)] : 0;
    while (j < d.batch && d.off_a[u(j)] - d.off_a[u(j - 1)] == step_a && d.off_b[u(j)] - d.off_b[u(j - 1)] == step_b) ++j;
    cuda_k::gemm(t, ta, tb, j - i, d.m, d.n, d.k, at(k[0], d.off_a[u(i)] * d.m * d.k), step_a * d.m * d.k,
                 at(k[1], d.off_b[u(i)] * d.k * d.n), step_b * d.k * d.n, at(k.out, i * d.m * d.n), d.m * d.n);
    i = j;
  }
})
double matmul_flops(const InferArgs& a, const Meta& out) {
  const Shape& sa = a[0].shape;
  std::int64_t k = sa.rank() == 1 ? sa[0] : a.attrs.trans_a ? sa[sa.rank() - 2] : sa.back();
  return 2.0 * static_cast<double>(out.shape.numel()) * static_cast<double>(k);
}
// C = op(A) op(B): d op(A) = dC op(B)^T, d op(B) = op(A)^T dC. A rank-1
// operand is taken as the matrix it stands for ([1,K] or [K,1]) and dC gets
// back the dim its output dropped; a broadcast batch is summed back by sum_to.
void matmul_bwd(BackwardArgs& a) {
  const Var &A0 = a.in[0], &B0 = a.in[1];
  Var A = A0, B = B0, dC = a.dout;
  bool ta = a.attrs.trans_a && A0.rank() > 1, tb = a.attrs.trans_b && B0.rank() > 1;
  if (A0.rank() == 1 || B0.rank() == 1) {
    Shape s = dC.shape();
    if (B0.rank() == 1) s.push_back(1);
    if (A0.rank() == 1) {
      s.push_back(s.back());
      s[s.rank() - 2] = 1;
    }
    dC = reshape(dC, s);
    if (A0.rank() == 1) A = reshape(A0, {1, A0.dim(0)});
    if (B0.rank() == 1) B = reshape(B0, {B0.dim(0), 1});
  }
  auto fit = [](Var g, const Var& as, const Var& orig) {  // sum a broadcast batch, drop a vector's extra dim
    if (!(g.shape() == as.shape())) g = sum_to(g, as.shape());
    return as.rank() == orig.rank() ? g : reshape(g, orig.shape());
  };
  // The smaller gradient is built first (so computed first in node order): for a layer x W^T, dW reads the
  // activation x and is weight-sized, dx reads only W and is activation-sized; dW first lets x die before dx
  // is allocated (a recurrent layer's [B, T, H] output, dead after the head's dW, was held next to its
  // gradient: a third of sqrt_n's peak).
  auto grad_a = [&] { a.grad[0] = fit(ta ? matmul(B, dC, tb, true) : matmul(dC, B, false, !tb), A, A0); };
  const bool b_first = a.needs[1] && B0.numel() < A0.numel();
  if (a.needs[0] && !b_first) grad_a();
  if (a.needs[1]) {
    Var g;
    if (A.rank() > 2 && B.rank() == 2 && !ta) {  // [B,T,K] x [K,N]: fold the batch, one GEMM
      // the rows counted (A and dC share their leading dims), not -1: next to a K or N of 0, -1
      // is ambiguous and reshape threw
      std::int64_t rows = 1;
      for (int i = 0; i + 1 < A.rank(); ++i) rows *= A.dim(i);
      Var Af = reshape(A, {rows, A.dim(-1)}), dCf = reshape(dC, {rows, dC.dim(-1)});
      g = tb ? matmul(dCf, Af, true, false) : matmul(Af, dCf, true, false);
    } else {
      g = tb ? matmul(dC, A, true, ta) : matmul(A, dC, !ta, false);
    }
    a.grad[1] = fit(g, B, B0);
  }
  if (a.needs[0] && b_first) grad_a();
}
const OpDef op_def_matmul{.name = "matmul", .args = "a,b", .arity = 2, .infer = infer_matmul, .cpu = matmul_cpu, .cuda = AD_CUDA_FN(matmul_cuda),
                          .backward = matmul_bwd, .saves = saves_input(0) | saves_input(1),
                          .flops = matmul_flops};
Var matmul(const Operand& a, const Operand& b, bool trans_a, bool trans_b) {
  Attrs at;  // a vector is its own transpose: the flag is dropped, so backward and the kernels never see it
  at.trans_a = trans_a && operand_shape("matmul", a).rank() != 1;
  at.trans_b = trans_b && operand_shape("matmul", b).rank() != 1;
  return make_node(OpId::matmul, {a, b}, at);
}

}  // namespace ad
