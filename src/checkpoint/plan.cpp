// Policies turn a graph into a Schedule; the simulation predicts its peak.
// The planner reads only the graph's structure, metas and OpDef fields
// (view, saves, flops) — never an op by name.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "core/graph_impl.hpp"

namespace ad {

std::string Policy::name() const {
  switch (kind) {
    case Kind::keep_all: return "keep_all";
  }
  return "?";
}

namespace {

// keep_all: compute every needed node once, in graph (topological) order;
// free each value this run computed right after its last consumer, unless
// it is a target. Sinks are accumulated right after they are computed.
Schedule plan_keep_all(const GraphImpl& g, const std::vector<std::int32_t>& targets, const std::vector<Sink>& sinks) {
  std::int32_t hi = -1;
  for (auto t : targets) hi = std::max(hi, t);
  for (const auto& s : sinks) hi = std::max(hi, s.node);
  Schedule s;
  s.targets = targets;
  if (hi < 0) return s;
  auto n = static_cast<std::size_t>(hi) + 1;

  // needed: ancestors of targets/sinks that hold no value
  std::vector<char> needed(n, 0), is_target(n, 0), is_sink(n, 0);
  for (auto t : targets) { needed[static_cast<std::size_t>(t)] = 1; is_target[static_cast<std::size_t>(t)] = 1; }
  for (const auto& sk : sinks) needed[static_cast<std::size_t>(sk.node)] = is_sink[static_cast<std::size_t>(sk.node)] = 1;
  for (std::int32_t id = hi; id >= 0; --id) {
    auto u = static_cast<std::size_t>(id);
    if (!needed[u]) continue;
    const Node& nd = g.node(id);
    if (nd.value.defined()) { needed[u] = 0; continue; }  // already there: nothing to compute
    for (auto in : nd.inputs) needed[static_cast<std::size_t>(in)] = 1;
  }
  // last consumer of each value computed here
  std::vector<std::int32_t> last_use(n, -1);
  for (std::int32_t id = 0; id <= hi; ++id)
    if (needed[static_cast<std::size_t>(id)])
      for (auto in : g.node(id).inputs) last_use[static_cast<std::size_t>(in)] = id;
  // frees_after[c]: values whose last use is c (each listed once)
  std::vector<std::vector<std::int32_t>> frees_after(n);
  for (std::int32_t id = 0; id <= hi; ++id) {
    auto u = static_cast<std::size_t>(id);
    if (!needed[u] || is_target[u]) continue;
    if (last_use[u] >= 0) frees_after[static_cast<std::size_t>(last_use[u])].push_back(id);
  }
  s.steps.reserve(3 * n);
  // A sink may feed several parameters (e.g. loss = p + q shares one
  // gradient node), and may already hold a value (then it is not recomputed).
  auto accumulate = [&](std::int32_t id) {
    for (std::size_t i = 0; i < sinks.size(); ++i)
      if (sinks[i].node == id) s.steps.push_back({Step::Kind::accumulate, id, static_cast<std::int32_t>(i)});
  };
  for (std::size_t i = 0; i < sinks.size(); ++i) s.sinks.push_back(sinks[i].param);
  for (std::int32_t id = 0; id <= hi; ++id) {
    auto u = static_cast<std::size_t>(id);
    if (is_sink[u] && !needed[u]) accumulate(id);  // value present before the run
  }
  for (std::int32_t id = 0; id <= hi; ++id) {
    auto u = static_cast<std::size_t>(id);
    if (!needed[u]) continue;
    s.steps.push_back({Step::Kind::compute, id});
    if (is_sink[u]) {
      accumulate(id);
      if (!is_target[u] && last_use[u] < 0) s.steps.push_back({Step::Kind::free, id});
    }
    for (auto f : frees_after[u]) s.steps.push_back({Step::Kind::free, f});
  }
  return s;
}

}  // namespace

Schedule plan(GraphImpl& g, const std::vector<std::int32_t>& targets, const std::vector<Sink>& sinks,
              const Policy& policy) {
  for (auto t : targets)
    if (t < 0 || static_cast<std::size_t>(t) >= g.nodes.size()) throw Error(fmt::format("plan: target {} is not a node", t));
  Schedule s;
  switch (policy.kind) {
    case Policy::Kind::keep_all: s = plan_keep_all(g, targets, sinks); break;
  }
  s.predicted_peak_bytes = simulate_peak(g, s);
  return s;
}

// Storage-exact simulation, replaying what the executor allocates. Each
// allocation is a storage instance with a reference count: computing a
// non-view node makes a new instance; a view node references its input's
// current instance; a node's previous value is released after its new one is
// made; a free drops the node's reference. So a base recomputed while a view
// still holds its old storage costs new bytes, as it does at run time.
// Values present before the run keep their real storage: they count only if
// the graph's allocator holds them, and one also held outside the graph (the
// user kept a copy of the Tensor) is never released by a free.
std::int64_t simulate_peak(const GraphImpl& g, const Schedule& s) {
  struct Instance { std::int64_t bytes; std::int32_t refs; bool pinned; };
  std::size_t n = g.nodes.size();
  std::vector<Instance> inst;
  std::vector<std::int32_t> holds(n, -1);  // instance held by each node's value
  std::unordered_map<const Storage*, std::int32_t> existing;
  for (std::size_t i = 0; i < n; ++i) {
    const Tensor& v = g.nodes[i].value;
    if (!v.defined()) continue;
    const Storage* st = v.storage().get();
    auto [it, fresh] = existing.try_emplace(st, static_cast<std::int32_t>(inst.size()));
    if (fresh)
      inst.push_back({st->allocator() == g.alloc ? static_cast<std::int64_t>(st->bytes()) : 0, 0, false});
    ++inst[static_cast<std::size_t>(it->second)].refs;
    holds[i] = it->second;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (holds[i] < 0) continue;
    Instance& in = inst[static_cast<std::size_t>(holds[i])];
    in.pinned = g.nodes[i].value.storage().use_count() > in.refs;
  }
  std::int64_t live = 0, peak = 0;
  auto release = [&](std::int32_t k) {
    if (k < 0) return;
    Instance& in = inst[static_cast<std::size_t>(k)];
    if (--in.refs == 0 && !in.pinned) live -= in.bytes;
  };
  auto name = [&](std::int32_t id) { return fmt::format("{}#{}", op_def(g.node(id).op).name, id); };
  std::vector<const Meta*> metas;
  for (const Step& st : s.steps) {
    if (st.node < 0 || static_cast<std::size_t>(st.node) >= n)
      throw Error(fmt::format("simulate_peak: a step names node {}, not a node of the graph", st.node));
    auto u = static_cast<std::size_t>(st.node);
    switch (st.kind) {
      case Step::Kind::compute: {
        const Node& nd = g.nodes[u];
        const OpDef& def = op_def(nd.op);
        if (!def.cpu)
          throw Error(fmt::format("simulate_peak: {} is a leaf and cannot be computed (bad schedule)", name(st.node)));
        for (auto in : nd.inputs)
          if (holds[static_cast<std::size_t>(in)] < 0)
            throw Error(fmt::format("simulate_peak: {} needs input {} which holds no value (bad schedule)",
                                    name(st.node), name(in)));
        std::int32_t now;
        if (def.view) {
          now = holds[static_cast<std::size_t>(nd.inputs[0])];
          ++inst[static_cast<std::size_t>(now)].refs;
        } else {
          now = static_cast<std::int32_t>(inst.size());
          inst.push_back({static_cast<std::int64_t>(nd.meta.nbytes()), 1, false});
          live += inst.back().bytes;
        }
        std::int64_t ws = 0;
        if (def.workspace) {
          metas.clear();
          for (auto in : nd.inputs) metas.push_back(&g.node(in).meta);
          ws = std::max<std::int64_t>(def.workspace(InferArgs{def, metas, nd.attrs}, nd.meta), 0);
        }
        peak = std::max(peak, live + ws);
        release(holds[u]);  // the executor replaces the old value after making the new one
        holds[u] = now;
        break;
      }
      case Step::Kind::free:
        release(holds[u]);
        holds[u] = -1;
        break;
      case Step::Kind::accumulate:
        if (holds[u] < 0)
          throw Error(fmt::format("simulate_peak: accumulate of {} which holds no value (bad schedule)", name(st.node)));
        break;
    }
  }
  return peak;
}

}  // namespace ad
