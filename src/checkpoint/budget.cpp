// policy::budget — the cheapest schedule (by recompute flops) whose exactly
// simulated peak fits the budget.
//
// Candidates form a fixed list that does not depend on the budget: keep_all,
// keep sets that drop the forward values cheapest to recompute per byte,
// uniform keep sets, and DTR-style schedules (evict the value with the lowest
// cost / (bytes x staleness) when memory runs out) simulated at a ladder of
// memory levels from the lower bound up to the keep_all peak, and, for
// chain-shaped graphs, binomial (Revolve) schedules. Each candidate's
// peak is simulated exactly; the plan for a budget B is the first candidate,
// in (recompute cost, peak) order, whose peak is <= B. When none fits, a
// second tier: the DTR schedules a bisection over memory levels finds between
// the lower bound and the least fixed peak, again in (cost, peak) order; the
// least of their peaks is the minimum feasible budget stated when B is below
// it. Neither tier depends on B, so lowering the budget never raises the
// peak, and every budget at or above the stated minimum plans. (A DTR run at
// level B itself would not do: DTR is greedy, and can get stuck at a level
// above one where it succeeds.)
#include <algorithm>
#include <cmath>
#include <optional>

#include "checkpoint/planner.hpp"

namespace ad::planner {

namespace {

// Plans one DTR run at memory level `limit`; nullopt when it gets stuck
// (every present value is in use by the op being computed).
class Dtr {
 public:
  Dtr(const Problem& p, std::int64_t limit) : p_(p), b_(p), limit_(limit) {
    auto n = static_cast<std::size_t>(p.hi + 1);
    lock_.assign(n, 0);
    last_.assign(n, 0);
    view_refs_.assign(n, 0);
    base_.resize(n);
    for (std::int32_t id = 0; id <= p.hi; ++id) {
      const Node& nd = p.g.node(id);
      base_[static_cast<std::size_t>(id)] = op_def(nd.op).view ? base_[static_cast<std::size_t>(nd.inputs[0])] : id;
    }
  }

  std::optional<Schedule> run() {
    std::vector<std::int32_t> touched, cand;
    for (auto d : p_.order) {
      touched.clear();
      if (!ensure(d, touched)) return std::nullopt;
      cand.clear();
      cand.push_back(d);
      for (auto t : touched) {
        cand.push_back(t);
        for (auto in : p_.g.node(t).inputs) cand.push_back(in);
      }
      for (auto u : cand)
        if (b_.present(u) && !p_.pinned[static_cast<std::size_t>(u)] && b_.next_use(u, d) < 0) release(u);
    }
    return b_.finish();
  }

 private:
  bool is_view(std::int32_t id) const { return base_[static_cast<std::size_t>(id)] != id; }

  bool ensure(std::int32_t v, std::vector<std::int32_t>& touched) {
    auto u = static_cast<std::size_t>(v);
    if (b_.present(v)) { last_[u] = ++clock_; return true; }
    const Node& nd = p_.g.node(v);
    std::size_t locked = 0;
    bool ok = true;
    for (auto in : nd.inputs) {
      if (!ensure(in, touched)) { ok = false; break; }
      ++lock_[static_cast<std::size_t>(in)];
      ++locked;
    }
    std::int64_t need = p_.bytes[u] + p_.ws[u];
    while (ok && live_ + need > limit_) ok = evict_one();
    if (ok) {
      b_.compute(v);
      touched.push_back(v);
      if (is_view(v)) ++view_refs_[static_cast<std::size_t>(base_[u])];
      else live_ += p_.bytes[u];
      last_[u] = ++clock_;
    }
    for (std::size_t i = 0; i < locked; ++i) --lock_[static_cast<std::size_t>(nd.inputs[i])];
    return ok;
  }

  void release(std::int32_t v) {
    auto u = static_cast<std::size_t>(v);
    b_.free(v);
    if (is_view(v)) --view_refs_[static_cast<std::size_t>(base_[u])];
    else live_ -= p_.bytes[u];
  }

  // Evicts the value with the lowest cost / (bytes x staleness); false if none can go.
  bool evict_one() {
    std::int32_t best = -1;
    double best_h = 0;
    for (auto id : p_.order) {
      auto u = static_cast<std::size_t>(id);
      // only forward values: recomputing a gradient value would replay the backward pass behind it
      if (id > p_.boundary) break;
      if (!b_.present(id) || p_.pinned[u] || lock_[u] || is_view(id) || view_refs_[u] || p_.bytes[u] == 0) continue;
      double stale = static_cast<double>(clock_ - last_[u] + 1);
      double h = (p_.flops[u] + 1.0) / (static_cast<double>(p_.bytes[u]) * stale);
      if (best < 0 || h < best_h) { best = id; best_h = h; }
    }
    if (best < 0) return false;
    release(best);
    return true;
  }

  const Problem& p_;
  Builder b_;
  std::int64_t limit_;
  std::int64_t live_ = 0;
  std::int64_t clock_ = 0;
  std::vector<std::int32_t> lock_, base_, view_refs_;
  std::vector<std::int64_t> last_;
};

// 1, 2, 3, ... growing by ~25% up to n (inclusive)
std::vector<std::int64_t> ladder(std::int64_t n) {
  std::vector<std::int64_t> v;
  for (double x = 1; static_cast<std::int64_t>(x) <= n; x = std::max(x + 1, x * 1.25)) v.push_back(static_cast<std::int64_t>(x));
  if (v.empty() || v.back() != n) v.push_back(n);
  return v;
}

struct Candidate {
  Schedule s;
  std::int64_t peak;
  std::size_t index;
};

}  // namespace

Schedule budget(const Problem& p, std::int64_t bytes) {
  std::vector<Candidate> cands;
  auto add = [&](Schedule s) {
    std::int64_t pk = simulate_peak(p.g, s);
    cands.push_back({std::move(s), pk, cands.size()});
  };
  std::vector<char> all(static_cast<std::size_t>(p.hi + 1), 1);
  add(keep_set(p, all));
  if (cands[0].peak <= bytes) return std::move(cands[0].s);  // nothing cheaper than no recomputation

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
    add(keep_set(p, keep));
  }
  for (auto k : ladder(n)) {  // keep every k-th
    if (k < 2) continue;
    std::vector<char> keep(all.size(), 0);
    for (std::int64_t i = 0; i < n; ++i)
      if ((i + 1) % k == 0) keep[static_cast<std::size_t>(fs[static_cast<std::size_t>(i)])] = 1;
    add(keep_set(p, keep));
  }
  std::int64_t lb = p.lower_bound(), top = cands[0].peak;
  constexpr int kRungs = 12;
  for (int r = 0; r <= kRungs; ++r) {
    double level = static_cast<double>(lb) * std::pow(static_cast<double>(top) / static_cast<double>(std::max<std::int64_t>(lb, 1)),
                                                      static_cast<double>(r) / kRungs);
    if (auto s = Dtr(p, r == 0 ? lb : static_cast<std::int64_t>(level)).run()) add(std::move(*s));
  }
  // chains: binomial (Revolve) schedules with growing numbers of snapshots
  bool chain = true;
  for (auto k : ladder(static_cast<std::int64_t>(p.forward.size()))) {
    if (!chain || k > 64) break;
    try {
      add(optimal_chain(p, static_cast<std::int32_t>(k)));
    } catch (const Error&) {
      chain = false;  // not a chain: no Revolve candidates
    }
  }
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    if (a.s.recompute_flops != b.s.recompute_flops) return a.s.recompute_flops < b.s.recompute_flops;
    if (a.peak != b.peak) return a.peak < b.peak;
    return a.index < b.index;
  });
  for (auto& c : cands)
    if (c.peak <= bytes) return std::move(c.s);
  std::int64_t best = cands[0].peak;
  for (const auto& c : cands) best = std::min(best, c.peak);
  // Second tier: DTR schedules at the levels a bisection for the least level
  // that still fits visits (independent of the budget).
  std::vector<Candidate> low;
  for (std::int64_t lo = lb, hi = best; lo < hi;) {
    std::int64_t mid = lo + (hi - lo) / 2;
    auto s = Dtr(p, mid).run();
    std::int64_t pk = s ? simulate_peak(p.g, *s) : -1;
    if (s && pk <= mid) {
      best = std::min(best, pk);
      hi = std::min(mid, pk);
      low.push_back({std::move(*s), pk, low.size()});
    } else {
      lo = mid + 1;
    }
  }
  std::stable_sort(low.begin(), low.end(), [](const Candidate& a, const Candidate& b) {
    if (a.s.recompute_flops != b.s.recompute_flops) return a.s.recompute_flops < b.s.recompute_flops;
    if (a.peak != b.peak) return a.peak < b.peak;
    return a.index < b.index;
  });
  for (auto& c : low)
    if (c.peak <= bytes) return std::move(c.s);
  throw Error(fmt::format("budget: {} B is below the minimum feasible peak of {} B for this step "
                          "(its largest single step alone needs {} B)",
                          bytes, best, lb));
}

}  // namespace ad::planner
