// Numbers on the benchmarks' command lines, checked as the examples check
// theirs (examples/common/args.hpp): the whole argument as a decimal whole
// number in range, else a usage error naming the flag ("--reps takes a whole
// number >= 1, got 'abc'") on stderr and exit status 2. A benchmark that
// read "--r abc" as 0 measured something nobody asked for.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../examples/common/args.hpp"

namespace bench_cli {

// The value after flag argv[i] (i moves past it) as a whole number from lo to hi.
inline std::int64_t whole(int argc, char** argv, int& i, std::int64_t lo, std::int64_t hi = INT64_MAX) {
  const std::string flag = argv[i];
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", flag.c_str());
    std::exit(2);
  }
  try {
    return args::flag_whole(flag, argv[++i], lo, hi);
  } catch (const ad::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(2);
  }
}

// The same for an int-sized value.
inline int whole_int(int argc, char** argv, int& i, int lo, int hi = INT32_MAX) {
  return static_cast<int>(whole(argc, argv, i, lo, hi));
}

}  // namespace bench_cli
