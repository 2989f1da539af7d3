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
