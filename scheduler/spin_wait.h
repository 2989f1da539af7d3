// Waiting briefly without sleeping. A thread that sleeps and is woken pays a wake-up: tens of microseconds on an idle
// core, up to a scheduler slice on a busy machine. Where the awaited event usually comes within microseconds (the
// next order of back-to-back collectives, a completion handed back to its caller), polling for a bounded time before
// sleeping is cheaper than the sleep. Every pass yields the core, so on a loaded machine the spin costs others little.
//
// What yielding spins do depends on who else wants the core (collective_bench, 2 ranks on a 2-vCPU VM, issue 26):
// under chrt -f 1 a negotiated 4 KiB step costs about plain Gloo's (1.0-1.1x; 2.3x without spinning: each wake-up
// waits for a busy core); beside other sessions' nice-10/19 builds it costs 3-8x less than plain Gloo (a yielding
// spinner keeps its core for this process's threads woken onto it); beside two nice-0 busy loops it costs 1.8-2.6x
// plain Gloo (0.8-0.9x without spinning: a yield may hand the core to a loop until the next tick). Stopping the spin
// for a second after a pass in which the process lost its core to another one fixed the busy-loop case but also fired
// beside nice-10 work and lost that gain (4 KiB 0.13x -> 1.7x), so the spin stays as it is.
#pragma once

#include <atomic>
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

// Held by the one thread of this process that spins in spin_until_alone.
inline std::atomic<bool> g_lone_spinner{false};

// spin_until for waits on another process (a peer's message, a collective's end): at most one thread of the process
// spins at a time, and a second one that would spin sleeps at once. Two ranks on two cores showed why
// (collective_bench, 4 KiB, quiet): with the caller's wait and the negotiator thread both spinning, a rank's two
// spinners yielded to each other on one core while its Gloo thread queued on the other core behind the other rank's
// threads (a spinner counts as load, so nothing moved it). Side by side, quiet, 4 KiB: 2.31x plain Gloo (median of 5,
// 1.86-5.17) with both spinning, 1.36x (0.76-2.42) with one spinner per process (1.77x over 30 quiet runs in four
// sets); at load ~10 0.08-0.20x and 0.13-0.55x (a spinner still keeps a core for the process; plain Gloo loses its
// core to the load).
template <class Ready>
bool spin_until_alone(Ready&& ready, std::chrono::nanoseconds budget) {
  if (ready()) return true;
  if (budget <= std::chrono::nanoseconds::zero()) return false;
  bool free = false;
  if (!g_lone_spinner.compare_exchange_strong(free, true, std::memory_order_acquire)) return false;
  const bool got = spin_until(ready, budget);
  g_lone_spinner.store(false, std::memory_order_release);
  return got;
}

}  // namespace commsched
