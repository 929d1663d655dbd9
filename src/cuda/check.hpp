#pragma once
// Internal: every CUDA runtime and cuBLAS call goes through these checks,
// which throw ad::Error with the call, file, line and the library's message.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "ad/error.hpp"

#define AD_CUDA_CHECK(call)                                                                                    \
  do {                                                                                                         \
    cudaError_t err_ = (call);                                                                                 \
    if (err_ != cudaSuccess) {                                                                                 \
      (void)cudaGetLastError(); /* not reported again by the next launch's check */                           \
      throw ::ad::Error(fmt::format("CUDA: {} failed at {}:{}: {} ({})", #call, __FILE__, __LINE__,            \
                                    cudaGetErrorString(err_), cudaGetErrorName(err_)));                        \
    }                                                                                                          \
  } while (0)

#define AD_CUBLAS_CHECK(call)                                                                                  \
  do {                                                                                                         \
    cublasStatus_t st_ = (call);                                                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                          \
      throw ::ad::Error(fmt::format("cuBLAS: {} failed at {}:{}: {}", #call, __FILE__, __LINE__,               \
                                    cublasGetStatusString(st_)));                                              \
  } while (0)

// After a kernel launch: launch-configuration errors surface here.
#define AD_CUDA_LAUNCH_CHECK() AD_CUDA_CHECK(cudaGetLastError())
