// CUDA kernels of the shape ops: permute, copies of blocks along an axis
// (slice, slice_backward, concat, part_backward), gather and its adjoint, and
// the index check that turns an out-of-range index into an ad::Error on the
// host. The copies move raw words of the element's size, so any dtype works.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "core/device.hpp"
#include "cuda/launch.hpp"
#include "cuda/util.cuh"

namespace ad::cuda_k {

namespace {
constexpr int kThreads = 256;

// f(W{}) with W the unsigned word of es bytes
template <class F> void by_size(std::size_t es, const char* what, F f) {
  switch (es) {
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    case 8: return f(std::uint64_t{});
    default: break;
  }
  throw Error(std::string(what) + ": no CUDA kernel for elements of " + std::to_string(es) + " bytes");
}

// ---- permute ----
struct Perm {
  int rank;
  std::int64_t dims[kMaxRank];  // output dims
  std::int64_t st[kMaxRank];    // x's element stride along each output dim
};
// y[i] = x[sum_d c_d st_d] with (c_d) the row-major coordinates of i in y
template <class W> __global__ void permute_kernel(const W* x, W* y, std::int64_t n, Perm p) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rem = i, off = 0;
    for (int d = p.rank - 1; d >= 0; --d) {
      off += (rem % p.dims[d]) * p.st[d];
      rem /= p.dims[d];
    }
    y[i] = x[off];
  }
}

// ---- copy along an axis ----
// element e of the (outer, n, inner) block: e = (o * n + j) * inner + i
template <class W>
__global__ void copy_axis_kernel(const W* src, std::int64_t src_len, std::int64_t src_at, W* dst, std::int64_t dst_len,
                                 std::int64_t dst_at, std::int64_t n, std::int64_t inner, std::int64_t total) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t i = e % inner, t = e / inner;
    std::int64_t j = t % n, o = t / n;
    dst[(o * dst_len + dst_at + j) * inner + i] = src[(o * src_len + src_at + j) * inner + i];
  }
}

// ---- index check ----
// *first = min over bad positions (starts at ULLONG_MAX: none)
__global__ void bad_index_kernel(const std::int64_t* idx, std::int64_t n, std::int64_t len, unsigned long long* first) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t v = idx[i];
    if (v < 0 || v >= len) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

// ---- gather ----
// y[(o * ni + j) * inner + i] = x[(o * len + index[j]) * inner + i]
template <class W>
__global__ void gather_kernel(const W* x, std::int64_t len, std::int64_t inner, const std::int64_t* index,
                              std::int64_t ni, W* y, std::int64_t total) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t i = e % inner, t = e / inner;
    std::int64_t j = t % ni, o = t / ni;
    std::int64_t v = index[j];
    // indices were checked on the host; the guard only keeps a bad one from reading out of bounds
    y[e] = (v >= 0 && v < len) ? x[(o * len + v) * inner + i] : W(0);
  }
}
// One block per row (o, v) of dx. The block walks the index in chunks of
// kThreads positions; in each chunk it lists the positions j with index[j] = v
// in increasing order (warp ballots, then warp counts in shared memory), and
// every thread adds those dy rows into its own columns of the dx row. Each
// dx element is written by one thread only, adding dy rows in increasing j
// from 0: the CPU's order, so the same bits, and no atomics.
template <class T>
__global__ void gather_backward_kernel(const T* dy, std::int64_t len, std::int64_t inner, const std::int64_t* index,
                                       std::int64_t ni, T* dx, std::int64_t rows) {
  __shared__ std::int64_t hits[kThreads];
  __shared__ int warp_hits[kThreads / 32];
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, warp = t >> 5;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    std::int64_t o = row / len, v = row % len;
    T* out = dx + row * inner;
    for (std::int64_t i = t; i < inner; i += kThreads) out[i] = T(0);
    for (std::int64_t j0 = 0; j0 < ni; j0 += kThreads) {
      std::int64_t j = j0 + t;
      bool hit = j < ni && index[j] == v;
      unsigned ballot = __ballot_sync(0xffffffffu, hit);
      if (lane == 0) warp_hits[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, count = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        before += w < warp ? warp_hits[w] : 0;
        count += warp_hits[w];
      }
      if (hit) hits[before + __popc(ballot & ((1u << lane) - 1u))] = j;
      __syncthreads();
      for (int h = 0; h < count; ++h) {
        const T* g = dy + (o * ni + hits[h]) * inner;
        for (std::int64_t i = t; i < inner; i += kThreads) out[i] += g[i];
      }
      __syncthreads();  // hits and warp_hits are rewritten by the next chunk
    }
  }
}
}  // namespace

void permute(std::size_t es, const void* x, const Shape& xs, const Shape& perm, void* y, const Shape& ys) {
  std::int64_t n = ys.numel();
  if (n == 0) return;
  Perm p{};
  p.rank = ys.rank();
  std::int64_t xst[kMaxRank], acc = 1;
  for (int d = xs.rank() - 1; d >= 0; --d) {
    xst[d] = acc;
    acc *= xs[d];
  }
  for (int d = 0; d < p.rank; ++d) {
    p.dims[d] = ys[d];
    p.st[d] = xst[perm[d]];
  }
  by_size(es, "permute", [&](auto w) {
    using W = decltype(w);
    permute_kernel<<<grid_for(n, kThreads), kThreads>>>(static_cast<const W*>(x), static_cast<W*>(y), n, p);
  });
  check_launch("permute");
}

void copy_axis(std::size_t es, const void* src, std::int64_t src_len, std::int64_t src_at, void* dst,
               std::int64_t dst_len, std::int64_t dst_at, std::int64_t outer, std::int64_t n, std::int64_t inner) {
  std::int64_t total = outer * n * inner;
  if (total == 0) return;
  by_size(es, "copy_axis", [&](auto w) {
    using W = decltype(w);
    copy_axis_kernel<<<grid_for(total, kThreads), kThreads>>>(static_cast<const W*>(src), src_len, src_at,
                                                             static_cast<W*>(dst), dst_len, dst_at, n, inner, total);
  });
  check_launch("copy_axis");
}

void zero(void* p, std::size_t bytes) {
  if (bytes) check_call(cudaMemsetAsync(p, 0, bytes, 0), "cudaMemsetAsync");
}

std::int64_t first_bad_index(const std::int64_t* index, std::int64_t n, std::int64_t len, std::int64_t* value) {
  if (n == 0) return -1;
  Flag first;  // ULLONG_MAX: none
  bad_index_kernel<<<grid_for(n, kThreads), kThreads>>>(index, n, len, first.p);
  check_launch("index check");
  const unsigned long long at = first.get();  // the default stream orders the copy after the kernel
  if (at == ULLONG_MAX) return -1;
  check_call(cudaMemcpy(value, index + at, sizeof(std::int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy (bad index)");
  return static_cast<std::int64_t>(at);
}

void gather(std::size_t es, const void* x, std::int64_t outer, std::int64_t len, std::int64_t inner,
            const std::int64_t* index, std::int64_t ni, void* y) {
  std::int64_t total = outer * ni * inner;
  if (total == 0) return;
  by_size(es, "gather", [&](auto w) {
    using W = decltype(w);
    gather_kernel<<<grid_for(total, kThreads), kThreads>>>(static_cast<const W*>(x), len, inner, index, ni,
                                                          static_cast<W*>(y), total);
  });
  check_launch("gather");
}

void gather_backward(DType t, const void* dy, std::int64_t outer, std::int64_t len, std::int64_t inner,
                     const std::int64_t* index, std::int64_t ni, void* dx) {
  std::int64_t rows = outer * len;
  if (rows == 0 || inner == 0) return;
  auto blocks = static_cast<unsigned>(rows < 65535L * 16 ? rows : 65535L * 16);
  if (t == DType::f32)
    gather_backward_kernel<<<blocks, kThreads>>>(static_cast<const float*>(dy), len, inner, index, ni,
                                                 static_cast<float*>(dx), rows);
  else
    gather_backward_kernel<<<blocks, kThreads>>>(static_cast<const double*>(dy), len, inner, index, ni,
                                                 static_cast<double*>(dx), rows);
  check_launch("gather_backward");
}

}  // namespace ad::cuda_k
