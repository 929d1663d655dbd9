// Looking tensors up by name in a NamedTensors list (optimizer and module
// states): one hash map, so loading a state of n tensors costs O(n), not the
// O(n^2) of a scan per name (40,000 parameters took 36 s that way).
#pragma once

#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "ad/error.hpp"
#include "ad/nn/module.hpp"

namespace ad::nn::detail {

class NamedIndex {
 public:
  // `where` names the caller in the error for a name that appears twice
  NamedIndex(const NamedTensors& s, const char* where) {
    by_name_.reserve(s.size());
    for (const auto& nt : s)
      if (!by_name_.emplace(nt.first, &nt.second).second)
        throw Error(fmt::format("{}: tensor \"{}\" appears twice", where, nt.first));
  }
  // nullptr where there is no tensor of that name
  const Tensor* find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }

 private:
  std::unordered_map<std::string, const Tensor*> by_name_;
};

}  // namespace ad::nn::detail
