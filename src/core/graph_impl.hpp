#pragma once
// Internal: nodes, attrs and the OpDef table. Ops (src/ops), the planner
// (src/checkpoint) and the executor see the graph through this header.
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ad/graph.hpp"
#include "ad/ops.hpp"
#include "ad/schedule.hpp"
#include "ad/trace.hpp"

namespace ad {

// Static description of a node's value.
struct Meta {
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu();
  std::size_t nbytes() const { return static_cast<std::size_t>(shape.numel()) * dtype_size(dtype); }
};
// "f32[2,3]"
std::string describe(const Meta& m);

// Op parameters. One struct for all ops; each op reads the fields it documents.
struct Attrs {
  Shape shape;                 // reshape/broadcast_to/sum_to/full target; *_backward: input shape
  Shape axes;                  // reduction axes (sorted, unique); permute order
  std::int64_t axis = 0;       // softmax/logsumexp/slice/concat/gather axis (non-negative)
  std::int64_t start = 0, stop = 0;  // slice bounds (normalised)
  double scalar = 0;           // scalar operand, exponent, eps, dropout p, fill value; clamp: lo
  double scalar2 = 0;          // clamp: hi
  bool keepdim = false;
  bool trans_a = false, trans_b = false;
  bool causal = false;         // attention: causal mask (bottom-right aligned); semiseparable_matvec: lower triangle of H
  Reduction reduction = Reduction::mean;
  std::int32_t which = 0;      // multi-part backward: which gradient this node is
  DType dtype = DType::f32;    // cast / full target dtype
  std::uint64_t seed = 0, offset = 0;  // random ops
  // conv2d and its gradients, max_pool2d: (h, w) pairs; window: max_pool2d's KH, KW
  std::int64_t stride[2] = {1, 1}, pad[2] = {0, 0}, dilation[2] = {1, 1}, window[2] = {0, 0}, groups = 1;
};

struct ParamState : std::enable_shared_from_this<ParamState> {
  Tensor value;
  Tensor grad;
  // zero_grad() ran and nothing has touched grad since: its buffer is kept
  // but its contents are stale and read as zeros. The next backward writes
  // the gradient straight into the buffer (no fill, no add); anyone else
  // reads it through grad_now(), which fills it first.
  bool grad_zero = false;
  // A backward (or a data-parallel reduce) has written this step's gradient
  // into grad since the last zero_grad(): Parameter::has_fresh_grad().
  // Optimizers step only such parameters.
  bool grad_fresh = false;
  std::string name;
  // Held by a backward that may write grad, from planning (which reads
  // grad_zero) to the end of its run: backward calls from several threads
  // that reach one Parameter take turns instead of losing a gradient.
  std::mutex backward_mutex;

  Tensor& grad_now() {
    if (grad_zero) {
      grad.fill(0.0);
      grad_zero = false;
    }
    return grad;
  }
  // A gradient of meta `m` may be written into grad's buffer (or become the
  // new grad) instead of being added: grad is absent or known zero.
  bool grad_writable(const Meta& m) const {
    if (!(m.shape == value.shape()) || m.dtype != value.dtype() || !(m.device == value.device())) return false;
    return !grad.defined() ||
           (grad_zero && grad.shape() == m.shape && grad.dtype() == m.dtype && grad.device() == m.device);
  }
};

struct Node {
  OpId op;
  std::vector<std::int32_t> inputs;
  Attrs attrs;
  Meta meta;
  Tensor value;                        // present or not
  std::shared_ptr<ParamState> param;   // parameter leaves
  // leaves: the storage version of the value when a run last started
  // (GraphImpl::refresh_leaves); seen_version is meaningful once seen is set
  std::uint64_t seen_version = 0;
  bool seen = false;
  std::int32_t times_computed = 0;     // by executors, over this graph's life
  std::int32_t last_run_computes = 0;  // compute steps of this node in the last executed schedule
  bool checkpoint = false;             // marked by ad::checkpoint (policy::manual keeps it)
};

struct OpDef;

// What an op's shape inference sees.
struct InferArgs {
  const OpDef& def;
  std::span<const Meta* const> in;
  const Attrs& attrs;
  const Meta& operator[](std::size_t i) const { return *in[i]; }
};

// What a kernel sees: input values, the output (allocated by the executor,
// except for view ops, whose kernel sets it), attrs and a workspace.
struct KernelArgs {
  std::span<const Tensor* const> in;
  Tensor& out;
  const Attrs& attrs;
  const Meta& out_meta;
  void* workspace = nullptr;
  const Tensor& operator[](std::size_t i) const { return *in[i]; }
};

// What a backward rule sees and sets: grad[i] = d(loss)/d(input i), built
// from ops on out, dout and the inputs. Leave grad[i] undefined for zero.
struct BackwardArgs {
  Var out, dout;
  std::vector<Var> in;
  Attrs attrs;
  std::vector<char> needs;  // needs[i]: input i's gradient is wanted
  std::vector<Var> grad;
};

inline constexpr std::uint32_t kSavesOutput = 1u << 31;
inline constexpr std::uint32_t saves_input(int i) { return 1u << i; }

// One op: everything the engine knows about it, in one place.
struct OpDef {
  const char* name;
  const char* args;  // input names for messages, comma separated ("a,b")
  int arity;         // number of inputs; -1: one or more
  Meta (*infer)(const InferArgs&);                 // throws ad::Error
  void (*cpu)(const KernelArgs&);                  // nullptr only for leaves
  void (*cuda)(const KernelArgs&) = nullptr;       // nullptr: "no CUDA kernel for <op>"
  void (*backward)(BackwardArgs&) = nullptr;       // nullptr: not differentiable (see no_grad)
  const char* no_grad = nullptr;                   // why there is no backward rule
  std::uint32_t saves = 0;                         // what backward reads: inputs bits, kSavesOutput
  double (*flops)(const InferArgs&, const Meta& out) = nullptr;  // nullptr: out.numel()
  std::int64_t (*workspace)(const InferArgs&, const Meta& out) = nullptr;  // bytes; nullptr: 0
  bool view = false;                               // output shares input 0's storage
  // Inputs (bit i) whose buffer the output may take over when the input's
  // value dies at this node: elementwise CPU kernels that read element j of
  // the input before writing element j of the output (out may equal it).
  // Only inputs with the output's shape, dtype and device qualify.
  std::uint8_t overwrites = 0;
  // detach: no gradient flows through the output, by design (grad() treats
  // it as a constant; no_grad says so). Not an error, unlike a missing rule.
  bool stops_gradient = false;
  // Inputs (bit i) with respect to which the output's gradient is zero
  // wherever it is defined (a comparison's operands, where's cond): the
  // backward rule gives them none, and backward() does not count a
  // Parameter reached only through such inputs (or detach) as one the loss
  // depends on, so it gets no gradient (an optimizer leaves it alone).
  std::uint8_t zero_grad_inputs = 0;
  // The output is zeros of attrs.shape with input 0 placed at [attrs.start,
  // attrs.stop) along attrs.axis (slice's gradient). grad() assembles such
  // contributions to one value with a single concat (zeros in the gaps)
  // instead of adding full-size tensors: T slices of a sequence would
  // otherwise cost T full-size gradients and T - 1 full-size adds.
  bool places_slice = false;
  // A gradient contribution made by this op (slice: a piece of another
  // gradient, as concat's backward cuts one per input) is built again when
  // the gradient it contributes to is needed, so it is computed just before
  // it is read: made when concat's backward runs, the T pieces of a
  // recurrent layer's [B, T, H] output gradient were all held from the start
  // of backward, next to the gradient they were cut from.
  bool defer_in_grad = false;
};

// An op's CUDA launcher, `<name>_cuda`, exists only in builds with the CUDA
// backend: op files define it inside AD_CUDA_ONLY(...) and name it in their
// OpDef as AD_CUDA_FN(<name>_cuda) (nullptr otherwise).
#if AD_HAVE_CUDA
#define AD_CUDA_FN(f) f
#define AD_CUDA_ONLY(...) __VA_ARGS__
#else
#define AD_CUDA_FN(f) nullptr
#define AD_CUDA_ONLY(...)
#endif

#define AD_OP(name, family) extern const OpDef op_def_##name;
#include "ad/op_list.inc"
#undef AD_OP

const OpDef& op_def(OpId op);

class GraphImpl {
 public:
  GraphImpl();
  Node& node(std::int32_t id) { return nodes[static_cast<std::size_t>(id)]; }
  const Node& node(std::int32_t id) const { return nodes[static_cast<std::size_t>(id)]; }
  std::int32_t add_node(Node n);
  // Takes back the op node just added (id must be the last node and nothing
  // may read it yet): a builder that checked its inputs with one form of a
  // node and then builds another.
  void drop_last(std::int32_t id);
  std::int32_t param_node(ParamState* p);
  bool is_leaf(std::int32_t id) const;
  // Called before every run (eval, planning): a leaf whose tensor was
  // written since the last run (Storage::version), or a parameter whose
  // Parameter now holds another tensor, makes every computed value that
  // depends on it stale; those values are dropped, to be recomputed. A
  // parameter whose shape, dtype or device changed throws ad::Error.
  void refresh_leaves();

  std::vector<Node> nodes;
  std::vector<std::int32_t> leaves;  // input and parameter nodes, in order
  std::shared_ptr<Allocator> alloc;
  std::unordered_map<const ParamState*, std::int32_t> param_nodes;
  std::unordered_map<std::int32_t, std::string> names;
  // backward(): loss id -> gradient sinks built for it (reused by later calls)
  // first_grad: the first gradient node grad() appended (nodes before it are the forward pass's)
  struct GradCacheEntry { std::int32_t seed; std::vector<Sink> sinks; std::int32_t first_grad = 0; };
  std::unordered_map<std::int32_t, GradCacheEntry> grad_cache;
  // backward_wrt(): the same, for a (loss, seed, wrt) triple, with the nodes of
  // wrt's gradients (few entries per graph: searched in order)
  struct WrtCacheEntry {
    std::int32_t loss, seed;
    std::vector<std::int32_t> wrt, wrt_grads;
    std::vector<Sink> sinks;
  };
  std::vector<WrtCacheEntry> wrt_cache;
  // Testing aid: fill every output with a NaN/garbage pattern before its
  // kernel runs, so a kernel that leaves elements unwritten is caught.
  bool poison_outputs = false;
  // Graph::record: where executed steps are recorded (not owned), or null.
  Trace* trace = nullptr;
  // Called by the executor after each accumulate step (a parameter's
  // gradient for this step is complete); dist::DataParallel starts its
  // all-reduces from here.
  std::function<void(const Parameter&)> on_grad_ready;
  // Expires with the graph: plans made for it hold a weak_ptr (Plan::graph_alive).
  std::shared_ptr<const int> alive = std::make_shared<const int>(0);
};

// Builds a node: resolves the graph of the operands, infers the output meta
// (ad::Error on mismatch), appends it.
Var make_node(OpId op, std::span<const Operand> inputs, const Attrs& attrs = {});
inline Var make_node(OpId op, std::initializer_list<Operand> inputs, const Attrs& attrs = {}) {
  return make_node(op, std::span<const Operand>(inputs.begin(), inputs.size()), attrs);
}

// The shape of an op's operand, read before its node is built (to normalise
// an axis); throws ad::Error naming `op` for an undefined Var or an empty
// Parameter.
Shape operand_shape(const char* op, const Operand& x);

// ---- helpers for infer functions ----
// The operand as a node of like's graph: its Var, or the Parameter's leaf
// there (for builders that reshape an operand before the op that would place
// it: a reshape of a Parameter alone knows no graph).
inline Var operand_var(const Operand& o, const Var& like) {
  if (o.var().defined()) return o.var();
  return Var(like.graph(), like.graph()->param_node(o.param()));
}

// Throws ad::Error "<op>: <what>: a f32[2,3] vs b f32[4]" (all inputs listed).
[[noreturn]] void fail_shapes(const InferArgs& a, const std::string& what);
[[noreturn]] void fail(const InferArgs& a, const std::string& what);
// Inputs must be f32/f64 and share dtype (names them otherwise). Devices are
// checked for every op in make_node, before infer.
void check_float_same(const InferArgs& a);
// Input i must be i64 indices.
void check_index(const InferArgs& a, std::size_t i);
// Normalises a possibly negative axis for rank r; throws naming the op.
std::int64_t norm_axis(const InferArgs& a, std::int64_t axis, int rank);
std::int64_t norm_axis(const char* op, std::int64_t axis, const Shape& shape);
// Numpy broadcast of two shapes; nullopt-like: returns false if incompatible.
bool broadcast_shapes(const Shape& a, const Shape& b, Shape& out);

// Runtime errors from kernels (data-dependent), naming the op.
[[noreturn]] void kernel_fail(const char* op, const std::string& what);

}  // namespace ad
