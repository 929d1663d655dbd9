#pragma once
// The fuzz entry point for the safetensors loader, shared by the libFuzzer
// target (fuzz_safetensors.cpp, built with -DAD_FUZZ=ON) and the corpus
// replay test (tests/nn_safetensors.cpp), so CI runs the same code on the
// seed corpus without libFuzzer.
//
// Any input must either parse or throw ad::Error. What parses must serialise
// again and parse back to the same tensors (bit for bit) and metadata;
// anything else aborts, which the fuzzer reports as a crash.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ad/safetensors.hpp"

inline int ad_fuzz_safetensors(const std::uint8_t* data, std::size_t size) {
  ad::SafeTensors st;
  try {
    st = ad::parse_safetensors(data, size);
  } catch (const ad::Error&) {
    return 0;
  }
  std::vector<std::uint8_t> again;
  try {
    again = ad::serialize_safetensors(st.tensors, st.metadata);
  } catch (const ad::Error&) {
    return 0;  // readable but not writable (an empty tensor name)
  }
  ad::SafeTensors back = ad::parse_safetensors(again.data(), again.size());
  if (back.tensors.size() != st.tensors.size() || back.metadata != st.metadata) std::abort();
  for (const auto& nt : st.tensors) {
    const ad::Tensor* t = back.find(nt.first);
    if (!t || !ad::bitwise_equal(*t, nt.second)) std::abort();
  }
  return 0;
}
