#pragma once
// Internal: plans cached by graph structure, owned by a Policy (copies share).
#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ad/policy.hpp"
#include "ad/schedule.hpp"

namespace ad {

// Plans keyed by everything the planner reads: each involved node's op,
// inputs, attrs, meta, checkpoint mark and whether it holds a value, plus the
// targets and sinks. Keys are compared in full (no false hits). Keeps the
// most recent kCapacity plans, one per key. Locked: Policy copies on
// several threads share it.
class PlanCache {
 public:
  static constexpr std::size_t kCapacity = 32;
  static std::vector<std::uint64_t> key(const GraphImpl& g, const std::vector<std::int32_t>& targets,
                                        const std::vector<Sink>& sinks);
  bool find(const std::vector<std::uint64_t>& k, Schedule& out);
  void insert(std::vector<std::uint64_t> k, const Schedule& s);
  std::size_t size();

 private:
  struct Entry { std::vector<std::uint64_t> key; Schedule s; };
  std::mutex m_;
  std::list<Entry> entries_;  // most recent first
};

}  // namespace ad
