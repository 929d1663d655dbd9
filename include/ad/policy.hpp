#pragma once
// Rematerialisation policies: which values a step keeps, which it frees and
// recomputes when needed. A Policy is cheap to copy; copies share one plan
// cache, so create the policy once and pass it to every step of a loop.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ad/graph.hpp"

namespace ad {

// What a selective predicate sees of a forward node.
struct NodeInfo {
  std::int32_t id;
  OpId op;
  std::int64_t bytes;  // size of its value
  double flops;        // cost of recomputing it (the op's cost model)
  bool checkpoint;     // marked with ad::checkpoint()
};
using KeepFn = std::function<bool(const NodeInfo&)>;

class PlanCache;

struct Policy {
  enum class Kind : std::uint8_t { keep_all, manual, uniform, sqrt_n, selective, budget, optimal_chain };
  Kind kind = Kind::keep_all;
  std::int64_t every = 0;         // uniform: keep every k-th forward node
  std::int64_t budget_bytes = 0;  // budget: peak bytes never exceeded
  std::int32_t slots = 0;         // optimal_chain: snapshots, counting the input's
  KeepFn keep;                    // selective: true = keep the value
  // Activation compression (lossy): kept forward values are stored as this
  // dtype (f16 or bf16) between the forward pass and their use in backward,
  // and restored to their own dtype when used. f32 = off. Applies to the
  // keep-set policies (keep_all, manual, uniform, sqrt_n, selective). The
  // gradient error depends on the model: a backward that amplifies the
  // rounding (1 - y^2 of a saturated tanh) can lose small gradients entirely.
  DType compress = DType::f32;
  // Host offload: kept forward values move to host memory between the
  // forward pass and their use in backward (Step offload / prefetch), so the
  // graph's (the device's) memory holds only what is computed or read at
  // the moment. On a GPU the copies run on the executor's copy stream into
  // pinned buffers, each prefetch queued one compute step before its first
  // reader so it overlaps with that step. Keep-set policies only; not with
  // compression. Exact (bit-identical gradients).
  bool offload = false;
  // Elementwise ops write over an input whose value dies there instead of
  // allocating (CPU). Lowers the peak, never raises it; off only to compare
  // with planners that do not model it (bench/remat's exact oracle).
  bool reuse_buffers = true;
  std::shared_ptr<PlanCache> cache;  // plans reused for graphs of the same structure
  std::string name() const;
  // This policy with activation compression to `storage` (f16 or bf16).
  // Throws ad::Error for another dtype, a budget or optimal_chain policy, or
  // one with offload.
  Policy compressed(DType storage) const;
  // This policy with host offload of its kept values (see `offload`).
  // Throws ad::Error for a budget or optimal_chain policy, or one with
  // compression.
  Policy offloaded() const;
};

namespace policy {
// Keeps every value until its last use, then frees it. No recomputation.
Policy keep_all();
// Keeps only nodes marked with ad::checkpoint() (and leaves; a marked view,
// such as attention's output, keeps the value it views); every other
// forward value is freed after the forward pass and recomputed when needed.
Policy manual();
// Keeps every k-th forward node (k >= 1, else ad::Error; k = 1 keeps all).
Policy uniform(std::int64_t k);
// Chen et al.'s sqrt(n) segments: the n forward values (those owning memory,
// in graph order) are split into windows of ceil(sqrt(n)); in each, the
// boundary where the fewest bytes cross (values the forward pass reads again
// after it) is chosen and every value crossing it is kept, so a segment is
// recomputed from what is kept alone. On a chain that is every
// ceil(sqrt(n))-th value; on a recurrent cell or a residual stream, the state.
Policy sqrt_n();
// Keeps the forward nodes for which keep(info) is true (JAX-style
// checkpoint policies); see save_matmuls(). An empty keep is an ad::Error.
Policy selective(KeepFn keep);
// The cheapest schedule (by recompute flops) the planner finds whose peak
// fits in `bytes` (docs/design.md: a fixed candidate list, an exact tier on
// small graphs, a second tier when nothing in the list fits). A lower
// budget never gets a higher peak; near the least feasible peak a higher
// budget can get a plan that recomputes more than a lower one's (the second
// tier is not built when the list has a fit).
// backward() throws ad::BudgetError (an ad::Error) stating the least peak it
// can plan, and whether that is proven to be the minimum, when it cannot
// fit. The measured peak never exceeds `bytes`: it counts what the step
// allocates, above the graph's values already present when backward starts
// (Report::baseline_bytes: values you asked for before, with value() or
// eval(), stay held on top; Graph::release drops them). bytes < 0 is an
// ad::Error.
Policy budget(std::int64_t bytes);
// For chain-shaped graphs: Revolve / binomial checkpointing (Griewank and
// Walther) with `slots` snapshots (counting the one holding the input);
// executes the minimum number of forward steps for that many snapshots, in
// Revolve's model, where reversing a step recomputes it: T(l, s) + l step
// computations for l steps, 2l - 1 even with slots >= l (keep_all computes
// each once: use this policy when memory is short, not to save time). Throws ad::Error for
// slots < 1, and (from backward) if the graph is not a chain.
Policy optimal_chain(std::int32_t slots);
}  // namespace policy

// A ready predicate for selective(): keep the outputs of the products,
// matmul and conv2d (the costly ops to recompute); recompute the rest.
bool save_matmuls(const NodeInfo& info);

// Marks x's node as a checkpoint for policy::manual() (and returns x).
Var checkpoint(const Var& x);

// Byte-size literals: 64_MiB, 512_KiB.
inline namespace literals {
constexpr std::int64_t operator""_KiB(unsigned long long v) { return static_cast<std::int64_t>(v) << 10; }
constexpr std::int64_t operator""_MiB(unsigned long long v) { return static_cast<std::int64_t>(v) << 20; }
constexpr std::int64_t operator""_GiB(unsigned long long v) { return static_cast<std::int64_t>(v) << 30; }
}  // namespace literals

}  // namespace ad
