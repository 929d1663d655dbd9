#pragma once
// Internal: what every planner shares. A planner sees the graph only through
// node structure, metas and OpDef fields (view, flops, workspace, saves) —
// never an op by name.
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "core/graph_impl.hpp"

namespace ad::planner {

// The problem: compute `targets` and the sinks' nodes (accumulating each into
// its parameter) from the values present now.
// Per sink: 1 when its gradient can be computed straight into the
// parameter's gradient buffer (ParamState::grad_writable, the parameter and
// the node appear once among the sinks, the node is not a view and holds no
// value, and no value of the graph shares the buffer). Such a compute step
// allocates nothing in the graph, so its node costs 0 bytes here.
std::vector<char> writable_sinks(const GraphImpl& g, const std::vector<Sink>& sinks);

struct Problem {
  const GraphImpl& g;
  std::vector<std::int32_t> targets;
  std::vector<Sink> sinks;
  std::int32_t hi = -1;        // largest node id involved
  // forward nodes are ids <= boundary, the largest of the constructor's
  // targets (the loss); its outputs (gradients backward_wrt returns) are
  // appended to `targets`: computed with the backward nodes, held like the loss
  std::int32_t boundary = -1;
  std::vector<char> needed;    // computed at least once by any schedule (no value now)
  std::vector<char> pinned;    // never freed: leaves, values present before the run, targets
  std::vector<std::vector<std::int32_t>> consumers;  // needed consumers, ascending ids
  std::vector<std::int64_t> bytes;  // bytes a compute allocates (0 for views)
  std::vector<std::int64_t> ws;     // workspace bytes during the kernel
  std::vector<double> flops;
  std::vector<std::int32_t> forward;  // needed nodes with id <= boundary, ascending
  std::vector<std::int32_t> order;    // all needed nodes, ascending (the demand order)
  // Sink index whose parameter gradient a node's first compute writes in
  // place (-1: none); such nodes have bytes 0. Sinks with consumers among
  // the needed nodes, and targets, are never written in place.
  std::vector<std::int32_t> in_place;

  Problem(const GraphImpl& g, const std::vector<std::int32_t>& targets, const std::vector<Sink>& sinks,
          const std::vector<std::int32_t>& outputs = {});
  bool is_target(std::int32_t id) const;
  bool is_sink(std::int32_t id) const { return sink_mask[static_cast<std::size_t>(id)] != 0; }
  // Bytes the largest single step needs live at once: its inputs computed by
  // the graph, its output and its workspace. No schedule can do with less.
  std::int64_t lower_bound() const;

  std::vector<char> target_mask, sink_mask;
  std::vector<std::vector<std::int32_t>> sinks_at;  // per node: indices of the sinks it feeds
};

// Builds schedules step by step while tracking which values are present, and
// counts recomputations. Planners drive it.
class Builder {
 public:
  explicit Builder(const Problem& p);
  bool present(std::int32_t id) const { return present_[static_cast<std::size_t>(id)] != 0; }
  void compute(std::int32_t id);   // inputs must be present
  void free(std::int32_t id);      // no-op for pinned values
  void accumulate_sinks(std::int32_t id);
  void compress(std::int32_t id, DType storage);
  bool compressed(std::int32_t id) const { return stored_[static_cast<std::size_t>(id)] == kCompressed; }
  void offload(std::int32_t id);  // to host memory until ensure() prefetches it
  bool offloaded(std::int32_t id) const { return stored_[static_cast<std::size_t>(id)] == kOffloaded; }
  // Computes id and, recursively, any absent input (recomputing from the
  // nearest present values). Appends every node computed to `touched`, and
  // calls `computed(node)` right after each compute (so a planner can free
  // values a recomputation no longer needs before the next one runs).
  void ensure(std::int32_t id, std::vector<std::int32_t>* touched = nullptr,
              const std::function<void(std::int32_t)>& computed = {});
  // First needed consumer of id with id > after, or -1.
  std::int32_t next_use(std::int32_t id, std::int32_t after);
  Schedule finish();
  // The schedule so far recomputes more flops than cost_cap: a planner
  // building a candidate for budget() may stop there (it cannot be the plan).
  bool over_cap() const { return s.recompute_flops > cost_cap; }

  const Problem& p;
  Schedule s;
  double cost_cap = std::numeric_limits<double>::infinity();

 private:
  enum : char { kHere = 0, kCompressed, kOffloaded };  // how a present value is stored
  std::vector<char> present_, computed_, stored_;
  std::vector<std::size_t> cursor_;
};

// Schedule keeping `keep` (forward nodes; others are freed once the forward
// pass no longer needs them and recomputed on demand in backward, where
// recomputed values stay until their last use).
// With `compress` f16/bf16, kept values are stored compressed between the
// forward pass and their first use in backward; with `offload`, they are
// offloaded to host memory in between instead.
Schedule keep_set(const Problem& p, const std::vector<char>& keep, DType compress = DType::f32, bool offload = false);
// keep_set (uncompressed, nothing offloaded) as a candidate of budget():
// nullopt as soon as it recomputes more than cost_cap flops.
std::optional<Schedule> keep_set_under(const Problem& p, const std::vector<char>& keep, double cost_cap);
// Bytes of the kept values backward reads, all held at once when keep_set's
// forward pass ends: a lower bound of its schedule's peak (with or without
// reuse_dying_inputs, which never merges two values that are both held).
std::int64_t keep_set_held_bytes(const Problem& p, const std::vector<char>& keep);
// sqrt_n's keep set, and budget's candidates: in each whole window of k of
// the values fs (graph order), the boundary where the fewest bytes cross (the
// latest among equals), and every value crossing a chosen boundary kept.
std::vector<char> boundary_keep(const Problem& p, const std::vector<std::int32_t>& fs, std::int64_t k);
// manual()'s keep set: the forward values marked with ad::checkpoint (a
// marked view keeps the value it views); empty when nothing is marked.
std::vector<char> marked_keep(const Problem& p);

// Moves each prefetch step before the compute step that precedes it, so the
// copy overlaps with that compute (the value then occupies the graph's
// memory one step earlier; plan() simulates the result).
void hoist_prefetches(const Problem& p, Schedule& s);
// Most bytes held offloaded at once under `s`.
std::int64_t offload_peak(const Problem& p, const Schedule& s);

// Marks compute steps whose output can take over a dying input's buffer
// (OpDef::overwrites; the schedule's next step about that input frees it;
// CPU only; never a leaf, target, sink, view or a value some view shares).
// Lowers the peak or leaves it; never raises it. Idempotent.
void reuse_dying_inputs(const Problem& p, Schedule& s);

// What budget() skipped as unable to be the plan (see budget.cpp); `on` =
// false builds and simulates every candidate (tests: the plan is the same).
struct Pruning {
  bool on = true;
  int stopped = 0;      // candidates whose builder stopped at the cost cap
  int unsimulated = 0;  // finished candidates over the cap, not simulated
  int held_over = 0;    // keep sets whose held bytes exceed the budget, not built
  int reruns = 0;       // DTR runs stopped at the cap and run again in full
};
// reuse: candidates' peaks count reuse_dying_inputs (as plan() applies it)
Schedule budget(const Problem& p, std::int64_t bytes, bool reuse = true, Pruning* pruning = nullptr);

// A candidate of budget()'s fixed list: its recompute flops and its peak.
struct FixedPoint {
  double cost;
  std::int64_t peak;
};
// The exact tier's reach: values to compute (joint graph nodes without a
// value); states it may expand per plan in min-cost searches, and per
// min-cost search; per plan in the feasibility searches below every fixed
// candidate, and per depth-first or least-peak search there (about 1-5 us
// and ~100-150 bytes each while a search runs: a plan spends at most about
// 4 s and 45 MB there, once per problem, as sweeps and plans are cached).
inline constexpr int kExactValues = 40;
inline constexpr std::size_t kExactStates = 200000, kExactStatesPerSearch = 50000, kExactStatesLow = 600000,
                             kExactStatesDeep = 300000;
// budget()'s exact tier (exact.cpp): on problems of at most kExactValues
// values to compute, the (recompute flops, peak) Pareto frontier swept
// down from `top` (keep_all's peak) by exact searches, each pruned by the
// cheapest fixed candidate that fits its level. Depends on the problem and
// `fixed` only; `bytes` (the budget) only ends the sweep early where the rest
// of it could not change the plan. Empty on other problems.
struct Frontier {
  std::vector<Schedule> schedules;  // the points found (fixed candidates are not repeated)
  double proven_cost = -1;          // >= 0: no schedule within `bytes` recomputes less
  // the sweep ran to its end and proved its last point's peak the least of
  // any schedule (in the search's model: without buffer reuse)
  bool least_proven = false;
  std::int64_t least = -1;
};
Frontier exact_frontier(const Problem& p, const std::vector<FixedPoint>& fixed, std::int64_t top, std::int64_t bytes,
                        bool reuse);
// Forgets the sweeps exact_frontier keeps between plans (tests: a plan must
// not depend on which budgets were planned before it).
void clear_exact_sweeps();
// Revolve on a chain; `grouped`: a step is a run of forward nodes ending at
// one a gradient node reads (see chain.cpp), else one node per step.
Schedule optimal_chain(const Problem& p, std::int32_t slots, bool grouped = false);
// optimal_chain as a candidate of budget(): nullopt as soon as it
// recomputes more than cost_cap flops (throws as optimal_chain does).
std::optional<Schedule> optimal_chain_under(const Problem& p, std::int32_t slots, bool grouped, double cost_cap);

}  // namespace ad::planner
