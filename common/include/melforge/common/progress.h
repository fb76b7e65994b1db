#pragma once
/// Progress reporting: a bar with an ETA on a terminal, periodic plain lines in a log.
#include <cstdint>
#include <mutex>
#include <string>

#include "melforge/common/timing.h"

namespace melforge {

/// Reports progress of one task of `total` units on stderr. Thread-safe.
class Progress {
 public:
  /// `label`: what is counted (e.g. "decode train"); `unit`: unit name (e.g. "files"); `quiet`: print nothing.
  /// On a terminal the bar redraws at most 10 times a second; otherwise a line is printed every `log_every_s`.
  Progress(std::string label, int64_t total, std::string unit, bool quiet, double log_every_s = 10.0);
  /// Adds `n` units done.
  void advance(int64_t n = 1);
  /// Prints the final state (100% or where it stopped) and a newline. Called by the destructor if needed.
  void finish();
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  void print_locked(bool final_line);
  std::string label_;
  std::string unit_;
  int64_t total_;
  int64_t done_ = 0;
  bool quiet_;
  bool tty_;
  bool finished_ = false;
  double log_every_s_;
  double last_print_s_ = 0;
  Stopwatch watch_;
  std::mutex mutex_;
};

}  // namespace melforge
