// Lending work to the thread that waits for it (leader/followers). A backend whose completions come from a thread of
// its own (the collective negotiator's, which receives the order and runs the collective) pays a hand-off at each end
// of a step: that thread must be woken when the order comes, and the caller when the collective ends. On a machine
// that halts idle cores each wake-up costs tens of microseconds to milliseconds (issue 26, collective_bench: under
// real-time scheduling, where a woken thread gets a core at once, a negotiated 1 MiB step costs 1.03-1.08x plain
// Gloo; without it 2.6x). A caller that is about to wait anyway can instead receive the order and run the collective
// itself, as plain Gloo's caller does: no hand-off on either end.
#pragma once

#include <chrono>
#include <functional>

namespace commsched {

class WaitHelper {
 public:
  virtual ~WaitHelper() = default;
  // Does the backend's pending work on the calling thread until `done()` holds, or until `idle` has passed with
  // nothing to do (the caller then sleeps as usual and the backend's own thread carries on). Returns at once where
  // the work cannot move to this thread (the backend's thread is in the middle of it, or this thread is inside one of
  // the backend's callbacks). `done` must be cheap and thread-safe; it is polled between pieces of work.
  virtual void help_until(const std::function<bool()>& done, std::chrono::nanoseconds idle) = 0;
};

}  // namespace commsched
