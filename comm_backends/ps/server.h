// The parameter server process: shard assignment (rank 0) and summation, a protocol on the control plane
// (comm_backends/control/van.h), which does the rendezvous (server 0 is the root), heartbeats, peer loss and the
// goodbye barrier: the server exits 0 once every worker has said bye, 1 when the Van fails.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/control/van.h"
#include "comm_backends/ps/async_table.h"
#include "comm_backends/lag_tracker.h"
#include "comm_backends/ps/ps_config.h"
#include "comm_backends/ps/reply_queue.h"
#include "comm_backends/ps/sharder.h"
#include "comm_backends/ps/slot_table.h"
#include "comm_backends/ps/sum_engine.h"
#include "comm_backends/ps/transport.h"

namespace commsched {

// Runs a server until every worker has said goodbye (returns 0) or a peer is lost or fails (returns 1, after logging
// an error naming the peer to stderr). Configuration errors throw InvalidArgument.
// owns_process: the caller is a server process's main (`commsched server`). Then, once the server has failed, the
// process is ended with exit status 1 if it has not exited 5 s later: a failed server must never linger (a survivor
// of a lost peer once stayed up in the kill test, its shutdown stuck; logged when it happens). One cause of a stuck
// shutdown is known and fixed: zmq_ctx_term() waiting forever for a connection whose peer vanished while we closed
// (see set_linger in zmq_transport.cc); this is the last line of defence for any other.
int run_server(const ClusterEnv& env, const PsConfig& cfg, bool owns_process = false);

namespace ps {

class Server final : public control::VanProtocol {
 public:
  Server(const ClusterEnv& env, const PsConfig& cfg, std::unique_ptr<Transport> transport);
  int run();
  // Called once, on the server's thread, when the server fails (after the error is logged).
  void on_failure(std::function<void()> hook) { failure_hook_ = std::move(hook); }
  // How the transport authenticates peers, for the log ("" : not at all).
  void set_authentication(std::string how) { authentication_ = std::move(how); }

 private:
  using Clock = std::chrono::steady_clock;

  // control::VanProtocol
  void on_message(PeerId id, const control::Roster::Member& sender, const Header& h,
                  std::unique_ptr<Payload> payload) override;
  void on_ready() override;
  void on_failed(const Status& status) override;

  void on_assign(PeerId id, const Header& h);
  void on_data(PeerId id, const Header& h, std::unique_ptr<Payload> payload);
  void on_batch(PeerId id, const Header& h, std::unique_ptr<Payload> payload);
  void ack_receipt(PeerId id, const Header& h);
  // One entry of an open batch is answered; the batch's one answer goes once every entry is.
  void batch_entry_done(const Waiter& w, const Outcome& o);
  struct OpenBatch;
  void answer_batch(PeerId peer, const OpenBatch& b);
  void on_join(uint32_t worker);
  void send_outcome(Outcome& o);
  // Sends the answers in outcomes_, then those the engine's threads have made meanwhile.
  void send_outcomes();
  void log(const std::string& line) const;

  ClusterEnv env_;
  PsConfig cfg_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<collective::Rendezvous> rendezvous_;  // server 0 serves it; the Van publishes our endpoint there
  control::Van van_;
  std::shared_ptr<BufferPool> pool_;
  Summer summer_;
  // Broadcasts and every push_pull of a sync run (its SlotTables); gradients (kFlagAsync) of an async or ssp run (its
  // AsyncTables). After transport_: its threads end (stop) before the transport goes.
  SumEngine engine_;
  // Receipts, sums, batch answers and `joined`, most urgent first (errors, lags and heartbeats go at once). Declared
  // after the transport and the Van, so destroyed before them (the transport may release payloads while it closes).
  ReplyQueue replies_;
  Sharder sharder_;
  std::string authentication_;
  std::function<void()> failure_hook_;
  std::vector<Outcome> outcomes_;
  // push_pull_batch requests not answered yet, by (worker, request id): their entries' sums as they become due.
  struct OpenBatch {
    Header request;
    std::vector<BatchEntry> entries;
    std::vector<std::shared_ptr<const std::byte>> sums;  // by entry
    size_t remaining = 0;
    std::string error;  // the first entry's error: the whole batch is answered with it
  };
  std::map<std::pair<PeerId, uint64_t>, OpenBatch> batches_;
  // Slow-but-live workers: named in a warning once they hold the others back kLagWarningS or more (every kLagRepeat).
  static constexpr double kLagWarningS = 1.0;
  static constexpr std::chrono::seconds kLagRepeat{5};
  void warn_laggards(Clock::time_point now);
  void report_lags(Clock::time_point now);
  // Logs the rounds some workers pushed and others have not, and fails those past COMMSCHED_STALL_SHUTDOWN.
  void check_stalls(Clock::time_point now);
  bool lags_reported_ = false;  // the last report named somebody
  LagTracker lag_;
  std::vector<Clock::time_point> lag_warned_;  // by worker rank
  Clock::time_point next_lag_check_;
  StallWatch stall_watch_;
};

}  // namespace ps
}  // namespace commsched
