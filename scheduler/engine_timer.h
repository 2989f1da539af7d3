// The engine's wake-up timer: one thread that calls `fire` when the earliest requested time has come (a policy's
// fusion cycle, say). Requests only ever move the deadline earlier; after it fires, the next request arms it again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "base/types.h"

namespace commsched {

class WakeupTimer {
 public:
  // `t0` is the engine's clock origin (times are nanoseconds since it); `fire` runs on the timer thread.
  WakeupTimer(std::chrono::steady_clock::time_point t0, std::function<void()> fire);
  ~WakeupTimer();
  WakeupTimer(const WakeupTimer&) = delete;
  WakeupTimer& operator=(const WakeupTimer&) = delete;

  void wake_at(Nanos at);
  void stop();  // idempotent; joins the thread

 private:
  void loop();

  const std::chrono::steady_clock::time_point t0_;
  std::function<void()> fire_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Nanos> wakeup_at_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace commsched
