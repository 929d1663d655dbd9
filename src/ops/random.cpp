// Random ops. Masks are pure functions of (seed, offset, index) through
// Philox, so a recomputed node draws exactly the same mask.
#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/random_math.hpp"
#if AD_HAVE_CUDA
#include "cuda/launch.hpp"
#endif

namespace ad {

// ---- dropout ----  y = x m / (1 - p), m_i = [u_i > p], u_i = uniform(seed, offset + i);
// linear in x: its gradient is the same dropout applied to dy
Meta infer_dropout(const InferArgs& a) {
  check_float_same(a);
  double p = a.attrs.scalar;
  if (!(p >= 0.0 && p < 1.0)) fail_shapes(a, fmt::format("p must be in [0, 1), got {}", p));
  return a[0];
}
void dropout_cpu(const KernelArgs& k) {
  double p = k.attrs.scalar;
  std::uint64_t seed = k.attrs.seed, off = k.attrs.offset;
  kernels::dispatch_float(k.out.dtype(), "dropout", [&](auto t) {
    using T = decltype(t);
    const T* x = k[0].data<T>();
    T* y = k.out.data<T>();
    rnd::Dropout<T> f{seed, off, static_cast<float>(p), static_cast<T>(1.0 / (1.0 - p))};
    for (std::int64_t i = 0; i < k.out.numel(); ++i) y[i] = f(x[i], i);
  });
}
AD_CUDA_ONLY(void dropout_cuda(const KernelArgs& k) {
  double p = k.attrs.scalar;
  cuda_k::dropout(k.out.dtype(), k[0].raw(), k.out.raw(), k.out.numel(), k.attrs.seed, k.attrs.offset,
                  static_cast<float>(p), 1.0 / (1.0 - p));
})
void dropout_bwd(BackwardArgs& a) {
  a.grad[0] = dropout(a.dout, a.attrs.scalar, a.attrs.seed, a.attrs.offset);
}
const OpDef op_def_dropout{.name = "dropout", .args = "x", .arity = 1, .infer = infer_dropout, .cpu = dropout_cpu,
                           .cuda = AD_CUDA_FN(dropout_cuda),
                           .backward = dropout_bwd};
Var dropout(const Operand& x, double p, std::uint64_t seed, std::uint64_t offset) {
  Attrs at;
  at.scalar = p;
  at.seed = seed;
  at.offset = offset;
  return make_node(OpId::dropout, {x}, at);
}
Var dropout(const Operand& x, double p, Rng& rng) {
  Shape s = operand_shape("dropout", x);
  std::uint64_t seed = rng.seed();
  std::uint64_t off = rng.reserve(static_cast<std::uint64_t>(s.numel()));
  return dropout(x, p, seed, off);
}

}  // namespace ad
