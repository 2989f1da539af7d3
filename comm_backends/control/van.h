// The control plane of the parameter server (as ps-lite's Van): over any `Transport`, it does the rendezvous, the
// heartbeats, peer-loss detection and propagation, the goodbye barrier and the handling of malformed messages, once,
// for the server and the worker alike. They are protocols on top: every other message (push_pull, sums, sharding,
// join) passes through to them, from a member whose identity the Van has checked.
//
// Rendezvous (README.md) goes through the job's rendezvous store (control::Store; server 0's process serves it at
// COMMSCHED_ROOT_ADDR:COMMSCHED_ROOT_PORT): every server binds an ephemeral port and publishes the endpoint it
// advertises under "<scope>server/<rank>"; servers 1..S-1 first read server 0's and dial it, workers read every
// server's and dial them all. A dialing node says hello on each connection (its role, rank and settings), so the
// transport's connection gets its member; the Roster admits each rank once. Server 0 is ready once every worker and
// server has said hello and then publishes "<scope>assembled"; a worker is ready once it reads that key (so nobody
// talks to a server before the whole job has come), a server >= 1 once every worker has said hello to it. Ranks come
// from the environment contract (COMMSCHED_RANK). The store proves the run's secret both ways before any key is read
// or written (collective/link_auth.h); a peer's connection is authenticated by the transport
// (TransportOptions::auth_secret) before any of its messages reaches the Van.
//
// Liveness (comm_backends/liveness.h): every connection carries a ping each heartbeat in both directions; a member is
// lost when its connection ends with no goodbye within the grace, or it is silent for COMMSCHED_TIMEOUT. The node that
// notices tells every member it still expects (`peer_lost` naming the lost one) and fails; a node told so fails too and
// passes it on to its other members, so the news reaches every survivor in one or two hops and names the same peer,
// with the first node that reported it (the rule and the message are control::LossRelay's, shared with the collective
// negotiator). Goodbyes are counted by control::GoodbyeBarrier, shared likewise.
//
// Goodbye: a leaving node says bye to every member it still expects, and a node told bye answers with its own (unless
// it said bye first). The leaving node closes only once each has answered, its connection has ended, or
// COMMSCHED_TIMEOUT has passed. Closing earlier could lose the bye: a connection closed while the peer's traffic is
// still arriving (the answers to requests in flight) is reset, and what is still queued on it, the bye last, is
// thrown away (the kernel drops unsent TCP data on a close with unread input; ZeroMQ's linger does not cover that).
//
// Malformed input: a member that sends a malformed or unexpected message fails the node (and the cluster, through
// peer_lost). A connection that is not a member (a stranger, a port scanner, a bad hello) gets an error reply, is
// logged and ignored from then on; the others are still served.
//
// Threading: one thread drives the Van (poll, send, leave); only the transport's wake() may be called elsewhere.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/types.h"
#include "comm_backends/cluster_env.h"
#include "comm_backends/control/goodbye_barrier.h"
#include "comm_backends/control/loss_relay.h"
#include "comm_backends/control/roster.h"
#include "comm_backends/control/store.h"
#include "comm_backends/liveness.h"
#include "comm_backends/ps/protocol.h"
#include "comm_backends/ps/transport.h"

namespace commsched::control {

struct VanOptions {
  PeerRole role = PeerRole::worker;  // worker or server
  uint32_t rank = 0;
  int num_workers = 1;
  int num_servers = 1;
  std::string store_scope = "ps/";  // prefix of this job's keys in the rendezvous store
  // Servers: the host to bind (an address, an interface name, '*') and the host to advertise.
  std::string bind_host;
  std::string advertised_host;
  double heartbeat_s = 0.25;         // COMMSCHED_PS_HEARTBEAT (0: liveness.h's automatic interval)
  double timeout_s = 10;             // COMMSCHED_TIMEOUT
  double rendezvous_timeout_s = 120;
  // When this node's rendezvous began (it waited for the store before the Van starts): the timeout counts from it.
  // Unset: from start().
  std::chrono::steady_clock::time_point rendezvous_began{};
  uint64_t max_message_bytes = 0;    // decode limit of data ranges
  std::function<void(const std::string&)> log;  // dropped connections (the others are still served)
  // Settings every process of the job must share (the PS mode), carried in each hello: a member whose hello differs
  // fails the rendezvous (and is told), named with both settings as `describe_settings` words them.
  uint32_t settings = 0;
  std::function<std::string(uint32_t)> describe_settings;

  // The environment contract's part (role, rank, sizes, bind and advertised hosts, COMMSCHED_TIMEOUT).
  static VanOptions from(const ClusterEnv& env);
};

// A text payload (an error, a loss report) as a string ("" without one).
std::string payload_text(const ps::Payload* p);

// What a protocol on top of the Van sees.
class VanProtocol {
 public:
  virtual ~VanProtocol() = default;
  // A protocol message from a member (never hello, ping, bye or peer_lost: the Van's own).
  virtual void on_message(ps::PeerId from, const Roster::Member& sender, const ps::Header& h,
                          std::unique_ptr<ps::Payload> payload) = 0;
  // The rendezvous is complete: every member this node talks to is known (worker: every server dialed, and the
  // whole job has come).
  virtual void on_ready() {}
  // Called once when this node fails (a lost peer, a report of one, malformed input, a rendezvous timeout); the
  // survivors have been told. The Van closes the transport right after this returns, so do not release callers'
  // buffers here: do that once poll() has returned false.
  virtual void on_failed(const Status& status) = 0;
};

class Van {
 public:
  // `store` is the job's rendezvous store; it must outlive the Van.
  Van(VanOptions opts, ps::Transport& transport, VanProtocol& protocol, Store& store);

  // Binds (servers), reads the endpoints this node dials from the store (waiting for them at most
  // COMMSCHED_PS_RENDEZVOUS_TIMEOUT), dials them and says hello, and publishes its own (servers). Returns the
  // endpoint this node advertises ("" for workers). Throws std::runtime_error when the bind fails; a server that
  // does not publish in time, or a store that fails, fails the node (on_failed names it) instead.
  std::string start();
  // One round of the control loop: waits at most `max_wait` for an event and handles it, judges liveness, sends the
  // heartbeats that are due. False once the node has failed (the transport is closed then).
  bool poll(std::chrono::milliseconds max_wait);
  // Goodbye: says bye to every member still expected to speak, waits (at most COMMSCHED_TIMEOUT) until each has
  // answered bye or its connection has ended, handling what arrives meanwhile as poll() does, then closes the
  // transport. Leaving is not failing: a member that does not answer is only not waited for any longer.
  void leave();

  bool ready() const { return ready_; }
  // The heartbeat interval (comm_backends/liveness.h's rule): how long a protocol's loop may wait in poll().
  std::chrono::milliseconds heartbeat() const { return heartbeat_; }
  bool failed() const { return relay_.stopped(); }
  // The goodbye barrier: every member of `role` has said bye (after the rendezvous).
  bool all_left(PeerRole role) const;
  // The connection of a member (0: not connected).
  ps::PeerId peer(PeerRole role, uint32_t rank) const { return roster_.id_of({role, rank}); }
  // Connections of every member of `role`, in rank order.
  const std::vector<ps::PeerId>& peers(PeerRole role) const { return roster_.ids(role); }
  // "worker 2 (127.0.0.1:4711)" for logs and errors.
  std::string name(ps::PeerId peer) const;

  void send(ps::PeerId peer, const ps::Header& h, ps::OutPayload payload = {});
  void send_text(ps::PeerId peer, const ps::Header& h, std::string text);
  // A header of type `t` from this node.
  ps::Header header(ps::MsgType t) const { return ps::make_header(t, opts_.role, opts_.rank); }

  // The protocol found a message from `peer` against its rules: a member fails the node, a stranger is dropped.
  void malformed(ps::PeerId peer, const std::string& why);
  // Fails the node (telling every member still expected, except `culprit`) with `status`. Idempotent.
  void fail(const Status& status, ps::PeerId culprit = 0);
  ps::Transport& transport() { return transport_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string key(const std::string& name) const { return opts_.store_scope + name; }
  // Server `rank`'s endpoint from the store, waiting until `deadline`; none once the node has failed (naming it).
  std::optional<std::string> endpoint_of(uint32_t server, Deadline deadline);
  void dial(uint32_t server, const std::string& endpoint);
  void publish(const std::string& name, const std::string& value);
  void store_failed(const std::exception& e);
  void check_assembled(Clock::time_point now);
  Status rendezvous_timeout(const std::string& waiting_for) const;
  ps::Header hello() const;
  void check_settings(ps::PeerId id, const ps::Header& h);
  void handle(ps::Incoming& in);
  void on_member_message(ps::PeerId id, const Roster::Member& m, const ps::Header& h, std::unique_ptr<ps::Payload> p);
  void on_hello(ps::PeerId id, const ps::Header& h);
  void maybe_ready();
  void drop(ps::PeerId id, const std::string& why);
  void watch(ps::PeerId id, Clock::time_point heard);
  void lost(ps::PeerId id, const std::string& why);
  void stop(std::optional<LossRelay::Verdict> verdict, Status::Code code);
  void tick(Clock::time_point now);
  void log(const std::string& line) const;

  VanOptions opts_;
  ps::Transport& transport_;
  VanProtocol& protocol_;
  Store& store_;
  Roster roster_;
  Liveness live_;
  GoodbyeBarrier bye_;  // every member is awaited; a member that said bye is no longer watched by live_
  LossRelay relay_;     // failed once it has stopped
  std::unordered_set<ps::PeerId> dropped_;  // strangers: ignored from now on
  std::chrono::milliseconds heartbeat_;
  Clock::time_point started_;
  Clock::time_point next_tick_;
  // Workers: when to look for "assembled" next (backing off, so a long wait costs the store little).
  Clock::time_point next_store_check_;
  std::chrono::milliseconds store_backoff_{1};
  bool ready_ = false;
};

}  // namespace commsched::control
