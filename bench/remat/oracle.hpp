#pragma once
// Exact rematerialisation oracle for small joint (forward + backward) graphs:
// the cheapest schedule, by the planner's own cost model (recompute flops),
// whose simulated peak fits a budget — or the least peak any schedule has.
//
// The space searched. A schedule is any sequence of steps
//   compute(v)  (every input of v present; peak there = live bytes + bytes(v)
//                + workspace(v), exactly as ad::simulate_peak counts it),
//   free(v)     (v not a target),
// after which every target is present and every sink (a parameter gradient)
// has been computed at least once (it is accumulated right after). Values
// may be computed any number of times, forward and gradient values alike, in
// any order: this is the executor's whole schedule space (Checkmate's R/S
// matrices without its frontier-advancing stage restriction), so the optimum
// below is a lower bound for every policy.
//
// The search: A* over states (set of present values, set of sinks done),
// cost = flops of every compute, heuristic = flops of the absent values that
// must still be computed (the required ones and, transitively, their absent
// inputs) — admissible and consistent. Three reductions, each sound (an
// optimal schedule exists that obeys them):
//  1. frees happen only under memory pressure, right before a compute that
//     would not fit otherwise, and free an inclusion-minimal set of values
//     that makes it fit (postponing a free never invalidates a compute, and
//     while the memory allows it never breaks the budget; a value freed
//     without need can be freed later instead). An equivalent form frees
//     right after the last read (moving a free earlier never raises memory);
//     both are implemented and agree on every budget (AD_ORACLE_CHECK=1), the
//     lazy one explores 2-4x fewer states;
//  2. a value that is no ancestor of anything still required is freed at
//     once (it can never be read again);
//  3. only ancestors of still-required values are computed.
// The minimum peak is found by bisection on the budget with feasibility
// searches over the same space. Exponential: for graphs of up to ~40 joint nodes
// (about 8-12 forward ops); larger searches give up at a state cap.
#include <cstdint>
#include <string>

#include <ad/ad.hpp>

namespace ad::planner { struct Problem; }

namespace remat_bench {

struct OracleResult {
  enum class Status { optimal, infeasible, gave_up } status = Status::gave_up;
  double recompute_flops = 0;  // extra flops over computing every node once
  double total_flops = 0;      // flops of all computes
  std::int64_t peak = 0;       // simulated peak of the schedule found
  std::size_t states = 0;      // states expanded
  ad::Schedule schedule;       // the schedule found (checked with ad::simulate_peak)
};

class Oracle {
 public:
  // Throws ad::Error if the problem has more than 64 values to compute, or
  // view ops (their shared storage is outside this model).
  explicit Oracle(const ad::planner::Problem& p);
  ~Oracle();
  Oracle(const Oracle&) = delete;
  Oracle& operator=(const Oracle&) = delete;
  // The cheapest schedule whose peak is <= budget.
  OracleResult min_cost(std::int64_t budget, std::size_t max_states, bool lazy = true) const;
  // Some schedule whose peak is <= budget (not the cheapest), or infeasible.
  OracleResult feasible(std::int64_t budget, std::size_t max_states) const;
  // A schedule with the least peak (min_cost at that peak gives the cheapest);
  // feasible_hint: a budget known to be feasible (keep_all's peak). Status
  // gave_up with a schedule: its peak is feasible but not proven least (a
  // probe below it hit the state cap).
  OracleResult min_peak(std::size_t max_states, std::int64_t feasible_hint) const;
  // The same by one search with the bottleneck as the cost (a cross-check).
  OracleResult min_peak_bottleneck(std::size_t max_states) const;
  int values() const;           // values to compute (joint graph nodes that are not leaves)
  double base_flops() const;    // flops of computing each value once

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace remat_bench
