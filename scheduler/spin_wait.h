// Waiting briefly without sleeping. A thread that sleeps and is woken pays a wake-up: tens of microseconds on an idle
// core, up to a scheduler slice on a busy machine. Where the awaited event usually comes within microseconds (the
// next order of back-to-back collectives, a completion handed back to its caller), polling for a bounded time before
// sleeping is cheaper than the sleep. Every pass yields the core, so on a loaded machine the spin costs others little.
#pragma once

#include <chrono>
#include <thread>

namespace commsched {

// Polls `ready()` until it returns true (then true) or `budget` has passed (then false). A zero budget asks once.
template <class Ready>
bool spin_until(Ready&& ready, std::chrono::nanoseconds budget) {
  if (ready()) return true;
  if (budget <= std::chrono::nanoseconds::zero()) return false;
  const auto until = std::chrono::steady_clock::now() + budget;
  do {
    std::this_thread::yield();
    if (ready()) return true;
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

}  // namespace commsched
