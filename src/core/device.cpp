// Raw memory on any device: the host heap here, CUDA through cuda_rt.
#include "core/device.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "ad/cuda.hpp"
#include "ad/error.hpp"

namespace ad::device {

std::string name(Device d) {
  return d.kind == DeviceKind::cpu ? std::string("cpu") : fmt::format("cuda:{}", d.index);
}

On::On(Device d) {
  if (d.kind != DeviceKind::cuda) return;
  const int prev = cuda_rt::enter_device(d.index);
  if (prev != d.index) prev_ = prev;
}
On::~On() {
  if (prev_ >= 0) cuda_rt::leave_device(prev_);
}

void* allocate(Device d, std::size_t bytes) {
  if (d.kind == DeviceKind::cuda) return cuda_rt::allocate(d.index, bytes);
  // 64-byte alignment for vector loads; aligned_alloc needs a multiple of it.
  std::size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(fmt::format("out of host memory allocating {} bytes", bytes));
  return p;
}

void deallocate(Device d, void* p, std::size_t bytes) noexcept {
  if (d.kind == DeviceKind::cuda) cuda_rt::deallocate(d.index, p, bytes);
  else std::free(p);
}

void copy(void* dst, Device dd, const void* src, Device sd, std::size_t bytes) {
  if (bytes == 0) return;
  if (dd.kind == DeviceKind::cpu && sd.kind == DeviceKind::cpu) {
    std::memmove(dst, src, bytes);
    return;
  }
  cuda_rt::copy(dst, dd.kind == DeviceKind::cpu ? -1 : dd.index, src, sd.kind == DeviceKind::cpu ? -1 : sd.index,
                bytes);
}

void memset(Device d, void* p, int value, std::size_t bytes) {
  if (bytes == 0) return;
  if (d.kind == DeviceKind::cuda) cuda_rt::memset(d.index, p, value, bytes);
  else std::memset(p, value, bytes);
}

}  // namespace ad::device

#if !AD_HAVE_CUDA
// ---- a build without CUDA: every CUDA request is a clear error ----
namespace ad::cuda_rt {
namespace {
[[noreturn]] void no_cuda() {
  throw Error("CUDA: this build of ad has no CUDA backend (configure with -DAD_CUDA=ON on a machine with the CUDA "
              "toolkit)");
}
}  // namespace
void* allocate(int, std::size_t) { no_cuda(); }
void deallocate(int, void*, std::size_t) noexcept {}
void copy(void*, int, const void*, int, std::size_t) { no_cuda(); }
void memset(int, void*, int, std::size_t) { no_cuda(); }
void add_into(Tensor&, const Tensor&) { no_cuda(); }
void count_cast_overflows(const Tensor&, const Tensor&, void*) { no_cuda(); }
int enter_device(int) { no_cuda(); }
void leave_device(int) noexcept {}
void* host_alloc(std::size_t) { no_cuda(); }
void host_free(void*) noexcept {}
void copy_to_host_async(int, void*, const void*, std::size_t) { no_cuda(); }
void* copy_to_device_async(int, void*, const void*, std::size_t) { no_cuda(); }
void wait_and_release(int, void*) { no_cuda(); }
}  // namespace ad::cuda_rt

namespace ad::cuda {
bool built() { return false; }
int device_count() { return 0; }
bool available() { return false; }
void require(int) { cuda_rt::allocate(0, 0); }
MemoryStats memory_stats(int) { return {}; }
void empty_cache() {}
void synchronize(int) {}
}  // namespace ad::cuda
#endif
