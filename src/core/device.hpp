#pragma once
// Internal: raw memory on any device. The CPU parts live in device.cpp; the
// CUDA parts in src/cuda/runtime.cpp (or stubs that throw in a build
// without CUDA).
#include <cstddef>
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

}  // namespace ad::device

namespace ad::cuda_rt {
// Implemented by src/cuda/runtime.cpp, or by the stubs in device.cpp.
void* allocate(int dev, std::size_t bytes);
void deallocate(int dev, void* p, std::size_t bytes) noexcept;
void copy(void* dst, int dst_dev, const void* src, int src_dev, std::size_t bytes);  // -1: host
void memset(int dev, void* p, int value, std::size_t bytes);
// dst += src elementwise (same shape and float dtype, both on one GPU).
void add_into(Tensor& dst, const Tensor& src);
}  // namespace ad::cuda_rt
