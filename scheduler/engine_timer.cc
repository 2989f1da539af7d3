#include "scheduler/engine_timer.h"

namespace commsched {

WakeupTimer::WakeupTimer(std::chrono::steady_clock::time_point t0, std::function<void()> fire)
    : t0_(t0), fire_(std::move(fire)), thread_([this] { loop(); }) {}

WakeupTimer::~WakeupTimer() { stop(); }

void WakeupTimer::wake_at(Nanos at) {
  std::lock_guard lk(mu_);
  if (!wakeup_at_ || at < *wakeup_at_) {
    wakeup_at_ = at;
    cv_.notify_one();
  }
}

void WakeupTimer::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void WakeupTimer::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    if (!wakeup_at_) {
      cv_.wait(lk);
      continue;
    }
    const auto deadline = t0_ + std::chrono::nanoseconds(*wakeup_at_);
    cv_.wait_until(lk, deadline);
    // Woken early by an earlier request (or spuriously): the loop re-reads the deadline.
    if (stop_ || !wakeup_at_ || std::chrono::steady_clock::now() < t0_ + std::chrono::nanoseconds(*wakeup_at_)) continue;
    wakeup_at_.reset();
    lk.unlock();
    fire_();
    lk.lock();
  }
}

}  // namespace commsched
