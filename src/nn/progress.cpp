#include "ad/nn/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

#include "ad/error.hpp"
#include "ad/schedule.hpp"

namespace ad::nn {

std::string format_bytes(std::int64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string format_seconds(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  if (s < 10) return fmt::format("{:.1f}s", s);
  auto t = static_cast<std::int64_t>(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
}

std::string Progress::format(const std::string& label, std::int64_t step, std::int64_t total, double loss,
                             double per_second, const std::string& unit, std::int64_t peak_bytes, double eta) {
  std::string s = label.empty() ? "" : label + "  ";
  if (total > 0)
    s += fmt::format("step {}/{} ({}%)", step, total, static_cast<int>(100.0 * static_cast<double>(step) / static_cast<double>(total)));
  else
    s += fmt::format("step {}", step);
  s += fmt::format("  loss {:.4f}", loss);
  if (per_second > 0) s += fmt::format("  {:.{}f} {}/s", per_second, per_second < 100 ? 1 : 0, unit);
  if (peak_bytes >= 0) s += "  peak " + format_bytes(peak_bytes);
  if (eta >= 0) s += "  ETA " + format_seconds(eta);
  return s;
}

Progress::Progress(std::int64_t total, ProgressOptions o) : total_(total), o_(std::move(o)) {
  if (total < 0) throw Error(fmt::format("Progress: total_steps must be >= 0, got {}", total));
  if (!o_.out) throw Error("Progress: out is a null FILE*");
  tty_ = o_.tty < 0 ? ::isatty(::fileno(o_.out)) == 1 : o_.tty > 0;
  every_ = o_.print_every > 0 ? o_.print_every : std::max<std::int64_t>(1, (total - o_.start_step) / 20);
  step_ = o_.start_step;
  t0_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  try {
    finish();
  } catch (...) {
  }
}

void Progress::update(std::int64_t step, double loss, std::int64_t peak_bytes) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  update_at(elapsed, step, loss, peak_bytes);
}
void Progress::update(std::int64_t step, double loss, const Report& r) { update(step, loss, r.measured_peak_bytes); }

void Progress::update_at(double elapsed, std::int64_t step, double loss, std::int64_t peak_bytes) {
  step_ = step;
  loss_ = loss;
  if (peak_bytes > peak_) peak_ = peak_bytes;
  dirty_ = true;
  finished_ = false;
  bool last = total_ > 0 && step >= total_;
  bool due = tty_ ? elapsed - last_draw_ >= o_.redraw_seconds : (step - o_.start_step) % every_ == 0;
  if (due || last) draw(elapsed, last);
}

void Progress::draw(double elapsed, bool last) {
  double done = static_cast<double>(step_ - o_.start_step);
  double rate = elapsed > 0 && done > 0 ? done / elapsed : 0;
  double eta = total_ > 0 && rate > 0 ? static_cast<double>(std::max<std::int64_t>(total_ - step_, 0)) / rate : -1;
  double shown_rate = o_.items_per_step > 0 ? rate * static_cast<double>(o_.items_per_step) : rate;
  std::string unit = o_.items_per_step > 0 ? o_.item_name : "step";
  std::string line = format(o_.label, step_, total_, loss_, shown_rate, unit, peak_, last ? -1 : eta);
  if (last) line += "  in " + format_seconds(elapsed);
  if (tty_) {
    std::size_t len = line.size();
    if (len < last_len_) line.append(last_len_ - len, ' ');  // clear what the last line left
    last_len_ = len;
    std::fputs(("\r" + line).c_str(), o_.out);
    open_line_ = true;
    if (last) {
      std::fputc('\n', o_.out);
      open_line_ = false;
      last_len_ = 0;
    }
  } else {
    std::fputs((line + "\n").c_str(), o_.out);
  }
  std::fflush(o_.out);
  last_draw_ = elapsed;
  dirty_ = false;
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (dirty_) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    draw(elapsed, false);
  }
  if (tty_ && open_line_) {
    std::fputc('\n', o_.out);
    std::fflush(o_.out);
    open_line_ = false;
    last_len_ = 0;
  }
}

}  // namespace ad::nn
