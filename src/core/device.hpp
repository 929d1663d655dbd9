#pragma once
// Internal: raw memory on any device. The CPU parts live in device.cpp; the
// CUDA parts in src/cuda/runtime.cpp (or stubs that throw in a build
// without CUDA).
#include <cstddef>
#include <cstdint>
#include <string>

#include "ad/dtype.hpp"

namespace ad {
class Tensor;
}

namespace ad::device {

void* allocate(Device d, std::size_t bytes);
void deallocate(Device d, void* p, std::size_t bytes) noexcept;
// Copies bytes between any two devices (synchronous with respect to the host).
void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes);
void memset(Device d, void* p, int value, std::size_t bytes);
std::string name(Device d);  // "cpu", "cuda:0"

// While alive, a GPU `d` is the calling thread's current device (nothing for
// the CPU): kernels launch, and cuBLAS and the runtime act, on the current
// device, which is not the tensor's unless set.
class On {
 public:
  explicit On(Device d);
  ~On();
  On(const On&) = delete;
  On& operator=(const On&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace ad::device

namespace ad::cuda_rt {
// Implemented by src/cuda/runtime.cpp, or by the stubs in device.cpp.
void* allocate(int dev, std::size_t bytes);
void deallocate(int dev, void* p, std::size_t bytes) noexcept;
void copy(void* dst, int dst_dev, const void* src, int src_dev, std::size_t bytes);  // -1: host
void memset(int dev, void* p, int value, std::size_t bytes);
// dst += src elementwise (same shape and float dtype, both on one GPU).
void add_into(Tensor& dst, const Tensor& src);
// Counts, on the device, the elements finite in `from` but not in `to` (its
// conversion to a narrower dtype, same shape, one GPU), into `counter`: 8
// bytes on that GPU, zeroed (cuda_rt::allocate + memset) and owned by the
// caller, so graphs running at once on one GPU never share a count; read it
// with copy (which waits for the device).
void count_cast_overflows(const Tensor& from, const Tensor& to, void* counter);
// Makes `dev` the calling thread's current GPU; returns the previous one for
// leave_device. Kernels and cuBLAS run on the current GPU.
int enter_device(int dev);
void leave_device(int prev) noexcept;

// ---- host offload (the executor's Offload / Prefetch steps) ----
// Kernels run on the device's compute stream (the default stream); copies
// for offload run on a second, non-blocking copy stream per device, created
// on first use. Events are opaque handles.
// Pinned host memory (cached: freed blocks are reused, each only once the
// copies queued on it have completed).
void* host_alloc(std::size_t bytes);
void host_free(void* p) noexcept;
// Queues dst (pinned host) <- src (device `dev`), or dst (device) <- src
// (pinned host), on the copy stream, after all work queued so far on the
// compute stream. Both blocks are marked busy until the copy completes:
// freeing either defers its reuse. Copies on the copy stream run in order,
// so a value's prefetch always follows its offload. copy_to_device_async
// returns an event that completes with the copy (for wait_and_release).
void copy_to_host_async(int dev, void* dst, const void* src, std::size_t bytes);
void* copy_to_device_async(int dev, void* dst, const void* src, std::size_t bytes);
// The compute stream waits (on the device, not the host) for `event`, which
// is then released.
void wait_and_release(int dev, void* event);
}  // namespace ad::cuda_rt
