// Reductions on the GPU: sum (sum, mean, sum_to) and max with its backward.
// Sums accumulate in f64 in an order fixed by the shapes (deterministic):
// the layouts of ops/sum_layout.hpp ([O][R][I]: contiguous runs a block per
// output, strided columns a thread per output, both cut into P parts into
// f64 partials when there are few outputs), else one block per output whose
// threads cover the reduced elements. Max: one block per output, combined in
// shared memory in a fixed tree order.
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/launch.hpp"
#include "cuda/util.cuh"
#include "ops/sum_layout.hpp"

namespace ad::cuda_k {

namespace {
constexpr int kThreads = 256;
struct Geom {
  int rank;
  std::int64_t keep[kMaxRank];  // output dims (1 where reduced)
  std::int64_t red[kMaxRank];   // reduced dims (1 where kept)
  std::int64_t stride[kMaxRank];
  std::int64_t nred;
};
// offset in x of element 0 of output o's group
__device__ std::int64_t base_offset(const Geom& g, std::int64_t o) {
  std::int64_t base = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    base += (o % g.keep[d]) * g.stride[d];
    o /= g.keep[d];
  }
  return base;
}
// offset of the group's r-th element from its element 0 (increasing in r)
__device__ std::int64_t red_offset(const Geom& g, std::int64_t r) {
  std::int64_t off = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    off += (r % g.red[d]) * g.stride[d];
    r /= g.red[d];
  }
  return off;
}
template <class T> __global__ void reduce_kernel(const T* x, T* y, std::int64_t nout, Geom g, double scale) {
  __shared__ double part[kThreads];
  for (std::int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
    std::int64_t base = base_offset(g, o);
    double acc = 0;
    for (std::int64_t r = threadIdx.x; r < g.nred; r += blockDim.x) acc += static_cast<double>(x[base + red_offset(g, r)]);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
      if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) y[o] = static_cast<T>(part[0] * scale);
    __syncthreads();
  }
}

// block sum of each thread's v into sh[0] (fixed tree order); sh has kThreads
__device__ double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();  // sh is reused
  return r;
}
// [O][R] (I == 1): block (o, p) sums x[o R + r] over r in part p of P; P == 1
// writes y[o] = scale * sum, else part[o P + p] = sum
template <class T>
__global__ void sum_runs_kernel(const T* x, T* y, double* part, std::int64_t O, std::int64_t R, std::int64_t P,
                                double scale) {
  __shared__ double sh[kThreads];
  for (std::int64_t bp = blockIdx.x; bp < O * P; bp += gridDim.x) {
    const std::int64_t o = bp / P, p = bp % P, r0 = R * p / P, r1 = R * (p + 1) / P;
    const T* xo = x + o * R;
    double a0 = 0, a1 = 0;  // two chains: two loads in flight per thread
    std::int64_t r = r0 + threadIdx.x;
    for (; r + kThreads < r1; r += 2 * kThreads) {
      a0 += static_cast<double>(xo[r]);
      a1 += static_cast<double>(xo[r + kThreads]);
    }
    if (r < r1) a0 += static_cast<double>(xo[r]);
    const double v = block_sum(a0 + a1, sh);
    if (threadIdx.x == 0) {
      if (P == 1) y[o] = static_cast<T>(v * scale);
      else part[o * P + p] = v;
    }
  }
}
// [O][R][I] with I > 1: thread (o, p, i) sums x[(o R + r) I + i] over r in
// part p (neighbouring threads read neighbouring i); P == 1 writes y
template <class T>
__global__ void sum_cols_kernel(const T* x, T* y, double* part, std::int64_t O, std::int64_t R, std::int64_t I,
                                std::int64_t P, double scale) {
  const std::int64_t total = O * P * I;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t % I, p = (t / I) % P, o = t / (I * P), r0 = R * p / P, r1 = R * (p + 1) / P;
    const T* xp = x + o * R * I + i;
    double acc = 0;
    for (std::int64_t r = r0; r < r1; ++r) acc += static_cast<double>(xp[r * I]);
    if (P == 1) y[o * I + i] = static_cast<T>(acc * scale);
    else part[(o * P + p) * I + i] = acc;
  }
}
// the P partials of output (o, i), part[(o P + p) I + i], added by one block in
// a fixed tree order: y[o I + i] = scale * sum
template <class T>
__global__ void sum_parts_kernel(const double* part, T* y, std::int64_t O, std::int64_t I, std::int64_t P,
                                 double scale) {
  __shared__ double sh[kThreads];
  for (std::int64_t q = blockIdx.x; q < O * I; q += gridDim.x) {
    const std::int64_t o = q / I, i = q % I;
    double acc = 0;
    for (std::int64_t p = threadIdx.x; p < P; p += kThreads) acc += part[(o * P + p) * I + i];
    const double v = block_sum(acc, sh);
    if (threadIdx.x == 0) y[q] = static_cast<T>(v * scale);
  }
}

// The CPU's max step (ops/reduce.cpp): a NaN replaces the running value, so
// does a larger one; ties keep the earlier element.
__device__ double max_step(double a, double v) { return (v > a || v != v) ? v : a; }

// Scanning left to right with max_step gives the same result as scanning two
// consecutive runs and combining their results with max_step (run 1 first):
// the last NaN, else the first maximal element. So each thread scans one
// contiguous run of the reduced elements and the runs are combined neighbour
// by neighbour, keeping the order; the result equals the CPU's sequential scan.
template <class T> __global__ void max_kernel(const T* x, T* y, std::int64_t nout, Geom g) {
  __shared__ double part[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t chunk = (g.nred + kThreads - 1) / kThreads;
  for (std::int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
    std::int64_t base = base_offset(g, o);
    std::int64_t r0 = t * chunk, r1 = r0 + chunk < g.nred ? r0 + chunk : g.nred;
    double acc = -INFINITY;
    for (std::int64_t r = r0; r < r1; ++r) acc = max_step(acc, static_cast<double>(x[base + red_offset(g, r)]));
    part[t] = acc;
    __syncthreads();
    // after the step with width w, part[t] (t a multiple of 2w) covers runs t .. t + 2w - 1
    for (int w = 1; w < kThreads; w *= 2) {
      if (t % (2 * w) == 0) part[t] = max_step(part[t], part[t + w]);
      __syncthreads();
    }
    if (t == 0) y[o] = static_cast<T>(part[0]);
    __syncthreads();
  }
}
// dx = dy[o] at the lowest reduced index r whose element equals the group's
// maximum (or is NaN when the group has a NaN), 0 at the group's other
// elements. The maximum is found again here from x (ops/reduce.cpp says why);
// its value does not depend on the order of the steps (only which NaN or
// which of 0 and -0, which compare alike), and the lowest index is a min over
// the threads' first hits.
template <class T>
__global__ void max_backward_kernel(const T* x, const T* dy, T* dx, std::int64_t nout, Geom g) {
  __shared__ std::int64_t first[kThreads];
  __shared__ double part[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  for (std::int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
    std::int64_t base = base_offset(g, o);
    double acc = -INFINITY;
    for (std::int64_t r = t; r < g.nred; r += kThreads) acc = max_step(acc, static_cast<double>(x[base + red_offset(g, r)]));
    part[t] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
      if (t < w) part[t] = max_step(part[t], part[t + w]);
      __syncthreads();
    }
    const double yo = part[0];
    const bool nan = yo != yo;
    std::int64_t mine = g.nred;  // none
    for (std::int64_t r = t; r < g.nred; r += kThreads) {
      const auto v = static_cast<double>(x[base + red_offset(g, r)]);
      if (v == yo || (nan && v != v)) {
        mine = r;  // r grows: the first hit of this thread is its lowest
        break;
      }
    }
    first[t] = mine;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
      if (t < w && first[t + w] < first[t]) first[t] = first[t + w];
      __syncthreads();
    }
    std::int64_t hit = first[0];
    T go = dy[o];
    for (std::int64_t r = t; r < g.nred; r += kThreads) dx[base + red_offset(g, r)] = r == hit ? go : T(0);
    __syncthreads();  // first[] and part[] are rewritten for the next output
  }
}

Geom make_geom(const Shape& xs, const Shape& keep) {
  Geom g{};
  g.rank = xs.rank();
  g.nred = 1;
  std::int64_t acc = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    g.stride[d] = acc;
    acc *= xs[d];
    bool reduced = keep[d] == 1 && xs[d] != 1;
    g.keep[d] = reduced ? 1 : xs[d];
    g.red[d] = reduced ? xs[d] : 1;
    g.nred *= g.red[d];
  }
  return g;
}
// one block per output (the kernels loop over the rest)
unsigned blocks_for(std::int64_t nout) { return static_cast<unsigned>(nout < 65535L * 16 ? nout : 65535L * 16); }
}  // namespace

namespace {
template <class T>
void reduce_sum_t(const T* x, const Shape& xs, const Shape& keep, T* y, double scale, void* ws) {
  const std::int64_t nout = keep.numel();
  const sumlayout::Layout L = sumlayout::layout(xs, keep);
  if (L.general) {
    reduce_kernel<<<blocks_for(nout), kThreads>>>(x, y, nout, make_geom(xs, keep), scale);
    return;
  }
  auto* part = static_cast<double*>(ws);
  if (L.P > 1 && !part) throw Error("reduce_sum: no workspace for the partial sums (bad plan)");
  if (L.I == 1) sum_runs_kernel<<<blocks_for(L.O * L.P), kThreads>>>(x, y, part, L.O, L.R, L.P, scale);
  else sum_cols_kernel<<<grid_for(L.O * L.P * L.I, kThreads), kThreads>>>(x, y, part, L.O, L.R, L.I, L.P, scale);
  if (L.P > 1) {
    check_launch("reduce_sum (parts)");
    sum_parts_kernel<<<blocks_for(L.O * L.I), kThreads>>>(part, y, L.O, L.I, L.P, scale);
  }
}
}  // namespace

void reduce_sum(DType t, const void* x, const Shape& xs, const Shape& keep, void* y, double scale, void* ws) {
  if (keep.numel() == 0) return;
  if (t == DType::f32)
    reduce_sum_t(static_cast<const float*>(x), xs, keep, static_cast<float*>(y), scale, ws);
  else
    reduce_sum_t(static_cast<const double*>(x), xs, keep, static_cast<double*>(y), scale, ws);
  check_launch("reduce_sum");
}

void reduce_max(DType t, const void* x, const Shape& xs, const Shape& keep, void* y) {
  std::int64_t nout = keep.numel();
  if (nout == 0) return;
  Geom g = make_geom(xs, keep);
  if (t == DType::f32)
    max_kernel<<<blocks_for(nout), kThreads>>>(static_cast<const float*>(x), static_cast<float*>(y), nout, g);
  else
    max_kernel<<<blocks_for(nout), kThreads>>>(static_cast<const double*>(x), static_cast<double*>(y), nout, g);
  check_launch("max");
}

void max_backward(DType t, const void* x, const Shape& xs, const Shape& keep, const void* dy, void* dx) {
  std::int64_t nout = keep.numel();
  if (nout == 0) return;
  Geom g = make_geom(xs, keep);
  if (t == DType::f32)
    max_backward_kernel<<<blocks_for(nout), kThreads>>>(static_cast<const float*>(x), static_cast<const float*>(dy),
                                                        static_cast<float*>(dx), nout, g);
  else
    max_backward_kernel<<<blocks_for(nout), kThreads>>>(static_cast<const double*>(x), static_cast<const double*>(dy),
                                                        static_cast<double*>(dx), nout, g);
  check_launch("max_backward");
}

}  // namespace ad::cuda_k
