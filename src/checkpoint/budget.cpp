// policy::budget — the cheapest schedule (by recompute flops) whose exactly
// simulated peak fits the budget.
//
// Candidates form a fixed list that does not depend on the budget: keep_all,
// keep sets that drop the forward values cheapest to recompute per byte,
// uniform keep sets, keep sets at the least-crossing boundaries (sqrt_n's,
// every window size), and DTR-style schedules (evict the value with the
// lowest cost / (bytes x staleness) when memory runs out) simulated at a ladder of
// memory levels from the lower bound up to the keep_all peak (on problems of
// up to kSmallProblem nodes also with three more eviction scores and an
// order that computes the loss last; see the variants in budget()), and, for
// chain-shaped graphs, binomial (Revolve) schedules, with one forward node
// per chain step and with steps grouped up to the values backward reads. The DTR ladder runs
// twice: demanding the nodes in autodiff's order, and in a low-memory
// topological order (each step, the ready node whose demand adds the least
// memory: a parameter gradient as soon as its inputs exist, since it is
// accumulated and freed at once), from the top level down, stopping (per
// order) at the first run longer than 16x keep_all's steps: lower levels
// recompute the graph many times over and are left to the second tier.
// Each candidate's peak is simulated exactly; the plan for a budget B is the
// first candidate, in (recompute cost, peak) order, whose peak is <= B
// (candidates that cannot be it are pruned without changing it: see
// budget()). When
// none fits, a second tier: the DTR schedules a bisection over memory levels
// finds between the lower bound and the least fixed peak (one bisection per
// DTR variant on small problems), again in (cost,
// peak) order; the least of their peaks is the minimum feasible budget stated
// when B is below it. Neither tier depends on B, so lowering the budget never raises the
// peak, and every budget at or above the stated minimum plans. (A DTR run at
// level B itself would not do: DTR is greedy, and can get stuck at a level
// above one where it succeeds.)
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <queue>
#include <set>
#include <utility>

#include "checkpoint/planner.hpp"

namespace ad::planner {

namespace {

// Plans one DTR run at memory level `limit`, demanding the nodes in `order`
// (a topological order of p.order; default p.order); nullopt when it gets
// stuck (every present value is in use by the op being computed).
class Dtr {
 public:
  // max_steps: give up (nullopt, capped()) once the schedule has more steps
  // (0: no limit); cost_cap: give up (nullopt, over_cost()) once it
  // recomputes more flops; the step count is checked first
  Dtr(const Problem& p, std::int64_t limit, const std::vector<std::int32_t>* order = nullptr, std::size_t max_steps = 0,
      int score = 0, double cost_cap = std::numeric_limits<double>::infinity())
      : p_(p), b_(p), limit_(limit), max_steps_(max_steps), score_(score), order_(order ? *order : p.order) {
    b_.cost_cap = cost_cap;
    auto n = static_cast<std::size_t>(p.hi + 1);
    pending_.assign(n, 0);
    for (auto id : p.order) pending_[static_cast<std::size_t>(id)] = static_cast<std::int32_t>(p.consumers[static_cast<std::size_t>(id)].size());
    slot_.assign(n, -1);
    lock_.assign(n, 0);
    last_.assign(n, 0);
    view_refs_.assign(n, 0);
    base_.resize(n);
    for (std::int32_t id = 0; id <= p.hi; ++id) {
      const Node& nd = p.g.node(id);
      base_[static_cast<std::size_t>(id)] = op_def(nd.op).view ? base_[static_cast<std::size_t>(nd.inputs[0])] : id;
    }
    if (score_ == 0) make_classes();
  }

  std::optional<Schedule> run() {
    std::vector<std::int32_t> touched, cand;
    for (auto d : order_) {
      touched.clear();
      if (!ensure(d, touched)) return std::nullopt;
      if (max_steps_ && b_.s.steps.size() > max_steps_) { capped_ = true; return std::nullopt; }
      if (b_.over_cap()) { over_cost_ = true; return std::nullopt; }
      const auto& ins = p_.g.node(d).inputs;
      for (std::size_t i = 0; i < ins.size(); ++i)  // d is served: one consumer less to wait for
        if (std::find(ins.begin(), ins.begin() + static_cast<std::ptrdiff_t>(i), ins[i]) == ins.begin() + static_cast<std::ptrdiff_t>(i))
          --pending_[static_cast<std::size_t>(ins[i])];
      cand.clear();
      cand.push_back(d);
      for (auto t : touched) {
        cand.push_back(t);
        for (auto in : p_.g.node(t).inputs) cand.push_back(in);
      }
      for (auto u : cand)
        if (b_.present(u) && !p_.pinned[static_cast<std::size_t>(u)] && pending_[static_cast<std::size_t>(u)] <= 0) release(u);
    }
    return b_.finish();
  }
  // run() gave up because the schedule grew past max_steps
  bool capped() const { return capped_; }
  // run() gave up because the schedule recomputed more than cost_cap (it
  // might still have grown past max_steps, had it gone on)
  bool over_cost() const { return over_cost_; }

 private:
  bool is_view(std::int32_t id) const { return base_[static_cast<std::size_t>(id)] != id; }

  // Makes v present, computing the absent values it needs first (depth
  // first over its inputs, in their order), each input locked while its
  // siblings are made; false when stuck or past a limit. An explicit stack of
  // frames, not recursion: a chain of 10^5 nodes is a deep demand.
  bool ensure(std::int32_t v, std::vector<std::int32_t>& touched) {
    if (b_.present(v)) { touch(v); return true; }
    if (capped_ || over_cost_) return false;
    frames_.clear();
    frames_.push_back({v, 0});
    bool ok = true;  // false once a demand below failed: every frame unwinds
    while (!frames_.empty()) {
      Frame& f = frames_.back();
      const auto& ins = p_.g.node(f.v).inputs;
      if (ok && f.next < ins.size()) {
        const std::int32_t in = ins[f.next];
        if (!b_.present(in)) {
          if (capped_ || over_cost_) { ok = false; continue; }
          frames_.push_back({in, 0});  // f is not used past this point
          continue;
        }
        touch(in);
        lock(in, +1);
        ++f.next;
        continue;
      }
      // every input present and locked (or a failure below): compute f.v
      const std::int32_t w = f.v;
      const std::size_t locked = f.next;
      if (ok) ok = compute(w, touched);
      for (std::size_t i = 0; i < locked; ++i) lock(ins[i], -1);
      frames_.pop_back();
      if (ok && !frames_.empty()) {  // the parent's input is present now: lock it, go on to the next
        lock(w, +1);
        ++frames_.back().next;
      }
    }
    return ok;
  }

  // Computes v (its inputs present and locked), evicting what it must to fit.
  bool compute(std::int32_t v, std::vector<std::int32_t>& touched) {
    auto u = static_cast<std::size_t>(v);
    std::int64_t need = p_.bytes[u] + p_.ws[u];
    while (live_ + need > limit_)
      if (!evict_one()) return false;
    b_.compute(v);
    touched.push_back(v);
    // the limits hold inside one demand too: at a low level, recovering one
    // evicted value can recompute (and evict) far more than the whole graph
    if (max_steps_ && b_.s.steps.size() > max_steps_) capped_ = true;
    if (b_.over_cap()) over_cost_ = true;
    if (is_view(v)) view_ref(base_[u], +1);
    else live_ += p_.bytes[u];
    // only forward values are evicted: recomputing a gradient value would replay the backward pass behind it
    if (v <= p_.boundary && !p_.pinned[u] && !is_view(v) && p_.bytes[u] > 0 && slot_[u] < 0) {
      slot_[u] = static_cast<std::int32_t>(evictable_.size());
      evictable_.push_back(v);
    }
    last_[u] = ++clock_;
    sync(v);
    return true;
  }

  void release(std::int32_t v) {
    auto u = static_cast<std::size_t>(v);
    b_.free(v);
    if (slot_[u] >= 0) {
      auto last = evictable_.back();
      evictable_[static_cast<std::size_t>(slot_[u])] = last;
      slot_[static_cast<std::size_t>(last)] = slot_[u];
      evictable_.pop_back();
      slot_[u] = -1;
      sync(v);
    }
    if (is_view(v)) view_ref(base_[u], -1);
    else live_ -= p_.bytes[u];
  }

  // Evicts the value with the lowest cost / (bytes x staleness), the lowest
  // id among equals; false if none can go. Looks only at the present forward
  // values that own memory (few when memory is tight), not at every node.
  bool evict_one() {
    std::int32_t best = -1;
    double best_h = 0;
    auto consider = [&](std::int32_t id, double h) {
      if (best < 0 || h < best_h || (h == best_h && id < best)) { best = id; best_h = h; }
    };
    if (score_ == 0) {
      // the same choice as the scan below, without looking at every value: in
      // a class (equal flops and bytes) h only grows with last_, so a class's
      // least h is at the front of its least-recently-used list (ties: the
      // equal front run, lowest id); the classes are few in a model of
      // repeated layers, where the scan made a long chain's plan quadratic
      for (auto c : live_classes_) {
        const auto& set = cls_[static_cast<std::size_t>(c)].set;
        double front_h = 0;
        for (auto it = set.begin(); it != set.end(); ++it) {
          double h = heuristic(it->second);
          if (it != set.begin() && h != front_h) break;  // past the class's least h
          front_h = h;
          consider(it->second, h);
        }
      }
    } else {
      for (auto id : evictable_) {
        auto u = static_cast<std::size_t>(id);
        if (lock_[u] || view_refs_[u]) continue;
        consider(id, heuristic(id));
      }
    }
    if (best < 0) return false;
    release(best);
    return true;
  }

  // DTR's score: recompute cost / (bytes x staleness), lowest evicted first
  double heuristic(std::int32_t id) {
    auto u = static_cast<std::size_t>(id);
    double stale = (score_ & 1) ? 1.0 : static_cast<double>(clock_ - last_[u] + 1);
    double cost = (score_ & 2) ? chain_cost(id) : p_.flops[u];
    return (cost + 1.0) / (static_cast<double>(p_.bytes[u]) * stale);
  }

  // ---- score 0: the values evict_one may take, per class ----
  // The forward values that may be evicted, grouped by (flops, bytes); each
  // class holds, ordered by (last_, id), its values that are evictable now:
  // present, not locked by the demand in progress, no view of them present.
  void make_classes() {
    auto n = static_cast<std::size_t>(p_.hi + 1);
    cls_of_.assign(n, -1);
    in_set_.assign(n, 0);
    std::vector<std::int32_t> ids;
    for (std::int32_t id = 0; id <= p_.boundary; ++id)
      if (!is_view(id) && p_.bytes[static_cast<std::size_t>(id)] > 0) ids.push_back(id);
    auto key_less = [&](std::int32_t a, std::int32_t b) {
      auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
      if (p_.flops[ua] != p_.flops[ub]) return p_.flops[ua] < p_.flops[ub];
      return p_.bytes[ua] < p_.bytes[ub];
    };
    std::stable_sort(ids.begin(), ids.end(), key_less);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i == 0 || key_less(ids[i - 1], ids[i])) cls_.emplace_back();
      cls_of_[static_cast<std::size_t>(ids[i])] = static_cast<std::int32_t>(cls_.size() - 1);
    }
  }
  // Puts v in its class's set, or takes it out, as its state now says.
  void sync(std::int32_t v) {
    if (score_ != 0) return;
    auto u = static_cast<std::size_t>(v);
    const bool want = slot_[u] >= 0 && !lock_[u] && !view_refs_[u];
    if (want == static_cast<bool>(in_set_[u])) return;
    const std::int32_t ci = cls_of_[u];
    Class& c = cls_[static_cast<std::size_t>(ci)];
    if (want) {
      if (c.set.empty()) {
        c.live_at = static_cast<std::int32_t>(live_classes_.size());
        live_classes_.push_back(ci);
      }
      c.set.emplace(last_[u], v);
    } else {
      c.set.erase({last_[u], v});
      if (c.set.empty()) {  // out of the list of classes with an evictable value
        auto last = live_classes_.back();
        live_classes_[static_cast<std::size_t>(c.live_at)] = last;
        cls_[static_cast<std::size_t>(last)].live_at = c.live_at;
        live_classes_.pop_back();
        c.live_at = -1;
      }
    }
    in_set_[u] = want;
  }
  void lock(std::int32_t v, int by) {
    lock_[static_cast<std::size_t>(v)] += by;
    sync(v);
  }
  void view_ref(std::int32_t v, int by) {
    view_refs_[static_cast<std::size_t>(v)] += by;
    sync(v);
  }
  // v, present, was used: its last_ moves to the clock (and its set place with it)
  void touch(std::int32_t v) {
    auto u = static_cast<std::size_t>(v);
    if (score_ == 0 && in_set_[u]) {
      auto& set = cls_[static_cast<std::size_t>(cls_of_[u])].set;
      set.erase({last_[u], v});
      last_[u] = ++clock_;
      set.emplace(last_[u], v);
    } else {
      last_[u] = ++clock_;
    }
  }

  // flops of recomputing id and the absent values it needs (DTR's evicted
  // neighbourhood, upstream only; each counted once)
  double chain_cost(std::int32_t id) {
    ++mark_;
    double c = 0;
    stack_.assign(1, id);
    while (!stack_.empty()) {
      auto v = stack_.back();
      stack_.pop_back();
      auto u = static_cast<std::size_t>(v);
      if (seen_[u] == mark_) continue;
      seen_[u] = mark_;
      c += p_.flops[u];
      for (auto in : p_.g.node(v).inputs)
        if (!b_.present(in) && p_.needed[static_cast<std::size_t>(in)]) stack_.push_back(in);
    }
    return c;
  }

  const Problem& p_;
  Builder b_;
  std::int64_t limit_;
  std::size_t max_steps_;
  int score_ = 0;
  bool capped_ = false, over_cost_ = false;
  std::int64_t live_ = 0;
  std::int64_t clock_ = 0;
  std::vector<std::int32_t> order_;
  std::vector<std::int32_t> lock_, base_, view_refs_;
  std::vector<std::int32_t> pending_;              // consumers of each value not yet demanded
  std::vector<std::int32_t> evictable_, slot_;     // present forward values that may be evicted; index in it
  std::vector<std::int64_t> last_;
  std::vector<std::int64_t> seen_ = std::vector<std::int64_t>(static_cast<std::size_t>(p_.hi + 1), 0);
  std::vector<std::int32_t> stack_;
  std::int64_t mark_ = 0;
  struct Frame {
    std::int32_t v;    // the value being made present
    std::size_t next;  // its inputs [0, next) are present and locked
  };
  std::vector<Frame> frames_;
  struct Class {
    std::set<std::pair<std::int64_t, std::int32_t>> set;  // (last_, id) of the values evictable now
    std::int32_t live_at = -1;                            // index in live_classes_ (-1: empty)
  };
  std::vector<Class> cls_;
  std::vector<std::int32_t> cls_of_;        // a value's class (-1: never evictable)
  std::vector<char> in_set_;                // in its class's set
  std::vector<std::int32_t> live_classes_;  // the classes with an evictable value
};

// Joint-graph nodes up to which every DTR eviction score runs (see budget()).
constexpr std::size_t kSmallProblem = 300;

// 1, 2, 3, ... growing by ~25% up to n (inclusive)
std::vector<std::int64_t> ladder(std::int64_t n) {
  std::vector<std::int64_t> v;
  for (double x = 1; static_cast<std::int64_t>(x) <= n; x = std::max(x + 1, x * 1.25)) v.push_back(static_cast<std::int64_t>(x));
  if (v.empty() || v.back() != n) v.push_back(n);
  return v;
}

// A topological order of p.order that keeps live memory low: each step, of
// the nodes whose inputs are all computed, the one whose compute adds the
// least (its bytes and workspace, or only the workspace if nothing reads it,
// minus the inputs it reads last); ties go to the lower id (autodiff order).
std::vector<std::int32_t> low_memory_order(const Problem& p) {
  auto n = static_cast<std::size_t>(p.hi + 1);
  std::vector<std::int32_t> missing(n, 0), uses(n, 0), ready, out;
  auto first = [](const std::vector<std::int32_t>& ins, std::size_t i) {  // ins[i] not seen before in ins
    return std::find(ins.begin(), ins.begin() + static_cast<std::ptrdiff_t>(i), ins[i]) == ins.begin() + static_cast<std::ptrdiff_t>(i);
  };
  for (auto id : p.order) {
    auto u = static_cast<std::size_t>(id);
    uses[u] = static_cast<std::int32_t>(p.consumers[u].size());
    const auto& ins = p.g.node(id).inputs;
    for (std::size_t i = 0; i < ins.size(); ++i)
      if (first(ins, i) && p.needed[static_cast<std::size_t>(ins[i])]) ++missing[u];
    if (!missing[u]) ready.push_back(id);
  }
  auto delta = [&](std::int32_t id) {
    auto u = static_cast<std::size_t>(id);
    std::int64_t d = p.ws[u] + ((uses[u] > 0 || p.pinned[u]) ? p.bytes[u] : 0);
    const auto& ins = p.g.node(id).inputs;
    for (std::size_t i = 0; i < ins.size(); ++i) {
      auto x = static_cast<std::size_t>(ins[i]);
      if (first(ins, i) && p.needed[x] && !p.pinned[x] && uses[x] == 1) d -= p.bytes[x];
    }
    return d;
  };
  // the ready node of least (delta, id), from a heap: a node's delta only
  // falls, when an input's uses drop to 1, and then a fresh entry goes in;
  // an entry whose delta is no longer the node's is stale and skipped (a scan
  // of the ready set made a long recurrence's order quadratic)
  using Entry = std::pair<std::int64_t, std::int32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  std::vector<char> is_ready(n, 0), done(n, 0);
  for (auto id : ready) {
    is_ready[static_cast<std::size_t>(id)] = 1;
    heap.emplace(delta(id), id);
  }
  out.reserve(p.order.size());
  while (!heap.empty()) {
    auto [d, id] = heap.top();
    heap.pop();
    auto u = static_cast<std::size_t>(id);
    if (done[u] || d != delta(id)) continue;
    done[u] = 1;
    out.push_back(id);
    const auto& ins = p.g.node(id).inputs;
    for (std::size_t i = 0; i < ins.size(); ++i) {
      if (!first(ins, i)) continue;
      auto x = static_cast<std::size_t>(ins[i]);
      if (--uses[x] == 1)  // x's last consumer will free it: a ready one's delta fell
        for (auto c : p.consumers[x])
          if (is_ready[static_cast<std::size_t>(c)] && !done[static_cast<std::size_t>(c)]) heap.emplace(delta(c), c);
    }
    for (auto c : p.consumers[u])
      if (--missing[static_cast<std::size_t>(c)] == 0) {
        is_ready[static_cast<std::size_t>(c)] = 1;
        heap.emplace(delta(c), c);
      }
  }
  return out;
}

struct Candidate {
  Schedule s;
  std::int64_t peak;
  std::size_t index;
};

}  // namespace

Schedule budget(const Problem& p, std::int64_t bytes, bool reuse, Pruning* pruning) {
  Pruning counts;
  Pruning& pr = pruning ? *pruning : counts;
  std::vector<Candidate> cands;
  // The plan is the first candidate in (cost, peak) order that fits, so one
  // that recomputes more than a candidate known to fit can never be it. Such
  // candidates are not simulated, and their builders stop as soon as they
  // pass that cost (cap()): the plan is the one the whole list gives, in a
  // fraction of the time on large graphs (the DTR runs and Revolve schedules
  // at low levels recompute the graph many times over). Except on problems
  // of the exact tier, whose sweep is pruned by every candidate's peak.
  constexpr double kNoCap = std::numeric_limits<double>::infinity();
  constexpr std::int64_t kUnsimulated = std::numeric_limits<std::int64_t>::max();
  const bool prune = pr.on && p.order.size() > static_cast<std::size_t>(kExactValues);
  double fits_at = kNoCap;  // the least cost of a candidate that fits
  auto cap = [&] { return prune ? fits_at : kNoCap; };
  // Each candidate's place in the list (ties of cost and peak go to the
  // first): the keep sets, the DTR runs, the Revolve schedules, the exact
  // tier's points. The Revolve schedules are built before the DTR runs, and
  // with the most snapshots (least recomputation) first: a cheap schedule
  // that fits low budgets lowers the cap early.
  constexpr std::size_t kKeepSets = 0, kDtr = std::size_t{1} << 40, kRevolve = std::size_t{2} << 40,
                        kExactPoints = std::size_t{3} << 40;
  std::size_t keep_sets = 0, dtr_runs = 0;
  auto add = [&](Schedule s, std::size_t index) {
    std::int64_t pk = kUnsimulated;
    if (s.recompute_flops <= cap()) {
      if (reuse) reuse_dying_inputs(p, s);  // each candidate's peak as it will run
      pk = simulate_peak(p.g, s);
      if (pk <= bytes) fits_at = std::min(fits_at, s.recompute_flops);
    } else {
      ++pr.unsimulated;
    }
    cands.push_back({std::move(s), pk, index});
  };
  // Keep sets whose held values alone (a lower bound of the peak) exceed
  // the budget cannot fit: built only if nothing fits, for the least peak.
  std::vector<std::pair<std::vector<char>, std::size_t>> held_over;
  auto add_keep = [&](std::vector<char> keep) {
    const std::size_t index = kKeepSets + keep_sets++;
    if (prune && keep_set_held_bytes(p, keep) > bytes) {
      held_over.emplace_back(std::move(keep), index);
      ++pr.held_over;
    } else if (auto s = keep_set_under(p, keep, cap())) {
      add(std::move(*s), index);
    } else {
      ++pr.stopped;
    }
  };
  std::vector<char> all(static_cast<std::size_t>(p.hi + 1), 1);
  add(keep_set(p, all), kKeepSets + keep_sets++);
  if (cands[0].peak <= bytes) {  // nothing is cheaper than no recomputation
    cands[0].s.proven_cheapest = true;
    return std::move(cands[0].s);
  }

  // forward values that own memory, cheapest to recompute per byte first
  std::vector<std::int32_t> fs;
  for (auto id : p.forward)
    if (!op_def(p.g.node(id).op).view && p.bytes[static_cast<std::size_t>(id)] > 0) fs.push_back(id);
  std::vector<std::int32_t> by_ratio = fs;
  std::stable_sort(by_ratio.begin(), by_ratio.end(), [&](std::int32_t a, std::int32_t b) {
    auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
    return p.flops[ua] / static_cast<double>(p.bytes[ua]) < p.flops[ub] / static_cast<double>(p.bytes[ub]);
  });
  auto n = static_cast<std::int64_t>(fs.size());
  for (auto t : ladder(n)) {  // drop the t cheapest
    std::vector<char> keep = all;
    for (std::int64_t i = 0; i < t; ++i) keep[static_cast<std::size_t>(by_ratio[static_cast<std::size_t>(i)])] = 0;
    add_keep(std::move(keep));
  }
  for (auto k : ladder(n)) {  // keep every k-th
    if (k < 2) continue;
    std::vector<char> keep(all.size(), 0);
    for (std::int64_t i = 0; i < n; ++i)
      if ((i + 1) % k == 0) keep[static_cast<std::size_t>(fs[static_cast<std::size_t>(i)])] = 1;
    add_keep(std::move(keep));
  }
  // Keep sets whose gaps widen toward the front (the last gap g, then g +
  // g/4, g + 2g/4, ...): when backward reverses a segment, every checkpoint
  // in front of it is still held, so the last segments must be the shortest
  // for the peak to stay level.
  for (auto g0 : ladder(n)) {
    if (g0 < 4 || g0 >= n) continue;
    std::vector<char> keep(all.size(), 0);
    std::int64_t gap = g0;
    for (std::int64_t i = n - 1 - g0; i >= 0; i -= gap, gap += g0 / 4) keep[static_cast<std::size_t>(fs[static_cast<std::size_t>(i)])] = 1;
    add_keep(std::move(keep));
  }
  // sqrt_n's keep sets at every window size: boundaries where the fewest
  // bytes cross, and what crosses them (on a chain the same as every k-th;
  // on a recurrence the state, which the sets above miss). Last among the
  // keep sets, so a tie of cost and peak goes to the sets before.
  for (auto k : ladder(n)) {
    if (k < 2) continue;
    add_keep(boundary_keep(p, fs, k));
  }
  // and sqrt_n()'s own keep set (its window, ceil(sqrt(n)) over every
  // non-view forward value, is often not on the ladder): a budget that
  // sqrt_n() fits then always plans
  {
    std::vector<std::int32_t> all_fs;
    for (auto id : p.forward)
      if (!op_def(p.g.node(id).op).view) all_fs.push_back(id);
    const auto k = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(all_fs.size()))));
    add_keep(boundary_keep(p, all_fs, std::max<std::int64_t>(1, k)));
  }
  // and manual()'s keep set when the graph has ad::checkpoint marks (a
  // layer's own, e.g. nn::Recurrent's checkpoint_every): a budget that the
  // marks' plan fits then always plans (a user's trial found budget's least
  // peak 38 % above the marks' on a 1,000-step LSTM)
  if (auto marked = marked_keep(p); !marked.empty()) add_keep(std::move(marked));
  std::int64_t lb = p.lower_bound(), top = cands[0].peak;
  // A DTR run longer than this recomputes the graph many times over; the
  // ladder leaves such low levels to the second tier below (the bisection).
  const std::size_t max_steps = 16 * cands[0].s.steps.size();
  // chains: binomial (Revolve) schedules with growing numbers of snapshots
  // (built in the other order, see kRevolve), one forward node per step and
  // with steps grouped up to the values backward reads (an MLP layer per step)
  std::vector<std::int64_t> snapshots;
  for (auto k : ladder(static_cast<std::int64_t>(p.forward.size())))
    if (k <= 64) snapshots.push_back(k);
  for (bool grouped : {false, true}) {
    const std::size_t first = kRevolve + (grouped ? snapshots.size() : 0);
    try {
      for (std::size_t i = snapshots.size(); i-- > 0;)
        if (auto s = optimal_chain_under(p, static_cast<std::int32_t>(snapshots[i]), grouped, cap()))
          add(std::move(*s), first + i);
        else
          ++pr.stopped;
    } catch (const Error&) {
      // not a chain: no Revolve candidates
    }
  }
  constexpr int kRungs = 12;
  const std::vector<std::int32_t> low_memory = low_memory_order(p);
  // The DTR variants. Every problem: DTR's score in autodiff's order and in
  // the low-memory order. Small problems (where the runs are cheap and one
  // eviction choice or the place of the loss decides the cost) also get
  //  - three more eviction scores (bits of `score`): 1 = without staleness
  //    (cost / bytes), 2 = the cost of the value and of the absent values its
  //    recomputation needs (DTR's evicted neighbourhood), 3 = both;
  //  - the low-memory order with the targets (the loss) last: gradients
  //    read the loss's inputs, not the loss, so its computation can wait
  //    until backward no longer needs the memory. (Autodiff's order with the
  //    loss last added nothing against the oracle.)
  struct Variant {
    const std::vector<std::int32_t>* order;
    int score;
    bool capped = false;  // a run gave up at max_steps: lower rungs would run longer
    // levels whose runs stopped at the cost cap before max_steps: whether
    // they would have reached it decides whether the rungs below run at all
    std::vector<std::int64_t> unsettled;
  };
  const bool small = p.order.size() <= kSmallProblem;
  auto last_targets = [&](const std::vector<std::int32_t>& order) {
    std::vector<std::int32_t> o;
    if (!small) return o;
    for (auto id : order)
      if (!p.is_target(id)) o.push_back(id);
    for (auto id : order)
      if (p.is_target(id)) o.push_back(id);
    return o;
  };
  const std::vector<std::int32_t> low_targets_last = last_targets(low_memory);
  std::vector<Variant> variants;
  for (int sc = 0; sc < (small ? 4 : 1); ++sc) {
    variants.push_back({&p.order, sc, false, {}});
    variants.push_back({&low_memory, sc, false, {}});
    if (small) variants.push_back({&low_targets_last, sc, false, {}});
  }
  for (int r = kRungs; r >= 0; --r) {
    double level = static_cast<double>(lb) * std::pow(static_cast<double>(top) / static_cast<double>(std::max<std::int64_t>(lb, 1)),
                                                      static_cast<double>(r) / kRungs);
    auto lim = r == 0 ? lb : static_cast<std::int64_t>(level);
    for (auto& v : variants) {
      if (v.capped) continue;
      Dtr d(p, lim, v.order, max_steps, v.score, cap());
      auto s = d.run();
      if (d.over_cost()) {
        ++pr.stopped;
        v.unsettled.push_back(lim);
        continue;
      }
      if (!s) {
        v.capped = d.capped();
        continue;
      }
      // A schedule within the cap: it counts only if no run above it (of
      // those stopped at the cap) would have reached max_steps. Those runs
      // again, in full (rare: DTR costs more at lower levels).
      for (auto up : v.unsettled) {
        ++pr.reruns;
        Dtr full(p, up, v.order, max_steps, v.score);
        if (!full.run() && full.capped()) { v.capped = true; break; }
      }
      v.unsettled.clear();
      if (!v.capped) add(std::move(*s), kDtr + dtr_runs++);
    }
  }
  // the exact tier (exact.cpp): on problems of up to 64 values, the points
  // of the (recompute flops, peak) frontier that exact searches prove, each
  // pruned by the fixed candidates above
  std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.index < b.index; });
  std::vector<FixedPoint> fixed;
  for (const auto& c : cands) fixed.push_back({c.s.recompute_flops, c.peak});
  Frontier exact = exact_frontier(p, fixed, top, bytes, reuse);
  for (std::size_t i = 0; i < exact.schedules.size(); ++i) add(std::move(exact.schedules[i]), kExactPoints + i);
  if (fits_at == kNoCap)  // nothing fits: the least peak of all
    for (const auto& [keep, index] : held_over) add(keep_set(p, keep), index);
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    if (a.s.recompute_flops != b.s.recompute_flops) return a.s.recompute_flops < b.s.recompute_flops;
    if (a.peak != b.peak) return a.peak < b.peak;
    return a.index < b.index;
  });
  for (auto& c : cands)
    if (c.peak <= bytes) {
      c.s.proven_cheapest = c.s.recompute_flops == exact.proven_cost;
      return std::move(c.s);
    }
  // (nothing fits, so every candidate was simulated)
  std::int64_t best = cands[0].peak;
  for (const auto& c : cands) best = std::min(best, c.peak);
  // Second tier: DTR schedules at the levels a bisection for the least level
  // that still fits visits (independent of the budget).
  // (On small problems, one bisection per DTR variant.)
  std::vector<Candidate> low;
  const std::int64_t fixed_best = best;
  // a level whose DTR run grows past this many steps counts as not fitting
  // (without a limit, runs at low levels of graphs of a few thousand nodes
  // took minutes and tens of GB)
  const std::size_t tier2_steps = std::max<std::size_t>(4 * max_steps, std::size_t(1) << 20);
  for (const auto& v : variants) {
    if (!small && v.order != &p.order) break;  // large problems: DTR's order and score only
    for (std::int64_t lo = lb, hi = fixed_best; lo < hi;) {
      std::int64_t mid = lo + (hi - lo) / 2;
      auto s = Dtr(p, mid, v.order, tier2_steps, v.score).run();
      if (s && reuse) reuse_dying_inputs(p, *s);
      std::int64_t pk = s ? simulate_peak(p.g, *s) : -1;
      if (s && pk <= mid) {
        best = std::min(best, pk);
        hi = std::min(mid, pk);
        low.push_back({std::move(*s), pk, low.size()});
      } else {
        lo = mid + 1;
      }
    }
  }
  std::stable_sort(low.begin(), low.end(), [](const Candidate& a, const Candidate& b) {
    if (a.s.recompute_flops != b.s.recompute_flops) return a.s.recompute_flops < b.s.recompute_flops;
    if (a.peak != b.peak) return a.peak < b.peak;
    return a.index < b.index;
  });
  for (auto& c : low)
    if (c.peak <= bytes) {
      c.s.proven_cheapest = c.s.recompute_flops == exact.proven_cost;
      return std::move(c.s);
    }
  // Proven minimal: a schedule reaches the largest single step's bytes, or
  // the exact tier's sweep proved nothing fits below its last point. Both
  // hold in the model without buffer reuse only (reuse can lower a step).
  const bool proven = !reuse && (best == lb || (exact.least_proven && best == exact.least));
  if (proven)
    throw BudgetError(fmt::format("budget: {} B is below the minimum feasible peak of {} B for this step "
                                  "(proven: no schedule has a lower peak; its largest single step alone needs {} B)",
                                  bytes, best, lb),
                      bytes, best, lb, true);
  // lb counts a step's inputs and output apart; writing over an input (reuse)
  // can need less, so with reuse it is only named where it is no more than best
  const std::string step_need =
      lb <= best ? fmt::format("; its largest single step alone needs {} B", lb)
                 : fmt::format("; its largest single step needs {} B unless it writes over an input", lb);
  throw BudgetError(fmt::format("budget: {} B is below the least peak of any schedule the planner finds for this "
                                "step, {} B (every budget from there up plans; not proven minimal{})",
                                bytes, best, step_need),
                    bytes, best, std::min(lb, best), false);
}

}  // namespace ad::planner
