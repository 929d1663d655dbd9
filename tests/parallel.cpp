// The kernel thread pool (src/ops/parallel.*): every task runs once, the
// tasks of a team run concurrently (kernels that meet at barriers rely on
// it), nested and concurrent teams work, exceptions come back to the caller.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ad/error.hpp"
#include "ops/parallel.hpp"

namespace {

// All n tasks arrive before any leaves; false if that takes over 20 s (the
// tasks did not run at once) instead of hanging the test.
bool meet(std::atomic<int>& arrived, int n) {
  arrived.fetch_add(1);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (arrived.load() < n)
    if (std::chrono::steady_clock::now() > end) return false;
  return true;
}

// A team of n that checks concurrency and counts each task.
void check_team(int n) {
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
  std::atomic<int> arrived{0}, met{0};
  ad::parallel::team(n, [&](int w) {
    runs[static_cast<std::size_t>(w)].fetch_add(1);
    met += meet(arrived, n);
  });
  CHECK(met.load() == n);
  for (int w = 0; w < n; ++w) CHECK(runs[static_cast<std::size_t>(w)].load() == 1);
}

}  // namespace

TEST_CASE("parallel: a team's tasks each run once and run at the same time") {
  const int hw = ad::parallel::max_threads();
  for (int n : {2, 3, hw, hw + 2}) {  // beyond the pool's size: threads of its own
    CAPTURE(n);
    check_team(n);
  }
}

TEST_CASE("parallel: many short teams in a row (the pool's hand-off)") {
  std::vector<int> hits(1000, 0);
  for (int rep = 0; rep < 2000; ++rep) {
    const std::int64_t n = 1 + rep % 997;
    ad::parallel::parallel_for(n, 1e9, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)] += 1; });
  }
  long total = 0;
  for (int h : hits) total += h;
  long expect = 0;
  for (int rep = 0; rep < 2000; ++rep) expect += 1 + rep % 997;
  CHECK(total == expect);
  CHECK(hits[0] == 2000);
}

TEST_CASE("parallel: a team started from inside a task, and teams from two threads at once") {
  std::atomic<int> inner_met{0};
  ad::parallel::team(2, [&](int) {
    std::atomic<int> arrived{0};
    std::atomic<int> ok{0};
    ad::parallel::team(2, [&](int) { ok += meet(arrived, 2); });
    inner_met += ok.load() == 2;
  });
  CHECK(inner_met.load() == 2);

  std::atomic<int> done{0};
  auto user = [&] {
    for (int rep = 0; rep < 200; ++rep) {
      std::atomic<int> arrived{0}, ok{0};
      ad::parallel::team(2, [&](int) { ok += meet(arrived, 2); });
      done += ok.load() == 2;
    }
  };
  std::thread a(user), b(user);
  a.join();
  b.join();
  CHECK(done.load() == 400);
}

TEST_CASE("parallel: an exception in a task reaches the caller (the lowest task's)") {
  auto throwing = [](int w) {
    if (w >= 1) throw std::runtime_error("task " + std::to_string(w));
  };
  try {
    ad::parallel::team(3, throwing);
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "task 1");
  }
  check_team(2);  // the pool still works afterwards
  CHECK_THROWS_AS(ad::parallel::parallel_for(100, 1e9, [](std::int64_t i) {
                    if (i == 99) throw std::out_of_range("last");
                  }),
                  std::out_of_range);
}

TEST_CASE("parallel: teams still run in a child process after fork()") {
  check_team(2);  // the pool's workers exist in this process
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // child: no workers; a team must start its own threads
    std::atomic<int> arrived{0}, ok{0};
    ad::parallel::team(2, [&](int) { ok += meet(arrived, 2); });
    std::int64_t sum = 0;
    std::vector<std::int64_t> v(1000, 0);
    ad::parallel::parallel_for(1000, 1e9, [&](std::int64_t i) { v[static_cast<std::size_t>(i)] = i; });
    for (auto x : v) sum += x;
    _exit(ok.load() == 2 && sum == 999 * 1000 / 2 ? 0 : 1);
  }
  int status = -1;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  pid_t r = 0;
  while ((r = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (r == 0) {  // hung: the child waited on workers it does not have
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL("the child process hung in a team");
  }
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  check_team(2);  // and the parent's pool still works
}

TEST_CASE("parallel: a team whose threads cannot all be started throws ad::Error and runs none of its tasks") {
  // Many user threads each running kernels while the pool is busy start
  // teams of their own and can reach the process's thread limit. A failed
  // start was a std::system_error, or std::terminate when some of the team's
  // threads were already running; on the pool's path it also left the pool
  // marked busy for good.
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // child: every team starts its own threads here
    if (getuid() == 0 && setuid(65534) != 0) _exit(10);  // RLIMIT_NPROC does not bind root
    rlimit old{};
    if (getrlimit(RLIMIT_NPROC, &old) != 0) _exit(11);
    int code = 0;
    // the user's tasks (as nobody: this child alone) at most 0, 1, 2: no
    // thread starts, or one does and the next fails
    for (rlim_t limit : {rlim_t{0}, rlim_t{1}, rlim_t{2}}) {
      rlimit r{limit, old.rlim_max};
      if (setrlimit(RLIMIT_NPROC, &r) != 0) _exit(12);
      std::atomic<int> ran{0};
      try {
        ad::parallel::team(4, [&](int) { ran.fetch_add(1); });
        code |= 1;  // no limit in force
      } catch (const ad::Error& e) {
        if (std::string(e.what()).find("thread limit") == std::string::npos) code |= 2;
      } catch (...) {
        code |= 4;  // not an ad::Error
      }
      if (ran.load() != 0) code |= 8;  // a task ran in a team that failed to start
    }
    if (setrlimit(RLIMIT_NPROC, &old) != 0) _exit(13);
    std::atomic<int> ran{0};
    ad::parallel::team(4, [&](int) { ran.fetch_add(1); });  // and teams run again once threads can start
    _exit(ran.load() == 4 ? code : code | 16);
  }
  int status = -1;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  pid_t r = 0;
  while ((r = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (r == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL("the child process hung in a team that could not start");
  }
  REQUIRE_MESSAGE(WIFEXITED(status), "the child ended by signal ", WTERMSIG(status));
  if (WEXITSTATUS(status) == 10) {
    MESSAGE("not checked: this root process cannot become nobody (RLIMIT_NPROC does not bind root)");
    return;
  }
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("parallel: parallel_for_dynamic runs every index once, in threads or alone, and rethrows") {
  for (double work : {1.0, 1e9}) {  // below the threshold: on the caller alone
    for (std::int64_t n : {1, 2, 7, 1000}) {
      CAPTURE(work);
      CAPTURE(n);
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::atomic<int> other_thread{0};
      const auto caller = std::this_thread::get_id();
      ad::parallel::parallel_for_dynamic(n, work, [&](std::int64_t i) {
        hits[static_cast<std::size_t>(i)].fetch_add(1);
        if (std::this_thread::get_id() != caller) other_thread.fetch_add(1);
        if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // unequal tasks
      });
      for (auto& h : hits) CHECK(h.load() == 1);
      if (work < 2.0) CHECK(other_thread.load() == 0);
    }
  }
  CHECK_THROWS_AS(ad::parallel::parallel_for_dynamic(100, 1e9,
                                                     [](std::int64_t i) {
                                                       if (i == 57) throw std::runtime_error("task 57");
                                                     }),
                  std::runtime_error);
}
