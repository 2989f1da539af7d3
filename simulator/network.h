// Network models for the simulator. Workers are symmetric (same profile, same policy, same events at the same
// simulated times), so the simulator follows one representative worker and the models account for the other W-1
// through the load they put on the shared resources (server NICs, the ring). Each resource is a FIFO link: a message
// occupies it for bytes / bandwidth after whatever was dispatched before it (store-and-forward in dispatch order, which
// is what a sender that keeps a bounded number of bytes in flight approximates).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/policy.h"
#include "scheduler/reply_order.h"

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

// A message's life on the network: it starts moving at `begin` (after what was dispatched before it), the worker
// learns that every byte of its push has arrived at `sent` (the PS acknowledges receipt; the engine releases the
// message's credit then, CommBackend::reports_sent), and its result is back at the worker at `end`. sent <= end.
struct Transfer {
  Nanos begin;
  Nanos end;
  Nanos sent = -1;  // -1: the network has no separate receipt (credit is released at `end`)
  Nanos released() const { return sent >= 0 ? sent : end; }
};

class NetworkModel {
 public:
  virtual ~NetworkModel() = default;
  // Dispatches `batch` (one fused message) at `start`.
  virtual Transfer transfer(const Batch& batch, Nanos start) = 0;
  // Forgets all reservations (a new run).
  virtual void reset() = 0;
  // Least time the network needs for `bytes` of one worker's gradients sent as at least `messages` messages (the sum
  // of min_messages over their tensors), whatever the schedule: the fixed costs every message or collective pays
  // count at that fewest number, so no batching or partitioning can get below it.
  virtual double comm_lower_bound_s(uint64_t bytes, uint64_t messages) const = 0;
  // The fewest messages a tensor of `bytes` can travel in (0 for an empty one): one, unless the network cuts it.
  virtual uint64_t min_messages(uint64_t tensor_bytes) const { return tensor_bytes > 0 ? 1 : 0; }
  virtual CostModel cost_model() const = 0;
  virtual std::string describe() const = 0;
};

// Parameter server, as comm_backends/ps sends it: each partition of a batch is its own message (the PS backend does not
// fuse partitions into one request), messages above chunk_bytes travel as several chunks, and each chunk (key, offset)
// lives on one server, chosen on first sight as the least-loaded by bytes (the root's Sharder). All W workers push that
// chunk to its server and the server sends the sum back to each of them, so one chunk occupies its server's NIC for
// W * bytes / server rate in each direction. Workers are symmetric (they dispatch the same messages at the same times),
// so the model follows one worker and every server. Full duplex: push and pull use opposite directions of each NIC, so
// one message's pull overlaps the next one's push. Each server acknowledges a push as soon as it has arrived (message
// `received`); the acknowledgement leaves through the server's send queue, FIFO behind the pulls already queued there
// (the transport has one send queue per process), and reaches the worker a latency later: that is when the engine
// releases the message's credit. `sharded = false` is the idealised model instead: every message spread evenly over the
// S servers (W/S of its bytes on each), one message per batch.
struct PsParams {
  int workers = 8;
  int servers = 8;
  double worker_bps = 10e9;   // worker NIC, bits per second, each direction
  double server_bps = 10e9;   // server NIC
  double latency_s = 25e-6;   // one way, per message
  // Messages bigger than this travel as several chunks, each pushed, summed and pulled on its own, so one big
  // message's pull overlaps its own push (the PS backend's COMMSCHED_PS_CHUNK_BYTES, 4 MiB by default). 0: never.
  uint64_t chunk_bytes = 0;
  bool sharded = true;
  // false: what a server receives is not limited, only what every process sends, as under the transport's EMULATED
  // rate (COMMSCHED_EMULATE_RATE paces each process's sends; loopback receives at memory speed). For validation.
  bool server_ingress_limited = true;
  // The emulated links' token-bucket burst (comm_backends/ps/zmq_transport.cc); simulate_each_worker only.
  uint64_t emulated_burst_bytes = 256 << 10;
  // Real NICs (server_ingress_limited) in simulate_each_worker only: every link shared max-min fairly among the
  // connections with bytes on it, as TCP shares a NIC (flow_net.h), instead of FIFO, one message at a time.
  bool fair_share = false;
  // Real NICs only (server_ingress_limited, FIFO links; not fair_share, not emulated): every message also holds each
  // link it crosses for this long, the fixed CPU cost of sending or receiving one message (framing, system calls, the
  // server's bookkeeping), so a push_pull costs its server 2 * message_s beside its bytes. 0 here; the grid and
  // `commsched bench` (GridSpec::ps_message_s, --ps-message-cost) default to the real PS's measured cost
  // (scheduler/auto_knobs.h, kPsMessageS, which the automatic PS partition weighs too).
  double message_s = 0;
  // Every worker simulated, FIFO links or emulated ones (not fair_share): the order a server sends its ready replies
  // in. >0: the product's rule (scheduler/reply_order.h: receipts first, then the most urgent partition), a reply
  // sent at the latest once this many replies have left since it became ready; 0: arrival order.
  uint64_t reply_overtakes = ReplyOrder<int>::kDefaultMaxOvertakes;
};

class PsNetwork final : public NetworkModel {
 public:
  explicit PsNetwork(PsParams p);
  Transfer transfer(const Batch& batch, Nanos start) override;
  void reset() override;
  double comm_lower_bound_s(uint64_t bytes, uint64_t messages) const override;
  uint64_t min_messages(uint64_t tensor_bytes) const override;
  CostModel cost_model() const override;
  std::string describe() const override;

 private:
  struct Server {
    Link in, out;
    uint64_t load = 0;  // bytes assigned (the Sharder's measure)
  };
  double message_s() const;                            // the per-message cost this link model charges
  Nanos worker_time(uint64_t bytes) const;            // on the worker NIC
  Nanos server_time(uint64_t bytes, double share) const;  // on one server NIC: `share` of every worker's bytes
  // One message (or chunk) through push, receipt and pull, on `server` carrying `share` of it.
  Transfer transfer_one(uint64_t bytes, Nanos start, Server& server, double share);
  // One message's chunks, one after another, each on its owner (sharded) or spread over all servers.
  Transfer transfer_message(int32_t key, uint64_t offset, uint64_t bytes, Nanos start);
  Server& owner(int32_t key, uint64_t offset, uint64_t bytes);

  PsParams p_;
  Nanos latency_;
  Link worker_up_, worker_down_;
  std::vector<Server> servers_;  // sharded: one per server; otherwise one that stands for all
  std::map<std::pair<int32_t, uint64_t>, size_t> owner_;
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
  double comm_lower_bound_s(uint64_t bytes, uint64_t messages) const override;
  CostModel cost_model() const override;
  std::string describe() const override;

 private:
  RingParams p_;
  Link ring_;
};

uint64_t batch_bytes(const Batch& batch);

}  // namespace commsched::sim
