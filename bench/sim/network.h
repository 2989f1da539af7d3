// Network models for the simulator. Workers are symmetric (same profile, same policy, same events at the same
// simulated times), so the simulator follows one representative worker and the models account for the other W-1
// through the load they put on the shared resources (server NICs, the ring). Each resource is a FIFO link: a message
// occupies it for bytes / bandwidth after whatever was dispatched before it (store-and-forward in dispatch order, which
// is what a sender that keeps a bounded number of bytes in flight approximates).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "scheduler/policy.h"

namespace commsched::sim {

// A serially used resource: bytes go through one message after another.
class Link {
 public:
  // Reserves the link for `duration` from max(ready, when it frees up); returns when that reservation ends.
  Nanos reserve(Nanos ready, Nanos duration) {
    free_at_ = std::max(free_at_, ready) + duration;
    return free_at_;
  }
  // When a message ready at `ready` would start moving.
  Nanos start_of(Nanos ready) const { return std::max(free_at_, ready); }
  void reset() { free_at_ = 0; }

 private:
  Nanos free_at_ = 0;
};

// The alpha + beta * bytes cost of one message, as MG-WFBP's planner wants it.
struct CostModel {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
};

// A message's life on the network: it starts moving at `begin` (after what was dispatched before it) and its result is
// back at the worker at `end`.
struct Transfer {
  Nanos begin;
  Nanos end;
};

class NetworkModel {
 public:
  virtual ~NetworkModel() = default;
  // Dispatches `batch` (one fused message) at `start`.
  virtual Transfer transfer(const Batch& batch, Nanos start) = 0;
  // Forgets all reservations (a new run).
  virtual void reset() = 0;
  // Least time the network needs for `bytes` of gradients per iteration, whatever the schedule.
  virtual double comm_lower_bound_s(uint64_t bytes) const = 0;
  virtual CostModel cost_model() const = 0;
  virtual std::string describe() const = 0;
};

// Parameter server: each message is pushed to the servers and the sum pulled back. Keys are spread evenly over the
// S servers (load-balanced sharding, DESIGN.md), so every server receives W/S of each message's bytes from the workers
// together; with symmetric workers one representative server stands for all. Full duplex: push and pull use opposite
// directions of each NIC, so one message's pull overlaps the next one's push.
struct PsParams {
  int workers = 8;
  int servers = 8;
  double worker_bps = 10e9;   // worker NIC, bits per second, each direction
  double server_bps = 10e9;   // server NIC
  double latency_s = 25e-6;   // one way, per message
  // Messages bigger than this travel as several chunks, each pushed, summed and pulled on its own, so one big
  // message's pull overlaps its own push (the PS backend's COMMSCHED_PS_CHUNK_BYTES, 4 MiB by default). 0: never.
  uint64_t chunk_bytes = 0;
};

class PsNetwork final : public NetworkModel {
 public:
  explicit PsNetwork(PsParams p);
  Transfer transfer(const Batch& batch, Nanos start) override;
  void reset() override;
  double comm_lower_bound_s(uint64_t bytes) const override;
  CostModel cost_model() const override;
  std::string describe() const override;

 private:
  Nanos worker_time(uint64_t bytes) const;  // on the worker NIC
  Nanos server_time(uint64_t bytes) const;  // on one server NIC: every worker's share of the message
  Transfer transfer_one(uint64_t bytes, Nanos start);  // one message (or chunk) through push and pull

  PsParams p_;
  Nanos latency_;
  Link worker_up_, worker_down_, server_in_, server_out_;
};

// Ring all-reduce, alpha-beta: 2(W-1)/W * bytes / B + 2(W-1) * alpha per collective; collectives run one at a time.
struct RingParams {
  int workers = 8;
  double bandwidth_bps = 10e9;
  double alpha_s = 5e-6;      // per step
};

class RingAllreduceNetwork final : public NetworkModel {
 public:
  explicit RingAllreduceNetwork(RingParams p);
  Transfer transfer(const Batch& batch, Nanos start) override;
  void reset() override { ring_.reset(); }
  double comm_lower_bound_s(uint64_t bytes) const override;
  CostModel cost_model() const override;
  std::string describe() const override;

 private:
  RingParams p_;
  Link ring_;
};

uint64_t batch_bytes(const Batch& batch);

}  // namespace commsched::sim
