#pragma once
// Load-time dispatch for hot loops (GCC target_clones): a marked function is
// compiled once per listed target plus the baseline x86-64, and the CPU
// picks one when the program loads. Everything the function calls inline is
// compiled into each clone; a call that is not inlined runs the baseline
// code (slower, still correct). Off for clang (the sanitizer builds), nvcc,
// sanitizers (an instrumented resolver runs before ThreadSanitizer starts:
// a crash at load) and with AD_NO_TARGET_CLONES; the default build has no
// -march.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && !defined(AD_NO_TARGET_CLONES)
#define AD_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#else
#define AD_TARGET_CLONES(...)
#endif

// Elementwise loops: AVX2 without FMA, so each element sees the same IEEE
// operations in the same order and both versions give the same bits —
// results never depend on the CPU.
#define AD_VEC AD_TARGET_CLONES("avx2", "default")

namespace ad {
// The CPU has AVX-512 (F and VL, as the x86-64-v4 clone requires; clang 14
// knows no "x86-64-v4" here): 64-byte vectors live in registers. Without it
// GCC lowers a 64-byte vector extension type to two 256-bit halves through
// the stack, several times slower than code written with 32-byte vectors,
// so kernels whose state is a 64-byte vector pick the width by this check
// (inside each clone; the same lanes either way).
inline bool wide_vectors() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return wide;
#else
  return false;
#endif
}
}  // namespace ad
