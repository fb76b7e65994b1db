#include "melforge/common/progress.h"

#include <unistd.h>

#include <cstdio>

namespace melforge {

Progress::Progress(std::string label, int64_t total, std::string unit, bool quiet, double log_every_s)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      quiet_(quiet),
      tty_(isatty(STDERR_FILENO) != 0),
      log_every_s_(log_every_s) {}

void Progress::advance(int64_t n) {
  std::lock_guard lock(mutex_);
  done_ += n;
  if (quiet_ || (!tty_ && done_ >= total_)) return;
  const double now = watch_.seconds();
  if (now - last_print_s_ >= (tty_ ? 0.1 : log_every_s_)) {
    last_print_s_ = now;
    print_locked(false);
  }
}

void Progress::print_locked(bool final_line) {
  const double elapsed = watch_.seconds();
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  const double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : 0.0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    char bar[kWidth + 1];
    for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
    bar[kWidth] = '\0';
    std::fprintf(stderr, "\r%-16s [%s] %lld/%lld %s %5.1f%% %.0f %s/s ETA %4.0fs%s", label_.c_str(), bar,
                 static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(), 100.0 * frac, rate,
                 unit_.c_str(), eta, final_line ? "\n" : "");
  } else {
    std::fprintf(stderr, "[progress] %s: %lld/%lld %s (%.1f%%), %.0f %s/s, elapsed %.1fs, ETA %.0fs\n",
                 label_.c_str(), static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(),
                 100.0 * frac, rate, unit_.c_str(), elapsed, eta);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  std::lock_guard lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (!quiet_) print_locked(true);
}

Progress::~Progress() { finish(); }

}  // namespace melforge
