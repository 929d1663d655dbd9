// explain(plan): per node, what the schedule does with its value and why.
#include <fmt/format.h>

#include "checkpoint/fate.hpp"
#include "core/graph_impl.hpp"
#include "core/step_check.hpp"

namespace ad {

std::string explain(const Plan& plan) {
  if (!plan.graph) throw Error("explain: empty plan");
  if (plan.graph_alive.expired())
    throw Error("explain: the plan's graph has been destroyed; call explain(plan) while its ad::Graph exists");
  const GraphImpl& g = *plan.graph;
  const Schedule& s = plan.schedule;
  for (const Step& st : s.steps)  // the schedule's steps index the graph's nodes
    if (std::string e = detail::step_error(g, st, s.sinks); !e.empty()) throw Error("explain: " + e);
  const planner::Fates f = planner::fates(s);
  std::string out = fmt::format("plan: {} — predicted peak {} B, {} steps, {} recomputations ({:.3g} extra flops)\n\n",
                                s.policy, s.predicted_peak_bytes, s.steps.size(), s.recomputed_nodes, s.recompute_flops);
  out += "| node | op | value | bytes | computed | fate | why |\n|---|---|---|---|---|---|---|\n";
  for (std::size_t i = 0; i < f.n; ++i) {
    if (!f.computes[i]) continue;
    const Node& nd = g.nodes[i];
    const OpDef& def = op_def(nd.op);
    bool fwd = f.forward(i);
    std::string fate, why;
    if (f.target[i]) {
      fate = "kept (output)";
      why = "a target of the step";
    } else if (f.recomputed[i]) {
      fate = fmt::format("deleted, recomputed x{}", f.computes[i] - 1);
      why = def.view ? "a view: recomputing it is free"
                     : fmt::format("{}: cheaper to recompute than to hold", s.policy);
    } else if (!fwd) {
      fate = "freed after last use";
      why = "gradient value";
    } else {
      fate = f.present_at_end[i] ? "kept" : "kept until last use";
      if (f.compressed[i]) fate += ", stored compressed";
      if (f.offloaded[i]) fate += ", offloaded to host until backward";
      why = nd.checkpoint ? "checkpoint (ad::checkpoint)" : fmt::format("{} keeps it", s.policy);
    }
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", i, def.name, describe(nd.meta),
                       def.view ? 0 : nd.meta.nbytes(), f.computes[i], fate, why);
  }
  return out;
}

}  // namespace ad
