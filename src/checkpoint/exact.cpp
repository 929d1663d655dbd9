// The exact tier of policy::budget: on problems of at most kExactValues
// values to compute, points of the (recompute flops, peak) Pareto frontier
// found by exact searches, swept from keep_all's peak downwards.
//
// The schedule space is the executor's: compute(v) once v's inputs are
// present, free(v) for any value but a target, any value (forward or
// gradient) computed any number of times, in any order, until the targets are
// present and every sink (parameter gradient) has been computed once (it is
// accumulated right after). A state is (P: values present, D: sinks done).
// The step memory of compute(v) is live bytes + bytes(v) + workspace(v), as
// ad::simulate_peak counts it; a view costs nothing and keeps its base's
// storage live while it is present, and a value is not recomputed while a
// view of its old storage is present (that would hold two copies).
//
// Two reductions keep the space small and lose no optimum:
//  - a value is freed only right after a step that read it (moving a free
//    earlier, to just after its last read, never raises memory), so each
//    compute(v) branches on which of v's inputs (and v itself, if it is a
//    sink: accumulating reads it) to free at once;
//  - a value that is no ancestor of anything still required is dropped at
//    once, and only ancestors of required values are computed.
// The min-cost search is A* over (g + h, bottleneck), lexicographic: g =
// flops so far, h = flops of the absent values that must still be computed
// (the required ones and, transitively, their absent inputs; admissible and
// consistent), bottleneck = the largest step so far. The first goal reached
// has the least flops and, among those, the least peak. The best fixed
// candidate that fits the level prunes every state that cannot beat it.
//
// The sweep (exact_frontier) is a function of the problem and the fixed
// candidates only, never of the budget: at level B = keep_all's peak - 1 it
// finds the cheapest schedule whose peak is <= B (or proves that no schedule
// beats the best fixed candidate there), then moves B below that point's
// peak, and so on down. Each point joins budget()'s candidate list, so
// lowering the budget still never raises the peak. The min-cost searches
// share a state cap. Where one gives up, the point is the best fixed
// candidate at B; below every fixed candidate the sweep looks for feasible
// schedules only, from a reserve of states of their own: a weighted A*
// (g + 3h) for a cheap one; else one with the targets last (the sinks
// first, by a search that never holds a target, then the targets computed
// again from nothing present: a target held through the backward pass, the
// loss, adds its bytes to every step there); else any schedule, depth first
// (children by g + h), then improved by a short branch and bound on the
// flops; else a best-first search on the peak, whose
// first goal has the least peak of all (the sweep ends there). The sweep stops
// early once the budget is settled: a point at or under the budget proven
// cheapest at its level, followed by a proof that nothing below its peak costs
// as little (the truncated sweep picks the same plan as the whole one would);
// or at the first point under the budget that a feasibility search found
// (the sweep there has no cost order: the plan takes the points before it
// and that one, whatever was planned before, and never a higher peak for a
// lower budget, as every later point's peak is lower still).
#include <algorithm>
#include <bit>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "checkpoint/cache.hpp"
#include "checkpoint/planner.hpp"

namespace ad::planner {

namespace {

using Mask = std::uint64_t;
constexpr Mask bit(int k) { return Mask{1} << k; }
constexpr double kInf = std::numeric_limits<double>::infinity();

// One step of a search's path: compute a value, then free some (bits of the
// search's value index, the same in every Search of one problem).
struct Step {
  int via;
  Mask dropped;
};

struct Outcome {
  enum class Status { found, none, gave_up } status = Status::none;
  double cost = 0;         // recompute flops of the schedule found
  std::int64_t peak = 0;   // its peak in the search's model
  std::size_t expanded = 0;
  std::vector<Step> path;  // the schedule found, as steps
};

// Which of the problem's requirements a search meets: all of them, or (a
// schedule in two parts, "targets last") only the sinks, then only the targets
// from nothing present.
enum class Part { whole, sinks, targets };

class Search {
 public:
  explicit Search(const Problem& p, Part part = Part::whole) {
    std::vector<int> index(static_cast<std::size_t>(p.hi + 1), -1);
    for (auto v : p.order) {
      if (n_ == kExactValues) { usable_ = false; return; }
      index[static_cast<std::size_t>(v)] = n_++;
      id_.push_back(v);
    }
    auto n = static_cast<std::size_t>(n_);
    in_.assign(n, 0);
    anc_.assign(n, 0);
    group_.assign(n, 0);
    std::vector<int> root(n, -1);
    for (std::size_t k = 0; k < n; ++k) {
      auto v = static_cast<std::size_t>(id_[k]);
      const Node& nd = p.g.node(id_[k]);
      for (auto x : nd.inputs)
        if (int j = index[static_cast<std::size_t>(x)]; j >= 0) in_[k] |= bit(j);
      if (!op_def(nd.op).view) {
        root[k] = static_cast<int>(k);
        owners_ |= bit(static_cast<int>(k));
      } else if (int j = index[static_cast<std::size_t>(nd.inputs[0])]; j >= 0 && root[static_cast<std::size_t>(j)] >= 0) {
        root[k] = root[static_cast<std::size_t>(j)];  // shares that value's storage
      }  // else: a view of a leaf or of a value present before the run (not the graph's bytes)
      if (root[k] >= 0) group_[static_cast<std::size_t>(root[k])] |= bit(static_cast<int>(k));
      anc_[k] = bit(static_cast<int>(k));
      for (Mask m = in_[k]; m; m &= m - 1) anc_[k] |= anc_[static_cast<std::size_t>(std::countr_zero(m))];
      bytes_.push_back(p.bytes[v]);
      step_.push_back(p.bytes[v] + p.ws[v]);
      flops_.push_back(p.flops[v]);
      base_ += p.flops[v];
      if (part != Part::targets && p.is_sink(id_[k])) sinks_ |= bit(static_cast<int>(k));
      if (part != Part::sinks && p.is_target(id_[k])) targets_ |= bit(static_cast<int>(k));
    }
    for (std::size_t k = 0; k < n; ++k)
      if (group_[k] != bit(static_cast<int>(k)) && (owners_ & bit(static_cast<int>(k)))) shared_.push_back(static_cast<int>(k));
  }
  bool usable() const { return usable_; }
  bool has_sinks() const { return sinks_ != 0; }
  bool has_targets() const { return targets_ != 0; }
  // Appends a path's steps to b.
  void replay(Builder& b, const std::vector<Step>& path) const {
    for (const Step& st : path) {
      b.compute(id_[static_cast<std::size_t>(st.via)]);
      for (Mask f = st.dropped; f; f &= f - 1) b.free(id_[static_cast<std::size_t>(std::countr_zero(f))]);
    }
  }

  enum class Goal {
    cheapest,  // the least flops (then the least peak) with peak <= budget and recompute flops < below
    quick,     // some schedule with peak <= budget, cheap but not proven cheapest (weighted A*: g + 3h)
    lowest,    // the least peak (then flops) of any schedule with peak <= budget (best-first on the peak)
    deep,      // some schedule with peak <= budget, depth first (children by the least total flops, then
               // live bytes), then a short branch and bound on the flops for a cheaper one
  };
  Outcome run(Goal goal, std::int64_t budget, double below, std::size_t cap) const {
    std::vector<State> st;
    std::unordered_map<Key, std::uint32_t, KeyHash> seen;
    seen.reserve(std::min<std::size_t>(cap, 1 << 16));
    // ordered by (key, tie), then deeper (more flops done) first
    struct Item { double key, tie, g; std::uint32_t e; };
    auto later = [](const Item& a, const Item& b) {
      if (a.key != b.key) return a.key > b.key;
      if (a.tie != b.tie) return a.tie > b.tie;
      return a.g < b.g;
    };
    std::priority_queue<Item, std::vector<Item>, decltype(later)> open(later);
    double limit = below + base_;  // total flops to beat
    double child_depth = 0;                // deep: the depth of the children being pushed
    // deep: after its first goal, the search goes on for a quarter of the
    // states that took (at most 50,000) as a branch and bound on the flops:
    // cheaper paths reopen states, and a cheaper goal replaces the schedule
    bool bound = false;
    std::size_t extra = 0;
    auto push = [&](Mask P, Mask D, double g, std::int64_t live, std::int64_t bn, std::uint32_t from, int via, Mask dropped) {
      std::uint32_t e;
      double h;
      if (auto it = seen.find(Key{P, D}); it != seen.end()) {  // a known state: its heuristic is known too
        e = it->second;
        State& o = st[e];
        const bool better = goal == Goal::deep     ? bound && g < o.g
                            : goal == Goal::lowest ? bn < o.bn || (bn == o.bn && g < o.g)
                                                   : g < o.g || (g == o.g && bn < o.bn);
        if ((o.closed && !bound) || !better) return;
        h = o.h;
        if (g + h >= limit) return;
        o = {P, D, g, h, live, bn, from, via, dropped, false};
      } else {
        h = heuristic(P, D);
        if (g + h >= limit) return;
        e = static_cast<std::uint32_t>(st.size());
        seen.emplace(Key{P, D}, e);
        st.push_back({P, D, g, h, live, bn, from, via, dropped, false});
      }
      const auto b = static_cast<double>(bn);
      open.push(goal == Goal::cheapest ? Item{g + h, b, g, e}
                : goal == Goal::quick  ? Item{g + 3 * h, b, g, e}
                : goal == Goal::deep   ? Item{-child_depth, g + h + static_cast<double>(live) * 1e-9, g, e}
                                       : Item{b, g + h, g, e});
    };
    push(0, 0, 0, 0, 0, kNone, -1, 0);
    Outcome out;
    while (!open.empty()) {
      std::uint32_t e = open.top().e;
      child_depth = 1 - open.top().key;
      open.pop();
      if (st[e].closed) continue;
      st[e].closed = true;
      const State cur = st[e];
      const Mask R = required(cur.P, cur.D);
      if (!R) {
        out.status = Outcome::Status::found;
        out.cost = cur.g - base_;
        out.peak = cur.bn;
        out.path.clear();
        for (auto x = e; st[x].via >= 0; x = st[x].from) out.path.push_back({st[x].via, st[x].dropped});
        std::reverse(out.path.begin(), out.path.end());
        if (goal != Goal::deep) return out;
        if (!bound) extra = std::min<std::size_t>(out.expanded / 4, 50000);
        bound = true;
        limit = cur.g;
        continue;
      }
      if (bound && extra-- == 0) return out;
      if (++out.expanded > cap) {
        if (!bound) out.status = Outcome::Status::gave_up;
        return out;
      }
      for (Mask c = useful(R) & ~cur.P; c; c &= c - 1) {
        const int v = std::countr_zero(c);
        const auto uv = static_cast<std::size_t>(v);
        if (in_[uv] & ~cur.P) continue;  // an input is absent
        // a value some present view still shares is not recomputed (the
        // view would hold the old storage and the new one would cost twice)
        if (group_[uv] & cur.P) continue;
        const std::int64_t step = cur.live + step_[uv];
        if (step > budget) continue;
        const Mask P1 = cur.P | bit(v), D1 = cur.D | (sinks_ & bit(v));
        const Mask P2 = P1 & (useful(required(P1, D1)) | targets_);
        // frees right after this read: any of v's inputs, and v if it is a sink (accumulated)
        const Mask optional = (in_[uv] | (sinks_ & bit(v))) & P2 & ~targets_;
        const double g = cur.g + flops_[uv];
        const std::int64_t bn = std::max(cur.bn, step);
        for (Mask F = optional;; F = (F - 1) & optional) {
          const Mask P3 = P2 & ~F;
          push(P3, D1, g, mem(P3), bn, e, v, P1 & ~P3);
          if (!F) break;
        }
      }
    }
    return out;
  }

 private:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  struct Key {
    Mask P, D;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      std::uint64_t h = (k.P ^ (k.D * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
      return static_cast<std::size_t>(h ^ (h >> 31));
    }
  };
  struct State {
    Mask P, D;
    double g, h;     // flops so far; heuristic (a function of P and D)
    std::int64_t live, bn;
    std::uint32_t from;
    int via;         // value computed to reach this state (-1: the start)
    Mask dropped;    // values freed right after that compute
    bool closed;
  };

  Mask required(Mask P, Mask D) const { return (sinks_ & ~D) | (targets_ & ~P); }
  Mask useful(Mask R) const {
    Mask u = 0;
    for (; R; R &= R - 1) u |= anc_[static_cast<std::size_t>(std::countr_zero(R))];
    return u;
  }
  // live bytes: each storage once, while its value or any view of it is present
  std::int64_t mem(Mask P) const {
    std::int64_t m = 0;
    for (Mask q = P & owners_; q; q &= q - 1) m += bytes_[static_cast<std::size_t>(std::countr_zero(q))];
    for (int o : shared_)
      if (!(P & bit(o)) && (P & group_[static_cast<std::size_t>(o)])) m += bytes_[static_cast<std::size_t>(o)];
    return m;
  }
  double heuristic(Mask P, Mask D) const {
    Mask todo = required(P, D) & ~P;
    double h = 0;
    while (todo) {  // highest index first: inputs have lower indices
      const int k = 63 - std::countl_zero(todo);
      todo &= ~bit(k);
      todo |= in_[static_cast<std::size_t>(k)] & ~P;
      h += flops_[static_cast<std::size_t>(k)];
    }
    return h;
  }

  bool usable_ = true;
  int n_ = 0;
  std::vector<std::int32_t> id_;  // bit -> node id
  std::vector<Mask> in_, anc_;    // inputs among the values; ancestors, itself included
  std::vector<Mask> group_;       // per value that owns storage: it and the views that share it (else 0)
  Mask owners_ = 0;               // values that own their storage (not views)
  std::vector<int> shared_;       // owners some view shares
  std::vector<std::int64_t> bytes_, step_;
  std::vector<double> flops_;
  double base_ = 0;               // flops of computing every value once
  Mask sinks_ = 0, targets_ = 0;
};

// The sweep as a resumable sequence of frontier points: a plan takes points
// until its budget is settled; a later plan of the same problem (another
// budget) resumes where the last one stopped. Points depend on the problem
// only, so resuming yields exactly what one uninterrupted sweep would.
class Sweep {
 public:
  struct Point {
    double cost;          // recompute flops
    std::int64_t peak;    // simulated (with reuse_dying_inputs when the plan uses it)
    bool proven;          // the cheapest schedule whose peak fits the level it was searched at
    std::int32_t index;   // into schedules(), or -1: a fixed candidate (already in budget()'s list)
    std::int64_t level;   // the level it was searched at
  };
  Sweep(const Problem& p, std::vector<FixedPoint> fixed, std::int64_t top)
      : search_(p),
        sinks_part_(p, Part::sinks),
        targets_part_(p, Part::targets),
        fixed_(std::move(fixed)),
        lb_(p.lower_bound()),
        level_(top - 1),
        done_(!search_.usable()) {}
  std::mutex m;
  const std::vector<Point>& points() const { return points_; }
  // over, and its last level proved nothing fits below it: the least peak
  // of any schedule is level + 1
  bool least_proven() const { return done_ && least_proven_; }
  std::int64_t least() const { return level_ + 1; }
  const Schedule& schedule(std::int32_t i) const { return schedules_[static_cast<std::size_t>(i)]; }

  // Appends the next point; false when the sweep is over.
  bool next(const Problem& p, bool reuse) {
    while (!done_ && level_ >= lb_ && left_ + low_left_ > 0) {
      const FixedPoint* f = best_fixed(level_);
      Outcome r;
      r.status = Outcome::Status::gave_up;
      const Search* by = &search_;  // whose path r holds
      std::vector<Step> tail;       // targets last: the targets' part, after r's
      if (cheapest_ || f) {
        r = search_.run(Search::Goal::cheapest, level_, f ? f->cost : kInf, take(kExactStatesPerSearch));
        left_ -= std::min(left_, r.expanded);
        // the very first search is the cheapest of all: if it gives up, the
        // problem is beyond this tier's reach
        if (points_.empty() && r.status == Outcome::Status::gave_up) break;
      }
      Point pt{0, 0, false, -1, level_};
      bool last = false;  // the least peak is proven: nothing fits below it
      if (r.status == Outcome::Status::found) {
        pt.proven = true;
      } else if (f) {  // none cheaper than the fixed candidate (proven), or gave up
        pt = {f->cost, f->peak, r.status == Outcome::Status::none, -1, level_};
      } else if (r.status == Outcome::Status::none) {
        least_proven_ = true;  // no schedule fits the level: the least peak is just above it
        break;
      } else {
        // below every fixed candidate and out of reach of a min-cost search:
        // a cheap schedule that fits, else one with the targets last, else
        // any (depth first), else the one with the least peak of all
        cheapest_ = false;
        // These searches have no cost bound: one that ends without a
        // schedule has visited every state under the level, so nothing fits
        // there and the least peak is proven (the parts of targets last
        // prove nothing: they search a narrower space).
        const auto none = [](const Outcome& o) { return o.status == Outcome::Status::none; };
        r = search_.run(Search::Goal::quick, level_, kInf, take_low(kExactStatesPerSearch / 5));
        low_left_ -= std::min(low_left_, r.expanded);
        if (none(r)) { least_proven_ = true; break; }
        if (r.status != Outcome::Status::found && targets_last(r, tail)) by = &sinks_part_;
        if (r.status != Outcome::Status::found) {
          // any schedule, depth first (at most kExactStatesDeep states):
          // level by level, such points form a chain down towards the least
          // peak
          r = search_.run(Search::Goal::deep, level_, kInf, std::min(left_ + low_left_, kExactStatesDeep));
          spend(r.expanded);
          if (none(r)) { least_proven_ = true; break; }
        }
        if (r.status != Outcome::Status::found) {
          // else the least peak of all, from the states left (at most
          // kExactStatesDeep: each search's states stay in memory while it runs)
          r = search_.run(Search::Goal::lowest, level_, kInf, std::min(left_ + low_left_, kExactStatesDeep));
          spend(r.expanded);
          if (none(r)) { least_proven_ = true; break; }
          if (r.status != Outcome::Status::found) break;
          last = true;
        }
      }
      if (r.status == Outcome::Status::found) {
        Builder b(p);
        by->replay(b, r.path);
        targets_part_.replay(b, tail);
        Schedule s = b.finish();
        if (reuse) reuse_dying_inputs(p, s);
        pt.cost = s.recompute_flops;
        pt.peak = simulate_peak(p.g, s);
        if (pt.peak > level_) break;  // the search's memory model disagrees: keep only what is simulated
        pt.index = static_cast<std::int32_t>(schedules_.size());
        s.sinks.clear();  // kept past this plan: no hold on the user's parameters (each plan sets its own)
        schedules_.push_back(std::move(s));
      }
      points_.push_back(pt);
      level_ = pt.peak - 1;
      done_ = last;
      least_proven_ = last;
      return true;
    }
    done_ = true;
    return false;
  }

 private:
  // the cheapest fixed candidate (then the lowest peak) whose peak is <= level
  const FixedPoint* best_fixed(std::int64_t level) const {
    const FixedPoint* b = nullptr;
    for (const auto& f : fixed_)
      if (f.peak <= level && (!b || f.cost < b->cost || (f.cost == b->cost && f.peak < b->peak))) b = &f;
    return b;
  }

  std::size_t take(std::size_t n) const { return std::min(left_, n); }
  std::size_t take_low(std::size_t n) const { return std::min(low_left_, n); }
  void spend(std::size_t n) {  // from the reserve first, then the min-cost searches' states
    const std::size_t a = std::min(low_left_, n);
    low_left_ -= a;
    left_ -= std::min(left_, n - a);
  }

  // Targets last, at level_: the sinks first (by a search that never holds
  // a target: the cheapest within its share of states, else a weighted A*),
  // then the targets computed again from nothing present (searched first:
  // it is small, and without it the sinks' part is of no use). A target
  // held through the backward pass (the loss, say) adds its bytes to every
  // step there; computing it last trades a second forward pass for them.
  // On success r holds the sinks' path and tail the targets'.
  bool targets_last(Outcome& r, std::vector<Step>& tail) {
    if (!sinks_part_.has_sinks() || !targets_part_.has_targets()) return false;
    Outcome t = targets_part_.run(Search::Goal::cheapest, level_, kInf, take_low(kExactStatesPerSearch / 5));
    low_left_ -= std::min(low_left_, t.expanded);
    if (t.status != Outcome::Status::found) return false;
    Outcome a;
    for (auto [goal, cap] : {std::pair{Search::Goal::cheapest, kExactStatesPerSearch * 3 / 5},
                             std::pair{Search::Goal::quick, kExactStatesPerSearch / 5}}) {
      a = sinks_part_.run(goal, level_, kInf, take_low(cap));
      low_left_ -= std::min(low_left_, a.expanded);
      if (a.status == Outcome::Status::found) break;
    }
    if (a.status != Outcome::Status::found) return false;
    r = std::move(a);
    tail = std::move(t.path);
    return true;
  }

  Search search_, sinks_part_, targets_part_;
  std::vector<FixedPoint> fixed_;
  std::int64_t lb_, level_;
  std::size_t left_ = kExactStates;       // states left for the min-cost searches
  std::size_t low_left_ = kExactStatesLow;  // and for the feasibility searches below every fixed candidate
  bool cheapest_ = true;  // min-cost searches; after one gives up below every fixed candidate, feasibility only
  bool least_proven_ = false;  // the last search proved nothing fits below the last point
  bool done_;
  std::vector<Point> points_;
  std::vector<Schedule> schedules_;
};

// The last few sweeps, by problem (PlanCache's key) and reuse: planning the
// same step at several budgets runs one sweep.
class SweepMemo {
 public:
  std::shared_ptr<Sweep> get(const Problem& p, const std::vector<FixedPoint>& fixed, std::int64_t top, bool reuse) {
    std::vector<std::uint64_t> key = PlanCache::key(p.g, p.targets, p.sinks);
    key.push_back(reuse);
    key.push_back(static_cast<std::uint64_t>(p.boundary));  // where the forward pass ends among the targets
    std::lock_guard<std::mutex> lock(m_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->first == key) {
        entries_.splice(entries_.begin(), entries_, it);
        return entries_.front().second;
      }
    entries_.emplace_front(std::move(key), std::make_shared<Sweep>(p, fixed, top));
    if (entries_.size() > kCapacity) entries_.pop_back();
    return entries_.front().second;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(m_);
    entries_.clear();
  }

 private:
  static constexpr std::size_t kCapacity = 8;
  std::mutex m_;
  std::list<std::pair<std::vector<std::uint64_t>, std::shared_ptr<Sweep>>> entries_;
};

SweepMemo& memo() {
  static SweepMemo m;
  return m;
}

}  // namespace

void clear_exact_sweeps() { memo().clear(); }

Frontier exact_frontier(const Problem& p, const std::vector<FixedPoint>& fixed, std::int64_t top, std::int64_t bytes,
                        bool reuse) {
  Frontier out;
  if (p.order.size() > static_cast<std::size_t>(kExactValues)) return out;
  std::shared_ptr<Sweep> sweep = memo().get(p, fixed, top, reuse);
  std::lock_guard<std::mutex> lock(sweep->m);
  Sweep::Point settled{0, 0, false, -1, 0};  // a point at or under the budget, proven cheapest at its level
  for (std::size_t i = 0;; ++i) {
    if (i == sweep->points().size() && !sweep->next(p, reuse)) break;
    const Sweep::Point pt = sweep->points()[i];
    if (pt.index >= 0) {
      out.schedules.push_back(sweep->schedule(pt.index));
      out.schedules.back().sinks.clear();  // this plan's parameters
      for (const auto& sk : p.sinks) out.schedules.back().sinks.push_back(sk.param);
    }
    // proven cheapest at a level >= the budget: no schedule within the budget costs less
    if (pt.proven && pt.level >= bytes) out.proven_cost = std::max(out.proven_cost, pt.cost);
    // settled: the previous point fits the budget and was proven cheapest at
    // its level, and this one (searched just under its peak) proves nothing
    // below costs as little
    if (settled.proven && pt.proven && pt.cost > settled.cost) break;
    // below every fixed candidate (where the min-cost searches gave up): the
    // first schedule a feasibility search finds under the budget ends the
    // plan's part of the sweep. The points after it have lower peaks and are
    // found by searches without a cost bound; a plan takes the points up to
    // that one, the same ones whatever was planned before.
    if (pt.index >= 0 && !pt.proven && pt.peak <= bytes) break;
    settled = pt.peak <= bytes ? pt : Sweep::Point{0, 0, false, -1, 0};
  }
  if (sweep->least_proven()) {
    out.least_proven = true;
    out.least = sweep->least();
  }
  return out;
}

}  // namespace ad::planner
