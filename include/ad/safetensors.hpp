#pragma once
// safetensors files of named tensors (https://github.com/huggingface/safetensors):
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   UTF-8 JSON: {"<name>": {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}
//             (may end with spaces, used as padding)
//   the rest  the tensors' bytes, little-endian, row-major; offsets count
//             from the first byte after the header.
// dtypes: F32, F64, F16, BF16, I64 (ad's DTypes).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ad/tensor.hpp"

namespace ad {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// The largest header a loader accepts (as the reference implementation).
inline constexpr std::uint64_t kSafetensorsMaxHeader = 100'000'000;

struct SafeTensors {
  NamedTensors tensors;  // in the header's order
  Metadata metadata;     // "__metadata__", empty if absent
  // The tensor called `name`, or nullptr.
  const Tensor* find(const std::string& name) const;
  // The tensor called `name`; throws ad::Error if there is none.
  const Tensor& at(const std::string& name) const;
};

// The bytes of a safetensors file holding `tensors` (in data order: dtype
// size descending, then the given order) and `metadata`. Throws ad::Error for
// an empty or repeated name, the reserved name "__metadata__", names or
// metadata that are not valid UTF-8, or a tensor that is undefined or not on
// the CPU.
std::vector<std::uint8_t> serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata = {});

// Writes serialize_safetensors(...) to `path` atomically: to a new temporary
// file in the same directory, flushed to disk (fsync), then renamed over
// `path`. If anything fails, `path` is untouched (an existing file keeps its
// old contents), the temporary file is removed, and ad::Error names the
// path and the system's reason. Where `path` is a symbolic link, the file it
// leads to is replaced (the link stays); a replaced file keeps its
// permission bits.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

// Parses a safetensors file held in memory. Every field is validated against
// the buffer's size: header length (<= kSafetensorsMaxHeader and within the
// buffer), strict JSON (UTF-8, no duplicate keys), known dtype, shape of
// non-negative integers (rank <= kMaxRank), data_offsets [begin, end] with
// end - begin = numel x dtype size (overflow-checked), tensors covering the
// data section exactly, without overlap or gaps, metadata values strings.
// Throws ad::Error saying what is wrong; never reads out of bounds.
SafeTensors parse_safetensors(const void* data, std::size_t size);

// Reads and validates a file as parse_safetensors does; the header is read
// and checked against the file's size before any tensor is allocated.
// Throws ad::Error naming the path.
SafeTensors load_safetensors(const std::string& path);

}  // namespace ad
