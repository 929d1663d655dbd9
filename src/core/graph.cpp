#include <fmt/format.h>

#include "core/graph_impl.hpp"
#include "core/device.hpp"

namespace ad {

// ---- op table ----
namespace {
const OpDef* const kOpTable[] = {
#define AD_OP(name, family) &op_def_##name,
#include "ad/op_list.inc"
#undef AD_OP
};
static_assert(sizeof(kOpTable) / sizeof(kOpTable[0]) == static_cast<std::size_t>(kNumOps));
}  // namespace

const OpDef& op_def(OpId op) { return *kOpTable[static_cast<std::size_t>(op)]; }
const char* op_name(OpId op) { return op_def(op).name; }

std::string describe(const Meta& m) {
  if (m.device.kind == DeviceKind::cpu) return fmt::format("{}{}", dtype_name(m.dtype), m.shape.str());
  return fmt::format("{}{}@cuda:{}", dtype_name(m.dtype), m.shape.str(), m.device.index);
}

// ---- Parameter ----
Parameter::Parameter(Tensor value, std::string name) : s_(std::make_shared<ParamState>()) {
  if (!value.defined()) throw Error("Parameter: value is an undefined tensor");
  if (!is_compute_float(value.dtype()))
    throw Error(fmt::format("Parameter: dtype {} is not a compute dtype (f32 or f64)", dtype_name(value.dtype())));
  s_->value = std::move(value);
  s_->name = std::move(name);
}
Parameter Parameter::randn(const Shape& shape, Rng& rng, double stddev, DType dtype, std::string name) {
  return Parameter(Tensor::randn(shape, rng, dtype, 0.0, stddev), std::move(name));
}
Parameter Parameter::zeros(const Shape& shape, DType dtype, std::string name) {
  return Parameter(Tensor::zeros(shape, dtype), std::move(name));
}
static ParamState& checked(const std::shared_ptr<ParamState>& s) {
  if (!s) throw Error("Parameter: use of an empty (default-constructed) Parameter");
  return *s;
}
const std::string& Parameter::name() const { return checked(s_).name; }
Tensor& Parameter::value() const { return checked(s_).value; }
const Tensor& Parameter::grad() const { return checked(s_).grad_now(); }
bool Parameter::has_grad() const { return checked(s_).grad.defined(); }
bool Parameter::has_fresh_grad() const {
  const auto& s = checked(s_);
  return s.grad.defined() && s.grad_fresh;
}
void Parameter::zero_grad() const {
  auto& s = checked(s_);
  if (s.grad.defined()) s.grad_zero = true;  // filled lazily (grad_now), or overwritten by the next backward
  s.grad_fresh = false;
}

// ---- GraphImpl ----
GraphImpl::GraphImpl() : alloc(std::make_shared<Allocator>(Device::cpu())) { nodes.reserve(64); }

std::int32_t GraphImpl::add_node(Node n) {
  if (nodes.size() >= static_cast<std::size_t>(INT32_MAX)) throw Error("Graph: too many nodes");
  nodes.push_back(std::move(n));
  const auto id = static_cast<std::int32_t>(nodes.size() - 1);
  if (is_leaf(id)) leaves.push_back(id);
  return id;
}

void GraphImpl::refresh_leaves() {
  // every check first: an error leaves the graph as it was (a write found
  // before it is still found by the next run)
  for (std::int32_t id : leaves) {
    const Node& n = node(id);
    if (!n.param) continue;
    const Tensor& cur = n.param->value;
    const Meta m{cur.shape(), cur.dtype(), cur.device()};
    if (!(m.shape == n.meta.shape) || m.dtype != n.meta.dtype || !(m.device == n.meta.device))
      throw Error(fmt::format("Graph: parameter {} is now {}{} on {} but was {}{} on {} when this graph was built; "
                              "build a new graph",
                              n.param->name.empty() ? std::string("(unnamed)") : "'" + n.param->name + "'",
                              dtype_name(m.dtype), m.shape.str(), device::name(m.device), dtype_name(n.meta.dtype),
                              n.meta.shape.str(), device::name(n.meta.device)));
  }
  std::vector<char> dirty;
  auto mark = [&](std::int32_t id) {
    if (dirty.empty()) dirty.assign(nodes.size(), 0);
    dirty[static_cast<std::size_t>(id)] = 1;
  };
  for (std::int32_t id : leaves) {
    Node& n = node(id);
    if (n.param) {
      const Tensor& cur = n.param->value;
      if (!cur.same_storage(n.value) || cur.storage_offset() != n.value.storage_offset()) {
        n.value = cur;  // the Parameter holds another tensor (same meta: checked above)
        if (n.seen) mark(id);
      }
    }
    const std::uint64_t v = n.value.storage() ? n.value.storage()->version() : 0;
    if (n.seen && v != n.seen_version) mark(id);
    n.seen_version = v;
    n.seen = true;
  }
  if (dirty.empty()) return;
  for (std::size_t id = 0; id < nodes.size(); ++id) {
    Node& n = nodes[id];
    if (dirty[id]) continue;  // a leaf
    for (auto in : n.inputs)
      if (dirty[static_cast<std::size_t>(in)]) { dirty[id] = 1; break; }
    if (dirty[id] && !is_leaf(static_cast<std::int32_t>(id))) n.value = Tensor();
  }
}

void GraphImpl::drop_last(std::int32_t id) {
  if (nodes.empty() || static_cast<std::size_t>(id) + 1 != nodes.size() || is_leaf(id) || node(id).value.defined())
    throw Error(fmt::format("Graph: internal: node {} is not the last op node built", id));
  nodes.pop_back();
}

std::int32_t GraphImpl::param_node(ParamState* p) {
  auto it = param_nodes.find(p);
  if (it != param_nodes.end()) return it->second;
  Node n;
  n.op = OpId::parameter;
  n.meta = {p->value.shape(), p->value.dtype(), p->value.device()};
  n.param = p->shared_from_this();
  n.value = p->value;
  auto id = add_node(std::move(n));
  param_nodes.emplace(p, id);
  if (!p->name.empty()) names.emplace(id, p->name);
  return id;
}

bool GraphImpl::is_leaf(std::int32_t id) const {
  auto op = node(id).op;
  return op == OpId::input || op == OpId::parameter;
}

// ---- Graph ----
Graph::Graph() : impl_(std::make_unique<GraphImpl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

Var Graph::input(const Tensor& t, std::string name) {
  if (!t.defined()) throw Error("Graph::input: undefined tensor");
  Node n;
  n.op = OpId::input;
  n.meta = {t.shape(), t.dtype(), t.device()};
  n.value = t;
  GraphImpl& g = impl();
  auto id = g.add_node(std::move(n));
  if (!name.empty()) g.names.emplace(id, std::move(name));
  return {&g, id};
}
Var Graph::param(const Parameter& p) {
  if (!p.defined()) throw Error("Graph::param: empty Parameter");
  GraphImpl& g = impl();
  return {&g, g.param_node(p.state())};
}
std::int64_t Graph::num_nodes() const { return static_cast<std::int64_t>(impl().nodes.size()); }
std::int64_t Graph::live_bytes() const { return impl().alloc->live_bytes(); }
std::int64_t Graph::release(const std::vector<Var>& keep) {
  GraphImpl& g = impl();
  std::vector<char> kept(g.nodes.size(), 0);
  for (std::size_t i = 0; i < keep.size(); ++i) {
    if (!keep[i].defined()) throw Error(fmt::format("Graph::release: keep[{}] is an undefined Var", i));
    if (keep[i].graph() != &g)
      throw Error(fmt::format("Graph::release: keep[{}] {} belongs to another graph", i, keep[i].str()));
    kept[static_cast<std::size_t>(keep[i].id())] = 1;
  }
  const std::int64_t before = g.alloc->live_bytes();
  for (std::size_t id = 0; id < g.nodes.size(); ++id) {
    Node& nd = g.nodes[id];
    if (!kept[id] && nd.value.defined() && !g.is_leaf(static_cast<std::int32_t>(id))) nd.value = Tensor{};
  }
  return before - g.alloc->live_bytes();
}
void Graph::record(Trace* trace) { impl().trace = trace; }
GraphImpl& Graph::impl() const {
  if (!impl_) throw Error("Graph: use of a moved-from Graph");
  return *impl_;
}

// ---- Var ----
static const Node& checked_node(const Var& v) {
  if (!v.defined()) throw Error("Var: use of an undefined Var");
  return v.graph()->node(v.id());
}
OpId Var::op() const { return checked_node(*this).op; }
Shape Var::shape() const { return checked_node(*this).meta.shape; }
DType Var::dtype() const { return checked_node(*this).meta.dtype; }
Device Var::device() const { return checked_node(*this).meta.device; }
bool Var::has_value() const { return checked_node(*this).value.defined(); }
std::int64_t Var::dim(int i) const {
  const Shape& s = shape();
  if (i < -s.rank() || i >= s.rank()) throw Error(fmt::format("Var::dim: index {} out of range for shape {}", i, s.str()));
  return s[i < 0 ? i + s.rank() : i];
}
Tensor Var::value() const { return eval(*this); }
std::string Var::str() const {
  const Node& n = checked_node(*this);
  return fmt::format("{}#{} {}", op_def(n.op).name, id_, describe(n.meta));
}

// ---- building nodes ----
static std::string arg_name(const OpDef& def, std::size_t i);
// "a f32[2,3] vs b undefined": the operands of a node not yet built.
static std::string operands_of(const OpDef& def, std::span<const Operand> inputs) {
  std::string s;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Operand& o = inputs[i];
    if (i) s += " vs ";
    s += arg_name(def, i) + " ";
    if (o.param()) s += fmt::format("{}{}", dtype_name(o.param()->value.dtype()), o.param()->value.shape().str());
    else if (o.var().defined()) s += describe(o.var().graph()->node(o.var().id()).meta);
    else s += "undefined";
  }
  return s;
}
Shape operand_shape(const char* op, const Operand& x) {
  if (x.param()) return x.param()->value.shape();
  if (!x.var().defined()) throw Error(fmt::format("{}: input is an undefined Var or an empty Parameter", op));
  return x.var().shape();
}
Var make_node(OpId op, std::span<const Operand> inputs, const Attrs& attrs) {
  const OpDef& def = op_def(op);
  if (def.arity >= 0 && static_cast<int>(inputs.size()) != def.arity)
    throw Error(fmt::format("{}: expects {} inputs, got {}", def.name, def.arity, inputs.size()));
  if (def.arity < 0 && inputs.empty()) throw Error(fmt::format("{}: expects at least one input", def.name));
  GraphImpl* g = nullptr;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Operand& o = inputs[i];
    if (!o.var().defined()) {
      if (!o.param())
        throw Error(fmt::format("{}: input {} is an undefined Var or an empty Parameter: {}", def.name,
                                arg_name(def, i), operands_of(def, inputs)));
      continue;
    }
    if (g && o.var().graph() != g)
      throw Error(fmt::format("{}: inputs belong to different graphs: {}", def.name, operands_of(def, inputs)));
    g = o.var().graph();
  }
  if (!g)
    throw Error(fmt::format("{}: every input is a Parameter, so no graph is known; place one in a graph with "
                            "g.param(p): {}",
                            def.name, operands_of(def, inputs)));
  Node n;
  n.op = op;
  n.attrs = attrs;
  n.inputs.reserve(inputs.size());
  for (const auto& o : inputs) {
    if (o.param()) n.inputs.push_back(g->param_node(o.param()));
    else n.inputs.push_back(o.var().id());
  }
  const Meta* metas_small[8];
  std::vector<const Meta*> metas_big;
  const Meta** metas = metas_small;
  if (n.inputs.size() > 8) { metas_big.resize(n.inputs.size()); metas = metas_big.data(); }
  for (std::size_t i = 0; i < n.inputs.size(); ++i) metas[i] = &g->node(n.inputs[i]).meta;
  InferArgs a{def, std::span<const Meta* const>(metas, n.inputs.size()), n.attrs};
  // no op moves data between devices: a kernel runs where its inputs are (every input, lengths and indices too)
  for (std::size_t i = 1; i < n.inputs.size(); ++i)
    if (!(metas[i]->device == metas[0]->device)) fail_shapes(a, "inputs on different devices");
  n.meta = def.infer(a);
  if (!n.meta.shape.fits_bytes(static_cast<std::int64_t>(dtype_size(n.meta.dtype))))
    throw Error(fmt::format("{}: output shape {} has more bytes than a 64-bit count holds: {}", def.name,
                            n.meta.shape.str(), operands_of(def, inputs)));
  return {g, g->add_node(std::move(n))};
}

// ---- infer helpers ----
static std::string arg_name(const OpDef& def, std::size_t i) {
  std::string_view s = def.args ? def.args : "";
  std::size_t k = 0, start = 0;
  while (k < i) {
    auto p = s.find(',', start);
    if (p == std::string_view::npos) return fmt::format("in{}", i);  // variadic tail
    start = p + 1;
    ++k;
  }
  auto e = s.find(',', start);
  auto name = s.substr(start, e == std::string_view::npos ? s.size() - start : e - start);
  if (name.empty() || name == "...") return fmt::format("in{}", i);
  return std::string(name);
}
std::string shapes_of(const InferArgs& a) {
  std::string s;
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    if (i) s += " vs ";
    s += arg_name(a.def, i) + " " + describe(*a.in[i]);
  }
  return s;
}
void fail_shapes(const InferArgs& a, const std::string& what) {
  throw Error(fmt::format("{}: {}: {}", a.def.name, what, shapes_of(a)));
}
void fail(const InferArgs& a, const std::string& what) { throw Error(fmt::format("{}: {}", a.def.name, what)); }

void check_float_same(const InferArgs& a) {
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    if (!is_compute_float(a[i].dtype))
      fail_shapes(a, fmt::format("{} must be f32 or f64, got {}", arg_name(a.def, i), dtype_name(a[i].dtype)));
    if (a[i].dtype != a[0].dtype) fail_shapes(a, "dtype mismatch");
  }
}
void check_index(const InferArgs& a, std::size_t i) {
  if (a[i].dtype != DType::i64)
    fail_shapes(a, fmt::format("{} must be i64 indices, got {}", arg_name(a.def, i), dtype_name(a[i].dtype)));
}
std::int64_t norm_axis(const InferArgs& a, std::int64_t axis, int rank) {
  if (axis < -rank || axis >= rank)
    fail_shapes(a, fmt::format("axis {} out of range for rank {}", axis, rank));
  return axis < 0 ? axis + rank : axis;
}
std::int64_t norm_axis(const char* op, std::int64_t axis, const Shape& shape) {
  int rank = shape.rank();
  if (axis < -rank || axis >= rank)
    throw Error(fmt::format("{}: axis {} out of range for shape {}", op, axis, shape.str()));
  return axis < 0 ? axis + rank : axis;
}
bool broadcast_shapes(const Shape& a, const Shape& b, Shape& out) {
  int r = std::max(a.rank(), b.rank());
  out = Shape{};
  for (int i = 0; i < r; ++i) {
    int ia = a.rank() - r + i, ib = b.rank() - r + i;
    std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out.push_back(da == 1 ? db : da);
  }
  return true;
}
void kernel_fail(const char* op, const std::string& what) { throw Error(fmt::format("{}: {}", op, what)); }

}  // namespace ad
