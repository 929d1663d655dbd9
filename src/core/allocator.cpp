#include "ad/allocator.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <mutex>

#include "ad/error.hpp"
#include "core/device.hpp"

namespace ad {

void* Allocator::allocate(std::size_t bytes, Device d) {
  void* p = device::allocate(d, bytes);
  auto b = static_cast<std::int64_t>(bytes);
  std::int64_t now = live_.fetch_add(b, std::memory_order_relaxed) + b;
  std::int64_t pk = peak_.load(std::memory_order_relaxed);
  while (now > pk && !peak_.compare_exchange_weak(pk, now, std::memory_order_relaxed)) {
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void Allocator::deallocate(void* p, std::size_t bytes, Device d) noexcept {
  device::deallocate(d, p, bytes);
  live_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
}

std::int64_t Allocator::reset_peak() {
  std::int64_t now = live_bytes();
  peak_.store(now, std::memory_order_relaxed);
  return now;
}

std::shared_ptr<Allocator> default_allocator(Device device) {
  // The host heap and each GPU's memory are process-wide; so are their counters.
  static const std::shared_ptr<Allocator> cpu = std::make_shared<Allocator>(Device::cpu());
  if (device.kind == DeviceKind::cpu) return cpu;
  constexpr int kMaxGpus = 64;
  if (device.index < 0 || device.index >= kMaxGpus)
    throw Error(fmt::format("default_allocator: no device cuda:{}", device.index));
  static std::shared_ptr<Allocator> gpus[kMaxGpus];
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  auto& a = gpus[device.index];
  if (!a) a = std::make_shared<Allocator>(device);
  return a;
}

}  // namespace ad
