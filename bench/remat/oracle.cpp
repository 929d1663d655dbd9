// The exact oracle: see oracle.hpp for the space searched and why the
// reductions are sound.
#include "oracle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <queue>
#include <vector>

#include "checkpoint/planner.hpp"
#include "core/graph_impl.hpp"

namespace remat_bench {

namespace {
using Mask = std::uint64_t;
constexpr Mask bit(int k) { return Mask{1} << k; }

// Open-addressing map (P, D) -> entry index; grows at load 1/2.
class StateMap {
 public:
  StateMap() : slots_(1 << 16, kEmpty) {}
  // index of (p, d), or the fresh index `next` after inserting it
  std::uint32_t find_or_insert(Mask p, Mask d, std::uint32_t next, const std::vector<Mask>& ps,
                               const std::vector<Mask>& ds, bool& fresh) {
    if (2 * (count_ + 1) > slots_.size()) grow(ps, ds);
    std::size_t i = hash(p, d) & (slots_.size() - 1);
    while (slots_[i] != kEmpty) {
      std::uint32_t e = slots_[i];
      if (ps[e] == p && ds[e] == d) { fresh = false; return e; }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = next;
    ++count_;
    fresh = true;
    return next;
  }

 private:
  static constexpr std::uint32_t kEmpty = 0xffffffffu;
  static std::size_t hash(Mask p, Mask d) {
    std::uint64_t h = p * 0x9E3779B97F4A7C15ull ^ (d + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
  void grow(const std::vector<Mask>& ps, const std::vector<Mask>& ds) {
    std::vector<std::uint32_t> old(slots_.size() * 2, kEmpty);
    old.swap(slots_);
    for (auto e : old) {
      if (e == kEmpty) continue;
      std::size_t i = hash(ps[e], ds[e]) & (slots_.size() - 1);
      while (slots_[i] != kEmpty) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = e;
    }
  }
  std::vector<std::uint32_t> slots_;
  std::size_t count_ = 0;
};
}  // namespace

struct Oracle::Impl {
  const ad::planner::Problem& p;
  int n = 0;
  std::vector<std::int32_t> id;   // bit -> node id
  std::vector<Mask> in, anc;      // inputs that are values to compute; ancestors (with itself)
  std::vector<std::int64_t> bytes, ws;
  std::vector<double> flops;
  Mask sinks = 0, targets = 0;
  double base = 0;

  explicit Impl(const ad::planner::Problem& prob) : p(prob) {
    std::vector<int> index(static_cast<std::size_t>(p.hi + 1), -1);
    for (auto v : p.order) {
      const ad::Node& nd = p.g.node(v);
      if (ad::op_def(nd.op).view) throw ad::Error(fmt::format("oracle: view op {}#{} not modelled", ad::op_def(nd.op).name, v));
      if (n == 64) throw ad::Error("oracle: more than 64 values to compute");
      index[static_cast<std::size_t>(v)] = n++;
      id.push_back(v);
    }
    for (std::int32_t v = 0; v <= p.hi; ++v)
      if (p.g.node(v).value.defined() && p.g.node(v).value.storage()->allocator() == p.g.alloc)
        throw ad::Error(fmt::format("oracle: node {} holds a graph-allocated value before the run", v));
    in.assign(static_cast<std::size_t>(n), 0);
    anc.assign(static_cast<std::size_t>(n), 0);
    for (int k = 0; k < n; ++k) {
      auto v = static_cast<std::size_t>(id[static_cast<std::size_t>(k)]);
      for (auto x : p.g.node(static_cast<std::int32_t>(v)).inputs) {
        int j = index[static_cast<std::size_t>(x)];
        if (j >= 0) in[static_cast<std::size_t>(k)] |= bit(j);
      }
      anc[static_cast<std::size_t>(k)] = bit(k);
      for (Mask m = in[static_cast<std::size_t>(k)]; m; m &= m - 1)
        anc[static_cast<std::size_t>(k)] |= anc[static_cast<std::size_t>(std::countr_zero(m))];
      bytes.push_back(p.bytes[v]);
      ws.push_back(p.ws[v]);
      flops.push_back(p.flops[v]);
      base += p.flops[v];
      if (p.is_sink(static_cast<std::int32_t>(v))) sinks |= bit(k);
      if (p.is_target(static_cast<std::int32_t>(v))) targets |= bit(k);
    }
  }

  Mask required(Mask P, Mask D) const { return (sinks & ~D) | (targets & ~P); }
  Mask useful(Mask R) const {
    Mask u = 0;
    for (; R; R &= R - 1) u |= anc[static_cast<std::size_t>(std::countr_zero(R))];
    return u;
  }
  std::int64_t mem(Mask P) const {
    std::int64_t m = 0;
    for (; P; P &= P - 1) m += bytes[static_cast<std::size_t>(std::countr_zero(P))];
    return m;
  }
  // flops of the absent values that must still be computed
  double heuristic(Mask P, Mask D) const {
    Mask M = required(P, D) & ~P;
    double h = 0;
    for (int k = n - 1; k >= 0; --k)
      if (M & bit(k)) {
        M |= in[static_cast<std::size_t>(k)] & ~P;
        h += flops[static_cast<std::size_t>(k)];
      }
    return h;
  }

  std::int64_t bytes_of(Mask m) const { return mem(m); }
  // Calls fn(F) for each inclusion-minimal F within `from` with bytes(F) >= need
  // (F = 0 when need <= 0).
  template <class Fn> void minimal_sets(Mask from, std::int64_t need, Fn&& fn) const {
    if (need <= 0) { fn(Mask{0}); return; }
    std::vector<int> c;
    for (Mask m = from; m; m &= m - 1)
      if (bytes[static_cast<std::size_t>(std::countr_zero(m))] > 0) c.push_back(std::countr_zero(m));
    std::vector<std::int64_t> rest(c.size() + 1, 0);
    for (std::size_t i = c.size(); i-- > 0;) rest[i] = rest[i + 1] + bytes[static_cast<std::size_t>(c[i])];
    auto rec = [&](auto&& self, std::size_t i, Mask F, std::int64_t got) -> void {
      if (got >= need) {
        for (Mask m = F; m; m &= m - 1)  // minimal: dropping any member falls short
          if (got - bytes[static_cast<std::size_t>(std::countr_zero(m))] >= need) return;
        fn(F);
        return;
      }
      if (i == c.size() || got + rest[i] < need) return;
      self(self, i + 1, F | bit(c[i]), got + bytes[static_cast<std::size_t>(c[i])]);
      self(self, i + 1, F, got);
    };
    rec(rec, 0, 0, 0);
  }

  // mode 0: min total flops with every step's memory <= budget (A*);
  // mode 1: min bottleneck (largest step memory); mode 2: any schedule within
  // budget (best-first on the heuristic). lazy: frees under pressure only.
  OracleResult search(int mode, std::int64_t budget, std::size_t max_states, bool lazy) const {
    std::vector<Mask> ps, ds, freed, pre;  // pre: freed before the compute, freed: after it
    std::vector<double> g;
    std::vector<std::int64_t> bott;
    std::vector<std::uint32_t> parent;
    std::vector<std::int8_t> via;
    std::vector<char> closed;
    StateMap map;
    struct Item { double key; double tie; std::uint32_t e; };
    auto worse = [](const Item& a, const Item& b) { return a.key != b.key ? a.key > b.key : a.tie > b.tie; };
    std::priority_queue<Item, std::vector<Item>, decltype(worse)> open(worse);
    auto add = [&](Mask P, Mask D, double cost, std::int64_t bn, std::uint32_t par, int v, Mask before, Mask fr) {
      bool fresh;
      auto e = map.find_or_insert(P, D, static_cast<std::uint32_t>(ps.size()), ps, ds, fresh);
      double key = mode == 0 ? cost + heuristic(P, D) : mode == 2 ? heuristic(P, D) : static_cast<double>(bn);
      if (fresh) {
        ps.push_back(P); ds.push_back(D); g.push_back(cost); bott.push_back(bn);
        parent.push_back(par); via.push_back(static_cast<std::int8_t>(v)); pre.push_back(before); freed.push_back(fr);
        closed.push_back(0);
      } else {
        bool better = mode == 1 ? bn < bott[e] : cost < g[e];
        if (closed[e] || !better) return;
        g[e] = cost; bott[e] = bn; parent[e] = par; via[e] = static_cast<std::int8_t>(v); pre[e] = before; freed[e] = fr;
      }
      open.push({key, mode == 0 ? -cost : cost, e});
    };
    add(0, 0, 0, 0, 0xffffffffu, -1, 0, 0);
    OracleResult res;
    std::size_t expanded = 0;
    while (!open.empty()) {
      Item it = open.top();
      open.pop();
      auto e = it.e;
      if (closed[e]) continue;
      closed[e] = 1;
      const Mask P = ps[e], D = ds[e];
      const Mask R = required(P, D);
      if (!R) {
        res.status = OracleResult::Status::optimal;
        res.total_flops = g[e];
        res.recompute_flops = g[e] - base;
        res.states = expanded;
        res.schedule = rebuild(e, parent, via, pre, freed);
        res.peak = ad::simulate_peak(p.g, res.schedule);
        return res;
      }
      if (++expanded > max_states) { res.status = OracleResult::Status::gave_up; res.states = expanded; return res; }
      const std::int64_t live = mem(P);
      const double cost = g[e];
      const std::int64_t bn = bott[e];
      for (Mask cand = useful(R) & ~P; cand; cand &= cand - 1) {
        int v = std::countr_zero(cand);
        auto uv = static_cast<std::size_t>(v);
        if (in[uv] & ~P) continue;  // an input is absent
        std::int64_t step = live + bytes[uv] + ws[uv];
        const Mask D1 = D | (sinks & bit(v));
        if (lazy) {
          // free only under pressure: each inclusion-minimal set F of present
          // values (not v's inputs, not targets) whose bytes make v fit
          const std::int64_t need = step - budget;
          const Mask U1 = useful(required(P | bit(v), D1)) | targets;
          minimal_sets(P & ~targets & ~in[uv], need, [&](Mask F) {
            const Mask P1 = (P & ~F) | bit(v), P2 = P1 & U1;
            add(P2, D1, cost + flops[uv], std::max(bn, step - bytes_of(F)), e, v, F, P1 & ~P2);
          });
          continue;
        }
        if (mode == 0 && step > budget) continue;
        const Mask P1 = P | bit(v);
        const Mask U1 = useful(required(P1, D1)) | targets;
        const Mask freeable = in[uv] & ~targets & U1;
        // every subset F of freeable (reduction 1), then drop what is useless (reduction 2)
        for (Mask F = freeable;; F = (F - 1) & freeable) {
          Mask P2 = P1 & ~F & U1;
          add(P2, D1, cost + flops[uv], std::max(bn, step), e, v, 0, P1 & ~P2);
          if (!F) break;
        }
      }
    }
    res.status = OracleResult::Status::infeasible;
    res.states = expanded;
    return res;
  }

  ad::Schedule rebuild(std::uint32_t e, const std::vector<std::uint32_t>& parent, const std::vector<std::int8_t>& via,
                       const std::vector<Mask>& pre, const std::vector<Mask>& freed) const {
    std::vector<std::uint32_t> path;
    for (auto x = e; via[x] >= 0; x = parent[x]) path.push_back(x);
    std::reverse(path.begin(), path.end());
    ad::Schedule s;
    s.targets = p.targets;
    for (const auto& sk : p.sinks) s.sinks.push_back(sk.param);
    std::vector<char> done(static_cast<std::size_t>(n), 0);
    for (auto x : path) {
      int v = via[x];
      auto node = id[static_cast<std::size_t>(v)];
      for (Mask f = pre[x]; f; f &= f - 1) s.steps.push_back({ad::Step::Kind::free, id[static_cast<std::size_t>(std::countr_zero(f))]});
      // a sink's first compute goes straight into its parameter's gradient when the planner would do so
      s.steps.push_back({ad::Step::Kind::compute, node, done[static_cast<std::size_t>(v)] ? -1 : p.in_place[static_cast<std::size_t>(node)]});
      if (done[static_cast<std::size_t>(v)]) {
        ++s.recomputed_nodes;
        s.recompute_flops += flops[static_cast<std::size_t>(v)];
      } else if (sinks & bit(v)) {
        for (std::size_t i = 0; i < p.sinks.size(); ++i)
          if (p.sinks[i].node == node) s.steps.push_back({ad::Step::Kind::accumulate, node, static_cast<std::int32_t>(i)});
      }
      done[static_cast<std::size_t>(v)] = 1;
      for (Mask f = freed[x]; f; f &= f - 1) s.steps.push_back({ad::Step::Kind::free, id[static_cast<std::size_t>(std::countr_zero(f))]});
    }
    s.policy = "oracle";
    return s;
  }
};

Oracle::Oracle(const ad::planner::Problem& p) : impl_(new Impl(p)) {}
Oracle::~Oracle() { delete impl_; }
OracleResult Oracle::min_cost(std::int64_t budget, std::size_t max_states, bool lazy) const {
  return impl_->search(0, budget, max_states, lazy);
}
OracleResult Oracle::feasible(std::int64_t budget, std::size_t max_states) const { return impl_->search(2, budget, max_states, true); }
OracleResult Oracle::min_peak(std::size_t max_states, std::int64_t feasible_hint) const {
  // Bisection on the budget between the largest single step (no schedule needs
  // less) and a known feasible peak; each feasible probe's schedule tightens the
  // upper end to its actual peak. The bottleneck search (mode 1) gives the same
  // answer in one pass but over many more states.
  std::int64_t lo = impl_->p.lower_bound(), hi = feasible_hint;
  OracleResult best = impl_->search(2, hi, max_states, true);
  if (best.status != OracleResult::Status::optimal) return best;
  hi = best.peak;
  std::size_t states = best.states;
  bool exact = true;
  while (lo < hi) {
    std::int64_t mid = lo + (hi - lo) / 2;
    OracleResult r = impl_->search(2, mid, max_states, true);
    states += r.states;
    if (r.status == OracleResult::Status::optimal) { hi = r.peak; best = std::move(r); }
    else if (r.status == OracleResult::Status::infeasible) lo = mid + 1;
    else { exact = false; lo = mid + 1; }  // unknown below mid: hi stays a feasible upper bound
  }
  best.states = states;
  // optimal: best.peak is the least peak; gave_up: a feasible peak, not proven least
  best.status = exact ? OracleResult::Status::optimal : OracleResult::Status::gave_up;
  return best;  // its cost is not minimised: use min_cost(peak)
}
OracleResult Oracle::min_peak_bottleneck(std::size_t max_states) const { return impl_->search(1, 0, max_states, false); }
int Oracle::values() const { return impl_->n; }
double Oracle::base_flops() const { return impl_->base; }

}  // namespace remat_bench
