#pragma once
// Workspace layout of the semi-Markov CRF's CUDA kernels (src/cuda/semicrf.cu),
// computed by the host: the op's `workspace` (what the planner counts) and the
// launchers carve the same bytes. Plain C++ (no CUDA headers).
//
// The workspace is `lanes` equal parts; lane l (one CUDA block) runs the
// sequences b = l, l + lanes, ... one after another. A lane holds the CPU's
// structure for one sequence (ops/semicrf_cpu.hpp): a Ke-slot α ring per
// stored checkpoint (every I positions, the live ring being the last slot),
// the α rows of one interval, a Ke-slot β ring, O(C) rows, and for the
// backward pass f64 partial sums of dD (Ke, C), dTr and dP per lane, added
// over lanes in lane order at the end. Nothing has a T·K factor; Viterbi
// holds O(T·C) int32 backpointers, as on the CPU.
#include <algorithm>
#include <cstdint>

#include "ops/semicrf_cpu.hpp"

namespace ad::semicrf::gpu {

// Sequences in flight at once (one CUDA block each).
inline constexpr std::int64_t kMaxLanes = 64;

struct Layout {
  std::int64_t lanes = 1, ke = 0, I = 0, slots = 0;
  // byte offsets inside a lane
  std::int64_t ck_ring = 0, ck_stride = 0, ck_meta = 0, meta_stride = 0, ival = 0, nu = 0, bring = 0, bbase = 0,
               abase = 0, rows = 0, gD = 0, gTr = 0, gP = 0, bk = 0, bc = 0;
  std::int64_t lane_bytes = 0, total = 0;
};

inline std::int64_t align256(std::int64_t b) { return (b + 255) / 256 * 256; }

// Rows of C doubles in a lane's `rows` area.
inline constexpr std::int64_t kRows = 10;

// esize: bytes of the input dtype. The fast path keeps its rings and the
// interval rows in the input dtype (relative to f64 bases, as the CPU); the
// general path and Viterbi keep everything in f64.
inline Layout layout(const Dims& d, Pass pass) {
  Layout y;
  y.ke = d.ke();
  y.I = interval(d.T, y.ke);
  y.slots = std::max<std::int64_t>(checkpoints(d.T, y.I), 1);
  y.lanes = std::max<std::int64_t>(1, std::min<std::int64_t>(d.B, kMaxLanes));
  const std::int64_t C = d.C, ke = y.ke;
  const bool fast = !d.general && pass != Pass::viterbi;
  const std::int64_t re = fast ? static_cast<std::int64_t>(d.esize) : 8;
  // a ring column in elements: the fast path's f32 rings keep hi + lo, as the CPU's (ring_column)
  const std::int64_t rke = fast && re == 4 ? detail::ring_column<float>(ke) : ke;
  std::int64_t cur = 0;
  auto take = [&cur](std::int64_t bytes) { std::int64_t o = cur; cur += align256(bytes); return o; };
  y.ck_stride = align256(C * rke * re);
  y.meta_stride = align256(3 * C * 8);
  y.rows = take(kRows * C * 8);
  y.abase = take(2 * C * 8);
  if (pass == Pass::logz || pass == Pass::viterbi) {
    y.ck_ring = take(C * rke * re);
  } else {
    y.ck_ring = take(y.ck_stride * y.slots);
    if (fast) y.ck_meta = take(y.meta_stride * y.slots);
    y.ival = take(y.I * C * re);
    if (fast) y.nu = take(y.I * 8);
    y.bring = take(C * rke * re);
    y.bbase = take(2 * C * 8);
  }
  if (pass == Pass::viterbi) {
    y.bk = take((d.T + 1) * C * 4);
    y.bc = take((d.T + 1) * C * 4);
  }
  if (pass == Pass::backward) {
    y.gD = take(ke * C * 8);
    y.gTr = take((d.general ? ke : 1) * C * C * 8);
    y.gP = take(C * 8);
  }
  y.lane_bytes = cur;
  y.total = y.lanes * y.lane_bytes;
  return y;
}

}  // namespace ad::semicrf::gpu
