#include "write_queue.h"

#include <utility>

namespace melforge::builder {

WriteQueue::WriteQueue(bool background) {
  if (background) thread_ = std::thread([this] { loop(); });
}

WriteQueue::~WriteQueue() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WriteQueue::post(std::function<void()> task) {
  wait();
  if (!thread_.joinable()) {
    task();
    return;
  }
  {
    std::lock_guard lock(mutex_);
    task_ = std::move(task);
  }
  cv_.notify_all();
}

void WriteQueue::wait() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [this] { return !task_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void WriteQueue::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || task_; });
    if (!task_) return;
    lock.unlock();
    std::exception_ptr error;
    try {
      task_();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    task_ = nullptr;
    error_ = error;
    cv_.notify_all();
  }
}

}  // namespace melforge::builder
