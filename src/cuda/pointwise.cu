// CUDA kernels of the elementwise ops: one grid-stride kernel per shape of
// access (same-shape unary, binary and ternary; broadcasting binary and
// ternary), applying the AD_HD functors of ops/pointwise.hpp that the CPU
// kernels apply too; casts, accumulation, and dropout (ops/random_math.hpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ad/error.hpp"
#include "core/load.hpp"
#include "cuda/launch.hpp"
#include "cuda/util.cuh"
#include "ops/random_math.hpp"

namespace ad::cuda_k {

namespace {

constexpr int kThreads = 256;
unsigned blocks_for(std::int64_t n) { return grid_for(n, kThreads); }

template <class T, class F> __global__ void map1_kernel(const T* x, T* y, std::int64_t n, F f) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = f(x[i]);
}
template <class T, class F> __global__ void map2_kernel(const T* a, const T* b, T* y, std::int64_t n, F f) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = f(a[i], b[i]);
}
template <class T, class F>
__global__ void map3_kernel(const T* a, const T* b, const T* c, T* y, std::int64_t n, F f) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = f(a[i], b[i], c[i]);
}
struct Bcast {
  int rank;
  std::int64_t dims[kMaxRank], sa[kMaxRank], sb[kMaxRank];  // output dims, element strides (0: broadcast)
};
template <class T, class F> __global__ void bcast2_kernel(const T* a, const T* b, T* y, std::int64_t n, Bcast s, F f) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rem = i, ia = 0, ib = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      std::int64_t c = rem % s.dims[d];
      rem /= s.dims[d];
      ia += c * s.sa[d];
      ib += c * s.sb[d];
    }
    y[i] = f(a[ia], b[ib]);
  }
}
struct Bcast3 {
  int rank;
  std::int64_t dims[kMaxRank], sa[kMaxRank], sb[kMaxRank], sc[kMaxRank];  // as Bcast, for three inputs
};
template <class T, class F>
__global__ void bcast3_kernel(const T* a, const T* b, const T* c, T* y, std::int64_t n, Bcast3 s, F f) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rem = i, ia = 0, ib = 0, ic = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      std::int64_t k = rem % s.dims[d];
      rem /= s.dims[d];
      ia += k * s.sa[d];
      ib += k * s.sb[d];
      ic += k * s.sc[d];
    }
    y[i] = f(a[ia], b[ib], c[ic]);
  }
}
// element strides of `in` broadcast to `out` (numpy rules, right-aligned)
void strides_for(const Shape& in, const Shape& out, std::int64_t* st) {
  int r = out.rank(), ri = in.rank();
  std::int64_t acc = 1;
  for (int d = r - 1; d >= 0; --d) {
    int k = d - (r - ri);
    if (k < 0) { st[d] = 0; continue; }
    st[d] = in[k] == 1 && out[d] != 1 ? 0 : acc;
    acc *= in[k];
  }
}

template <class From, class To> __global__ void cast_kernel(const From* x, To* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = static_cast<To>(x[i]);
}
// f16/bf16 are stored as raw 16-bit words; conversions use the AD_HD
// functions of ad/dtype.hpp (round to nearest even), as on the CPU.
__global__ void to16_kernel(const float* x, std::uint16_t* y, std::int64_t n, bool bf) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = bf ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
}
// from f64 in one rounding (f64_to_f16 / f64_to_bf16: through an f32 rounded to odd)
__global__ void to16_from64_kernel(const double* x, std::uint16_t* y, std::int64_t n, bool bf) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = bf ? f64_to_bf16(x[i]) : f64_to_f16(x[i]);
}
__global__ void from16_to64_kernel(const std::uint16_t* x, double* y, std::int64_t n, bool bf) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = static_cast<double>(bf ? bf16_to_f32(x[i]) : f16_to_f32(x[i]));
}
__global__ void from16_kernel(const std::uint16_t* x, float* y, std::int64_t n, bool bf) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = bf ? bf16_to_f32(x[i]) : f16_to_f32(x[i]);
}
template <class T> __global__ void add_into_kernel(T* d, const T* s, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    d[i] += s[i];
}

// dropout: y[i] = f(x[i], i), the mask drawn from Philox as on the CPU
template <class T> __global__ void dropout_kernel(const T* x, T* y, std::int64_t n, rnd::Dropout<T> f) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = f(x[i], i);
}

}  // namespace

template <class F> void map1(DType t, const void* x, void* y, std::int64_t n, F f) {
  if (n == 0) return;
  if (t == DType::f32)
    map1_kernel<<<blocks_for(n), kThreads>>>(static_cast<const float*>(x), static_cast<float*>(y), n, f);
  else
    map1_kernel<<<blocks_for(n), kThreads>>>(static_cast<const double*>(x), static_cast<double*>(y), n, f);
  check_launch("map1");
}
template <class F> void map2(DType t, const void* a, const void* b, void* y, std::int64_t n, F f) {
  if (n == 0) return;
  if (t == DType::f32)
    map2_kernel<<<blocks_for(n), kThreads>>>(static_cast<const float*>(a), static_cast<const float*>(b),
                                             static_cast<float*>(y), n, f);
  else
    map2_kernel<<<blocks_for(n), kThreads>>>(static_cast<const double*>(a), static_cast<const double*>(b),
                                             static_cast<double*>(y), n, f);
  check_launch("map2");
}
template <class F>
void broadcast2(DType t, const void* a, const Shape& as, const void* b, const Shape& bs, void* y, const Shape& ys, F f) {
  std::int64_t n = ys.numel();
  if (n == 0) return;
  if (as == ys && bs == ys) return map2(t, a, b, y, n, f);
  Bcast s{};
  s.rank = ys.rank();
  for (int d = 0; d < s.rank; ++d) s.dims[d] = ys[d];
  strides_for(as, ys, s.sa);
  strides_for(bs, ys, s.sb);
  if (t == DType::f32)
    bcast2_kernel<<<blocks_for(n), kThreads>>>(static_cast<const float*>(a), static_cast<const float*>(b),
                                               static_cast<float*>(y), n, s, f);
  else
    bcast2_kernel<<<blocks_for(n), kThreads>>>(static_cast<const double*>(a), static_cast<const double*>(b),
                                               static_cast<double*>(y), n, s, f);
  check_launch("broadcast2");
}

template <class F> void map3(DType t, const void* a, const void* b, const void* c, void* y, std::int64_t n, F f) {
  if (n == 0) return;
  if (t == DType::f32)
    map3_kernel<<<blocks_for(n), kThreads>>>(static_cast<const float*>(a), static_cast<const float*>(b),
                                             static_cast<const float*>(c), static_cast<float*>(y), n, f);
  else
    map3_kernel<<<blocks_for(n), kThreads>>>(static_cast<const double*>(a), static_cast<const double*>(b),
                                             static_cast<const double*>(c), static_cast<double*>(y), n, f);
  check_launch("map3");
}
template <class F>
void broadcast3(DType t, const void* a, const Shape& as, const void* b, const Shape& bs, const void* c, const Shape& cs,
                void* y, const Shape& ys, F f) {
  std::int64_t n = ys.numel();
  if (n == 0) return;
  if (as == ys && bs == ys && cs == ys) return map3(t, a, b, c, y, n, f);
  Bcast3 s{};
  s.rank = ys.rank();
  for (int d = 0; d < s.rank; ++d) s.dims[d] = ys[d];
  strides_for(as, ys, s.sa);
  strides_for(bs, ys, s.sb);
  strides_for(cs, ys, s.sc);
  if (t == DType::f32)
    bcast3_kernel<<<blocks_for(n), kThreads>>>(static_cast<const float*>(a), static_cast<const float*>(b),
                                               static_cast<const float*>(c), static_cast<float*>(y), n, s, f);
  else
    bcast3_kernel<<<blocks_for(n), kThreads>>>(static_cast<const double*>(a), static_cast<const double*>(b),
                                               static_cast<const double*>(c), static_cast<double*>(y), n, s, f);
  check_launch("broadcast3");
}

#define AD_INSTANTIATE_UNARY(F) template void map1<pw::F>(DType, const void*, void*, std::int64_t, pw::F);
#define AD_INSTANTIATE_BINARY(F)                                                                    \
  template void map2<pw::F>(DType, const void*, const void*, void*, std::int64_t, pw::F);          \
  template void broadcast2<pw::F>(DType, const void*, const Shape&, const void*, const Shape&, void*, \
                                  const Shape&, pw::F);
AD_PW_UNARY_LIST(AD_INSTANTIATE_UNARY)
#define AD_INSTANTIATE_TERNARY(F)                                                                   \
  template void map3<pw::F>(DType, const void*, const void*, const void*, void*, std::int64_t, pw::F); \
  template void broadcast3<pw::F>(DType, const void*, const Shape&, const void*, const Shape&, const void*, \
                                  const Shape&, void*, const Shape&, pw::F);
AD_PW_BINARY_LIST(AD_INSTANTIATE_BINARY)
AD_PW_TERNARY_LIST(AD_INSTANTIATE_TERNARY)

namespace {
__global__ void count_cast_overflows_kernel(DType from, const void* x, DType to, const void* y, std::int64_t n,
                                            unsigned long long* counter) {
  unsigned long long mine = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    mine += isfinite(detail::load_as_double(from, x, i)) && !isfinite(detail::load_as_double(to, y, i));
  if (mine) atomicAdd(counter, mine);  // (rare: most threads add nothing)
}
}  // namespace

void count_cast_overflows(DType from, const void* x, DType to, const void* y, std::int64_t n,
                          unsigned long long* counter) {
  if (n == 0) return;
  count_cast_overflows_kernel<<<blocks_for(n), kThreads>>>(from, x, to, y, n, counter);
  check_launch("count_cast_overflows");
}

void cast(DType from, DType to, const void* x, void* y, std::int64_t n) {
  if (n == 0) return;
  auto g = blocks_for(n);
  auto is16 = [](DType d) { return d == DType::f16 || d == DType::bf16; };
  if (from == to) {
    check_call(cudaMemcpyAsync(y, x, n * dtype_size(from), cudaMemcpyDeviceToDevice, 0), "cudaMemcpyAsync (cast)");
  } else if (from == DType::f32 && to == DType::f64) {
    cast_kernel<<<g, kThreads>>>(static_cast<const float*>(x), static_cast<double*>(y), n);
  } else if (from == DType::f64 && to == DType::f32) {
    cast_kernel<<<g, kThreads>>>(static_cast<const double*>(x), static_cast<float*>(y), n);
  } else if (from == DType::f32 && is16(to)) {
    to16_kernel<<<g, kThreads>>>(static_cast<const float*>(x), static_cast<std::uint16_t*>(y), n, to == DType::bf16);
  } else if (is16(from) && to == DType::f32) {
    from16_kernel<<<g, kThreads>>>(static_cast<const std::uint16_t*>(x), static_cast<float*>(y), n,
                                   from == DType::bf16);
  } else if (from == DType::f64 && is16(to)) {
    to16_from64_kernel<<<g, kThreads>>>(static_cast<const double*>(x), static_cast<std::uint16_t*>(y), n,
                                        to == DType::bf16);
  } else if (is16(from) && to == DType::f64) {
    from16_to64_kernel<<<g, kThreads>>>(static_cast<const std::uint16_t*>(x), static_cast<double*>(y), n,
                                        from == DType::bf16);
  } else {
    throw Error(std::string("cast: ") + dtype_name(from) + " -> " + dtype_name(to) +
                             " has no direct CUDA kernel; go through f32");
  }
  check_launch("cast");
}

void add_into(DType t, void* dst, const void* src, std::int64_t n) {
  if (n == 0) return;
  if (t == DType::f32)
    add_into_kernel<<<blocks_for(n), kThreads>>>(static_cast<float*>(dst), static_cast<const float*>(src), n);
  else
    add_into_kernel<<<blocks_for(n), kThreads>>>(static_cast<double*>(dst), static_cast<const double*>(src), n);
  check_launch("add_into");
}

void dropout(DType t, const void* x, void* y, std::int64_t n, std::uint64_t seed, std::uint64_t offset, float p,
             double scale) {
  if (n == 0) return;
  if (t == DType::f32)
    dropout_kernel<<<blocks_for(n), kThreads>>>(static_cast<const float*>(x), static_cast<float*>(y), n,
                                                rnd::Dropout<float>{seed, offset, p, static_cast<float>(scale)});
  else
    dropout_kernel<<<blocks_for(n), kThreads>>>(static_cast<const double*>(x), static_cast<double*>(y), n,
                                                rnd::Dropout<double>{seed, offset, p, scale});
  check_launch("dropout");
}

}  // namespace ad::cuda_k
