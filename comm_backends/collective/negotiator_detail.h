// What the negotiator's files share (negotiator.cc: connections and messages; negotiator_rounds.cc: the loop and a
// helping caller's rounds; negotiator_order.cc: the order's path; negotiator_faults.cc: a peer's loss, keep-alive, the
// goodbye barrier, stragglers). Not part of the interface.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include "comm_backends/collective/negotiator.h"

namespace commsched::collective::detail {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wakes the negotiator thread through its eventfd.
inline void wake(int eventfd) {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(eventfd, &one, sizeof one);
}

}  // namespace commsched::collective::detail

namespace commsched::collective {

class Negotiator::StateLock {
 public:
  explicit StateLock(Negotiator& n) : n_(n), lock_(n.state_mu_) { mark(); }
  StateLock(Negotiator& n, std::try_to_lock_t t) : n_(n), lock_(n.state_mu_, t) {
    if (lock_.owns_lock()) mark();
  }
  ~StateLock() {
    if (lock_.owns_lock()) unlock();
  }
  bool owns() const { return lock_.owns_lock(); }
  void lock() {
    lock_.lock();
    mark();
  }
  void unlock() {
    n_.state_owner_ = std::thread::id{};
    lock_.unlock();
  }

 private:
  void mark() { n_.state_owner_ = std::this_thread::get_id(); }
  Negotiator& n_;
  std::unique_lock<std::mutex> lock_;
};

}  // namespace commsched::collective
