#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "ad/tensor.hpp"

namespace ad {

// Every op of the library, generated from ad/op_list.inc.
enum class OpId : std::uint16_t {
#define AD_OP(name, family) name,
#include "ad/op_list.inc"
#undef AD_OP
};
inline constexpr int kNumOps = 0
#define AD_OP(name, family) +1
#include "ad/op_list.inc"
#undef AD_OP
    ;
const char* op_name(OpId op);

class GraphImpl;
class Trace;
struct ParamState;

// A trainable tensor that outlives graphs. Copies share the same state, so a
// Parameter held by a module and by an optimizer is one parameter.
// backward() accumulates into grad(); zero_grad() resets it.
class Parameter {
 public:
  Parameter() = default;
  // value must be f32 or f64 (the compute dtypes; a bf16 or f16 tensor is an
  // ad::Error: cast it, and keep bf16 for compressed activations).
  explicit Parameter(Tensor value, std::string name = {});
  // N(0, stddev^2) initialisation from rng.
  static Parameter randn(const Shape& shape, Rng& rng, double stddev = 1.0, DType dtype = DType::f32,
                         std::string name = {});
  static Parameter zeros(const Shape& shape, DType dtype = DType::f32, std::string name = {});
  // Internal: a handle to existing state.
  explicit Parameter(std::shared_ptr<ParamState> s) : s_(std::move(s)) {}

  bool defined() const { return s_ != nullptr; }
  const std::string& name() const;
  const Shape& shape() const { return value().shape(); }
  DType dtype() const { return value().dtype(); }
  // The value; writes through it (an optimizer step) are seen by later graphs.
  Tensor& value() const;
  // Accumulated gradient (same shape and dtype); undefined until the first
  // backward() that reaches this parameter.
  const Tensor& grad() const;
  bool has_grad() const;
  // A backward() (or a data-parallel gradient reduce) has written into grad()
  // since the last zero_grad(). Optimizers step only these parameters, so one
  // that no loss reached this step (an unused branch, a frozen head) keeps its
  // value and optimizer state, as a PyTorch parameter whose grad is None.
  bool has_fresh_grad() const;
  // Sets the gradient to zero, keeping its buffer. The zeros are written
  // lazily: the next backward() writes the new gradient straight into the
  // buffer (no fill and no add), and grad() fills it if read first. So a
  // Tensor handle to the gradient taken *before* zero_grad() may still show
  // the old values until then; take it from grad() afterwards.
  void zero_grad() const;
  ParamState* state() const { return s_.get(); }

 private:
  std::shared_ptr<ParamState> s_;
};

// A node of a graph, as seen by the user: its shape and dtype are known as
// soon as it is built; its value is computed by backward()/eval() and, if it
// was freed to save memory, recomputed on demand from its inputs.
// A Var is a light handle: it must not outlive its Graph.
class Var {
 public:
  Var() = default;
  Var(GraphImpl* g, std::int32_t id) : g_(g), id_(id) {}
  bool defined() const { return g_ != nullptr; }
  GraphImpl* graph() const { return g_; }
  std::int32_t id() const { return id_; }
  OpId op() const;
  // A copy: building more nodes may move the graph's own storage, so a
  // reference into it could dangle.
  Shape shape() const;
  int rank() const { return shape().rank(); }
  std::int64_t dim(int i) const;  // negative i counts from the end
  std::int64_t numel() const { return shape().numel(); }
  DType dtype() const;
  Device device() const;
  bool has_value() const;
  // The node's value, computing it (and any freed inputs) if absent. The
  // returned handle shares the node's storage.
  Tensor value() const;
  // "matmul#7 f32[64,256]"
  std::string str() const;

 private:
  GraphImpl* g_ = nullptr;
  std::int32_t id_ = -1;
};

// A symbolic graph: ops append nodes (recipes) and infer their shapes; nothing
// is computed until eval()/backward(). Make one per step, or reuse it.
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;

  // A data leaf holding `t` (shared, not copied): writing t later through
  // Tensor's API (data<T>() on a non-const Tensor, fill, copy_from; after a
  // write through raw(), t.mark_modified()) makes the values this graph
  // computed from it stale, and the next eval or backward recomputes them.
  // The same holds for a parameter leaf's tensor, and for a Parameter given
  // another tensor of the same shape and dtype (another shape: ad::Error).
  // Not differentiated by backward(); ad::grad(loss, {x}) can still
  // differentiate with respect to it.
  Var input(const Tensor& t, std::string name = {});
  // The leaf for `p` in this graph (the same node every time it is asked for).
  Var param(const Parameter& p);

  std::int64_t num_nodes() const;
  // Bytes currently held by values this graph computed (not leaves).
  std::int64_t live_bytes() const;
  // Drops every value this graph computed (never a leaf's tensor), except
  // those of `keep`, and returns how many bytes live_bytes() fell by. A
  // dropped value is recomputed on demand (value(), eval(), backward). For
  // reading the loss (or a metric) before backward() without the forward
  // values it computed staying held through the step, on top of the policy's
  // budget: loss.value(); g.release({loss}); backward(loss, policy).
  // A Tensor you hold (from value() or eval()) keeps its own storage alive,
  // and counted. A Var of another graph in `keep` is an ad::Error.
  std::int64_t release(const std::vector<Var>& keep = {});
  // Records every step the executor runs on this graph into `trace` (not
  // owned; it must outlive the recording) until record(nullptr).
  void record(Trace* trace);
  // Throws ad::Error for a moved-from Graph (as every member above does).
  GraphImpl& impl() const;

 private:
  std::unique_ptr<GraphImpl> impl_;
};

// An op argument: a Var, or a Parameter (placed in the graph of the other
// arguments automatically).
class Operand {
 public:
  Operand(Var v) : v_(v) {}                         // NOLINT(implicit)
  Operand(const Parameter& p) : p_(p.state()) {}    // NOLINT(implicit)
  const Var& var() const { return v_; }
  ParamState* param() const { return p_; }

 private:
  Var v_;
  ParamState* p_ = nullptr;
};

// Computes `x` now (and any freed inputs it needs); returns its value (a
// handle sharing the node's storage).
Tensor eval(const Var& x);

}  // namespace ad
