#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ad/graph.hpp"

namespace ad {

// One step of a schedule over a graph's nodes.
//   compute: run the node's kernel (its inputs must hold values);
//   free: drop the node's value;
//   accumulate: add the node's value into sinks[aux].grad().
struct Step {
  enum class Kind : std::uint8_t { compute, free, accumulate };
  Kind kind;
  std::int32_t node;
  std::int32_t aux = -1;
};

// What the executor runs. The executor decides nothing: every compute, free
// and accumulation is listed here, made by a policy's planner.
struct Schedule {
  std::vector<Step> steps;
  std::vector<std::int32_t> targets;  // nodes whose values are kept at the end
  std::vector<Parameter> sinks;       // accumulate targets
  std::int64_t predicted_peak_bytes = 0;
};

// A rematerialisation policy: which values to keep and which to recompute.
struct Policy {
  enum class Kind : std::uint8_t { keep_all };
  Kind kind = Kind::keep_all;
  std::string name() const;
};
namespace policy {
// Keeps every value until its last use, then frees it. No recomputation.
inline Policy keep_all() { return {}; }
}  // namespace policy

// A gradient to accumulate into a parameter once computed.
struct Sink {
  std::int32_t node;
  Parameter param;
};

// Makes the schedule that computes `targets` (and the sinks' nodes, each
// accumulated then freed) under `policy`, with the predicted peak filled in.
Schedule plan(GraphImpl& g, const std::vector<std::int32_t>& targets, const std::vector<Sink>& sinks,
              const Policy& policy);

// Simulates `s` from static sizes: the maximum, over the run, of bytes
// allocated in the graph's allocator above what was live when it started.
// Values already present count with their real storage (shared by views;
// never released while the user holds a copy). Throws ad::Error for a step
// the executor would reject (an input or accumulated node holding no value).
std::int64_t simulate_peak(const GraphImpl& g, const Schedule& s);

// Counters of one executed schedule.
struct RunStats {
  std::int64_t measured_peak_bytes = 0;  // allocator peak minus baseline
  std::int64_t baseline_bytes = 0;       // graph bytes live when the run began
  std::int64_t computed_nodes = 0;
  std::int64_t recomputed_nodes = 0;     // computes of a node already computed once in this graph
  double run_ms = 0;
};

// Runs `s` on the graph's nodes. Throws ad::Error (naming the op and shapes)
// if a kernel rejects its data (e.g. an index out of range), or if a step is
// invalid (an input or accumulated node holding no value, a gradient whose
// shape or dtype differs from its parameter's).
RunStats execute(GraphImpl& g, const Schedule& s);

// What backward() (and eval) report about a step.
struct Report {
  std::string policy;
  std::int64_t predicted_peak_bytes = 0;
  std::int64_t measured_peak_bytes = 0;
  std::int64_t baseline_bytes = 0;
  std::int64_t computed_nodes = 0;
  std::int64_t recomputed_nodes = 0;
  std::int64_t steps = 0;
  double plan_ms = 0;
  double run_ms = 0;
};

}  // namespace ad
