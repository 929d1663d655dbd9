// CUDA kernels of the ops along one axis: one thread per row, running the
// row functors of ops/rows.hpp that the CPU kernels run too.
#include <cuda_runtime.h>

#include <vector>

#include "cuda/launch.hpp"
#include "cuda/util.cuh"

namespace ad::cuda_k {

namespace {
constexpr int kThreads = 128;
template <class F> __global__ void rows_kernel(F f, std::int64_t outer, std::int64_t len, std::int64_t inner) {
  std::int64_t n = outer * inner;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t o = r / inner, i = r % inner;
    f(o * len * inner + i, inner, r);
  }
}
template <class F> void launch(F f, RowGeom g) {
  std::int64_t n = g.outer * g.inner;
  if (n == 0) return;
  std::int64_t b = (n + kThreads - 1) / kThreads;
  rows_kernel<<<static_cast<unsigned>(b < 65535L * 16 ? b : 65535L * 16), kThreads>>>(f, g.outer, g.len, g.inner);
  check_launch("rows");
}
template <class T> void run(RowGeom g, rows::Op op, const std::vector<const void*>& in, void* out) {
  auto c = [&](std::size_t i) { return static_cast<const T*>(in.at(i)); };
  T* y = static_cast<T*>(out);
  switch (op) {
    case rows::Op::logsumexp: return launch(rows::Logsumexp<T>{c(0), y, g.len}, g);
    case rows::Op::logsumexp_backward: return launch(rows::LogsumexpBackward<T>{c(0), c(1), c(2), y, g.len}, g);
    case rows::Op::softmax: return launch(rows::Softmax<T>{c(0), y, g.len}, g);
    case rows::Op::softmax_backward: return launch(rows::SoftmaxBackward<T>{c(0), c(1), y, g.len}, g);
    case rows::Op::log_softmax: return launch(rows::LogSoftmax<T>{c(0), y, g.len}, g);
    case rows::Op::log_softmax_backward: return launch(rows::LogSoftmaxBackward<T>{c(0), c(1), y, g.len}, g);
  }
}
}  // namespace

void for_rows(DType t, RowGeom g, rows::Op op, std::initializer_list<const void*> in, void* out) {
  std::vector<const void*> v(in);
  if (t == DType::f32) run<float>(g, op, v, out);
  else run<double>(g, op, v, out);
}

}  // namespace ad::cuda_k
