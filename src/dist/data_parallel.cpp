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

namespace ad::dist {

DataParallel::DataParallel(Communicator comm, std::vector<Parameter> params, std::int64_t bucket_bytes)
    : comm_(std::move(comm)) {
  if (params.empty()) throw Error("DataParallel: no parameters");
  std::set<const ParamState*> held;  // a parameter listed twice (tied weights) is reduced once
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined()) throw Error(fmt::format("DataParallel: parameter {} is undefined", i));
    if (held.insert(params[i].state()).second) params_.push_back(params[i]);
  }
  for (auto& p : params_) comm_.broadcast(p.value(), 0);
  build_buckets(bucket_bytes);
}

// Backward produces gradients roughly last parameter first, so buckets are
// filled from the end of the list; a bucket holds one dtype.
void DataParallel::build_buckets(std::int64_t bucket_bytes) {
  Bucket cur;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const Parameter& p = params_[k];
    std::int64_t b = static_cast<std::int64_t>(p.value().nbytes());
    if (!cur.members.empty() &&
        (p.dtype() != cur.dtype || !(p.value().device() == params_[cur.members.front()].value().device()) ||
         (cur.elems * static_cast<std::int64_t>(dtype_size(cur.dtype)) + b > bucket_bytes))) {
      buckets_.push_back(std::move(cur));
      cur = Bucket{};
    }
    cur.dtype = p.dtype();
    cur.members.push_back(k);
    cur.elems += p.value().numel();
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
  if (!loss.defined()) throw Error("DataParallel::backward: undefined loss");
  GraphImpl& g = *loss.graph();
  std::vector<std::size_t> bucket_of(params_.size()), pending(buckets_.size());
  std::vector<InFlight> fl(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    pending[b] = buckets_[b].members.size();
    for (auto m : buckets_[b].members) bucket_of[m] = b;
  }
  std::size_t next = 0;  // buckets start in index order on every rank
  // A bucket is its members' gradients, then one element per member: 1 where
  // this rank's loss reached it (a fresh gradient), else 0. After the mean,
  // a member whose flag is 0 on every rank got no gradient anywhere: it is
  // left without a fresh one (its optimizer does not step it), alike on
  // every rank.
  auto start = [&](std::size_t b) {
    const Bucket& bk = buckets_[b];
    const Device dev = params_[bk.members.front()].value().device();
    const auto nm = static_cast<std::int64_t>(bk.members.size());
    fl[b].flat = Tensor::empty({bk.elems + nm}, bk.dtype, dev);
    auto* dst = static_cast<char*>(fl[b].flat.raw());
    Tensor flags = Tensor::empty({nm}, bk.dtype);
    std::int64_t k = 0;
    for (auto m : bk.members) {
      const bool fresh = params_[m].has_fresh_grad();
      const Tensor& gr = params_[m].grad();
      std::size_t n = params_[m].value().nbytes();
      if (gr.defined()) device::copy(dst, dev, gr.raw(), gr.device(), n);
      else device::memset(dev, dst, 0, n);
      dst += n;
      flags.view(k++, {1}).fill(fresh ? 1.0 : 0.0);
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
  try {
    r = ad::backward(loss, policy);
  } catch (...) {
    g.on_grad_ready = nullptr;
    throw;
  }
  g.on_grad_ready = nullptr;
  // buckets whose parameters got no gradient from this loss still take part
  for (std::size_t b = next; b < buckets_.size(); ++b) start(b);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    fl[b].work.wait();
    const Bucket& bk = buckets_[b];
    const auto nm = static_cast<std::int64_t>(bk.members.size());
    const std::vector<double> reached = fl[b].flat.view(bk.elems, {nm}).to(Device::cpu()).to_vector();
    const auto* src = static_cast<const char*>(fl[b].flat.raw());
    for (std::size_t k = 0; k < bk.members.size(); ++k) {
      ParamState& s = *params_[bk.members[k]].state();
      std::size_t n = s.value.nbytes();
      if (reached[k] > 0) {  // some rank's loss reached it: the mean over the ranks
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
  // which parameters some rank's loss reached (the others keep no fresh gradient, on every rank)
  Tensor reached = Tensor::empty({static_cast<std::int64_t>(params_.size())}, DType::f64);
  for (std::size_t i = 0; i < params_.size(); ++i) reached.data<double>()[i] = params_[i].has_fresh_grad() ? 1.0 : 0.0;
  comm_.all_reduce(reached, ReduceOp::sum);
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
