// The planning problem, the schedule builder, and keep-set schedules (the
// policies keep_all, manual, uniform, sqrt_n and selective are keep sets).
#include <algorithm>
#include <unordered_set>

#include "checkpoint/planner.hpp"

namespace ad::planner {

std::vector<char> writable_sinks(const GraphImpl& g, const std::vector<Sink>& sinks) {
  std::vector<char> w(sinks.size(), 0);
  bool any = false;
  for (std::size_t k = 0; k < sinks.size(); ++k) {
    const Sink& sk = sinks[k];
    const ParamState* ps = sk.param.state();
    const Node& nd = g.node(sk.node);
    if (!ps || nd.value.defined() || op_def(nd.op).view || !ps->grad_writable(nd.meta)) continue;
    bool once = true;
    for (std::size_t j = 0; j < sinks.size() && once; ++j)
      once = j == k || (sinks[j].node != sk.node && sinks[j].param.state() != ps);
    w[k] = once;
    any = any || once;
  }
  if (!any) return w;
  // a buffer some value of the graph reads (say, g.input(p.grad())) is not overwritten
  std::unordered_set<const Storage*> held;
  for (const Node& n : g.nodes)
    if (n.value.defined()) held.insert(n.value.storage().get());
  for (std::size_t k = 0; k < sinks.size(); ++k) {
    const ParamState* ps = sinks[k].param.state();
    if (w[k] && ps->grad.defined() && held.count(ps->grad.storage().get())) w[k] = 0;
  }
  return w;
}

Problem::Problem(const GraphImpl& graph, const std::vector<std::int32_t>& t, const std::vector<Sink>& sk,
                 const std::vector<std::int32_t>& outputs)
    : g(graph), targets(t), sinks(sk) {
  for (auto x : targets) boundary = std::max(boundary, x);
  targets.insert(targets.end(), outputs.begin(), outputs.end());
  for (auto x : targets) hi = std::max(hi, x);
  for (const auto& s : sinks) hi = std::max(hi, s.node);
  auto n = static_cast<std::size_t>(hi + 1);
  needed.assign(n, 0);
  pinned.assign(n, 0);
  target_mask.assign(n, 0);
  sink_mask.assign(n, 0);
  consumers.assign(n, {});
  bytes.assign(n, 0);
  ws.assign(n, 0);
  flops.assign(n, 0);
  for (auto x : targets) needed[static_cast<std::size_t>(x)] = target_mask[static_cast<std::size_t>(x)] = 1;
  sinks_at.assign(n, {});
  for (std::size_t k = 0; k < sinks.size(); ++k) {
    auto u = static_cast<std::size_t>(sinks[k].node);
    needed[u] = sink_mask[u] = 1;
    sinks_at[u].push_back(static_cast<std::int32_t>(k));
  }
  for (std::int32_t id = hi; id >= 0; --id) {
    auto u = static_cast<std::size_t>(id);
    const Node& nd = g.node(id);
    if (nd.value.defined()) { needed[u] = 0; pinned[u] = 1; continue; }
    if (!needed[u]) continue;
    for (auto in : nd.inputs) needed[static_cast<std::size_t>(in)] = 1;
  }
  std::vector<const Meta*> metas;
  for (std::int32_t id = 0; id <= hi; ++id) {
    auto u = static_cast<std::size_t>(id);
    if (target_mask[u]) pinned[u] = 1;
    if (!needed[u]) continue;
    const Node& nd = g.node(id);
    const OpDef& def = op_def(nd.op);
    order.push_back(id);
    if (id <= boundary) forward.push_back(id);
    for (std::size_t i = 0; i < nd.inputs.size(); ++i) {
      auto in = nd.inputs[i];
      bool dup = std::find(nd.inputs.begin(), nd.inputs.begin() + static_cast<std::ptrdiff_t>(i), in) !=
                 nd.inputs.begin() + static_cast<std::ptrdiff_t>(i);
      if (!dup) consumers[static_cast<std::size_t>(in)].push_back(id);
    }
    bytes[u] = def.view ? 0 : static_cast<std::int64_t>(nd.meta.nbytes());
    metas.clear();
    for (auto in : nd.inputs) metas.push_back(&g.node(in).meta);
    InferArgs a{def, metas, nd.attrs};
    if (def.workspace) ws[u] = std::max<std::int64_t>(0, def.workspace(a, nd.meta));
    flops[u] = def.flops ? def.flops(a, nd.meta) : static_cast<double>(nd.meta.shape.numel());
  }
  in_place.assign(n, -1);
  auto w = writable_sinks(g, sinks);
  for (std::size_t k = 0; k < sinks.size(); ++k) {
    auto u = static_cast<std::size_t>(sinks[k].node);
    if (!w[k] || !needed[u] || target_mask[u] || !consumers[u].empty()) continue;
    in_place[u] = static_cast<std::int32_t>(k);
    bytes[u] = 0;
  }
}

bool Problem::is_target(std::int32_t id) const { return target_mask[static_cast<std::size_t>(id)] != 0; }

std::int64_t Problem::lower_bound() const {
  // storage owner of each node (views share their base's storage)
  std::vector<std::int32_t> owner(static_cast<std::size_t>(hi + 1));
  for (std::int32_t id = 0; id <= hi; ++id) {
    const Node& nd = g.node(id);
    owner[static_cast<std::size_t>(id)] = op_def(nd.op).view ? owner[static_cast<std::size_t>(nd.inputs[0])] : id;
  }
  std::int64_t lb = 0;
  std::vector<std::int32_t> seen;
  for (auto id : order) {
    const Node& nd = g.node(id);
    std::int64_t need = bytes[static_cast<std::size_t>(id)] + ws[static_cast<std::size_t>(id)];
    seen.clear();
    for (auto in : nd.inputs) {
      auto o = owner[static_cast<std::size_t>(in)];
      if (!needed[static_cast<std::size_t>(o)] || std::find(seen.begin(), seen.end(), o) != seen.end()) continue;
      seen.push_back(o);
      need += bytes[static_cast<std::size_t>(o)];
    }
    lb = std::max(lb, need);
  }
  return lb;
}

Builder::Builder(const Problem& prob) : p(prob) {
  auto n = static_cast<std::size_t>(p.hi + 1);
  present_.assign(n, 0);
  computed_.assign(n, 0);
  stored_.assign(n, kHere);
  cursor_.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) present_[i] = p.g.nodes[i].value.defined();
  s.steps.reserve(3 * p.order.size());
  for (const auto& sk : p.sinks) s.sinks.push_back(sk.param);
  s.targets = p.targets;
  s.boundary = p.boundary;
  // sinks that already hold a value are accumulated up front
  for (std::size_t i = 0; i < p.sinks.size(); ++i)
    if (present_[static_cast<std::size_t>(p.sinks[i].node)])
      s.steps.push_back({Step::Kind::accumulate, p.sinks[i].node, static_cast<std::int32_t>(i)});
}

void Builder::compute(std::int32_t id) {
  auto u = static_cast<std::size_t>(id);
  // the first compute of a sink whose gradient goes straight into its parameter
  s.steps.push_back({Step::Kind::compute, id, computed_[u] ? -1 : p.in_place[u]});
  if (computed_[u]) {
    ++s.recomputed_nodes;
    s.recompute_flops += p.flops[u];
  } else if (p.is_sink(id)) {  // accumulated once, right after its first computation
    for (auto k : p.sinks_at[u]) s.steps.push_back({Step::Kind::accumulate, id, k});
  }
  computed_[u] = 1;
  present_[u] = 1;
}

void Builder::free(std::int32_t id) {
  auto u = static_cast<std::size_t>(id);
  if (!present_[u] || p.pinned[u]) return;
  s.steps.push_back({Step::Kind::free, id});
  present_[u] = 0;
  stored_[u] = kHere;
}

void Builder::compress(std::int32_t id, DType storage) {
  auto u = static_cast<std::size_t>(id);
  if (!present_[u] || stored_[u] != kHere || p.pinned[u]) return;
  s.steps.push_back({Step::Kind::compress, id, static_cast<std::int32_t>(storage)});
  stored_[u] = kCompressed;
}

void Builder::offload(std::int32_t id) {
  auto u = static_cast<std::size_t>(id);
  if (!present_[u] || stored_[u] != kHere || p.pinned[u]) return;
  s.steps.push_back({Step::Kind::offload, id});
  stored_[u] = kOffloaded;
}

void Builder::ensure(std::int32_t id, std::vector<std::int32_t>* touched,
                     const std::function<void(std::int32_t)>& computed) {
  std::vector<std::int32_t> stack{id};
  while (!stack.empty()) {
    std::int32_t t = stack.back();
    if (present(t)) {
      auto& st = stored_[static_cast<std::size_t>(t)];
      if (st != kHere) {  // restored to its own dtype, or brought back from host memory, before anything reads it
        s.steps.push_back({st == kCompressed ? Step::Kind::decompress : Step::Kind::prefetch, t});
        st = kHere;
      }
      stack.pop_back();
      continue;
    }
    bool waiting = false;
    for (auto in : p.g.node(t).inputs)
      if (!present(in) || stored_[static_cast<std::size_t>(in)] != kHere) { stack.push_back(in); waiting = true; break; }
    if (waiting) continue;
    compute(t);
    if (touched) touched->push_back(t);
    stack.pop_back();
    if (computed) computed(t);
  }
}

std::int32_t Builder::next_use(std::int32_t id, std::int32_t after) {
  auto u = static_cast<std::size_t>(id);
  const auto& c = p.consumers[u];
  std::size_t& k = cursor_[u];
  while (k < c.size() && c[k] <= after) ++k;
  return k < c.size() ? c[k] : -1;
}

Schedule Builder::finish() { return std::move(s); }

// Horizon of each forward value: the last gradient node that needs it,
// directly or through forward values that are not kept (and so may have to
// be recomputed from it). -1 if backward never needs it.
std::vector<std::int32_t> horizons(const Problem& p, const std::vector<char>& keep) {
  const std::int32_t L = p.boundary;
  std::vector<std::int32_t> h(static_cast<std::size_t>(p.hi + 1), -1);
  for (auto it = p.forward.rbegin(); it != p.forward.rend(); ++it) {
    auto u = static_cast<std::size_t>(*it);
    for (auto c : p.consumers[u]) {
      auto uc = static_cast<std::size_t>(c);
      if (c > L) h[u] = std::max(h[u], c);
      else if (!keep[uc]) h[u] = std::max(h[u], h[uc]);
    }
  }
  // leaves and values present before the run are pinned; their horizon is irrelevant
  return h;
}

// A kept forward value worth storing away (compressed or offloaded) until
// backward: it owns its bytes and no view shares them.
bool storable(const Problem& p, std::int32_t u) {
  const Node& nd = p.g.node(u);
  if (op_def(nd.op).view || p.bytes[static_cast<std::size_t>(u)] <= 0) return false;
  for (auto c : p.consumers[static_cast<std::size_t>(u)])
    if (op_def(p.g.node(c).op).view) return false;
  return true;
}

std::int64_t keep_set_held_bytes(const Problem& p, const std::vector<char>& keep) {
  const auto h = horizons(p, keep);
  std::int64_t held = 0;
  for (auto id : p.forward) {
    auto u = static_cast<std::size_t>(id);
    if (keep[u] && h[u] > p.boundary && !p.pinned[u]) held += p.bytes[u];
  }
  return held;
}

namespace {
std::optional<Schedule> build_keep_set(const Problem& p, const std::vector<char>& keep, DType compress, bool offload,
                                       double cost_cap) {
  Builder b(p);
  b.cost_cap = cost_cap;
  const std::int32_t L = p.boundary;
  const auto h = horizons(p, keep);
  std::vector<std::vector<std::int32_t>> expire(static_cast<std::size_t>(p.hi + 1));
  for (auto id : p.forward)
    if (h[static_cast<std::size_t>(id)] > L) expire[static_cast<std::size_t>(h[static_cast<std::size_t>(id)])].push_back(id);
  // In backward, a recomputed forward value is also freed as soon as nothing
  // still needs it: no gradient node after the current demand reads it, and
  // each forward consumer is present (it is then kept until nothing needs
  // it either) or needed by no gradient node from here on. So recomputing a
  // segment holds its values only while they are read: an MLP's matmul and
  // bias outputs go as soon as the next op has read them.
  std::int32_t d = -1;
  auto spent = [&](std::int32_t u) {
    auto uu = static_cast<std::size_t>(u);
    if (u > L || !b.present(u) || p.pinned[uu]) return false;
    if (h[uu] <= d) return true;
    if (b.next_use(u, d) >= 0) return false;  // a gradient node still reads it
    for (auto c : p.consumers[uu])
      if (c <= L && !b.present(c) && h[static_cast<std::size_t>(c)] >= d) return false;
    return true;
  };
  auto free_spent_inputs = [&](std::int32_t t) {
    for (auto in : p.g.node(t).inputs)
      if (spent(in)) b.free(in);
  };
  std::vector<std::int32_t> touched, cand;
  for (auto dd : p.order) {
    d = dd;
    touched.clear();
    if (d > L) b.ensure(d, &touched, free_spent_inputs);
    else b.ensure(d, &touched);
    // Values this demand used or made, and forward values whose horizon this is.
    cand.clear();
    cand.push_back(d);
    for (auto t : touched) {
      cand.push_back(t);
      for (auto in : p.g.node(t).inputs) cand.push_back(in);
    }
    for (auto x : expire[static_cast<std::size_t>(d)]) cand.push_back(x);
    for (auto u : cand) {
      auto uu = static_cast<std::size_t>(u);
      if (!b.present(u) || p.pinned[uu]) continue;
      std::int32_t nu = b.next_use(u, d);
      bool drop;
      if (u > L) drop = nu < 0;                                   // gradient values: after last use
      else if (d > L) drop = spent(u);                            // backward: once nothing needs it
      else if (nu >= 0 && nu <= L) drop = false;                  // forward still reads it
      else drop = !keep[uu] || h[uu] <= d;                        // forward done: keep only what is kept
      if (drop) b.free(u);
      else if (u <= L && d <= L && (nu < 0 || nu > L)) {  // held for backward
        if (offload && storable(p, u)) b.offload(u);       // in host memory until then
        else if (compress != DType::f32 && !op_def(p.g.node(u).op).view && p.bytes[uu] > 0 &&
                 is_compute_float(p.g.node(u).meta.dtype))
          b.compress(u, compress);  // stored small until then
      }
    }
    if (b.over_cap()) return std::nullopt;
  }
  return b.finish();
}
}  // namespace

Schedule keep_set(const Problem& p, const std::vector<char>& keep, DType compress, bool offload) {
  return *build_keep_set(p, keep, compress, offload, std::numeric_limits<double>::infinity());
}

std::optional<Schedule> keep_set_under(const Problem& p, const std::vector<char>& keep, double cost_cap) {
  return build_keep_set(p, keep, DType::f32, false, cost_cap);
}

void hoist_prefetches(const Problem& p, Schedule& s) {
  auto& st = s.steps;
  for (std::size_t i = 0; i < st.size(); ++i) {
    if (st[i].kind != Step::Kind::prefetch) continue;
    // the compute step before it, with no step about this node in between
    std::size_t j = i;
    while (j > 0 && st[j - 1].kind != Step::Kind::compute && st[j - 1].node != st[i].node) --j;
    if (j == 0 || st[j - 1].kind != Step::Kind::compute || st[j - 1].node == st[i].node) continue;
    const Node& c = p.g.node(st[j - 1].node);
    if (std::find(c.inputs.begin(), c.inputs.end(), st[i].node) != c.inputs.end()) continue;  // (never: it is offloaded)
    std::rotate(st.begin() + static_cast<std::ptrdiff_t>(j - 1), st.begin() + static_cast<std::ptrdiff_t>(i),
                st.begin() + static_cast<std::ptrdiff_t>(i + 1));
  }
}

std::int64_t offload_peak(const Problem& p, const Schedule& s) {
  std::vector<char> away(static_cast<std::size_t>(p.hi + 1), 0);
  std::int64_t now = 0, peak = 0;
  for (const Step& st : s.steps) {
    auto u = static_cast<std::size_t>(st.node);
    if (u >= away.size()) continue;
    auto b = static_cast<std::int64_t>(p.g.node(st.node).meta.nbytes());
    if (st.kind == Step::Kind::offload && !away[u]) {
      away[u] = 1;
      peak = std::max(peak, now += b);
    } else if ((st.kind == Step::Kind::prefetch || st.kind == Step::Kind::free) && away[u]) {
      away[u] = 0;
      now -= b;
    }
  }
  return peak;
}

void reuse_dying_inputs(const Problem& p, Schedule& s) {
  const auto n = static_cast<std::size_t>(p.hi + 1);
  // can a value of u be overwritten at all?
  std::vector<char> ok(n, 0);
  for (auto id : p.order) {
    auto u = static_cast<std::size_t>(id);
    const Node& nd = p.g.node(id);
    if (p.pinned[u] || p.is_sink(id) || op_def(nd.op).view) continue;
    bool viewed = false;
    for (auto c : p.consumers[u]) viewed = viewed || op_def(p.g.node(c).op).view;
    ok[u] = !viewed;
  }
  // walking backwards: for each node, the kind of the next step about it
  // (a compute that reads it, or a step on the node itself)
  enum : std::uint8_t { none, read, freed, other };
  std::vector<std::uint8_t> next(n, none);
  for (std::size_t i = s.steps.size(); i-- > 0;) {
    Step& st = s.steps[i];
    const auto v = static_cast<std::size_t>(st.node);
    if (st.kind != Step::Kind::compute) {
      if (v < n) next[v] = st.kind == Step::Kind::free ? freed : other;
      continue;
    }
    const Node& nd = p.g.node(st.node);
    const OpDef& def = op_def(nd.op);
    if (st.reuse < 0 && st.aux < 0 && def.overwrites && !def.view) {
      for (std::size_t k = 0; k < nd.inputs.size() && k < 8; ++k) {
        const auto in = nd.inputs[k];
        const auto u = static_cast<std::size_t>(in);
        if (!(def.overwrites & (1u << k)) || in == st.node || u >= n || !ok[u] || next[u] != freed) continue;
        const Meta& m = p.g.node(in).meta;
        if (!(m.shape == nd.meta.shape) || m.dtype != nd.meta.dtype) continue;
        st.reuse = in;
        break;
      }
    }
    for (auto in : nd.inputs)
      if (static_cast<std::size_t>(in) < n) next[static_cast<std::size_t>(in)] = read;
    if (v < n) next[v] = other;
  }
}

std::vector<char> marked_keep(const Problem& p) {
  std::vector<char> keep(static_cast<std::size_t>(p.hi + 1), 0);
  bool any = false;
  for (auto id : p.forward) {
    if (!p.g.node(id).checkpoint) continue;
    any = true;
    // a view marked with ad::checkpoint (a reshape, or attention's output, a
    // part of the op's buffer) keeps the value it views: a view itself costs
    // nothing to recompute, its base is what the mark asks to keep
    std::int32_t base = id;
    while (op_def(p.g.node(base).op).view) base = p.g.node(base).inputs[0];
    keep[static_cast<std::size_t>(base)] = 1;
  }
  if (!any) keep.clear();
  return keep;
}

// The values kept at segment boundaries, one boundary in each window of k
// values of fs (topological order): after the value i of the window where
// the fewest bytes cross (values at or before i that a forward node after i
// reads: views read as their base, leaves do not count), the latest among
// equals; every value crossing a chosen boundary is kept, so the segment
// after it recomputes from what is kept and the leaves alone. In a chain
// one value crosses each boundary and every k-th value is kept; in a
// recurrent cell the state (and a running loss) crosses after each step,
// and keeping the cell's other values instead, as every k-th value did, made
// recomputation restart from the beginning.
std::vector<char> boundary_keep(const Problem& p, const std::vector<std::int32_t>& fs, std::int64_t k) {
  const auto n = static_cast<std::int64_t>(fs.size());
  std::vector<std::int64_t> pos(static_cast<std::size_t>(p.hi + 1), -1), reach(fs.size(), -1);
  for (std::int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(fs[static_cast<std::size_t>(i)])] = i;
  auto base = [&](std::int32_t id) {
    while (op_def(p.g.node(id).op).view) id = p.g.node(id).inputs[0];
    return id;
  };
  for (std::int64_t i = 0; i < n; ++i)
    for (auto in : p.g.node(fs[static_cast<std::size_t>(i)]).inputs) {
      const std::int64_t a = pos[static_cast<std::size_t>(base(in))];
      if (a >= 0) reach[static_cast<std::size_t>(a)] = std::max(reach[static_cast<std::size_t>(a)], i);
    }
  // crossing bytes of each boundary (value j crosses boundaries j .. reach[j] - 1)
  std::vector<std::int64_t> cross(fs.size() + 1, 0);
  for (std::int64_t j = 0; j < n; ++j)
    if (reach[static_cast<std::size_t>(j)] > j) {
      const std::int64_t b = p.bytes[static_cast<std::size_t>(fs[static_cast<std::size_t>(j)])];
      cross[static_cast<std::size_t>(j)] += b;
      cross[static_cast<std::size_t>(reach[static_cast<std::size_t>(j)])] -= b;
    }
  for (std::int64_t i = 1; i <= n; ++i) cross[static_cast<std::size_t>(i)] += cross[static_cast<std::size_t>(i - 1)];
  // chosen[i]: boundaries chosen at or before i (prefix count)
  std::vector<std::int64_t> chosen(fs.size(), 0);
  for (std::int64_t w = 0; w + k <= n; w += k) {  // whole windows only, as every k-th value
    std::int64_t best = w;
    for (std::int64_t i = w; i < w + k; ++i)
      if (cross[static_cast<std::size_t>(i)] <= cross[static_cast<std::size_t>(best)]) best = i;
    chosen[static_cast<std::size_t>(best)] = 1;
  }
  for (std::int64_t i = 1; i < n; ++i) chosen[static_cast<std::size_t>(i)] += chosen[static_cast<std::size_t>(i - 1)];
  std::vector<char> keep(static_cast<std::size_t>(p.hi + 1), 0);
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t last = std::max(reach[static_cast<std::size_t>(j)] - 1, j);  // boundaries j .. last
    const std::int64_t before = j > 0 ? chosen[static_cast<std::size_t>(j - 1)] : 0;
    // crossing a chosen boundary, or the value a chosen boundary follows (the
    // chain's k-th value, kept as before even where nothing reads it later)
    if (chosen[static_cast<std::size_t>(last)] > before) keep[static_cast<std::size_t>(fs[static_cast<std::size_t>(j)])] = 1;
  }
  return keep;
}

}  // namespace ad::planner
