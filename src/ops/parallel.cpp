// The worker pool behind parallel::run_team (see parallel.hpp).
//
// One team runs at a time. The caller publishes (fn, ctx, n) under a mutex,
// bumps a generation counter and wakes the workers; worker k < n runs task
// k, the caller runs task 0, and the last to finish wakes the caller.
// Workers spin briefly on the generation before they sleep, so a kernel
// that launches many short teams back to back (one per group of rows, say)
// does not pay a wake-up for each. A call that finds the pool busy or too
// small starts its own threads, as every call did before the pool. A child
// process made by fork() has none of its parent's workers: there the pool
// is never used, and every team starts its own threads. A thread that cannot
// be started (the process's thread limit) is an ad::Error, before any task
// of the team has run.
#include "ops/parallel.hpp"

#include <fmt/format.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "ad/error.hpp"

namespace ad::parallel {

namespace {

thread_local bool t_in_pool_task = false;
std::atomic<bool> g_forked{false};  // set in a child of fork(): the pool's workers are not there

// `started` of the n - 1 threads a team of n needs besides its caller were running.
[[noreturn]] void cannot_start(int started, int n, const std::system_error& e) {
  throw Error(fmt::format("kernel threads: could not start a thread for a team of {} ({} of {} started: {}); the "
                          "process's thread limit (ulimit -u, a container's pids limit) is reached",
                          n, started, n - 1, e.what()));
}

// Every thread is started before any task runs: tasks may wait for each
// other (barriers), so a team that cannot start all its threads runs none
// of its tasks and throws ad::Error (a thread left running while the vector
// of threads unwound ended the process in std::terminate).
void spawn_team(int n, void (*fn)(void*, int), void* ctx) {
  std::atomic<int> gate{0};  // 0: wait, 1: run, -1: give up
  std::vector<std::thread> th;
  th.reserve(static_cast<std::size_t>(n - 1));
  try {
    for (int w = 1; w < n; ++w) th.emplace_back([=, &gate] {
      gate.wait(0, std::memory_order_acquire);
      if (gate.load(std::memory_order_acquire) < 0) return;
      t_in_pool_task = true;
      fn(ctx, w);
    });
  } catch (const std::system_error& e) {
    gate.store(-1, std::memory_order_release);
    gate.notify_all();
    for (auto& x : th) x.join();
    cannot_start(static_cast<int>(th.size()), n, e);
  }
  gate.store(1, std::memory_order_release);
  gate.notify_all();
  fn(ctx, 0);
  for (auto& x : th) x.join();
}

void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

class Pool {
 public:
  Pool() { pthread_atfork(nullptr, nullptr, [] { g_forked.store(true); }); }
  ~Pool() {
    if (g_forked.load()) {  // the workers' threads are the parent's: nothing to stop or join
      new std::vector<std::thread>(std::move(workers_));  // left alone (joinable threads may not be destroyed)
      return;
    }
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void run(int n, void (*fn)(void*, int), void* ctx) {
    bool expected = false;
    if (t_in_pool_task || g_forked.load(std::memory_order_relaxed) || n - 1 > max_workers() ||
        !busy_.compare_exchange_strong(expected, true)) {
      spawn_team(n, fn, ctx);
      return;
    }
    {
      std::unique_lock<std::mutex> lk(m_);
      try {
        while (static_cast<int>(workers_.size()) < n - 1) {
          const int id = static_cast<int>(workers_.size()) + 1;
          workers_.emplace_back([this, id] { loop(id); });
        }
      } catch (const std::system_error& e) {  // the workers started so far stay, idle
        const int started = static_cast<int>(workers_.size());
        lk.unlock();
        busy_.store(false, std::memory_order_release);  // (left set, every later team started its own threads)
        cannot_start(started, n, e);
      }
      fn_ = fn;
      ctx_ = ctx;
      n_ = n;
      left_.store(n - 1, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    t_in_pool_task = true;  // a team started from task 0 gets its own threads
    fn(ctx, 0);
    t_in_pool_task = false;
    for (int i = 0; i < kSpins && left_.load(std::memory_order_acquire) > 0; ++i) relax();
    if (left_.load(std::memory_order_acquire) > 0) {
      std::unique_lock<std::mutex> lk(m_);
      done_.wait(lk, [&] { return left_.load(std::memory_order_acquire) == 0; });
    }
    busy_.store(false, std::memory_order_release);
  }

 private:
  static constexpr int kSpins = 1 << 12;  // some 10-200 us of pause instructions, by CPU
  static int max_workers() { return max_threads() - 1; }

  void loop(int id) {
    t_in_pool_task = true;
    std::uint64_t seen = 0;
    for (;;) {
      std::uint64_t g = gen_.load(std::memory_order_acquire);
      for (int i = 0; i < kSpins && g == seen; ++i) {
        relax();
        g = gen_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(m_);
        wake_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
      }
      void (*fn)(void*, int);
      void* ctx;
      int n;
      {
        std::lock_guard<std::mutex> lk(m_);
        if (stop_) return;
        seen = gen_.load(std::memory_order_acquire);
        fn = fn_;
        ctx = ctx_;
        n = n_;
      }
      if (id >= n) continue;
      fn(ctx, id);
      if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(m_);  // the caller checks left_ under m_ before it sleeps
        done_.notify_one();
      }
    }
  }

  std::atomic<bool> busy_{false};
  std::mutex m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  std::atomic<std::uint64_t> gen_{0};
  std::atomic<int> left_{0};
  void (*fn_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
  int n_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void run_team(int n, void (*fn)(void*, int), void* ctx) {
  if (n <= 1) {
    fn(ctx, 0);
    return;
  }
  pool().run(n, fn, ctx);
}

}  // namespace ad::parallel
