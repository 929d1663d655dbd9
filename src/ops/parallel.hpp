#pragma once
// Internal: parallel loops for CPU kernels over a pool of persistent worker
// threads (parallel.cpp). Each task index writes its own outputs and every
// reduction a kernel does runs in a fixed order, so results are the same
// bits for any thread count.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <type_traits>
#include <vector>

namespace ad::parallel {

inline int max_threads() {
  unsigned h = std::thread::hardware_concurrency();
  return h ? static_cast<int>(std::min(h, 64u)) : 1;
}

// Runs fn(ctx, w) for w in [0, n) on n threads at once (w = 0 on the
// calling thread) and returns when all are done. The threads come from a
// pool started on first use and kept (no thread start per call); when the
// pool is busy (another thread's team, or a call from inside a task) or too
// small, fresh threads are started for this call instead. Either way the n
// tasks run concurrently, which teams that meet at barriers rely on. fn must
// not throw (team() below catches for it). Throws ad::Error, having run no
// task, when a thread the team needs cannot be started (the process's
// thread limit).
void run_team(int n, void (*fn)(void*, int), void* ctx);

// f(w) for w in [0, n) on n concurrent threads; an exception thrown by f is
// rethrown here (the one from the lowest w when several throw).
template <class F> void team(int n, F&& f) {
  if (n <= 1) {
    f(0);
    return;
  }
  struct Ctx {
    std::remove_reference_t<F>* f;
    std::vector<std::exception_ptr> err;
  } ctx{&f, std::vector<std::exception_ptr>(static_cast<std::size_t>(n))};
  run_team(
      n,
      [](void* c, int w) {
        auto* x = static_cast<Ctx*>(c);
        try {
          (*x->f)(w);
        } catch (...) {
          x->err[static_cast<std::size_t>(w)] = std::current_exception();
        }
      },
      &ctx);
  for (auto& e : ctx.err)
    if (e) std::rethrow_exception(e);
}

// Threads for a loop of n tasks of `work` flops in all: 1 below ~2^17.
inline std::int64_t loop_threads(std::int64_t n, double work) {
  return work < 131072.0 ? 1 : std::min<std::int64_t>(n, max_threads());
}

// Runs f(i) for i in [0, n), splitting [0, n) into contiguous ranges over up
// to max_threads() threads. `work` (about the flops of the whole loop)
// decides whether threads pay: below ~2^17 it runs on the calling thread.
// An exception thrown by f is rethrown on the caller (the one from the
// lowest range when several throw).
template <class F> void parallel_for(std::int64_t n, double work, F&& f) {
  if (n <= 0) return;
  const std::int64_t t = loop_threads(n, work);
  if (t <= 1) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  team(static_cast<int>(t), [&](int w) {
    std::int64_t lo = n * w / t, hi = n * (w + 1) / t;
    for (std::int64_t i = lo; i < hi; ++i) f(i);
  });
}

// Runs f(i) for i in [0, n) as parallel_for, but each thread takes the next
// index when it finishes one (tasks of unequal cost; the order in which
// indices start is i's order).
template <class F> void parallel_for_dynamic(std::int64_t n, double work, F&& f) {
  if (n <= 0) return;
  const std::int64_t t = loop_threads(n, work);
  if (t <= 1) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<std::int64_t> next{0};
  team(static_cast<int>(t), [&](int) {
    for (std::int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i);
  });
}

}  // namespace ad::parallel
