#pragma once
/// The write thread of a build: compressing and writing one batch overlaps the decoding and mel of the next.
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace melforge::builder {

/// Runs writer tasks in order on one background thread, so that compressing and writing one batch overlaps the
/// decoding and mel computation of the next. At most one task is in flight: post() waits for the previous one.
/// With `background` false (--threads 1, so that a build uses one core; the bench, which times the writes on their
/// own) post() runs the task itself, at once. The destructor waits for the task in flight, so whatever a task uses
/// must be destroyed after the queue.
class WriteQueue {
 public:
  /// Starts the thread when `background`.
  explicit WriteQueue(bool background);
  ~WriteQueue();
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  /// Waits for the previous task (rethrowing its error), then starts `task` (runs it, without a background thread).
  void post(std::function<void()> task);
  /// Waits until no task is in flight; rethrows the error of the last task, if any.
  void wait();

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace melforge::builder
