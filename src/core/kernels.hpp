#pragma once
// Internal helpers shared by CPU kernels: dtype dispatch, broadcasting
// iteration, in-place accumulation.
#include <fmt/format.h>

#include <cstdint>

#include "core/graph_impl.hpp"
#include "core/vec.hpp"

namespace ad::kernels {

// Calls f(T{}) with T = float or double for a compute dtype.
template <class F> decltype(auto) dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    default: break;
  }
  kernel_fail(op, fmt::format("no CPU kernel for dtype {}", dtype_name(t)));
}

// Applies out[i] = f(x[i]) over n elements. y may equal x (an op writing
// over a dying input: element i is read before it is written); other
// overlaps are not allowed. No __restrict: GCC's run-time overlap check
// lets the equal case through to the vector loop.
template <class T, class F> AD_VEC void map1(const T* x, T* y, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}
// out[i] = f(a[i], b[i]).
// y may equal a or b, as for map1.
template <class T, class F>
AD_VEC void map2(const T* a, const T* b, T* y, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
}

// out[i] = f(a[i], b[i], c[i]).
// y may equal a, b or c, as for map1.
template <class T, class F>
AD_VEC void map3(const T* a, const T* b, const T* c, T* y, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i], c[i]);
}

// Strides of `in` viewed through numpy broadcasting as `out` (0 on broadcast dims).
inline void broadcast_strides(const Shape& in, const Shape& out, std::int64_t* strides) {
  int off = out.rank() - in.rank();
  std::int64_t s = 1;
  for (int i = out.rank() - 1; i >= 0; --i) {
    int j = i - off;
    if (j < 0 || in[j] == 1) strides[i] = 0;
    else { strides[i] = s; }
    if (j >= 0) s *= in[j];
  }
}

// y = f(a, b) with numpy broadcasting of a and b to y's shape. The innermost
// dim runs as a contiguous loop (stride 1 or 0 for each input) so it vectorises.
template <class T, class F>
AD_VEC void broadcast2(const T* a, const Shape& as, const T* b, const Shape& bs, T* y, const Shape& ys, F f) {
  std::int64_t n = ys.numel();
  if (n == 0) return;
  if (as == ys && bs == ys) { map2(a, b, y, n, f); return; }
  int r = ys.rank();
  std::int64_t sa[kMaxRank]{}, sb[kMaxRank]{};
  broadcast_strides(as, ys, sa);
  broadcast_strides(bs, ys, sb);
  // merge trailing dims while both inputs stay contiguous-or-broadcast consistently
  std::int64_t inner = r ? ys[r - 1] : 1;
  std::int64_t ia = r ? sa[r - 1] : 0, ib = r ? sb[r - 1] : 0;
  int d = r - 2;
  for (; d >= 0; --d) {
    bool a_ok = (ia == 0 && sa[d] == 0) || (ia == 1 && sa[d] == inner);
    bool b_ok = (ib == 0 && sb[d] == 0) || (ib == 1 && sb[d] == inner);
    if (!a_ok || !b_ok) break;
    inner *= ys[d];
  }
  if (r == 0) { y[0] = f(a[0], b[0]); return; }
  std::int64_t outer = n / inner;
  std::int64_t idx[kMaxRank] = {0};
  std::int64_t oa = 0, ob = 0;
  for (std::int64_t o = 0; o < outer; ++o) {
    T* yo = y + o * inner;
    const T* ao = a + oa;
    const T* bo = b + ob;
    if (ia && ib) for (std::int64_t i = 0; i < inner; ++i) yo[i] = f(ao[i], bo[i]);
    else if (ia) { T bv = bo[0]; for (std::int64_t i = 0; i < inner; ++i) yo[i] = f(ao[i], bv); }
    else if (ib) { T av = ao[0]; for (std::int64_t i = 0; i < inner; ++i) yo[i] = f(av, bo[i]); }
    else { T v = f(ao[0], bo[0]); for (std::int64_t i = 0; i < inner; ++i) yo[i] = v; }
    // advance the odometer over dims 0..d
    for (int k = d; k >= 0; --k) {
      if (++idx[k] < ys[k]) { oa += sa[k]; ob += sb[k]; break; }
      oa -= sa[k] * (ys[k] - 1);
      ob -= sb[k] * (ys[k] - 1);
      idx[k] = 0;
    }
  }
}

// y = f(a, b, c) with numpy broadcasting of a, b and c to y's shape (where).
// As broadcast2: the trailing dims across which each input stays either
// contiguous (step 1) or constant (step 0) run as one inner loop. y may
// equal an input of y's shape (element i of each input is read before y[i]
// is written).
template <class T, class F>
AD_VEC void broadcast3(const T* a, const Shape& as, const T* b, const Shape& bs, const T* c, const Shape& cs, T* y,
                       const Shape& ys, F f) {
  std::int64_t n = ys.numel();
  if (n == 0) return;
  if (as == ys && bs == ys && cs == ys) { map3(a, b, c, y, n, f); return; }
  int r = ys.rank();
  if (r == 0) { y[0] = f(a[0], b[0], c[0]); return; }
  std::int64_t st[3][kMaxRank]{};
  broadcast_strides(as, ys, st[0]);
  broadcast_strides(bs, ys, st[1]);
  broadcast_strides(cs, ys, st[2]);
  // the inner run: dims r-1, r-2, ... while each input keeps its inner step (1: contiguous, 0: one value)
  std::int64_t inner = ys[r - 1];
  const std::int64_t ia = st[0][r - 1], ib = st[1][r - 1], ic = st[2][r - 1];
  int d = r - 2;
  for (; d >= 0; --d) {
    bool ok = true;
    for (const auto& s : st) {
      const std::int64_t step = s[r - 1];
      ok &= (step == 0 && s[d] == 0) || (step == 1 && s[d] == inner);
    }
    if (!ok) break;
    inner *= ys[d];
  }
  std::int64_t outer = n / inner;
  std::int64_t idx[kMaxRank] = {0};
  std::int64_t oa = 0, ob = 0, oc = 0;
  for (std::int64_t o = 0; o < outer; ++o) {
    T* yo = y + o * inner;
    const T *ao = a + oa, *bo = b + ob, *co = c + oc;
    if (ia && ib && ic) for (std::int64_t i = 0; i < inner; ++i) yo[i] = f(ao[i], bo[i], co[i]);
    else for (std::int64_t i = 0; i < inner; ++i) yo[i] = f(ao[i * ia], bo[i * ib], co[i * ic]);
    // advance the odometer over dims 0..d
    for (int k = d; k >= 0; --k) {
      if (++idx[k] < ys[k]) { oa += st[0][k]; ob += st[1][k]; oc += st[2][k]; break; }
      oa -= st[0][k] * (ys[k] - 1);
      ob -= st[1][k] * (ys[k] - 1);
      oc -= st[2][k] * (ys[k] - 1);
      idx[k] = 0;
    }
  }
}

// A shape seen around one axis: elements before it (outer), along it (len)
// and after it (inner); element (o, j, i) is at (o * len + j) * inner + i.
struct AxisSplit { std::int64_t outer, len, inner; };
inline AxisSplit split_at(const Shape& s, std::int64_t axis) {
  AxisSplit r{1, s[static_cast<int>(axis)], 1};
  for (int i = 0; i < axis; ++i) r.outer *= s[i];
  for (int i = static_cast<int>(axis) + 1; i < s.rank(); ++i) r.inner *= s[i];
  return r;
}

// acc += v (same shape and dtype).
void add_into(Tensor& acc, const Tensor& v);

// Row-major strides of a shape.
inline void contiguous_strides(const Shape& s, std::int64_t* st) {
  std::int64_t k = 1;
  for (int i = s.rank() - 1; i >= 0; --i) { st[i] = k; k *= s[i]; }
}

}  // namespace ad::kernels
