#pragma once
// A progress line for training loops:
//   train  step 120/1000 (12%)  loss 2.3456  85.3 step/s  peak 12.5 MiB  ETA 10s
// On a terminal it redraws one line in place ('\r', at most every
// redraw_seconds); otherwise (a log file, CI) it prints plain lines every
// print_every steps. Time is measured with a steady clock from construction.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ad {
struct Report;
}

namespace ad::nn {

struct ProgressOptions {
  std::FILE* out = stderr;
  std::string label;                 // printed first when not empty
  std::int64_t start_step = 0;       // steps already done at construction (a resumed run)
  std::int64_t items_per_step = 0;   // > 0: throughput in items/s (samples, tokens) instead of step/s
  std::string item_name = "item";    // unit of items_per_step
  double redraw_seconds = 0.1;       // terminal: least time between redraws
  std::int64_t print_every = 0;      // not a terminal: a line every N steps (0: about 20 lines per run)
  int tty = -1;                      // -1: isatty(out); 0 or 1 forces plain lines or redraws
};

class Progress {
 public:
  // total_steps: the step count at the end (for the percentage and ETA);
  // 0 if unknown. Throws ad::Error for total_steps < 0 or a null out.
  explicit Progress(std::int64_t total_steps, ProgressOptions options = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Records that `step` steps are done (counting from 1, including
  // start_step), the last loss and the step's peak bytes (< 0: not shown;
  // the line shows the largest seen). Draws when due; the last step always.
  void update(std::int64_t step, double loss, std::int64_t peak_bytes = -1);
  // The same with the peak from backward()'s report.
  void update(std::int64_t step, double loss, const Report& report);
  // As update(), at a given time since construction (for tests and replays).
  void update_at(double elapsed_seconds, std::int64_t step, double loss, std::int64_t peak_bytes = -1);
  // Draws the last state if it was not drawn and ends a terminal line.
  // Called by the destructor.
  void finish();

  bool tty() const { return tty_; }
  // The line for the given values (no I/O). per_second <= 0 or eta < 0 are
  // left out.
  static std::string format(const std::string& label, std::int64_t step, std::int64_t total, double loss,
                            double per_second, const std::string& unit, std::int64_t peak_bytes, double eta_seconds);

 private:
  void draw(double elapsed, bool last);

  std::int64_t total_;
  ProgressOptions o_;
  bool tty_ = false;
  std::chrono::steady_clock::time_point t0_;
  std::int64_t step_ = 0, peak_ = -1, every_ = 1;
  double loss_ = 0, last_draw_ = -1e300;
  std::size_t last_len_ = 0;
  bool dirty_ = false, open_line_ = false, finished_ = false;
};

// "12.5 MiB", "800 B"
std::string format_bytes(std::int64_t bytes);
// "1h02m", "3m05s", "12s", "0.4s"
std::string format_seconds(double s);

}  // namespace ad::nn
