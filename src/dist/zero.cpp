// Zero1: optimizer state partitioned across ranks (ZeRO stage 1).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "ad/autodiff.hpp"
#include "ad/dist.hpp"
#include "core/device.hpp"
#include "core/graph_impl.hpp"

namespace ad::dist {

namespace {
const Tensor* find(const nn::NamedTensors& s, const std::string& name) {
  for (const auto& nt : s)
    if (nt.first == name) return &nt.second;
  return nullptr;
}
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
      to_part ? device::copy(a, part.device(), b, t.device(), n) : device::copy(b, t.device(), a, part.device(), n);
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
  for (auto& np : params_) comm_.broadcast(np.second.value(), 0);
  const std::int64_t w = comm_.size();
  shard_ = (total_ + w - 1) / w;
  begin_ = shard_ * comm_.rank();
  // this rank's slice of the flat parameters (zeros in the padding)
  Tensor v = Tensor::zeros({shard_}, dtype_).to(device_);
  copy_range(values(params_), begin_, v, true);
  shard_param_ = Parameter(v, "shard");
  opt_ = make_optimizer({{"shard", shard_param_}});
  if (!opt_) throw Error("Zero1: make_optimizer returned no optimizer");
}

void Zero1::reduce_gradients() {
  const std::int64_t w = comm_.size();
  Tensor flat = Tensor::zeros({shard_ * w}, dtype_).to(device_);
  std::vector<Tensor> grads;
  for (const auto& np : params_)
    grads.push_back(np.second.grad().defined() ? np.second.grad()
                                              : Tensor::zeros(np.second.shape(), dtype_).to(device_));
  copy_range(grads, 0, flat, true);
  ParamState& s = *shard_param_.state();
  if (!s.grad.defined()) s.grad = Tensor::zeros({shard_}, dtype_).to(device_);
  comm_.reduce_scatter(flat, s.grad, ReduceOp::mean);
  s.grad_zero = false;  // overwritten
  s.grad_fresh = true;
}

Report Zero1::backward(const Var& loss, const Policy& policy) {
  Report r = ad::backward(loss, policy);
  reduce_gradients();
  return r;
}

void Zero1::gather_parameters() {
  const std::int64_t w = comm_.size();
  Tensor flat = Tensor::empty({shard_ * w}, dtype_, device_);
  comm_.all_gather(shard_param_.value(), flat);
  copy_range(values(params_), 0, flat, false);
}

void Zero1::step() {
  // the shard starts from the parameters as they are now: values written
  // since the last step (loaded weights, a manual change) are not undone
  copy_range(values(params_), begin_, shard_param_.value(), true);
  opt_->step();
  gather_parameters();
}

void Zero1::zero_grad() const {
  for (const auto& np : params_) np.second.zero_grad();
  shard_param_.zero_grad();
}

std::int64_t Zero1::state_bytes() const {
  std::int64_t b = 0;
  for (const auto& nt : opt_->state()) b += static_cast<std::int64_t>(nt.second.nbytes());
  return b;
}
std::int64_t Zero1::unsharded_state_bytes() const {
  // slots of the shard optimizer, per element, times N; plus a step per parameter and the global step
  std::int64_t slots = 0, steps = 0;
  for (const auto& nt : opt_->state()) {
    if (nt.first == "step") continue;
    if (nt.second.numel() == shard_ && nt.second.dtype() == dtype_) ++slots;
    else ++steps;
  }
  return slots * total_ * static_cast<std::int64_t>(dtype_size(dtype_)) +
         steps * static_cast<std::int64_t>(params_.size()) * 8 + 8;
}
std::int64_t Zero1::largest_parameter_bytes() const {
  std::int64_t m = 0;
  for (const auto& np : params_) m = std::max(m, static_cast<std::int64_t>(np.second.value().nbytes()));
  return m;
}

// Full state, in the unsharded optimizer's format: each slot is gathered
// from all ranks and cut into per-parameter tensors.
nn::NamedTensors Zero1::state() const {
  const std::int64_t w = comm_.size();
  nn::NamedTensors in = opt_->state(), out;
  const Tensor* step = find(in, "step");
  out.emplace_back("step", step->clone());
  const Tensor* pstep = find(in, "shard.step");
  for (const auto& nt : in) {
    if (nt.first.rfind("shard.", 0) != 0 || nt.first == "shard.step") continue;
    std::string slot = nt.first.substr(6);
    Tensor flat = Tensor::empty({shard_ * w}, dtype_, device_);
    comm_.all_gather(nt.second, flat);
    std::vector<Tensor> per;
    for (const auto& np : params_) per.push_back(Tensor::empty(np.second.shape(), dtype_, device_));
    copy_range(per, 0, flat, false);
    for (std::size_t i = 0; i < per.size(); ++i) out.emplace_back(params_[i].first + "." + slot, per[i]);
  }
  if (pstep)
    for (const auto& np : params_) out.emplace_back(np.first + ".step", pstep->clone());
  return out;
}

void Zero1::load_state(const nn::NamedTensors& state) {
  const Tensor* step = find(state, "step");
  if (!step) throw Error("Zero1::load_state: the state has no \"step\" tensor");
  nn::NamedTensors mine;
  mine.emplace_back("step", *step);
  // slots: every "<first parameter>.<slot>" other than .step
  const std::string& first = params_[0].first;
  std::vector<std::string> slots;
  for (const auto& nt : state)
    if (nt.first.rfind(first + ".", 0) == 0 && nt.first != first + ".step") slots.push_back(nt.first.substr(first.size() + 1));
  const Tensor* pstep = find(state, first + ".step");
  for (const auto& np : params_) {
    const Tensor* ps = find(state, np.first + ".step");
    if (static_cast<bool>(ps) != static_cast<bool>(pstep) ||
        (ps && ps->to_vector() != pstep->to_vector()))
      throw Error(fmt::format("Zero1::load_state: \"{}.step\" differs from \"{}.step\" (a sharded optimizer updates "
                              "every parameter together)", np.first, first));
  }
  if (pstep) mine.emplace_back("shard.step", *pstep);
  for (const auto& slot : slots) {
    Tensor part = Tensor::zeros({shard_}, dtype_).to(device_);
    std::vector<Tensor> per;
    for (const auto& np : params_) {
      const std::string name = np.first + "." + slot;
      const Tensor* t = find(state, name);
      if (!t) throw Error(fmt::format("Zero1::load_state: \"{}\" is missing", name));
      if (t->shape() != np.second.shape() || t->dtype() != dtype_)
        throw Error(fmt::format("Zero1::load_state: \"{}\" is {}{}, parameter is {}{}", name, dtype_name(t->dtype()),
                                t->shape().str(), dtype_name(dtype_), np.second.shape().str()));
      per.push_back(*t);
    }
    copy_range(per, begin_, part, true);
    mine.emplace_back("shard." + slot, part);
  }
  opt_->load_state(mine);
  // the shard's parameter values follow the (possibly newly loaded) parameters
  copy_range(values(params_), begin_, shard_param_.value(), true);
}

}  // namespace ad::dist
