#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "ad/dtype.hpp"

namespace ad {

// Allocates tensor memory and counts it to the byte. An allocator has a home
// device (where allocate(bytes) puts memory) but can place blocks on any
// device; a graph's allocator counts its values on every device together,
// which is what a plan's predicted peak describes.
// live_bytes() is the sum of the requested sizes of the blocks currently
// allocated; peak_bytes() the maximum live_bytes() reached since construction
// or the last reset_peak(). Counting uses requested sizes (not rounded-up
// sizes), so a planner's prediction from static shapes can be compared exactly.
// Thread-safe.
class Allocator {
 public:
  explicit Allocator(Device device = Device::cpu()) : device_(device) {}
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns 64-byte-aligned memory for `bytes` bytes (a zero-byte request
  // returns a valid, unique pointer). Throws ad::Error when out of memory.
  void* allocate(std::size_t bytes) { return allocate(bytes, device_); }
  void deallocate(void* p, std::size_t bytes) noexcept { deallocate(p, bytes, device_); }
  // On device `d` (CUDA memory comes from that device's caching allocator).
  // Throws ad::Error when the device is out of memory or unavailable.
  void* allocate(std::size_t bytes, Device d);
  void deallocate(void* p, std::size_t bytes, Device d) noexcept;

  Device device() const { return device_; }
  std::int64_t live_bytes() const { return live_.load(std::memory_order_relaxed); }
  std::int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  std::int64_t allocations() const { return count_.load(std::memory_order_relaxed); }
  // Sets the peak to the current live bytes and returns that value.
  std::int64_t reset_peak();

 private:
  Device device_;
  std::atomic<std::int64_t> live_{0}, peak_{0}, count_{0};
};

// The allocator used for tensors created outside a graph (user data,
// parameters and their gradients). A graph counts its own values with its own
// Allocator, so a step's peak is never mixed with the user's tensors, nor
// with another graph's running on another thread. There is one default
// allocator per device for the whole process: its live_bytes(), peak_bytes()
// and reset_peak() count every thread's tensors.
std::shared_ptr<Allocator> default_allocator(Device device = Device::cpu());

}  // namespace ad
