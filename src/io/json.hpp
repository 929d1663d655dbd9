#pragma once
// A small strict JSON parser (RFC 8259) for file headers: UTF-8 validated,
// duplicate object keys rejected, nesting depth bounded, numbers kept as
// their literal text. Errors are ad::Error("<what>: ... at byte N").
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ad::json {

struct Member;

struct Value {
  enum class Kind : std::uint8_t { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  std::string text;                                    // string value, or a number's literal
  std::vector<Value> items;                            // array
  std::vector<Member> members;                         // object, in document order
  std::size_t pos = 0;                                 // byte offset where the value starts
};
struct Member {
  std::string first;  // key
  Value second;
};

const char* kind_name(Value::Kind k);

// Parses `text` as one JSON value followed only by whitespace. `what` names
// the document in error messages. Throws ad::Error on any violation.
Value parse(std::string_view text, const std::string& what, int max_depth = 64);

// The value of a number literal that is a non-negative integer (no sign,
// fraction or exponent) fitting in 64 bits; false otherwise.
bool to_u64(const Value& v, std::uint64_t& out);

// `s` as a JSON string literal (quotes added; ", \ and control characters
// escaped; other bytes copied, so `s` must be valid UTF-8).
std::string quote(std::string_view s);

// True when `s` is valid UTF-8 (no overlong forms, surrogates or code points
// past U+10FFFF).
bool valid_utf8(std::string_view s);

}  // namespace ad::json
