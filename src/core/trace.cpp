// Trace: events recorded by the executor, written as Chrome trace-event JSON.
#include "ad/trace.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "ad/error.hpp"

namespace ad {

namespace {
const char* kind_name(TraceEvent::Kind k) {
  switch (k) {
    case TraceEvent::Kind::compute: return "compute";
    case TraceEvent::Kind::recompute: return "recompute";
    case TraceEvent::Kind::accumulate: return "accumulate";
    case TraceEvent::Kind::compress: return "compress";
    case TraceEvent::Kind::decompress: return "decompress";
    case TraceEvent::Kind::offload: return "offload";
    case TraceEvent::Kind::prefetch: return "prefetch";
    case TraceEvent::Kind::alloc: return "alloc";
    case TraceEvent::Kind::free: return "free";
    case TraceEvent::Kind::evict: return "evict";
    case TraceEvent::Kind::live: return "live";
  }
  return "?";
}
bool is_span(TraceEvent::Kind k) { return k <= TraceEvent::Kind::prefetch; }

// JSON string body: quotes, backslashes and control characters escaped.
void append_escaped(std::string& out, const std::string& s) {
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
}
}  // namespace

Trace::Trace() : t0_(std::chrono::steady_clock::now()) {}

void Trace::clear() {
  events_.clear();
  runs_ = 0;
  t0_ = std::chrono::steady_clock::now();
}

double Trace::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
}

// pid 1 is the process; each run is its own thread track (tid = run + 1) so
// successive steps stack up as separate rows; the live-bytes counter is
// process-wide.
std::string Trace::json() const {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"ad executor\"}}";
  for (std::int32_t r = 0; r < runs_; ++r)
    out += fmt::format(",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"name\":\"run {}\"}}}}",
                       r + 1, r);
  for (const TraceEvent& e : events_) {
    out += ",\n{\"name\":\"";
    if (e.kind == TraceEvent::Kind::live) {
      out += "live bytes\",\"ph\":\"C\"";
      out += fmt::format(",\"ts\":{:.3f},\"pid\":1,\"tid\":{},\"args\":{{\"bytes\":{}}}}}", e.ts_us, e.run + 1, e.bytes);
      continue;
    }
    append_escaped(out, e.name.empty() ? kind_name(e.kind) : e.name);
    out += fmt::format("\",\"cat\":\"{}\"", kind_name(e.kind));
    if (is_span(e.kind))
      out += fmt::format(",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f}", e.ts_us, e.dur_us);
    else
      out += fmt::format(",\"ph\":\"i\",\"s\":\"t\",\"ts\":{:.3f}", e.ts_us);
    out += fmt::format(",\"pid\":1,\"tid\":{},\"args\":{{\"node\":{},\"bytes\":{}", e.run + 1, e.node, e.bytes);
    if (!e.shape.empty()) {
      out += ",\"value\":\"";
      append_escaped(out, e.shape);
      out += '"';
    }
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

void Trace::save(const std::string& path) const {
  std::string text = json();
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), std::fclose);
  if (!f) throw Error(fmt::format("Trace::save: cannot open '{}' for writing", path));
  if (std::fwrite(text.data(), 1, text.size(), f.get()) != text.size() || std::fflush(f.get()) != 0)
    throw Error(fmt::format("Trace::save: writing '{}' failed", path));
}

}  // namespace ad
