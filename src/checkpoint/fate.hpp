#pragma once
// Internal: what a schedule does with each node's value, read off its steps.
// explain() and to_dot() both describe plans through it.
#include <cstdint>
#include <vector>

#include "core/graph_impl.hpp"

namespace ad::planner {

struct Fates {
  std::size_t n = 0;                        // node ids < n appear in the schedule
  std::int32_t boundary = -1;               // forward nodes: ids <= forward_boundary(schedule)
  std::vector<std::int32_t> computes;       // compute steps per node
  std::vector<std::int32_t> recomputed;     // computes after the value had been freed
  std::vector<char> present_at_end, target, compressed, offloaded;
  bool forward(std::size_t i) const { return static_cast<std::int32_t>(i) <= boundary; }
};

inline Fates fates(const Schedule& s) {
  Fates f;
  std::int32_t hi = -1;
  for (const auto& st : s.steps) hi = std::max(hi, st.node);
  for (auto t : s.targets) hi = std::max(hi, t);
  f.n = static_cast<std::size_t>(hi + 1);
  f.computes.assign(f.n, 0);
  f.recomputed.assign(f.n, 0);
  f.present_at_end.assign(f.n, 0);
  f.target.assign(f.n, 0);
  f.compressed.assign(f.n, 0);
  f.offloaded.assign(f.n, 0);
  for (auto t : s.targets) f.target[static_cast<std::size_t>(t)] = 1;
  f.boundary = forward_boundary(s);
  for (const auto& st : s.steps) {
    auto u = static_cast<std::size_t>(st.node);
    if (st.kind == Step::Kind::compute) {
      if (f.computes[u] > 0 && !f.present_at_end[u]) ++f.recomputed[u];
      ++f.computes[u];
      f.present_at_end[u] = 1;
    } else if (st.kind == Step::Kind::free) {
      f.present_at_end[u] = 0;
    } else if (st.kind == Step::Kind::compress) {
      f.compressed[u] = 1;
    } else if (st.kind == Step::Kind::offload) {
      f.offloaded[u] = 1;
    }
  }
  return f;
}

}  // namespace ad::planner
