#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ad/hd.hpp"

namespace ad {

// Element types. f32 and f64 are compute types; f16 and bf16 are storage
// types (convert with ad::cast before computing); i64 holds integer labels
// and indices (cross_entropy labels, gather indices).
enum class DType : std::uint8_t { f32, f64, f16, bf16, i64 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i64: return 8;
  }
  return 0;
}
constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
  }
  return "?";
}
constexpr bool is_compute_float(DType t) { return t == DType::f32 || t == DType::f64; }
constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<std::int64_t> { static constexpr DType value = DType::i64; };

enum class DeviceKind : std::uint8_t { cpu, cuda };

// Where a tensor lives. Device::cpu() or Device::cuda(i).
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  static constexpr Device cpu() { return {DeviceKind::cpu, 0}; }
  static constexpr Device cuda(int i) { return {DeviceKind::cuda, i}; }
  friend constexpr bool operator==(Device a, Device b) { return a.kind == b.kind && a.index == b.index; }
};

// ---- f16 / bf16 storage conversions (round to nearest even) ----
AD_HD std::uint32_t f32_bits(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; }
AD_HD float f32_from_bits(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

AD_HD std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
AD_HD float bf16_to_f32(std::uint16_t h) { return f32_from_bits(static_cast<std::uint32_t>(h) << 16); }

AD_HD std::uint16_t f32_to_f16(float f) {
  std::uint32_t u = f32_bits(f);
  std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (a < 0x38800000u) {  // subnormal f16 (or zero)
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);  // rounds to zero
    std::uint32_t mant = (a & 0x007fffffu) | 0x00800000u;
    int shift = 126 - static_cast<int>(a >> 23);  // 14..24
    std::uint32_t half = 1u << (shift - 1);
    std::uint32_t rounded = mant + half - 1 + ((mant >> shift) & 1u);
    return static_cast<std::uint16_t>(sign | (rounded >> shift));
  }
  std::uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // round mantissa to 10 bits
  return static_cast<std::uint16_t>(sign | ((r - 0x38000000u) >> 13));
}
AD_HD float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = (h & 0x8000u) << 16;  // h promotes to int, & 0x8000u makes it unsigned
  std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return f32_from_bits(sign);
    float v = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// f64 -> f32 rounded to odd: an inexact result is truncated toward zero and
// its last bit set. Rounding that f32 to f16 or bf16 (nearest even) then
// gives the f64's own nearest f16 / bf16: round to odd with at least two
// extra bits makes the second rounding exact, where f64 -> f32 -> f16 by
// nearest twice rounded ties the wrong way (1 + 2^-11 + 2^-40 to 1 in f16).
AD_HD float f64_to_f32_odd(double d) {
  const float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || d != d) return f;  // exact, or NaN
  std::uint32_t u = f32_bits(f);
  const double af = f < 0 ? -static_cast<double>(f) : static_cast<double>(f), ad = d < 0 ? -d : d;
  if (af > ad) u -= 1u;  // rounded away from zero (inf included): one step toward zero, same sign
  return f32_from_bits(u | 1u);
}
AD_HD std::uint16_t f64_to_f16(double d) { return f32_to_f16(f64_to_f32_odd(d)); }
AD_HD std::uint16_t f64_to_bf16(double d) { return f32_to_bf16(f64_to_f32_odd(d)); }

}  // namespace ad
