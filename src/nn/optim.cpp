#include "ad/nn/optim.hpp"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <set>
#include <unordered_set>

#include "core/vec.hpp"
#include "nn/named_index.hpp"

namespace ad::nn {

// ---- learning-rate schedules ----
namespace {
void check_lr(const char* what, double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) throw Error(fmt::format("{}: lr must be finite and >= 0, got {}", what, lr));
}
}  // namespace

LrSchedule LrSchedule::constant(double lr) {
  check_lr("LrSchedule::constant", lr);
  LrSchedule s;
  s.kind_ = Kind::constant;
  s.lr_ = lr;
  return s;
}
LrSchedule LrSchedule::linear_warmup(double lr, std::int64_t warmup) {
  check_lr("LrSchedule::linear_warmup", lr);
  if (warmup < 1) throw Error(fmt::format("LrSchedule::linear_warmup: warmup_steps must be >= 1, got {}", warmup));
  LrSchedule s;
  s.kind_ = Kind::linear_warmup;
  s.lr_ = lr;
  s.warmup_ = warmup;
  return s;
}
LrSchedule LrSchedule::cosine(double lr, std::int64_t total, double lr_min) {
  check_lr("LrSchedule::cosine", lr);
  if (total < 1) throw Error(fmt::format("LrSchedule::cosine: total_steps must be >= 1, got {}", total));
  if (!(lr_min >= 0.0 && lr_min <= lr))
    throw Error(fmt::format("LrSchedule::cosine: lr_min must be in [0, lr = {}], got {}", lr, lr_min));
  LrSchedule s;
  s.kind_ = Kind::cosine;
  s.lr_ = lr;
  s.lr_min_ = lr_min;
  s.total_ = total;
  return s;
}
LrSchedule LrSchedule::warmup_cosine(double lr, std::int64_t warmup, std::int64_t total, double lr_min) {
  check_lr("LrSchedule::warmup_cosine", lr);
  if (warmup < 1) throw Error(fmt::format("LrSchedule::warmup_cosine: warmup_steps must be >= 1, got {}", warmup));
  if (total < warmup)
    throw Error(fmt::format("LrSchedule::warmup_cosine: total_steps ({}) must be >= warmup_steps ({})", total, warmup));
  if (!(lr_min >= 0.0 && lr_min <= lr))
    throw Error(fmt::format("LrSchedule::warmup_cosine: lr_min must be in [0, lr = {}], got {}", lr, lr_min));
  LrSchedule s;
  s.kind_ = Kind::warmup_cosine;
  s.lr_ = lr;
  s.lr_min_ = lr_min;
  s.warmup_ = warmup;
  s.total_ = total;
  return s;
}
double LrSchedule::operator()(std::int64_t t) const {
  if (t < 0) throw Error(fmt::format("LrSchedule: step must be >= 0, got {}", t));
  auto cosine_at = [&](double u) { return lr_min_ + (lr_ - lr_min_) * 0.5 * (1.0 + std::cos(std::numbers::pi * u)); };
  switch (kind_) {
    case Kind::constant: return lr_;
    case Kind::linear_warmup:
      return t < warmup_ ? lr_ * static_cast<double>(t + 1) / static_cast<double>(warmup_) : lr_;
    case Kind::cosine:
      return cosine_at(static_cast<double>(std::min(t, total_)) / static_cast<double>(total_));
    case Kind::warmup_cosine: {
      if (t < warmup_) return lr_ * static_cast<double>(t + 1) / static_cast<double>(warmup_);
      std::int64_t span = total_ - warmup_;
      if (span == 0) return lr_min_;
      return cosine_at(static_cast<double>(std::min(t - warmup_, span)) / static_cast<double>(span));
    }
  }
  return lr_;
}

// ---- gradient clipping ----
namespace {
template <class T> double sum_squares(const T* g, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  return s;
}
template <class T> AD_VEC void scale(T* g, std::int64_t n, T c) {
  for (std::int64_t i = 0; i < n; ++i) g[i] *= c;
}
// Each parameter once, in order of first appearance (a tied weight listed
// under two names is one gradient).
std::vector<Parameter> unique(const std::vector<Parameter>& params) {
  std::vector<Parameter> out;
  std::set<const ParamState*> seen;
  for (const auto& p : params)
    if (p.defined() && seen.insert(p.state()).second) out.push_back(p);
  return out;
}
}  // namespace

double grad_norm(const std::vector<Parameter>& params) {
  double s = 0;
  for (const auto& p : unique(params)) {
    if (!p.has_fresh_grad()) continue;  // no gradient this step (a stale one reads as zeros)
    const Tensor& g = p.grad();
    if (g.dtype() == DType::f32) s += sum_squares(g.data<float>(), g.numel());
    else if (g.dtype() == DType::f64) s += sum_squares(g.data<double>(), g.numel());
    else throw Error(fmt::format("grad_norm: gradient of {} has dtype {}, not f32/f64", p.name(), dtype_name(g.dtype())));
  }
  return std::sqrt(s);
}
double clip_grad_norm(const std::vector<Parameter>& params, double max_norm) {
  if (!(max_norm > 0)) throw Error(fmt::format("clip_grad_norm: max_norm must be > 0, got {}", max_norm));
  double norm = grad_norm(params);
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  double c = max_norm / (norm + 1e-6);
  for (const auto& p : unique(params)) {
    if (!p.has_fresh_grad()) continue;
    Tensor g = p.grad();
    if (g.dtype() == DType::f32) scale(g.data<float>(), g.numel(), static_cast<float>(c));
    else scale(g.data<double>(), g.numel(), c);
  }
  return norm;
}
double clip_grad_norm(const NamedParameters& params, double max_norm) {
  std::vector<Parameter> ps;
  for (const auto& np : params) ps.push_back(np.second);
  return clip_grad_norm(ps, max_norm);
}

// ---- Optimizer ----
namespace {
NamedParameters name_by_index(const std::vector<Parameter>& params) {
  std::set<std::string> seen;
  std::vector<std::string> names(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::string n = params[i].defined() ? params[i].name() : std::string();
    if (!n.empty() && seen.insert(n).second) names[i] = n;
  }
  NamedParameters out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::string n = names[i];
    if (n.empty()) {  // "<index>", or "_<index>" (and so on) where a parameter is named that
      n = std::to_string(i);
      while (!seen.insert(n).second) n = "_" + n;
    }
    out.emplace_back(n, params[i]);
  }
  return out;
}
std::int64_t scalar_i64(const Tensor& t, const std::string& name) {
  if (t.dtype() != DType::i64 || t.numel() != 1)
    throw Error(fmt::format("Optimizer::load_state: \"{}\" must be one i64 value, got {}{}", name, dtype_name(t.dtype()),
                            t.shape().str()));
  return t.data<std::int64_t>()[0];
}
Tensor i64_scalar(std::int64_t v) {
  Tensor t = Tensor::empty({}, DType::i64);
  t.data<std::int64_t>()[0] = v;
  return t;
}
}  // namespace

Optimizer::Optimizer(NamedParameters params, double lr) {
  std::set<std::string> seen;
  std::set<const ParamState*> held;
  for (auto& np : params) {
    if (!np.second.defined()) throw Error(fmt::format("Optimizer: parameter \"{}\" is empty", np.first));
    if (np.first.empty()) throw Error("Optimizer: a parameter has an empty name");
    if (!seen.insert(np.first).second) throw Error(fmt::format("Optimizer: parameter name \"{}\" is repeated", np.first));
    if (!is_compute_float(np.second.dtype()))
      throw Error(fmt::format("Optimizer: parameter \"{}\" has dtype {}, not f32/f64", np.first, dtype_name(np.second.dtype())));
    // One parameter under several names (tied weights): updated once, under its first name.
    if (held.insert(np.second.state()).second) params_.push_back(std::move(np));
  }
  slots_.resize(params_.size());
  param_steps_.assign(params_.size(), 0);
  set_lr(lr);
}
Optimizer::Optimizer(const std::vector<Parameter>& params, double lr) : Optimizer(name_by_index(params), lr) {}

double Optimizer::lr() const { return has_schedule_ ? schedule_(step_) : lr_; }
void Optimizer::set_lr(double lr) {
  check_lr("Optimizer::set_lr", lr);
  lr_ = lr;
  has_schedule_ = false;
}
void Optimizer::set_schedule(const LrSchedule& s) {
  schedule_ = s;
  has_schedule_ = true;
}
void Optimizer::zero_grad() const {
  for (const auto& np : params_)
    if (np.second.has_grad()) np.second.zero_grad();
}

void Optimizer::step() {
  double lr_now = lr();
  std::vector<std::string> slot_list = slot_names();
  // every check before any parameter changes: an error leaves no step half taken
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i].second;
    if (!p.has_fresh_grad()) continue;
    if (p.grad().shape() != p.shape() || p.grad().dtype() != p.dtype())
      throw Error(fmt::format("{}.step: gradient of \"{}\" is {}{}, parameter is {}{}", name(), params_[i].first,
                              dtype_name(p.grad().dtype()), p.grad().shape().str(), dtype_name(p.dtype()), p.shape().str()));
    // a Parameter given a tensor of another shape or dtype after its state was formed (or loaded)
    for (std::size_t k = 0; k < slots_[i].size() && k < slot_list.size(); ++k) {
      const Tensor& t = slots_[i][k];
      if (t.shape() != p.shape() || t.dtype() != p.dtype())
        throw Error(fmt::format("{}.step: state \"{}.{}\" is {}{}, parameter is {}{} (the parameter was given a tensor "
                                "of another shape or dtype: make a new optimizer for it, or load a state that matches)",
                                name(), params_[i].first, slot_list[k], dtype_name(t.dtype()), t.shape().str(),
                                dtype_name(p.dtype()), p.shape().str()));
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i].second;
    if (!p.has_fresh_grad()) continue;  // no loss reached it since zero_grad(): no step, no state change
    auto& slots = slots_[i];
    while (slots.size() < slot_list.size()) slots.push_back(Tensor::zeros(p.shape(), p.dtype()));
    update(p, slots, ++param_steps_[i], lr_now);
  }
  ++step_;
}

NamedTensors Optimizer::state() const {
  NamedTensors out;
  out.emplace_back("step", i64_scalar(step_));
  std::vector<std::string> slot_list = slot_names();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (param_steps_[i] == 0) continue;
    const std::string& n = params_[i].first;
    out.emplace_back(n + ".step", i64_scalar(param_steps_[i]));
    for (std::size_t k = 0; k < slot_list.size() && k < slots_[i].size(); ++k)
      out.emplace_back(n + "." + slot_list[k], slots_[i][k]);
  }
  return out;
}

void Optimizer::load_state(const NamedTensors& state) {
  const std::string where = fmt::format("{}::load_state", name());
  std::vector<std::string> slot_list = slot_names();
  std::unordered_set<std::string> known{"step"};
  const detail::NamedIndex index(state, where.c_str());
  const Tensor* st = index.find("step");
  if (!st) throw Error(fmt::format("{}: the state has no \"step\" tensor", where));
  std::int64_t step = scalar_i64(*st, "step");
  if (step < 0) throw Error(fmt::format("{}: \"step\" is negative ({})", where, step));
  // Check everything before changing anything.
  std::vector<std::int64_t> steps(params_.size(), 0);
  std::vector<std::vector<const Tensor*>> slots(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string& n = params_[i].first;
    const Parameter& p = params_[i].second;
    known.insert(n + ".step");
    for (const auto& s : slot_list) known.insert(n + "." + s);
    if (const Tensor* ps = index.find(n + ".step")) {
      steps[i] = scalar_i64(*ps, n + ".step");
      if (steps[i] < 1) throw Error(fmt::format("{}: \"{}.step\" must be >= 1, got {}", where, n, steps[i]));
    }
    for (const auto& s : slot_list) {
      const Tensor* t = index.find(n + "." + s);
      if (steps[i] > 0 && !t) throw Error(fmt::format("{}: \"{}.{}\" is missing", where, n, s));
      if (steps[i] == 0 && t) throw Error(fmt::format("{}: \"{}.{}\" is present but \"{}.step\" is not", where, n, s, n));
      if (t && (t->shape() != p.shape() || t->dtype() != p.dtype()))
        throw Error(fmt::format("{}: \"{}.{}\" is {}{}, parameter is {}{}", where, n, s, dtype_name(t->dtype()),
                                t->shape().str(), dtype_name(p.dtype()), p.shape().str()));
      if (t) slots[i].push_back(t);
    }
  }
  for (const auto& nt : state)
    if (!known.count(nt.first))
      throw Error(fmt::format("{}: unexpected tensor \"{}\" (no parameter or slot of that name)", where, nt.first));
  step_ = step;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    param_steps_[i] = steps[i];
    slots_[i].clear();
    for (const Tensor* t : slots[i]) slots_[i].push_back(t->clone());
  }
}

// ---- SGD ----
namespace {
void check_nonneg(const char* opt, const char* what, double v) {
  if (!(v >= 0.0) || !std::isfinite(v)) throw Error(fmt::format("{}: {} must be finite and >= 0, got {}", opt, what, v));
}
SGDOptions checked(SGDOptions o) {
  check_nonneg("SGD", "lr", o.lr);
  check_nonneg("SGD", "momentum", o.momentum);
  check_nonneg("SGD", "dampening", o.dampening);
  check_nonneg("SGD", "weight_decay", o.weight_decay);
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw Error(fmt::format("SGD: nesterov needs momentum > 0 and dampening = 0, got momentum {} dampening {}",
                            o.momentum, o.dampening));
  return o;
}
AdamOptions checked(AdamOptions o, const char* opt) {
  check_nonneg(opt, "lr", o.lr);
  check_nonneg(opt, "eps", o.eps);
  check_nonneg(opt, "weight_decay", o.weight_decay);
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
    throw Error(fmt::format("{}: betas must be in [0, 1), got ({}, {})", opt, o.beta1, o.beta2));
  return o;
}

template <class T>
AD_VEC void sgd_update(T* __restrict p, const T* __restrict g, T* __restrict b, std::int64_t n, T lr, T wd, T mu, T damp, bool nesterov, bool first) {
  for (std::int64_t i = 0; i < n; ++i) {
    T d = g[i] + wd * p[i];
    if (b) {
      b[i] = first ? d : mu * b[i] + (T(1) - damp) * d;
      d = nesterov ? d + mu * b[i] : b[i];
    }
    p[i] -= lr * d;
  }
}

// m, v updated in place; p = p * decay - step_size * m / (sqrt(v) / sqrt_bc2 + eps)
template <class T>
AD_VEC void adam_update(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, std::int64_t n, T b1, T b2, T l2, T decay, T step_size, T sqrt_bc2,
                 T eps) {
  for (std::int64_t i = 0; i < n; ++i) {
    T pi = p[i] * decay;
    T gi = g[i] + l2 * p[i];
    T mi = b1 * m[i] + (T(1) - b1) * gi;
    T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (std::sqrt(vi) / sqrt_bc2 + eps);
  }
}
}  // namespace

SGD::SGD(NamedParameters params, SGDOptions o) : Optimizer(std::move(params), checked(o).lr), o_(o) {}
SGD::SGD(const std::vector<Parameter>& params, SGDOptions o) : Optimizer(params, checked(o).lr), o_(o) {}
std::string SGD::hyperparameters() const {
  return fmt::format("momentum={} dampening={} weight_decay={} nesterov={}", o_.momentum, o_.dampening, o_.weight_decay,
                     o_.nesterov);
}
std::vector<std::string> SGD::slot_names() const {
  if (o_.momentum > 0) return {"momentum_buffer"};
  return {};
}
void SGD::update(const Parameter& p, std::vector<Tensor>& slots, std::int64_t t, double lr) {
  Tensor& w = p.value();
  const Tensor& g = p.grad();
  bool first = t == 1;
  if (w.dtype() == DType::f32) {
    float* b = slots.empty() ? nullptr : slots[0].data<float>();
    sgd_update<float>(w.data<float>(), g.data<float>(), b, w.numel(), static_cast<float>(lr),
                      static_cast<float>(o_.weight_decay), static_cast<float>(o_.momentum),
                      static_cast<float>(o_.dampening), o_.nesterov, first);
  } else {
    double* b = slots.empty() ? nullptr : slots[0].data<double>();
    sgd_update<double>(w.data<double>(), g.data<double>(), b, w.numel(), lr, o_.weight_decay, o_.momentum,
                       o_.dampening, o_.nesterov, first);
  }
}

// ---- Adam / AdamW ----
Adam::Adam(NamedParameters params, AdamOptions o, bool decoupled)
    : Optimizer(std::move(params), checked(o, decoupled ? "AdamW" : "Adam").lr), o_(o), decoupled_(decoupled) {}
Adam::Adam(NamedParameters params, AdamOptions o) : Adam(std::move(params), o, false) {}
Adam::Adam(const std::vector<Parameter>& params, AdamOptions o) : Adam(name_by_index(params), o, false) {}
AdamW::AdamW(NamedParameters params, AdamOptions o) : Adam(std::move(params), o, true) {}
AdamW::AdamW(const std::vector<Parameter>& params, AdamOptions o) : Adam(name_by_index(params), o, true) {}

std::string Adam::hyperparameters() const {
  return fmt::format("beta1={} beta2={} eps={} weight_decay={}", o_.beta1, o_.beta2, o_.eps, o_.weight_decay);
}
std::vector<std::string> Adam::slot_names() const { return {"exp_avg", "exp_avg_sq"}; }
void Adam::update(const Parameter& p, std::vector<Tensor>& slots, std::int64_t t, double lr) {
  double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t));
  double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t));
  double step_size = lr / bc1, sqrt_bc2 = std::sqrt(bc2);
  double l2 = decoupled_ ? 0.0 : o_.weight_decay;
  double decay = decoupled_ ? 1.0 - lr * o_.weight_decay : 1.0;
  Tensor& w = p.value();
  const Tensor& g = p.grad();
  if (w.dtype() == DType::f32) {
    using T = float;
    adam_update<T>(w.data<T>(), g.data<T>(), slots[0].data<T>(), slots[1].data<T>(), w.numel(), static_cast<T>(o_.beta1),
                   static_cast<T>(o_.beta2), static_cast<T>(l2), static_cast<T>(decay), static_cast<T>(step_size),
                   static_cast<T>(sqrt_bc2), static_cast<T>(o_.eps));
  } else {
    using T = double;
    adam_update<T>(w.data<T>(), g.data<T>(), slots[0].data<T>(), slots[1].data<T>(), w.numel(), o_.beta1, o_.beta2, l2,
                   decay, step_size, sqrt_bc2, o_.eps);
  }
}

}  // namespace ad::nn
