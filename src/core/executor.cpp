// Runs a Schedule. Decides nothing: computes, frees and accumulates exactly
// as listed, and measures the peak through the graph's allocator.
#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "core/graph_impl.hpp"
#include "core/kernels.hpp"

namespace ad {

namespace {
void run_compute(GraphImpl& g, std::int32_t id, std::vector<const Tensor*>& ins) {
  Node& nd = g.node(id);
  const OpDef& def = op_def(nd.op);
  if (!def.cpu) throw Error(fmt::format("execute: node {} ({}) has no value and cannot be computed", id, def.name));
  ins.clear();
  for (auto in : nd.inputs) {
    const Tensor& t = g.node(in).value;
    if (!t.defined())
      throw Error(fmt::format("execute: {}#{} needs input {}#{} which holds no value (bad schedule)", def.name, id,
                              op_def(g.node(in).op).name, in));
    ins.push_back(&t);
  }
  if (nd.meta.device.kind != DeviceKind::cpu)
    throw Error(fmt::format("{}: no kernel for device kind {} in this build", def.name, static_cast<int>(nd.meta.device.kind)));
  Tensor out;
  if (!def.view) {
    out = Tensor::empty(nd.meta.shape, nd.meta.dtype, nd.meta.device, g.alloc);
    if (g.poison_outputs && out.nbytes()) std::memset(out.raw(), 0xff, out.nbytes());  // NaN in f32/f64
  }
  std::unique_ptr<Storage> ws;  // counted by the graph's allocator, freed after the kernel
  if (def.workspace) {
    std::vector<const Meta*> metas;
    for (auto in : nd.inputs) metas.push_back(&g.node(in).meta);
    auto b = def.workspace(InferArgs{def, metas, nd.attrs}, nd.meta);
    if (b > 0) ws = std::make_unique<Storage>(g.alloc, static_cast<std::size_t>(b));
  }
  KernelArgs a{ins, out, nd.attrs, nd.meta, ws ? ws->data() : nullptr};
  def.cpu(a);
  nd.value = std::move(out);
  ++nd.times_computed;
  ++nd.last_run_computes;
}

void accumulate_into(const Parameter& p, const Tensor& v) {
  ParamState& s = *p.state();
  if (!(v.shape() == s.value.shape()) || v.dtype() != s.value.dtype())
    throw Error(fmt::format("execute: gradient {}{} does not match parameter {}{}", dtype_name(v.dtype()),
                            v.shape().str(), dtype_name(s.value.dtype()), s.value.shape().str()));
  if (!s.grad.defined()) {
    s.grad = v.clone(default_allocator(v.device()));
    return;
  }
  kernels::add_into(s.grad, v);
}
}  // namespace

RunStats execute(GraphImpl& g, const Schedule& s) {
  auto t0 = std::chrono::steady_clock::now();
  RunStats r;
  r.baseline_bytes = g.alloc->reset_peak();
  std::vector<const Tensor*> ins;
  for (const Step& st : s.steps)
    if (st.kind == Step::Kind::compute && st.node >= 0 && static_cast<std::size_t>(st.node) < g.nodes.size())
      g.node(st.node).last_run_computes = 0;
  for (const Step& st : s.steps) {
    if (st.node < 0 || static_cast<std::size_t>(st.node) >= g.nodes.size())
      throw Error(fmt::format("execute: a step names node {}, not a node of the graph", st.node));
    Node& nd = g.node(st.node);
    switch (st.kind) {
      case Step::Kind::compute:
        if (nd.last_run_computes > 0) ++r.recomputed_nodes;
        run_compute(g, st.node, ins);
        ++r.computed_nodes;
        break;
      case Step::Kind::free: nd.value = Tensor{}; break;
      case Step::Kind::accumulate:
        if (st.aux < 0 || static_cast<std::size_t>(st.aux) >= s.sinks.size() ||
            !s.sinks[static_cast<std::size_t>(st.aux)].defined())
          throw Error(fmt::format("execute: accumulate step names sink {} of {}", st.aux, s.sinks.size()));
        if (!nd.value.defined())
          throw Error(fmt::format("execute: accumulate of {}#{} which holds no value (bad schedule)", op_def(nd.op).name,
                                  st.node));
        accumulate_into(s.sinks[static_cast<std::size_t>(st.aux)], nd.value);
        break;
    }
  }
  r.measured_peak_bytes = g.alloc->peak_bytes() - r.baseline_bytes;
  r.run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Tensor eval(const Var& x) {
  if (!x.defined()) throw Error("eval: undefined Var");
  GraphImpl& g = *x.graph();
  if (!g.node(x.id()).value.defined()) {
    Schedule s = plan(g, {x.id()}, {}, policy::keep_all());
    execute(g, s);
  }
  return g.node(x.id()).value;
}

}  // namespace ad
