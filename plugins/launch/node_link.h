// The control channel between the launchers of a multi-node `commsched launch` (no ssh: every node runs its own
// launcher). The launchers meet as every other group does (comm_backends/control/store.h): node 0's launcher serves a
// rendezvous store at --root HOST:PORT and publishes there the port of its link listener; every other launcher reads
// it from the store and dials the link. The store and the link each prove the run's secret both ways (LinkAuth:
// "store", then "node link"), so neither a stranger nor another run's launcher can read the link's address, join,
// start or stop the run; a stranger is refused with its address logged. The link then carries lines of text:
//
//   node -> root   HELLO <node> <w> <s>  joined (once per node rank) with its share: w workers and s servers
//   root -> nodes  GO <w:s,...> <k=v>\t<k=v>...
//                                        everyone joined: start; every node's share in node order (a node's ranks
//                                        follow those of the nodes before it), the root's environment for every child
//   node -> root   WDONE <node>          this node's workers all exited 0
//   root -> nodes  WALLDONE              every node's workers are done (servers may now be expected to leave)
//   node -> root   DONE <node>           every process of this node exited 0; the node's launcher leaves
//   any  -> any    ABORT <node> <why>    tear down (the root relays it to every other node)
//   any  -> any    PING                  a heartbeat, when this launcher said nothing for an interval
//
// The link is authenticated, not encrypted (the GO environment holds no secret: every node brings its own). The link
// stays a socket of its own rather than keys in the store: a connection that closes before its DONE (a launcher
// killed, a host gone) counts at once as an abort from that node, and so does a launcher silent for the join's
// silence limit (a hung or unreachable host; comm_backends/liveness.h's rule).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm_backends/control/socket.h"
#include "comm_backends/liveness.h"
#include "plugins/launch/node_link_lines.h"

namespace commsched {

struct LinkEvent {
  // node_lost: only where lost nodes are survived (NodeLink::survive_lost_nodes), on node 0.
  enum class Kind { abort, all_workers_done, all_done, node_lost } kind;
  std::string message;
  int node = -1;  // node_lost: which
};

class NodeLink {
 public:
  // Root (node 0): serves the rendezvous store at host:port, publishes its link there and waits for nnodes-1 HELLOs,
  // then sends GO with `env` to all. `secret` (empty: none) is what every node proves and checks on the store and on
  // the link; a node and a root that disagree on having one fail with an error naming the switches.
  // Other nodes: find the link through the store (retrying while node 0 starts), say HELLO and wait for GO; `env`
  // receives the root's environment. Both throw
  // std::runtime_error naming the address, the missing nodes or the peer when the join does not complete within
  // timeout_s. After the join, with silence_s > 0, every launcher sends PING when it said nothing for
  // heartbeat_interval(silence_s), and poll() reports a node silent for silence_s as an abort naming it.
  // `share`: what this node starts; shares() then holds every node's.
  static std::unique_ptr<NodeLink> join(int nnodes, int node_rank, const node_link::Share& share,
                                        const std::string& host, int port,
                                        std::map<std::string, std::string>& env, double timeout_s,
                                        const std::string& secret, double silence_s = 0);
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  // Every node's share, in node order (known once join returns).
  const std::vector<node_link::Share>& shares() const { return shares_; }

  // Reads what arrived (waits at most timeout_ms); returns at most one event per call.
  std::optional<LinkEvent> poll(int timeout_ms);
  void workers_done();             // this node's workers exited 0
  void done();                     // this node's processes all exited 0
  void abort(const std::string& why);
  // Elastic runs, node 0: a node whose launcher is lost (closed, silent) is reported as node_lost and counted as
  // finished instead of aborting the run (its workers die with their launcher; the survivors re-form without them).
  void survive_lost_nodes() { survive_lost_nodes_ = true; }

 private:
  struct Peer {
    control::Fd fd;
    int node = -1;
    std::string inbox;
    bool done = false;
    bool workers_done = false;
  };
  using Clock = std::chrono::steady_clock;
  NodeLink(int nnodes, int node_rank) : nnodes_(nnodes), node_rank_(node_rank) {}
  void accept_nodes(const std::string& host, int port, const std::map<std::string, std::string>& env,
                    const std::string& secret, double timeout_s, Clock::time_point deadline);
  // What a proven connection's HELLO says, or nullopt (told why and logged) when it sends none.
  static std::optional<node_link::Hello> read_hello(Peer& peer, Clock::time_point deadline);
  static Peer dial_root(const node_link::Hello& hello, const std::string& host, int port, const std::string& secret,
                        double timeout_s,
                        Clock::time_point deadline);
  void send(Peer& p, const std::string& line);
  void broadcast(const std::string& line, int except_node = -1);
  std::optional<LinkEvent> handle_line(Peer& from, const std::string& line);
  std::optional<LinkEvent> drain(Peer& p);  // handles the complete lines in p's inbox
  // Closes p's connection and aborts the run (node 0 tells the others first), naming p's node and `why`.
  LinkEvent lose(Peer& p, const std::string& why);
  std::optional<LinkEvent> root_progress();
  void watch_peers(double silence_s);
  // A heartbeat when one is due; a peer silent past the limit is lost.
  std::optional<LinkEvent> keep_alive();

  int nnodes_;
  int node_rank_;
  control::Fd listener_;
  std::vector<Peer> peers_;   // root: one per other node; others: the root
  std::vector<node_link::Share> shares_;
  bool my_workers_done_ = false;
  bool my_done_ = false;
  bool walldone_sent_ = false;
  bool all_done_reported_ = false;
  bool survive_lost_nodes_ = false;
  std::optional<Liveness> live_;  // none: only a closed connection counts
  std::chrono::milliseconds heartbeat_{0};
  Clock::time_point last_sent_{};
};

// Splits "HOST:PORT"; throws InvalidArgument naming the value.
std::pair<std::string, int> parse_host_port(const std::string& s);

}  // namespace commsched
