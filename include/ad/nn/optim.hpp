#pragma once
// Optimizers (SGD with momentum / Nesterov, Adam, AdamW), gradient clipping
// by global norm, learning-rate schedules. Updates are plain loops over the
// parameter's f32 or f64 elements, in the parameter's dtype, in a fixed
// order: the same gradients give the same bits on every run.
//
// An optimizer's state (step counts and moment buffers) is a list of named
// tensors: state() / load_state() save and restore it, e.g. through
// ad::save_safetensors, so a resumed run continues bit for bit.
#include <cstdint>
#include <string>
#include <vector>

#include "ad/nn/module.hpp"

namespace ad::nn {

// ---- learning-rate schedules ----
// lr(t) for the t-th update (t = 0, 1, ...). With peak lr, warmup W and total
// T (both in steps) and floor lr_min:
//   constant:       lr
//   linear_warmup:  lr * min(1, (t + 1) / W)
//   cosine:         lr_min + (lr - lr_min) * (1 + cos(pi * min(t, T) / T)) / 2
//   warmup_cosine:  lr * (t + 1) / W for t < W, then cosine over the
//                   remaining T - W steps: u = min(t - W, T - W) / (T - W),
//                   lr_min + (lr - lr_min) * (1 + cos(pi * u)) / 2
//                   (u = 1 when T = W).
// Constructors throw ad::Error for lr < 0, W < 1, T < 1, T < W, or
// lr_min outside [0, lr].
class LrSchedule {
 public:
  enum class Kind : std::uint8_t { constant, linear_warmup, cosine, warmup_cosine };
  static LrSchedule constant(double lr);
  static LrSchedule linear_warmup(double lr, std::int64_t warmup_steps);
  static LrSchedule cosine(double lr, std::int64_t total_steps, double lr_min = 0);
  static LrSchedule warmup_cosine(double lr, std::int64_t warmup_steps, std::int64_t total_steps, double lr_min = 0);
  // The learning rate of update t (throws ad::Error for t < 0).
  double operator()(std::int64_t t) const;
  Kind kind() const { return kind_; }

 private:
  Kind kind_ = Kind::constant;
  double lr_ = 0, lr_min_ = 0;
  std::int64_t warmup_ = 0, total_ = 0;
};

// ---- gradient clipping ----
// The global L2 norm of the gradients of `params` (parameters without a
// fresh gradient, Parameter::has_fresh_grad, are skipped; a parameter listed
// twice counts once), accumulated in double in parameter order.
double grad_norm(const std::vector<Parameter>& params);
// If that norm exceeds max_norm, scales every gradient by
// max_norm / (norm + 1e-6) (PyTorch's rule). Returns the norm before
// clipping. A non-finite norm (inf/NaN gradients) leaves the gradients
// unchanged; check the return value to skip such a step. Throws ad::Error for
// max_norm <= 0.
double clip_grad_norm(const std::vector<Parameter>& params, double max_norm);
double clip_grad_norm(const NamedParameters& params, double max_norm);

// ---- optimizers ----
// Holds named parameters; step() updates each one that has a gradient from a
// backward since its last zero_grad() (Parameter::has_fresh_grad): one that no
// loss reached keeps its value, slots and update count, as a PyTorch parameter
// whose grad is None. Parameter names must be unique and non-empty (use
// Module::named_parameters()); one Parameter under several names (tied
// weights) is held once, under its first name.
//
// State tensors: "step" (i64 [], updates taken by step()) and, for each
// parameter updated at least once, "<name>.step" (i64 []: its own update
// count, used for Adam's bias correction) and "<name>.<slot>" (same shape and
// dtype as the parameter; slots: SGD with momentum "momentum_buffer", Adam
// and AdamW "exp_avg", "exp_avg_sq").
class Optimizer {
 public:
  Optimizer(NamedParameters params, double lr);
  // Names from Parameter::name(), or "<index>" when missing or repeated
  // ("_<index>" where a parameter is already named "<index>", and so on).
  Optimizer(const std::vector<Parameter>& params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter with a fresh gradient, at lr(); then the
  // step count advances. Throws ad::Error if a gradient's shape or dtype
  // differs from its parameter's.
  void step();
  // Zeroes the gradient of every parameter that has one.
  void zero_grad() const;

  // The learning rate the next step() uses: the schedule at step_count()
  // if one is set, else the constant set_lr() value.
  double lr() const;
  void set_lr(double lr);  // constant from now on (removes a schedule)
  void set_schedule(const LrSchedule& s);
  std::int64_t step_count() const { return step_; }
  const NamedParameters& params() const { return params_; }
  virtual const char* name() const = 0;
  // The hyperparameters other than the learning rate, as "key=value" pairs
  // (e.g. "beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0"): save_optimizer
  // and save_checkpoint record them with name() in the file's metadata.
  // An optimizer defined outside the library may leave it empty.
  virtual std::string hyperparameters() const { return {}; }

  // The state (see above). The tensors share storage with the optimizer:
  // save them before the next step(), or clone them.
  NamedTensors state() const;
  // Restores state() output (copies values in). Throws ad::Error naming the
  // tensor for an unknown name, a missing "step", a shape or dtype that
  // differs from the parameter's, or a slot without its "<name>.step".
  void load_state(const NamedTensors& state);
  // Slot names for the current hyperparameters (e.g. none for plain SGD).
  virtual std::vector<std::string> slot_names() const = 0;

 protected:
  // Updates parameter i; slots[k] matches slot_names()[k]; t = this
  // parameter's update number, from 1.
  virtual void update(const Parameter& p, std::vector<Tensor>& slots, std::int64_t t, double lr) = 0;

 private:
  NamedParameters params_;
  std::vector<std::vector<Tensor>> slots_;  // [param][slot], allocated at the first update
  std::vector<std::int64_t> param_steps_;
  std::int64_t step_ = 0;
  double lr_ = 0;
  bool has_schedule_ = false;
  LrSchedule schedule_;
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;  // L2: g += weight_decay * p
  bool nesterov = false;    // needs momentum > 0 and dampening = 0
};

// g = grad + wd p; with momentum mu: b = g at the first update, then
// b = mu b + (1 - dampening) g; g = nesterov ? g + mu b : b; p -= lr g.
// (PyTorch's torch.optim.SGD.) Throws ad::Error for invalid options.
class SGD : public Optimizer {
 public:
  SGD(NamedParameters params, SGDOptions o = {});
  SGD(const std::vector<Parameter>& params, SGDOptions o = {});
  const char* name() const override { return "SGD"; }
  std::string hyperparameters() const override;
  const SGDOptions& options() const { return o_; }
  std::vector<std::string> slot_names() const override;

 protected:
  void update(const Parameter& p, std::vector<Tensor>& slots, std::int64_t t, double lr) override;

 private:
  SGDOptions o_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // Adam: L2 (g += wd p); AdamW: decoupled (p *= 1 - lr wd)
};

// Adam (Kingma & Ba), as torch.optim.Adam: at update t,
//   g = grad (+ wd p for Adam);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// AdamW (Loshchilov & Hutter) first decays p *= 1 - lr wd and adds no L2 term.
// Throws ad::Error for invalid options (lr, eps, wd < 0; betas outside [0, 1)).
class Adam : public Optimizer {
 public:
  Adam(NamedParameters params, AdamOptions o = {});
  Adam(const std::vector<Parameter>& params, AdamOptions o = {});
  const char* name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  std::string hyperparameters() const override;
  const AdamOptions& options() const { return o_; }
  std::vector<std::string> slot_names() const override;

 protected:
  Adam(NamedParameters params, AdamOptions o, bool decoupled);
  void update(const Parameter& p, std::vector<Tensor>& slots, std::int64_t t, double lr) override;

 private:
  AdamOptions o_;
  bool decoupled_ = false;
};

// AdamW: AdamOptions with decoupled weight decay (default weight_decay 0.01).
inline AdamOptions adamw_defaults() {
  AdamOptions o;
  o.weight_decay = 1e-2;
  return o;
}
class AdamW : public Adam {
 public:
  AdamW(NamedParameters params, AdamOptions o = adamw_defaults());
  AdamW(const std::vector<Parameter>& params, AdamOptions o = adamw_defaults());
};

}  // namespace ad::nn
