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


// Staged kernels (third generation: f32, D a multiple of 4 up to 64, r up to
// 64): blocks of 256 threads copy contiguous spans of rows to shared memory
// with cp.async, ST tiles in flight per block, so the bytes in flight do not
// depend on registers; the arithmetic reads shared memory only.
inline bool staged_applies(std::int64_t r, std::int64_t D, int es) {
  return es == 4 && D >= 4 && D <= 64 && D % 4 == 0 && r >= 1 && r <= 64;
}
constexpr std::int64_t kStagedSmem = 96 * 1024;  // at most 2 blocks per multiprocessor below this
constexpr int kSumsStages = 4, kRowsStages = 3;

// Chunk sums: a tile of R rows is x (R x D) then v (R x r, rounded up to 4,
// plus 4 elements that the last tile reads past r). Threads form G groups of
// tpg (lane = a 4 x TE tile of the r x D sum, ntiles of them); group g takes
// rows g, g + G, ...; the groups' partials are added in
// order through the same shared memory at the end of the chunk (256 * 4 * TE
// elements).
struct StagedSums {
  int R, ST, stage, TE, ne, ntiles, tpg, G;
  std::int64_t smem_bytes;
};
inline StagedSums staged_sums(std::int64_t r, std::int64_t D) {
  StagedSums p{};
  p.ST = kSumsStages;
  p.TE = 4;  // 4 x 8 tiles (79 registers) ran slower on an H200: 0.241 against 0.208 ms
  p.ne = static_cast<int>(D / p.TE);
  p.ntiles = (round4(r) / 4) * p.ne;
  p.tpg = 16;
  while (p.tpg < p.ntiles) p.tpg *= 2;
  p.G = 256 / p.tpg;
  auto stage = [&](int R) { return static_cast<int>(R * D) + round4(R * r) + 4; };
  p.R = 64;
  while (p.R > 8 && static_cast<std::int64_t>(p.ST) * stage(p.R) * 4 > kStagedSmem / 2) p.R /= 2;
  p.stage = stage(p.R);
  p.smem_bytes = std::max<std::int64_t>(static_cast<std::int64_t>(p.ST) * p.stage, 256 * 4 * p.TE) * 4;
  return p;
}

// Full rows: thread = (row pair p, 4 columns): rows p and p + R / 2 of a tile
// of R rows (a multiple of 8: a tile's first row times r is a multiple of 4,
// so u's span is 16-byte aligned). A stage holds x rows [t0 - 1, t0 + R + 1)
// ((R + 2) x D), u (R x r rounded up to 4), d and up (R each) and lo (R + 4:
// from row t0 - 4, 16-byte aligned); W (r x D) follows the ST stages.
struct StagedRows {
  int R, ST, stage;
  std::int64_t smem_bytes;
};
inline StagedRows staged_rows(std::int64_t r, std::int64_t D) {
  StagedRows p{};
  p.ST = kRowsStages;
  auto stage = [&](int R) { return static_cast<int>((R + 2) * D) + round4(R * r) + 3 * R + 4; };
  auto bytes = [&](int R) { return (static_cast<std::int64_t>(p.ST) * stage(R) + r * D) * 4; };
  p.R = 2 * static_cast<int>(256 / (D / 4)) / 8 * 8;
  while (p.R > 8 && bytes(p.R) > kStagedSmem) p.R -= 8;
  p.stage = stage(p.R);
  p.smem_bytes = bytes(p.R);
  return p;
}

// Causal product in one pass over memory (staged; D in {8, 16, 32, 64}, r <=
// 32): a block takes a chunk of Lg = H * SR rows in order of a counter;
// thread = (sub-chunk h, 2 columns), H = 256 / (D / 2) sub-chunks of SR rows,
// HW = 32 / (D / 2) of them per warp. The chunk's x (from the row before it),
// v, u, d and lo are copied to shared memory once, up front: phase 1 (the
// sub-chunk sums) waits for x and v only, u arrives behind it, and phase 2
// (the scan) reads shared memory only. Between the phases the chunk publishes
// its sum and finds its exclusive prefix by a decoupled look-back over the
// chunks before it (the workspace: a flag per chunk, each chunk's sum in f32
// and its inclusive prefix in f64). Shared memory within kScanSmem: two
// blocks per multiprocessor. The workspace is at most a quarter of x's size
// (Lg >= 16 r: 12 r D bytes a chunk against 4 Lg D of x).
// cluster: the layout of the clustered kernel (semiseparable.cu, variants 5
// and 6), which also holds its cluster's exclusive prefix (r x D doubles at
// oG); chunks are a little shorter for it.
struct StagedScan {
  int Dh, H, HW, SR, Lg;
  int ox, ov, ou, od, olo, owt, oE, oG;  // float offsets in shared memory (oE, oG: doubles start there)
  std::int64_t smem_bytes;
  bool fits;  // shared memory within the limit, the workspace bound above, r D <= 1024
};
constexpr std::int64_t kScanSmem = 110 * 1024;  // two blocks per multiprocessor (228 KB each)
inline StagedScan staged_scan(std::int64_t r, std::int64_t D, bool cluster = false) {
  StagedScan p{};
  if (!(D == 8 || D == 16 || D == 32 || D == 64) || r < 1 || r > 32) return p;
  const std::int64_t limit = kScanSmem;
  p.Dh = static_cast<int>(D / 2);
  p.H = 256 / p.Dh;
  p.HW = 32 / p.Dh;
  auto layout = [&](int SR) {
    const std::int64_t Lg = std::int64_t{p.H} * SR;
    std::int64_t o = 0;
    p.ox = static_cast<int>(o), o += (Lg + 1) * D;  // row -1 first (zeros before the first row)
    // + 8: the walks read up to 3 past the last row's r ranks (8 since the
    // FP64 tensor-core walks, now removed: the layout measured since)
    p.ov = static_cast<int>(o), o += round4(Lg * r) + 8;
    p.ou = static_cast<int>(o), o += round4(Lg * r) + 8;
    p.od = static_cast<int>(o), o += round4(Lg);
    p.olo = static_cast<int>(o), o += round4(Lg);  // lo_{i - 1} for row i (0 before the first row)
    p.owt = static_cast<int>(o), o += 8 * r * D;
    o = (o + 3) / 4 * 4;
    p.oE = static_cast<int>(o), o += 2 * r * D;
    p.oG = static_cast<int>(o), o += cluster ? 2 * r * D : 0;
    return o * 4;
  };
  int SR = 32;
  while (SR > 1 && layout(SR) > limit) --SR;
  p.smem_bytes = layout(SR);
  p.SR = SR;
  p.Lg = p.H * SR;
  p.fits = p.smem_bytes <= limit && p.Lg >= 16 * r && r * D <= 1024;
  return p;
}
// The workspace: B * chunks flags (int) and a counter, rounded up to 16 bytes
// (staged_scan_flag_bytes); then each chunk's sum (r x D floats) and its
// inclusive prefix (r x D doubles, 16-byte aligned: r D is a multiple of 8).
inline std::int64_t staged_scan_flag_bytes(std::int64_t B, std::int64_t N, std::int64_t D, std::int64_t r) {
  const StagedScan p = staged_scan(r, D);
  if (!p.fits) return 0;
  const std::int64_t nc = (N + p.Lg - 1) / p.Lg;
  return (B * nc + 1 + 3) / 4 * 16;
}
// The rounds kernel (semiseparable.cu, variants 7 to 10) takes the one-pass
// kernel's chunks in rounds of Rc consecutive chunks of a batch. Its
// workspace, in bytes from the start: a ticket counter and three flags per
// round (its chunks' sums all written; its chunks' prefixes written; the
// look-back's flag over rounds: 1 its sum, 2 its inclusive prefix), rounded
// up to 16 bytes; each chunk's sum (r x D floats, at agg) and exclusive
// prefix (r x D doubles, at E); each round's sum (r x D floats, at rag) and
// inclusive prefix (r x D doubles, at rin).
struct RoundsLayout {
  std::int64_t rounds = 0;  // rounds per batch
  std::int64_t agg = 0, E = 0, rag = 0, rin = 0, bytes = 0;
};
constexpr std::int64_t kMinRoundChunks = 16;  // the workspace below holds rounds this short or longer
inline RoundsLayout staged_rounds_layout(std::int64_t B, std::int64_t N, std::int64_t D, std::int64_t r,
                                         std::int64_t Rc) {
  RoundsLayout L;
  const StagedScan p = staged_scan(r, D);
  if (!p.fits || Rc < 1) return L;
  const std::int64_t nc = (N + p.Lg - 1) / p.Lg, rD = r * D;
  L.rounds = (nc + Rc - 1) / Rc;
  L.agg = (1 + 3 * B * L.rounds + 3) / 4 * 16;
  L.E = L.agg + B * nc * rD * 4;  // rD is a multiple of 8 (D even): 16-byte aligned
  L.rag = L.E + B * nc * rD * 8;
  L.rin = L.rag + B * L.rounds * rD * 4;
  L.bytes = L.rin + B * L.rounds * rD * 8;
  return L;
}
// the larger of the one-pass kernel's workspace and the rounds kernel's with
// rounds of kMinRoundChunks chunks (longer rounds take less)
inline std::int64_t staged_scan_ws_bytes(std::int64_t B, std::int64_t N, std::int64_t D, std::int64_t r) {
  const StagedScan p = staged_scan(r, D);
  if (!p.fits) return 0;
  const std::int64_t nc = (N + p.Lg - 1) / p.Lg;
  const std::int64_t one_pass = staged_scan_flag_bytes(B, N, D, r) + B * nc * r * D * (4 + 8);
  const std::int64_t rounds = staged_rounds_layout(B, N, D, r, kMinRoundChunks).bytes;
  return one_pass > rounds ? one_pass : rounds;
}

}  // namespace ad::cuda_k::semisep_plan
