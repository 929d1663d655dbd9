#include "ad/nn/module.hpp"

#include <functional>
#include <unordered_set>

namespace ad::nn {

namespace {

// Walks a module tree depth first, calling the callbacks with full names.
class Walker : public Visitor {
 public:
  std::function<void(const std::string&, const Parameter&)> on_parameter;
  std::function<void(const std::string&, const Tensor&)> on_buffer;
  std::function<void(const Module&)> on_module;

  void walk(const Module& m) {
    if (on_module) on_module(m);
    m.visit(*this);
  }
  void parameter(const std::string& name, const Parameter& p) override {
    if (on_parameter && p.defined()) on_parameter(prefix_ + name, p);
  }
  void buffer(const std::string& name, const Tensor& t) override {
    if (on_buffer && t.defined()) on_buffer(prefix_ + name, t);
  }
  void module(const std::string& name, const Module& m) override {
    std::string saved = prefix_;
    prefix_ += name + ".";
    walk(m);
    prefix_ = std::move(saved);
  }

 private:
  std::string prefix_;
};

}  // namespace

NamedParameters Module::named_parameters() const {
  NamedParameters out;
  Walker w;
  w.on_parameter = [&](const std::string& n, const Parameter& p) { out.emplace_back(n, p); };
  w.walk(*this);
  return out;
}

std::vector<Parameter> Module::parameters() const {
  std::vector<Parameter> out;
  for (auto& np : named_parameters()) out.push_back(np.second);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  Walker w;
  w.on_buffer = [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); };
  w.walk(*this);
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  std::unordered_set<const ParamState*> seen;  // a tied parameter (under two names) counts once
  for (auto& np : named_parameters())
    if (seen.insert(np.second.state()).second) n += np.second.value().numel();
  return n;
}

void Module::zero_grad() const {
  for (auto& np : named_parameters())
    if (np.second.has_grad()) np.second.zero_grad();
}

void Module::train(bool on) {
  Walker w;
  // visit() hands out submodules as const; they are parts of *this, which is
  // not const here, so changing their flag is well defined.
  w.on_module = [&](const Module& m) { const_cast<Module&>(m).training_ = on; };
  w.walk(*this);
}

}  // namespace ad::nn
