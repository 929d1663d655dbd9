#pragma once
// Load-time dispatch for hot loops (GCC target_clones): a marked function is
// compiled once per listed target plus the baseline x86-64, and the CPU
// picks one when the program loads. Everything the function calls inline is
// compiled into each clone; a call that is not inlined runs the baseline
// code (slower, still correct). Off for clang (the sanitizer builds), nvcc,
// sanitizers and with AD_NO_TARGET_CLONES; the default build has no -march.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(AD_NO_TARGET_CLONES)
#define AD_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#else
#define AD_TARGET_CLONES(...)
#endif

// Elementwise loops: AVX2 without FMA, so each element sees the same IEEE
// operations in the same order and both versions give the same bits —
// results never depend on the CPU.
#define AD_VEC AD_TARGET_CLONES("avx2", "default")
