// libFuzzer target for the safetensors loader (configure with -DAD_FUZZ=ON
// and clang). Run: fuzz_safetensors -max_total_time=30 <work-dir> tests/fuzz/corpus
#include "fuzz_safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return ad_fuzz_safetensors(data, size);
}
