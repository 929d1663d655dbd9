#include "ad/format.hpp"

#include <cmath>

namespace ad {

namespace {
constexpr std::int64_t kEdge = 3;  // values shown at each end of a long dim

void append_value(std::string& s, double v, DType t) {
  if (t == DType::i64) s += fmt::format("{}", static_cast<std::int64_t>(v));
  else s += fmt::format("{:.6g}", v);
}
void append_dim(std::string& s, const std::vector<double>& v, const Shape& sh, int dim, std::int64_t off, DType t,
                int indent) {
  std::int64_t n = sh[dim], stride = 1;
  for (int i = dim + 1; i < sh.rank(); ++i) stride *= sh[i];
  s += '[';
  for (std::int64_t i = 0; i < n; ++i) {
    if (n > 2 * kEdge && i == kEdge) {
      s += dim + 1 == sh.rank() ? "..., " : fmt::format("...,\n{:{}}", "", indent + 1);
      i = n - kEdge;
    }
    if (dim + 1 == sh.rank()) append_value(s, v[static_cast<std::size_t>(off + i)], t);
    else append_dim(s, v, sh, dim + 1, off + i * stride, t, indent + 1);
    if (i + 1 < n) s += dim + 1 == sh.rank() ? ", " : fmt::format(",\n{:{}}", "", indent + 1);
  }
  s += ']';
}
}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "Tensor(undefined)";
  std::string s = fmt::format("Tensor {}{}\n", dtype_name(t.dtype()), t.shape().str());
  std::vector<double> v = t.to_vector();
  if (t.rank() == 0) append_value(s, v[0], t.dtype());
  else append_dim(s, v, t.shape(), 0, 0, t.dtype(), 0);
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
