// What a schedule step may ask, checked the same way by the executor and by
// simulate_peak, so that the two accept and reject the same hand-built
// schedules (a step one of them ignored or took differently made predicted
// and measured peaks differ, and a free or reuse of a leaf destroyed a value
// the engine never frees). Checks only what the graph alone decides; the
// runtime conditions (a value present, its buffer held by no one else) stay
// with each.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/device.hpp"

#include "ad/schedule.hpp"
#include "core/graph_impl.hpp"

namespace ad::detail {

// "" when the step is allowed, else what is wrong (the caller names itself).
// sinks: the schedule's (Schedule::sinks).
inline std::string step_error(const GraphImpl& g, const Step& st, const std::vector<Parameter>& sinks) {
  const auto n = static_cast<std::int32_t>(g.nodes.size());
  if (st.node < 0 || st.node >= n) return fmt::format("a step names node {}, not a node of the graph", st.node);
  const Node& nd = g.node(st.node);
  const OpDef& def = op_def(nd.op);
  auto name = [&](std::int32_t id) { return fmt::format("{}#{}", op_def(g.node(id).op).name, id); };
  // a gradient step's sink: named by the schedule, and the node is a gradient of that parameter's meta
  auto sink_error = [&]() -> std::string {
    const auto k = st.aux;
    if (k >= static_cast<std::int32_t>(sinks.size()) || !sinks[static_cast<std::size_t>(k)].defined())
      return fmt::format("{} of {} names sink {} of {} (bad schedule)",
                         st.kind == Step::Kind::compute ? "compute" : "accumulate", name(st.node), k, sinks.size());
    const Parameter& p = sinks[static_cast<std::size_t>(k)];
    const Tensor& v = p.value();
    if (!(v.shape() == nd.meta.shape) || v.dtype() != nd.meta.dtype || !(v.device() == nd.meta.device))
      return fmt::format("{} of {} ({}) into the gradient of parameter \"{}\" ({}{} on {}): another shape, dtype or "
                         "device (bad schedule)",
                         st.kind == Step::Kind::compute ? "compute" : "accumulate", name(st.node), describe(nd.meta),
                         p.name(), dtype_name(v.dtype()), v.shape().str(), device::name(v.device()));
    return {};
  };
  const char* moved = st.kind == Step::Kind::offload    ? "offload"
                      : st.kind == Step::Kind::prefetch ? "prefetch"
                      : st.kind == Step::Kind::compress ? "compress"
                      : st.kind == Step::Kind::decompress ? "decompress"
                                                          : nullptr;
  if (moved && !def.cpu)
    return fmt::format("{} of {}, a leaf: a leaf's value is the caller's tensor, which the engine never moves or "
                       "converts (bad schedule)", moved, name(st.node));
  switch (st.kind) {
    case Step::Kind::free:
      if (!def.cpu) return fmt::format("free of {}, a leaf: the engine never frees leaves (bad schedule)", name(st.node));
      break;
    case Step::Kind::accumulate:
      if (st.aux < 0) return fmt::format("accumulate of {} names sink {} (bad schedule)", name(st.node), st.aux);
      return sink_error();
    case Step::Kind::compute: {
      if (st.aux >= 0)
        if (std::string e = sink_error(); !e.empty()) return e;
      if (st.reuse < 0) break;
      if (st.reuse >= n) return fmt::format("compute of {} names reuse node {}, not a node of the graph", name(st.node), st.reuse);
      if (def.view || st.aux >= 0)
        return fmt::format("compute of {} with reuse of {}: a view, or a gradient written into a parameter's buffer, "
                           "takes over no input's buffer (bad schedule)", name(st.node), name(st.reuse));
      bool may = false;
      for (std::size_t k = 0; k < nd.inputs.size() && k < 8; ++k)
        may = may || (nd.inputs[k] == st.reuse && (def.overwrites >> k) & 1u);
      if (!may)
        return fmt::format("compute of {} cannot write over {}: not an input its kernel may overwrite (bad schedule)",
                           name(st.node), name(st.reuse));
      const Node& r = g.node(st.reuse);
      if (!op_def(r.op).cpu)
        return fmt::format("compute of {} cannot write over {}, a leaf: the engine never frees leaves (bad schedule)",
                           name(st.node), name(st.reuse));
      if (!(r.meta.shape == nd.meta.shape) || r.meta.dtype != nd.meta.dtype || !(r.meta.device == nd.meta.device))
        return fmt::format("compute of {} ({}) cannot write over {} ({}): another shape, dtype or device (bad schedule)",
                           name(st.node), describe(nd.meta), name(st.reuse), describe(r.meta));
      break;
    }
    case Step::Kind::compress:
      if (st.aux < 0 || st.aux > static_cast<std::int32_t>(DType::i64) || !is_floating(static_cast<DType>(st.aux)))
        return fmt::format("compress of {} to dtype value {}: not a floating dtype (bad schedule)", name(st.node), st.aux);
      break;
    default: break;
  }
  return {};
}

}  // namespace ad::detail
