#include "io/json.hpp"

#include <fmt/format.h>

#include <unordered_set>

#include "ad/error.hpp"

namespace ad::json {

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::null: return "null";
    case Value::Kind::boolean: return "a boolean";
    case Value::Kind::number: return "a number";
    case Value::Kind::string: return "a string";
    case Value::Kind::array: return "an array";
    case Value::Kind::object: return "an object";
  }
  return "?";
}

namespace {

// Length of the UTF-8 sequence starting at s[i] if valid, else 0.
std::size_t utf8_len(std::string_view s, std::size_t i) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  std::size_t n = s.size() - i;
  auto cont = [&](std::size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return n >= 2 && cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (n < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (n < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xF0 && b(i + 1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  Parser(std::string_view s, const std::string& what, int max_depth) : s_(s), what_(what), max_depth_(max_depth) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("unexpected data after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { fail_at(msg, i_); }
  [[noreturn]] void fail_at(const std::string& msg, std::size_t at) const {
    throw Error(fmt::format("{}: {} at byte {}", what_, msg, at));
  }
  bool eof() const { return i_ >= s_.size(); }
  char peek() const { return s_[i_]; }
  void skip_ws() {
    while (!eof() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++i_;
  }
  void expect(char c, const char* where) {
    if (eof()) fail(fmt::format("unexpected end of the document, expected '{}' {}", c, where));
    if (peek() != c) fail(fmt::format("expected '{}' {}", c, where));
    ++i_;
  }
  void literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) fail("invalid literal");
    i_ += word.size();
  }

  Value value(int depth) {
    if (depth > max_depth_) fail(fmt::format("nesting deeper than {}", max_depth_));
    if (eof()) fail("unexpected end of the document, expected a value");
    Value v;
    v.pos = i_;
    char c = peek();
    if (c == '{') {
      v.kind = Value::Kind::object;
      ++i_;
      skip_ws();
      if (!eof() && peek() == '}') { ++i_; return v; }
      std::unordered_set<std::string> keys;  // a header may hold a million tensors: no scan per key
      for (;;) {
        skip_ws();
        if (eof() || peek() != '"') fail(eof() ? "unexpected end of the document in an object" : "expected a string key");
        std::size_t key_pos = i_;
        std::string key = string();
        if (!keys.insert(key).second) fail_at(fmt::format("duplicate key {}", quote(key)), key_pos);
        skip_ws();
        expect(':', "after an object key");
        skip_ws();
        v.members.push_back(Member{std::move(key), value(depth + 1)});
        skip_ws();
        if (eof()) fail("unexpected end of the document in an object");
        if (peek() == ',') { ++i_; continue; }
        expect('}', "or ',' in an object");
        return v;
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::array;
      ++i_;
      skip_ws();
      if (!eof() && peek() == ']') { ++i_; return v; }
      for (;;) {
        skip_ws();
        v.items.push_back(value(depth + 1));
        skip_ws();
        if (eof()) fail("unexpected end of the document in an array");
        if (peek() == ',') { ++i_; continue; }
        expect(']', "or ',' in an array");
        return v;
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::string;
      v.text = string();
      return v;
    }
    if (c == 't') { literal("true"); v.kind = Value::Kind::boolean; v.boolean = true; return v; }
    if (c == 'f') { literal("false"); v.kind = Value::Kind::boolean; return v; }
    if (c == 'n') { literal("null"); return v; }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Value::Kind::number;
      v.text = number();
      return v;
    }
    fail(fmt::format("unexpected character 0x{:02x}", static_cast<unsigned char>(c)));
  }

  std::string number() {
    std::size_t start = i_;
    auto digits = [&] {
      std::size_t d = i_;
      while (!eof() && peek() >= '0' && peek() <= '9') ++i_;
      return i_ - d;
    };
    if (peek() == '-') ++i_;
    if (eof()) fail("unexpected end of the document in a number");
    if (peek() == '0') {
      ++i_;
    } else if (digits() == 0) {
      fail("invalid number");
    }
    if (!eof() && peek() == '.') {
      ++i_;
      if (digits() == 0) fail("invalid number: no digits after '.'");
    }
    if (!eof() && (peek() == 'e' || peek() == 'E')) {
      ++i_;
      if (!eof() && (peek() == '+' || peek() == '-')) ++i_;
      if (digits() == 0) fail("invalid number: no digits in the exponent");
    }
    return std::string(s_.substr(start, i_ - start));
  }

  std::uint32_t hex4() {
    if (s_.size() - i_ < 4) fail("unexpected end of the document in a \\u escape");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
      else fail("invalid hex digit in a \\u escape");
    }
    return v;
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    for (;;) {
      if (eof()) fail("unexpected end of the document in a string");
      auto c = static_cast<unsigned char>(peek());
      if (c == '"') { ++i_; return out; }
      if (c < 0x20) fail("unescaped control character in a string");
      if (c == '\\') {
        ++i_;
        if (eof()) fail("unexpected end of the document in an escape");
        char e = s_[i_++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            std::uint32_t cp = hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate in a \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (s_.substr(i_, 2) != "\\u") fail("unpaired high surrogate in a \\u escape");
              i_ += 2;
              std::uint32_t lo = hex4();
              if (lo < 0xDC00 || lo > 0xDFFF) fail("invalid low surrogate in a \\u escape");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            append_utf8(out, cp);
            break;
          }
          default: fail("invalid escape in a string");
        }
        continue;
      }
      std::size_t n = utf8_len(s_, i_);
      if (n == 0) fail("invalid UTF-8 in a string");
      out.append(s_.substr(i_, n));
      i_ += n;
    }
  }

  std::string_view s_;
  const std::string& what_;
  int max_depth_;
  std::size_t i_ = 0;
};

}  // namespace

Value parse(std::string_view text, const std::string& what, int max_depth) {
  return Parser(text, what, max_depth).document();
}

bool to_u64(const Value& v, std::uint64_t& out) {
  if (v.kind != Value::Kind::number || v.text.empty()) return false;
  std::uint64_t r = 0;
  for (char c : v.text) {
    if (c < '0' || c > '9') return false;
    auto d = static_cast<std::uint64_t>(c - '0');
    if (r > (UINT64_MAX - d) / 10) return false;
    r = r * 10 + d;
  }
  out = r;
  return true;
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {  // a UTF-8 sequence as it is; a byte of none (only in error messages: names are checked) as \xNN
      std::size_t n = utf8_len(s, i);
      if (n == 0) {
        out += fmt::format("\\x{:02x}", c);
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20) out += fmt::format("\\u{:04x}", c);
    else out += static_cast<char>(c);
    ++i;
  }
  return out + "\"";
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = utf8_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace ad::json
