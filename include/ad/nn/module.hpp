#pragma once
// Modules: named groups of Parameters that build graph nodes.
//
// A module lists its own parameters, buffers (persistent non-trained state,
// e.g. Dropout's random stream) and direct submodules in visit(); everything
// else — named_parameters(), train()/eval(), zero_grad() — walks that list.
// Modules hold no pointers to their members, so they copy and move freely.
// A copy shares the Parameters and buffers (both are shared handles) and has
// its own train/eval flag.
//
// A new module (attention, a transformer block, a CRF head) is a class with
// its parameters and submodules as members, a constructor that initialises
// them from an ad::Rng, a visit() that names them, and an operator() that
// builds its output from ops and its submodules' operator().
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ad/graph.hpp"

namespace ad::nn {

class Module;

// Receives the members of one module (not of its submodules: the walker
// recurses through `module`).
class Visitor {
 public:
  virtual ~Visitor() = default;
  virtual void parameter(const std::string& name, const Parameter& p) = 0;
  // Persistent state that is not trained (saved and loaded with parameters).
  virtual void buffer(const std::string& name, const Tensor& t) = 0;
  virtual void module(const std::string& name, const Module& m) = 0;
};

using NamedParameters = std::vector<std::pair<std::string, Parameter>>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;

  // Names this module's own parameters, buffers and submodules, in a fixed
  // order (the order of named_parameters()).
  virtual void visit(Visitor& v) const = 0;

  // Every parameter of this module and its submodules, depth first, named by
  // the path of submodule names: "blocks.0.attn.q.weight".
  NamedParameters named_parameters() const;
  std::vector<Parameter> parameters() const;
  // Every buffer, named like parameters.
  NamedTensors named_buffers() const;
  // Total number of trainable elements (a parameter tied under two names counts once).
  std::int64_t num_parameters() const;
  // Sets the gradient of every parameter that has one to zero.
  void zero_grad() const;

  // Training mode (the default) or evaluation mode, for this module and all
  // submodules. Dropout is the identity in evaluation mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

 private:
  bool training_ = true;
};

// A list of modules of one type, named "0", "1", ... (so a list member
// `blocks` gives "blocks.3.ln1.weight").
template <class M> class ModuleList : public Module {
 public:
  ModuleList() = default;
  explicit ModuleList(std::vector<M> items) : items_(std::move(items)) {}
  void push_back(M m) { items_.push_back(std::move(m)); }
  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  M& operator[](std::size_t i) { return items_[i]; }
  const M& operator[](std::size_t i) const { return items_[i]; }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  void visit(Visitor& v) const override {
    for (std::size_t i = 0; i < items_.size(); ++i) v.module(std::to_string(i), items_[i]);
  }

 private:
  std::vector<M> items_;
};

}  // namespace ad::nn
