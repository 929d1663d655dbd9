#pragma once
// Internal: a plain std::thread parallel loop for CPU kernels. Each task
// index writes its own outputs and every reduction a kernel does runs in a
// fixed order, so results are the same bits for any thread count.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace ad::parallel {

inline int max_threads() {
  unsigned h = std::thread::hardware_concurrency();
  return h ? static_cast<int>(std::min(h, 64u)) : 1;
}

// Runs f(i) for i in [0, n), splitting [0, n) into contiguous ranges over up
// to max_threads() threads. `work` (about the flops of the whole loop)
// decides whether threads pay: below ~2^17 it runs on the calling thread.
// An exception thrown by f is rethrown on the caller (the one from the
// lowest range when several throw).
template <class F> void parallel_for(std::int64_t n, double work, F&& f) {
  if (n <= 0) return;
  std::int64_t t = std::min<std::int64_t>(n, max_threads());
  if (work < 131072.0) t = 1;
  if (t <= 1) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<std::exception_ptr> err(static_cast<std::size_t>(t));
  auto run = [&](std::int64_t w) {
    std::int64_t lo = n * w / t, hi = n * (w + 1) / t;
    try {
      for (std::int64_t i = lo; i < hi; ++i) f(i);
    } catch (...) {
      err[static_cast<std::size_t>(w)] = std::current_exception();
    }
  };
  std::vector<std::thread> th;
  th.reserve(static_cast<std::size_t>(t - 1));
  for (std::int64_t w = 1; w < t; ++w) th.emplace_back(run, w);
  run(0);
  for (auto& x : th) x.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

}  // namespace ad::parallel
