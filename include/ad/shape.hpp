#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ad/error.hpp"

namespace ad {

inline constexpr int kMaxRank = 8;

// A tensor shape: up to kMaxRank dimensions stored inline (no allocation).
// Also used for lists of axes. Throws ad::Error past kMaxRank.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) { for (auto d : dims) push_back(d); }
  explicit Shape(const std::vector<std::int64_t>& dims) { for (auto d : dims) push_back(d); }

  int rank() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  std::int64_t operator[](int i) const { return d_[static_cast<std::size_t>(i)]; }
  std::int64_t& operator[](int i) { return d_[static_cast<std::size_t>(i)]; }
  std::int64_t back() const { return d_[static_cast<std::size_t>(rank_ - 1)]; }
  const std::int64_t* begin() const { return d_.data(); }
  const std::int64_t* end() const { return d_.data() + rank_; }
  void push_back(std::int64_t d) {
    if (rank_ >= kMaxRank) throw Error("Shape: rank exceeds the maximum of " + std::to_string(kMaxRank));
    d_[static_cast<std::size_t>(rank_++)] = d;
  }
  void pop_back() { --rank_; }
  // The product of the dimensions; INT64_MAX where it does not fit in 64 bits
  // (no shape has that many elements of 2 or more bytes: every builder of
  // tensors and nodes rejects it by its byte count, fits_bytes below).
  std::int64_t numel() const {
    std::int64_t n = 1;
    bool over = false;
    for (int i = 0; i < rank_; ++i) {
      std::int64_t d = d_[static_cast<std::size_t>(i)];
      if (d == 0) return 0;
      over |= __builtin_mul_overflow(n, d, &n);
    }
    return over ? INT64_MAX : n;
  }
  // numel() elements of `elem_bytes` each fit in a 64-bit byte count.
  bool fits_bytes(std::int64_t elem_bytes) const {
    std::int64_t b;
    return !__builtin_mul_overflow(numel(), elem_bytes, &b);
  }
  std::vector<std::int64_t> vec() const { return {begin(), end()}; }
  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i) if (a[i] != b[i]) return false;
    return true;
  }
  // "[2,3,4]"
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) { if (i) s += ','; s += std::to_string(d_[static_cast<std::size_t>(i)]); }
    return s + "]";
  }

 private:
  std::array<std::int64_t, kMaxRank> d_{};
  int rank_ = 0;
};

}  // namespace ad
