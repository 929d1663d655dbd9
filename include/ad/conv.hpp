#pragma once
// Convolutions and poolings over images (NCHW) as graph ops. A convolution
// keeps only its input and weight for the backward pass: the unfolded
// columns (im2col, KH * KW times the input) live in the kernel's workspace
// while it runs, never in the graph, so the planner sees the memory a step
// really holds.
#include <array>
#include <cstdint>

#include "ad/graph.hpp"

namespace ad {

struct Conv2dOptions {
  std::array<std::int64_t, 2> stride{1, 1};    // (h, w), >= 1
  std::array<std::int64_t, 2> padding{0, 0};   // zeros on each side, >= 0
  std::array<std::int64_t, 2> dilation{1, 1};  // spacing of the kernel's taps, >= 1
  std::int64_t groups = 1;                      // divides C and O; C = O = groups is a depthwise conv
};

// Cross-correlation, as in every deep-learning framework:
//   y[n,o,oh,ow] = sum_{c,i,j} w[o,c,i,j] x[n, g*C/G + c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
// (g = o's group, o / (O/G); x taken as 0 in the padding).
//   x [N, C, H, W], w [O, C/G, KH, KW] -> y [N, O, HO, WO],
//   HO = floor((H + 2 ph - dh (KH - 1) - 1) / sh) + 1, likewise WO.
// f32 or f64, one dtype. No bias: add one as y + reshape(g.param(b), {O, 1, 1})
// (nn::Conv2d does).
// Gradients: dx is the transposed convolution of dy (col2im of w^T dy), dw
// sums dy times the columns over the batch; both are ops of their own with
// gradients, so conv2d can be differentiated twice.
// Kernels: per image, the columns are formed in the op's workspace (C KH KW
// x HO WO elements; on CUDA up to 64 MiB of images at once) and multiplied by
// w through BLAS / cuBLAS; a 1x1 kernel with stride 1 and no padding uses x
// directly (no workspace), and on the CPU a depthwise conv (C/G = 1) runs as
// shifted multiply-adds over planes (no workspace either).
// Throws ad::Error naming conv2d and the shapes when x or w is not rank 4,
// C != (w's dim 1) * groups, groups does not divide O, the window (with
// dilation and padding) is larger than the padded input, or dtypes differ or
// are not f32/f64; naming conv2d and the option when an option is out of
// range (stride, dilation, groups >= 1, padding >= 0, each below 2^31).
Var conv2d(const Operand& x, const Operand& w, const Conv2dOptions& options = {});

// The transposed convolution (a "deconvolution"): conv2d's gradient with
// respect to its input, as a layer. x [N, Cin, H, W], w [Cin, Cout/G, KH, KW]
// (PyTorch's ConvTranspose2d layout) -> [N, Cout, HO, WO] with
//   HO = (H - 1) sh - 2 ph + dh (KH - 1) + 1 + output_padding[0], likewise WO;
// each x element scatters w's window into the output, stride apart (stride 2
// doubles the size: the upsampling path of a U-Net). output_padding (each
// below the stride, or the dilation) picks among the sizes that stride
// rounds together. The node is conv2d_backward_input, so its kernels and
// gradients are conv2d's. Throws ad::Error naming conv_transpose2d for bad
// options or output_padding, and conv2d_backward_input's errors for shapes.
Var conv_transpose2d(const Operand& x, const Operand& w, const Conv2dOptions& options = {},
                     std::array<std::int64_t, 2> output_padding = {0, 0});

// Nearest-neighbour upsampling by whole factors: y[n,c,i,j] =
// x[n,c,i/fh,j/fw]. x [N, C, H, W] -> [N, C, H fh, W fw]. A reshape and a
// broadcast (no kernel of its own); the gradient sums each block.
Var upsample_nearest2d(const Operand& x, std::array<std::int64_t, 2> factor);

struct Conv1dOptions {
  std::int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
};
// (nn::Conv1d is the layer.)
// conv2d over sequences: x [N, C, L], w [O, C/G, K] -> [N, O, LO] (a conv2d
// with H = 1, through reshapes; x or w may be a Parameter; the errors past
// the ranks name conv2d).
Var conv1d(const Operand& x, const Operand& w, const Conv1dOptions& options = {});

struct Pool2dOptions {
  std::array<std::int64_t, 2> kernel{2, 2};    // window (h, w), >= 1
  std::array<std::int64_t, 2> stride{0, 0};    // 0: the kernel size
  std::array<std::int64_t, 2> padding{0, 0};  // >= 0; max_pool2d: no window may lie wholly in it
  std::array<std::int64_t, 2> dilation{1, 1};  // max_pool2d only
  // avg_pool2d only: false divides each window by its taps inside x (the
  // padding not counted), as count_include_pad = False in PyTorch
  bool count_padding = true;
};

// y[n,c,oh,ow] = max over the window's taps that fall inside x (the padding
// takes no part; a window with no tap inside x is an error when the node is
// built). x [N, C, H, W] -> [N, C, HO, WO], sizes as conv2d. A NaN in a window is its maximum (the first NaN); the gradient goes
// to the tap that won: the first largest one on a tie (no split). The
// backward reads x, not saved indices (it finds the winner again); it has no
// gradient of its own (max_pool2d is differentiable once).
// f32 or f64. Throws ad::Error naming max_pool2d and the shape when x is not
// rank 4, an option is out of range, or the window does not fit.
Var max_pool2d(const Operand& x, const Pool2dOptions& options = {});

// The mean over each window, the padding's zeros included (every window
// divides by KH * KW; count_padding = false divides by the taps inside x
// instead): a depthwise conv2d with weights 1 / (KH KW), so it
// shares conv2d's kernels and gradients. dilation must be 1. Throws
// ad::Error naming avg_pool2d for a bad kernel, padding or dilation, a
// window larger than the padded input, x not rank 4 or not f32/f64.
Var avg_pool2d(const Operand& x, const Pool2dOptions& options = {});

}  // namespace ad
