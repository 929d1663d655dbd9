#pragma once
#include <cmath>
#include <cstdint>

#include "ad/hd.hpp"

namespace ad {

// ---- Philox-4x32-10 counter-based generator (Salmon et al., SC'11) ----
// The i-th random number of a stream depends only on (seed, i): re-running a
// node with the same seed and offset draws the same numbers, on CPU and GPU.
struct Philox4 { std::uint32_t v[4]; };

AD_HD Philox4 philox4x32_10(std::uint64_t counter, std::uint64_t seed) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = 0, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// The i-th 32-bit draw of stream `seed`: lane i%4 of block i/4.
AD_HD std::uint32_t philox_u32(std::uint64_t seed, std::uint64_t i) {
  return philox4x32_10(i >> 2, seed).v[i & 3];
}
// Uniform in (0, 1] with 24 random bits (exactly representable in f32).
AD_HD float uniform01(std::uint32_t u) { return static_cast<float>((u >> 8) + 1u) * (1.0f / 16777216.0f); }
// Uniform in (0, 1] with 53 random bits from two draws.
AD_HD double uniform01_f64(std::uint32_t a, std::uint32_t b) {
  std::uint64_t m = (static_cast<std::uint64_t>(a) << 21) ^ (b >> 11);
  return static_cast<double>((m & ((1ull << 53) - 1)) + 1) * (1.0 / 9007199254740992.0);
}

// A seeded stream of random numbers. reserve(n) hands out n consecutive
// counters and returns the first, so each consumer (a fill, a dropout node)
// gets its own non-overlapping range and results never depend on order of
// execution — only on order of construction. Not synchronised: give each
// thread (a data loader, say) its own Rng.
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) : seed_(seed) {}
  std::uint64_t seed() const { return seed_; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t reserve(std::uint64_t n) { std::uint64_t o = offset_; offset_ += n; return o; }

 private:
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

}  // namespace ad
