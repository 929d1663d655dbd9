#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ad/graph.hpp"
#include "ad/policy.hpp"

namespace ad {

// One step of a schedule over a graph's nodes.
//   compute: run the node's kernel (its inputs must hold values); with aux =
//     k >= 0 the node is sinks[k]'s gradient and is written straight into
//     that parameter's gradient buffer, which holds zeros or does not exist
//     yet (no graph bytes; the accumulate step that follows adds nothing);
//   free: drop the node's value;
//   accumulate: add the node's value into sinks[aux].grad();
//   compress: store the node's value as DType(aux) (f16/bf16), freeing the original;
//   decompress: restore the value to the node's own dtype.
//   offload: copy the node's value to host memory (pinned, on the executor's
//     copy stream, for a value on a GPU) and drop it from the graph's memory;
//   prefetch: bring an offloaded value back into the graph's memory. Nothing
//     may read the value between its offload and its prefetch.
//   A compute step with reuse = u >= 0 writes the node's value over input
//   u's buffer (u's value dies here: the schedule's next step about u frees
//   it), allocating nothing. u must be an input the node's kernel may
//   overwrite (OpDef::overwrites), not a leaf, with the node's shape, dtype
//   and device, and the step no view and no gradient written into a
//   parameter's buffer; when something else holds u's buffer (a Tensor kept
//   outside the graph, a view's value) the step allocates instead, in
//   execute and simulate_peak alike. A free, offload, prefetch, compress or
//   decompress of a leaf (an input or a parameter: its value is the caller's
//   tensor), a reuse that breaks these rules, a compress to a dtype that is
//   not floating, and a compute or accumulate naming a sink that is not
//   there or whose parameter has another shape, dtype or device are
//   ad::Errors from both (and from explain and to_dot), before any step runs.
//   Reading, accumulating or offloading a value while it is stored
//   compressed is an ad::Error from both.
struct Step {
  enum class Kind : std::uint8_t { compute, free, accumulate, compress, decompress, offload, prefetch };
  Kind kind;
  std::int32_t node;
  std::int32_t aux = -1;
  std::int32_t reuse = -1;
};

// What the executor runs. The executor decides nothing: every compute, free
// and accumulation is listed here, made by a policy's planner.
struct Schedule {
  std::vector<Step> steps;
  std::vector<std::int32_t> targets;  // nodes whose values are kept at the end
  // Forward nodes are ids <= boundary: the largest of plan()'s `targets`
  // (the loss); its `outputs` (gradients backward_wrt returns) come after.
  // -1 (a schedule made by hand): the largest target.
  std::int32_t boundary = -1;
  std::vector<Parameter> sinks;       // accumulate targets
  std::int64_t predicted_peak_bytes = 0;
  std::int64_t recomputed_nodes = 0;  // compute steps of nodes already computed earlier in the schedule
  double recompute_flops = 0;         // their cost by the op cost model
  std::int64_t kept_bytes = 0;        // forward values held when the loss was first computed
  std::int64_t budget_bytes = 0;      // > 0: the executor never lets the step exceed this (policy::budget)
  std::int64_t offload_peak_bytes = 0;  // most bytes held offloaded in host memory at once
  std::string policy;                 // name of the policy that made it
  // budget: no schedule whose peak fits the budget recomputes fewer flops
  // (proven by the policy's exact search, on small problems)
  bool proven_cheapest = false;
  double plan_ms = 0;
  bool from_cache = false;
};

// A gradient to accumulate into a parameter once computed.
struct Sink {
  std::int32_t node;
  Parameter param;
};

// Makes the schedule that computes `targets` (and the sinks' nodes, each
// accumulated then freed) under `policy`, with the predicted peak filled in.
// `outputs`: nodes of the backward pass (gradients) also kept at the end;
// the forward pass ends at the largest target.
Schedule plan(GraphImpl& g, const std::vector<std::int32_t>& targets, const std::vector<Sink>& sinks,
              const Policy& policy, const std::vector<std::int32_t>& outputs = {});
// The last forward node of `s` (Schedule::boundary, or the largest target).
std::int32_t forward_boundary(const Schedule& s);

// Simulates `s` from static sizes: the maximum, over the run, of bytes
// allocated in the graph's allocator above what was live when it started.
// Values already present count with their real storage (shared by views;
// never released while the user holds a copy). A gradient written into its
// parameter's buffer costs no graph bytes only while that buffer is absent or
// zeroed when the step comes, as execute decides: Schedule::predicted_peak_bytes
// holds for the gradients as they were at planning, and simulate_peak called
// later (the parameters got gradients since) gives the peak a run would have
// then. Throws ad::Error for a step the executor would reject (an input or
// accumulated node holding no value), and for a peak beyond 2^63 bytes.
std::int64_t simulate_peak(const GraphImpl& g, const Schedule& s);

// Counters of one executed schedule.
struct RunStats {
  std::int64_t measured_peak_bytes = 0;  // allocator peak minus baseline
  std::int64_t baseline_bytes = 0;       // graph bytes live when the run began
  std::int64_t computed_nodes = 0;
  std::int64_t recomputed_nodes = 0;     // computes of a node already computed earlier in this run
  std::int64_t evictions = 0;            // values the budget guard had to evict (0 when the plan was right)
  std::int64_t offload_peak_bytes = 0;   // most bytes held offloaded in host memory at once
  double run_ms = 0;
};

// Runs `s` on the graph's nodes. Throws ad::Error (naming the op and shapes)
// if a kernel rejects its data (e.g. an index out of range), or if a step is
// invalid (an input or accumulated node holding no value, a gradient whose
// shape or dtype differs from its parameter's).
RunStats execute(GraphImpl& g, const Schedule& s);

// A schedule together with the graph it was made for. A plan does not keep
// its graph alive (a Report of the last step would otherwise hold every
// value that step kept); `graph_alive` expires with the graph, and explain()
// and to_dot() throw ad::Error for a plan whose graph is gone.
struct Plan {
  GraphImpl* graph = nullptr;
  Schedule schedule;
  std::weak_ptr<const void> graph_alive;
};

// Per node of the plan's graph that the schedule computes: what happens to
// its value and why, one line each (a markdown table). Call it while the
// plan's ad::Graph exists (ad::Error afterwards).
std::string explain(const Plan& plan);

// Graphviz DOT of the nodes a plan computes (and the leaves they read): each
// node's op, value (dtype and shape), bytes, and its fate under the plan —
// kept (green), deleted and recomputed (salmon), gradient freed after use
// (blue, dashed), leaves (grey / gold for parameters). `dot -Tsvg` draws it.
// Throws ad::Error for an empty plan, a plan made for another graph or one
// whose graph has been destroyed.
std::string to_dot(const Plan& plan);
std::string to_dot(const Graph& graph, const Plan& plan);
// Every node of a graph, without a plan.
std::string to_dot(const Graph& graph);

// What backward() reports about a step.
struct Report {
  std::string policy;
  std::int64_t predicted_peak_bytes = 0;  // simulated before the run
  std::int64_t measured_peak_bytes = 0;   // by the graph's allocator during the run
  std::int64_t baseline_bytes = 0;        // graph bytes live when the run began
  std::int64_t kept_bytes = 0;            // forward values held when the loss was first computed
  std::int64_t computed_nodes = 0;
  std::int64_t recomputed_nodes = 0;
  double recompute_flops = 0;             // extra flops spent recomputing (cost model)
  std::int64_t evictions = 0;             // values the executor's budget guard evicted (0 when the plan is exact)
  std::int64_t offload_peak_bytes = 0;    // most bytes the step held offloaded in host memory at once
  std::int64_t steps = 0;
  bool proven_cheapest = false;           // Schedule::proven_cheapest
  bool plan_cached = false;               // the plan came from the policy's cache
  double plan_ms = 0;
  double run_ms = 0;
  std::shared_ptr<const Plan> plan;       // for explain(*report.plan)
  std::vector<Tensor> grads;              // backward_wrt: d(loss)/d(wrt[i]), in wrt's order
  std::vector<Tensor> values;             // backward_keep: the forward pass's values of keep, in keep's order
};

}  // namespace ad
