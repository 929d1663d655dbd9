// explain(plan): per node, what the schedule does with its value and why.
#include <fmt/format.h>

#include "core/graph_impl.hpp"

namespace ad {

std::string explain(const Plan& plan) {
  if (!plan.graph) throw Error("explain: empty plan");
  const GraphImpl& g = *plan.graph;
  const Schedule& s = plan.schedule;
  std::int32_t hi = -1;
  for (const auto& st : s.steps) hi = std::max(hi, st.node);
  for (auto t : s.targets) hi = std::max(hi, t);
  auto n = static_cast<std::size_t>(hi + 1);
  std::vector<std::int32_t> computes(n, 0), frees_before_reuse(n, 0);
  std::vector<char> present(n, 0), is_target(n, 0), compressed(n, 0);
  for (auto t : s.targets) is_target[static_cast<std::size_t>(t)] = 1;
  for (const auto& st : s.steps) {
    auto u = static_cast<std::size_t>(st.node);
    if (st.kind == Step::Kind::compute) {
      if (computes[u] > 0 && !present[u]) ++frees_before_reuse[u];
      ++computes[u];
      present[u] = 1;
    } else if (st.kind == Step::Kind::free) {
      present[u] = 0;
    } else if (st.kind == Step::Kind::compress) {
      compressed[u] = 1;
    }
  }
  std::int32_t boundary = -1;
  for (auto t : s.targets) boundary = std::max(boundary, t);
  std::string out = fmt::format("plan: {} — predicted peak {} B, {} steps, {} recomputations ({:.3g} extra flops)\n\n",
                                s.policy, s.predicted_peak_bytes, s.steps.size(), s.recomputed_nodes, s.recompute_flops);
  out += "| node | op | value | bytes | computed | fate | why |\n|---|---|---|---|---|---|---|\n";
  for (std::size_t i = 0; i < n; ++i) {
    if (!computes[i]) continue;
    const Node& nd = g.nodes[i];
    const OpDef& def = op_def(nd.op);
    bool fwd = static_cast<std::int32_t>(i) <= boundary;
    std::string fate, why;
    if (is_target[i]) {
      fate = "kept (output)";
      why = "a target of the step";
    } else if (frees_before_reuse[i]) {
      fate = fmt::format("deleted, recomputed x{}", computes[i] - 1);
      why = def.view ? "a view: recomputing it is free"
                     : fmt::format("{}: cheaper to recompute than to hold", s.policy);
    } else if (!fwd) {
      fate = "freed after last use";
      why = "gradient value";
    } else {
      fate = present[i] ? "kept" : "kept until last use";
      if (compressed[i]) fate += ", stored compressed";
      why = nd.checkpoint ? "checkpoint (ad::checkpoint)" : fmt::format("{} keeps it", s.policy);
    }
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", i, def.name, describe(nd.meta),
                       def.view ? 0 : nd.meta.nbytes(), computes[i], fate, why);
  }
  return out;
}

}  // namespace ad
