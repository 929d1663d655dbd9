#include "checkpoint/cache.hpp"

#include <algorithm>
#include <cstring>

#include "checkpoint/planner.hpp"
#include "core/graph_impl.hpp"

namespace ad {

std::vector<std::uint64_t> PlanCache::key(const GraphImpl& g, const std::vector<std::int32_t>& targets,
                                          const std::vector<Sink>& sinks) {
  std::int32_t hi = -1;
  for (auto t : targets) hi = std::max(hi, t);
  for (const auto& s : sinks) hi = std::max(hi, s.node);
  std::vector<std::uint64_t> k;
  k.reserve(static_cast<std::size_t>(hi + 1) * 24 + 8);
  auto shape = [&](const Shape& s) {
    k.push_back(static_cast<std::uint64_t>(s.rank()));
    for (auto d : s) k.push_back(static_cast<std::uint64_t>(d));
  };
  auto dbl = [&](double d) { std::uint64_t u; std::memcpy(&u, &d, 8); k.push_back(u); };
  std::vector<const Meta*> metas;
  for (std::int32_t id = 0; id <= hi; ++id) {
    const Node& n = g.node(id);
    k.push_back(static_cast<std::uint64_t>(n.op) | (static_cast<std::uint64_t>(n.value.defined()) << 16) |
                (static_cast<std::uint64_t>(n.checkpoint) << 17) | (static_cast<std::uint64_t>(n.meta.dtype) << 24) |
                (static_cast<std::uint64_t>(n.inputs.size()) << 32));
    for (auto in : n.inputs) k.push_back(static_cast<std::uint64_t>(in));
    // the device: kernels and their workspaces differ between CPU and GPU
    k.push_back(static_cast<std::uint64_t>(n.meta.device.kind) << 32 | static_cast<std::uint32_t>(n.meta.device.index));
    shape(n.meta.shape);
    const Attrs& a = n.attrs;
    shape(a.shape);
    shape(a.axes);
    k.push_back(static_cast<std::uint64_t>(a.axis));
    k.push_back(static_cast<std::uint64_t>(a.start));
    k.push_back(static_cast<std::uint64_t>(a.stop));
    dbl(a.scalar);
    dbl(a.scalar2);
    k.push_back(static_cast<std::uint64_t>(a.keepdim) | (static_cast<std::uint64_t>(a.trans_a) << 1) |
                (static_cast<std::uint64_t>(a.trans_b) << 2) |
                (static_cast<std::uint64_t>(a.causal) << 3) | (static_cast<std::uint64_t>(a.reduction) << 8) |
                (static_cast<std::uint64_t>(a.dtype) << 16) | (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a.which)) << 32));
    for (int i = 0; i < 2; ++i)
      for (std::int64_t v : {a.stride[i], a.pad[i], a.dilation[i], a.window[i]}) k.push_back(static_cast<std::uint64_t>(v));
    k.push_back(static_cast<std::uint64_t>(a.groups));
    // not a.seed or a.offset: a random op's stream position changes every
    // step (dropout drawn from an Rng) and changes no size, cost or step
    // The workspace the op asks for: a planner input that may depend on more
    // than the node (a kernel setting read when it is sized)
    const OpDef& def = op_def(n.op);
    if (def.workspace) {
      metas.clear();
      for (auto in : n.inputs) metas.push_back(&g.node(in).meta);
      k.push_back(static_cast<std::uint64_t>(def.workspace(InferArgs{def, metas, n.attrs}, n.meta)));
    }
  }
  k.push_back(~0ull);
  for (auto t : targets) k.push_back(static_cast<std::uint64_t>(t));
  k.push_back(~0ull);
  for (const auto& s : sinks) k.push_back(static_cast<std::uint64_t>(s.node));
  k.push_back(~0ull);  // which gradients are written in place depends on the parameters' state
  for (char w : planner::writable_sinks(g, sinks)) k.push_back(static_cast<std::uint64_t>(w));
  return k;
}

bool PlanCache::find(const std::vector<std::uint64_t>& k, Schedule& out) {
  std::lock_guard<std::mutex> lock(m_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->key == k) {
      entries_.splice(entries_.begin(), entries_, it);
      out = entries_.front().s;
      return true;
    }
  return false;
}

void PlanCache::insert(std::vector<std::uint64_t> k, const Schedule& s) {
  std::lock_guard<std::mutex> lock(m_);
  // threads that missed together (copies of one model on several threads)
  // each insert the plan: one entry per key, else the copies push others out
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->key == k) {
      entries_.erase(it);
      break;
    }
  entries_.push_front({std::move(k), s});
  if (entries_.size() > kCapacity) entries_.pop_back();
}

std::size_t PlanCache::size() {
  std::lock_guard<std::mutex> lock(m_);
  return entries_.size();
}

}  // namespace ad
