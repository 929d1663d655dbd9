// Reverse-mode autodiff: walks the graph from the loss backwards and appends
// gradient nodes built by each op's backward rule (so every device runs them).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <tuple>
#include <utility>

#include "ad/autodiff.hpp"
#include "core/graph_impl.hpp"

namespace ad {

std::vector<Var> grad(const Var& loss, const std::vector<Var>& wrt, const Var& seed) {
  if (!loss.defined()) throw Error("grad: loss is an undefined Var");
  GraphImpl& g = *loss.graph();
  const Meta loss_meta = g.node(loss.id()).meta;
  if (!is_compute_float(loss_meta.dtype))
    throw Error(fmt::format("grad: loss {} is not f32/f64", describe(loss_meta)));
  if (seed.defined()) {
    if (seed.graph() != &g) throw Error("grad: seed belongs to another graph");
    const Meta& sm = g.node(seed.id()).meta;
    if (!(sm.shape == loss_meta.shape) || sm.dtype != loss_meta.dtype)
      throw Error(fmt::format("grad: seed {} does not match loss {}", describe(sm), describe(loss_meta)));
  } else if (loss_meta.shape.numel() != 1) {
    throw Error(fmt::format("grad: loss {} is not a scalar; pass a seed gradient of the same shape",
                            describe(loss_meta)));
  }
  for (const auto& w : wrt) {
    if (!w.defined()) throw Error("grad: an entry of wrt is an undefined Var");
    if (w.graph() != &g) throw Error(fmt::format("grad: {} belongs to another graph than the loss", w.str()));
  }
  const std::int32_t L = loss.id();
  const auto n = static_cast<std::size_t>(L) + 1;
  // wants[i]: a gradient must flow into node i (it is in wrt, or leads to it)
  std::vector<char> wants(n, 0);
  for (const auto& w : wrt) if (w.id() <= L) wants[static_cast<std::size_t>(w.id())] = 1;
  for (std::int32_t id = 0; id <= L; ++id) {
    if (op_def(g.node(id).op).stops_gradient) continue;  // detach: a constant to what reads it
    for (auto in : g.node(id).inputs)
      if (wants[static_cast<std::size_t>(in)]) { wants[static_cast<std::size_t>(id)] = 1; break; }
  }

  std::vector<Var> grads(n);
  // contributions of OpDef::places_slice nodes (slice's gradient), kept apart
  // until the node's gradient is needed and then assembled by settle()
  std::vector<std::vector<Var>> placed(n);
  // contributions of OpDef::defer_in_grad nodes, made again by settle()
  std::vector<std::vector<Var>> deferred(n);
  auto accumulate = [&](std::size_t iu, const Var& gv) {
    const DType dt = g.node(gv.id()).meta.dtype;  // a copy: the ops below append nodes
    if (!grads[iu].defined()) {
      grads[iu] = gv;
    } else if (is_compute_float(dt)) {
      grads[iu] = add(grads[iu], gv);
    } else {  // f16 / bf16 (storage types: add takes f32/f64): summed in f32, rounded once
      grads[iu] = cast(add(cast(grads[iu], DType::f32), cast(gv, DType::f32)), dt);
    }
  };
  auto route = [&](std::size_t iu, const Var& gv) {
    const Node& gn = g.node(gv.id());
    if (op_def(gn.op).places_slice && is_compute_float(gn.meta.dtype))
      placed[iu].push_back(gv);
    else if (op_def(gn.op).defer_in_grad)
      deferred[iu].push_back(gv);
    else
      accumulate(iu, gv);
  };
  auto settle = [&](std::size_t iu) {
    if (!deferred[iu].empty()) {
      std::vector<Var> recipes;
      recipes.swap(deferred[iu]);
      for (const Var& r : recipes) {
        const Node nd = g.node(r.id());  // a copy: make_node appends to the node list
        std::vector<Operand> ins;
        for (const auto in : nd.inputs) ins.emplace_back(Var(&g, in));
        const Var again = make_node(nd.op, std::span<const Operand>(ins), nd.attrs);
        if (op_def(nd.op).places_slice && is_compute_float(nd.meta.dtype))
          placed[iu].push_back(again);
        else
          accumulate(iu, again);
      }
    }
    if (placed[iu].empty()) return;
    std::vector<Var> pieces;
    pieces.swap(placed[iu]);
    if (pieces.size() == 1) return accumulate(iu, pieces[0]);
    // one concat per axis; a group whose distinct ranges overlap is added as before
    std::sort(pieces.begin(), pieces.end(), [&](const Var& x, const Var& y) {
      const Attrs &ax = g.node(x.id()).attrs, &ay = g.node(y.id()).attrs;
      return std::make_tuple(ax.axis, ax.start, ax.stop, x.id()) < std::make_tuple(ay.axis, ay.start, ay.stop, y.id());
    });
    for (std::size_t b = 0; b < pieces.size();) {
      const Attrs first = g.node(pieces[b].id()).attrs;
      std::size_t e = b;
      while (e < pieces.size() && g.node(pieces[e].id()).attrs.axis == first.axis) ++e;
      // ranges [start, stop) with the pieces' inputs summed where a range repeats
      std::vector<std::pair<Attrs, Var>> runs;
      bool disjoint = true;
      for (std::size_t i = b; i < e; ++i) {
        const Attrs at = g.node(pieces[i].id()).attrs;
        const Var dy(&g, g.node(pieces[i].id()).inputs[0]);
        if (!runs.empty() && runs.back().first.start == at.start && runs.back().first.stop == at.stop) {
          runs.back().second = add(runs.back().second, dy);
          continue;
        }
        if (!runs.empty() && at.start < runs.back().first.stop) disjoint = false;
        runs.emplace_back(at, dy);
      }
      if (!disjoint || e - b == 1) {
        for (std::size_t i = b; i < e; ++i) accumulate(iu, pieces[i]);
      } else {
        const Shape full_shape = first.shape;
        const int ax = static_cast<int>(first.axis);
        std::vector<Var> parts;
        std::int64_t at = 0;
        auto zeros_until = [&](std::int64_t stop) {
          if (stop <= at) return;
          Shape zs = full_shape;
          zs[ax] = stop - at;
          parts.push_back(full(pieces[b], zs, 0.0, g.node(pieces[b].id()).meta.dtype));
        };
        for (const auto& [range, dy] : runs) {
          zeros_until(range.start);
          if (range.stop > range.start) parts.push_back(dy);
          at = std::max(at, range.stop);
        }
        zeros_until(full_shape[ax]);
        accumulate(iu, parts.size() == 1 ? parts[0] : concat(parts, ax));
      }
      b = e;
    }
  };
  if (wants[static_cast<std::size_t>(L)])
    grads[static_cast<std::size_t>(L)] = seed.defined() ? seed : full(loss, loss_meta.shape, 1.0, loss_meta.dtype);

  BackwardArgs a;
  for (std::int32_t id = L; id >= 0; --id) {
    auto u = static_cast<std::size_t>(id);
    settle(u);
    if (!grads[u].defined() || g.is_leaf(id)) continue;
    const Node& nd = g.node(id);  // copied out below: rules append nodes
    const OpDef& def = op_def(nd.op);
    if (def.stops_gradient) continue;
    bool any = false;
    for (auto in : nd.inputs) any |= wants[static_cast<std::size_t>(in)] != 0;
    if (!any) continue;
    if (!def.backward)
      throw Error(fmt::format("grad: {} has no backward rule ({}); the gradient cannot flow through it",
                              Var(&g, id).str(), def.no_grad ? def.no_grad : "not differentiable"));
    a.out = Var(&g, id);
    a.dout = grads[u];
    a.attrs = nd.attrs;
    a.in.clear();
    a.needs.clear();
    for (auto in : nd.inputs) {
      a.in.emplace_back(&g, in);
      a.needs.push_back(wants[static_cast<std::size_t>(in)]);
    }
    a.grad.assign(a.in.size(), Var{});
    def.backward(a);
    for (std::size_t i = 0; i < a.in.size(); ++i) {
      if (!a.needs[i] || !a.grad[i].defined()) continue;
      auto iu = static_cast<std::size_t>(a.in[i].id());
      const Meta& im = g.node(a.in[i].id()).meta;
      const Meta& gm = g.node(a.grad[i].id()).meta;
      if (!(gm.shape == im.shape) || gm.dtype != im.dtype)
        throw Error(fmt::format("grad: internal: backward of {} gave {} for input {}", def.name, describe(gm), describe(im)));
      route(iu, a.grad[i]);
    }
  }
  std::vector<Var> out;
  out.reserve(wrt.size());
  for (const auto& w : wrt) {
    Var gw = w.id() <= L ? grads[static_cast<std::size_t>(w.id())] : Var{};
    if (!gw.defined()) gw = zeros_like(w);
    out.push_back(gw);
  }
  return out;
}

namespace {
void check_loss(const Var& loss, const Var& seed, const char* op) {
  if (!loss.defined()) throw Error(fmt::format("{}: loss is an undefined Var", op));
  GraphImpl& g = *loss.graph();
  if (seed.defined()) {
    if (seed.graph() != &g) throw Error(fmt::format("{}: seed {} belongs to another graph than the loss", op, seed.str()));
    const Meta &sm = g.node(seed.id()).meta, &lm = g.node(loss.id()).meta;
    if (!(sm.shape == lm.shape) || sm.dtype != lm.dtype)
      throw Error(fmt::format("{}: seed {} does not match loss {}", op, describe(sm), describe(lm)));
  }
  if (!seed.defined() && g.node(loss.id()).meta.shape.numel() != 1)
    throw Error(fmt::format("{}: loss {} is not a scalar; reduce it (ad::sum, ad::mean) or pass a seed "
                            "gradient of its shape",
                            op, loss.str()));
}
// The parameters `loss` depends on differentiably (not only through detach
// or the inputs of OpDef::zero_grad_inputs: comparisons, where's cond), in
// node order: only they get gradients (and step in an optimizer).
std::vector<Var> params_of(const Var& loss) {
  GraphImpl& g = *loss.graph();
  const std::int32_t L = loss.id();
  std::vector<char> reach(static_cast<std::size_t>(L) + 1, 0);
  reach[static_cast<std::size_t>(L)] = 1;
  std::vector<Var> params;
  for (std::int32_t id = L; id >= 0; --id) {
    if (!reach[static_cast<std::size_t>(id)]) continue;
    const Node& nd = g.node(id);
    if (nd.op == OpId::parameter) params.emplace_back(&g, id);
    const OpDef& def = op_def(nd.op);
    if (def.stops_gradient) continue;
    for (std::size_t i = 0; i < nd.inputs.size(); ++i)
      if (i >= 8 || !((def.zero_grad_inputs >> i) & 1u)) reach[static_cast<std::size_t>(nd.inputs[i])] = 1;
  }
  std::reverse(params.begin(), params.end());
  return params;
}
// Builds (once per loss, seed and wrt) the gradient nodes of the loss's
// parameters and of `wrt`: the parameters' become sinks, wrt's plan targets.
const GraphImpl::WrtCacheEntry& wrt_grads(const Var& loss, const std::vector<Var>& wrt, const Var& seed) {
  GraphImpl& g = *loss.graph();
  std::vector<std::int32_t> ids;
  for (const Var& w : wrt) ids.push_back(w.id());
  const std::int32_t sid = seed.defined() ? seed.id() : -1;
  for (const auto& e : g.wrt_cache)
    if (e.loss == loss.id() && e.seed == sid && e.wrt == ids) return e;
  std::vector<Var> all = params_of(loss);
  const std::size_t np = all.size();
  all.insert(all.end(), wrt.begin(), wrt.end());
  std::vector<Var> grads = grad(loss, all, seed);
  GraphImpl::WrtCacheEntry e{loss.id(), sid, ids, {}, {}};
  for (std::size_t i = 0; i < np; ++i) e.sinks.push_back({grads[i].id(), Parameter(g.node(all[i].id()).param)});
  for (std::size_t i = np; i < all.size(); ++i) e.wrt_grads.push_back(grads[i].id());
  g.wrt_cache.push_back(std::move(e));
  return g.wrt_cache.back();
}
Report run_plan(std::shared_ptr<Plan> p, double plan_ms) {
  RunStats rs = execute(*p->graph, p->schedule);
  Report r;
  r.policy = p->schedule.policy;
  r.predicted_peak_bytes = p->schedule.predicted_peak_bytes;
  r.measured_peak_bytes = rs.measured_peak_bytes;
  r.baseline_bytes = rs.baseline_bytes;
  r.kept_bytes = p->schedule.kept_bytes;
  r.computed_nodes = rs.computed_nodes;
  r.recomputed_nodes = rs.recomputed_nodes;
  r.evictions = rs.evictions;
  r.offload_peak_bytes = rs.offload_peak_bytes;
  r.recompute_flops = p->schedule.recompute_flops;
  r.steps = static_cast<std::int64_t>(p->schedule.steps.size());
  r.plan_cached = p->schedule.from_cache;
  r.proven_cheapest = p->schedule.proven_cheapest;
  r.plan_ms = plan_ms;
  r.run_ms = rs.run_ms;
  r.plan = std::move(p);
  return r;
}
// The graph's parameters, locked in address order (no deadlock between graphs
// that share several): a Parameter reached by backward calls on two threads
// at once had one thread's gradient silently lost.
std::vector<std::unique_lock<std::mutex>> lock_params(const Var& loss) {
  std::vector<ParamState*> params;
  if (loss.defined())
    for (const auto& pn : loss.graph()->param_nodes) params.push_back(const_cast<ParamState*>(pn.first));
  std::sort(params.begin(), params.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(params.size());
  for (ParamState* ps : params) locks.emplace_back(ps->backward_mutex);
  return locks;
}
}  // namespace

namespace {
// The parameters' gradient nodes of `loss` (built once per loss and seed).
const GraphImpl::GradCacheEntry& param_grads(const Var& loss, const Var& seed, const char* op) {
  check_loss(loss, seed, op);
  GraphImpl& g = *loss.graph();
  auto it = g.grad_cache.find(loss.id());
  if (it == g.grad_cache.end() || it->second.seed != (seed.defined() ? seed.id() : -1)) {
    std::vector<Var> params = params_of(loss);
    if (params.empty())
      throw Error(fmt::format("{}: loss {} does not depend on any Parameter (other than through "
                              "detach, a comparison or where's cond, whose gradient is zero); use "
                              "ad::backward_wrt(loss, wrt, policy) or ad::grad(loss, wrt) to differentiate with "
                              "respect to inputs",
                              op, loss.str()));
    const auto first = static_cast<std::int32_t>(g.nodes.size());
    auto grads = grad(loss, params, seed);
    GraphImpl::GradCacheEntry e{seed.defined() ? seed.id() : -1, {}, first};
    for (std::size_t i = 0; i < params.size(); ++i)
      e.sinks.push_back({grads[i].id(), Parameter(g.node(params[i].id()).param)});
    it = g.grad_cache.insert_or_assign(loss.id(), std::move(e)).first;
  }
  return it->second;
}
}  // namespace

Plan plan_backward(const Var& loss, const Policy& policy, const Var& seed) {
  const GraphImpl::GradCacheEntry& e = param_grads(loss, seed, "backward");
  GraphImpl& g = *loss.graph();
  return Plan{&g, plan(g, {loss.id()}, e.sinks, policy), g.alive};
}

Report backward(const Var& loss, const Policy& policy, const Var& seed) {
  auto locks = lock_params(loss);
  auto t0 = std::chrono::steady_clock::now();
  auto p = std::make_shared<Plan>(plan_backward(loss, policy, seed));
  auto t1 = std::chrono::steady_clock::now();
  return run_plan(std::move(p), std::chrono::duration<double, std::milli>(t1 - t0).count());
}

Report backward_keep(const Var& loss, const std::vector<Var>& keep, const Policy& policy, const Var& seed) {
  auto locks = lock_params(loss);
  auto t0 = std::chrono::steady_clock::now();
  if (keep.empty()) throw Error("backward_keep: keep is empty; use ad::backward");
  const GraphImpl::GradCacheEntry& e = param_grads(loss, seed, "backward_keep");
  GraphImpl& g = *loss.graph();
  std::vector<std::int32_t> targets{loss.id()};
  for (std::size_t i = 0; i < keep.size(); ++i) {
    const Var& k = keep[i];
    if (!k.defined()) throw Error(fmt::format("backward_keep: keep[{}] is an undefined Var", i));
    if (k.graph() != &g)
      throw Error(fmt::format("backward_keep: keep[{}] {} belongs to another graph than the loss {}", i, k.str(),
                              loss.str()));
    if (k.id() >= e.first_grad)
      throw Error(fmt::format("backward_keep: keep[{}] {} was made after the first backward of this loss (or is one "
                              "of its gradient nodes); keep only values of the forward pass",
                              i, k.str()));
    targets.push_back(k.id());
  }
  auto p = std::make_shared<Plan>(Plan{&g, plan(g, targets, e.sinks, policy), g.alive});
  auto t1 = std::chrono::steady_clock::now();
  Report r = run_plan(std::move(p), std::chrono::duration<double, std::milli>(t1 - t0).count());
  for (const Var& k : keep) r.values.push_back(g.node(k.id()).value);
  return r;
}

namespace {
Plan plan_wrt(const Var& loss, const std::vector<Var>& wrt, const Policy& policy, const Var& seed,
              std::vector<std::int32_t>& grad_ids) {
  check_loss(loss, seed, "backward_wrt");
  GraphImpl& g = *loss.graph();
  if (wrt.empty()) throw Error("backward_wrt: wrt is empty; use ad::backward for the parameters' gradients alone");
  for (std::size_t i = 0; i < wrt.size(); ++i) {
    if (!wrt[i].defined()) throw Error(fmt::format("backward_wrt: wrt[{}] is an undefined Var", i));
    if (wrt[i].graph() != &g)
      throw Error(fmt::format("backward_wrt: wrt[{}] {} belongs to another graph than the loss {}", i, wrt[i].str(),
                              loss.str()));
  }
  const GraphImpl::WrtCacheEntry& e = wrt_grads(loss, wrt, seed);
  grad_ids = e.wrt_grads;
  return Plan{&g, plan(g, {loss.id()}, e.sinks, policy, e.wrt_grads), g.alive};
}
}  // namespace

Plan plan_backward_wrt(const Var& loss, const std::vector<Var>& wrt, const Policy& policy, const Var& seed) {
  std::vector<std::int32_t> ids;
  return plan_wrt(loss, wrt, policy, seed, ids);
}

Report backward_wrt(const Var& loss, const std::vector<Var>& wrt, const Policy& policy, const Var& seed) {
  auto locks = lock_params(loss);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::int32_t> ids;
  auto p = std::make_shared<Plan>(plan_wrt(loss, wrt, policy, seed, ids));
  auto t1 = std::chrono::steady_clock::now();
  GraphImpl* g = p->graph;
  Report r = run_plan(std::move(p), std::chrono::duration<double, std::milli>(t1 - t0).count());
  for (std::int32_t id : ids) r.grads.push_back(Var(g, id).value());
  return r;
}

}  // namespace ad
