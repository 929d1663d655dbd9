// Policies turn a graph into a Schedule; the simulation predicts its peak.
// The planner reads only the graph's structure, metas and OpDef fields
// (view, saves, flops) — never an op by name.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "checkpoint/cache.hpp"
#include "checkpoint/planner.hpp"
#include "core/graph_impl.hpp"
#include "core/step_check.hpp"

namespace ad {

namespace {
std::string base_name(const Policy& p) {
  switch (p.kind) {
    case Policy::Kind::keep_all: return "keep_all";
    case Policy::Kind::manual: return "manual";
    case Policy::Kind::uniform: return fmt::format("uniform({})", p.every);
    case Policy::Kind::sqrt_n: return "sqrt_n";
    case Policy::Kind::selective: return "selective";
    case Policy::Kind::budget: return fmt::format("budget({} B)", p.budget_bytes);
    case Policy::Kind::optimal_chain: return fmt::format("optimal_chain({})", p.slots);
  }
  return "?";
}
}  // namespace
std::string Policy::name() const {
  std::string n = base_name(*this);
  if (offload) n += "+offload";
  return compress == DType::f32 ? n : fmt::format("{}+{}", n, dtype_name(compress));
}

Policy Policy::compressed(DType storage) const {
  if (storage != DType::f16 && storage != DType::bf16)
    throw Error(fmt::format("Policy::compressed: storage dtype must be f16 or bf16, got {}", dtype_name(storage)));
  if (kind == Kind::budget || kind == Kind::optimal_chain)
    throw Error(fmt::format("Policy::compressed: not available for {}", name()));
  if (offload) throw Error(fmt::format("Policy::compressed: not available with host offload ({})", name()));
  Policy p = *this;
  p.compress = storage;
  p.cache = std::make_shared<PlanCache>();  // plans differ from the uncompressed policy's
  return p;
}

Policy Policy::offloaded() const {
  if (kind == Kind::budget || kind == Kind::optimal_chain)
    throw Error(fmt::format("Policy::offloaded: not available for {}", name()));
  if (compress != DType::f32)
    throw Error(fmt::format("Policy::offloaded: not available with compression ({})", name()));
  Policy p = *this;
  p.offload = true;
  p.cache = std::make_shared<PlanCache>();  // plans differ from the policy's without offload
  return p;
}

namespace policy {
namespace {
// A policy of `kind` with its own plan cache (shared by its copies).
Policy cached(Policy::Kind kind) {
  Policy p;
  p.kind = kind;
  p.cache = std::make_shared<PlanCache>();
  return p;
}
}  // namespace
Policy keep_all() { return {}; }  // planning it costs no more than a cache lookup
Policy manual() { return cached(Policy::Kind::manual); }
Policy uniform(std::int64_t k) {
  if (k < 1) throw Error(fmt::format("policy::uniform: k must be >= 1, got {}", k));
  Policy p = cached(Policy::Kind::uniform);
  p.every = k;
  return p;
}
Policy sqrt_n() { return cached(Policy::Kind::sqrt_n); }
Policy selective(KeepFn keep) {
  if (!keep) throw Error("policy::selective: empty predicate");
  Policy p = cached(Policy::Kind::selective);
  p.keep = std::move(keep);
  return p;
}
Policy budget(std::int64_t bytes) {
  if (bytes < 0) throw Error(fmt::format("policy::budget: negative budget {} B", bytes));
  Policy p = cached(Policy::Kind::budget);
  p.budget_bytes = bytes;
  return p;
}
Policy optimal_chain(std::int32_t slots) {
  if (slots < 1) throw Error(fmt::format("policy::optimal_chain: needs at least 1 slot, got {}", slots));
  Policy p = cached(Policy::Kind::optimal_chain);
  p.slots = slots;
  return p;
}
}  // namespace policy

bool save_matmuls(const NodeInfo& info) { return info.op == OpId::matmul || info.op == OpId::conv2d; }

Var checkpoint(const Var& x) {
  if (!x.defined()) throw Error("checkpoint: undefined Var");
  x.graph()->node(x.id()).checkpoint = true;
  return x;
}

namespace {
// Policy is a plain struct whose fields a user may edit after making it: the
// constructors' checks again, at use, so an edited field is an ad::Error
// naming it, never a division by zero or an empty std::function call.
void check_policy(const Policy& p) {
  const std::string n = p.name();
  switch (p.kind) {
    case Policy::Kind::keep_all:
    case Policy::Kind::manual:
    case Policy::Kind::sqrt_n: break;
    case Policy::Kind::uniform:
      if (p.every < 1) throw Error(fmt::format("backward: policy {}: `every` must be >= 1, got {}", n, p.every));
      break;
    case Policy::Kind::selective:
      if (!p.keep) throw Error(fmt::format("backward: policy {}: `keep` is an empty predicate", n));
      break;
    case Policy::Kind::budget:
      if (p.budget_bytes < 0) throw Error(fmt::format("backward: policy {}: negative budget_bytes {}", n, p.budget_bytes));
      break;
    case Policy::Kind::optimal_chain:
      if (p.slots < 1) throw Error(fmt::format("backward: policy {}: `slots` must be >= 1, got {}", n, p.slots));
      break;
    default:
      throw Error(fmt::format("backward: policy kind {} is not one of Policy::Kind",
                              static_cast<int>(static_cast<std::uint8_t>(p.kind))));
  }
  if (p.compress != DType::f32 && p.compress != DType::f16 && p.compress != DType::bf16)
    throw Error(fmt::format("backward: policy {}: `compress` must be f32 (off), f16 or bf16", n));
  const bool keep_set = p.kind != Policy::Kind::budget && p.kind != Policy::Kind::optimal_chain;
  if ((p.compress != DType::f32 || p.offload) && !keep_set)
    throw Error(fmt::format("backward: policy {}: compression and offload apply to keep-set policies only", n));
  if (p.compress != DType::f32 && p.offload)
    throw Error(fmt::format("backward: policy {}: compression and offload cannot be combined", n));
}

// Forward nodes that own memory (views are free to recompute and never kept).
std::vector<std::int32_t> forward_storage(const planner::Problem& p) {
  std::vector<std::int32_t> f;
  for (auto id : p.forward)
    if (!op_def(p.g.node(id).op).view) f.push_back(id);
  return f;
}
std::vector<char> keep_mask(const planner::Problem& p, const Policy& pol) {
  std::vector<char> keep(static_cast<std::size_t>(p.hi + 1), 0);
  auto fs = forward_storage(p);
  switch (pol.kind) {
    case Policy::Kind::keep_all: std::fill(keep.begin(), keep.end(), 1); break;
    case Policy::Kind::manual:
      if (auto marked = planner::marked_keep(p); !marked.empty()) keep = std::move(marked);
      break;
    case Policy::Kind::uniform:  // every k-th value, whatever the structure: the one knob, predictable
      for (std::size_t i = 0; i < fs.size(); ++i)
        if ((static_cast<std::int64_t>(i) + 1) % pol.every == 0) keep[static_cast<std::size_t>(fs[i])] = 1;
      break;
    case Policy::Kind::sqrt_n:  // about sqrt(n) segments, cut where the fewest bytes cross
      keep = planner::boundary_keep(
          p, fs, std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(fs.size()))))));
      break;
    case Policy::Kind::selective:
      for (auto id : p.forward) {
        const Node& nd = p.g.node(id);
        auto u = static_cast<std::size_t>(id);
        keep[u] = pol.keep(NodeInfo{id, nd.op, p.bytes[u], p.flops[u], nd.checkpoint});
      }
      break;
    default: break;
  }
  return keep;
}
// Bytes of forward values (computed here, owning memory) held right after the
// forward pass's last node (the loss) is first computed, not counting the targets.
std::int64_t kept_bytes(const planner::Problem& p, const Schedule& s) {
  std::vector<std::int64_t> held(static_cast<std::size_t>(p.hi + 1), 0);  // bytes each value holds now
  std::int64_t live = 0;
  for (const Step& st : s.steps) {
    auto u = static_cast<std::size_t>(st.node);
    if (!(st.node <= p.boundary && p.needed[u] && p.bytes[u] > 0)) {
      if (st.kind == Step::Kind::compute && st.node == p.boundary) return live;
      continue;
    }
    std::int64_t now = held[u];
    switch (st.kind) {
      case Step::Kind::compute:
        if (st.node == p.boundary) return live;
        now = p.bytes[u];
        break;
      case Step::Kind::free: now = 0; break;
      case Step::Kind::compress:
        now = p.g.node(st.node).meta.shape.numel() * static_cast<std::int64_t>(dtype_size(static_cast<DType>(st.aux)));
        break;
      case Step::Kind::decompress:
      case Step::Kind::prefetch: now = p.bytes[u]; break;
      case Step::Kind::offload: now = 0; break;
      case Step::Kind::accumulate: break;
    }
    live += now - held[u];
    held[u] = now;
  }
  return live;
}
}  // namespace

Schedule plan(GraphImpl& g, const std::vector<std::int32_t>& targets, const std::vector<Sink>& sinks,
              const Policy& policy, const std::vector<std::int32_t>& outputs) {
  auto t0 = std::chrono::steady_clock::now();
  for (const auto* list : {&targets, &outputs})
    for (auto t : *list)
      if (t < 0 || static_cast<std::size_t>(t) >= g.nodes.size()) throw Error(fmt::format("plan: target {} is not a node", t));
  for (const auto& s : sinks)
    if (s.node < 0 || static_cast<std::size_t>(s.node) >= g.nodes.size())
      throw Error(fmt::format("plan: sink {} is not a node", s.node));
  check_policy(policy);
  g.refresh_leaves();  // values computed from leaves written since the last run are dropped first
  std::vector<std::uint64_t> key;
  Schedule s;
  // A selective policy's plan depends on its predicate only through the
  // nodes it keeps: the mask is computed first (one call per forward node)
  // and is part of the cache key, so any predicate, a lambda's captures
  // included, plans afresh exactly when it keeps other nodes.
  std::optional<planner::Problem> prob;
  std::vector<char> mask;
  if (policy.kind == Policy::Kind::selective) {
    prob.emplace(g, targets, sinks, outputs);
    mask = keep_mask(*prob, policy);
  }
  if (policy.cache) {
    std::vector<std::int32_t> all = targets;
    all.insert(all.end(), outputs.begin(), outputs.end());
    key = PlanCache::key(g, all, sinks);
    key.push_back(outputs.size());  // which of them are outputs: the forward pass ends elsewhere
    // copies share the cache, and a copy may change any setting: every one is
    // part of the key
    key.push_back(static_cast<std::uint64_t>(policy.kind));
    key.push_back(static_cast<std::uint64_t>(policy.every));
    key.push_back(static_cast<std::uint64_t>(policy.budget_bytes));
    key.push_back(static_cast<std::uint64_t>(static_cast<std::uint32_t>(policy.slots)));
    key.push_back(static_cast<std::uint64_t>(policy.compress));
    key.push_back(policy.offload);
    key.push_back(policy.reuse_buffers);
    key.push_back(mask.size());
    for (std::size_t i = 0; i < mask.size(); i += 64) {  // the mask, 64 nodes a word
      std::uint64_t w = 0;
      for (std::size_t j = i; j < std::min(mask.size(), i + 64); ++j) w |= static_cast<std::uint64_t>(mask[j] != 0) << (j - i);
      key.push_back(w);
    }
    if (policy.cache->find(key, s)) {
      s.sinks.clear();  // the cached plan's steps, this call's parameters
      for (const auto& sk : sinks) s.sinks.push_back(sk.param);
      s.from_cache = true;
      s.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return s;
    }
  }
  if (!prob) prob.emplace(g, targets, sinks, outputs);
  planner::Problem& p = *prob;
  switch (policy.kind) {
    case Policy::Kind::budget: s = planner::budget(p, policy.budget_bytes, policy.reuse_buffers); break;
    case Policy::Kind::optimal_chain: s = planner::optimal_chain(p, policy.slots); break;
    default:
      s = planner::keep_set(p, mask.empty() ? keep_mask(p, policy) : mask, policy.compress, policy.offload);
      if (policy.offload) planner::hoist_prefetches(p, s);
      break;
  }
  if (policy.reuse_buffers) planner::reuse_dying_inputs(p, s);
  s.predicted_peak_bytes = simulate_peak(g, s);
  s.offload_peak_bytes = planner::offload_peak(p, s);
  s.kept_bytes = kept_bytes(p, s);
  if (policy.kind == Policy::Kind::budget) s.budget_bytes = policy.budget_bytes;
  s.policy = policy.name();
  if (policy.cache) {
    Schedule stored = s;
    stored.sinks.clear();  // parameters are not part of the plan
    policy.cache->insert(std::move(key), stored);
  }
  s.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

std::int32_t forward_boundary(const Schedule& s) {
  if (s.boundary >= 0) return s.boundary;
  std::int32_t b = -1;
  for (auto t : s.targets) b = std::max(b, t);
  return b;
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
  std::vector<char> away(n, 0);            // offloaded to host memory
  std::vector<char> packed(n, 0);          // stored compressed
  // a sink's gradient buffer takes a gradient in place (no graph bytes) while
  // it is absent or zeroed, as the executor decides at the step: a gradient
  // written or added since (another backward after planning) makes the step
  // allocate in the graph instead
  std::unordered_map<const ParamState*, bool> writable;
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
  // sums checked: a graph of values near 2^62 bytes each must not wrap to a small peak that a budget accepts
  auto grow = [&](std::int64_t bytes, std::int64_t extra, const Step& st) {
    std::int64_t now = 0, top = 0;
    if (__builtin_add_overflow(live, bytes, &now) || __builtin_add_overflow(now, extra, &top))
      throw Error(fmt::format("simulate_peak: at {} of {}#{} the step holds more than 2^63 bytes at once; no device "
                              "holds this graph",
                              st.kind == Step::Kind::compute ? "the compute" : "a copy",
                              op_def(g.node(st.node).op).name, st.node));
    live = now;
    peak = std::max(peak, top);
  };
  auto release = [&](std::int32_t k) {
    if (k < 0) return;
    Instance& in = inst[static_cast<std::size_t>(k)];
    if (--in.refs == 0 && !in.pinned) live -= in.bytes;
  };
  auto name = [&](std::int32_t id) { return fmt::format("{}#{}", op_def(g.node(id).op).name, id); };
  std::vector<const Meta*> metas;
  for (const Step& st : s.steps) {
    if (std::string e = detail::step_error(g, st, s.sinks); !e.empty()) throw Error("simulate_peak: " + e);
    auto u = static_cast<std::size_t>(st.node);
    switch (st.kind) {
      case Step::Kind::compute: {
        const Node& nd = g.nodes[u];
        const OpDef& def = op_def(nd.op);
        if (!def.cpu)
          throw Error(fmt::format("simulate_peak: {} is a leaf and cannot be computed (bad schedule)", name(st.node)));
        for (auto in : nd.inputs) {
          if (holds[static_cast<std::size_t>(in)] < 0)
            throw Error(fmt::format("simulate_peak: {} needs input {} which holds no value (bad schedule)",
                                    name(st.node), name(in)));
          if (packed[static_cast<std::size_t>(in)])
            throw Error(fmt::format("simulate_peak: {} reads {} while it is stored compressed (bad schedule)",
                                    name(st.node), name(in)));
        }
        bool in_grad = false;  // written into the parameter's gradient buffer
        if (st.aux >= 0 && !def.view) {
          const ParamState* ps = s.sinks[static_cast<std::size_t>(st.aux)].state();
          auto [w, fresh] = writable.try_emplace(ps, false);
          if (fresh) w->second = ps->grad_writable(nd.meta);
          in_grad = w->second;
          w->second = false;  // holds this gradient now
        }
        std::int32_t now;
        std::int64_t fresh_bytes = 0;
        const std::int32_t victim = st.reuse >= 0 ? holds[static_cast<std::size_t>(st.reuse)] : -1;
        if (victim >= 0 && inst[static_cast<std::size_t>(victim)].refs == 1 && !inst[static_cast<std::size_t>(victim)].pinned) {
          // written over the dying input's buffer (step_error checked the step; as the executor, only when
          // no other value and nothing outside the graph holds it): its reference moves to this node
          now = holds[static_cast<std::size_t>(st.reuse)];
          holds[static_cast<std::size_t>(st.reuse)] = -1;
        } else if (in_grad) {  // written into a parameter's gradient buffer: not the graph's bytes
          now = static_cast<std::int32_t>(inst.size());
          inst.push_back({0, 1, false});
        } else if (def.view) {
          now = holds[static_cast<std::size_t>(nd.inputs[0])];
          ++inst[static_cast<std::size_t>(now)].refs;
        } else {
          now = static_cast<std::int32_t>(inst.size());
          inst.push_back({static_cast<std::int64_t>(nd.meta.nbytes()), 1, false});
          fresh_bytes = inst.back().bytes;
        }
        std::int64_t ws = 0;
        if (def.workspace) {
          metas.clear();
          for (auto in : nd.inputs) metas.push_back(&g.node(in).meta);
          ws = std::max<std::int64_t>(def.workspace(InferArgs{def, metas, nd.attrs}, nd.meta), 0);
        }
        grow(fresh_bytes, ws, st);
        release(holds[u]);  // the executor replaces the old value after making the new one
        holds[u] = now;
        packed[u] = 0;
        break;
      }
      case Step::Kind::free:
        release(holds[u]);
        holds[u] = -1;
        packed[u] = 0;
        break;
      case Step::Kind::accumulate:
        if (holds[u] < 0)
          throw Error(fmt::format("simulate_peak: accumulate of {} which holds no value (bad schedule)", name(st.node)));
        if (packed[u])
          throw Error(fmt::format("simulate_peak: accumulate of {} while it is stored compressed (bad schedule)",
                                  name(st.node)));
        writable[s.sinks[static_cast<std::size_t>(st.aux)].state()] = false;  // a gradient is there now
        break;
      case Step::Kind::compress:
      case Step::Kind::decompress: {
        if (holds[u] < 0)
          throw Error(fmt::format("simulate_peak: (de)compress of {} which holds no value (bad schedule)", name(st.node)));
        const Meta& m = g.nodes[u].meta;
        auto es = st.kind == Step::Kind::compress ? dtype_size(static_cast<DType>(st.aux)) : dtype_size(m.dtype);
        inst.push_back({m.shape.numel() * static_cast<std::int64_t>(es), 1, false});
        grow(inst.back().bytes, 0, st);
        release(holds[u]);
        holds[u] = static_cast<std::int32_t>(inst.size() - 1);
        packed[u] = st.kind == Step::Kind::compress;
        break;
      }
      case Step::Kind::offload:  // the graph's bytes leave; host bytes are not the graph's
        if (holds[u] < 0)
          throw Error(fmt::format("simulate_peak: offload of {} which holds no value (bad schedule)", name(st.node)));
        if (g.nodes[u].meta.nbytes() == 0 || op_def(g.nodes[u].op).view)
          throw Error(fmt::format("simulate_peak: offload of {}, a view or empty value (bad schedule)", name(st.node)));
        if (packed[u])
          throw Error(fmt::format("simulate_peak: offload of {} while it is stored compressed (bad schedule)",
                                  name(st.node)));
        release(holds[u]);
        holds[u] = -1;
        away[u] = 1;
        break;
      case Step::Kind::prefetch:
        if (!away[u])
          throw Error(fmt::format("simulate_peak: prefetch of {} which is not offloaded (bad schedule)", name(st.node)));
        inst.push_back({static_cast<std::int64_t>(g.nodes[u].meta.nbytes()), 1, false});
        grow(inst.back().bytes, 0, st);
        holds[u] = static_cast<std::int32_t>(inst.size() - 1);
        away[u] = 0;
        break;
    }
    if (st.kind == Step::Kind::free) away[u] = 0;
  }
  return peak;
}

}  // namespace ad
