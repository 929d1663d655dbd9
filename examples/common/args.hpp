// Numbers on the examples' command lines: the whole argument as a decimal
// whole number in range, or an ad::Error that names the flag and what it
// takes ("--steps takes a whole number >= 1, got 'abc'"). The examples print
// the message and exit with status 2, as for any usage error. And the
// examples' last resort for an exception that reaches main (report_error).
#pragma once

#include <ad/ad.hpp>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

namespace args {

// `v`, all of it, as a whole number from lo to hi; false if it is not one
// (empty, other characters, leading space, out of range or of 64 bits).
inline bool whole(const std::string& v, std::int64_t lo, std::int64_t hi, std::int64_t& out) {
  if (v.empty() || std::isspace(static_cast<unsigned char>(v[0]))) return false;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (*end || errno || n < lo || n > hi) return false;
  out = n;
  return true;
}

// `v`, all of it, as a whole number >= 0 of up to 64 bits; false if not.
inline bool whole_u64(const std::string& v, std::uint64_t& out) {
  if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0]))) return false;  // strtoull takes "-1"
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (*end || errno) return false;
  out = n;
  return true;
}

// The value `v` of flag `flag` as a whole number from lo to hi, else ad::Error.
inline std::int64_t flag_whole(const std::string& flag, const std::string& v, std::int64_t lo,
                               std::int64_t hi = INT64_MAX) {
  std::int64_t n = 0;
  if (whole(v, lo, hi, n)) return n;
  if (hi == INT64_MAX) throw ad::Error(fmt::format("{} takes a whole number >= {}, got '{}'", flag, lo, v));
  throw ad::Error(fmt::format("{} takes a whole number from {} to {}, got '{}'", flag, lo, hi, v));
}

// The value `v` of flag `flag` (a seed) as a whole number >= 0 of up to 64 bits, else ad::Error.
inline std::uint64_t flag_seed(const std::string& flag, const std::string& v) {
  std::uint64_t n = 0;
  if (whole_u64(v, n)) return n;
  throw ad::Error(fmt::format("{} takes a whole number from 0 to {}, got '{}'", flag, UINT64_MAX, v));
}

// "error: ..." on stderr for an exception that reached main (ad::Error, out
// of host memory, anything else: never an abort); returns exit status 1.
inline int report_error(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) std::fprintf(stderr, "error: out of host memory\n");
  else std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}

}  // namespace args
