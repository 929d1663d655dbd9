#pragma once
// How the GPU sums a tensor over some of its axes (sum, mean, sum_to): a
// plain function of the shapes, shared by the CUDA launcher (src/cuda/reduce.cu)
// and the ops that declare its workspace, so the plan knows the bytes.
//
// Adjacent axes of one kind (kept or summed) merge. When what is left is
// [O kept][R summed][I kept] (any of them 1), output (o, i) is the sum over r
// of x[(o R + r) I + i]: I == 1 sums contiguous runs (a block per output),
// I > 1 sums strided columns (a thread per output, neighbouring threads on
// neighbouring i). When there are few outputs, each output's R terms are cut
// into P parts summed in parallel into f64 partials (the op's workspace,
// O P I doubles), then added in part order: the order depends on the shapes
// only, so results are deterministic. Other layouts (summed axes between kept
// ones more than once) take a generic kernel: a block per output.
#include <algorithm>
#include <cstdint>

#include "ad/shape.hpp"

namespace ad::sumlayout {

struct Layout {
  std::int64_t O = 1, R = 1, I = 1;  // kept before, summed, kept after
  std::int64_t P = 1;                // parts per output (1: no partials)
  bool general = false;              // not [O][R][I]: the generic kernel, no parts
  std::int64_t ws_bytes() const { return !general && P > 1 ? O * P * I * static_cast<std::int64_t>(sizeof(double)) : 0; }
};

// keep: xs with 1 at each summed axis (the same rank as xs)
inline Layout layout(const Shape& xs, const Shape& keep) {
  Layout L;
  int kinds[3] = {0, 0, 0};  // the sequence of merged axis kinds: 1 kept, 2 summed
  int n = 0;
  std::int64_t sizes[3] = {1, 1, 1};
  for (int d = 0; d < xs.rank(); ++d) {
    if (xs[d] == 1) continue;  // size-1 axes are neither
    const int kind = keep[d] == 1 ? 2 : 1;
    if (n > 0 && kinds[n - 1] == kind) {
      sizes[n - 1] *= xs[d];
      continue;
    }
    if (n == 3) {
      L.general = true;
      return L;
    }
    kinds[n] = kind;
    sizes[n++] = xs[d];
  }
  // place the merged runs into [O][R][I]
  int at = 0;  // 0: before R, 1: R taken
  for (int q = 0; q < n; ++q) {
    if (kinds[q] == 2) {
      L.R = sizes[q];
      at = 1;
    } else if (at == 0) {
      L.O = sizes[q];
    } else {
      L.I = sizes[q];
    }
  }
  if (n == 3 && kinds[0] == 2) {  // summed, kept, summed
    L.general = true;
    return L;
  }
  const std::int64_t nout = L.O * L.I;
  if (L.I == 1)  // a block per part: about 1024 blocks, each part at least 2048 terms
    L.P = std::clamp<std::int64_t>(std::min((1024 + nout - 1) / nout, L.R / 2048), 1, 1024);
  else  // a thread per part: about 65536 threads, each part at least 64 terms
    L.P = std::clamp<std::int64_t>(std::min((65536 + nout - 1) / nout, L.R / 64), 1, 1024);
  return L;
}

}  // namespace ad::sumlayout
