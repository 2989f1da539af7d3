// Worker side of the parameter server: a CommBackend for push_pull (push a partition, get the sum of all workers in
// the same round trip) and broadcast (rank `root` sends, everybody receives; for initial parameters).
//
// One I/O thread owns the transport; start() only queues and wakes it, so it never blocks. Partitions are sent
// zero-copy from the task's buffer and the answer is written back in place: where the transport can (UCX), it lands
// there directly (a PayloadSink: no copy after the transport's own); otherwise it is copied from the delivered frame. Which server owns a partition
// (key, offset) is asked once of the root's Sharder and cached, so every worker agrees.
// The worker is a protocol on the control plane (comm_backends/control/van.h), which does the rendezvous, heartbeats,
// peer loss and goodbye. When a server is lost (connection closed, or silent for COMMSCHED_TIMEOUT), or a server
// reports a lost peer, every in-flight and later batch fails with Status::Code::peer_lost and a message naming it.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/comm_backend.h"
#include "comm_backends/control/van.h"
#include "comm_backends/ps/buffer_pool.h"
#include "comm_backends/ps/protocol.h"
#include "comm_backends/ps/ps_config.h"
#include "comm_backends/ps/transport.h"
#include "comm_backends/straggler.h"

namespace commsched {

class PsBackend final : public CommBackend, private control::VanProtocol, private RankJoin, private StragglerReport {
 public:
  // Connects to the cluster described by `env` (a worker) and waits for the rendezvous. Throws std::runtime_error
  // naming the root and the reason when it fails or times out; InvalidArgument for a bad configuration.
  PsBackend(const ClusterEnv& env, const PsConfig& cfg);
  ~PsBackend() override;

  std::string_view name() const override { return "ps"; }
  int rank() const override { return env_.rank; }
  int size() const override { return env_.num_workers; }
  // reports_sent, joins, stragglers, and the encoded schemes the servers decode and sum (sync mode).
  BackendCapabilities capabilities() const override { return caps_; }
  // Hierarchical mode (comm_backends/hierarchical): from now on every push_pull is a lane, one machine's slice that
  // one worker per machine pushes, summed over `machines` contributors instead of every worker (ps::kFlagLane).
  // Broadcasts stay whole-cluster. Call before the first start().
  void set_lane_contributors(uint32_t machines) { lane_contributors_ = machines; }
  // Says goodbye to every server (so they may exit 0) and stops once each has answered it (at most COMMSCHED_TIMEOUT);
  // answers arriving before that complete their batches, the others are cancelled. Do not call from a `done` callback.
  void shutdown() override;

 private:
  // `sent` fires when a server has received every byte of the batch (a `received` message per request), which is
  // before the sum: the other workers' pushes are not waited for.
  void do_start(std::vector<PartitionView> batch, BatchDone sent, BatchDone done) override;
  // RankJoin: tells every server this worker has joined (they stand in for it with zeros) and waits until each says
  // every worker has; returns the rank that joined last (as server 0 saw it). Throws std::runtime_error when the
  // backend fails or stops meanwhile. No time limit: the others may train for long; a lost peer still ends it.
  int join() override;
  // StragglerReport: the servers' latest lag reports, merged (MsgType::lags).
  std::vector<Straggler> stragglers() const override;

  using Clock = std::chrono::steady_clock;
  struct BatchState {
    BatchDone done;
    BatchDone sent;          // empty: not asked for, or already called
    size_t remaining = 0;    // requests not yet answered
    size_t unreceived = 0;   // requests whose `received` has not come yet (only when `sent` was asked for)
    Status status;
  };
  struct Request {
    std::shared_ptr<BatchState> batch;
    PartitionView part;
    bool received = false;
    int server = -1;       // where the request went (-1: waiting for its owner)
    // The transport may be writing this request's answer into the tensor (the sink chose it). Until that answer is
    // delivered the request is never completed on its own: only after the transport has closed (finish_*).
    bool landing = false;
    // A push_pull_batch: these partitions (two or more; `part` is the first) travel in one message each way.
    std::vector<PartitionView> fused = {};
  };
  struct Queued {
    std::vector<PartitionView> batch;
    BatchDone sent;
    BatchDone done;
  };
  enum class State { connecting, ready, failed, stopped };

  // Made once, in the constructor (dispatch() asks supports() of every partition).
  BackendCapabilities make_capabilities();

  // control::VanProtocol (on the I/O thread)
  void on_message(ps::PeerId from, const control::Roster::Member& sender, const ps::Header& h,
                  std::unique_ptr<ps::Payload> payload) override;
  void on_ready() override;
  void on_failed(const Status& status) override;

  void io_main();
  void on_assignment(const ps::Header& h);
  void on_answer(int server, const ps::Header& h, std::unique_ptr<ps::Payload> payload);
  void on_batch_answer(int server, const ps::Header& h, std::unique_ptr<ps::Payload> payload);
  // Whether a partition may share a push_pull_batch: a small plain synchronous push_pull.
  bool batchable(const PartitionView& p) const;
  // The pieces of a batch as requests: runs of batchable pieces for one known server become push_pull_batches.
  std::vector<std::vector<PartitionView>> group_requests(std::vector<PartitionView> pieces) const;
  int known_owner(const PartitionView& p) const;
  void send_batch(uint64_t id, int server);
  // The PayloadSink (I/O thread): the tensor range of the in-flight request a well-formed answer of the right size
  // from the right server belongs to; nullopt otherwise (the answer goes through the transport's buffer and
  // on_answer's checks, as without a sink).
  std::optional<std::span<std::byte>> landing_for(ps::PeerId peer, std::span<const std::byte> header, size_t bytes);
  void dispatch_queued();
  void dispatch(Queued& q);
  void on_received(int server, const ps::Header& h);
  // Whether `server` is the one request `id` went to; fails the backend naming both when not.
  bool from_server_asked(int server, uint64_t id, const Request& r, const char* verb);
  void send_join_if_asked();
  void on_joined(int server, const ps::Header& h);
  void on_lags(int server, const ps::Payload* payload);
  void mark_received(Request& r);
  void send_request(uint64_t id, int server);
  void complete(uint64_t id, const Status& st);
  void fail_all(const Status& st) { van_->fail(st); }
  void finish_failed();
  void finish_stopped();
  ps::Header header(ps::MsgType t) const { return van_->header(t); }
  std::string server_name(int s) const;

  ClusterEnv env_;
  PsConfig cfg_;
  BackendCapabilities caps_;
  uint32_t lane_contributors_ = 0;  // 0: push_pulls are summed over every worker
  std::unique_ptr<ps::Transport> transport_;
  std::unique_ptr<collective::Rendezvous> rendezvous_;  // the store the Van found the servers in
  std::unique_ptr<control::Van> van_;  // drives transport_ on the I/O thread

  // Shared with callers of start()/shutdown().
  std::mutex mu_;
  std::condition_variable state_cv_;
  State state_ = State::connecting;
  bool stopping_ = false;
  Status failure_;
  std::deque<Queued> queue_;
  bool join_asked_ = false;  // join() waits: the I/O thread sends the joins
  bool join_done_ = false;   // every server answered `joined`
  int join_last_ = -1;       // as server 0 reported it
  mutable std::mutex lags_mu_;
  StragglerBoard lags_;      // by server

  // I/O thread only.
  std::deque<Queued> failed_queue_;              // taken from queue_ on failure, failed once the transport is closed
  std::unordered_map<uint64_t, Request> inflight_;
  std::map<std::pair<uint64_t, uint64_t>, int> owner_;                   // (key, offset) -> server
  std::map<std::pair<uint64_t, uint64_t>, std::vector<uint64_t>> parked_;  // awaiting an owner
  uint64_t next_request_ = 1;
  // push_pull_batch messages are built here: after the first rounds no batch allocates (released by the transport).
  std::shared_ptr<ps::BufferPool> batch_buffers_ = ps::BufferPool::create();
  int joined_answers_ = 0;                       // servers that answered this join so far
  std::thread io_;
};

}  // namespace commsched
