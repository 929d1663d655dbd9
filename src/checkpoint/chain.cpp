// policy::optimal_chain — Revolve / binomial checkpointing (Griewank and
// Walther) on chain-shaped graphs.
//
// The forward nodes f_1..f_l form a chain x_0 -> x_1 -> ... -> x_l when each
// f_i reads only leaves and f_{i-1} (x_0 is the input, a leaf). Reversing
// step i runs f_i once more from x_{i-1} (the fused step) and then the
// gradient nodes of step i. With s snapshots (counting the one that holds
// x_0), the forward steps before the fused ones are at least
//   T(l, s) = min_{0<j<l} { j + T(l-j, s-1) + T(j, s) },  T(1, s) = 0,
//   T(l, 1) = l(l-1)/2,
// whose closed form is r*l - C(s+r, s+1) with r the least integer such that
// C(s+r, s) >= l. The schedule below attains it, so the engine computes
// forward nodes exactly T(l, s) + l times.
//
// Grouped links (used by policy::budget as candidates, not by the policy
// itself): a step is then a maximal run of forward nodes ending at one whose
// value a gradient node reads (or at the last forward node). In an MLP,
// matmul -> +bias -> tanh is one step, since backward reads only the tanh
// output (and the matmul's input, the previous step's tanh output): storing
// a matmul or bias output would be a wasted snapshot. The values inside a
// step are transients, freed after their last reader within the step.
#include <algorithm>
#include <limits>

#include "checkpoint/planner.hpp"
#include "checkpoint/revolve.hpp"

namespace ad::planner {

namespace {

class Revolver {
 public:
  Revolver(const Problem& p, std::int32_t slots, bool grouped, double cost_cap) : p_(p), b_(p), slots_(slots) {
    b_.cost_cap = cost_cap;
    const auto& f = p.forward;
    const auto n = static_cast<std::size_t>(p.hi + 1);
    // steps: one forward node each, or grouped up to a node a gradient node reads
    std::vector<char> read_by_grad(n, 0);
    if (grouped)
      for (auto id : p.order)
        if (id > p.boundary)
          for (auto in : p.g.node(id).inputs) read_by_grad[static_cast<std::size_t>(in)] = 1;
    links_.assign(1, {});  // links_[0] unused: x_0 is the leaf input
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (i == 0 || !grouped || read_by_grad[static_cast<std::size_t>(f[i - 1])]) links_.emplace_back();
      links_.back().push_back(f[i]);
    }
    l_ = static_cast<std::int64_t>(links_.size()) - 1;
    index_.assign(n, 0);
    for (std::int64_t i = 1; i <= l_; ++i)
      for (auto id : links_[static_cast<std::size_t>(i)]) index_[static_cast<std::size_t>(id)] = i;
    // chain check: a node of step i reads only leaves / present values, x_{i-1}
    // (the last node of step i-1) and earlier nodes of its own step
    free_after_.assign(n, {});
    for (std::int64_t i = 1; i <= l_; ++i)
      for (auto id : links_[static_cast<std::size_t>(i)])
        for (auto in : p.g.node(id).inputs) {
          auto k = index_[static_cast<std::size_t>(in)];
          if (k == 0 || k == i || (k == i - 1 && in == x(k))) continue;
          throw Error(fmt::format("optimal_chain: the graph is not a chain: {}#{} (step {}) reads {}#{} (step {})",
                                  op_def(p.g.node(id).op).name, id, i, op_def(p.g.node(in).op).name, in, k));
        }
    // a value inside a step is freed after its last reader there (grouped steps only)
    for (std::int64_t i = 1; i <= l_; ++i) {
      const auto& nodes = links_[static_cast<std::size_t>(i)];
      for (std::size_t j = 0; j + 1 < nodes.size(); ++j) {
        std::int32_t last = nodes[j];
        for (auto c : p.consumers[static_cast<std::size_t>(nodes[j])])
          if (index_[static_cast<std::size_t>(c)] == i) last = std::max(last, c);
        free_after_[static_cast<std::size_t>(last)].push_back(nodes[j]);
      }
    }
    // step of each gradient node: the forward step whose reversal runs it
    step_.assign(static_cast<std::size_t>(p.hi + 1), 0);
    // (with no forward step left to run, l_ = 0, every gradient node goes to slot 1)
    by_step_.assign(static_cast<std::size_t>(std::max<std::int64_t>(l_, 1) + 1), {});
    uses_left_.assign(static_cast<std::size_t>(p.hi + 1), 0);
    for (auto id : p.order) {
      if (id <= p.boundary) continue;
      std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0, from_grads = l_;
      bool fwd = false;
      for (auto in : p.g.node(id).inputs) {
        auto k = index_[static_cast<std::size_t>(in)];
        if (k) { fwd = true; lo = std::min(lo, k); hi = std::max(hi, k); }
        else if (in > p.boundary && p.needed[static_cast<std::size_t>(in)]) from_grads = std::min(from_grads, step_[static_cast<std::size_t>(in)]);
        if (p.needed[static_cast<std::size_t>(in)] && in > p.boundary) ++uses_left_[static_cast<std::size_t>(in)];
      }
      std::int64_t st = fwd ? hi : from_grads;
      if (fwd && (hi - lo > 1 || hi > from_grads))
        throw Error(fmt::format("optimal_chain: gradient node {}#{} reads forward steps {}..{}: not a chain's backward",
                                op_def(p.g.node(id).op).name, id, lo, hi));
      step_[static_cast<std::size_t>(id)] = std::max<std::int64_t>(st, 1);
      by_step_[static_cast<std::size_t>(step_[static_cast<std::size_t>(id)])].push_back(id);
    }
  }

  // nullopt once the schedule recomputes more than the cost cap
  std::optional<Schedule> run() {
    if (l_ > 0) reverse(0, l_, slots_);
    else run_grads(1);  // the forward values are all present (a second backward, a loss already evaluated)
    if (b_.over_cap()) return std::nullopt;
    return b_.finish();
  }

 private:
  // x_i for i >= 1 is the last node of step i; x_0 is the (always present) input.
  std::int32_t x(std::int64_t i) const { return links_[static_cast<std::size_t>(i)].back(); }
  void drop(std::int64_t i) { if (i >= 1) b_.free(x(i)); }
  // runs step i's forward nodes, freeing the values inside it
  void run_step(std::int64_t i) {
    for (auto id : links_[static_cast<std::size_t>(i)]) {
      b_.compute(id);
      for (auto d : free_after_[static_cast<std::size_t>(id)]) b_.free(d);
    }
  }
  // computes x_{a+1} .. x_{c} from x_a, keeping only x_c (and x_a)
  void advance(std::int64_t a, std::int64_t c) {
    for (std::int64_t i = a + 1; i <= c && !b_.over_cap(); ++i) {
      run_step(i);
      if (i - 1 > a) drop(i - 1);
    }
  }
  // fused step: x_i from x_{i-1}, then step i's gradient nodes
  void reverse_step(std::int64_t i) {
    run_step(i);
    run_grads(i);
    drop(i);
  }
  // step i's gradient nodes, each input freed after its last use
  void run_grads(std::int64_t i) {
    for (auto id : by_step_[static_cast<std::size_t>(i)]) {
      b_.compute(id);
      for (auto in : p_.g.node(id).inputs) {
        auto u = static_cast<std::size_t>(in);
        if (in > p_.boundary && p_.needed[u] && --uses_left_[u] == 0) b_.free(in);
      }
      if (uses_left_[static_cast<std::size_t>(id)] == 0) b_.free(id);
    }
  }
  // reverses steps b..a+1; x_a is held; s snapshots including x_a's
  void reverse(std::int64_t a, std::int64_t b, std::int64_t s) {
    if (b_.over_cap()) return;  // the candidate is dropped: stop building it
    std::int64_t n = b - a;
    if (n == 1) { reverse_step(b); return; }
    if (s == 1) {
      for (std::int64_t i = b; i > a && !b_.over_cap(); --i) {
        advance(a, i - 1);
        reverse_step(i);
        if (i - 1 > a) drop(i - 1);
      }
      return;
    }
    std::int64_t j = revolve::best_split(n, s);
    advance(a, a + j);
    reverse(a + j, b, s - 1);
    drop(a + j);
    reverse(a, a + j, s);
  }

  const Problem& p_;
  Builder b_;
  std::int64_t slots_, l_ = 0;
  std::vector<std::vector<std::int32_t>> links_, free_after_;
  std::vector<std::int64_t> index_, step_;
  std::vector<std::vector<std::int32_t>> by_step_;
  std::vector<std::int32_t> uses_left_;
};

}  // namespace

Schedule optimal_chain(const Problem& p, std::int32_t slots, bool grouped) {
  return *Revolver(p, slots, grouped, std::numeric_limits<double>::infinity()).run();
}

std::optional<Schedule> optimal_chain_under(const Problem& p, std::int32_t slots, bool grouped, double cost_cap) {
  return Revolver(p, slots, grouped, cost_cap).run();
}

}  // namespace ad::planner
