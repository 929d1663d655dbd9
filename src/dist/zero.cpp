// Zero1: optimizer state partitioned across ranks (ZeRO stage 1).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <unordered_set>

#include "ad/autodiff.hpp"
#include "ad/dist.hpp"
#include "core/device.hpp"
#include "core/graph_impl.hpp"
#include "dist/impl.hpp"
#include "nn/named_index.hpp"

namespace ad::dist {

namespace {
// Copies between `part` (elements [begin, begin + part.numel()) of the
// concatenation of `ts`, flat) and the tensors: into part when to_part.
void copy_range(const std::vector<Tensor>& ts, std::int64_t begin, Tensor& part, bool to_part) {
  const std::size_t es = dtype_size(part.dtype());
  const std::int64_t end = begin + part.numel();
  std::int64_t off = 0;
  for (const Tensor& t : ts) {
    std::int64_t lo = std::max(off, begin), hi = std::min(off + t.numel(), end);
    if (lo < hi) {
      char* a = static_cast<char*>(part.raw()) + static_cast<std::size_t>(lo - begin) * es;
      char* b = static_cast<char*>(t.raw()) + static_cast<std::size_t>(lo - off) * es;
      auto n = static_cast<std::size_t>(hi - lo) * es;
      if (to_part) {
        device::copy(a, part.device(), b, t.device(), n);
      } else {
        device::copy(b, t.device(), a, part.device(), n);
        t.mark_modified();  // a parameter's values, written through raw()
      }
    }
    off += t.numel();
  }
}
std::vector<Tensor> values(const nn::NamedParameters& ps) {
  std::vector<Tensor> v;
  for (const auto& np : ps) v.push_back(np.second.value());
  return v;
}
}  // namespace

Zero1::Zero1(Communicator comm, nn::NamedParameters params, MakeOptimizer make_optimizer)
    : comm_(std::move(comm)) {
  // this rank's own argument errors go through the count check, so every rank fails, not this one alone
  std::string bad;
  try {
    std::set<const ParamState*> held;  // a parameter under two names (tied weights): one slice, its first name
    for (auto& np : params)
      if (!np.second.defined() || held.insert(np.second.state()).second) params_.push_back(std::move(np));
    if (params_.empty()) throw Error("Zero1: no parameters");
    dtype_ = params_[0].second.dtype();
    device_ = params_[0].second.value().device();
    for (const auto& [name, p] : params_) {
      if (!p.defined()) throw Error(fmt::format("Zero1: parameter '{}' is undefined", name));
      if (!(p.value().device() == device_))
        throw Error(fmt::format("Zero1: parameters must share one device: '{}' is on {}, '{}' on {}", params_[0].first,
                                device::name(device_), name, device::name(p.value().device())));
      if (p.dtype() != dtype_)
        throw Error(fmt::format("Zero1: parameters must share one dtype: '{}' is {}, '{}' is {}", params_[0].first,
                                dtype_name(dtype_), name, dtype_name(p.dtype())));
      total_ += p.value().numel();
    }
    // what the optimizer's constructor would refuse, checked here on the whole list: on every rank
    // alike (a rank whose range held the offending segment would fail alone, the others wait)
    std::set<std::string> names;
    for (const auto& np : params_) {
      if (np.first.empty()) throw Error("Zero1: a parameter has an empty name");
      if (!names.insert(np.first).second)
        throw Error(fmt::format("Zero1: parameter name \"{}\" is repeated (two different parameters)", np.first));
    }
    if (dtype_ != DType::f32 && dtype_ != DType::f64)
      throw Error(fmt::format("Zero1: parameters have dtype {}, not f32/f64", dtype_name(dtype_)));
  } catch (const Error& e) {
    bad = e.what();
  }
  check_same_count(comm_, "Zero1", params_.size(), bad);
  for (auto& np : params_) comm_.broadcast(np.second.value(), 0);
  for (const auto& np : params_) shapes_.push_back(np.second.shape());
  const std::int64_t w = comm_.size();
  shard_ = (total_ + w - 1) / w;
  begin_ = shard_ * comm_.rank();
  // this rank's segments: each parameter's part of [begin_, begin_ + shard_)
  nn::NamedParameters named;
  std::int64_t off = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::int64_t n = params_[i].second.value().numel();
    const std::int64_t lo = std::max(off, begin_), hi = std::min(off + n, begin_ + shard_);
    if (lo < hi) {
      Parameter seg(Tensor::empty({hi - lo}, dtype_, device_), params_[i].first);
      seg.value().copy_from(params_[i].second.value().view(lo - off, Shape{hi - lo}));
      segs_.push_back({i, lo - off, hi - off, lo - begin_, seg});
      named.emplace_back(params_[i].first, seg);
    }
    off += n;
  }
  reached_.assign(params_.size(), 0);
  steps_.assign(params_.size(), 0);
  opt_ = make_optimizer(std::move(named));
  if (!opt_) throw Error("Zero1: make_optimizer returned no optimizer");
}

// "" while parameter i has the shape, dtype and device it had when this was
// made (its part of the flat vector), else the error
std::string Zero1::changed(const char* where, std::size_t i) const {
  return changed_parameter(where, "Zero1", fmt::format("parameter \"{}\"", params_[i].first), shapes_[i], dtype_,
                           device_, params_[i].second.value());
}

void Zero1::reduce_gradients() {
  const char* where = "Zero1::reduce_gradients";
  // rank q's block of the flat buffer: its range of the flat gradient, then
  // one flag per parameter (1 where this rank's loss reached it); after the
  // mean, a flag above 0 means some rank's loss reached that parameter. A
  // parameter given a tensor of another shape, dtype or device since this was
  // made goes as zeros of its old size with the flag -world: the mean is
  // negative on every rank, and every rank throws after the reduce (one rank
  // throwing alone would leave the others waiting until the timeout).
  const std::int64_t w = comm_.size(), np = static_cast<std::int64_t>(params_.size()), blk = shard_ + np;
  Tensor flat = Tensor::zeros({blk * w}, dtype_).to(device_);
  std::vector<Tensor> grads;
  std::vector<std::string> change(params_.size());
  Tensor flags = Tensor::zeros({np}, DType::f64);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i].second;
    change[i] = changed(where, i);
    const bool use = change[i].empty() && p.grad().defined();
    grads.push_back(use ? p.grad() : Tensor::zeros(shapes_[i], dtype_).to(device_));
    flags.data<double>()[i] = !change[i].empty() ? -static_cast<double>(w) : p.has_fresh_grad() ? 1.0 : 0.0;
  }
  flags = flags.to(dtype_).to(device_);
  for (std::int64_t q = 0; q < w; ++q) {
    Tensor part = flat.view(q * blk, Shape{shard_});
    copy_range(grads, q * shard_, part, true);
    flat.view(q * blk + shard_, Shape{np}).copy_from(flags);
  }
  Tensor mine = Tensor::empty({blk}, dtype_, device_);
  comm_.reduce_scatter(flat, mine, ReduceOp::mean);
  const std::vector<double> got = mine.view(shard_, Shape{np}).to_vector();
  for (const std::string& e : change)
    if (!e.empty()) throw Error(e);
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (got[i] < 0)
      throw Error(changed_elsewhere(where, "Zero1", fmt::format("parameter \"{}\"", params_[i].first), shapes_[i],
                                    dtype_));
  for (std::size_t i = 0; i < params_.size(); ++i) reached_[i] = got[i] > 0;
  for (Segment& sg : segs_) {
    ParamState& s = *sg.p.state();
    if (!reached_[sg.param]) {  // not stepped, as an unsharded optimizer skips it (a gradient from a
      s.grad_fresh = false;     // step before, not zeroed since, would otherwise be applied again)
      continue;
    }
    if (!s.grad.defined()) s.grad = Tensor::empty({sg.hi - sg.lo}, dtype_, device_);
    s.grad.copy_from(mine.view(sg.at, Shape{sg.hi - sg.lo}));
    s.grad_zero = false;  // overwritten
    s.grad_fresh = true;
  }
}

Report Zero1::backward(const Var& loss, const Policy& policy) {
  // with a changed parameter, backward itself may refuse its stale gradient on this rank alone: its error is
  // dropped, and reduce_gradients fails every rank through the flags
  bool changed_here = false;
  for (std::size_t i = 0; i < params_.size(); ++i) changed_here = changed_here || !changed("Zero1::backward", i).empty();
  Report r;
  try {
    r = ad::backward(loss, policy);
  } catch (const Error&) {
    if (!changed_here) throw;
  }
  reduce_gradients();
  return r;
}

std::int64_t Zero1::changed_anywhere(std::int64_t flag) const {
  const std::int64_t w = comm_.size();
  Tensor mine = Tensor::full({1}, static_cast<double>(flag), dtype_).to(device_);
  Tensor all = Tensor::empty({w}, dtype_, device_);
  comm_.all_gather(mine, all);
  std::int64_t most = 0;
  for (double f : all.to(Device::cpu()).to_vector()) most = std::max(most, static_cast<std::int64_t>(f));
  return most;
}

void Zero1::gather_parameters() {
  const std::int64_t w = comm_.size();
  Tensor part = Tensor::zeros({shard_}, dtype_).to(device_);
  for (const Segment& sg : segs_) part.view(sg.at, Shape{sg.hi - sg.lo}).copy_from(sg.p.value());
  Tensor flat = Tensor::empty({shard_ * w}, dtype_, device_);
  comm_.all_gather(part, flat);
  copy_range(values(params_), 0, flat, false);
}

void Zero1::step() {
  const char* where = "Zero1::step";
  // a parameter given a tensor of another shape, dtype or device since this
  // was made, on any rank: every rank learns it from one small all-gather of
  // the ranks' flags before any optimizer step, and throws with nothing
  // changed (no shard stepped, no step counted, no parameter written)
  std::string error;
  std::int64_t flag = 0;
  for (std::size_t i = 0; i < params_.size() && !flag; ++i)
    if (!(error = changed(where, i)).empty()) flag = static_cast<std::int64_t>(i) + 1;
  const std::int64_t most = changed_anywhere(flag);
  if (flag) throw Error(error);
  if (most > 0) {
    const auto i = static_cast<std::size_t>(most - 1);
    throw Error(changed_elsewhere(where, "Zero1", fmt::format("parameter \"{}\"", params_[i].first), shapes_[i],
                                  dtype_));
  }
  // the segments start from the parameters as they are now: values written
  // since the last step (loaded weights, a manual change) are not undone
  for (Segment& sg : segs_)
    sg.p.value().copy_from(params_[sg.param].second.value().view(sg.lo, Shape{sg.hi - sg.lo}));
  opt_->step();
  // what the optimizer stepped: the segments with a fresh gradient, those of the reached parameters
  // (cleared by zero_grad, as the gradients: a second step() before it steps them again, as unsharded)
  for (std::size_t i = 0; i < params_.size(); ++i) steps_[i] += reached_[i];
  gather_parameters();
}

void Zero1::zero_grad() const {
  for (const auto& np : params_) np.second.zero_grad();
  for (const Segment& sg : segs_) sg.p.zero_grad();
  std::fill(reached_.begin(), reached_.end(), 0);
}

std::int64_t Zero1::state_bytes() const {
  std::int64_t b = 0;
  for (const auto& nt : opt_->state()) b += static_cast<std::int64_t>(nt.second.nbytes());
  return b;
}
std::int64_t Zero1::unsharded_state_bytes() const {
  // every parameter stepped: its slots (N elements each in all), its step; and the global step
  const auto slots = static_cast<std::int64_t>(opt_->slot_names().size());
  return slots * total_ * static_cast<std::int64_t>(dtype_size(dtype_)) + static_cast<std::int64_t>(params_.size()) * 8 + 8;
}
std::int64_t Zero1::largest_parameter_bytes() const {
  std::int64_t m = 0;
  for (const Shape& s : shapes_) m = std::max(m, s.numel() * static_cast<std::int64_t>(dtype_size(dtype_)));
  return m;
}

namespace {
Tensor i64_scalar(std::int64_t v) {
  Tensor t = Tensor::empty({}, DType::i64);
  t.data<std::int64_t>()[0] = v;
  return t;
}
}  // namespace

// Full state, in the unsharded optimizer's format: each slot is gathered
// from all ranks and cut into per-parameter tensors.
nn::NamedTensors Zero1::state() const {
  const std::int64_t w = comm_.size();
  nn::NamedTensors in = opt_->state(), out;
  const nn::detail::NamedIndex index(in, "Zero1::state");
  out.emplace_back("step", index.find("step")->clone());
  const std::vector<std::string> slots = opt_->slot_names();
  std::vector<std::vector<Tensor>> per(params_.size());  // [param][slot]
  for (const std::string& slot : slots) {
    Tensor part = Tensor::zeros({shard_}, dtype_).to(device_);
    for (const Segment& sg : segs_)
      if (const Tensor* t = index.find(params_[sg.param].first + "." + slot))
        part.view(sg.at, Shape{sg.hi - sg.lo}).copy_from(*t);
    Tensor flat = Tensor::empty({shard_ * w}, dtype_, device_);
    comm_.all_gather(part, flat);
    std::vector<Tensor> full;
    for (const Shape& s : shapes_) full.push_back(Tensor::empty(s, dtype_, device_));
    copy_range(full, 0, flat, false);
    for (std::size_t i = 0; i < params_.size(); ++i) per[i].push_back(full[i]);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (steps_[i] == 0) continue;
    const std::string& n = params_[i].first;
    out.emplace_back(n + ".step", i64_scalar(steps_[i]));
    for (std::size_t k = 0; k < slots.size(); ++k) out.emplace_back(n + "." + slots[k], per[i][k]);
  }
  return out;
}

void Zero1::load_state(const nn::NamedTensors& state) {
  const char* where = "Zero1::load_state";
  auto step_of = [&](const Tensor& t, const std::string& name) {
    if (t.dtype() != DType::i64 || t.numel() != 1)
      throw Error(fmt::format("{}: \"{}\" must be one i64 value, got {}{}", where, name, dtype_name(t.dtype()),
                              t.shape().str()));
    return t.to(Device::cpu()).data<std::int64_t>()[0];
  };
  std::unordered_set<std::string> known{"step"};
  const nn::detail::NamedIndex index(state, where);
  const Tensor* step = index.find("step");
  if (!step) throw Error(fmt::format("{}: the state has no \"step\" tensor", where));
  if (step_of(*step, "step") < 0) throw Error(fmt::format("{}: \"step\" is negative", where));
  // every check before anything changes, on the whole state: each rank finds the same errors
  const std::vector<std::string> slots = opt_->slot_names();
  std::vector<std::int64_t> steps(params_.size(), 0);
  std::vector<std::vector<const Tensor*>> slot_t(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (std::string e = changed(where, i); !e.empty()) throw Error(e);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string& n = params_[i].first;
    known.insert(n + ".step");
    if (const Tensor* ps = index.find(n + ".step")) {
      steps[i] = step_of(*ps, n + ".step");
      if (steps[i] < 1) throw Error(fmt::format("{}: \"{}.step\" must be >= 1, got {}", where, n, steps[i]));
    }
    for (const std::string& sl : slots) {
      known.insert(n + "." + sl);
      const Tensor* t = index.find(n + "." + sl);
      if (steps[i] > 0 && !t) throw Error(fmt::format("{}: \"{}.{}\" is missing", where, n, sl));
      if (steps[i] == 0 && t) throw Error(fmt::format("{}: \"{}.{}\" is present but \"{}.step\" is not", where, n, sl, n));
      if (t && (t->shape() != shapes_[i] || t->dtype() != dtype_))
        throw Error(fmt::format("{}: \"{}.{}\" is {}{}, parameter is {}{}", where, n, sl, dtype_name(t->dtype()),
                                t->shape().str(), dtype_name(dtype_), shapes_[i].str()));
      slot_t[i].push_back(t);
    }
  }
  for (const auto& nt : state)
    if (!known.count(nt.first))
      throw Error(fmt::format("{}: unexpected tensor \"{}\" (no parameter or slot of that name)", where, nt.first));
  // this rank's part: each segment's step count and slices of its slots
  nn::NamedTensors mine;
  mine.emplace_back("step", *step);
  for (const Segment& sg : segs_) {
    if (steps[sg.param] == 0) continue;
    const std::string& n = params_[sg.param].first;
    mine.emplace_back(n + ".step", i64_scalar(steps[sg.param]));
    for (std::size_t k = 0; k < slots.size(); ++k) {
      Tensor part = Tensor::empty({sg.hi - sg.lo}, dtype_, device_);
      part.copy_from(slot_t[sg.param][k]->view(sg.lo, Shape{sg.hi - sg.lo}));
      mine.emplace_back(n + "." + slots[k], part);
    }
  }
  opt_->load_state(mine);
  steps_ = steps;
}

}  // namespace ad::dist
