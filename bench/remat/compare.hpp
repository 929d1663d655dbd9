#pragma once
// The budget policy against the exact oracle over budget sweeps on small
// graphs (random DAGs, VGG-, ResNet- and U-Net-like).
#include <cstdint>
#include <string>
#include <vector>

namespace remat_bench {

struct OracleCase {
  std::string family, graph;
  int values = 0;                  // values to compute in the joint graph
  std::int64_t budget = 0, min_peak = 0, top = 0;  // oracle's least peak, keep_all's peak
  bool min_peak_exact = true;      // false: min_peak is a feasible upper bound (the bisection hit the cap)
  enum class Status { optimal, infeasible, gave_up } oracle = Status::gave_up;
  double oracle_rc = 0, policy_rc = 0;  // recompute flops
  double base = 0;                 // flops of computing each value once
  bool policy_feasible = false;
  std::int64_t oracle_peak = 0, policy_peak = 0;
  std::size_t states = 0;          // states the oracle expanded
  double oracle_ms = 0;
  double policy_ms = -1;           // the policy's planning time (the first budget of a graph plans from scratch)
  bool first = false;              // the first budget planned for this graph
  bool policy_proven = false;      // the policy's plan is proven cheapest (Schedule::proven_cheapest)
  std::string note;                // anomalies (a check that failed)
};

struct OracleGraphNote {
  std::string family, graph, note;  // graphs left out, and why
};

// Runs the sweep: for each graph, the oracle's least peak, one budget just
// below it (both must be infeasible) and `budgets` budgets from it up to
// keep_all's peak. quick: fewer graphs.
std::vector<OracleCase> oracle_compare(int budgets, bool quick, std::size_t max_states,
                                       std::vector<OracleGraphNote>* skipped);

}  // namespace remat_bench
