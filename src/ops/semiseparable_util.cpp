// Tensor-level utilities of the semiseparable family (not graph ops): the
// dense H, the T + U V^T factorisation of a dense matrix, and the multi-level
// HODLR form. LAPACK (dgesdd) through LAPACKE; all in double.
#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "ad/semiseparable.hpp"
#include "ad/tensor.hpp"

namespace ad {

namespace {
using i64 = std::int64_t;
using Mat = std::vector<double>;  // row-major

double frob(const Mat& a) {
  double s = 0;
  for (double v : a) s += v * v;
  return std::sqrt(s);
}
// Truncated SVD of a (m x n, row-major): a ~ us vt with us = U_k S_k (m x k),
// w = V_k (n x k), k = min(rank, m, n). Throws ad::Error when LAPACK fails.
void svd_truncate(const char* who, Mat a, i64 m, i64 n, i64 rank, Mat& us, Mat& w, i64& k) {
  i64 p = std::min(m, n);
  k = std::min(rank, p);
  us.assign(static_cast<std::size_t>(m * k), 0.0);
  w.assign(static_cast<std::size_t>(n * k), 0.0);
  if (k == 0) return;
  Mat s(static_cast<std::size_t>(p)), U(static_cast<std::size_t>(m * p)), Vt(static_cast<std::size_t>(p * n));
  lapack_int info = LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', static_cast<lapack_int>(m), static_cast<lapack_int>(n),
                                   a.data(), static_cast<lapack_int>(n), s.data(), U.data(),
                                   static_cast<lapack_int>(p), Vt.data(), static_cast<lapack_int>(n));
  if (info != 0) throw Error(fmt::format("{}: LAPACK dgesdd failed (info {}) on a {}x{} block", who, info, m, n));
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < k; ++j) us[static_cast<std::size_t>(i * k + j)] = U[static_cast<std::size_t>(i * p + j)] * s[static_cast<std::size_t>(j)];
  for (i64 i = 0; i < n; ++i)
    for (i64 j = 0; j < k; ++j) w[static_cast<std::size_t>(i * k + j)] = Vt[static_cast<std::size_t>(j * n + i)];
}
Tensor tensor_of(const Mat& v, const Shape& s) { return Tensor::from(std::span<const double>(v), s); }
}  // namespace

Tensor semiseparable_dense(const Tensor& t_diag, const Tensor& t_upper, const Tensor& t_lower, const Tensor& u,
                           const Tensor& v, bool causal) {
  i64 N = t_diag.numel();
  if (t_diag.rank() != 1 || t_upper.numel() != N - 1 || t_lower.numel() != N - 1 || u.rank() != 2 ||
      u.shape() != v.shape() || u.dim(0) != N)
    throw Error(fmt::format("semiseparable_dense: shapes do not fit: t_diag {} t_upper {} t_lower {} u {} v {}",
                            t_diag.shape().str(), t_upper.shape().str(), t_lower.shape().str(), u.shape().str(),
                            v.shape().str()));
  i64 r = u.dim(1);
  auto d = t_diag.to_vector(), up = t_upper.to_vector(), lo = t_lower.to_vector(), uu = u.to_vector(), vv = v.to_vector();
  Mat h(static_cast<std::size_t>(N * N), 0.0);
  for (i64 i = 0; i < N; ++i)
    for (i64 j = 0; j < (causal ? i + 1 : N); ++j) {
      double a = 0;
      for (i64 k = 0; k < r; ++k) a += uu[static_cast<std::size_t>(i * r + k)] * vv[static_cast<std::size_t>(j * r + k)];
      if (i == j) a += d[static_cast<std::size_t>(i)];
      if (j == i + 1) a += up[static_cast<std::size_t>(i)];
      if (i == j + 1) a += lo[static_cast<std::size_t>(j)];
      h[static_cast<std::size_t>(i * N + j)] = a;
    }
  return tensor_of(h, {N, N});
}

SemiseparableFactors semiseparable_factorize(const Tensor& h, i64 rank, int max_iters, double tol) {
  if (h.rank() != 2 || h.dim(0) != h.dim(1) || h.dim(0) < 1 || !is_floating(h.dtype()))
    throw Error(fmt::format("semiseparable_factorize: h must be a square float matrix (N, N) with N >= 1, got {}{}",
                            dtype_name(h.dtype()), h.shape().str()));
  i64 N = h.dim(0);
  if (rank < 0 || rank > N)
    throw Error(fmt::format("semiseparable_factorize: rank {} out of range [0, {}] for h {}", rank, N, h.shape().str()));
  if (max_iters < 0 || !(tol >= 0))
    throw Error(fmt::format("semiseparable_factorize: max_iters {} and tol {} must be >= 0", max_iters, tol));
  Mat H = h.to_vector();
  for (std::size_t i = 0; i < H.size(); ++i)
    if (!std::isfinite(H[i]))
      throw Error(fmt::format("semiseparable_factorize: h[{}, {}] = {} is not finite", static_cast<i64>(i) / N,
                              static_cast<i64>(i) % N, H[i]));
  const double hn = std::max(frob(H), 1e-300);
  auto band = [&](const Mat& a, Mat& d, Mat& up, Mat& lo) {
    d.assign(static_cast<std::size_t>(N), 0.0);
    up.assign(static_cast<std::size_t>(N - 1), 0.0);
    lo.assign(static_cast<std::size_t>(N - 1), 0.0);
    for (i64 i = 0; i < N; ++i) {
      d[static_cast<std::size_t>(i)] = a[static_cast<std::size_t>(i * N + i)];
      if (i + 1 < N) {
        up[static_cast<std::size_t>(i)] = a[static_cast<std::size_t>(i * N + i + 1)];
        lo[static_cast<std::size_t>(i)] = a[static_cast<std::size_t>((i + 1) * N + i)];
      }
    }
  };
  auto in_band = [](i64 i, i64 j) { return j - i <= 1 && i - j <= 1; };
  SemiseparableFactors f;
  Mat d, up, lo, us, w, L(static_cast<std::size_t>(N * N), 0.0);
  band(H, d, up, lo);
  i64 k = 0;
  double best = INFINITY;
  Mat bd, bu, bl, bus, bw;
  for (int it = 0; it < std::max(1, max_iters); ++it) {
    // L = svd_r(H - T): the band of H - L is what T takes next
    Mat R = H;
    for (i64 i = 0; i < N; ++i)
      for (i64 j = std::max<i64>(0, i - 1); j <= std::min(N - 1, i + 1); ++j)
        R[static_cast<std::size_t>(i * N + j)] -= (j == i ? d[static_cast<std::size_t>(i)]
                                                   : j == i + 1 ? up[static_cast<std::size_t>(i)]
                                                                : lo[static_cast<std::size_t>(j)]);
    svd_truncate("semiseparable_factorize", R, N, N, rank, us, w, k);
    ++f.iterations;
    std::fill(L.begin(), L.end(), 0.0);
    if (k > 0)
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(N), static_cast<int>(N), static_cast<int>(k),
                  1.0, us.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 0.0, L.data(), static_cast<int>(N));
    // T = band(H - L): the error left is H - L off the band
    Mat E(H.size());
    for (std::size_t i = 0; i < H.size(); ++i) E[i] = H[i] - L[i];
    band(E, d, up, lo);
    double off = 0;
    for (i64 i = 0; i < N; ++i)
      for (i64 j = 0; j < N; ++j)
        if (!in_band(i, j)) off += E[static_cast<std::size_t>(i * N + j)] * E[static_cast<std::size_t>(i * N + j)];
    double err = std::sqrt(off) / hn;
    bool improved = err < best * (1 - 1e-3);
    if (err < best) { best = err; bd = d; bu = up; bl = lo; bus = us; bw = w; }
    if (best <= tol || !improved) break;
  }
  f.rel_error = best;
  f.t_diag = tensor_of(bd, {N});
  f.t_upper = tensor_of(bu, {N - 1});
  f.t_lower = tensor_of(bl, {N - 1});
  // u, v (N, rank): columns past the numerical rank k are zero
  Mat U(static_cast<std::size_t>(N * rank), 0.0), V(static_cast<std::size_t>(N * rank), 0.0);
  for (i64 i = 0; i < N; ++i)
    for (i64 j = 0; j < k; ++j) {
      U[static_cast<std::size_t>(i * rank + j)] = bus[static_cast<std::size_t>(i * k + j)];
      V[static_cast<std::size_t>(i * rank + j)] = bw[static_cast<std::size_t>(i * k + j)];
    }
  f.u = tensor_of(U, {N, rank});
  f.v = tensor_of(V, {N, rank});
  return f;
}

// ---- Hodlr ----
Hodlr Hodlr::build(const Tensor& h, i64 rank, i64 leaf) {
  if (h.rank() != 2 || h.dim(0) != h.dim(1) || h.dim(0) < 1 || !is_floating(h.dtype()))
    throw Error(fmt::format("Hodlr::build: h must be a square float matrix (N, N) with N >= 1, got {}{}",
                            dtype_name(h.dtype()), h.shape().str()));
  if (rank < 0 || leaf < 1)
    throw Error(fmt::format("Hodlr::build: rank {} must be >= 0 and leaf {} >= 1 (h {})", rank, leaf, h.shape().str()));
  Hodlr m;
  m.n_ = h.dim(0);
  m.rank_ = rank;
  m.leaf_ = leaf;
  Mat H = h.to_vector();
  m.build_block(H, 0, m.n_, 0);
  return m;
}

int Hodlr::build_block(const std::vector<double>& h, i64 lo, i64 hi, int depth) {
  int id = static_cast<int>(blocks_.size());
  blocks_.emplace_back();
  levels_ = std::max<i64>(levels_, depth + 1);
  i64 n = hi - lo;
  Block b;
  b.lo = lo;
  b.hi = hi;
  if (n <= leaf_) {
    b.dense.resize(static_cast<std::size_t>(n * n));
    for (i64 i = 0; i < n; ++i)
      for (i64 j = 0; j < n; ++j) b.dense[static_cast<std::size_t>(i * n + j)] = h[static_cast<std::size_t>((lo + i) * n_ + lo + j)];
    blocks_[static_cast<std::size_t>(id)] = std::move(b);
    return id;
  }
  b.mid = lo + n / 2;
  auto sub = [&](i64 r0, i64 r1, i64 c0, i64 c1) {
    Mat a(static_cast<std::size_t>((r1 - r0) * (c1 - c0)));
    for (i64 i = r0; i < r1; ++i)
      for (i64 j = c0; j < c1; ++j) a[static_cast<std::size_t>((i - r0) * (c1 - c0) + j - c0)] = h[static_cast<std::size_t>(i * n_ + j)];
    return a;
  };
  svd_truncate("Hodlr::build", sub(lo, b.mid, b.mid, hi), b.mid - lo, hi - b.mid, rank_, b.u12, b.v12, b.k12);
  svd_truncate("Hodlr::build", sub(b.mid, hi, lo, b.mid), hi - b.mid, b.mid - lo, rank_, b.u21, b.v21, b.k21);
  i64 mid = b.mid;
  blocks_[static_cast<std::size_t>(id)] = std::move(b);
  int c0 = build_block(h, lo, mid, depth + 1);
  int c1 = build_block(h, mid, hi, depth + 1);
  blocks_[static_cast<std::size_t>(id)].child[0] = c0;
  blocks_[static_cast<std::size_t>(id)].child[1] = c1;
  return id;
}

i64 Hodlr::stored_elements() const {
  i64 s = 0;
  for (const Block& b : blocks_)
    s += static_cast<i64>(b.dense.size() + b.u12.size() + b.v12.size() + b.u21.size() + b.v21.size());
  return s;
}

// y[lo:hi] = H[lo:hi, lo:hi] x[lo:hi] (x, y point at row lo; D columns)
void Hodlr::apply(int id, const double* x, double* y, i64 D) const {
  const Block& b = blocks_[static_cast<std::size_t>(id)];
  i64 n = b.hi - b.lo;
  if (b.child[0] < 0) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(D), static_cast<int>(n),
                1.0, b.dense.data(), static_cast<int>(n), x, static_cast<int>(D), 0.0, y, static_cast<int>(D));
    return;
  }
  i64 m1 = b.mid - b.lo, m2 = b.hi - b.mid;
  apply(b.child[0], x, y, D);
  apply(b.child[1], x + m1 * D, y + m1 * D, D);
  std::vector<double> t(static_cast<std::size_t>(std::max(b.k12, b.k21) * D));
  auto lowrank = [&](const Mat& u, const Mat& v, i64 k, i64 rows, i64 cols, const double* xs, double* ys) {
    if (k == 0) return;
    // t = v^T xs (k x D); ys += u t
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(k), static_cast<int>(D), static_cast<int>(cols),
                1.0, v.data(), static_cast<int>(k), xs, static_cast<int>(D), 0.0, t.data(), static_cast<int>(D));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(D), static_cast<int>(k),
                1.0, u.data(), static_cast<int>(k), t.data(), static_cast<int>(D), 1.0, ys, static_cast<int>(D));
  };
  lowrank(b.u12, b.v12, b.k12, m1, m2, x + m1 * D, y);
  lowrank(b.u21, b.v21, b.k21, m2, m1, x, y + m1 * D);
}

Tensor Hodlr::matvec(const Tensor& x) const {
  if (blocks_.empty()) throw Error("Hodlr::matvec: an empty Hodlr (default-constructed); build one with Hodlr::build");
  bool vec = x.rank() == 1;
  if ((x.rank() != 1 && x.rank() != 2) || x.dim(0) != n_ || !is_floating(x.dtype()))
    throw Error(fmt::format("Hodlr::matvec: x must be (N) or (N, D) with N = {}, got {}{}", n_, dtype_name(x.dtype()),
                            x.shape().str()));
  i64 D = vec ? 1 : x.dim(1);
  Mat xs = x.to_vector(), ys(xs.size(), 0.0);
  if (D > 0) apply(0, xs.data(), ys.data(), D);
  return tensor_of(ys, x.shape());
}

}  // namespace ad
