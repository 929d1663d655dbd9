#pragma once
// Internal: the index math of conv2d and the 2-D poolings. The CUDA kernels
// (src/cuda/conv.cu) evaluate im2col_at / col2im_at per element; the CPU
// kernels (src/ops/conv.cpp) form the same columns a row segment at a time
// (the tests compare both with plain loops, and col2im_at's order of terms
// with the CPU's scatter). The max-pool functions are shared as they are.
//
// Layouts (row-major): x [N, C, H, W], w [O, C/G, KH, KW], y [N, O, HO, WO].
// The columns of one image ("im2col"): cols[r][l] with r = (c * KH + i) * KW
// + j over all C channels (so group g's rows are one block, g * C/G * KH * KW
// onwards) and l = oh * WO + ow: the x element that weight (c, i, j) meets at
// output position (oh, ow), or 0 where that falls in the padding.
#include <cmath>
#include <cstdint>

#include "ad/hd.hpp"

namespace ad::conv {

struct Geom {
  std::int64_t n, c, h, w;   // x
  std::int64_t o, kh, kw;    // output channels (pooling: c), window
  std::int64_t ho, wo;       // output spatial dims
  std::int64_t sh, sw, ph, pw, dh, dw, g;  // stride, padding, dilation, groups
  AD_HD std::int64_t cg() const { return c / g; }
  AD_HD std::int64_t og() const { return o / g; }
  AD_HD std::int64_t kk() const { return kh * kw; }
  AD_HD std::int64_t plane() const { return h * w; }
  AD_HD std::int64_t l() const { return ho * wo; }           // output positions per channel
  AD_HD std::int64_t rows() const { return c * kh * kw; }    // column rows of one image
  AD_HD std::int64_t cols_elems() const { return rows() * l(); }
  // a 1x1 window, stride 1, no padding: the columns are x itself
  AD_HD bool direct() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// The output size along one dim: floor((in + 2 pad - dil (k - 1) - 1) / stride) + 1
// (may be <= 0: the caller reports it).
inline std::int64_t out_size(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t pad, std::int64_t dil) {
  const std::int64_t span = in + 2 * pad - dil * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

// cols[r][l] of one image (x_img: [C, H, W]).
template <class T> AD_HD T im2col_at(const Geom& g, const T* x_img, std::int64_t r, std::int64_t l) {
  const std::int64_t j = r % g.kw, i = (r / g.kw) % g.kh, c = r / g.kk();
  const std::int64_t ow = l % g.wo, oh = l / g.wo;
  const std::int64_t y = oh * g.sh - g.ph + i * g.dh, x = ow * g.sw - g.pw + j * g.dw;
  if (y < 0 || y >= g.h || x < 0 || x >= g.w) return T(0);
  return x_img[(c * g.h + y) * g.w + x];
}

// The window rows i (or columns j) whose tap lands on input coordinate y:
// y = o * s - p + i * d for an output o in [0, out). Calls f(i, o) for each,
// i ascending.
template <class F>
AD_HD void taps_at(std::int64_t y, std::int64_t k, std::int64_t s, std::int64_t p, std::int64_t d, std::int64_t out,
                   F f) {
  for (std::int64_t i = 0; i < k; ++i) {
    const std::int64_t t = y + p - i * d;
    if (t < 0) break;  // t falls as i grows
    if (t % s != 0) continue;
    const std::int64_t o = t / s;
    if (o < out) f(i, o);
  }
}

// col2im, the adjoint of im2col: dx_img[c][y][x] = the sum of the cols
// entries that im2col read from (c, y, x), in a fixed order (i, then j).
template <class T> AD_HD T col2im_at(const Geom& g, const T* cols, std::int64_t c, std::int64_t y, std::int64_t x) {
  T s = T(0);
  taps_at(y, g.kh, g.sh, g.ph, g.dh, g.ho, [&](std::int64_t i, std::int64_t oh) {
    taps_at(x, g.kw, g.sw, g.pw, g.dw, g.wo, [&](std::int64_t j, std::int64_t ow) {
      s += cols[((c * g.kh + i) * g.kw + j) * g.l() + oh * g.wo + ow];
    });
  });
  return s;
}

// ---- max pooling ----  over the window's taps inside x (padding takes no
// part); the first largest tap wins a tie, the first NaN wins over anything.
// Returns the winning tap i * kw + j of output (oh, ow) of one plane [H, W],
// or -1 when every tap falls in the padding (prevented by max_pool2d's checks).
template <class T> AD_HD std::int64_t max_tap(const Geom& g, const T* plane, std::int64_t oh, std::int64_t ow) {
  std::int64_t best = -1;
  T bv = T(0);
  for (std::int64_t i = 0; i < g.kh; ++i) {
    const std::int64_t y = oh * g.sh - g.ph + i * g.dh;
    if (y < 0 || y >= g.h) continue;
    for (std::int64_t j = 0; j < g.kw; ++j) {
      const std::int64_t x = ow * g.sw - g.pw + j * g.dw;
      if (x < 0 || x >= g.w) continue;
      const T v = plane[y * g.w + x];
      if (best < 0 || (!(bv != bv) && (v > bv || v != v))) {
        best = i * g.kw + j;
        bv = v;
      }
    }
  }
  return best;
}
template <class T> AD_HD T max_pool_at(const Geom& g, const T* plane, std::int64_t oh, std::int64_t ow) {
  const std::int64_t t = max_tap(g, plane, oh, ow);
  const std::int64_t i = t / g.kw, j = t % g.kw;
  return plane[(oh * g.sh - g.ph + i * g.dh) * g.w + ow * g.sw - g.pw + j * g.dw];
}
// The gradient at x (y, x) of one plane: the dy of every window whose winning
// tap is (y, x), summed in a fixed order.
template <class T>
AD_HD T max_pool_grad_at(const Geom& g, const T* plane, const T* dy_plane, std::int64_t y, std::int64_t x) {
  T s = T(0);
  taps_at(y, g.kh, g.sh, g.ph, g.dh, g.ho, [&](std::int64_t i, std::int64_t oh) {
    taps_at(x, g.kw, g.sw, g.pw, g.dw, g.wo, [&](std::int64_t j, std::int64_t ow) {
      if (max_tap(g, plane, oh, ow) == i * g.kw + j) s += dy_plane[oh * g.wo + ow];
    });
  });
  return s;
}

}  // namespace ad::conv
