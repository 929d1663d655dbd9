// CPU kernels of semiseparable_matvec (and its gradient) and of the
// Woodbury solve (and its gradient). See semiseparable_cpu.hpp.
#include "ops/semiseparable_cpu.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/graph_impl.hpp"
#include "core/vec.hpp"
#include "ops/parallel.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define AD_STREAM_STORES 1
#else
#define AD_STREAM_STORES 0
#endif
#include <unistd.h>

namespace ad::semisep {

namespace {
std::atomic<std::size_t> g_stream_min{0};  // 0: not yet read from the machine
std::atomic<int> g_backward_sweeps{0};     // set_cpu_backward_sweeps
}  // namespace
int set_cpu_backward_sweeps(int mode) { return g_backward_sweeps.exchange(mode); }

namespace {
using i64 = std::int64_t;

// Hot f32 tasks are compiled for x86-64-v4 (AVX-512 with VL), x86-64-v3
// (AVX2 + FMA) and baseline x86-64 and picked at load time (target_clones,
// core/vec.hpp; the row helpers are force-inlined into each clone). Plain
// "avx512f" / "avx2" targets would leave out FMA for 16- and 32-byte vectors
// (and the upper 16 registers at those widths): the rows of du and dv at
// small r, and the last columns of any D, then ran as separate multiplies and
// adds. The AVX clones fuse a*b+c into FMA, so bits can differ between
// machines of different ISA; on one machine they are fixed (and independent
// of the thread count).
#define AD_SIMD_CLONES AD_TARGET_CLONES("arch=x86-64-v4", "arch=x86-64-v3", "default")
#define AD_ALWAYS_INLINE __attribute__((always_inline)) inline

// y[:] += sum_k w[k] S[k, :] (sums over k in order). 64-byte blocks of y are
// held in a register (GCC/Clang vector extension: one zmm, two ymm or four
// xmm, whatever the clone's ISA has) across the loop over k.
template <class T> AD_ALWAYS_INLINE void mix_acc(T* __restrict y, const T* __restrict w, const T* __restrict S, i64 r, i64 D) {
  constexpr i64 kW = 64 / static_cast<i64>(sizeof(T));
  typedef T V __attribute__((vector_size(64)));
  i64 c0 = 0;
  for (; c0 + kW <= D; c0 += kW) {
    V acc;
    std::memcpy(&acc, y + c0, sizeof(V));
    for (i64 k = 0; k < r; ++k) {
      V sv;
      std::memcpy(&sv, S + k * D + c0, sizeof(V));
      acc += w[k] * sv;
    }
    std::memcpy(y + c0, &acc, sizeof(V));
  }
  for (i64 k = 0; k < r; ++k) {
    T wk = w[k];
    const T* s = S + k * D;
    for (i64 c = c0; c < D; ++c) y[c] += wk * s[c];
  }
}
// sum_c a[c] b[c]: 64-byte vector partial sums, then a fixed pairwise tree
// over the lanes (vectorises; the same order every call). Without AVX-512
// the 64-byte partial sums are kept as two 32-byte halves (the same lanes,
// the same bits): GCC would otherwise hold a 64-byte vector on the stack.
template <class T> AD_ALWAYS_INLINE T dot(const T* __restrict a, const T* __restrict b, i64 n) {
  constexpr i64 kW = 64 / static_cast<i64>(sizeof(T)), kH = kW / 2;
  typedef T V __attribute__((vector_size(64)));
  typedef T V32 __attribute__((vector_size(32)));
  typedef T V16 __attribute__((vector_size(16)));
  V32 h0 = {}, h1 = {};  // lanes [0, kW/2) and [kW/2, kW) of the partial sums
  i64 i = 0;
  if (wide_vectors()) {
    V acc = {};
    for (; i + kW <= n; i += kW) {
      V va, vb;
      std::memcpy(&va, a + i, sizeof(V));
      std::memcpy(&vb, b + i, sizeof(V));
      acc += va * vb;
    }
    std::memcpy(&h0, &acc, 32);
    std::memcpy(&h1, reinterpret_cast<const char*>(&acc) + 32, 32);
  } else {
    for (; i + kW <= n; i += kW) {
      V32 a0, a1, b0, b1;
      std::memcpy(&a0, a + i, 32);
      std::memcpy(&a1, a + i + kH, 32);
      std::memcpy(&b0, b + i, 32);
      std::memcpy(&b1, b + i + kH, 32);
      h0 += a0 * b0;
      h1 += a1 * b1;
    }
  }
  // lanes j += j + kW/2, then j += j + kW/4, ...: halves of the register added
  h0 += h1;
  V16 q0, q1;
  std::memcpy(&q0, &h0, 16);
  std::memcpy(&q1, reinterpret_cast<const char*>(&h0) + 16, 16);
  q0 += q1;
  T l[16 / sizeof(T)];
  std::memcpy(l, &q0, 16);
  T t;
  if constexpr (sizeof(T) == 4) t = (l[0] + l[2]) + (l[1] + l[3]);
  else t = l[0] + l[1];
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}
// dot() of four pairs of f32 rows at once (row p: a + p sa, b + p sb; n a
// multiple of 16): the same products and the same tree per row as dot(), but
// the four trees share their shuffles (one add per level for all four).
// Without AVX-512 in 32-byte halves (dot4_halves), as dot() does.
AD_ALWAYS_INLINE void dot4_halves(const float* __restrict a, i64 sa, const float* __restrict b, i64 sb, i64 n,
                                  float* out) {
  typedef float V __attribute__((vector_size(32)));
  V lo[4] = {}, hi[4] = {};  // lanes 0..7 and 8..15 of row p's partial sums
  for (i64 i = 0; i < n; i += 16)
    for (int p = 0; p < 4; ++p) {
      V a0, a1, b0, b1;
      std::memcpy(&a0, a + p * sa + i, 32);
      std::memcpy(&a1, a + p * sa + i + 8, 32);
      std::memcpy(&b0, b + p * sb + i, 32);
      std::memcpy(&b1, b + p * sb + i + 8, 32);
      lo[p] += a0 * b0;
      hi[p] += a1 * b1;
    }
  // lane j + lane j + 8
  V s[4];
  for (int p = 0; p < 4; ++p) s[p] = lo[p] + hi[p];
  // lane j + lane j + 4: rows 0, 1 (then 2, 3) side by side, l0..l3 each
  V u01 = __builtin_shufflevector(s[0], s[1], 0, 1, 2, 3, 8, 9, 10, 11) +
          __builtin_shufflevector(s[0], s[1], 4, 5, 6, 7, 12, 13, 14, 15);
  V u23 = __builtin_shufflevector(s[2], s[3], 0, 1, 2, 3, 8, 9, 10, 11) +
          __builtin_shufflevector(s[2], s[3], 4, 5, 6, 7, 12, 13, 14, 15);
  // (l0 + l2) + (l1 + l3)
  V e01 = u01 + __builtin_shufflevector(u01, u01, 2, 3, 2, 3, 6, 7, 6, 7);
  V e23 = u23 + __builtin_shufflevector(u23, u23, 2, 3, 2, 3, 6, 7, 6, 7);
  V t01 = e01 + __builtin_shufflevector(e01, e01, 1, 1, 1, 1, 5, 5, 5, 5);
  V t23 = e23 + __builtin_shufflevector(e23, e23, 1, 1, 1, 1, 5, 5, 5, 5);
  out[0] = t01[0];
  out[1] = t01[4];
  out[2] = t23[0];
  out[3] = t23[4];
}
AD_ALWAYS_INLINE void dot4(const float* __restrict a, i64 sa, const float* __restrict b, i64 sb, i64 n, float* out) {
  if (!wide_vectors()) return dot4_halves(a, sa, b, sb, n, out);
  typedef float V __attribute__((vector_size(64)));
  V acc[4] = {};
  for (i64 i = 0; i < n; i += 16)
    for (int p = 0; p < 4; ++p) {
      V va, vb;
      std::memcpy(&va, a + p * sa + i, sizeof(V));
      std::memcpy(&vb, b + p * sb + i, sizeof(V));
      acc[p] += va * vb;
    }
  // lane j + lane j + 8: rows 0, 1 then rows 2, 3 side by side
  V s01 = __builtin_shufflevector(acc[0], acc[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
          __builtin_shufflevector(acc[0], acc[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  V s23 = __builtin_shufflevector(acc[2], acc[3], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
          __builtin_shufflevector(acc[2], acc[3], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  // lane j + lane j + 4: quad p holds row p's l0..l3
  V q = __builtin_shufflevector(s01, s23, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
        __builtin_shufflevector(s01, s23, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  // (l0 + l2) + (l1 + l3)
  V e = q + __builtin_shufflevector(q, q, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  V t = e + __builtin_shufflevector(e, e, 1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9, 13, 13, 13, 13);
  for (int p = 0; p < 4; ++p) out[p] = t[4 * p];
}
// Stored bf16/f16 elements [first, first + n) converted to f32 (exact); the
// next n (up to `end`) prefetched, so a task's next block is on its way while
// it works on this one.
template <class H> AD_ALWAYS_INLINE void convert_rows(const void* src, i64 first, i64 end, float* dst, i64 n) {
  const H* s = static_cast<const H*>(src);
  for (i64 e = 0; e < n; ++e) dst[e] = to_compute(s[first + e]);
  const char* next = reinterpret_cast<const char*>(s + first + n);
  const i64 ahead = std::min(n, end - first - n) * static_cast<i64>(sizeof(H));
  for (i64 o = 0; o < ahead; o += 64) __builtin_prefetch(next + o);
}
AD_SIMD_CLONES void bf16_rows(const void* src, i64 first, i64 end, float* dst, i64 n) {
  convert_rows<Bf16>(src, first, end, dst, n);
}
AD_SIMD_CLONES void f16_rows(const void* src, i64 first, i64 end, float* dst, i64 n) {
  convert_rows<F16>(src, first, end, dst, n);
}
// Rows of U or V (r columns) in the compute type, handed to a task a block of
// rows at a time: the stored rows themselves, or (bf16/f16) converted into the
// task's buffer by the cloned functions above. So each task is compiled once
// per compute type whatever U and V are stored as, and a converted block
// stays in L1 (forward) or L2 (the backward's chunk).
template <class T> struct RowSource {
  const T* rows = nullptr;  // stored in the compute type, or
  const void* stored = nullptr;
  void (*convert)(const void*, i64, i64, T*, i64) = nullptr;
  i64 r = 0, N = 0;
  // scratch for `n` converted rows (none when they are used in place)
  std::unique_ptr<T[]> buffer(i64 n) const {
    return convert ? std::unique_ptr<T[]>(new T[static_cast<std::size_t>(n * r)]) : nullptr;
  }
  // rows [i, i + n)
  AD_ALWAYS_INLINE const T* block(i64 i, i64 n, T* buf) const {
    if (!convert) return rows + i * r;
    convert(stored, i * r, N * r, buf, n * r);
    return buf;
  }
};
template <class T, class UV> RowSource<T> row_source(const UV* p, i64 N, i64 r) {
  RowSource<T> s;
  s.r = r;
  s.N = N;
  if constexpr (std::is_same_v<T, UV>) s.rows = p;
  else if constexpr (std::is_same_v<UV, Bf16>) s.stored = p, s.convert = bf16_rows;
  else s.stored = p, s.convert = f16_rows;
  return s;
}
// Rows per block of the forward tasks (a block of converted U or V rows in L1)
constexpr i64 kRowBlock = 64;

// Where a row of y starts before the first block of M's rows adds to it:
// Fill{false}: y's own values (it accumulates); Fill{true}: zero.
struct Fill {
  bool zero = false;
  template <class V, class T> AD_ALWAYS_INLINE void vec(V& yv, const T* y, i64 D, i64 i, i64 c0) const {
    if (zero) yv = V{};
    else std::memcpy(&yv, y + i * D + c0, sizeof(V));
  }
  template <class T> AD_ALWAYS_INLINE T at(const T* y, i64 D, i64 i, i64 c) const { return zero ? T(0) : y[i * D + c]; }
};
// Band: the tridiagonal rows pre_{g-1} s_{i-1} + dg_g s_i + nxt_g s_{i+1} of the
// rows s (D columns, row i is global row g = off + i of N); a neighbour is
// absent at the ends and where its coefficients are (nullptr). vec: a
// vector block of columns; at: one column; row: a whole row (without U V^T).
template <class T> struct Band {
  const T *s, *pre, *dg, *nxt;
  i64 off, N;
  template <class V> AD_ALWAYS_INLINE void vec(V& yv, const T*, i64 D, i64 i, i64 c0) const {
    const i64 g = off + i;
    const bool p = pre && g > 0, n = nxt && g + 1 < N;
    const T* si = s + i * D + c0;
    V xv, xp, xn;
    std::memcpy(&xv, si, sizeof(V));
    if (p) std::memcpy(&xp, si - D, sizeof(V));
    if (n) std::memcpy(&xn, si + D, sizeof(V));
    if (p && n) yv = pre[g - 1] * xp + dg[g] * xv + nxt[g] * xn;
    else if (p) yv = pre[g - 1] * xp + dg[g] * xv;
    else if (n) yv = dg[g] * xv + nxt[g] * xn;
    else yv = dg[g] * xv;
  }
  AD_ALWAYS_INLINE T at(const T*, i64 D, i64 i, i64 c) const {
    const i64 g = off + i;
    const bool p = pre && g > 0, n = nxt && g + 1 < N;
    const T* si = s + i * D + c;
    if (p && n) return tridiag_row(pre[g - 1], dg[g], nxt[g], si[-D], si[0], si[D]);
    if (p) return pre[g - 1] * si[-D] + dg[g] * si[0];
    if (n) return dg[g] * si[0] + nxt[g] * si[D];
    return dg[g] * si[0];
  }
  AD_ALWAYS_INLINE void row(T* __restrict yi, i64 D, i64 i) const {
    for (i64 c = 0; c < D; ++c) yi[c] = at(nullptr, D, i, c);
  }
};

// Stores of finished rows of a large output bypass the cache (non-temporal,
// in 16-byte pieces: SSE, so every clone has them): the row is not read
// first (no read for ownership) and does not evict the inputs still to be
// read. Worth it only when the output cannot stay in cache for its reader
// anyway (stream_min_bytes). The task that streamed ends with stream_fence().
bool streams(std::size_t out_bytes) {
#if AD_STREAM_STORES
  return out_bytes >= stream_min_bytes();
#else
  (void)out_bytes;
  return false;
#endif
}
// rows of y (D columns) start 16-byte aligned
template <class T> bool rows_aligned(const T* y, i64 D) {
  return reinterpret_cast<std::uintptr_t>(y) % 16 == 0 && (D * static_cast<i64>(sizeof(T))) % 16 == 0;
}
AD_ALWAYS_INLINE void stream_fence() {
#if AD_STREAM_STORES
  _mm_sfence();
#endif
}
template <int Q, class T, class V> AD_ALWAYS_INLINE void stream16(T* p, const V& v) {
#if AD_STREAM_STORES
  if constexpr (sizeof(T) == 4) {
    typedef float V4 __attribute__((vector_size(16)));
    V4 q = __builtin_shufflevector(v, v, 4 * Q, 4 * Q + 1, 4 * Q + 2, 4 * Q + 3);
    _mm_stream_ps(reinterpret_cast<float*>(p) + 4 * Q, reinterpret_cast<__m128>(q));
  } else {
    typedef double V2 __attribute__((vector_size(16)));
    V2 q = __builtin_shufflevector(v, v, 2 * Q, 2 * Q + 1);
    _mm_stream_pd(reinterpret_cast<double*>(p) + 2 * Q, reinterpret_cast<__m128d>(q));
  }
#else
  (void)p; (void)v;
#endif
}
// y[0 .. VB) = v; streamed past the cache when `stream` (p 16-byte aligned)
template <class T, class V> AD_ALWAYS_INLINE void put(T* p, const V& v, bool stream) {
#if AD_STREAM_STORES
  if (stream) {
    stream16<0>(p, v);
    if constexpr (sizeof(V) >= 32) stream16<1>(p, v);
    if constexpr (sizeof(V) >= 64) { stream16<2>(p, v); stream16<3>(p, v); }
    return;
  }
#endif
  std::memcpy(p, &v, sizeof(V));
}

// Sweeps over the rows [i0, i1) of a chunk (in order, or reversed) with an
// r x D state M (row-major):
//   sums: M[k, :] += a_i[k] x_i[:]
//   mix:  y_i[:] = start_i[:] + sum_k b_i[k] M[k, :]            (M read only)
//   scan: M[k, :] += a_i[k] x_i[:], then y_i[:] = start_i[:] + sum_k b_i[k] M[k, :]
// (start: Fill or Band above). Every element gets its terms in the same
// order whatever the blocking below: M's in row order, y_i's in increasing k
// after its start (GCC/Clang vector extension; one zmm, two ymm or four xmm
// per 64 bytes, whatever the clone's ISA has).
//
// sums (accumulate): tiles of rows of M by one or two vectors of columns in
// registers for the whole run of rows, one independent FMA chain per
// vector; a pair of vectors shares each broadcast a_i[k] (4 x 2 tiles, 8 x 2
// with AVX-512's 32 registers; on an AVX2 host 1.4x faster than 8 x 1).
//
// mix (mix_rows): tiles of 4 rows of y by two vectors of columns in
// registers across the loop over k. A row's own sum is a chain of r
// dependent FMAs; with M in registers instead and one row at a time (as mix
// ran until 2026-11-26) that chain, not memory, set the pace: on an AVX2
// host the forward matvec at r = 16 now runs 1.6x faster. Each y_i is
// written once, streamed past the cache when `stream` (the caller checked
// rows_aligned).
//
// scan (scan_body): M's block in registers, one row at a time (y_i's chain
// stays: row i's sum needs M after row i). Keeping snapshots of M per row
// and mixing them in tiles as above was tried (2026-11-26): as fast in
// cache, 1.5x slower at N = 2^22 on an AVX2 host.

// A sweep over the columns [c0, c0 + w) of every row streams its stores only
// when they fill whole 64-byte lines (whole rows, or 64-byte pieces of rows
// of a multiple of 64 bytes): the two halves of a line stored by two sweeps
// far apart in time leave part-filled write-combining buffers, each a
// partial-line write at the memory (AVX2 EPYC host, r = 4, causal, N = 2^22:
// 103 ms with half-line sweeps streamed, 77 ms plain, 2026-11-26).
template <class T> bool fills_lines(i64 D, i64 c0, i64 w) {
  constexpr i64 s = sizeof(T);
  return (c0 == 0 && w == D) || ((D * s) % 64 == 0 && (c0 * s) % 64 == 0 && (w * s) % 64 == 0);
}

// Row i of a matrix: base + (i - origin) * stride.
template <class T> struct RowPtr {
  const T* base;
  i64 origin, stride;
  AD_ALWAYS_INLINE const T* operator()(i64 i) const { return base + (i - origin) * stride; }
};
template <int KN, int NC, int VB, class T, class RowA>
AD_ALWAYS_INLINE void sums_block(T* M, const T* x, i64 D, i64 c0, i64 k0, i64 i0, i64 i1, bool reverse, RowA& arow) {
  typedef T V __attribute__((vector_size(VB)));
  constexpr i64 kW = VB / static_cast<i64>(sizeof(T));
  V m[KN][NC];
  for (int q = 0; q < KN; ++q)
    for (int j = 0; j < NC; ++j) std::memcpy(&m[q][j], M + (k0 + q) * D + c0 + j * kW, sizeof(V));
  // rows s, s + dir, ...: addresses affine in t (stepped pointers once
  // compiled), no index arithmetic per row
  const i64 dir = reverse ? -1 : 1, s = reverse ? i1 - 1 : i0, as = dir * arow.stride, xs = dir * D;
  const T* a0 = arow(s) + k0;
  const T* x0 = x + s * D + c0;
  for (i64 t = 0, n = i1 - i0; t < n; ++t) {
    const T* a = a0 + t * as;  // (a[q]: constant offsets, no index register per q)
    const T* xp = x0 + t * xs;
    V xv[NC];
    for (int j = 0; j < NC; ++j) std::memcpy(&xv[j], xp + j * kW, sizeof(V));
    for (int q = 0; q < KN; ++q)
      for (int j = 0; j < NC; ++j) m[q][j] += a[q] * xv[j];
  }
  for (int q = 0; q < KN; ++q)
    for (int j = 0; j < NC; ++j) std::memcpy(M + (k0 + q) * D + c0 + j * kW, &m[q][j], sizeof(V));
}
// Rows [k0, r) of M by blocks of KN0 rows, then halves of it down to 1.
template <int KN0, int NC, int VB, class T, class RowA>
AD_ALWAYS_INLINE void sums_rows_of_m(T* M, const T* x, i64 D, i64 r, i64 c0, i64 i0, i64 i1, bool reverse,
                                     RowA& arow) {
  i64 k0 = 0;
  for (; k0 + KN0 <= r; k0 += KN0) sums_block<KN0, NC, VB>(M, x, D, c0, k0, i0, i1, reverse, arow);
  if constexpr (KN0 > 1) {
    constexpr int H = KN0 / 2;
    for (; k0 + H <= r; k0 += H) sums_block<H, NC, VB>(M, x, D, c0, k0, i0, i1, reverse, arow);
    if constexpr (H > 1) {
      constexpr int Q = H / 2;
      for (; k0 + Q <= r; k0 += Q) sums_block<Q, NC, VB>(M, x, D, c0, k0, i0, i1, reverse, arow);
      for (; k0 < r; ++k0) sums_block<1, NC, VB>(M, x, D, c0, k0, i0, i1, reverse, arow);
    }
  }
}
// Column pairs, then one column block, of VB bytes from c0; returns the first
// column left. A pair shares each broadcast a_i[k] between two vectors
// (blocks of 4 rows of M, 8 with AVX-512: 8 or 16 accumulators); on an AVX2
// host 4 x 2 tiles ran 1.4x faster than 8 x 1.
template <int VB, class T, class RowA>
AD_ALWAYS_INLINE i64 sums_cols(T* M, const T* x, i64 D, i64 r, i64 c0, i64 i0, i64 i1, bool reverse, RowA& arow) {
  constexpr i64 kW = VB / static_cast<i64>(sizeof(T));
  const bool wide = wide_vectors();
  for (; c0 + 2 * kW <= D; c0 += 2 * kW) {
    if (wide) sums_rows_of_m<8, 2, VB>(M, x, D, r, c0, i0, i1, reverse, arow);
    else sums_rows_of_m<4, 2, VB>(M, x, D, r, c0, i0, i1, reverse, arow);
  }
  if (c0 + kW <= D) {
    if (wide) sums_rows_of_m<16, 1, VB>(M, x, D, r, c0, i0, i1, reverse, arow);
    else sums_rows_of_m<8, 1, VB>(M, x, D, r, c0, i0, i1, reverse, arow);
    c0 += kW;
  }
  return c0;
}
// 64-, then 32-, then 16-byte blocks; without AVX-512 from 32 bytes: a block
// of M held as 64-byte vectors then lives on the stack, not in registers
// (GCC splits each into two 256-bit halves through memory; on an AVX2 host
// the sweeps ran up to 2x slower). Only where GCC fuses multiply-adds may
// the bits differ between widths (the full forward's band start on an AVX2
// host changed its last bits with this); on one machine they stay fixed.
template <class T, class RowA>
AD_ALWAYS_INLINE void accumulate(T* M, const T* x, i64 D, i64 r, i64 i0, i64 i1, bool reverse, RowA& arow) {
  i64 c0 = wide_vectors() ? sums_cols<64>(M, x, D, r, 0, i0, i1, reverse, arow) : 0;
  c0 = sums_cols<32>(M, x, D, r, c0, i0, i1, reverse, arow);
  c0 = sums_cols<16>(M, x, D, r, c0, i0, i1, reverse, arow);
  if (c0 == D) return;
  for (i64 t = 0, n = i1 - i0; t < n; ++t) {  // the last columns (fewer than 16 bytes)
    i64 i = reverse ? i1 - 1 - t : i0 + t;
    const T* a = arow(i);
    for (i64 k = 0; k < r; ++k)
      for (i64 c = c0; c < D; ++c) M[k * D + c] += a[k] * x[i * D + c];
  }
}

// y_i[c0, c0 + NC W) = start_i + sum_k b_i[k] M[k, c0 .. c0 + NC W) for the R
// rows i = i0 + p (each vector of M loaded once for the R rows).
template <int R, int NC, int VB, class T, class RowB, class Start>
AD_ALWAYS_INLINE void mix_tile(const T* M, T* y, i64 D, i64 r, i64 c0, i64 i0, RowB& brow, const Start& start,
                               bool stream) {
  typedef T V __attribute__((vector_size(VB)));
  constexpr i64 kW = VB / static_cast<i64>(sizeof(T));
  V acc[R][NC];
  const T* b[R];
  for (int p = 0; p < R; ++p) {
    b[p] = brow(i0 + p);
    for (int j = 0; j < NC; ++j) start.vec(acc[p][j], y, D, i0 + p, c0 + j * kW);
  }
  for (i64 k = 0; k < r; ++k) {
    V mv[NC];
    for (int j = 0; j < NC; ++j) std::memcpy(&mv[j], M + k * D + c0 + j * kW, sizeof(V));
    for (int p = 0; p < R; ++p)
      for (int j = 0; j < NC; ++j) acc[p][j] += b[p][k] * mv[j];
  }
  for (int p = 0; p < R; ++p)
    for (int j = 0; j < NC; ++j) put(y + (i0 + p) * D + c0 + j * kW, acc[p][j], stream);
}
// Column pairs, then one column block, of VB bytes from c0; returns the first column left.
template <int VB, class T, class RowB, class Start>
AD_ALWAYS_INLINE i64 mix_cols(const T* M, T* y, i64 D, i64 r, i64 c0, i64 i0, i64 i1, RowB& brow,
                              const Start& start, bool stream) {
  constexpr i64 kW = VB / static_cast<i64>(sizeof(T));
  for (; c0 + 2 * kW <= D; c0 += 2 * kW) {
    const bool st = stream && fills_lines<T>(D, c0, 2 * kW);
    i64 i = i0;
    for (; i + 4 <= i1; i += 4) mix_tile<4, 2, VB>(M, y, D, r, c0, i, brow, start, st);
    for (; i < i1; ++i) mix_tile<1, 2, VB>(M, y, D, r, c0, i, brow, start, st);
  }
  if (c0 + kW <= D) {
    const bool st = stream && fills_lines<T>(D, c0, kW);
    i64 i = i0;
    for (; i + 8 <= i1; i += 8) mix_tile<8, 1, VB>(M, y, D, r, c0, i, brow, start, st);
    for (; i < i1; ++i) mix_tile<1, 1, VB>(M, y, D, r, c0, i, brow, start, st);
    c0 += kW;
  }
  return c0;
}
template <class T, class RowB, class Start>
AD_ALWAYS_INLINE void mix_rows(const T* M, T* y, i64 D, i64 r, i64 i0, i64 i1, RowB& brow, const Start& start,
                               bool stream) {
  i64 c0 = wide_vectors() ? mix_cols<64>(M, y, D, r, 0, i0, i1, brow, start, stream) : 0;
  c0 = mix_cols<32>(M, y, D, r, c0, i0, i1, brow, start, stream);
  c0 = mix_cols<16>(M, y, D, r, c0, i0, i1, brow, start, stream);
  if (c0 == D) return;
  for (i64 i = i0; i < i1; ++i) {  // the last columns (fewer than 16 bytes)
    const T* b = brow(i);
    for (i64 c = c0; c < D; ++c) y[i * D + c] = start.at(y, D, i, c);
    for (i64 k = 0; k < r; ++k)
      for (i64 c = c0; c < D; ++c) y[i * D + c] += b[k] * M[k * D + c];
  }
}

// scan: one block of KN rows of M by NC vectors of VB bytes of columns in
// registers for the whole run of rows; y_i (those columns) gets the block's
// terms. `first`: the first block of M's rows (y_i starts from `start`, else
// from its own values).
// Rows t = 0, 1, ... of a sweep's partial y: p + t * step.
template <class T> struct SweepRows { T* p; i64 step; };
// One sweep of scan_block over n rows: row t is global row s + dir * t; its
// rows of a (M's update), b (y's mix), x and y at base + t * step (stepped
// pointers once compiled, no index arithmetic per row).
template <class T> struct ScanWalk {
  const T *a0, *b0, *x0;
  i64 as, bs, xs;
  SweepRows<const T> yin;  // y's partial sums read (after the first block)
  SweepRows<T> yout;       // and written
  i64 s, dir, n;
};
// The rows of one block; a function per First: the branch on it inside the
// row loop (the band's start needs registers of its own) made GCC keep m on
// the stack, spilled and reloaded every row. The first block streams when
// `stream`; the others when Stream (a branch on a runtime flag there spilled
// m too; only the buffered sweep's last block streams).
template <bool First, bool Stream, int KN, int NC, int VB, class T, class Start, class V>
AD_ALWAYS_INLINE void scan_rows(V (&m)[KN][NC], const ScanWalk<T>& w, const T* y, i64 D, i64 c0, const Start& start,
                                bool stream) {
  constexpr i64 kW = VB / static_cast<i64>(sizeof(T));
  for (i64 t = 0; t < w.n; ++t) {
    const T *a = w.a0 + t * w.as, *b = w.b0 + t * w.bs, *xp = w.x0 + t * w.xs, *yi = w.yin.p + t * w.yin.step;
    T* yp = w.yout.p + t * w.yout.step;
    V xv[NC];
    for (int j = 0; j < NC; ++j) std::memcpy(&xv[j], xp + j * kW, sizeof(V));
    for (int q = 0; q < KN; ++q)
      for (int j = 0; j < NC; ++j) m[q][j] += a[q] * xv[j];
    V yv[NC];
    for (int j = 0; j < NC; ++j) {
      if constexpr (First) start.vec(yv[j], y, D, w.s + w.dir * t, c0 + j * kW);
      else std::memcpy(&yv[j], yi + j * kW, sizeof(V));
    }
    for (int q = 0; q < KN; ++q)
      for (int j = 0; j < NC; ++j) yv[j] += b[q] * m[q][j];
    for (int j = 0; j < NC; ++j) put(yp + j * kW, yv[j], First ? stream : Stream);
  }
}
// yin / yout: where the block reads y's partial sums (unless `first`) and
// writes them; nullptr p: y's own rows (the default).
// Stores streamed: the first block's when `stream`, the others' when
// LaterStream.
template <int KN, int NC, int VB, bool LaterStream = false, class T, class Start>
AD_ALWAYS_INLINE void scan_block(T* M, const T* x, T* y, i64 D, i64 c0, i64 k0, i64 i0, i64 i1, bool reverse,
                                 RowPtr<T> arow, RowPtr<T> brow, const Start& start, bool first, bool stream,
                                 SweepRows<const T> yin = {nullptr, 0}, SweepRows<T> yout = {nullptr, 0}) {
  typedef T V __attribute__((vector_size(VB)));
  constexpr i64 kW = VB / static_cast<i64>(sizeof(T));
  V m[KN][NC];
  for (int q = 0; q < KN; ++q)
    for (int j = 0; j < NC; ++j) std::memcpy(&m[q][j], M + (k0 + q) * D + c0 + j * kW, sizeof(V));
  const i64 dir = reverse ? -1 : 1, s = reverse ? i1 - 1 : i0, xs = dir * D;
  if (!yin.p) yin = {y + s * D + c0, xs};
  if (!yout.p) yout = {y + s * D + c0, xs};
  const ScanWalk<T> w{arow(s) + k0, brow(s) + k0, x + s * D + c0, dir * arow.stride, dir * brow.stride, xs,
                      yin, yout, s, dir, i1 - i0};
  if (first) scan_rows<true, false, KN, NC, VB>(m, w, y, D, c0, start, stream);
  else scan_rows<false, LaterStream, KN, NC, VB>(m, w, y, D, c0, start, false);
  for (int q = 0; q < KN; ++q)
    for (int j = 0; j < NC; ++j) std::memcpy(M + (k0 + q) * D + c0 + j * kW, &m[q][j], sizeof(V));
}
// A pair of column vectors over several blocks of M's rows, y streamed: the
// blocks before the last keep y's partial sums for a run of up to 64 rows in
// a buffer on the stack (in L1), the last block reads them and streams y's
// rows out, so y's lines are never read from memory (no read for
// ownership). Runs of rows in sweep order; every element gets its terms in
// the same order as in the unbuffered sweep.
template <int VB, class T, class Start>
AD_ALWAYS_INLINE void scan_pair_buffered(T* M, const T* x, T* y, i64 D, i64 r, i64 c0, i64 i0, i64 i1, bool reverse,
                                    RowPtr<T> arow, RowPtr<T> brow, const Start& start) {
  constexpr i64 kW = VB / static_cast<i64>(sizeof(T)), kRun = 64;
  alignas(64) T buf[kRun * 2 * kW];
  for (i64 j = 0, n = i1 - i0; j < n; j += kRun) {
    const i64 m = std::min(kRun, n - j);
    const i64 a0 = reverse ? i1 - j - m : i0 + j, a1 = a0 + m;  // the run's rows
    const SweepRows<const T> in{buf, 2 * kW};
    const SweepRows<T> out{buf, 2 * kW};
    i64 k0 = 0;
    for (; k0 + 4 < r; k0 += 4)  // r > 4: the first block is not the last
      scan_block<4, 2, VB>(M, x, y, D, c0, k0, a0, a1, reverse, arow, brow, start, k0 == 0, false, in, out);
    const SweepRows<T> to_y{nullptr, 0};  // the last block: y's rows, streamed
    switch (r - k0) {
      case 4: scan_block<4, 2, VB, true>(M, x, y, D, c0, k0, a0, a1, reverse, arow, brow, start, false, false, in, to_y); break;
      case 3: scan_block<3, 2, VB, true>(M, x, y, D, c0, k0, a0, a1, reverse, arow, brow, start, false, false, in, to_y); break;
      case 2: scan_block<2, 2, VB, true>(M, x, y, D, c0, k0, a0, a1, reverse, arow, brow, start, false, false, in, to_y); break;
      default: scan_block<1, 2, VB, true>(M, x, y, D, c0, k0, a0, a1, reverse, arow, brow, start, false, false, in, to_y); break;
    }
  }
}
// Column blocks of VB bytes from c0 while they fit; returns the first column
// left. Without AVX-512, pairs of column vectors by blocks of 4 rows of M:
// two chains of 4 dependent FMAs per row instead of one of 8 (r = 16 causal
// on an AVX2 host, in cache: 1.26x faster), and a row of 16 f32 columns is
// one 64-byte sweep (fills_lines). When one block covers all of M's rows
// (r <= 4 without AVX-512; r <= 8 or r == 16 with it) y_i is stored streamed
// when `stream` and the sweep fills whole lines. With more blocks y_i is
// written, read back and written again, never streamed: its lines are in
// cache by the last block, and a streamed store over a cached line forces it
// out first (on an AVX2 EPYC host, r = 16, causal, N = 2^22: 3.4x slower
// than plain stores, 2026-11-25) — except where scan_pair_buffered (above)
// keeps the partial rows in its buffer instead.
template <int VB, class T, class Start>
AD_ALWAYS_INLINE i64 scan_cols(T* M, const T* x, T* y, i64 D, i64 r, i64 c0, i64 i0, i64 i1, bool reverse,
                               RowPtr<T> arow, RowPtr<T> brow, const Start& start, bool stream) {
  constexpr i64 kW = VB / static_cast<i64>(sizeof(T));
  const bool wide = wide_vectors();
  // (scan_cols<64> runs only with AVX-512: no pair path compiled for it;
  // the buffered sweep only for 32-byte vectors, whose pair fills a line)
  if constexpr (VB != 64) if (!wide)
    for (; c0 + 2 * kW <= D; c0 += 2 * kW) {
      if constexpr (VB == 32) if (stream && r > 4 && fills_lines<T>(D, c0, 2 * kW)) {
        scan_pair_buffered<VB>(M, x, y, D, r, c0, i0, i1, reverse, arow, brow, start);
        continue;
      }
      for (i64 k0 = 0; k0 < r; k0 += 4) {
        // one block of M's rows (r <= 4): y_i finished on its first touch
        const bool first = k0 == 0, st = stream && r <= 4 && fills_lines<T>(D, c0, 2 * kW);
        switch (std::min<i64>(4, r - k0)) {
          case 4: scan_block<4, 2, VB>(M, x, y, D, c0, k0, i0, i1, reverse, arow, brow, start, first, st); break;
          case 3: scan_block<3, 2, VB>(M, x, y, D, c0, k0, i0, i1, reverse, arow, brow, start, first, st); break;
          case 2: scan_block<2, 2, VB>(M, x, y, D, c0, k0, i0, i1, reverse, arow, brow, start, first, st); break;
          default: scan_block<1, 2, VB>(M, x, y, D, c0, k0, i0, i1, reverse, arow, brow, start, first, st); break;
        }
      }
    }
  for (; c0 + kW <= D; c0 += kW)
    for (i64 k0 = 0; k0 < r; k0 += 8) {
      const bool first = k0 == 0;
      if (wide && r - k0 >= 16) {  // 16 rows of M in 16 of AVX-512's 32 registers (any width, with VL)
        scan_block<16, 1, VB>(M, x, y, D, c0, k0, i0, i1, reverse, arow, brow, start, first,
                              stream && first && r == 16 && fills_lines<T>(D, c0, kW));
        k0 += 8;
        continue;
      }
      // the block finishes y's rows on their first touch
      const bool only = first && r <= 8 && fills_lines<T>(D, c0, kW);
      switch (std::min<i64>(8, r - k0)) {
#define AD_SCAN_CASE(KN)                                                                                        \
  case KN:                                                                                                      \
    scan_block<KN, 1, VB>(M, x, y, D, c0, k0, i0, i1, reverse, arow, brow, start, first, stream && only); \
    break;
        AD_SCAN_CASE(8) AD_SCAN_CASE(7) AD_SCAN_CASE(6) AD_SCAN_CASE(5)
        AD_SCAN_CASE(4) AD_SCAN_CASE(3) AD_SCAN_CASE(2)
        default: scan_block<1, 1, VB>(M, x, y, D, c0, k0, i0, i1, reverse, arow, brow, start, first, stream && only); break;
#undef AD_SCAN_CASE
      }
    }
  return c0;
}
template <class T, class Start>
AD_ALWAYS_INLINE void scan_body(T* M, const T* x, T* y, i64 D, i64 r, i64 i0, i64 i1, bool reverse, RowPtr<T> arow,
                                RowPtr<T> brow, const Start& start, bool stream) {
  if (r == 0) return mix_rows(M, y, D, r, i0, i1, brow, start, stream);  // y_i = start_i
  i64 c0 = wide_vectors() ? scan_cols<64>(M, x, y, D, r, 0, i0, i1, reverse, arow, brow, start, stream) : 0;
  c0 = scan_cols<32>(M, x, y, D, r, c0, i0, i1, reverse, arow, brow, start, stream);
  c0 = scan_cols<16>(M, x, y, D, r, c0, i0, i1, reverse, arow, brow, start, stream);
  if (c0 == D) return;
  for (i64 t = 0, n = i1 - i0; t < n; ++t) {  // the last columns (fewer than 16 bytes)
    i64 i = reverse ? i1 - 1 - t : i0 + t;
    const T* a = arow(i);
    for (i64 k = 0; k < r; ++k)
      for (i64 c = c0; c < D; ++c) M[k * D + c] += a[k] * x[i * D + c];
    const T* b = brow(i);
    for (i64 c = c0; c < D; ++c) y[i * D + c] = start.at(y, D, i, c);
    for (i64 k = 0; k < r; ++k)
      for (i64 c = c0; c < D; ++c) y[i * D + c] += b[k] * M[k * D + c];
  }
}
// The sweeps as functions: one copy per compute type and start (and, for
// f32, per ISA clone), called from the tasks; inlined at every call site the
// library took twice as long to compile. Any r >= 0 (r = 0: y_i = start_i).
template <class T> void sweep_sums(T* M, const T* x, i64 D, i64 r, i64 i0, i64 i1, RowPtr<T> arow) {
  accumulate(M, x, D, r, i0, i1, false, arow);
}
template <class T, class Start>
void sweep_mix(const T* M, T* y, i64 D, i64 r, i64 i0, i64 i1, RowPtr<T> brow, const Start& start, bool stream) {
  mix_rows(M, y, D, r, i0, i1, brow, start, stream);
}
template <class T, class Start>
void sweep_scan(T* M, const T* x, T* y, i64 D, i64 r, i64 i0, i64 i1, bool reverse, RowPtr<T> arow, RowPtr<T> brow,
                const Start& start, bool stream) {
  scan_body(M, x, y, D, r, i0, i1, reverse, arow, brow, start, stream);
}
AD_SIMD_CLONES void sweep_sums(float* M, const float* x, i64 D, i64 r, i64 i0, i64 i1, RowPtr<float> arow) {
  accumulate(M, x, D, r, i0, i1, false, arow);
}
AD_SIMD_CLONES void sweep_mix(const float* M, float* y, i64 D, i64 r, i64 i0, i64 i1, RowPtr<float> brow,
                              const Fill& start, bool stream) {
  mix_rows(M, y, D, r, i0, i1, brow, start, stream);
}
AD_SIMD_CLONES void sweep_mix(const float* M, float* y, i64 D, i64 r, i64 i0, i64 i1, RowPtr<float> brow,
                              const Band<float>& start, bool stream) {
  mix_rows(M, y, D, r, i0, i1, brow, start, stream);
}
AD_SIMD_CLONES void sweep_scan(float* M, const float* x, float* y, i64 D, i64 r, i64 i0, i64 i1, bool reverse,
                               RowPtr<float> arow, RowPtr<float> brow, const Fill& start, bool stream) {
  scan_body(M, x, y, D, r, i0, i1, reverse, arow, brow, start, stream);
}
AD_SIMD_CLONES void sweep_scan(float* M, const float* x, float* y, i64 D, i64 r, i64 i0, i64 i1, bool reverse,
                               RowPtr<float> arow, RowPtr<float> brow, const Band<float>& start, bool stream) {
  scan_body(M, x, y, D, r, i0, i1, reverse, arow, brow, start, stream);
}

// The full backward's du and dv rows where r <= 4 (f32, D a multiple of 8),
// in one sweep: du_i[k] = dy_i . A[k], dv_i[k] = x_i . Bm[k] (A = V^T x,
// Bm = U^T dy, four rows of D each: zero rows past r), the eight dots of a
// row reduced together into one 32-byte vector (du_i | dv_i). The mixes
// they replace ran one sweep each with 16-byte vectors (r = 4; r < 4: one
// column at a time), a broadcast per multiply-add and a chain of D of them
// per row: on the AVX2 host the full backward at r = 4 runs 15 % faster in
// cache, at r = 2 and N = 2^22 2.9x (docs/benchmarks.md). Zero: rows start
// from zero (else from their values); Stream: streamed stores (r = 4 only:
// 16-byte rows); R4: r = 4. Template arguments, not tests per row: with the
// tests in the row loop this sweep ran no faster than the two mixes.
typedef float F8 __attribute__((vector_size(32)));
typedef float F4v __attribute__((vector_size(16)));
// out = (a0 + a1, a2 + a3, b0 + b1, b2 + b3 | the same of lanes 4..7)
AD_ALWAYS_INLINE void pair_sums(const F8& a, const F8& b, F8& out) {
  out = __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) + __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}
// acc[k] += dy_i . A[k], acc[4 + k] += x_i . Bm[k] over the columns [c, c + 8)
AD_ALWAYS_INLINE void du_dv_acc(F8 (&acc)[8], const F8& gv, const F8& xv, const float* __restrict A,
                                const float* __restrict Bm, i64 D, i64 c) {
  for (int k = 0; k < 4; ++k) {
    F8 a, b;
    std::memcpy(&a, A + k * D + c, 32);
    std::memcpy(&b, Bm + k * D + c, 32);
    acc[k] += gv * a;
    acc[4 + k] += xv * b;
  }
}
// The eight dots of a row (acc[k]: du's k-th, acc[4 + k]: dv's, 8 lanes
// each) reduced by one fixed tree and stored as the row's du and dv: from
// zero (Zero) or added to their values; r = 4 (R4) as one 16-byte store
// each, streamed when `stream` (16-byte aligned rows).
template <bool Zero, bool R4>
AD_ALWAYS_INLINE void du_dv_put(const F8 (&acc)[8], float* du, float* dv, i64 r, bool stream) {
  F8 h[4], q0, q1;
  for (int k = 0; k < 4; ++k) pair_sums(acc[2 * k], acc[2 * k + 1], h[k]);
  pair_sums(h[0], h[1], q0);
  pair_sums(h[2], h[3], q1);
  const F8 t = __builtin_shufflevector(q0, q1, 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(q0, q1, 4, 5, 6, 7, 12, 13, 14, 15);
  F4v u = __builtin_shufflevector(t, t, 0, 1, 2, 3), w = __builtin_shufflevector(t, t, 4, 5, 6, 7);
  if constexpr (R4) {
    if constexpr (!Zero) {
      F4v u0, w0;
      std::memcpy(&u0, du, 16);
      std::memcpy(&w0, dv, 16);
      u = u0 + u;
      w = w0 + w;
    }
    put(du, u, stream);
    put(dv, w, stream);
  } else {
    for (i64 k = 0; k < r; ++k) {
      du[k] = Zero ? u[k] : du[k] + u[k];
      dv[k] = Zero ? w[k] : dv[k] + w[k];
    }
  }
}
template <bool Zero, bool Stream, bool R4>
AD_ALWAYS_INLINE void du_dv_rows(const float* __restrict A, const float* __restrict Bm, const float* x, const float* dy,
                                 float* du, float* dv, i64 D, i64 r, i64 n) {
  for (i64 i = 0; i < n; ++i) {
    const float *g = dy + i * D, *xi = x + i * D;
    F8 acc[8] = {};
    for (i64 c = 0; c < D; c += 8) {
      F8 gv, xv;
      std::memcpy(&gv, g + c, 32);
      std::memcpy(&xv, xi + c, 32);
      du_dv_acc(acc, gv, xv, A, Bm, D, c);
    }
    du_dv_put<Zero, R4>(acc, du + i * r, dv + i * r, r, Stream);
  }
}
AD_SIMD_CLONES void sweep_du_dv(const float* A, const float* Bm, const float* x, const float* dy, float* du, float* dv,
                                i64 D, i64 r, i64 n, bool zero, bool stream) {
  if (r == 4) {
    if (zero && stream) du_dv_rows<true, true, true>(A, Bm, x, dy, du, dv, D, r, n);
    else if (zero) du_dv_rows<true, false, true>(A, Bm, x, dy, du, dv, D, r, n);
    else if (stream) du_dv_rows<false, true, true>(A, Bm, x, dy, du, dv, D, r, n);
    else du_dv_rows<false, false, true>(A, Bm, x, dy, du, dv, D, r, n);
  } else if (zero) {
    du_dv_rows<true, false, false>(A, Bm, x, dy, du, dv, D, r, n);
  } else {
    du_dv_rows<false, false, false>(A, Bm, x, dy, du, dv, D, r, n);
  }
}

// The whole full backward of a run of rows where r <= 4 (f32, D a multiple
// of 8, every gradient wanted, each row with a next row), in one sweep: per
// row i, with dy_i, x_i and the next rows in registers,
//   dx_i = (T^T dy)_i + sum_k v_i[k] G[k]          (G = U^T dy, the band as Band)
//   du_i, dv_i as du_dv_rows (A = V^T x, G padded to four rows of D)
//   dd_i += dy_i . x_i, dup_i += dy_i . x_{i+1}, dlo_i += dy_{i+1} . x_i
// (the three band dots reduced by one fixed tree). The three sweeps it
// replaces (the band's dots, dx's mix, du_dv_rows) each read the chunk's
// rows again from L2 and paid their own per-row overhead; this one does
// more work per row (a tree per row for the band's dots, where dot4 shares
// one among four rows) and needs 16 vector registers plus temporaries.
// Measured on an AMD EPYC (Zen 4) host, r = 4 (docs/benchmarks.md): with
// the AVX-512 clone, D = 16, N = 2^22 60.5 -> 51.9 ms (medians), in cache
// (N = 2^15) 3 % slower, D = 128 and 256 30 % faster; the AVX2 clone (16
// registers) 27 % slower at D = 16 in cache, 10 % at D = 32 and 64, 30 %
// faster at D = 128 and 256. Hence the default (set_cpu_backward_sweeps):
// one sweep with AVX-512 or D >= 128. x, dy, dx: the run's first row; v:
// its rows of V (r each); du, dv, dd, dup, dlo: the run's first row of each.
template <bool Zero, bool R4>
AD_ALWAYS_INLINE void bwd_rows(const float* __restrict A, const float* __restrict G, const Band<float>& band,
                               const float* x, const float* dy, const float* v, float* dx, float* du, float* dv,
                               float* dd, float* dup, float* dlo, i64 D, i64 r, i64 n, bool stream_dx,
                               bool stream_uv) {
  for (i64 t = 0; t < n; ++t) {
    const float *g = dy + t * D, *xi = x + t * D, *vi = v + t * r;
    F8 acc[8] = {}, bd = {}, bu = {}, bl = {};
    for (i64 c = 0; c < D; c += 8) {
      F8 gv, xv, gn, xn;
      std::memcpy(&gv, g + c, 32);
      std::memcpy(&xv, xi + c, 32);
      std::memcpy(&gn, g + D + c, 32);
      std::memcpy(&xn, xi + D + c, 32);
      du_dv_acc(acc, gv, xv, A, G, D, c);
      bd += gv * xv;
      bu += gv * xn;
      bl += gn * xv;
      F8 y;
      band.vec(y, dy, D, t, c);
      const i64 kr = R4 ? 4 : r;
      for (i64 k = 0; k < kr; ++k) {
        F8 b;
        std::memcpy(&b, G + k * D + c, 32);
        y += vi[k] * b;
      }
      put(dx + t * D + c, y, stream_dx);
    }
    du_dv_put<Zero, R4>(acc, du + t * r, dv + t * r, r, stream_uv);
    F8 h0, h1, q;
    pair_sums(bd, bu, h0);
    pair_sums(bl, F8{}, h1);
    pair_sums(h0, h1, q);
    const F4v s = __builtin_shufflevector(q, q, 0, 1, 2, 3) + __builtin_shufflevector(q, q, 4, 5, 6, 7);
    dd[t] += s[0];
    dup[t] += s[1];
    dlo[t] += s[2];
  }
}
AD_SIMD_CLONES void sweep_bwd_rows(const float* A, const float* G, const Band<float>& band, const float* x,
                                   const float* dy, const float* v, float* dx, float* du, float* dv, float* dd,
                                   float* dup, float* dlo, i64 D, i64 r, i64 n, bool zero, bool stream_dx,
                                   bool stream_uv) {
  if (r == 4) {
    if (zero) bwd_rows<true, true>(A, G, band, x, dy, v, dx, du, dv, dd, dup, dlo, D, r, n, stream_dx, stream_uv);
    else bwd_rows<false, true>(A, G, band, x, dy, v, dx, du, dv, dd, dup, dlo, D, r, n, stream_dx, stream_uv);
  } else if (zero) {
    bwd_rows<true, false>(A, G, band, x, dy, v, dx, du, dv, dd, dup, dlo, D, r, n, stream_dx, false);
  } else {
    bwd_rows<false, false>(A, G, band, x, dy, v, dx, du, dv, dd, dup, dlo, D, r, n, stream_dx, false);
  }
}

// S[b, c] = sum_{i in chunk c} v_i (x) x[b, i]   (r x D per chunk), one task per (b, c)
template <class T> struct SumsTask { const Dims& dm; const T* x; RowSource<T> v; T* S; };
template <class T> AD_ALWAYS_INLINE void chunk_sums_task(const SumsTask<T>& tk, i64 t) {
  const Dims& dm = tk.dm;
  i64 nc = dm.chunks(), rD = dm.r * dm.D;
  i64 b = t / nc, c = t % nc, i0 = c * dm.L, i1 = std::min(dm.N, i0 + dm.L);
  T* s = tk.S + t * rD;
  std::fill(s, s + rD, T(0));
  std::unique_ptr<T[]> buf = tk.v.buffer(kRowBlock);
  for (i64 j0 = i0; j0 < i1; j0 += kRowBlock) {  // the state s carries over from block to block
    const i64 j1 = std::min(i1, j0 + kRowBlock);
    const T* Vb = tk.v.block(j0, j1 - j0, buf.get());
    sweep_sums(s, tk.x + b * dm.N * dm.D, dm.D, dm.r, j0, j1, RowPtr<T>{Vb, j0, dm.r});
  }
}
template <class T, class UV> void chunk_sums(const Dims& dm, const T* x, const UV* v, T* S);

enum class Scan { total, prefix, suffix };
// Per b, over the chunk slots of `width` elements, in chunk order, in double:
// total -> slot 0 holds the sum; prefix / suffix -> slot c holds the sum of
// the slots before / after c (exclusive).
template <class T> void combine(const Dims& dm, i64 width, T* S, Scan kind) {
  i64 nc = dm.chunks();
  parallel::parallel_for(dm.B, static_cast<double>(dm.B * nc * width), [&](i64 b) {
    std::vector<double> acc(static_cast<std::size_t>(width), 0.0);
    T* base = S + b * nc * width;
    for (i64 j = 0; j < nc; ++j) {
      i64 c = kind == Scan::suffix ? nc - 1 - j : j;
      T* s = base + c * width;
      for (i64 e = 0; e < width; ++e) {
        double t = s[e];
        if (kind != Scan::total) s[e] = static_cast<T>(acc[static_cast<std::size_t>(e)]);
        acc[static_cast<std::size_t>(e)] += t;
      }
    }
    if (kind == Scan::total)
      for (i64 e = 0; e < width; ++e) base[e] = static_cast<T>(acc[static_cast<std::size_t>(e)]);
  });
}
// Pass 2 of the matvec for one (b, chunk) task.
template <class T> struct MatvecTask {
  const Dims& dm;
  bool causal;
  const T *x, *d, *up, *lo;
  RowSource<T> u, v;
  T* y;
  const T* S;
  bool stream;  // y's rows streamed past the cache
};
template <class T> AD_ALWAYS_INLINE void matvec_task(const MatvecTask<T>& tk, i64 t) {
  const Dims& dm = tk.dm;
  const bool causal = tk.causal;
  const T *x = tk.x, *d = tk.d, *up = tk.up, *lo = tk.lo;
  T* y = tk.y;
  const T* S = tk.S;
  const i64 N = dm.N, D = dm.D, r = dm.r, nc = dm.chunks(), rD = r * D;
    i64 b = t / nc, c = t % nc, i0 = c * dm.L, i1 = std::min(N, i0 + dm.L);
    const T* xb = x + b * N * D;
    T* yb = y + b * N * D;
    const T* W = S + (b * nc + (causal ? c : 0)) * rD;
    // the band's rows of x (through lo, d, up): y_i starts from them, then u_i . W
    const Band<T> band{xb, lo, d, causal ? nullptr : up, 0, N};
    if (r == 0 || D == 0) {  // T x alone
      for (i64 i = i0; i < i1; ++i) band.row(yb + i * D, D, i);
      return;
    }
    // P_i = S_<c + sum_{c0<=j<=i} v_j (x) x_j when causal, started from the
    // chunk's exclusive prefix and carried over from block to block
    std::vector<T> P(causal ? W : W + rD, W + rD);
    std::unique_ptr<T[]> ub = tk.u.buffer(kRowBlock), vb = causal ? tk.v.buffer(kRowBlock) : nullptr;
    for (i64 j0 = i0; j0 < i1; j0 += kRowBlock) {
      const i64 j1 = std::min(i1, j0 + kRowBlock);
      const T* Ub = tk.u.block(j0, j1 - j0, ub.get());
      const RowPtr<T> urow{Ub, j0, r};
      if (!causal) {
        sweep_mix(W, yb, D, r, j0, j1, urow, band, tk.stream);
      } else {
        const T* Vb = tk.v.block(j0, j1 - j0, vb.get());
        sweep_scan(P.data(), xb, yb, D, r, j0, j1, false, RowPtr<T>{Vb, j0, r}, urow, band, tk.stream);
      }
    }
    if (tk.stream) stream_fence();
}

// Pass 2 of the matvec backward for one chunk (all b, in order), with the
// chunk's rows of U and V in the compute type (Uc, Vc: row t = row i0 + t;
// converted by the caller when stored as bf16/f16, so this code exists once
// per compute type).
template <class T> struct BackwardTask {
  const Dims& dm;
  bool causal;
  const T *x, *d, *up, *lo;
  const T* dy;
  const MatvecGrads<T>& g;
  const T *Sx, *Sg;
  bool stream_dx, stream_uv;  // rows of dx / of du and dv streamed past the cache
  bool one_sweep;             // the full backward at r <= 4 as bwd_rows (set_cpu_backward_sweeps)
};
template <class T>
AD_ALWAYS_INLINE void matvec_backward_task(const BackwardTask<T>& tk, i64 c, const T* Uc, const T* Vc) {
  const Dims& dm = tk.dm;
  const bool causal = tk.causal;
  const T *x = tk.x, *d = tk.d, *up = tk.up, *lo = tk.lo, *dy = tk.dy, *Sx = tk.Sx, *Sg = tk.Sg;
  const MatvecGrads<T>& g = tk.g;
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, nc = dm.chunks(), rD = r * D;
  const i64 i0 = c * dm.L, i1 = std::min(N, i0 + dm.L), n = i1 - i0;
  const i64 band_end = std::min(i1, N - 1);  // dup, dlo have N - 1 rows
  if (g.dd) std::fill(g.dd + i0, g.dd + i1, T(0));
  if (g.dup && i0 < band_end) std::fill(g.dup + i0, g.dup + band_end, T(0));
  if (g.dlo && i0 < band_end) std::fill(g.dlo + i0, g.dlo + band_end, T(0));
  const bool rank = r > 0 && D > 0;
  // du, dv rows start from zero in the sweeps below (one per batch); without
  // them (no rank, or an empty batch), zeroed here
  if (g.du && (!rank || B == 0)) std::fill(g.du + i0 * r, g.du + i1 * r, T(0));
  if (g.dv && (!rank || B == 0)) std::fill(g.dv + i0 * r, g.dv + i1 * r, T(0));
  const RowPtr<T> urow{Uc, 0, r}, vrow{Vc, 0, r};
  std::vector<T> M(static_cast<std::size_t>(std::max(rD, 8 * D))), Mt(static_cast<std::size_t>(rD));
  auto transpose_into = [&](const T* W) {  // Mt (D x r) = W^T
    for (i64 k = 0; k < r; ++k)
      for (i64 e = 0; e < D; ++e) Mt[static_cast<std::size_t>(e * r + k)] = W[k * D + e];
  };
  // Wx, Wg as four rows of D each for the dot sweeps at r <= 4 (zero rows past r)
  auto four_rows = [&](const T* wx, const T* wg) -> std::pair<const T*, const T*> {
    if (r >= 4) return {wx, wg};
    std::fill(M.begin(), M.end(), T(0));
    std::copy(wx, wx + rD, M.begin());
    std::copy(wg, wg + rD, M.begin() + 4 * D);
    return {M.data(), M.data() + 4 * D};
  };
  for (i64 b = 0; b < B; ++b) {
    const T *xb = x + (b * N + i0) * D, *gb = dy + (b * N + i0) * D;
    T* dxb = g.dx ? g.dx + (b * N + i0) * D : nullptr;
    const RowPtr<T> xrow{xb, 0, D}, grow{gb, 0, D};
    const T* Wx = Sx + (b * nc + (causal ? c : 0)) * rD;
    const T* Wg = Sg + (b * nc + (causal ? c : 0)) * rD;
    // (T^T dy)_j: dx_j alone without U V^T, else its start in the sweeps below
    const Band<T> band{gb, causal ? nullptr : up, d, lo, i0, N};
    if constexpr (std::is_same_v<T, float>) {
      // every gradient of the full product at r <= 4: one sweep (bwd_rows)
      if (tk.one_sweep && !causal && rank && r <= 4 && D % 8 == 0 && dxb && g.dd && g.dup && g.dlo && g.du && g.dv) {
        const auto [A, Bm] = four_rows(Wx, Wg);
        const bool zero = b == 0, stream_uv = tk.stream_uv && b + 1 == B;
        const i64 nf = i0 + n < N ? n : n - 1;  // rows with a next row
        sweep_bwd_rows(A, Bm, band, xb, gb, Vc, dxb, g.du + i0 * r, g.dv + i0 * r, g.dd + i0, g.dup + i0,
                       g.dlo + i0, D, r, nf, zero, tk.stream_dx, stream_uv);
        if (nf < n) {  // the sequence's last row
          const i64 t = n - 1;
          g.dd[i0 + t] += dot(gb + t * D, xb + t * D, D);
          sweep_mix(Wg, dxb, D, r, t, n, vrow, band, tk.stream_dx);
          sweep_du_dv(A, Bm, xb + t * D, gb + t * D, g.du + (i0 + t) * r, g.dv + (i0 + t) * r, D, r, 1, zero,
                      stream_uv);
        }
        continue;
      }
    }
    i64 t0 = 0;
    if constexpr (std::is_same_v<T, float>) {  // four rows at a time, each with a next row (same bits)
      const bool want_up = g.dup && !causal;
      if (D > 0 && D % 16 == 0)
        for (; t0 + 4 <= n && i0 + t0 + 4 < N; t0 += 4) {
          const i64 i = i0 + t0;
          const T *xi = xb + t0 * D, *gi = gb + t0 * D;
          float s[4];
          if (g.dd) {
            dot4(gi, D, xi, D, D, s);
            for (int p = 0; p < 4; ++p) g.dd[i + p] += s[p];
          }
          if (want_up) {
            dot4(gi, D, xi + D, D, D, s);
            for (int p = 0; p < 4; ++p) g.dup[i + p] += s[p];
          }
          if (g.dlo) {
            dot4(gi + D, D, xi, D, D, s);
            for (int p = 0; p < 4; ++p) g.dlo[i + p] += s[p];
          }
          if (dxb && !rank)
            for (i64 p = 0; p < 4; ++p) band.row(dxb + (t0 + p) * D, D, t0 + p);
        }
    }
    for (i64 t = t0; t < n; ++t) {  // the band of T
      i64 i = i0 + t;
      const T *xi = xb + t * D, *gi = gb + t * D;
      if (g.dd) g.dd[i] += dot(gi, xi, D);
      if (i + 1 < N) {
        if (g.dup && !causal) g.dup[i] += dot(gi, xi + D, D);
        if (g.dlo) g.dlo[i] += dot(gi + D, xi, D);
      }
      if (dxb && !rank) band.row(dxb + t * D, D, t);
    }
    if (!rank) continue;
    // du and dv rows start from zero at b = 0 (sums over b)
    const Fill acc{b == 0};
    const bool last_b = b + 1 == B;
    if (!causal) {  // dx += V (U^T dy), du = dy (V^T x)^T, dv = x (U^T dy)^T
      if (dxb)
        sweep_mix(Wg, dxb, D, r, 0, n, vrow, band, tk.stream_dx);
      if constexpr (std::is_same_v<T, float>) {
        if (g.du && g.dv && r <= 4 && D % 8 == 0) {
          const auto [A, Bm] = four_rows(Wx, Wg);
          sweep_du_dv(A, Bm, xb, gb, g.du + i0 * r, g.dv + i0 * r, D, r, n, acc.zero, tk.stream_uv && last_b);
          continue;
        }
      }
      if (g.du) {
        transpose_into(Wx);
        sweep_mix(Mt.data(), g.du + i0 * r, r, D, 0, n, grow, acc, tk.stream_uv && last_b);
      }
      if (g.dv) {
        transpose_into(Wg);
        sweep_mix(Mt.data(), g.dv + i0 * r, r, D, 0, n, xrow, acc, tk.stream_uv && last_b);
      }
      continue;
    }
    // causal: Q_j = suffix of u_i (x) dy_i (from the later chunks' sum Wg), P_i = prefix of v_j (x) x_j
    if (dxb) {  // dx_j += v_j . Q_j
      std::copy(Wg, Wg + rD, M.begin());
      sweep_scan(M.data(), gb, dxb, D, r, 0, n, true, urow, vrow, band, tk.stream_dx);
    }
    if (g.du) {  // du_i = P_i dy_i, with P^T (D x r) updated by x_i[c] v_i
      transpose_into(Wx);
      sweep_scan(Mt.data(), Vc, g.du + i0 * r, r, D, 0, n, false, xrow, grow, acc, tk.stream_uv && last_b);
    }
    if (g.dv) {  // dv_j = Q_j x_j, with Q^T updated by dy_j[c] u_j
      transpose_into(Wg);
      sweep_scan(Mt.data(), Uc, g.dv + i0 * r, r, D, 0, n, true, grow, xrow, acc, tk.stream_uv && last_b);
    }
  }
  if (tk.stream_dx || tk.stream_uv) stream_fence();
}

// run(task, ...): the generic task, or its target_clones version for f32 (one
// clone set per task: U and V arrive in the compute type).
template <class T> void run(const SumsTask<T>& k, i64 t) { chunk_sums_task(k, t); }
template <class T> void run(const MatvecTask<T>& k, i64 t) { matvec_task(k, t); }
template <class T> void run(const BackwardTask<T>& k, i64 c, const T* Uc, const T* Vc) {
  matvec_backward_task(k, c, Uc, Vc);
}
AD_SIMD_CLONES void run(const SumsTask<float>& k, i64 t) { chunk_sums_task(k, t); }
AD_SIMD_CLONES void run(const MatvecTask<float>& k, i64 t) { matvec_task(k, t); }
AD_SIMD_CLONES void run(const BackwardTask<float>& k, i64 c, const float* Uc, const float* Vc) {
  matvec_backward_task(k, c, Uc, Vc);
}
// The backward for chunk c, with the chunk's rows of U and V in the compute type.
template <class T> void backward_chunk(const BackwardTask<T>& k, const RowSource<T>& u, const RowSource<T>& v, i64 c) {
  const i64 i0 = c * k.dm.L, n = std::min(k.dm.N, i0 + k.dm.L) - i0;
  std::unique_ptr<T[]> ub = u.buffer(n), vb = v.buffer(n);
  run(k, c, u.block(i0, n, ub.get()), v.block(i0, n, vb.get()));
}

template <class T, class UV> void chunk_sums(const Dims& dm, const T* x, const UV* v, T* S) {
  SumsTask<T> task{dm, x, row_source<T>(v, dm.N, dm.r), S};
  parallel::parallel_for(dm.B * dm.chunks(), 2.0 * static_cast<double>(dm.B * dm.N * dm.r * dm.D),
                         [&](i64 t) { run(task, t); });
}
// Slot 0 of each b's chunk sums S <- V^T x[b] (r x width(x)): copied from w
// (B, r, D) when given (semiseparable_sums formed it, the same bits), else
// formed here (the chunk sums, combined in double in chunk order).
template <class T, class UV> void total_sums(const Dims& dm, const T* x, const UV* v, T* S, const T* w = nullptr) {
  const i64 rD = dm.r * dm.D;
  if (!w) {
    chunk_sums(dm, x, v, S);
    combine(dm, rD, S, Scan::total);
    return;
  }
  for (i64 b = 0; b < dm.B; ++b) std::copy_n(w + b * rD, rD, S + b * dm.chunks() * rD);
}
}  // namespace


std::size_t stream_min_bytes() {
  std::size_t b = g_stream_min.load(std::memory_order_relaxed);
  if (b) return b;
  long llc = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  llc = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  b = llc > 0 ? static_cast<std::size_t>(llc) : std::size_t{32} << 20;
  g_stream_min.store(b, std::memory_order_relaxed);
  return b;
}
void set_stream_min_bytes(std::size_t bytes) { g_stream_min.store(bytes ? bytes : 1, std::memory_order_relaxed); }

std::int64_t chunk_rows(i64 N, i64 D, i64 requested) {
  if (requested > 0) return requested;
  i64 L = std::max<i64>(256, 16384 / std::max<i64>(1, D));
  return std::max<i64>(1, std::min(L, N));
}

// ---- semiseparable_matvec ----
std::size_t matvec_ws_bytes(const Dims& dm, std::size_t elem) {
  Carve c;
  c.take<char>(dm.B * dm.chunks() * dm.r * dm.D * static_cast<i64>(elem));
  return c.bytes;
}

// Pass 1: chunk sums of v (x) x; combine (total, or exclusive prefix when
// causal). Pass 2 per (b, chunk): y_i = T x + u_i . W (W = V^T x), or
// causal y_i = lo x_{i-1} + d x_i + u_i . (S_<c + P_i), P_i = sum_{c0<=j<=i} v_j (x) x_j.
template <class T, class UV>
void matvec(const Dims& dm, bool causal, const T* x, const T* d, const T* up, const T* lo, const UV* u, const UV* v,
            const T* w, T* y, void* ws) {
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, nc = dm.chunks(), rD = r * D;
  Carve cv{static_cast<char*>(ws)};
  T* S = reinterpret_cast<T*>(cv.take<char>(B * nc * rD * static_cast<i64>(sizeof(T))));
  const bool stream = streams(static_cast<std::size_t>(B * N * D) * sizeof(T)) && rows_aligned(y, D);
  MatvecTask<T> task{dm, causal, x, d, up, lo, row_source<T>(u, N, r), row_source<T>(v, N, r), y, S, stream};
  if (!causal || r == 0 || D == 0) {
    if (r > 0 && D > 0) total_sums(dm, x, v, S, w);
    parallel::parallel_for(B * nc, static_cast<double>(B * N * D * (2 * r + 6)),
                           [&](i64 t) { run(task, t); });
    return;
  }
  // Causal: groups of G chunks (about 2 MiB of x and v): chunk sums,
  // exclusive prefix carried across groups (in double, in chunk order: the
  // same values as one global scan), then pass 2 while the group's x and v
  // are still in cache. x and v are read from memory once. The chunk sums of
  // the next group run in the same loop as this group's pass 2, taken in turn
  // by the threads: the sums read memory, the scans mostly compute, so they
  // overlap. (Groups of 4 MiB of x were 5-10 % slower at N = 2^22 on an AVX2
  // EPYC VM, r = 16 and r = 4, 2026-11-26; the results do not depend on G.)
  const i64 row_bytes = D * static_cast<i64>(sizeof(T)) + r * static_cast<i64>(sizeof(UV));
  const i64 G = std::max<i64>(1, (i64{2} << 20) / std::max<i64>(1, dm.L * row_bytes));
  SumsTask<T> sums{dm, x, row_source<T>(v, N, r), S};
  std::vector<double> carry(static_cast<std::size_t>(B * rD), 0.0);
  auto group_n = [&](i64 g0) { return std::min(nc, g0 + G) - g0; };
  auto group_rows = [&](i64 g0) { return std::min(N, (g0 + group_n(g0)) * dm.L) - g0 * dm.L; };
  // t over (b, chunk of the group starting at g0)
  auto task_id = [&](i64 g0, i64 t) { return (t / group_n(g0)) * nc + g0 + t % group_n(g0); };
  parallel::parallel_for(B * group_n(0), 2.0 * static_cast<double>(B * group_rows(0) * rD),
                         [&](i64 t) { run(sums, task_id(0, t)); });
  for (i64 g0 = 0; g0 < nc; g0 += G) {
    const i64 gn = group_n(g0), h0 = g0 + G, hn = h0 < nc ? group_n(h0) : 0;
    for (i64 b = 0; b < B; ++b) {
      double* acc = carry.data() + b * rD;
      for (i64 c = g0; c < g0 + gn; ++c) {
        T* s = S + (b * nc + c) * rD;
        for (i64 e = 0; e < rD; ++e) {
          double t = s[e];
          s[e] = static_cast<T>(acc[e]);
          acc[e] += t;
        }
      }
    }
    // B gn scans and B hn sums, interleaved in the order tasks start
    const i64 ns = B * gn, nm = B * hn, both = std::min(ns, nm);
    const double work = static_cast<double>(B * group_rows(g0) * D * (4 * r + 6)) +
                        (hn ? 2.0 * static_cast<double>(B * group_rows(h0) * rD) : 0.0);
    parallel::parallel_for_dynamic(ns + nm, work, [&](i64 t) {
      const bool scan = t < 2 * both ? t % 2 == 0 : ns > nm;
      const i64 k = t < 2 * both ? t / 2 : t - both;
      if (scan) run(task, task_id(g0, k));
      else run(sums, task_id(h0, k));
    });
  }
}

std::size_t sums_ws_bytes(const Dims& dm, std::size_t elem) { return matvec_ws_bytes(dm, elem); }
template <class T, class UV> void sums(const Dims& dm, const T* x, const UV* v, T* w, void* ws) {
  const i64 rD = dm.r * dm.D;
  if (rD == 0) return;
  T* S = static_cast<T*>(ws);
  total_sums(dm, x, v, S);
  for (i64 b = 0; b < dm.B; ++b) std::copy_n(S + b * dm.chunks() * rD, rD, w + b * rD);
}

std::size_t matvec_backward_ws_bytes(const Dims& dm, std::size_t elem) {
  Carve c;
  c.take<char>(dm.B * dm.chunks() * dm.r * dm.D * static_cast<i64>(elem));
  c.take<char>(dm.B * dm.chunks() * dm.r * dm.D * static_cast<i64>(elem));
  return c.bytes;
}

// Non-causal, W = V^T x, G = U^T dy: dx = T^T dy + V G, du = dy W^T, dv = x G^T.
// Causal, P_i = sum_{j<=i} v_j (x) x_j, Q_j = sum_{i>=j} u_i (x) dy_i:
//   dx_j = d_j dy_j + lo_j dy_{j+1} + v_j . Q_j, du_i = dy_i . P_i, dv_j = x_j . Q_j.
// Band: dd_i = dy_i . x_i, dup_i = dy_i . x_{i+1}, dlo_i = dy_{i+1} . x_i.
// Pass 1 forms the chunk sums; pass 2 runs per chunk over all b (the rows of
// the parameter gradients belong to one task: sums over b in order).
template <class T, class UV>
void matvec_backward(const Dims& dm, bool causal, const T* x, const T* d, const T* up, const T* lo, const UV* u,
                     const UV* v, const T* w, const T* dy, const MatvecGrads<T>& g, void* ws) {
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, nc = dm.chunks(), rD = r * D;
  Carve cv{static_cast<char*>(ws)};
  T* Sx = reinterpret_cast<T*>(cv.take<char>(B * nc * rD * static_cast<i64>(sizeof(T))));
  T* Sg = reinterpret_cast<T*>(cv.take<char>(B * nc * rD * static_cast<i64>(sizeof(T))));
  const bool need_x = g.du && r > 0 && D > 0, need_g = (g.dx || g.dv) && r > 0 && D > 0;
  if (need_x && !causal) {
    total_sums(dm, x, v, Sx, w);
  } else if (need_x) {
    chunk_sums(dm, x, v, Sx);
    combine(dm, rD, Sx, Scan::prefix);
  }
  if (need_g) {
    chunk_sums(dm, dy, u, Sg);
    combine(dm, rD, Sg, causal ? Scan::suffix : Scan::total);
  }
  const bool stream_dx = g.dx && streams(static_cast<std::size_t>(B * N * D) * sizeof(T)) && rows_aligned(g.dx, D);
  const bool stream_uv = streams(static_cast<std::size_t>(2 * N * r) * sizeof(T)) && (!g.du || rows_aligned(g.du, r)) &&
                         (!g.dv || rows_aligned(g.dv, r));
  const int sweeps = g_backward_sweeps.load(std::memory_order_relaxed);
  const bool one_sweep = sweeps == 1 || (sweeps == 0 && (wide_vectors() || D >= 128));
  BackwardTask<T> task{dm, causal, x, d, up, lo, dy, g, Sx, Sg, stream_dx, stream_uv, one_sweep};
  const RowSource<T> us = row_source<T>(u, N, r), vs = row_source<T>(v, N, r);
  parallel::parallel_for(nc, static_cast<double>(B * N * D * (6 * r + 10)),
                         [&](i64 c) { backward_chunk(task, us, vs, c); });
}

// ---- semiseparable_solve (Woodbury) ----
namespace {
// lu_factor, lu_solve: semiseparable_math.hpp (shared with the CUDA path).
Dims capacitance_dims(const Dims& dm) { return Dims{1, dm.N, dm.r, dm.r, dm.L}; }
}  // namespace

void fail_capacitance(const char* op, i64 r) {
  kernel_fail(op, fmt::format("the capacitance matrix I + V^T T^-1 U (rank {}) is singular to working precision "
                              "(||C^-1|| (1 + ||V^T T^-1 U||) u >= 0.1): T + U V^T is not invertible in this dtype",
                              r));
}

std::size_t woodbury_ws_bytes(const Dims& dm, std::size_t elem) {
  Carve c;
  auto e = static_cast<i64>(elem);
  Dims dc = capacitance_dims(dm);
  c.take<char>(static_cast<i64>(tridiag_ws_bytes(dm.N, elem)));
  c.take<char>(dm.N * dm.r * e);
  c.take<char>(std::max(dm.B * dm.chunks() * dm.r * dm.D, dc.chunks() * dm.r * dm.r) * e);
  c.take<double>(dm.r * dm.r + 2 * dm.r);  // C, and two r-vectors for capacitance_factor
  c.take<i64>(dm.r);
  return c.bytes;
}

// The Woodbury formula is not backward stable: where T^-1 is far larger than
// H^-1 (T nearly singular, H not: T = diag(1e-17, 1), u = v = e_1) its two
// terms cancel and y loses every digit with no pivot or capacitance check
// failing. So the solve measures what it returned: the relative residual
// eta = ||x - H y||_inf / (||H||_inf ||y||_inf + ||x||_inf) (||H||_inf
// bounded by T's largest row sum plus ||U||_inf ||V^T||_inf; the residual
// summed in f64, V^T y in T's dtype) and throws when eta exceeds
// kResidualLimit: about sqrt(u) (1e-8 in f64, 1e-3 in f32): y is then the
// exact solution of no system closer to H than that. S: B chunks r D
// elements (V^T y, per b in slot 0). Not checked: non-finite x or y.
template <class T>
void check_residual(const char* op, const Dims& dm, const T* x, const T* d, const T* up, const T* lo, const T* u,
                    const T* v, const T* y, T* S) {
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, nc = dm.chunks(), rD = r * D;
  if (B * N * D == 0) return;
  const double limit = sizeof(T) == 4 ? 1e-3 : 1e-8;
  double tmax = 0, umax = 0;
  for (i64 i = 0; i < N; ++i) {
    double row = std::fabs(static_cast<double>(d[i]));
    if (i > 0) row += std::fabs(static_cast<double>(lo[i - 1]));
    if (i + 1 < N) row += std::fabs(static_cast<double>(up[i]));
    tmax = std::max(tmax, row);
    double us = 0;
    for (i64 k = 0; k < r; ++k) us += std::fabs(static_cast<double>(u[i * r + k]));
    umax = std::max(umax, us);
  }
  std::vector<double> vcol(static_cast<std::size_t>(r), 0.0);  // column sums of |V|: the row sums of |V^T|
  for (i64 j = 0; j < N; ++j)
    for (i64 k = 0; k < r; ++k) vcol[static_cast<std::size_t>(k)] += std::fabs(static_cast<double>(v[j * r + k]));
  const double hnorm = tmax + umax * (r ? *std::max_element(vcol.begin(), vcol.end()) : 0.0);
  if (r > 0) total_sums(dm, y, v, S);  // V^T y_b
  struct Part { double res = 0, ymax = 0, xmax = 0; bool finite = true; };
  std::vector<Part> parts(static_cast<std::size_t>(B * nc));
  parallel::parallel_for(B * nc, static_cast<double>(2 * B * N * rD + 6 * B * N * D), [&](i64 t) {
    const i64 b = t / nc, c = t % nc, i0 = c * dm.L, i1 = std::min(N, i0 + dm.L);
    const T* W = S + b * nc * rD;
    Part& pt = parts[static_cast<std::size_t>(t)];
    for (i64 i = i0; i < i1; ++i)
      for (i64 e = 0; e < D; ++e) {
        const i64 at = (b * N + i) * D + e;
        double h = static_cast<double>(d[i]) * static_cast<double>(y[at]);
        if (i > 0) h += static_cast<double>(lo[i - 1]) * static_cast<double>(y[at - D]);
        if (i + 1 < N) h += static_cast<double>(up[i]) * static_cast<double>(y[at + D]);
        for (i64 k = 0; k < r; ++k) h += static_cast<double>(u[i * r + k]) * static_cast<double>(W[k * D + e]);
        const double xv = static_cast<double>(x[at]), yv = static_cast<double>(y[at]);
        pt.finite = pt.finite && std::isfinite(xv) && std::isfinite(yv) && std::isfinite(h);
        pt.res = std::max(pt.res, std::fabs(xv - h));
        pt.ymax = std::max(pt.ymax, std::fabs(yv));
        pt.xmax = std::max(pt.xmax, std::fabs(xv));
      }
  });
  Part all;
  for (const Part& pt : parts) {
    all.finite = all.finite && pt.finite;
    all.res = std::max(all.res, pt.res);
    all.ymax = std::max(all.ymax, pt.ymax);
    all.xmax = std::max(all.xmax, pt.xmax);
  }
  const double scale = hnorm * all.ymax + all.xmax;
  if (!all.finite || !std::isfinite(scale) || scale == 0) return;
  const double eta = all.res / scale;
  if (eta > limit)
    kernel_fail(op, fmt::format("the Woodbury solve lost its accuracy: relative residual ||x - H y|| / (||H|| ||y|| + "
                                "||x||) = {:.3g}, over {:g} for {}: T is too ill-conditioned for the formula (T^-1 far "
                                "larger than H^-1) or H is nearly singular",
                                eta, limit, sizeof(T) == 4 ? "f32" : "f64"));
}

template <class T>
void woodbury_solve(const char* op, const Dims& dm, const T* x, const T* d, const T* up, const T* lo, const T* u,
                    const T* v, T* y, bool trans, void* ws) {
  if (trans) { std::swap(up, lo); std::swap(u, v); }
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, nc = dm.chunks(), rD = r * D;
  const auto e = static_cast<i64>(sizeof(T));
  Dims dc = capacitance_dims(dm);
  Carve cv{static_cast<char*>(ws)};
  void* tws = cv.take<char>(static_cast<i64>(tridiag_ws_bytes(N, sizeof(T))));
  T* Z = reinterpret_cast<T*>(cv.take<char>(N * r * e));
  T* S = reinterpret_cast<T*>(cv.take<char>(std::max(B * nc * rD, dc.chunks() * r * r) * e));
  double* C = cv.take<double>(r * r + 2 * r);
  i64* piv = cv.take<i64>(r);
  tridiag_solve(op, N, B, D, d, up, lo, x, y, false, tws);  // y = T^-1 x (checks the pivots first)
  if (r == 0) return;
  tridiag_solve(op, N, 1, r, d, up, lo, u, Z, false, tws);  // Z = T^-1 U
  total_sums(dc, Z, v, S);                                   // V^T Z
  if (!capacitance_factor(S, r, C, piv, C + r * r, C + r * r + r)) fail_capacitance(op, r);
  if (D == 0 || B == 0) return;
  total_sums(dm, y, v, S);  // W_b = V^T y_b
  parallel::parallel_for(B, static_cast<double>(B * D * r * r * 2), [&](i64 b) {
    std::vector<double> tmp(static_cast<std::size_t>(r));
    T* W = S + b * nc * rD;
    for (i64 c = 0; c < D; ++c) lu_solve(C, r, piv, W + c, D, tmp.data());  // S_b = C^-1 W_b
  });
  parallel::parallel_for(B * nc, static_cast<double>(2 * B * N * rD), [&](i64 t) {
    i64 b = t / nc, c = t % nc, i0 = c * dm.L, i1 = std::min(N, i0 + dm.L);
    const T* W = S + b * nc * rD;
    std::vector<T> nz(static_cast<std::size_t>(r));
    for (i64 i = i0; i < i1; ++i) {
      for (i64 k = 0; k < r; ++k) nz[static_cast<std::size_t>(k)] = -Z[i * r + k];
      mix_acc(y + (b * N + i) * D, nz.data(), W, r, D);  // y -= Z S_b
    }
  });
  check_residual(op, dm, x, d, up, lo, u, v, y, S);
}

std::size_t woodbury_backward_ws_bytes(const Dims& dm, std::size_t elem) {
  Carve c;
  c.take<char>(static_cast<i64>(woodbury_ws_bytes(dm, elem)));
  c.take<char>(2 * dm.B * dm.chunks() * dm.r * dm.D * static_cast<i64>(elem));
  return c.bytes;
}

template <class T>
void woodbury_solve_backward(const char* op, const Dims& dm, const T* d, const T* up, const T* lo, const T* u,
                             const T* v, const T* y, const T* g, T* lam, T* dd, T* dup, T* dlo, T* du, T* dv,
                             void* ws) {
  const i64 B = dm.B, N = dm.N, D = dm.D, r = dm.r, nc = dm.chunks(), rD = r * D;
  Carve cv{static_cast<char*>(ws)};
  void* sws = cv.take<char>(static_cast<i64>(woodbury_ws_bytes(dm, sizeof(T))));
  T* A = reinterpret_cast<T*>(cv.take<char>(B * nc * rD * static_cast<i64>(sizeof(T))));
  T* Bm = A + B * nc * rD;
  woodbury_solve(op, dm, g, d, up, lo, u, v, lam, true, sws);  // lam = H^-T g
  if (r > 0 && D > 0) {
    total_sums(dm, y, v, A);     // V^T y_b
    total_sums(dm, lam, u, Bm);  // U^T lam_b
  }
  parallel::parallel_for(nc, static_cast<double>(B * N * D * (4 * r + 6)), [&](i64 c) {
    i64 i0 = c * dm.L, i1 = std::min(N, i0 + dm.L);
    for (i64 i = i0; i < i1; ++i) {
      dd[i] = T(0);
      if (i + 1 < N) { dup[i] = T(0); dlo[i] = T(0); }
      for (i64 k = 0; k < r; ++k) { du[i * r + k] = T(0); dv[i * r + k] = T(0); }
    }
    for (i64 b = 0; b < B; ++b) {
      const T *yb = y + b * N * D, *lb = lam + b * N * D;
      const T *Ab = A + b * nc * rD, *Bb = Bm + b * nc * rD;
      for (i64 i = i0; i < i1; ++i) {
        const T *yi = yb + i * D, *li = lb + i * D;
        dd[i] -= dot(li, yi, D);
        if (i + 1 < N) {
          dup[i] -= dot(li, yi + D, D);
          dlo[i] -= dot(li + D, yi, D);
        }
        if (D == 0) continue;
        for (i64 k = 0; k < r; ++k) {
          du[i * r + k] -= dot(li, Ab + k * D, D);
          dv[i * r + k] -= dot(yi, Bb + k * D, D);
        }
      }
    }
  });
}

#define AD_MATVEC_INST(T, UV)                                                                                      \
  template void matvec<T, UV>(const Dims&, bool, const T*, const T*, const T*, const T*, const UV*, const UV*,     \
                              const T*, T*, void*);                                                                \
  template void sums<T, UV>(const Dims&, const T*, const UV*, T*, void*);                                         \
  template void matvec_backward<T, UV>(const Dims&, bool, const T*, const T*, const T*, const T*, const UV*,       \
                                       const UV*, const T*, const T*, const MatvecGrads<T>&, void*);
AD_MATVEC_INST(float, float)
AD_MATVEC_INST(float, Bf16)
AD_MATVEC_INST(float, F16)
AD_MATVEC_INST(double, double)
#undef AD_MATVEC_INST
#define AD_WOODBURY_INST(T)                                                                                        \
  template void woodbury_solve<T>(const char*, const Dims&, const T*, const T*, const T*, const T*, const T*,      \
                                  const T*, T*, bool, void*);                                                      \
  template void woodbury_solve_backward<T>(const char*, const Dims&, const T*, const T*, const T*, const T*,       \
                                           const T*, const T*, const T*, T*, T*, T*, T*, T*, T*, void*);
AD_WOODBURY_INST(float)
AD_WOODBURY_INST(double)
#undef AD_WOODBURY_INST

}  // namespace ad::semisep
