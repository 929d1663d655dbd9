// The CUDA runtime side: a caching allocator per device that counts what
// tensors requested separately from what it reserves, copies between host
// and devices, and the public ad::cuda functions.
#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ad/cuda.hpp"
#include "ad/tensor.hpp"
#include "core/device.hpp"
#include "cuda/check.hpp"
#include "cuda/launch.hpp"

namespace ad {

namespace {

// Blocks are rounded to 512 B and kept after free in a size-ordered pool; a
// request takes the smallest cached block that fits and is at most twice its
// size (so a small tensor never pins a huge block). On cudaMalloc failure the
// pool is returned to the driver and the allocation retried once.
struct Pool {
  std::mutex m;
  std::multimap<std::size_t, void*> free_blocks;        // size -> block
  std::unordered_map<void*, std::size_t> live_blocks;   // block -> size
  std::int64_t live = 0, peak = 0, reserved = 0;
};

constexpr int kMaxDevices = 64;
Pool& pool(int dev) {
  static Pool pools[kMaxDevices];
  return pools[dev];
}

std::size_t round_block(std::size_t bytes) { return std::max<std::size_t>(512, (bytes + 511) / 512 * 512); }

void release_cached(int dev, Pool& p) {  // p.m held
  if (p.free_blocks.empty()) return;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(dev);
  for (auto& [size, ptr] : p.free_blocks) {
    cudaFree(ptr);
    p.reserved -= static_cast<std::int64_t>(size);
  }
  p.free_blocks.clear();
  cudaSetDevice(prev);
}

struct DeviceGuard {
  int prev = 0;
  explicit DeviceGuard(int dev) {
    AD_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != dev) AD_CUDA_CHECK(cudaSetDevice(dev));
  }
  ~DeviceGuard() { cudaSetDevice(prev); }
};

}  // namespace

namespace cuda {

bool built() { return true; }
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}
bool available() { return device_count() > 0; }
void require(int index) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(fmt::format("CUDA: no usable GPU: {} ({})", cudaGetErrorString(e), cudaGetErrorName(e)));
  }
  if (index < 0 || index >= n)
    throw Error(fmt::format("CUDA: device cuda:{} does not exist ({} GPU{} visible)", index, n, n == 1 ? "" : "s"));
}
MemoryStats memory_stats(int index) {
  require(index);
  MemoryStats s;
  {
    Pool& p = pool(index);
    std::lock_guard<std::mutex> lock(p.m);
    s.live_bytes = p.live;
    s.peak_bytes = p.peak;
    s.reserved_bytes = p.reserved;
  }
  DeviceGuard g(index);
  std::size_t f = 0, t = 0;
  AD_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  s.device_free_bytes = static_cast<std::int64_t>(f);
  s.device_total_bytes = static_cast<std::int64_t>(t);
  return s;
}
void empty_cache() {
  int n = device_count();
  for (int d = 0; d < n && d < kMaxDevices; ++d) {
    Pool& p = pool(d);
    std::lock_guard<std::mutex> lock(p.m);
    release_cached(d, p);
  }
}
void synchronize(int index) {
  require(index);
  DeviceGuard g(index);
  AD_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace cuda

namespace cuda_rt {

void* allocate(int dev, std::size_t bytes) {
  if (dev < 0 || dev >= kMaxDevices) cuda::require(dev);
  Pool& p = pool(dev);
  std::size_t size = round_block(bytes);
  std::lock_guard<std::mutex> lock(p.m);
  void* ptr = nullptr;
  auto it = p.free_blocks.lower_bound(size);
  if (it != p.free_blocks.end() && it->first <= 2 * size) {
    size = it->first;
    ptr = it->second;
    p.free_blocks.erase(it);
  } else {
    cuda::require(dev);
    DeviceGuard g(dev);
    cudaError_t e = cudaMalloc(&ptr, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached(dev, p);
      e = cudaMalloc(&ptr, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::size_t f = 0, t = 0;
      cudaMemGetInfo(&f, &t);
      throw Error(fmt::format("CUDA: out of memory on cuda:{}: {} bytes requested, {} free of {}, {} reserved by ad's "
                              "caching allocator ({} live) — after emptying the cache once ({})",
                              dev, bytes, f, t, p.reserved, p.live, cudaGetErrorString(e)));
    }
    p.reserved += static_cast<std::int64_t>(size);
  }
  p.live_blocks[ptr] = size;
  p.live += static_cast<std::int64_t>(bytes);
  p.peak = std::max(p.peak, p.live);
  return ptr;
}

void deallocate(int dev, void* ptr, std::size_t bytes) noexcept {
  if (dev < 0 || dev >= kMaxDevices) return;
  Pool& p = pool(dev);
  std::lock_guard<std::mutex> lock(p.m);
  auto it = p.live_blocks.find(ptr);
  if (it == p.live_blocks.end()) return;
  // a block may still be read by queued kernels: they run on the device's
  // default stream in order, so reusing it for later work is safe
  p.free_blocks.emplace(it->second, ptr);
  p.live_blocks.erase(it);
  p.live -= static_cast<std::int64_t>(bytes);
}

void copy(void* dst, int dd, const void* src, int sd, std::size_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = dd < 0 ? cudaMemcpyDeviceToHost : (sd < 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  if (dd >= 0 && sd >= 0 && dd != sd) {
    AD_CUDA_CHECK(cudaMemcpyPeer(dst, dd, src, sd, bytes));
    return;
  }
  DeviceGuard g(dd >= 0 ? dd : sd);
  AD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
}

void memset(int dev, void* p, int value, std::size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard g(dev);
  AD_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, 0));
}

void add_into(Tensor& dst, const Tensor& src) {
  if (!dst.is_cuda() || src.device() != dst.device())
    throw Error(fmt::format("accumulate: gradient on {} but its buffer on {}", device::name(src.device()),
                            device::name(dst.device())));
  DeviceGuard g(dst.device().index);
  cuda_k::add_into(dst.dtype(), dst.raw(), src.raw(), dst.numel());
}

}  // namespace cuda_rt
}  // namespace ad
