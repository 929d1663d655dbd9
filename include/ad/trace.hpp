#pragma once
// Recording what the executor does, as a Chrome trace-event file that
// Perfetto (ui.perfetto.dev) and chrome://tracing open: op spans,
// recomputations, allocations and frees, and a live-bytes counter that plots
// the memory timeline of a step.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ad {

class Graph;

// One recorded event. Times are microseconds since the Trace was made.
struct TraceEvent {
  enum class Kind : std::uint8_t {
    compute,     // an op's kernel ran (span)
    recompute,   // the same, for a node already computed earlier in that run (span)
    accumulate,  // a gradient added into its Parameter (span)
    compress,    // a value stored in a smaller dtype (span)
    decompress,  // restored (span)
    offload,     // a value copied to host memory (span: the host's part; a GPU copy runs on)
    prefetch,    // an offloaded value brought back (span, likewise)
    alloc,       // bytes allocated for a node's value or an op's workspace (instant)
    free,        // a node's value dropped by the schedule (instant)
    evict,       // a value dropped by the executor's budget guard (instant)
    live,        // the graph's live bytes above the run's baseline (counter)
  };
  Kind kind;
  std::int32_t node = -1;
  std::string name;        // op name, or the parameter for accumulate
  std::string shape;       // "f32[64,256]"
  double ts_us = 0;
  double dur_us = 0;       // spans only
  std::int64_t bytes = 0;  // alloc/free/evict: bytes; live: live bytes; compute: output bytes
  std::int32_t run = 0;    // which executed schedule (0, 1, ...) of this trace
};

// Collects events while attached to a graph:
//   ad::Trace trace;
//   graph.record(&trace);            // every schedule run on graph is recorded
//   ad::backward(loss, policy);
//   graph.record(nullptr);
//   trace.save("step.trace.json");   // open in Perfetto
// A Trace may record several steps (each run is a new `run` index, shown as
// its own track). Not thread-safe: one graph runs at a time per trace.
class Trace {
 public:
  Trace();
  const std::vector<TraceEvent>& events() const { return events_; }
  void clear();
  // The trace-event JSON ("traceEvents" array, "displayTimeUnit": "ms").
  std::string json() const;
  // Writes json() to `path`; throws ad::Error if the file cannot be written.
  void save(const std::string& path) const;

  // Executor side.
  double now_us() const;
  std::int32_t begin_run() { return runs_++; }
  void add(TraceEvent e) { events_.push_back(std::move(e)); }

 private:
  std::chrono::steady_clock::time_point t0_;
  std::vector<TraceEvent> events_;
  std::int32_t runs_ = 0;
};

}  // namespace ad
