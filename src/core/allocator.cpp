#include "ad/allocator.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <mutex>

#include "ad/error.hpp"

namespace ad {

void* Allocator::allocate(std::size_t bytes) {
  if (device_.kind != DeviceKind::cpu)
    throw Error(fmt::format("Allocator: device kind {} is not available in this build",
                            static_cast<int>(device_.kind)));
  // 64-byte alignment for vector loads; aligned_alloc needs a multiple of it.
  std::size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(fmt::format("Allocator: out of host memory allocating {} bytes ({} live)", bytes, live_bytes()));
  auto b = static_cast<std::int64_t>(bytes);
  std::int64_t now = live_.fetch_add(b, std::memory_order_relaxed) + b;
  std::int64_t pk = peak_.load(std::memory_order_relaxed);
  while (now > pk && !peak_.compare_exchange_weak(pk, now, std::memory_order_relaxed)) {
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void Allocator::deallocate(void* p, std::size_t bytes) noexcept {
  std::free(p);
  live_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
}

std::int64_t Allocator::reset_peak() {
  std::int64_t now = live_bytes();
  peak_.store(now, std::memory_order_relaxed);
  return now;
}

std::shared_ptr<Allocator> default_allocator(Device device) {
  if (device.kind != DeviceKind::cpu) throw Error("default_allocator: only the CPU device is available in this build");
  // The host heap is process-wide; so is its counter.
  static const std::shared_ptr<Allocator> cpu = std::make_shared<Allocator>(Device::cpu());
  return cpu;
}

}  // namespace ad
