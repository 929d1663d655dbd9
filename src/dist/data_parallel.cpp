// DataParallel: parameters broadcast from rank 0, gradients averaged over
// ranks in buckets whose all-reduces start while backward still runs.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "ad/autodiff.hpp"
#include "ad/dist.hpp"
#include "core/device.hpp"
#include "core/graph_impl.hpp"
#include "dist/impl.hpp"

namespace ad::dist {

namespace {
std::string describe(DType d, const Shape& s, Device dev, bool with_device) {
  return fmt::format("{}{}{}", dtype_name(d), s.str(), with_device ? " on " + device::name(dev) : std::string());
}
std::string param_label(const Parameter& p, std::size_t i) {
  return p.name().empty() ? fmt::format("parameter {}", i) : fmt::format("parameter \"{}\"", p.name());
}
}  // namespace

std::string changed_parameter(const char* where, const char* who, const std::string& label, const Shape& shape,
                              DType dtype, Device device, const Tensor& now) {
  if (now.defined() && now.shape() == shape && now.dtype() == dtype && now.device() == device) return {};
  const bool moved = now.defined() && !(now.device() == device);
  return fmt::format("{}: {} was given a tensor of another shape, dtype or device after this {} was made: it was {}, "
                     "it is {} (make a new {} for the parameters as they are now, on every rank)",
                     where, label, who, describe(dtype, shape, device, moved),
                     now.defined() ? describe(now.dtype(), now.shape(), now.device(), moved) : "undefined", who);
}
std::string changed_elsewhere(const char* where, const char* who, const std::string& label, const Shape& shape,
                              DType dtype) {
  return fmt::format("{}: {} was given a tensor of another shape, dtype or device on another rank after this {} was "
                     "made (here it is still {}{}; that rank's error says what it became): make a new {} for the "
                     "parameters as they are now, on every rank",
                     where, label, who, dtype_name(dtype), shape.str(), who);
}

DataParallel::DataParallel(Communicator comm, std::vector<Parameter> params, std::int64_t bucket_bytes)
    : comm_(std::move(comm)) {
  // this rank's own argument errors go through the count check, so every rank fails, not this one alone
  std::string bad;
  if (params.empty()) bad = "DataParallel: no parameters";
  std::set<const ParamState*> held;  // a parameter listed twice (tied weights) is reduced once
  for (std::size_t i = 0; i < params.size() && bad.empty(); ++i) {
    if (!params[i].defined()) bad = fmt::format("DataParallel: parameter {} is undefined", i);
    else if (held.insert(params[i].state()).second) params_.push_back(params[i]);
  }
  check_same_count(comm_, "DataParallel", params_.size(), bad);
  for (auto& p : params_) comm_.broadcast(p.value(), 0);
  for (const auto& p : params_) held_.push_back({p.shape(), p.dtype(), p.value().device()});
  build_buckets(bucket_bytes);
}

// "" while parameter i has the shape, dtype and device it had when this was
// made (its slot in its bucket), else the error
std::string DataParallel::changed(const char* where, std::size_t i) const {
  return changed_parameter(where, "DataParallel", param_label(params_[i], i), held_[i].shape, held_[i].dtype,
                           held_[i].device, params_[i].value());
}

// Backward produces gradients roughly last parameter first, so buckets are
// filled from the end of the list; a bucket holds one dtype.
void DataParallel::build_buckets(std::int64_t bucket_bytes) {
  Bucket cur;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const Held& p = held_[k];
    const std::int64_t b = p.shape.numel() * static_cast<std::int64_t>(dtype_size(p.dtype));
    if (!cur.members.empty() &&
        (p.dtype != cur.dtype || !(p.device == held_[cur.members.front()].device) ||
         (cur.elems * static_cast<std::int64_t>(dtype_size(cur.dtype)) + b > bucket_bytes))) {
      buckets_.push_back(std::move(cur));
      cur = Bucket{};
    }
    cur.dtype = p.dtype;
    cur.members.push_back(k);
    cur.elems += p.shape.numel();
  }
  if (!cur.members.empty()) buckets_.push_back(std::move(cur));
}

namespace {
struct InFlight {
  Tensor flat;
  Communicator::Work work;
  bool started = false;
};
}  // namespace

Report DataParallel::backward(const Var& loss, const Policy& policy) {
  const char* where = "DataParallel::backward";
  if (!loss.defined()) throw Error("DataParallel::backward: undefined loss");
  // A parameter given a tensor of another shape, dtype or device since this
  // was made is not thrown for here, alone (the other ranks would wait for
  // this one's all-reduces until the timeout): its slot goes as zeros with the
  // flag -world, the mean comes out negative on every rank, and every rank
  // throws once the all-reduces are done, before writing any gradient.
  std::vector<std::string> change(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) change[i] = changed(where, i);
  GraphImpl& g = *loss.graph();
  std::vector<std::size_t> bucket_of(params_.size()), pending(buckets_.size());
  std::vector<InFlight> fl(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    pending[b] = buckets_[b].members.size();
    for (auto m : buckets_[b].members) bucket_of[m] = b;
  }
  std::size_t next = 0;  // buckets start in index order on every rank
  // A bucket is its members' gradients, then one element per member: 1 where
  // this rank's loss reached it (a fresh gradient), else 0 (-world where the
  // parameter changed, above). After the mean, a member whose flag is 0 on
  // every rank got no gradient anywhere: it is left without a fresh one (its
  // optimizer does not step it), alike on every rank.
  const double world = comm_.size();
  auto start = [&](std::size_t b) {
    const Bucket& bk = buckets_[b];
    const Device dev = held_[bk.members.front()].device;
    const auto nm = static_cast<std::int64_t>(bk.members.size());
    fl[b].flat = Tensor::empty({bk.elems + nm}, bk.dtype, dev);
    auto* dst = static_cast<char*>(fl[b].flat.raw());
    Tensor flags = Tensor::empty({nm}, bk.dtype);
    std::int64_t k = 0;
    for (auto m : bk.members) {
      const bool fresh = params_[m].has_fresh_grad();
      const Tensor& gr = params_[m].grad();
      const auto n = static_cast<std::size_t>(held_[m].shape.numel()) * dtype_size(bk.dtype);
      if (change[m].empty() && gr.defined()) device::copy(dst, dev, gr.raw(), gr.device(), n);
      else device::memset(dev, dst, 0, n);
      dst += n;
      flags.view(k++, {1}).fill(!change[m].empty() ? -world : fresh ? 1.0 : 0.0);
    }
    device::copy(dst, dev, flags.raw(), Device::cpu(), flags.nbytes());
    fl[b].work = comm_.all_reduce_async(fl[b].flat, ReduceOp::mean);
    fl[b].started = true;
  };
  auto launch_ready = [&] {
    while (next < buckets_.size() && pending[next] == 0) start(next++);
    for (auto& f : fl)
      if (f.started) f.work.test();  // let MPI progress the ones in flight
  };
  // which parameter a ready gradient belongs to
  std::vector<std::pair<const ParamState*, std::size_t>> index;
  for (std::size_t i = 0; i < params_.size(); ++i) index.emplace_back(params_[i].state(), i);
  std::sort(index.begin(), index.end());
  g.on_grad_ready = [&](const Parameter& p) {
    auto it = std::lower_bound(index.begin(), index.end(), std::make_pair(static_cast<const ParamState*>(p.state()),
                                                                          std::size_t{0}));
    if (it == index.end() || it->first != p.state()) return;  // not one of ours
    auto b = bucket_of[it->second];
    if (pending[b] > 0) --pending[b];
    launch_ready();
  };
  Report r;
  // with a changed parameter, backward itself may refuse its stale gradient on this rank alone: its error is
  // dropped (the buckets go below with the flags, and every rank throws after the all-reduces)
  const bool changed_here = std::any_of(change.begin(), change.end(), [](const std::string& e) { return !e.empty(); });
  try {
    r = ad::backward(loss, policy);
  } catch (const Error&) {
    if (!changed_here) {
      g.on_grad_ready = nullptr;
      throw;
    }
  } catch (...) {
    g.on_grad_ready = nullptr;
    throw;
  }
  g.on_grad_ready = nullptr;
  // buckets whose parameters got no gradient from this loss still take part
  for (std::size_t b = next; b < buckets_.size(); ++b) start(b);
  std::vector<std::vector<double>> reached(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    fl[b].work.wait();
    const auto nm = static_cast<std::int64_t>(buckets_[b].members.size());
    reached[b] = fl[b].flat.view(buckets_[b].elems, {nm}).to(Device::cpu()).to_vector();
  }
  for (const std::string& e : change)
    if (!e.empty()) throw Error(e);
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t k = 0; k < buckets_[b].members.size(); ++k)
      if (reached[b][k] < 0) {  // another rank's parameter changed
        const std::size_t m = buckets_[b].members[k];
        throw Error(
            changed_elsewhere(where, "DataParallel", param_label(params_[m], m), held_[m].shape, held_[m].dtype));
      }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    const auto* src = static_cast<const char*>(fl[b].flat.raw());
    for (std::size_t k = 0; k < bk.members.size(); ++k) {
      ParamState& s = *params_[bk.members[k]].state();
      std::size_t n = s.value.nbytes();
      if (reached[b][k] > 0) {  // some rank's loss reached it: the mean over the ranks
        if (!s.grad.defined()) s.grad = Tensor::zeros(s.value.shape(), s.value.dtype()).to(s.value.device());
        device::copy(s.grad.raw(), s.grad.device(), src, fl[b].flat.device(), n);
        s.grad.mark_modified();  // graphs holding it as a leaf recompute (refresh_leaves)
        s.grad_zero = false;  // overwritten with the mean
        s.grad_fresh = true;
      }
      src += n;
    }
  }
  return r;
}

void DataParallel::all_reduce_gradients() {
  const char* where = "DataParallel::all_reduce_gradients";
  // which parameters some rank's loss reached (the others keep no fresh
  // gradient, on every rank); a parameter changed since this was made counts
  // -world, so the sum is negative on every rank (as in backward)
  std::vector<std::string> change(params_.size());
  Tensor reached = Tensor::empty({static_cast<std::int64_t>(params_.size())}, DType::f64);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    change[i] = changed(where, i);
    reached.data<double>()[i] = !change[i].empty() ? -comm_.size() : params_[i].has_fresh_grad() ? 1.0 : 0.0;
  }
  if (std::string(comm_.backend()) == "nccl") {  // NCCL moves tensors on its GPU only
    Tensor d = reached.to(Device::cuda(comm_.device()));
    comm_.all_reduce(d, ReduceOp::sum);
    reached = d.to(Device::cpu());
  } else {
    comm_.all_reduce(reached, ReduceOp::sum);
  }
  for (const std::string& e : change)
    if (!e.empty()) throw Error(e);
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (reached.data<double>()[i] < 0)
      throw Error(changed_elsewhere(where, "DataParallel", param_label(params_[i], i), held_[i].shape, held_[i].dtype));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!(reached.data<double>()[i] > 0)) continue;
    ParamState& s = *params_[i].state();
    if (!s.grad.defined()) s.grad = Tensor::zeros(s.value.shape(), s.value.dtype()).to(s.value.device());
    comm_.all_reduce(s.grad_now(), ReduceOp::mean);
    s.grad_fresh = true;
  }
}

std::vector<std::int64_t> shard_indices(std::int64_t n, int rank, int world, std::uint64_t seed, std::int64_t epoch,
                                        bool shuffle) {
  if (n < 0 || world < 1 || rank < 0 || rank >= world)
    throw Error(fmt::format("shard_indices: rank {} of world {} over {} examples", rank, world, n));
  std::vector<std::int64_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  if (shuffle && n > 1) {
    // Fisher-Yates driven by Philox (seed, epoch): the same on every rank
    Rng rng(seed ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(epoch + 1)));
    Tensor u = Tensor::uniform({n}, rng, DType::f64, 0, 1);
    const double* r = u.data<double>();
    for (std::int64_t i = n - 1; i > 0; --i) {
      auto j = std::min<std::int64_t>(i, static_cast<std::int64_t>(r[i] * static_cast<double>(i + 1)));
      std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
    }
  }
  std::int64_t per = n / world;
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(per));
  for (std::int64_t k = 0; k < per; ++k) out.push_back(perm[static_cast<std::size_t>(k * world + rank)]);
  return out;
}

}  // namespace ad::dist
