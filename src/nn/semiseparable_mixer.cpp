// The learned causal semiseparable token mixer (a layer built from ops):
//   h = x W_in;  m = semiseparable_matvec(h, t_diag, 0, t_lower, U, V, causal);  y = m W_out
#include <cmath>

#include <fmt/format.h>

#include "ad/ops.hpp"
#include "ad/semiseparable.hpp"
#include "core/graph_impl.hpp"  // a Parameter's leaf in x's graph (the public route needs the Graph object)

namespace ad {

SemiseparableMixer SemiseparableMixer::make(std::int64_t max_len, std::int64_t channels, std::int64_t rank, Rng& rng,
                                            DType dtype) {
  if (max_len < 1 || channels < 1 || rank < 1 || !is_compute_float(dtype))
    throw Error(fmt::format("SemiseparableMixer: max_len {}, channels {} and rank {} must be >= 1 and dtype f32/f64 "
                            "(got {})",
                            max_len, channels, rank, dtype_name(dtype)));
  SemiseparableMixer m;
  m.max_len = max_len;
  m.channels = channels;
  m.rank = rank;
  m.uv_dtype = dtype;
  m.t_diag = Parameter(Tensor::full({max_len}, 1.0, dtype), "mixer.t_diag");
  m.t_lower = Parameter::randn({max_len - 1}, rng, 0.1, dtype, "mixer.t_lower");
  m.u = Parameter::randn({max_len, rank}, rng, 1.0 / std::sqrt(static_cast<double>(rank)), dtype, "mixer.u");
  m.v = Parameter::randn({max_len, rank}, rng, 1.0 / std::sqrt(static_cast<double>(max_len)), dtype, "mixer.v");
  double s = 1.0 / std::sqrt(static_cast<double>(channels));
  m.w_in = Parameter::randn({channels, channels}, rng, s, dtype, "mixer.w_in");
  m.w_out = Parameter::randn({channels, channels}, rng, s, dtype, "mixer.w_out");
  return m;
}

Var SemiseparableMixer::operator()(const Var& x) const {
  if (max_len < 1 || channels < 1)
    throw Error("SemiseparableMixer: an empty mixer (default-constructed); make one with SemiseparableMixer::make");
  if (!x.defined() || x.rank() != 3 || x.dim(2) != channels || x.dim(1) < 1 || x.dim(1) > max_len)
    throw Error(fmt::format("SemiseparableMixer: x must be (B, N, {}) with 1 <= N <= {}, got {}", channels, max_len,
                            x.defined() ? x.str() : std::string("an undefined Var")));
  std::int64_t N = x.dim(1);
  auto leaf = [&](const Parameter& p) { return Var(x.graph(), x.graph()->param_node(p.state())); };
  Var h = matmul(x, w_in);
  Var d = slice(leaf(t_diag), 0, 0, N), lo = slice(leaf(t_lower), 0, 0, N - 1);
  Var uu = slice(leaf(u), 0, 0, N), vv = slice(leaf(v), 0, 0, N);
  // bf16 / f16 only: f32 or f64 means the parameters' own dtype (an f64 mixer with the default f32 gave
  // x f64 against u, v f32, which the product rejects)
  if ((uv_dtype == DType::bf16 || uv_dtype == DType::f16) && uv_dtype != uu.dtype()) {
    uu = cast(uu, uv_dtype);
    vv = cast(vv, uv_dtype);
  }
  Var up = full(h, {N - 1}, 0.0, h.dtype());  // unused by the causal product
  Var m = semiseparable_matvec(h, d, up, lo, uu, vv, /*causal=*/true);
  return matmul(m, w_out);
}

}  // namespace ad
