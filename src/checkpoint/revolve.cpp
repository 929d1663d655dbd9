#include "checkpoint/revolve.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

namespace ad::revolve {

namespace {
// C(n, k), saturating at int64 max
std::int64_t binom(std::int64_t n, std::int64_t k) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t c = 1;  // C(n-k+i, i) after step i: exact, since i divides c * (n-k+i)
  for (std::int64_t i = 1; i <= k; ++i) {
    std::int64_t g = std::gcd(c, i), num = c / g, den = i / g;  // den divides (n-k+i)
    std::int64_t prod;
    if (__builtin_mul_overflow(num, (n - k + i) / den, &prod)) return kMax;
    c = prod;
  }
  return c;
}
}  // namespace

std::int64_t steps(std::int64_t l, std::int64_t s) {
  if (l <= 1) return 0;
  if (s <= 1) return l * (l - 1) / 2;
  std::int64_t r = 0;
  while (binom(s + r, s) < l) ++r;
  return r * l - binom(s + r, s + 1);
}

std::int64_t steps_recursive(std::int64_t l, std::int64_t s) {
  // table t[s][l]
  std::vector<std::vector<std::int64_t>> t(static_cast<std::size_t>(s + 1), std::vector<std::int64_t>(static_cast<std::size_t>(l + 1), 0));
  for (std::int64_t q = 1; q <= s; ++q)
    for (std::int64_t m = 1; m <= l; ++m) {
      auto& v = t[static_cast<std::size_t>(q)][static_cast<std::size_t>(m)];
      if (m == 1) { v = 0; continue; }
      if (q == 1) { v = m * (m - 1) / 2; continue; }
      v = std::numeric_limits<std::int64_t>::max();
      for (std::int64_t j = 1; j < m; ++j)
        v = std::min(v, j + t[static_cast<std::size_t>(q - 1)][static_cast<std::size_t>(m - j)] +
                            t[static_cast<std::size_t>(q)][static_cast<std::size_t>(j)]);
    }
  return t[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)];
}

std::int64_t best_split(std::int64_t l, std::int64_t s) {
  // f(j) = j + T(l-j, s-1) + T(j, s) is convex in j: T(., s) is convex (its
  // slope is the repetition number r, which never falls as l grows), and so
  // is T(l-j, s-1) as a function of j. The first minimiser is therefore the
  // first j whose forward difference f(j+1) - f(j) is >= 0: a bisection,
  // O(log l) evaluations instead of l.
  auto f = [&](std::int64_t j) { return j + steps(l - j, s - 1) + steps(j, s); };
  std::int64_t lo = 1, hi = l - 1;  // the answer is in [lo, hi]
  while (lo < hi) {
    std::int64_t mid = lo + (hi - lo) / 2;
    if (f(mid + 1) - f(mid) >= 0) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

}  // namespace ad::revolve
