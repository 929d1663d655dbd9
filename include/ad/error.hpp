#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ad {

// Every misuse of the library (bad shapes, dtypes, axes, missing values, ...)
// is reported by throwing ad::Error. The message names the op and the shapes
// involved, e.g. "matmul: inner dims differ (64 of a vs 65 of b): a f32[32,64] vs b f32[65,10]".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown when policy::budget finds no schedule whose peak fits the budget.
// Every budget >= least_peak plans. `proven`: no schedule at all has a
// lower peak (least_peak is the step's minimum); else a schedule with a
// lower peak may exist that the planner did not find (see docs/design.md,
// "budget(bytes)").
class BudgetError : public Error {
 public:
  BudgetError(const std::string& what, std::int64_t budget_bytes, std::int64_t least, std::int64_t largest_step,
              bool is_proven)
      : Error(what), budget(budget_bytes), least_peak(least), largest_step_bytes(largest_step), proven(is_proven) {}
  std::int64_t budget;              // the budget asked for
  std::int64_t least_peak;          // the least peak of any schedule the planner finds
  std::int64_t largest_step_bytes;  // what the step's largest single compute needs live (inputs, output, workspace;
                                    // at most least_peak: an op that writes over its input can need less)
  bool proven;
};

}  // namespace ad
