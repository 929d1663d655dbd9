#pragma once
// The GPU benchmarks' timer: the minimum over `reps` timed calls of f, after
// one warm-up call (cuBLAS handle, the caching allocator's blocks), each
// timed on the host around ad::cuda::synchronize(0).
#include <ad/ad.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

namespace bench {

inline double gpu_time_min(int reps, const std::function<void()>& f) {
  f();
  ad::cuda::synchronize(0);
  double best = INFINITY;
  for (int k = 0; k < std::max(1, reps); ++k) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    ad::cuda::synchronize(0);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace bench
