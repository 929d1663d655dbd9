#pragma once
// Launch plans of the semiseparable forward's warp-level CUDA kernels
// (src/cuda/semiseparable.cu): plain host arithmetic, no CUDA headers, so the
// CPU tests check it on every build (tests/gpu_plans.cpp) — a wrong size
// here fails only at launch, on a GPU.
#include <algorithm>
#include <cstdint>

namespace ad::cuda_k::semisep_plan {

inline int round4(std::int64_t n) { return static_cast<int>((n + 3) / 4 * 4); }
constexpr std::int64_t kBlockSmem = 48 * 1024;  // shared memory a block may take without opting in

// Causal scan (D <= 32, KB = r rounded up to 4, 8, 16, 24 or 32; es: bytes
// per element): a warp takes CPW chunks, lane = (chunk, column); each chunk
// row of shared memory holds u [0, KB), v [KB, 2 KB), x [2 KB, 2 KB + D), d
// and lo, padded to ROW (a multiple of 4 elements: 16-byte loads); a tile is
// RB rows; chunks sit CH elements apart, padded so that two chunks' rows
// differ by 16 bytes modulo 128 (no shared-memory bank conflict between the
// two 16-byte loads of a warp); two tiles per warp (double buffering), WPB
// warps per block, at most 10 KB of shared memory per warp.
struct Scan {
  int CPW, ROW, RB, CH, WPB;
  std::int64_t smem_bytes;
};
inline Scan scan(std::int64_t D, int KB, int es) {
  Scan p{};
  p.WPB = 4;
  constexpr int per_warp = 10240;
  p.ROW = round4(2 * KB + D + 2);
  // the padding is under 128 bytes a chunk: budgeted as 128
  p.CPW = std::max(1, std::min(static_cast<int>(32 / D), per_warp / (2 * (2 * p.ROW * es + 128))));
  p.RB = std::clamp((per_warp / (2 * p.CPW) - 128) / (p.ROW * es), 2, 32);
  p.CH = p.RB * p.ROW + (((16 - p.RB * p.ROW * es) % 128 + 128) % 128) / es;
  p.smem_bytes = static_cast<std::int64_t>(p.WPB) * 2 * p.CPW * p.CH * es;
  return p;
}

// Full rows (D <= 128): lane = (row slot, 4 columns), rpw rows per warp, 8
// warps per block; W (r x Dp) and each warp's rows of u at the odd stride rs
// in shared memory. `fits`: within the 48 KB a block gets without opting in
// (not so for f64 with r > 23 and D <= 4: those take the first tiled kernel).
struct Rows {
  int Dp, ne, rpw, rs;
  std::int64_t smem_bytes;
  bool fits;
};
inline Rows rows(std::int64_t r, std::int64_t D, int es) {
  Rows p{};
  p.Dp = round4(D);
  p.ne = p.Dp / 4;
  p.rpw = 32 / p.ne;
  p.rs = static_cast<int>(r) | 1;
  p.smem_bytes = (r * p.Dp + 8 * static_cast<std::int64_t>(p.rpw) * p.rs) * es;
  p.fits = D <= 128 && p.smem_bytes <= kBlockSmem;
  return p;
}

// Chunk sums: lane = a 4 x 4 tile of the r x D state; the warp-level kernel
// takes at most 32 tiles.
inline int sums_tiles(std::int64_t r, std::int64_t D) { return (round4(r) / 4) * (round4(D) / 4); }

}  // namespace ad::cuda_k::semisep_plan
