// Policies turn a graph into a Schedule; the simulation predicts its peak.
// The planner reads only the graph's structure, metas and OpDef fields
// (view, saves, flops) — never an op by name.
#include <fmt/format.h>

#include <algorithm>

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

// Storage-exact simulation: a view op's value shares its input's storage, so
// bytes are released only when the last node holding that storage is freed.
// Leaves hold user memory, which the graph's allocator does not count.
std::int64_t simulate_peak(const GraphImpl& g, const Schedule& s) {
  std::size_t n = g.nodes.size();
  std::vector<std::int32_t> owner(n);
  std::vector<std::int64_t> bytes(n, 0);
  std::vector<std::int32_t> refs(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    const OpDef& def = op_def(nd.op);
    owner[i] = def.view ? owner[static_cast<std::size_t>(nd.inputs[0])] : static_cast<std::int32_t>(i);
    if (!def.view && !g.is_leaf(static_cast<std::int32_t>(i))) bytes[i] = static_cast<std::int64_t>(nd.meta.nbytes());
    if (nd.value.defined()) ++refs[static_cast<std::size_t>(owner[i])];
  }
  std::int64_t live = 0, peak = 0;
  std::vector<const Meta*> metas;
  for (const Step& st : s.steps) {
    auto u = static_cast<std::size_t>(st.node);
    auto o = static_cast<std::size_t>(owner[u]);
    switch (st.kind) {
      case Step::Kind::compute: {
        const Node& nd = g.nodes[u];
        const OpDef& def = op_def(nd.op);
        if (refs[o]++ == 0) live += bytes[o];
        std::int64_t ws = 0;
        if (def.workspace) {
          metas.clear();
          for (auto in : nd.inputs) metas.push_back(&g.node(in).meta);
          ws = def.workspace(InferArgs{def, metas, nd.attrs}, nd.meta);
        }
        peak = std::max(peak, live + ws);
        break;
      }
      case Step::Kind::free:
        if (--refs[o] == 0) live -= bytes[o];
        break;
      case Step::Kind::accumulate: break;
    }
  }
  return peak;
}

}  // namespace ad
