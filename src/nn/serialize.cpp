#include "ad/nn/serialize.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <unordered_map>

#include "nn/named_index.hpp"

namespace ad::nn {

NamedTensors module_state(const Module& m) {
  NamedTensors out;
  for (auto& np : m.named_parameters()) out.emplace_back(np.first, np.second.value());
  for (auto& nb : m.named_buffers()) out.emplace_back(nb.first, nb.second);
  return out;
}

namespace {
// One tensor of the module under every name it has (a parameter tied under
// two names: an embedding and the output head).
struct Slot {
  Tensor dst;
  std::vector<std::string> names;
};
bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.raw() == b.raw() && a.shape() == b.shape() && a.dtype() == b.dtype();
}
std::vector<Slot> slots_of(const Module& m) {
  std::vector<Slot> out;
  std::unordered_multimap<const void*, std::size_t> at;  // data address -> slots starting there
  for (auto& nt : module_state(m)) {
    auto [lo, hi] = at.equal_range(nt.second.raw());
    auto it = std::find_if(lo, hi, [&](const auto& e) { return same_tensor(out[e.second].dst, nt.second); });
    if (it != hi) {
      out[it->second].names.push_back(nt.first);
    } else {
      at.emplace(nt.second.raw(), out.size());
      out.push_back({nt.second, {nt.first}});
    }
  }
  return out;
}
// What is written to a file: each tensor once, under its first name.
NamedTensors saved_state(const Module& m) {
  NamedTensors out;
  for (auto& s : slots_of(m)) out.emplace_back(s.names.front(), s.dst);
  return out;
}
std::string joined(const std::vector<std::string>& names) {
  std::string r;
  for (const auto& n : names) r += (r.empty() ? "\"" : ", \"") + n + "\"";
  return r;
}
// Checks `state` against the module; returns the (destination, source) pairs to copy.
// `what` names the caller in errors (load_module_state, load_checkpoint).
// A tied tensor needs one of its names in the source (files hold it once);
// under several, they must hold the same values.
std::vector<std::pair<Tensor, const Tensor*>> match_module_state(const Module& m, const NamedTensors& state, bool strict,
                                                                 const char* what) {
  const detail::NamedIndex src(state, what);
  std::set<std::string> names;
  std::vector<std::pair<Tensor, const Tensor*>> out;
  for (const Slot& slot : slots_of(m)) {
    const Tensor& d = slot.dst;
    const Tensor* found = nullptr;
    const std::string* found_name = nullptr;
    for (const auto& name : slot.names) {
      names.insert(name);
      const Tensor* s = src.find(name);
      if (!s) continue;
      if (s->shape() != d.shape() || s->dtype() != d.dtype())
        throw Error(fmt::format("{}: \"{}\" is {}{} in the source but {}{} in the module", what, name,
                                dtype_name(s->dtype()), s->shape().str(), dtype_name(d.dtype()), d.shape().str()));
      if (found && !bitwise_equal(*found, *s))
        throw Error(fmt::format("{}: \"{}\" and \"{}\" are one tied tensor of the module but hold different values in "
                                "the source",
                                what, *found_name, name));
      if (!found) { found = s; found_name = &name; }
    }
    if (!found) {
      if (strict)
        throw Error(fmt::format("{}: {} ({}{}) is missing", what,
                                slot.names.size() == 1 ? joined(slot.names) : "tied " + joined(slot.names) + ": all",
                                dtype_name(d.dtype()), d.shape().str()));
      continue;
    }
    out.emplace_back(d, found);
  }
  if (strict)
    for (const auto& nt : state)
      if (!names.count(nt.first))
        throw Error(fmt::format("{}: unexpected tensor \"{}\" (not a parameter or buffer of the module)", what, nt.first));
  return out;
}
// A source sharing storage with another pair's destination (a state taken
// from the module itself with its names moved: swapping two layers) is copied
// before any destination is written, so that no source is overwritten before
// it is read.
void apply(std::vector<std::pair<Tensor, const Tensor*>>& pairs) {
  std::unordered_map<const Storage*, int> dests;  // destinations per storage
  for (const auto& p : pairs) ++dests[p.first.storage().get()];
  std::vector<Tensor> snapshots;
  snapshots.reserve(pairs.size());
  for (auto& p : pairs) {
    const Storage* s = p.second->storage().get();
    auto it = dests.find(s);
    const bool aliased = it != dests.end() && it->second > (p.first.storage().get() == s ? 1 : 0);
    if (aliased) {
      snapshots.push_back(p.second->clone());
      p.second = &snapshots.back();  // reserve() above: the address stays
    }
  }
  for (auto& p : pairs) p.first.copy_from(*p.second);
}
}  // namespace

void load_module_state(const Module& m, const NamedTensors& state, bool strict) {
  auto pairs = match_module_state(m, state, strict, "load_module");
  apply(pairs);
}

void save_module(const std::string& path, const Module& m, const Metadata& metadata) {
  save_safetensors(path, saved_state(m), metadata);
}
Metadata load_module(const std::string& path, const Module& m, bool strict) {
  SafeTensors st = load_safetensors(path);
  try {
    load_module_state(m, st.tensors, strict);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (file {})", e.what(), path));
  }
  return st.metadata;
}

namespace {
constexpr const char* kOptimKind = "ad.optimizer";
constexpr const char* kOptimHyper = "ad.optimizer.hyperparameters";
// `metadata` with the optimizer's own entries added
Metadata with_optimizer(const Metadata& metadata, const Optimizer& opt, const char* what) {
  Metadata m = metadata;
  for (const char* k : {kOptimKind, kOptimHyper}) {
    if (m.count(k))
      throw Error(fmt::format("{}: metadata key \"{}\" is reserved for the optimizer's kind and hyperparameters", what, k));
  }
  m[kOptimKind] = opt.name();
  m[kOptimHyper] = opt.hyperparameters();
  return m;
}
// a file without the entry (written before they were recorded, or by hand) is accepted
void check_kind(const Metadata& m, const Optimizer& opt, const std::string& path, const char* what) {
  auto it = m.find(kOptimKind);
  if (it != m.end() && it->second != opt.name())
    throw Error(fmt::format("{}: {} holds {} state; this optimizer is {}", what, path, it->second, opt.name()));
}
}  // namespace

void save_optimizer(const std::string& path, const Optimizer& opt, const Metadata& metadata) {
  save_safetensors(path, opt.state(), with_optimizer(metadata, opt, "save_optimizer"));
}
Metadata load_optimizer(const std::string& path, Optimizer& opt) {
  SafeTensors st = load_safetensors(path);
  check_kind(st.metadata, opt, path, "load_optimizer");
  try {
    opt.load_state(st.tensors);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (file {})", e.what(), path));
  }
  return st.metadata;
}

namespace {
constexpr std::string_view kModel = "model.", kOptim = "optim.";
}

void save_checkpoint(const std::string& path, const Module& m, const Optimizer& opt, const Metadata& metadata) {
  NamedTensors all;
  for (auto& nt : saved_state(m)) all.emplace_back(std::string(kModel) + nt.first, nt.second);
  for (auto& nt : opt.state()) all.emplace_back(std::string(kOptim) + nt.first, nt.second);
  save_safetensors(path, all, with_optimizer(metadata, opt, "save_checkpoint"));
}

Metadata load_checkpoint(const std::string& path, const Module& m, Optimizer& opt) {
  SafeTensors st = load_safetensors(path);
  check_kind(st.metadata, opt, path, "load_checkpoint");
  NamedTensors model, optim;
  for (auto& nt : st.tensors) {
    std::string_view n = nt.first;
    if (n.starts_with(kModel)) model.emplace_back(std::string(n.substr(kModel.size())), nt.second);
    else if (n.starts_with(kOptim)) optim.emplace_back(std::string(n.substr(kOptim.size())), nt.second);
    else throw Error(fmt::format("load_checkpoint: {}: tensor \"{}\" is neither model.* nor optim.*", path, nt.first));
  }
  // Nothing changes unless both fit: the module is checked, then the
  // optimizer checks and loads, then the module's values are copied.
  try {
    auto pairs = match_module_state(m, model, true, "load_checkpoint");
    opt.load_state(optim);
    apply(pairs);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (file {})", e.what(), path));
  }
  return st.metadata;
}

}  // namespace ad::nn
