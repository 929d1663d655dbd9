// Matrix products through OpenBLAS.
#include <cblas.h>

#include <climits>
#include <cstring>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

namespace {
struct MatmulDims {
  std::int64_t batch, m, n, k;
  bool a_batched, b_batched;
};
MatmulDims matmul_dims(const Shape& a, const Shape& b, bool ta, bool tb, const Shape& out) {
  MatmulDims d{};
  d.m = ta ? a[a.rank() - 1] : a[a.rank() - 2];
  d.k = ta ? a[a.rank() - 2] : a[a.rank() - 1];
  d.n = tb ? b[b.rank() - 2] : b[b.rank() - 1];
  d.a_batched = a.rank() > 2;
  d.b_batched = b.rank() > 2;
  d.batch = out.numel() / std::max<std::int64_t>(1, d.m * d.n);
  if (d.m * d.n == 0) {
    d.batch = 1;
    for (int i = 0; i + 2 < out.rank(); ++i) d.batch *= out[i];
  }
  return d;
}
void check_blas_int(std::int64_t v) {
  if (v > INT_MAX) kernel_fail("matmul", fmt::format("dimension {} exceeds the BLAS integer range", v));
}
template <class T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) { std::memset(c, 0, static_cast<std::size_t>(m * n) * sizeof(T)); return; }
  check_blas_int(m); check_blas_int(n); check_blas_int(k);
  auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n), ldc = static_cast<int>(n);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, TA, TB, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, lda, b,
                ldb, 0.0f, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, TA, TB, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a, lda, b,
                ldb, 0.0, c, ldc);
}
}  // namespace

// ---- matmul ----  [..., M, K] x [..., K, N] -> [..., M, N]; batch dims equal or absent on one side
Meta infer_matmul(const InferArgs& a) {
  check_float_same(a);
  const Shape &sa = a[0].shape, &sb = a[1].shape;
  if (sa.rank() < 2 || sb.rank() < 2) fail_shapes(a, "operands need rank >= 2");
  bool ta = a.attrs.trans_a, tb = a.attrs.trans_b;
  std::int64_t m = ta ? sa.back() : sa[sa.rank() - 2], ka = ta ? sa[sa.rank() - 2] : sa.back();
  std::int64_t kb = tb ? sb.back() : sb[sb.rank() - 2], n = tb ? sb[sb.rank() - 2] : sb.back();
  if (ka != kb) fail_shapes(a, "inner dims differ");
  Shape out;
  if (sa.rank() > 2 && sb.rank() > 2) {
    if (sa.rank() != sb.rank()) fail_shapes(a, "batch dims differ");
    for (int i = 0; i + 2 < sa.rank(); ++i) {
      if (sa[i] != sb[i]) fail_shapes(a, "batch dims differ");
      out.push_back(sa[i]);
    }
  } else {
    const Shape& s = sa.rank() > 2 ? sa : sb;
    for (int i = 0; i + 2 < s.rank(); ++i) out.push_back(s[i]);
  }
  out.push_back(m);
  out.push_back(n);
  return Meta{out, a[0].dtype, a[0].device};
}
void matmul_cpu(const KernelArgs& k) {
  bool ta = k.attrs.trans_a, tb = k.attrs.trans_b;
  MatmulDims d = matmul_dims(k[0].shape(), k[1].shape(), ta, tb, k.out.shape());
  kernels::dispatch_float(k.out.dtype(), "matmul", [&](auto t) {
    using T = decltype(t);
    const T* A = k[0].data<T>();
    const T* B = k[1].data<T>();
    T* C = k.out.data<T>();
    if (d.a_batched && !d.b_batched && !ta) {  // fold the batch into M: one GEMM
      gemm(false, tb, d.batch * d.m, d.n, d.k, A, B, C);
      return;
    }
    for (std::int64_t i = 0; i < d.batch; ++i)
      gemm(ta, tb, d.m, d.n, d.k, A + (d.a_batched ? i * d.m * d.k : 0), B + (d.b_batched ? i * d.k * d.n : 0),
           C + i * d.m * d.n);
  });
}
// one strided-batched cuBLAS call; [B,M,K] x [K,N] folds the batch into M
AD_CUDA_ONLY(void matmul_cuda(const KernelArgs& k) {
  bool ta = k.attrs.trans_a, tb = k.attrs.trans_b;
  MatmulDims d = matmul_dims(k[0].shape(), k[1].shape(), ta, tb, k.out.shape());
  if (d.a_batched && !d.b_batched && !ta) {
    cuda_k::gemm(k.out.dtype(), false, tb, 1, d.batch * d.m, d.n, d.k, k[0].raw(), 0, k[1].raw(), 0, k.out.raw(), 0);
    return;
  }
  cuda_k::gemm(k.out.dtype(), ta, tb, d.batch, d.m, d.n, d.k, k[0].raw(), d.a_batched ? d.m * d.k : 0, k[1].raw(),
               d.b_batched ? d.k * d.n : 0, k.out.raw(), d.m * d.n);
})
double matmul_flops(const InferArgs& a, const Meta& out) {
  std::int64_t k = a.attrs.trans_a ? a[0].shape[a[0].shape.rank() - 2] : a[0].shape.back();
  return 2.0 * static_cast<double>(out.shape.numel()) * static_cast<double>(k);
}
// C = op(A) op(B): d op(A) = dC op(B)^T, d op(B) = op(A)^T dC
void matmul_bwd(BackwardArgs& a) {
  const Var &A = a.in[0], &B = a.in[1], &dC = a.dout;
  bool ta = a.attrs.trans_a, tb = a.attrs.trans_b;
  if (a.needs[0]) {
    Var g = ta ? matmul(B, dC, tb, true) : matmul(dC, B, false, !tb);
    a.grad[0] = g.shape() == A.shape() ? g : sum_to(g, A.shape());
  }
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
    a.grad[1] = g.shape() == B.shape() ? g : sum_to(g, B.shape());
  }
}
const OpDef op_def_matmul{.name = "matmul", .args = "a,b", .arity = 2, .infer = infer_matmul, .cpu = matmul_cpu, .cuda = AD_CUDA_FN(matmul_cuda),
                          .backward = matmul_bwd, .saves = saves_input(0) | saves_input(1),
                          .flops = matmul_flops};
Var matmul(const Operand& a, const Operand& b, bool trans_a, bool trans_b) {
  Attrs at;
  at.trans_a = trans_a;
  at.trans_b = trans_b;
  return make_node(OpId::matmul, {a, b}, at);
}

}  // namespace ad
