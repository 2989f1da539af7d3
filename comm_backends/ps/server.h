// The parameter server process: rendezvous root (rank 0), shard assignment (rank 0), summation, liveness.
//
// Rendezvous (documented in README.md): server 0 binds COMMSCHED_ROOT_PORT and is the root. Servers 1..S-1 bind an
// ephemeral port, connect to the root and say hello with their endpoint. Workers connect to the root and say hello;
// once every server and worker has, the root sends each worker the list of server endpoints. Workers then connect to
// every other server. Every connection carries heartbeats both ways; a lost peer stops every process.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/liveness.h"
#include "comm_backends/ps/lag_tracker.h"
#include "comm_backends/ps/ps_config.h"
#include "comm_backends/ps/sharder.h"
#include "comm_backends/ps/slot_table.h"
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

class Server {
 public:
  Server(const ClusterEnv& env, const PsConfig& cfg, std::unique_ptr<Transport> transport);
  int run();
  // Called once, on the server's thread, when the server fails (after the error is logged).
  void on_failure(std::function<void()> hook) { failure_hook_ = std::move(hook); }
  // How the transport authenticates peers, for the log ("" : not at all).
  void set_authentication(std::string how) { authentication_ = std::move(how); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Peer {
    PeerRole role = PeerRole::worker;
    uint32_t rank = 0;
  };

  void setup();
  void handle(Incoming& in);
  void on_message(PeerId id, const Header& h, std::unique_ptr<Payload> payload);
  Peer* register_peer(PeerId id, const Header& h);
  void on_hello(PeerId id, const Header& h, const std::string& text);
  void maybe_finish_rendezvous();
  void on_assign(PeerId id, const Header& h);
  void on_data(PeerId id, const Header& h, std::unique_ptr<Payload> payload);
  void on_join(uint32_t worker);
  void send_outcome(Outcome& o);
  void drop_peer(PeerId id, const std::string& why);
  void tick();
  void lose(const std::string& who_and_why, PeerId except);
  bool all_workers_left() const;
  Header header(MsgType t) const;
  void log(const std::string& line) const;
  std::string name_of(PeerId id) const;

  ClusterEnv env_;
  PsConfig cfg_;
  std::unique_ptr<Transport> transport_;
  std::shared_ptr<BufferPool> pool_;
  Summer summer_;
  SlotTable slots_;
  Sharder sharder_;
  std::string endpoint_;                       // what we advertise
  PeerId root_ = 0;                            // our connection to the root (servers >= 1)
  std::unordered_map<PeerId, Peer> peers_;
  Liveness live_;                              // of every peer in peers_
  std::unordered_set<PeerId> dropped_;         // foreign or malformed connections: ignored from now on
  std::vector<std::string> server_endpoints_;  // root: by rank (0 unused)
  std::vector<PeerId> worker_peer_;            // by rank
  bool rendezvous_done_ = false;
  bool failed_ = false;
  std::string authentication_;
  std::string failure_;
  std::function<void()> failure_hook_;
  Clock::time_point next_tick_;
  std::vector<Outcome> outcomes_;
  // Slow-but-live workers: named in a warning once they hold the others back kLagWarningS or more (every kLagRepeat).
  static constexpr double kLagWarningS = 1.0;
  static constexpr std::chrono::seconds kLagRepeat{5};
  void warn_laggards(Clock::time_point now);
  LagTracker lag_;
  std::vector<Clock::time_point> lag_warned_;  // by worker rank
};

}  // namespace ps
}  // namespace commsched
