#include "ad/format.hpp"

#include <cmath>

namespace ad {

namespace {
constexpr std::int64_t kEdge = 3;  // values shown at each end of a long dim

// A tensor's values on the host: i64 as themselves (through a double, values past 2^53 would change), the rest
// as doubles.
struct Values {
  std::vector<double> f;
  std::vector<std::int64_t> i;
  bool integer = false;
};
void append_value(std::string& s, const Values& v, std::int64_t k) {
  const auto u = static_cast<std::size_t>(k);
  if (v.integer) s += fmt::format("{}", v.i[u]);
  else s += fmt::format("{:.6g}", v.f[u]);
}
void append_dim(std::string& s, const Values& v, const Shape& sh, int dim, std::int64_t off, int indent) {
  std::int64_t n = sh[dim], stride = 1;
  for (int i = dim + 1; i < sh.rank(); ++i) stride *= sh[i];
  s += '[';
  for (std::int64_t i = 0; i < n; ++i) {
    if (n > 2 * kEdge && i == kEdge) {
      s += dim + 1 == sh.rank() ? "..., " : fmt::format("...,\n{:{}}", "", indent + 1);
      i = n - kEdge;
    }
    if (dim + 1 == sh.rank()) append_value(s, v, off + i);
    else append_dim(s, v, sh, dim + 1, off + i * stride, indent + 1);
    if (i + 1 < n) s += dim + 1 == sh.rank() ? ", " : fmt::format(",\n{:{}}", "", indent + 1);
  }
  s += ']';
}
}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "Tensor(undefined)";
  std::string s = fmt::format("Tensor {}{}\n", dtype_name(t.dtype()), t.shape().str());
  Values v;
  v.integer = t.dtype() == DType::i64;
  if (v.integer) {
    const Tensor h = t.to(Device::cpu());
    const std::int64_t* p = h.data<std::int64_t>();
    v.i.assign(p, p + h.numel());
  } else {
    v.f = t.to_vector();
  }
  if (t.rank() == 0) append_value(s, v, 0);
  else append_dim(s, v, t.shape(), 0, 0, 0);
  return s;
}

std::string to_string(const Report& r) {
  auto mib = [](std::int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  std::string s;
  s += "| policy | predicted peak | measured peak | kept | computed | recomputed | extra flops | evictions | plan ms | run ms |\n";
  s += "|---|---|---|---|---|---|---|---|---|---|\n";
  s += fmt::format("| {} | {} B ({:.2f} MiB) | {} B ({:.2f} MiB) | {} B | {} | {} | {:.3g} | {} | {:.3f}{} | {:.3f} |",
                   r.policy, r.predicted_peak_bytes, mib(r.predicted_peak_bytes), r.measured_peak_bytes,
                   mib(r.measured_peak_bytes), r.kept_bytes, r.computed_nodes, r.recomputed_nodes, r.recompute_flops,
                   r.evictions, r.plan_ms, r.plan_cached ? " (cached)" : "", r.run_ms);
  if (r.proven_cheapest) s += "\n\nno schedule within the budget recomputes less (proven by the exact search)";
  if (r.offload_peak_bytes > 0)
    s += fmt::format("\n\noffloaded to host memory: {} B ({:.2f} MiB) at most at once", r.offload_peak_bytes,
                     mib(r.offload_peak_bytes));
  return s;
}

}  // namespace ad
