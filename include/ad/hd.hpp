#pragma once
// AD_HD marks math shared by the CPU kernels and the CUDA kernels, so the CPU
// tests exercise the very code the GPU runs.
#if defined(__CUDACC__)
#define AD_HD __host__ __device__ __forceinline__
#else
#define AD_HD inline
#endif
