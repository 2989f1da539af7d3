#include "comm_backends/control/store.h"

#include <algorithm>
#include <stdexcept>
#include <thread>

namespace commsched::control {
namespace {

using Clock = std::chrono::steady_clock;

// Polls until `key` exists or the deadline passes. Polling is fine here: a rendezvous happens once per group, and
// the server stays stateless (no waiters to wake, none to forget when a client goes away).
std::optional<std::string> poll_for(Store& store, const std::string& key, Deadline deadline) {
  auto backoff = std::chrono::microseconds(200);
  for (;;) {
    if (auto value = store.try_get(key)) return value;
    if (Clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
  }
}

std::string waited_ms(Clock::time_point since) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count());
}

}  // namespace

std::string Store::get(const std::string& key, Deadline deadline) {
  const auto since = Clock::now();
  if (auto value = poll_for(*this, key, deadline)) return *value;
  throw std::runtime_error(where() + ": key '" + key + "' did not appear within " + waited_ms(since) +
                           " ms (did every rank start?)");
}

std::string Store::get(const std::string& key, std::chrono::milliseconds timeout) {
  return get(key, Clock::now() + timeout);
}

void Store::wait(const std::vector<std::string>& keys, Deadline deadline) {
  for (const auto& key : keys) get(key, deadline);
}

std::vector<std::string> exchange(Store& store, const std::string& scope, int rank, int size, const std::string& value,
                                  Deadline deadline) {
  if (rank < 0 || rank >= size)
    throw std::invalid_argument("rendezvous '" + scope + "': rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(size) + ")");
  store.set(scope + std::to_string(rank), value);
  std::vector<std::string> values(static_cast<size_t>(size));
  std::string missing;
  for (int r = 0; r < size; ++r) {
    auto v = poll_for(store, scope + std::to_string(r), deadline);
    if (v) values[static_cast<size_t>(r)] = std::move(*v);
    else missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!missing.empty())
    throw std::runtime_error(store.where() + ": rendezvous '" + scope + "': rank(s) " + missing +
                             " did not publish before the deadline (did every rank start?)");
  return values;
}

}  // namespace commsched::control
