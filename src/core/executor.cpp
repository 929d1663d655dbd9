// Runs a Schedule. Decides nothing: computes, frees and accumulates exactly
// as listed, and measures the peak through the graph's allocator.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <unordered_map>

#include "core/graph_impl.hpp"
#include "core/device.hpp"
#include "core/kernels.hpp"
#include "core/load.hpp"
#include "ad/trace.hpp"
#include "core/step_check.hpp"

namespace ad {

namespace {

// the parameter holds a gradient (zeroed or not) of another shape, dtype or device than `like`
bool grad_stale(const ParamState& s, const Tensor& like) {
  return s.grad.defined() && (!(s.grad.shape() == like.shape()) || s.grad.dtype() != like.dtype() ||
                              !(s.grad.device() == like.device()));
}
// "" unless the parameter holds a gradient (not zeroed) of another shape,
// dtype or device than its value: it was given another tensor since
std::string stale_grad_error(const Parameter& p) {
  const ParamState& s = *p.state();
  const Tensor& v = s.value;
  if (!grad_stale(s, v) || s.grad_zero) return {};
  return fmt::format("execute: parameter \"{}\" holds a gradient {}{} but is now {}{}: call zero_grad() after giving "
                     "it another tensor",
                     p.name(), dtype_name(s.grad.dtype()), s.grad.shape().str(), dtype_name(v.dtype()),
                     v.shape().str());
}

void accumulate_into(const Parameter& p, const Tensor& v) {
  ParamState& s = *p.state();
  if (!(v.shape() == s.value.shape()) || v.dtype() != s.value.dtype())
    throw Error(fmt::format("execute: gradient {}{} does not match parameter {}{}", dtype_name(v.dtype()),
                            v.shape().str(), dtype_name(s.value.dtype()), s.value.shape().str()));
  const bool stale_shape = grad_stale(s, v);
  if (std::string e = stale_grad_error(p); !e.empty()) throw Error(e);  // (execute checked it before the first step)
  s.grad_fresh = true;
  if (!s.grad.defined() || stale_shape) {  // a zeroed gradient of the old shape: replaced
    s.grad = v.clone(default_allocator(v.device()));
    s.grad_zero = false;
    return;
  }
  if (s.grad_zero) {  // zero_grad() ran: overwrite rather than fill and add
    s.grad.copy_from(v);
    s.grad_zero = false;
    return;
  }
  if (v.is_cuda()) cuda_rt::add_into(s.grad, v);
  else kernels::add_into(s.grad, v);
  s.grad.mark_modified();  // written through raw() (GraphImpl::refresh_leaves)
}

// Runs one schedule. With a budget (Schedule::budget_bytes > 0) it also
// guards it: should an allocation push the graph's bytes above the budget
// (the plan's sizes were wrong), it first evicts the value with the lowest
// cost / (bytes x staleness) among those this run computed (DTR's rule) and
// recomputes evicted values when a later step needs them.
class Runner {
 public:
  Runner(GraphImpl& g, const Schedule& s) : g_(g), s_(s) {
    budget_ = s.budget_bytes;
    if (budget_ > 0) {
      mine_.assign(g.nodes.size(), 0);
      evicted_.assign(g.nodes.size(), 0);
      last_.assign(g.nodes.size(), 0);
      for (auto t : s.targets)
        if (t >= 0 && static_cast<std::size_t>(t) < g.nodes.size()) target_.push_back(t);
      boundary_ = forward_boundary(s);
    }
  }

  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  ~Runner() {  // a run cut short by an error: the copies in flight and host buffers
    try {
      settle();
    } catch (...) {
    }
  }

  RunStats run() {
    auto t0 = std::chrono::steady_clock::now();
    r_.baseline_bytes = g_.alloc->reset_peak();
    if (trace_) {
      run_ = trace_->begin_run();
      mark_live();
    }
    for (const Step& st : s_.steps)
      if (st.kind == Step::Kind::compute && st.node >= 0 && static_cast<std::size_t>(st.node) < g_.nodes.size())
        g_.node(st.node).last_run_computes = 0;
    prepare_rollback();
    try {
      run_steps();
    } catch (const Error& e) {
      try {
        settle();  // no copy in flight may outlive the values dropped next
      } catch (...) {
      }
      const std::string left = rollback();
      if (left.empty()) throw;
      throw Error(std::string(e.what()) + left);
    } catch (...) {
      try {
        settle();
      } catch (...) {
      }
      rollback();
      throw;
    }
    settle();
    // values the guard recomputed that the schedule did not keep
    for (auto id : extra_)
      if (std::find(target_.begin(), target_.end(), id) == target_.end()) {
        if (trace_) note_release(id, g_.node(id).value, TraceEvent::Kind::free);
        g_.node(id).value = Tensor{};
      }
    if (trace_) mark_live();
    r_.measured_peak_bytes = g_.alloc->peak_bytes() - r_.baseline_bytes;
    r_.run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return r_;
  }

 private:
  // ---- a run that fails leaves no trace ----
  // A kernel may throw on its data (a label out of range), an allocation may
  // fail: the parameters' gradients are then as they were before the run
  // (a budget plan may add a gradient before the last forward step runs),
  // and the values the run computed are dropped (the graph's memory is what
  // it was, so the same plan fits again).
  struct SinkBefore {
    bool had = false, zero = false, fresh = false, touched = false;
    Tensor copy;  // a gradient's contents, copied before the run first changed them
  };
  std::vector<SinkBefore> sink_before_;
  std::vector<char> had_value_;
  std::size_t last_fwd_step_ = 0, step_ = 0;
  bool any_fwd_step_ = false;

  void prepare_rollback() {
    sink_before_.assign(s_.sinks.size(), {});
    for (std::size_t k = 0; k < s_.sinks.size(); ++k)
      if (s_.sinks[k].defined()) {
        const ParamState& ps = *s_.sinks[k].state();
        sink_before_[k] = {ps.grad.defined(), ps.grad_zero, ps.grad_fresh, false, {}};
      }
    const std::int32_t fwd_end = forward_boundary(s_);  // gradient nodes come after it
    had_value_.assign(g_.nodes.size(), 0);
    for (std::size_t i = 0; i < s_.steps.size(); ++i) {
      const Step& st = s_.steps[i];
      if (st.kind != Step::Kind::compute || st.node < 0 || static_cast<std::size_t>(st.node) >= g_.nodes.size()) continue;
      had_value_[static_cast<std::size_t>(st.node)] = g_.node(st.node).value.defined();
      if (st.node <= fwd_end) {
        last_fwd_step_ = i;
        any_fwd_step_ = true;
      }
    }
  }
  // Before the run first changes sinks[k]'s gradient: a gradient holding
  // contents (accumulated by earlier backward calls, not zeroed) is copied
  // where a forward step still follows. Later steps are gradient kernels,
  // which check nothing the forward did not (and every sink's state is
  // checked before the first step): such a copy of every gradient would cost
  // a parameter's memory each step for nothing. What can still fail there
  // (memory, the budget guard finding nothing to evict) names the gradients
  // it leaves changed (rollback).
  void save_sink(std::int32_t k) {
    if (k < 0 || static_cast<std::size_t>(k) >= sink_before_.size()) return;
    SinkBefore& b = sink_before_[static_cast<std::size_t>(k)];
    if (b.copy.defined() || !b.had || b.zero || !any_fwd_step_ || step_ > last_fwd_step_) return;
    const ParamState& ps = *s_.sinks[static_cast<std::size_t>(k)].state();
    if (ps.grad.defined() && !ps.grad_zero) b.copy = ps.grad.clone();
  }
  // Returns "" when every gradient is as before the run, else a sentence
  // naming those that gradient steps after the forward ones added to.
  std::string rollback() noexcept {
    std::string left;
    try {
      std::vector<std::string> changed;
      std::size_t unnamed = 0;
      for (std::size_t k = 0; k < sink_before_.size(); ++k) {
        if (!s_.sinks[k].defined()) continue;
        ParamState& ps = *s_.sinks[k].state();
        const SinkBefore& b = sink_before_[k];
        if (!b.had) {
          ps.grad = Tensor{};
          ps.grad_zero = false;
        } else if (b.zero) {
          ps.grad_zero = true;  // reads as zeros again, whatever the run wrote
        } else if (b.copy.defined()) {
          ps.grad.copy_from(b.copy);
        } else {
          if (b.touched && ps.name.empty()) ++unnamed;
          else if (b.touched && std::find(changed.begin(), changed.end(), ps.name) == changed.end())
            changed.push_back(ps.name);
          continue;  // not changed before the failure (or only by gradient steps after the forward ones)
        }
        ps.grad_fresh = b.fresh;
      }
      for (std::size_t id = 0; id < had_value_.size() && id < g_.nodes.size(); ++id)
        if (g_.nodes[id].last_run_computes > 0 && !had_value_[id]) g_.nodes[id].value = Tensor{};
      const std::size_t total = changed.size() + unnamed;
      if (total > 0) {
        std::string which;
        if (!changed.empty())
          which = fmt::format(" ({}{}{})",
                              fmt::join(changed.begin(), changed.begin() + std::min<std::ptrdiff_t>(4, std::ssize(changed)), ", "),
                              changed.size() > 4 ? ", ..." : "", unnamed > 0 ? fmt::format(" and {} unnamed", unnamed) : "");
        left = fmt::format("; this step had already added to the gradients of {} parameter{}{}, which are not "
                           "restored: zero_grad() them (or redo their earlier steps) before retrying",
                           total, total == 1 ? "" : "s", which);
      }
    } catch (...) {
    }
    return left;
  }

  void run_steps() {
    for (const Step& st : s_.steps)  // every step checked before the first runs
      if (std::string e = detail::step_error(g_, st, s_.sinks); !e.empty()) throw Error("execute: " + e);
    for (const Parameter& p : s_.sinks)  // and every gradient a step will add to (a later failure left others added)
      if (p.defined())
        if (std::string e = stale_grad_error(p); !e.empty()) throw Error(e);
    for (std::size_t si = 0; si < s_.steps.size(); ++si) {
      const Step& st = s_.steps[si];
      step_ = si;
      Node& nd = g_.node(st.node);
      switch (st.kind) {
        case Step::Kind::compute:
          if (st.aux >= 0 && static_cast<std::size_t>(st.aux) >= s_.sinks.size())
            throw Error(fmt::format("execute: compute step names sink {} of {}", st.aux, s_.sinks.size()));
          save_sink(st.aux);
          compute(st.node, st.aux, st.reuse);
          break;
        case Step::Kind::free:
          if (trace_) note_release(st.node, nd.value, TraceEvent::Kind::free);
          arrived(st.node);
          drop_host_copy(st.node);
          nd.value = Tensor{};
          if (budget_ > 0) evicted_[static_cast<std::size_t>(st.node)] = 0;
          mark_live();
          break;
        case Step::Kind::accumulate:
          if (st.aux < 0 || static_cast<std::size_t>(st.aux) >= s_.sinks.size() ||
              !s_.sinks[static_cast<std::size_t>(st.aux)].defined())
            throw Error(fmt::format("execute: accumulate step names sink {} of {}", st.aux, s_.sinks.size()));
          if (!nd.value.defined() && budget_ > 0 && evicted_[static_cast<std::size_t>(st.node)]) recompute(st.node);
          if (!nd.value.defined())
            throw Error(fmt::format("execute: accumulate of {}#{} which holds no value (bad schedule)",
                                    op_def(nd.op).name, st.node));
          arrived(st.node);
          save_sink(st.aux);
          {
            double ts = trace_ ? trace_->now_us() : 0;
            const Parameter& sink = s_.sinks[static_cast<std::size_t>(st.aux)];
            const Tensor& gr = sink.state()->grad;
            bool written = gr.defined() && gr.storage() == nd.value.storage() && gr.raw() == nd.value.raw();
            if (!written) accumulate_into(sink, nd.value);  // else the compute step wrote it in place
            // (a gradient holding earlier contents changes only here: a compute step writes in place only
            // into an absent or zeroed one, which rollback restores anyway)
            sink_before_[static_cast<std::size_t>(st.aux)].touched = true;
            if (trace_) span(TraceEvent::Kind::accumulate, st.node, ts, s_.sinks[static_cast<std::size_t>(st.aux)].name());
            if (g_.on_grad_ready) g_.on_grad_ready(s_.sinks[static_cast<std::size_t>(st.aux)]);
          }
          break;
        case Step::Kind::compress:
        case Step::Kind::decompress: {
          arrived(st.node);
          if (!nd.value.defined() && budget_ > 0 && evicted_[static_cast<std::size_t>(st.node)]) {
            // evicted by the guard (stored compressed or not yet): recomputed when the decompress step
            // wants it back, in its own dtype; a compress of it has nothing to store
            if (st.kind == Step::Kind::decompress) recompute(st.node);
            break;
          }
          if (!nd.value.defined())
            throw Error(fmt::format("execute: (de)compress of {}#{} which holds no value (bad schedule)",
                                    op_def(nd.op).name, st.node));
          DType to = st.kind == Step::Kind::compress ? static_cast<DType>(st.aux) : nd.meta.dtype;
          if (budget_ > 0) {  // both copies exist for a moment: the new one must fit too
            protect_.push_back(st.node);
            make_room(st.node, nd.meta.shape.numel() * static_cast<std::int64_t>(dtype_size(to)));
            protect_.pop_back();
          }
          double ts = trace_ ? trace_->now_us() : 0;
          Tensor t = Tensor::empty(nd.meta.shape, to, nd.meta.device, g_.alloc);
          if (trace_) {  // both copies exist now: the moment the live counter must show
            event(TraceEvent::Kind::alloc, st.node, static_cast<std::int64_t>(t.nbytes()));
            mark_live();
          }
          t.copy_from(nd.value);  // converts
          if (st.kind == Step::Kind::compress) check_range(st.node, nd.value, t);
          if (trace_) note_release(st.node, nd.value, TraceEvent::Kind::free);
          nd.value = std::move(t);
          if (trace_) {
            span(st.kind == Step::Kind::compress ? TraceEvent::Kind::compress : TraceEvent::Kind::decompress, st.node,
                 ts, op_def(nd.op).name);
            mark_live();
          }
          break;
        }
        case Step::Kind::offload: offload(st.node); break;
        case Step::Kind::prefetch: prefetch(st.node); break;
      }
    }
    check_gpu_ranges();
  }

  // into >= 0: the node is sinks[into]'s gradient; when that parameter's
  // gradient is still writable (absent or zeroed) the kernel writes straight
  // into it, allocating nothing in the graph.
  // reuse >= 0: write over that input's buffer, whose value dies here (the
  // planner checked that nothing reads it later); it is dropped right after.
  void compute(std::int32_t id, std::int32_t into = -1, std::int32_t reuse = -1) {
    Node& nd = g_.node(id);
    const OpDef& def = op_def(nd.op);
    ParamState* dst = nullptr;
    if (into >= 0 && !def.view) {
      ParamState* ps = s_.sinks[static_cast<std::size_t>(into)].state();
      if (ps->grad_writable(nd.meta)) dst = ps;
    }
    Tensor* victim = nullptr;
    if (reuse >= 0 && !dst) {  // detail::step_error checked the rest; here: no one else holds the buffer
      Tensor& v = g_.node(reuse).value;
      if (v.defined() && v.storage().use_count() == 1 && v.shape() == nd.meta.shape && v.dtype() == nd.meta.dtype)
        victim = &v;
    }
    if (!def.cpu) throw Error(fmt::format("execute: node {} ({}) has no value and cannot be computed", id, def.name));
    const std::size_t guard_mark = protect_.size();
    if (budget_ > 0) protect_.insert(protect_.end(), nd.inputs.begin(), nd.inputs.end());  // in use up the stack
    // the guard recomputing an evicted value whose input the schedule holds
    // compressed or offloaded at this point: a copy of that input in its own
    // dtype for this kernel only (counted against the budget, dropped after it)
    std::vector<std::pair<std::int32_t, Tensor>> copies;
    for (auto in : nd.inputs) {
      if (g_.node(in).value.defined()) {
        if (g_.node(in).value.dtype() != g_.node(in).meta.dtype) {
          if (budget_ > 0 && depth_ > 0) {
            copies.emplace_back(in, copy_for_recompute(in));
            continue;
          }
          throw Error(fmt::format("execute: {}#{} reads {}#{} while it is stored compressed (bad schedule)", def.name,
                                  id, op_def(g_.node(in).op).name, in));
        }
        continue;
      }
      if (away_.count(in)) {
        if (budget_ > 0 && depth_ > 0) {
          copies.emplace_back(in, copy_for_recompute(in));
          continue;
        }
        throw Error(fmt::format("execute: {}#{} reads {}#{} while it is offloaded to host memory (bad schedule)",
                                def.name, id, op_def(g_.node(in).op).name, in));
      }
      if (budget_ > 0 && (evicted_[static_cast<std::size_t>(in)] || depth_ > 0)) {
        // evicted by the guard, or needed to recompute such a value: recompute on demand
        ++depth_;
        compute(in);
        --depth_;
        extra_.push_back(in);
        continue;
      }
      throw Error(fmt::format("execute: {}#{} needs input {}#{} which holds no value (bad schedule)", def.name, id,
                              op_def(g_.node(in).op).name, in));
    }
    const bool on_gpu = nd.meta.device.kind == DeviceKind::cuda;
    void (*kernel)(const KernelArgs&) = on_gpu ? def.cuda : def.cpu;
    if (!kernel)
      throw Error(fmt::format("{}: no CUDA kernel for this op yet ({}#{} on {})", def.name, describe(nd.meta), id,
                              device::name(nd.meta.device)));
    std::int64_t ws_bytes = 0;
    if (def.workspace) {
      metas_.clear();
      for (auto in : nd.inputs) metas_.push_back(&g_.node(in).meta);
      ws_bytes = std::max<std::int64_t>(0, def.workspace(InferArgs{def, metas_, nd.attrs}, nd.meta));
    }
    if (budget_ > 0) make_room(id, (def.view || dst || victim ? 0 : static_cast<std::int64_t>(nd.meta.nbytes())) + ws_bytes);
    ins_.clear();
    for (auto in : nd.inputs) {
      auto c = std::find_if(copies.begin(), copies.end(), [&](const auto& e) { return e.first == in; });
      if (c != copies.end()) {
        ins_.push_back(&c->second);
        continue;
      }
      arrived(in);
      ins_.push_back(&g_.node(in).value);
    }
    Tensor out;
    if (victim) {
      out = *victim;
    } else if (dst) {
      out = dst->grad.defined() ? dst->grad
                                : Tensor::empty(nd.meta.shape, nd.meta.dtype, nd.meta.device, default_allocator(nd.meta.device));
      if (g_.poison_outputs) device::memset(nd.meta.device, out.raw(), 0xff, out.nbytes());
    } else if (!def.view) {
      out = Tensor::empty(nd.meta.shape, nd.meta.dtype, nd.meta.device, g_.alloc);
      if (g_.poison_outputs) device::memset(nd.meta.device, out.raw(), 0xff, out.nbytes());  // NaN in f32/f64
    }
    std::unique_ptr<Storage> ws;  // counted by the graph's allocator, freed after the kernel
    if (ws_bytes > 0) ws = std::make_unique<Storage>(g_.alloc, static_cast<std::size_t>(ws_bytes), nd.meta.device);
    KernelArgs a{ins_, out, nd.attrs, nd.meta, ws ? ws->data() : nullptr};
    double t0 = 0;
    if (trace_) {
      if (!def.view && !dst && !victim) event(TraceEvent::Kind::alloc, id, static_cast<std::int64_t>(nd.meta.nbytes()));
      if (ws_bytes > 0) event(TraceEvent::Kind::alloc, id, ws_bytes, "workspace");
      mark_live();
      t0 = trace_->now_us();
    }
    {
      device::On on(nd.meta.device);  // the node's GPU, not whichever is current
      kernel(a);
    }
    for (auto& [in, t] : copies) {  // the value itself stays as the schedule holds it
      if (trace_) note_release(in, t, TraceEvent::Kind::free);
      t = Tensor{};
    }
    // kernels write through raw(): tell graphs holding this storage as a leaf
    // (a gradient buffer given to Graph::input, say) that it changed
    if (!def.view) out.mark_modified();
    if (victim) *victim = Tensor{};  // overwritten: the input's value is gone (its free step is a no-op)
    if (dst) {
      dst->grad = out;
      dst->grad_zero = false;
      dst->grad_fresh = true;
    }
    nd.value = std::move(out);
    if (trace_) {
      span(nd.last_run_computes > 0 ? TraceEvent::Kind::recompute : TraceEvent::Kind::compute, id, t0, def.name);
      if (ws) {
        ws.reset();
        event(TraceEvent::Kind::free, id, ws_bytes, "workspace");
        mark_live();
      }
    }
    protect_.resize(guard_mark);
    if (nd.last_run_computes > 0) ++r_.recomputed_nodes;
    ++r_.computed_nodes;
    ++nd.times_computed;
    ++nd.last_run_computes;
    if (budget_ > 0) {
      auto u = static_cast<std::size_t>(id);
      mine_[u] = 1;
      evicted_[u] = 0;
      last_[u] = ++clock_;
      for (auto in : nd.inputs) last_[static_cast<std::size_t>(in)] = clock_;
    }
  }

  // ---- host offload ----
  // A value in host memory: a host tensor (for a CPU value) or a pinned
  // block written by the copy stream (for a GPU value).
  struct HostCopy {
    Tensor host;
    void* pinned = nullptr;
    std::int64_t bytes = 0;
  };
  static std::shared_ptr<Allocator> host_allocator() {  // CPU values offloaded: apart from the graph's bytes
    static const auto a = std::make_shared<Allocator>(Device::cpu());
    return a;
  }

  void offload(std::int32_t id) {
    Node& nd = g_.node(id);
    if (!nd.value.defined() || away_.count(id))
      throw Error(fmt::format("execute: offload of {}#{} which holds no value (bad schedule)", op_def(nd.op).name, id));
    if (op_def(nd.op).view)
      throw Error(fmt::format("execute: offload of {}#{}, a view (bad schedule)", op_def(nd.op).name, id));
    if (nd.value.dtype() != nd.meta.dtype)
      throw Error(fmt::format("execute: offload of {}#{} while it is stored compressed (bad schedule)",
                              op_def(nd.op).name, id));
    arrived(id);  // (a prefetched value offloaded again: the copy stream orders them anyway)
    double ts = trace_ ? trace_->now_us() : 0;
    HostCopy c;
    c.bytes = static_cast<std::int64_t>(nd.value.nbytes());
    if (nd.value.is_cuda()) {
      c.pinned = cuda_rt::host_alloc(static_cast<std::size_t>(c.bytes));
      try {
        cuda_rt::copy_to_host_async(nd.value.device().index, c.pinned, nd.value.raw(), static_cast<std::size_t>(c.bytes));
      } catch (...) {
        cuda_rt::host_free(c.pinned);
        throw;
      }
    } else {
      c.host = Tensor::empty(nd.value.shape(), nd.value.dtype(), Device::cpu(), host_allocator());
      c.host.copy_from(nd.value);
    }
    host_now_ += c.bytes;
    r_.offload_peak_bytes = std::max(r_.offload_peak_bytes, host_now_);
    away_.emplace(id, std::move(c));
    if (trace_) note_release(id, nd.value, TraceEvent::Kind::free);
    nd.value = Tensor{};  // on a GPU its block is reused only once the copy has read it
    if (trace_) {
      span(TraceEvent::Kind::offload, id, ts, op_def(nd.op).name);
      mark_live();
    }
  }

  void prefetch(std::int32_t id) {
    Node& nd = g_.node(id);
    auto it = away_.find(id);
    if (it == away_.end())
      throw Error(fmt::format("execute: prefetch of {}#{} which is not offloaded (bad schedule)", op_def(nd.op).name, id));
    double ts = trace_ ? trace_->now_us() : 0;
    if (budget_ > 0) make_room(id, static_cast<std::int64_t>(nd.meta.nbytes()));
    Tensor t = Tensor::empty(nd.meta.shape, nd.meta.dtype, nd.meta.device, g_.alloc);
    if (trace_) event(TraceEvent::Kind::alloc, id, static_cast<std::int64_t>(t.nbytes()));
    HostCopy& c = it->second;
    if (c.pinned) {  // its readers wait for the copy (arrived())
      arrived(id);
      arriving_[id] = cuda_rt::copy_to_device_async(t.device().index, t.raw(), c.pinned, static_cast<std::size_t>(c.bytes));
    } else {
      t.copy_from(c.host);
    }
    nd.value = std::move(t);
    drop_host_copy(id);
    if (trace_) {
      span(TraceEvent::Kind::prefetch, id, ts, op_def(nd.op).name);
      mark_live();
    }
  }

  // A compressed copy must hold every finite element finitely (f16 holds at
  // most 65504: a larger activation became infinite and its gradients wrong,
  // silently). On the CPU counted here, before the value is replaced; on a
  // GPU counted on the device and read once at the end of the steps
  // (check_gpu_ranges), not at every compress.
  void check_range(std::int32_t id, const Tensor& from, const Tensor& to) {
    if (to.is_cuda()) {
      const int dev = to.device().index;
      auto c = std::find_if(gpu_ranges_.begin(), gpu_ranges_.end(), [&](const auto& r) { return r->dev == dev; });
      if (c == gpu_ranges_.end()) {
        gpu_ranges_.push_back(std::make_unique<GpuCounter>(dev));
        c = gpu_ranges_.end() - 1;
      }
      cuda_rt::count_cast_overflows(from, to, (*c)->p);
      gpu_compressed_.push_back(id);
      return;
    }
    std::int64_t bad = 0;
    const std::int64_t n = from.numel();
    for (std::int64_t i = 0; i < n; ++i)
      bad += std::isfinite(detail::load_as_double(from.dtype(), from.raw(), i)) &&
             !std::isfinite(detail::load_as_double(to.dtype(), to.raw(), i));
    if (bad > 0) throw Error(range_error(fmt::format("compress of {}#{} ({})", op_def(g_.node(id).op).name, id,
                                                     describe(g_.node(id).meta)), bad, to.dtype()));
  }
  static std::string range_error(const std::string& what, std::int64_t bad, DType to) {
    return fmt::format("execute: {} to {}: {} finite element{} beyond {}'s range (largest finite {}) would become "
                       "infinite and make the gradients wrong; store it as bf16, or keep it",
                       what, dtype_name(to), bad, bad == 1 ? " is" : "s are", dtype_name(to),
                       to == DType::f16 ? "65504" : to == DType::bf16 ? "3.39e38" : "3.40e38");
  }
  void check_gpu_ranges() {
    std::uint64_t bad = 0;
    for (const auto& r : gpu_ranges_) {
      std::uint64_t n = 0;
      cuda_rt::copy(&n, -1, r->p, r->dev, sizeof n);  // waits for the count's kernels
      bad += n;
    }
    gpu_ranges_.clear();
    if (bad == 0) return;
    std::vector<std::string> names;
    for (std::size_t k = 0; k < gpu_compressed_.size() && k < 4; ++k)
      names.push_back(fmt::format("{}#{}", op_def(g_.node(gpu_compressed_[k]).op).name, gpu_compressed_[k]));
    throw Error(fmt::format("execute: values stored compressed on the GPU ({}{}): {} finite element{} beyond the "
                            "storage dtype's range (f16: largest finite 65504) became infinite, so the gradients are "
                            "wrong; store them as bf16, or keep them",
                            fmt::join(names, ", "), gpu_compressed_.size() > 4 ? ", ..." : "", bad,
                            bad == 1 ? "" : "s"));
  }
  // this run's count of compressed GPU values that overflowed, one per GPU (its own: runs on other threads
  // count theirs), freed with the run
  struct GpuCounter {
    int dev;
    void* p;
    explicit GpuCounter(int d) : dev(d), p(cuda_rt::allocate(d, sizeof(std::uint64_t))) {
      try {
        cuda_rt::memset(d, p, 0, sizeof(std::uint64_t));
      } catch (...) {
        cuda_rt::deallocate(d, p, sizeof(std::uint64_t));
        throw;
      }
    }
    ~GpuCounter() { cuda_rt::deallocate(dev, p, sizeof(std::uint64_t)); }
    GpuCounter(const GpuCounter&) = delete;
    GpuCounter& operator=(const GpuCounter&) = delete;
  };
  std::vector<std::unique_ptr<GpuCounter>> gpu_ranges_;
  std::vector<std::int32_t> gpu_compressed_;

  // A value the guard evicted, wanted back by a step: recomputed, and so are
  // its inputs that the schedule has freed by now (recursively).
  void recompute(std::int32_t id) {
    ++depth_;
    compute(id);
    --depth_;
  }

  // A copy of a value the schedule holds compressed or offloaded, in its own
  // dtype in the graph's memory, for the guard's recomputation of another.
  Tensor copy_for_recompute(std::int32_t id) {
    const Node& nd = g_.node(id);
    make_room(id, static_cast<std::int64_t>(nd.meta.nbytes()));
    Tensor t = Tensor::empty(nd.meta.shape, nd.meta.dtype, nd.meta.device, g_.alloc);
    if (trace_) {
      event(TraceEvent::Kind::alloc, id, static_cast<std::int64_t>(t.nbytes()));
      mark_live();
    }
    if (nd.value.defined()) {
      arrived(id);
      t.copy_from(nd.value);  // converts
    } else if (const HostCopy& c = away_.at(id); c.pinned) {
      cuda_rt::wait_and_release(t.device().index, cuda_rt::copy_to_device_async(t.device().index, t.raw(), c.pinned,
                                                                                static_cast<std::size_t>(c.bytes)));
    } else {
      t.copy_from(c.host);
    }
    return t;
  }

  // Before anything reads a prefetched value: the compute stream waits for its copy.
  void arrived(std::int32_t id) {
    if (arriving_.empty()) return;
    auto it = arriving_.find(id);
    if (it == arriving_.end()) return;
    void* ev = it->second;
    arriving_.erase(it);
    cuda_rt::wait_and_release(g_.node(id).meta.device.index, ev);
  }
  void drop_host_copy(std::int32_t id) {
    auto it = away_.find(id);
    if (it == away_.end()) return;
    if (it->second.pinned) cuda_rt::host_free(it->second.pinned);  // reused once its copies are done
    host_now_ -= it->second.bytes;
    away_.erase(it);
  }
  // End of the run: no copy left unwaited, no host copy kept.
  // Every event is waited for and every host copy returned even if one wait
  // fails (a sticky device error); the first error is rethrown.
  void settle() {
    std::exception_ptr first;
    while (!arriving_.empty()) {
      try {
        arrived(arriving_.begin()->first);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    while (!away_.empty()) drop_host_copy(away_.begin()->first);
    if (first) std::rethrow_exception(first);
  }

  void make_room(std::int32_t id, std::int64_t need) {
    const Node& nd = g_.node(id);
    while (g_.alloc->live_bytes() - r_.baseline_bytes + need > budget_) {
      std::int32_t best = -1;
      double best_h = 0;
      for (std::size_t u = 0; u < mine_.size(); ++u) {
        auto v = static_cast<std::int32_t>(u);
        const Node& c = g_.nodes[u];
        if (v > boundary_) break;  // only forward values: a gradient's recomputation replays backward
        if (!mine_[u] || !c.value.defined() || op_def(c.op).view || c.value.storage().use_count() > 1) continue;
        if (std::find(protect_.begin(), protect_.end(), v) != protect_.end()) continue;
        if (std::find(target_.begin(), target_.end(), v) != target_.end()) continue;
        double stale = static_cast<double>(clock_ - last_[u] + 1);
        double h = static_cast<double>(c.meta.shape.numel() + 1) / (static_cast<double>(c.meta.nbytes() + 1) * stale);
        if (best < 0 || h < best_h) { best = v; best_h = h; }
      }
      if (best < 0)
        throw Error(fmt::format("execute: budget of {} B cannot hold {}#{} ({} B) and the values it needs; nothing "
                                "left to evict",
                                budget_, op_def(nd.op).name, id, need));
      if (trace_) note_release(best, g_.node(best).value, TraceEvent::Kind::evict);
      g_.node(best).value = Tensor{};
      mark_live();
      evicted_[static_cast<std::size_t>(best)] = 1;
      ++r_.evictions;
    }
  }

  // ---- trace recording (only when the graph has a Trace attached) ----
  void event(TraceEvent::Kind k, std::int32_t id, std::int64_t bytes, const char* name = nullptr) {
    const Node& nd = g_.node(id);
    trace_->add(TraceEvent{k, id, name ? name : op_def(nd.op).name, describe(nd.meta), trace_->now_us(), 0, bytes, run_});
  }
  void span(TraceEvent::Kind k, std::int32_t id, double t0, const std::string& name) {
    const Node& nd = g_.node(id);
    double t1 = trace_->now_us();
    trace_->add(TraceEvent{k, id, name, describe(nd.meta), t0, t1 - t0,
                           op_def(nd.op).view ? 0 : static_cast<std::int64_t>(nd.meta.nbytes()), run_});
  }
  // A value about to be dropped: an event when this drops the last reference
  // to its storage (a base freed while a view still reads it is released
  // later, by the view's free).
  void note_release(std::int32_t id, const Tensor& v, TraceEvent::Kind k) {
    if (v.defined() && v.storage().use_count() == 1) event(k, id, static_cast<std::int64_t>(v.storage()->bytes()));
  }
  void mark_live() {
    if (trace_)
      trace_->add(TraceEvent{TraceEvent::Kind::live, -1, {}, {}, trace_->now_us(), 0,
                             g_.alloc->live_bytes() - r_.baseline_bytes, run_});
  }

  GraphImpl& g_;
  const Schedule& s_;
  Trace* trace_ = g_.trace;
  std::int32_t run_ = 0;
  RunStats r_;
  std::int64_t budget_ = 0, clock_ = 0;
  int depth_ = 0;
  std::int32_t boundary_ = -1;  // forward values are ids <= forward_boundary(schedule)
  std::vector<std::int32_t> extra_, protect_;
  std::vector<char> mine_, evicted_;
  std::vector<std::int64_t> last_;
  std::vector<std::int32_t> target_;
  std::vector<const Tensor*> ins_;
  std::vector<const Meta*> metas_;
  std::unordered_map<std::int32_t, HostCopy> away_;   // offloaded values
  std::unordered_map<std::int32_t, void*> arriving_;  // prefetched GPU values: their copy's event
  std::int64_t host_now_ = 0;
};

}  // namespace

RunStats execute(GraphImpl& g, const Schedule& s) { return Runner(g, s).run(); }

Tensor eval(const Var& x) {
  if (!x.defined()) throw Error("eval: undefined Var");
  GraphImpl& g = *x.graph();
  g.refresh_leaves();  // a value computed from a leaf written since is stale
  if (!g.node(x.id()).value.defined()) {
    Schedule s = plan(g, {x.id()}, {}, policy::keep_all());
    execute(g, s);
  }
  return g.node(x.id()).value;
}

}  // namespace ad
