// Waiting for completion callbacks. Task callbacks (scheduler/task.h) and a backend's BatchDone
// (comm_backends/comm_backend.h) are both `void(const Status&)`, called once from any thread; whoever submits work and
// then waits for it needs the same few lines of mutex, condition variable and counter. They live here once.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/spin_wait.h"
#include "scheduler/wait_helper.h"
#include "base/types.h"

namespace commsched {

// Counts expected and settled completions, keeps the failures, and waits (always bounded) for the rest, or for all
// but a few of them (a sliding window of work in flight). Thread-safe. Must outlive every callback it handed out: a
// caller that may give up waiting (a time limit) keeps it, and whatever the work writes into, in shared ownership
// with the callbacks.
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
    // Wake a waiter only when its condition may now hold: one wake-up per round, not one per completion, which a
    // benchmark's hand-back time would count.
    if (settled_ + wake_at_ >= expected_) cv_.notify_all();
  }

  // expect(1) and a callback that settles it: hand it to Task::on_done or CommBackend::start.
  std::function<void(const Status&)> callback() {
    expect(1);
    return [this](const Status& st) { settle(st); };
  }

  // Waits until at most `may_remain` expected completions are outstanding (by default: every one has settled) or
  // `limit` passes. Returns the first failure so far, ok when none failed, or an error saying how many are still
  // outstanding after the limit. Polls for up to kSpin before sleeping: work that ends within microseconds of the
  // wait (a small collective) then costs its caller no wake-up. With a `helper` (the backend's
  // BackendCapabilities::wait_helper) this thread first does the backend's work itself while there is some.
  Status wait(std::chrono::nanoseconds limit, size_t may_remain = 0, WaitHelper* helper = nullptr) {
    const auto ready = [&] { return settled_.load() + may_remain >= expected_.load(); };
    if (helper && !ready()) helper->help_until(ready, std::min<std::chrono::nanoseconds>(kHelpIdle, limit));
    spin_until_alone(ready, std::min<std::chrono::nanoseconds>(kSpin, limit));
    std::unique_lock lock(mu_);
    wake_at_ = std::max(wake_at_, may_remain);
    if (!cv_.wait_for(lock, limit, [&] { return settled_ + may_remain >= expected_; }))
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
    expected_ = settled_ = wake_at_ = 0;
    failures_.clear();
  }

 private:
  static constexpr std::chrono::microseconds kSpin{50};
  // How long a helping waiter waits (asleep in poll) for the backend's next piece of work: an order is a round trip
  // to rank 0 away, plus the other ranks' own lateness (collective_bench, quiet, 64 KiB and 1 MiB: with 200 us the
  // waiter often gave up just before the order came, and the negotiator thread then had to be woken to run it).
  static constexpr std::chrono::microseconds kHelpIdle{1000};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<size_t> expected_{0}, settled_{0};  // written under mu_; read without it while spinning
  size_t wake_at_ = 0;  // the largest `may_remain` any wait has asked for
  std::vector<Status> failures_;
};

}  // namespace commsched
