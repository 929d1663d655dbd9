#pragma once
// Binomial checkpointing numbers (Griewank and Walther): T(l, s), the least
// number of forward steps (not counting the fused last step of each
// reversal) to reverse a chain of l steps with s snapshots.
#include <cstdint>

namespace ad::revolve {

// By the recursion T(l, s) = min_{0<j<l} { j + T(l-j, s-1) + T(j, s) },
// T(1, s) = 0, T(l, 1) = l(l-1)/2. O(l^2 s): for tests and small l.
std::int64_t steps_recursive(std::int64_t l, std::int64_t s);
// By the closed form r*l - C(s+r, s+1), r least with C(s+r, s) >= l.
std::int64_t steps(std::int64_t l, std::int64_t s);
// The split j (0 < j < l) that attains T(l, s), for s >= 2 and l >= 2.
std::int64_t best_split(std::int64_t l, std::int64_t s);

}  // namespace ad::revolve
