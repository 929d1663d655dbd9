#pragma once
// The CUDA side of the runtime: which GPUs there are and the per-device
// caching allocators' memory figures. Tensors move with Tensor::to(device);
// graphs built from CUDA tensors run their kernels on that GPU.
#include <cstdint>

#include "ad/dtype.hpp"

namespace ad::cuda {

// True when this build has the CUDA backend (CMake option AD_CUDA).
bool built();
// GPUs visible to this process; 0 without a driver or a GPU, or in a build
// without CUDA (never throws).
int device_count();
bool available();
// Throws ad::Error unless device `index` can be used, saying why: a build
// without CUDA, no driver or GPU (with the CUDA runtime's message), or an
// index out of range.
void require(int index = 0);

// Bytes on one device. live/peak count what tensors requested (exactly, so a
// plan's predicted peak can be compared); reserved is what the caching
// allocator holds from the driver (live + cached free blocks + rounding).
struct MemoryStats {
  std::int64_t live_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t reserved_bytes = 0;
  std::int64_t device_free_bytes = 0;   // the driver's free memory
  std::int64_t device_total_bytes = 0;
};
MemoryStats memory_stats(int index = 0);
// Returns every cached free block to the driver.
void empty_cache();
// Waits for all work queued on the device.
void synchronize(int index = 0);

}  // namespace ad::cuda
