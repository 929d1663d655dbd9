// Attention as a graph op (see include/ad/attention.hpp). The forward node's
// value is one flat buffer [O | lse] in the input dtype: O [B,H,Nq,d] then one
// log-sum-exp per query row [B,H,Nq] in the accumulate type (f32 bits for
// bf16/f16 inputs; attn::lse_offset); ad::attention hands out O with part().
// The backward is one fused op whose value is [dq | dk | dv], handed out with
// part() too. Kernels: src/ops/attention_cpu.cpp, src/cuda/attention.cu;
// per-element math: attention_math.hpp.
#include <cmath>

#include "ad/attention.hpp"
#include "core/graph_impl.hpp"
#include "core/kernels.hpp"
#include "ops/attention_cpu.hpp"
#include "cuda/launch.hpp"

namespace ad {

namespace {
// q, k, v [B,H,Nq,d], [B,Hkv,Nk,d] x2 and optional key lengths i64 [B] at
// input `lens_at` (absent when the op has fewer inputs).
attn::Dims check_attention(const InferArgs& a, std::size_t lens_at) {
  for (std::size_t i = 0; i < 3; ++i) {
    if (!is_floating(a[i].dtype))
      fail_shapes(a, fmt::format("{} must be f32, f64, bf16 or f16, got {}", i == 0 ? "q" : i == 1 ? "k" : "v",
                                 dtype_name(a[i].dtype)));
    if (a[i].dtype != a[0].dtype) fail_shapes(a, "dtype mismatch");
  }
  const Shape &qs = a[0].shape, &ks = a[1].shape, &vs = a[2].shape;
  if (qs.rank() != 4 || ks.rank() != 4 || vs.rank() != 4)
    fail_shapes(a, "q must be [B, H, Nq, d], k and v [B, Hkv, Nk, d]");
  if (!(ks == vs)) fail_shapes(a, "k and v shapes differ");
  if (qs[0] != ks[0]) fail_shapes(a, fmt::format("batch sizes differ ({} vs {})", qs[0], ks[0]));
  if (qs[3] != ks[3]) fail_shapes(a, fmt::format("head sizes d differ ({} vs {})", qs[3], ks[3]));
  if (qs[3] == 0) fail_shapes(a, "head size d is 0");
  if (a[0].device.kind == DeviceKind::cuda && qs[3] > 128)
    fail_shapes(a, fmt::format("no CUDA kernel for head size d = {} (the CUDA kernels take d <= 128)", qs[3]));
  if (ks[1] == 0 ? qs[1] != 0 : qs[1] % ks[1] != 0)
    fail_shapes(a, fmt::format("key/value heads Hkv = {} do not divide query heads H = {}", ks[1], qs[1]));
  if (a.in.size() > lens_at) {
    const Meta& lm = a[lens_at];
    if (lm.dtype != DType::i64) fail_shapes(a, fmt::format("key_lengths must be i64, got {}", dtype_name(lm.dtype)));
    if (lm.shape.rank() != 1 || lm.shape[0] != qs[0]) fail_shapes(a, fmt::format("key_lengths must be [B] = [{}]", qs[0]));
  }
  if (!std::isfinite(a.attrs.scalar)) fail_shapes(a, fmt::format("scale must be finite, got {}", a.attrs.scalar));
  // the kernels multiply in f32 unless the inputs are f64
  if (a[0].dtype != DType::f64 && !std::isfinite(static_cast<float>(a.attrs.scalar)))
    fail_shapes(a, fmt::format("scale {} is not finite in f32, the compute type of {} inputs", a.attrs.scalar,
                               dtype_name(a[0].dtype)));
  attn::Dims dm;
  dm.B = qs[0]; dm.H = qs[1]; dm.Hkv = ks[1]; dm.Nq = qs[2]; dm.Nk = ks[2]; dm.d = qs[3];
  dm.causal = a.attrs.causal;
  dm.scale = a.attrs.scalar;
  return dm;
}
attn::Dims dims_of(const Tensor& q, const Tensor& k, const Attrs& at) {
  attn::Dims dm;
  const Shape &qs = q.shape(), &ks = k.shape();
  dm.B = qs[0]; dm.H = qs[1]; dm.Hkv = ks[1]; dm.Nq = qs[2]; dm.Nk = ks[2]; dm.d = qs[3];
  dm.causal = at.causal;
  dm.scale = at.scalar;
  return dm;
}
// Key lengths are data: checked when the kernel runs.
const std::int64_t* checked_lengths(const char* op, const KernelArgs& k, std::size_t at, const attn::Dims& dm) {
  if (k.in.size() <= at) return nullptr;
  const std::int64_t* lens = k[at].data<std::int64_t>();
  for (std::int64_t b = 0; b < dm.B; ++b)
    if (lens[b] < 0 || lens[b] > dm.Nk)
      kernel_fail(op, fmt::format("key_lengths[{}] = {} is outside [0, Nk = {}]", b, lens[b], dm.Nk));
  return lens;
}
// On a GPU the lengths are checked on the device (one flag read back).
AD_CUDA_ONLY(const std::int64_t* device_lengths(const char* op, const KernelArgs& k, std::size_t at,
                                                const attn::Dims& dm) {
  if (k.in.size() <= at) return nullptr;
  const std::int64_t* lens = k[at].data<std::int64_t>();
  std::int64_t value = 0;
  std::int64_t b = cuda_k::first_bad_index(lens, dm.B, dm.Nk + 1, &value);
  if (b >= 0) kernel_fail(op, fmt::format("key_lengths[{}] = {} is outside [0, Nk = {}]", b, value, dm.Nk));
  return lens;
})
bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }
// The CUDA backward's workspace: D, one accumulate-type value per query row.
std::int64_t cuda_backward_workspace_bytes(const attn::Dims& dm, DType t) {
  return dm.B * dm.H * dm.Nq * (t == DType::f64 ? 8 : 4);
}
double forward_flops(const attn::Dims& dm) {  // QK^T and PV: 2 products of 2 d flops per visible pair
  return 4.0 * static_cast<double>(dm.B * dm.H * dm.d) * attn::visible_pairs(dm);
}
}  // namespace

// ---- attention ----  q [B,H,Nq,d], k, v [B,Hkv,Nk,d] (, key_lengths [B]) -> [O | lse] flat,
// O [B,H,Nq,d] = softmax(scale q k^T + mask) v, lse [B,H,Nq]; saves q, k, v, lengths and the output
Meta infer_attention(const InferArgs& a) {
  if (a.in.size() != 3 && a.in.size() != 4)
    fail(a, fmt::format("expects q, k, v and optionally key_lengths, got {} inputs", a.in.size()));
  attn::Dims dm = check_attention(a, 3);
  return Meta{Shape{attn::buffer_elems(dm, dtype_size(a[0].dtype))}, a[0].dtype, a[0].device};
}
void attention_cpu(const KernelArgs& k) {
  attn::Dims dm = dims_of(k[0], k[1], k.attrs);
  const std::int64_t* lens = checked_lengths("attention", k, 3, dm);
  const DType dt = k.out.dtype();
  if (is_half(dt)) {
    auto* o = static_cast<std::uint16_t*>(k.out.raw());
    attn::forward_cpu_half(dm, dt == DType::bf16, static_cast<const std::uint16_t*>(k[0].raw()),
                           static_cast<const std::uint16_t*>(k[1].raw()), static_cast<const std::uint16_t*>(k[2].raw()),
                           lens, o, reinterpret_cast<float*>(o + attn::lse_offset(dm, 2)), k.workspace);
    return;
  }
  kernels::dispatch_float(dt, "attention", [&](auto t) {
    using T = decltype(t);
    T* o = k.out.data<T>();
    attn::forward_cpu<T>(dm, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(), lens, o, o + dm.B * dm.H * dm.Nq * dm.d,
                         k.workspace);
  });
}
AD_CUDA_ONLY(void attention_cuda(const KernelArgs& k) {
  attn::Dims dm = dims_of(k[0], k[1], k.attrs);
  const std::int64_t* lens = device_lengths("attention", k, 3, dm);
  const std::size_t es = dtype_size(k.out.dtype());
  char* buf = static_cast<char*>(k.out.raw());
  cuda_k::attention_forward(k.out.dtype(), dm, k[0].raw(), k[1].raw(), k[2].raw(), lens, buf,
                            buf + attn::lse_offset(dm, es) * static_cast<std::int64_t>(es));
})
// One fused backward node [dq | dk | dv]; each wanted gradient is a part of it.
// The gradient of lse (zero unless someone reads that part) is honoured too.
void attention_bwd(BackwardArgs& a) {
  std::vector<Operand> ins{a.in[0], a.in[1], a.in[2], a.out, a.dout};
  if (a.in.size() == 4) ins.push_back(a.in[3]);
  Var g = make_node(OpId::attention_backward, std::span<const Operand>(ins), a.attrs);
  const std::int64_t nq = a.in[0].numel(), nk = a.in[1].numel();
  if (a.needs[0]) a.grad[0] = part(g, 0, a.in[0].shape());
  if (a.needs[1]) a.grad[1] = part(g, nq, a.in[1].shape());
  if (a.needs[2]) a.grad[2] = part(g, nq + nk, a.in[2].shape());
}
const OpDef op_def_attention{
    .name = "attention", .args = "q,k,v,key_lengths", .arity = -1, .infer = infer_attention, .cpu = attention_cpu,
    .cuda = AD_CUDA_FN(attention_cuda), .backward = attention_bwd,
    .saves = saves_input(0) | saves_input(1) | saves_input(2) | saves_input(3) | kSavesOutput,
    .flops = [](const InferArgs& a, const Meta&) { return forward_flops(check_attention(a, 3)); },
    .workspace = [](const InferArgs& a, const Meta& out) -> std::int64_t {
      if (out.device.kind == DeviceKind::cuda) return 0;  // the CUDA forward needs no scratch
      return attn::forward_workspace_bytes(check_attention(a, 3), dtype_size(out.dtype));
    }};

Var attention(const Operand& q, const Operand& k, const Operand& v, const AttentionOptions& options) {
  const Shape qs = operand_shape("attention", q);  // a copy: building nodes may move the graph's metas
  Attrs at;
  at.causal = options.causal;
  if (options.scale) {
    if (!std::isfinite(*options.scale)) throw Error(fmt::format("attention: scale must be finite, got {}", *options.scale));
    at.scalar = *options.scale;
  } else {
    at.scalar = qs.rank() == 4 && qs[3] > 0 ? 1.0 / std::sqrt(static_cast<double>(qs[3])) : 1.0;
  }
  Var buf = options.key_lengths.defined() ? make_node(OpId::attention, {q, k, v, options.key_lengths}, at)
                                          : make_node(OpId::attention, {q, k, v}, at);
  return part(buf, 0, qs);
}

// ---- attention_backward ----  (q, k, v, [O | lse], [dO | dlse] (, key_lengths)) -> [dq | dk | dv] flat:
// D = rowsum(dO o O) - dlse; per tile P = e^{scale q k^T - lse}, dV += P^T dO, dS = P (dO V^T - D),
// dQ += scale dS K, dK += scale dS^T Q. Fused: one pass forms all three (the tiles are recomputed once).
Meta infer_attention_backward(const InferArgs& a) {
  if (a.in.size() != 5 && a.in.size() != 6)
    fail(a, fmt::format("expects q, k, v, out, dout and optionally key_lengths, got {} inputs", a.in.size()));
  attn::Dims dm = check_attention(a, 5);
  const std::int64_t buf = attn::buffer_elems(dm, dtype_size(a[0].dtype));
  for (std::size_t i : {std::size_t{3}, std::size_t{4}})
    if (a[i].shape.rank() != 1 || a[i].shape[0] != buf || a[i].dtype != a[0].dtype)
      fail_shapes(a, fmt::format("{} must be the attention buffer [{}]", i == 3 ? "out" : "dout", buf));
  return Meta{Shape{a[0].shape.numel() + 2 * a[1].shape.numel()}, a[0].dtype, a[0].device};
}
void attention_backward_cpu(const KernelArgs& k) {
  attn::Dims dm = dims_of(k[0], k[1], k.attrs);
  const std::int64_t* lens = checked_lengths("attention_backward", k, 5, dm);
  const std::int64_t no = dm.B * dm.H * dm.Nq * dm.d, nq = k[0].numel(), nk = k[1].numel();
  const DType dt = k.out.dtype();
  if (is_half(dt)) {
    using U = std::uint16_t;
    const U *buf = static_cast<const U*>(k[3].raw()), *dbuf = static_cast<const U*>(k[4].raw());
    const std::int64_t lo = attn::lse_offset(dm, 2);
    U* g = static_cast<U*>(k.out.raw());
    attn::backward_cpu_half(dm, dt == DType::bf16, static_cast<const U*>(k[0].raw()),
                            static_cast<const U*>(k[1].raw()), static_cast<const U*>(k[2].raw()), buf,
                            reinterpret_cast<const float*>(buf + lo), dbuf, reinterpret_cast<const float*>(dbuf + lo),
                            lens, g, g + nq, g + nq + nk, k.workspace);
    return;
  }
  kernels::dispatch_float(dt, "attention_backward", [&](auto t) {
    using T = decltype(t);
    const T *buf = k[3].data<T>(), *dbuf = k[4].data<T>();
    T* g = k.out.data<T>();
    attn::backward_cpu<T>(dm, k[0].data<T>(), k[1].data<T>(), k[2].data<T>(), buf, buf + no, dbuf, dbuf + no, lens, g,
                          g + nq, g + nq + nk, k.workspace);
  });
}
AD_CUDA_ONLY(void attention_backward_cuda(const KernelArgs& k) {
  attn::Dims dm = dims_of(k[0], k[1], k.attrs);
  const std::int64_t* lens = device_lengths("attention_backward", k, 5, dm);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(k.out.dtype()));
  const std::int64_t lo = attn::lse_offset(dm, static_cast<std::size_t>(es)) * es;
  const char *buf = static_cast<const char*>(k[3].raw()), *dbuf = static_cast<const char*>(k[4].raw());
  char* g = static_cast<char*>(k.out.raw());
  const std::int64_t nq = k[0].numel() * es, nk = k[1].numel() * es;
  cuda_k::attention_backward(k.out.dtype(), dm, k[0].raw(), k[1].raw(), k[2].raw(), buf, buf + lo, dbuf, dbuf + lo,
                             lens, g, g + nq, g + nq + nk, k.workspace);
})
const OpDef op_def_attention_backward{
    .name = "attention_backward", .args = "q,k,v,out,dout,key_lengths", .arity = -1,
    .infer = infer_attention_backward, .cpu = attention_backward_cpu,
    .cuda = AD_CUDA_FN(attention_backward_cuda), .no_grad = "double backward is not supported",
    .flops = [](const InferArgs& a, const Meta&) { return 2.5 * forward_flops(check_attention(a, 5)); },
    .workspace = [](const InferArgs& a, const Meta& out) -> std::int64_t {
      const attn::Dims dm = check_attention(a, 5);
      if (out.device.kind == DeviceKind::cuda) return cuda_backward_workspace_bytes(dm, out.dtype);
      return attn::backward_workspace_bytes(dm, dtype_size(out.dtype));
    }};

}  // namespace ad
