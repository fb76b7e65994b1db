#pragma once
/// Stopping a build or bench from another thread (melforge-build's signal thread): request_stop() sets a flag, and
/// the stages call check_stop() at file and batch boundaries.
#include <string>

#include "melforge/common/errors.h"

namespace melforge::builder {

/// A build stopped because request_stop() was called (melforge-build calls it on SIGINT or SIGTERM).
class Interrupted : public Error {
 public:
  /// `signal` is the signal number given to request_stop() (0 when none).
  Interrupted(const std::string& what, int signal) : Error(what), signal_(signal) {}
  /// The signal number given to request_stop().
  int signal() const { return signal_; }

 private:
  int signal_;
};

/// Asks every running build of this process to stop: run_build throws Interrupted at the next file or batch
/// boundary (at most one batch of mel computation later), after removing its temporary files. `signal` (> 0) is
/// reported in the message. Only stores to a lock-free atomic, so it may be called from any thread.
void request_stop(int signal);

/// Forgets a request_stop(), so that a later build in the same process runs: the Python package calls it before and
/// after each melforge.build (a KeyboardInterrupt stops one build, not every later one).
void clear_stop();

/// Throws Interrupted if request_stop() was called: the check every stage makes at file and batch boundaries.
void check_stop();

}  // namespace melforge::builder
