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
// Cached blocks of one pool (device memory of one GPU, or pinned host
// memory). A block that an asynchronous copy still uses when it is freed
// waits in `pending` until the copy's event completes (busy: block -> that
// event). The pool's mutex is held around every call.
struct Blocks {
  struct Pending {
    std::size_t size;
    void* ptr;
    cudaEvent_t done;
  };
  std::multimap<std::size_t, void*> free_blocks;        // size -> block
  std::unordered_map<void*, std::size_t> live_blocks;   // block -> size
  std::unordered_map<void*, cudaEvent_t> busy;
  std::vector<Pending> pending;

  // Pending blocks whose copies completed go back to the free list; with
  // `wait`, every pending block does (after waiting for its copy).
  void reclaim(bool wait) {
    auto keep = pending.begin();
    for (auto& b : pending) {
      cudaError_t e = wait ? cudaEventSynchronize(b.done) : cudaEventQuery(b.done);
      if (e == cudaErrorNotReady) {
        *keep++ = b;
        continue;
      }
      if (e != cudaSuccess) cudaGetLastError();  // a failed copy: the block is not used any more either
      cudaEventDestroy(b.done);
      free_blocks.emplace(b.size, b.ptr);
    }
    pending.erase(keep, pending.end());
  }
  // The smallest cached block of at least `size` bytes and at most twice
  // that (size is set to the block's), or nullptr.
  void* take(std::size_t& size) {
    if (!pending.empty()) reclaim(false);
    auto it = free_blocks.lower_bound(size);
    if (it == free_blocks.end() || it->first > 2 * size) return nullptr;
    size = it->first;
    void* ptr = it->second;
    free_blocks.erase(it);
    return ptr;
  }
  // A live block back to the cache (pending while a copy uses it); false if
  // ptr is not a live block.
  bool give_back(void* ptr) {
    auto it = live_blocks.find(ptr);
    if (it == live_blocks.end()) return false;
    if (auto b = busy.find(ptr); b != busy.end()) {
      pending.push_back({it->second, ptr, b->second});
      busy.erase(b);
    } else {
      free_blocks.emplace(it->second, ptr);
    }
    live_blocks.erase(it);
    return true;
  }
  // Marks a live block as used by queued work until `ev` completes
  // (replacing an earlier mark: work on one stream completes in order).
  // Returns false (and leaves ev to the caller) when ptr is not the start of
  // a live block.
  bool mark_busy(void* ptr, cudaEvent_t ev) {
    if (!live_blocks.count(ptr)) return false;
    auto [it, fresh] = busy.try_emplace(ptr, ev);
    if (!fresh) {
      cudaEventDestroy(it->second);
      it->second = ev;
    }
    return true;
  }
};

struct Pool : Blocks {
  std::mutex m;
  std::int64_t live = 0, peak = 0, reserved = 0;
};

constexpr int kMaxDevices = 64;
Pool& pool(int dev) {
  static Pool pools[kMaxDevices];
  return pools[dev];
}

std::size_t round_block(std::size_t bytes) { return std::max<std::size_t>(512, (bytes + 511) / 512 * 512); }

void release_cached(int dev, Pool& p) {  // p.m held
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(dev);
  p.reclaim(true);
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

namespace cuda_rt {
void empty_host_cache() noexcept;  // below, with the pinned host pool
}

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
  cuda_rt::empty_host_cache();
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
  void* ptr = p.take(size);
  if (!ptr) {
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
  // a block may still be read by queued kernels: they run on the device's
  // default stream in order, so reusing it for later work is safe; a copy
  // on the copy stream is not ordered with that work, so a block it still
  // uses waits for its event
  if (!p.give_back(ptr)) return;
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

namespace {
// ---- host offload ----
cudaStream_t copy_stream(int dev) {  // device `dev` current
  static std::mutex m;
  static cudaStream_t streams[kMaxDevices] = {};
  std::lock_guard<std::mutex> lock(m);
  if (!streams[dev]) AD_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[dev], cudaStreamNonBlocking));
  return streams[dev];
}
cudaEvent_t record_on(cudaStream_t s) {
  cudaEvent_t e = nullptr;
  AD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t r = cudaEventRecord(e, s);
  if (r != cudaSuccess) {
    cudaEventDestroy(e);
    AD_CUDA_CHECK(r);
  }
  return e;
}
// Pinned host blocks, cached like device blocks (without a size rounding:
// offloaded values are few and large).
struct HostPool : Blocks {
  std::mutex m;
};
HostPool& host_pool() {
  static HostPool p;
  return p;
}
// Marks both ends of a queued copy busy until it completes (each with its
// own event, recorded right after the copy on the copy stream); an end that
// is not the start of a block of its pool makes the host wait for the copy.
void mark_copy(int dev, cudaStream_t cs, void* dev_ptr, void* host_ptr) {
  bool ok = true;
  {
    Pool& p = pool(dev);
    cudaEvent_t e = record_on(cs);
    std::lock_guard<std::mutex> lock(p.m);
    if (!p.mark_busy(dev_ptr, e)) {
      cudaEventDestroy(e);
      ok = false;
    }
  }
  {
    HostPool& h = host_pool();
    cudaEvent_t e = record_on(cs);
    std::lock_guard<std::mutex> lock(h.m);
    if (!h.mark_busy(host_ptr, e)) {
      cudaEventDestroy(e);
      ok = false;
    }
  }
  if (!ok) AD_CUDA_CHECK(cudaStreamSynchronize(cs));
}
void* copy_async(int dev, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  cuda::require(dev);
  DeviceGuard g(dev);
  cudaStream_t cs = copy_stream(dev);
  // after everything queued so far on the compute stream: the source was
  // written there, and a recycled destination block may still be read there
  cudaEvent_t ready = record_on(nullptr);
  cudaError_t e = cudaStreamWaitEvent(cs, ready, 0);
  cudaEventDestroy(ready);
  AD_CUDA_CHECK(e);
  if (bytes > 0) AD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cs));
  bool to_host = kind == cudaMemcpyDeviceToHost;
  try {
    mark_copy(dev, cs, to_host ? const_cast<void*>(src) : dst, to_host ? dst : const_cast<void*>(src));
    return record_on(cs);
  } catch (...) {  // the copy is queued but its blocks may not be marked busy: let it finish first
    cudaStreamSynchronize(cs);
    throw;
  }
}
}  // namespace

void* host_alloc(std::size_t bytes) {
  HostPool& p = host_pool();
  std::size_t size = std::max<std::size_t>(bytes, 64);
  std::lock_guard<std::mutex> lock(p.m);
  void* ptr = p.take(size);
  if (!ptr) {
    cudaError_t e = cudaMallocHost(&ptr, size);
    if (e != cudaSuccess) {  // return the cached blocks and retry once
      cudaGetLastError();
      p.reclaim(true);
      for (auto& [sz, q] : p.free_blocks) cudaFreeHost(q);
      p.free_blocks.clear();
      e = cudaMallocHost(&ptr, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(fmt::format("CUDA: cannot allocate {} bytes of pinned host memory for offload ({})", bytes,
                              cudaGetErrorString(e)));
    }
  }
  p.live_blocks[ptr] = size;
  return ptr;
}

void host_free(void* ptr) noexcept {
  HostPool& p = host_pool();
  std::lock_guard<std::mutex> lock(p.m);
  p.give_back(ptr);
}

void empty_host_cache() noexcept {
  HostPool& p = host_pool();
  std::lock_guard<std::mutex> lock(p.m);
  p.reclaim(true);
  for (auto& [sz, q] : p.free_blocks) cudaFreeHost(q);
  p.free_blocks.clear();
}

void copy_to_host_async(int dev, void* dst, const void* src, std::size_t bytes) {
  cudaEventDestroy(static_cast<cudaEvent_t>(copy_async(dev, dst, src, bytes, cudaMemcpyDeviceToHost)));
}
void* copy_to_device_async(int dev, void* dst, const void* src, std::size_t bytes) {
  return copy_async(dev, dst, src, bytes, cudaMemcpyHostToDevice);
}

void wait_and_release(int dev, void* event) {
  auto e = static_cast<cudaEvent_t>(event);
  DeviceGuard g(dev);
  cudaError_t r = cudaStreamWaitEvent(nullptr, e, 0);
  cudaEventDestroy(e);
  AD_CUDA_CHECK(r);
}

void count_cast_overflows(const Tensor& from, const Tensor& to, void* counter) {
  DeviceGuard g(to.device().index);
  cuda_k::count_cast_overflows(from.dtype(), from.raw(), to.dtype(), to.raw(), to.numel(),
                               static_cast<unsigned long long*>(counter));
}
int enter_device(int dev) {
  int prev = 0;
  AD_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != dev) AD_CUDA_CHECK(cudaSetDevice(dev));
  return prev;
}
void leave_device(int prev) noexcept { cudaSetDevice(prev); }

void add_into(Tensor& dst, const Tensor& src) {
  if (!dst.is_cuda() || src.device() != dst.device())
    throw Error(fmt::format("accumulate: gradient on {} but its buffer on {}", device::name(src.device()),
                            device::name(dst.device())));
  DeviceGuard g(dst.device().index);
  cuda_k::add_into(dst.dtype(), dst.raw(), src.raw(), dst.numel());
}

}  // namespace cuda_rt
}  // namespace ad
