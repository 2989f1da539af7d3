// The parameter server with every worker simulated on its own, as comm_backends/ps runs it. PsNetwork (network.h)
// assumes symmetric workers, which push the same chunk at the same moment; real workers do not: the server answers
// the workers of a chunk one after another, in the order their pushes arrived (comm_backends/ps/slot_table), so the
// first to push is first to get the sum, starts its next forward earlier, and the workers drift apart; under
// ByteScheduler each then dispatches in its own order, and a sum waits for the slowest push of it.
//
// Per worker: an uplink (its pushes, FIFO in dispatch order) and a downlink. Per server: a send queue (receipts and sums)
// and a downlink. The send queue holds the ready replies and, each time its link can take a message, sends the one the
// product's rule picks (scheduler/reply_order.h: receipts first, then the most urgent partition, nothing starving), as
// comm_backends/ps/server.cc does; PsParams::reply_overtakes = 0 sends them in arrival order instead. With fair
// sharing the replies go in arrival order, each on its connection. Each partition of a batch is its own request, cut into chunks of at most chunk_bytes; each
// chunk (key, offset) lives whole on the server the root's Sharder gives it (least loaded by bytes, on first sight).
// A server acknowledges a push the moment it has arrived (`received`, queued in its send queue; the worker's engine releases credit when every chunk of the batch is acknowledged) and, once all W workers'
// pushes of that chunk's round are in, queues the sum to each of them in arrival order.
//
// Two link models:
// - server_ingress_limited (real NICs): a message leaves its sender's link in FIFO order, taking bytes / rate; when it
//   starts to flow it also takes the receiver's downlink (FIFO among the senders into it), and it arrives a latency
//   after the later of the two ends.
// - fair_share (real NICs too): every link shared max-min fairly among the connections with bytes on it (flow_net.h),
//   one connection per worker-server pair and direction, messages FIFO within a connection.
// - emulated (server_ingress_limited = false), as COMMSCHED_EMULATE_RATE runs the real cluster: every process paces its
//   own sends with a token bucket (comm_backends/ps/token_bucket.h, burst emulated_burst_bytes); a message leaves
//   whole as soon as the bucket is out of debt, arrives a latency later, and the bucket then owes its size. Nothing
//   limits what a process receives.
//
// Compression (compression_model.h), with every link model: a worker's batch first waits for its encoder (one per
// worker), then its pushes carry the compressed bytes; a server that recodes the scheme (top-k, signSGD) decodes each
// push as it arrives and encodes the sum once the round is complete, on one CPU per server, before the sums leave;
// the worker's batch is done its decode time after the last sum is in.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "simulator/compression_model.h"
#include "simulator/fabric.h"
#include "simulator/flow_net.h"
#include "simulator/network.h"

namespace commsched::sim {

// A message's time on a link of `bps`: bytes / rate in nanoseconds, rounded to the nearest, plus the link's fixed cost
// per message (PsParams::message_s; 0 on emulated links). The last answer is kept:
// one link's messages mostly have one size (a partition, a chunk, one sum to every worker in turn), and the division
// is a good part of a message's cost with hundreds of workers.
class WireTime {
 public:
  explicit WireTime(double bps, Nanos per_message = 0) : bps_(bps), per_message_(per_message) {}
  Nanos operator()(uint64_t bytes) const {
    if (bytes != bytes_) {
      bytes_ = bytes;
      ns_ = static_cast<Nanos>(std::llround(double(bytes) * 8e9 / bps_)) + per_message_;
    }
    return ns_;
  }

 private:
  double bps_;
  Nanos per_message_;
  mutable uint64_t bytes_ = ~uint64_t(0);
  mutable Nanos ns_ = 0;
};

// One process's sends: FIFO; paced by a token bucket, or a store-and-forward link.
class Sender {
 public:
  // `per_message`: the link's fixed cost per message (link model only; a paced sender's messages leave whole).
  Sender(double bps, double burst_bytes, bool paced, Nanos per_message = 0)
      : Bps_(bps / 8.0), burst_(burst_bytes), paced_(paced), wire_(Bps_ * 8.0, paced ? 0 : per_message) {}
  // A message of `bytes` queued at `ready` (calls in non-decreasing `ready`): when it starts to leave.
  // Paced: when it leaves whole; the bucket then owes `bytes`. Link: the link is busy until start + bytes / rate.
  Nanos send(Nanos ready, uint64_t bytes);
  // When a message queued at `ready` would start to leave (nothing is queued).
  Nanos start_of(Nanos ready) const;
  Nanos duration(uint64_t bytes) const { return wire_(bytes); }
  // Time spent moving bytes so far (link model: bytes / rate per message; paced: the same, at the bucket's rate).
  Nanos busy() const { return busy_; }
  // Link model only: the link is busy until `until` (a message that also waited for its receiver).
  void occupy_until(Nanos until) { free_at_ = std::max(free_at_, until); }
  bool paced() const { return paced_; }
  void reset() {
    free_at_ = 0;
    tokens_ = 0;
    busy_ = 0;
  }

 private:
  double Bps_;
  double burst_;
  bool paced_;
  WireTime wire_;
  Nanos free_at_ = 0;  // paced: when the last message left (FIFO); link: when the link frees up
  double tokens_ = 0;  // paced: the bucket's tokens (bytes) at free_at_, negative when in debt
  Nanos busy_ = 0;
};

// A receiver's downlink (link model): FIFO among the senders into it, with its busy time counted.
class Downlink {
 public:
  Nanos reserve(Nanos ready, Nanos duration) {
    busy_ += duration;
    return link_.reserve(ready, duration);
  }
  Nanos busy() const { return busy_; }

 private:
  Link link_;
  Nanos busy_ = 0;
};

class PsClusterFabric final : public Fabric {
 public:
  explicit PsClusterFabric(PsParams p, CompressionModel compression = {});
  int simulated_workers() const override { return p_.workers; }
  void start(EventLoop& loop, BatchSink& sink) override;
  Nanos dispatch(int worker, size_t id, const Batch& batch, Nanos now) override;
  LinkUse link_use(Nanos until) const override;
  Nanos min_push_ns(uint64_t bytes, uint64_t parts) const override;

 private:
  using ChunkKey = std::pair<int32_t, uint64_t>;  // key, offset
  struct ChunkHash {
    size_t operator()(const ChunkKey& k) const {
      return std::hash<uint64_t>()(k.second * 0x9E3779B97F4A7C15ull ^ uint32_t(k.first));
    }
  };
  struct Waiter {
    int worker;
    bool only;     // its batch's only message (see BatchState)
    size_t batch;  // the worker's batch its push belongs to
  };
  // A chunk (key, offset), numbered on first sight: its server, and what each push of it carries.
  struct Chunk {
    size_t server;
    uint64_t bytes;          // on the wire
    uint64_t dense;          // gradient bytes the server decodes (recoding schemes), else 0
    int32_t priority;        // its partition's (the server's reply order)
    std::vector<Waiter> waiting;  // the pushes of the current round that are in, in arrival order
  };
  // A message queued on a link-model sender, to start moving at `start` (its place among ties taken at enqueue).
  struct Outgoing {
    Nanos start;
    uint64_t turn;
    uint64_t bytes;
    uint32_t chunk;  // a push: the chunk; a sum: its chunk too (the sum's size)
    int worker;      // a push: from; a sum: to
    size_t batch;    // the worker's batch it belongs to
    bool only;       // the batch's only message (see BatchState)
  };
  struct Queue {
    Sender sender;
    std::deque<Outgoing> pending;  // link model: started in order, one start event on the loop at a time
  };
  // A server's ready reply: a receipt (bytes 0) or a sum, to `worker` for its batch `batch`.
  struct Reply {
    bool receipt;
    uint32_t chunk;
    int worker;
    size_t batch;
    bool only;  // the batch's one message (see Outgoing::only)
  };
  // A push arriving at its server at (at, turn).
  struct Arrival {
    Nanos at;
    uint64_t turn;
    uint32_t chunk;
    int worker;
    size_t batch;
    bool only;
  };
  // A batch's last receipt or last sum, due at (at, turn).
  struct Due {
    Nanos at;
    uint64_t turn;
    int worker;
    size_t batch;
  };
  // The batches whose last receipt one server sends, or whose last sum one worker's downlink delivers, in order.
  struct DueQueue {
    InOrder<Due> due;
    bool sums = false;  // what falls due: the batch's last sum (else its last receipt)
  };
  struct ServerState {
    Queue out;
    // Pushes on their way in, in order (with equal link rates a downlink's FIFO delivers in order; any other arrival
    // goes on the loop itself).
    InOrder<Arrival> arriving;
    uint64_t load = 0;  // bytes assigned (the Sharder's measure)
    Nanos cpu_free = 0; // when its decode and encode work so far is done (recoding schemes)
    DueQueue receipts = {};  // the batches whose last receipt this server sends, in the order they fall due
    ReplyOrder<Reply> ready{1};  // replies waiting for the send queue (PsParams::reply_overtakes > 0)
    bool send_posted = false;    // an event to send the next of them is on the loop
  };
  // Where a batch stands. With the link models a receipt's and a sum's arrival time are known before they happen, so
  // only the last of each is put on the loop: the latest (time, turn) so far is kept until every one is known.
  struct Latest {
    Nanos at = -1;
    uint64_t turn = 0;
    void take(Nanos t, uint64_t k) {
      if (t > at || (t == at && k > turn)) at = t, turn = k;
    }
  };
  // A batch of one message (most are: one partition of at most a chunk) keeps none: its receipt and its sum are
  // its last, and their messages say so (`only`), so they fall due without a look here, which with hundreds of
  // workers missed the cache on every message.
  struct BatchState {
    uint32_t receipts = 0, sums = 0;  // still to come (fair sharing) or to be known (link models)
    Latest last_receipt, last_sum;
    uint64_t gradient_bytes = 0;      // what the worker's decode stage handles once the sums are in
  };
  struct WorkerState {
    Queue up;
    Nanos encoder_free = 0;           // its encode stage (one encoder)
    DueQueue sums{{}, true};          // the batches whose last sum its downlink delivers, in the order they fall due
  };

  uint32_t chunk_id(int32_t key, uint64_t offset, uint64_t bytes, uint64_t dense);
  // How many messages dispatch sends for `batch` (`whole`: partitions are not cut into chunks).
  uint64_t messages_of(const Batch& batch, bool whole) const;
  // Worker `worker`'s push of `chunk` (batch `batch`) has arrived at the chunk's server.
  void on_push(uint32_t chunk, int worker, size_t batch, bool only);
  void send_sums(uint32_t chunk);
  // Whether a server's replies wait in its ReplyOrder (else each is queued on its sender as it becomes ready).
  bool ordered_replies() const { return p_.reply_overtakes > 0 && !flows_; }
  void queue_reply(size_t server, const Reply& r);
  void post_send(size_t server);  // send_replies once the server's sender can take a message
  // The server's link can take a message: sends its receipts and the next sum the rule picks.
  void send_replies(size_t server);
  // Queues a push (to_server) or a sum on `from` now; its arrival is handled by on_push or sum_known.
  // Returns when the message starts to leave.
  Nanos transmit(Queue& from, bool to_server, const Outgoing& m);
  void post_start(Queue& from, bool to_server);  // the link model's start event for the head of `from`
  void start_next(Queue& from, bool to_server);
  // Link model: `m` starts to leave `from` now; it arrives once the receiver's downlink has taken it too.
  void deliver(const Sender& from, bool to_server, const Outgoing& m);
  void arrive(bool to_server, const Outgoing& m, Nanos at);
  // A receipt (sent by `via`'s server) or a sum (arriving through `via`, the worker's downlink) will arrive at
  // (at, turn); the batch's event is posted once its last one is known.
  // `only`: the batch's only message.
  void receipt_known(int worker, size_t batch, bool only, Nanos at, uint64_t turn, DueQueue& via);
  void sum_known(int worker, size_t batch, bool only, Nanos at, uint64_t turn, DueQueue& via);
  // The batch's event at d: through `via` while it falls due in order there, else on the loop itself.
  void fall_due(DueQueue& via, const Due& d);
  void on_due(bool sum, int worker, size_t batch);
  void on_receipt(int worker, size_t batch);  // fair sharing: a receipt is in
  void on_sum(int worker, size_t batch);      // fair sharing: a sum is in
  void sums_in(int worker, size_t batch);     // the batch's last sum is in
  // fair_share: the flow network, its links (per process: up, then down) and connections, built by start().
  void build_flows(EventLoop& loop);
  int to_server(int worker, size_t server) const { return worker_conn_[size_t(worker) * servers_.size() + server]; }
  int to_worker(size_t server, int worker) const { return server_conn_[server * workers_.size() + size_t(worker)]; }

  PsParams p_;
  CompressionModel c_;
  Nanos latency_;
  Nanos message_ns_;  // PsParams::message_s where the link model charges it (FIFO links of real NICs), else 0
  WireTime into_server_, into_worker_;  // a message's time on a server's and on a worker's downlink
  EventLoop* loop_ = nullptr;
  BatchSink* sink_ = nullptr;
  std::vector<WorkerState> workers_;
  std::vector<ServerState> servers_;
  // Apart from the per-process state above, so that these small arrays, touched by every message, stay in the cache.
  std::vector<Downlink> worker_down_, server_in_;      // link model only
  std::vector<std::vector<BatchState>> batches_;       // per worker, per batch id
  std::unordered_map<ChunkKey, uint32_t, ChunkHash> chunk_ids_;
  std::vector<Chunk> chunks_;
  std::unique_ptr<FlowNet> flows_;
  std::vector<int> worker_links_, server_links_;  // per process: its uplink id, then its downlink id
  std::vector<int> worker_conn_, server_conn_;    // worker -> server and server -> worker connections
};

}  // namespace commsched::sim
