// The store every rendezvous meets at (as gloo's and c10d's do): a few keys and values, served by one process of a
// group and written by all. The parameter server's Van (servers' endpoints), the collective ranks' order negotiation,
// Gloo's full mesh, NCCL's unique id, the hierarchical backend's local groups, process sets, elastic generations and
// the multi-node launcher all bootstrap through it: a member
// publishes what others need (its address) under a key and waits for theirs, and sockets that must stay for latency
// (the negotiation's per-step reports and orders) are dialled from what it found there.
//
// The interface is what a rendezvous needs; comm_backends/collective/kv_store.h serves it over TCP, authenticated
// with the run's secret (a client that cannot prove it reads and writes nothing).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm_backends/control/socket.h"

namespace commsched::control {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value under `key`, or none yet (does not wait).
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Adds `delta` to the integer stored at `key` (absent: 0) in one step of the store and returns the sum: how
  // several processes take distinct numbers without a race.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // How the store is named in errors ("rendezvous store at 10.0.0.1:29500").
  virtual std::string where() const = 0;

  // Waits until `key` exists, at most until `deadline`; throws std::runtime_error naming the store, the key and how
  // long it waited.
  std::string get(const std::string& key, Deadline deadline);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  // Waits until every key exists (the first missing one is named when the deadline passes).
  void wait(const std::vector<std::string>& keys, Deadline deadline);
  bool contains(const std::string& key) { return try_get(key).has_value(); }
};

// The rendezvous of a group of `size` members on a store: member `rank` publishes `value` under "<scope><rank>" and
// waits for everyone's; returns the values by rank. Throws naming the ranks still missing at the deadline.
std::vector<std::string> exchange(Store& store, const std::string& scope, int rank, int size, const std::string& value,
                                  Deadline deadline);

}  // namespace commsched::control
