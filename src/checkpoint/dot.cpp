// to_dot: a graph (and what a plan does with each value) as Graphviz DOT.
#include <fmt/format.h>

#include "checkpoint/fate.hpp"
#include "core/graph_impl.hpp"
#include "core/step_check.hpp"

namespace ad {

namespace {
std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}
std::string human_bytes(std::int64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  if (b < 1024 * 1024) return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
  return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1024.0 * 1024.0));
}

// Nodes [0, n) of g; with fates, only those the schedule computes and the
// leaves and present values they read.
std::string write_dot(const GraphImpl& g, const planner::Fates* f, const Schedule* s) {
  std::size_t n = f ? std::min(f->n, g.nodes.size()) : g.nodes.size();
  std::vector<char> shown(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (f && !f->computes[i]) continue;
    shown[i] = 1;
    for (auto in : g.nodes[i].inputs)
      if (static_cast<std::size_t>(in) < n) shown[static_cast<std::size_t>(in)] = 1;
  }
  std::string out = "digraph ad {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];\n";
  if (s)
    out += fmt::format("  label=\"{}: predicted peak {}, {} recomputations\";\n  labelloc=t;\n", dot_escape(s->policy),
                       human_bytes(s->predicted_peak_bytes), s->recomputed_nodes);
  for (std::size_t i = 0; i < n; ++i) {
    if (!shown[i]) continue;
    const Node& nd = g.nodes[i];
    const OpDef& def = op_def(nd.op);
    std::int64_t bytes = def.view ? 0 : static_cast<std::int64_t>(nd.meta.nbytes());
    std::string name = def.name;
    std::string user;
    if (auto it = g.names.find(static_cast<std::int32_t>(i)); it != g.names.end()) user = it->second;
    else if (nd.param) user = nd.param->name;
    if (!user.empty()) name += " '" + user + "'";
    std::string fate, fill = "white", extra;
    bool leaf = nd.op == OpId::input || nd.op == OpId::parameter;
    if (leaf) {
      fate = nd.op == OpId::parameter ? "parameter" : "input";
      fill = nd.op == OpId::parameter ? "gold" : "lightgrey";
    } else if (!f) {
      fate = nd.value.defined() ? "has value" : "";
    } else if (!f->computes[i]) {
      fate = "present before the step";
      fill = "lightgrey";
    } else if (f->target[i]) {
      fate = "kept (output)";
      fill = "palegreen";
      extra = ", penwidth=2";
    } else if (f->recomputed[i]) {
      fate = fmt::format("deleted, recomputed x{}", f->computes[i] - 1);
      fill = "salmon";
    } else if (!f->forward(i)) {
      fate = "gradient, freed after use";
      fill = "lightblue";
    } else {
      fate = f->present_at_end[i] ? "kept" : "kept until last use";
      if (f->compressed[i]) fate += ", compressed";
      if (f->offloaded[i]) fate += ", offloaded";
      fill = "palegreen";
    }
    if (f && !leaf && f->computes[i] && !f->forward(i)) extra += ", style=\"rounded,filled,dashed\"";
    out += fmt::format("  n{} [label=\"#{} {}\\n{}\\n{}{}{}\", fillcolor={}{}];\n", i, i, dot_escape(name),
                       describe(nd.meta), human_bytes(bytes), fate.empty() ? "" : "\\n", fate, fill, extra);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!shown[i] || (f && !f->computes[i])) continue;
    for (auto in : g.nodes[i].inputs) out += fmt::format("  n{} -> n{};\n", in, i);
  }
  out += "}\n";
  return out;
}
}  // namespace

std::string to_dot(const Plan& plan) {
  if (!plan.graph) throw Error("to_dot: empty plan");
  if (plan.graph_alive.expired())
    throw Error("to_dot: the plan's graph has been destroyed; call to_dot(plan) while its ad::Graph exists");
  for (const Step& st : plan.schedule.steps)  // the schedule's steps index the graph's nodes
    if (std::string e = detail::step_error(*plan.graph, st, plan.schedule.sinks); !e.empty()) throw Error("to_dot: " + e);
  const planner::Fates f = planner::fates(plan.schedule);
  return write_dot(*plan.graph, &f, &plan.schedule);
}
std::string to_dot(const Graph& graph, const Plan& plan) {
  if (plan.graph != &graph.impl() || plan.graph_alive.expired())
    throw Error("to_dot: the plan was made for another graph");
  return to_dot(plan);
}
std::string to_dot(const Graph& graph) { return write_dot(graph.impl(), nullptr, nullptr); }

}  // namespace ad
