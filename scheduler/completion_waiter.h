// Waiting for completion callbacks. Task callbacks (scheduler/task.h) and a backend's BatchDone
// (comm_backends/comm_backend.h) are both `void(const Status&)`, called once from any thread; whoever submits work and
// then waits for it needs the same few lines of mutex, condition variable and counter. They live here once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/types.h"

namespace commsched {

// Counts expected and settled completions, keeps the failures, and waits (always bounded) for the rest.
// Thread-safe. Must outlive every callback it handed out.
class CompletionWaiter {
 public:
  // Announces `n` more completions to wait for. Call before the work can complete (before submit/start).
  void expect(size_t n = 1) {
    std::lock_guard lock(mu_);
    expected_ += n;
  }

  // Settles one expected completion with `st`.
  void settle(const Status& st) {
    std::lock_guard lock(mu_);
    ++settled_;
    if (!st.ok()) failures_.push_back(st);
    cv_.notify_all();
  }

  // expect(1) and a callback that settles it: hand it to Task::on_done or CommBackend::start.
  std::function<void(const Status&)> callback() {
    expect(1);
    return [this](const Status& st) { settle(st); };
  }

  // Waits until every expected completion has settled or `limit` passes. Returns the first failure, ok when all
  // succeeded, or an error saying how many are still outstanding after the limit.
  Status wait(std::chrono::nanoseconds limit) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, limit, [&] { return settled_ >= expected_; }))
      return Status::Error("timed out after " + std::to_string(std::chrono::duration<double>(limit).count()) +
                           " s with " + std::to_string(expected_ - settled_) + " of " + std::to_string(expected_) +
                           " completions outstanding");
    return failures_.empty() ? Status::Ok() : failures_.front();
  }

  std::vector<Status> failures() const {
    std::lock_guard lock(mu_);
    return failures_;
  }
  size_t outstanding() const {
    std::lock_guard lock(mu_);
    return expected_ - settled_;
  }
  // Forgets everything settled so far, to wait for the next round. Only between rounds (nothing outstanding).
  void reset() {
    std::lock_guard lock(mu_);
    expected_ = settled_ = 0;
    failures_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t expected_ = 0, settled_ = 0;
  std::vector<Status> failures_;
};

}  // namespace commsched
