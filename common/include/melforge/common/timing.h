#pragma once
/// Wall-clock stage timers, printed as a table and saved as JSON.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace melforge {

/// Monotonic stopwatch in seconds.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  /// Seconds since construction or the last `reset()`.
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  /// Restarts the stopwatch.
  void reset() { start_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// Accumulated seconds per named stage, in first-use order. Not thread-safe: add from one thread.
class StageTimes {
 public:
  /// Adds `seconds` to `stage` (creating it at the end of the order if new).
  void add(const std::string& stage, double seconds);
  /// Seconds recorded for `stage`, 0 when absent.
  double get(const std::string& stage) const;
  /// Stage names in first-use order.
  const std::vector<std::string>& order() const { return order_; }
  /// `{stage: seconds, ...}`.
  nlohmann::json to_json() const;
  /// A fixed-width table: stage, seconds, share of `total_seconds`.
  std::string table(double total_seconds) const;

 private:
  std::vector<std::string> order_;
  std::map<std::string, double> seconds_;
};

/// Adds the lifetime of the scope to a stage, and marks it with an NVTX range when built with CUDA.
class ScopedStage {
 public:
  /// Starts timing `stage` into `times`.
  ScopedStage(StageTimes& times, std::string stage);
  ~ScopedStage();
  ScopedStage(const ScopedStage&) = delete;
  ScopedStage& operator=(const ScopedStage&) = delete;

 private:
  StageTimes& times_;
  std::string stage_;
  Stopwatch watch_;
};

/// Peak resident set size of this process so far, in bytes (from /proc/self/status VmHWM).
long long peak_rss_bytes();

}  // namespace melforge
