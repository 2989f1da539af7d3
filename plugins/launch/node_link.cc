#include "plugins/launch/node_link.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <stdexcept>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/collective/link_auth.h"
#include "comm_backends/control/socket.h"
#include "plugins/launch/node_link_lines.h"
#include "scheduler/config.h"
#include "base/types.h"

namespace commsched {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Bounds a send to a launcher that stopped reading: the send fails and the next poll() finds the peer lost.
constexpr double kSendTimeoutS = 10.0;

std::string address(const std::string& host, int port) { return host + ":" + std::to_string(port); }

std::chrono::milliseconds left_ms(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

// The name that keys the link's proofs (a proof made for the store is worthless here).
constexpr const char* kLinkName = "node link";

// Reads one line from fd into `inbox` within the deadline; returns false at EOF, at timeout and when the peer sends
// more than a line may hold (before the handshake anyone may connect: what they send is not kept without bound).
bool read_line(int fd, std::string& inbox, std::string& line, Clock::time_point deadline) {
  for (;;) {
    if (node_link::take_line(inbox, line)) return true;
    if (node_link::overlong(inbox)) return false;
    if (!control::wait_readable(fd, deadline)) return false;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    inbox.append(buf, static_cast<size_t>(n));
  }
}

// A peer that is gone is not judged here: poll() reports it as lost.
void write_all(int fd, const std::string& s) { control::send_bytes(fd, s); }

}  // namespace

std::pair<std::string, int> parse_host_port(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InvalidArgument("--root '" + s + "': expected HOST:PORT (node 0's address and a free port)");
  const int port = static_cast<int>(parse_int("--root", s.substr(colon + 1), 1, 65534));
  return {s.substr(0, colon), port};
}

// Who a connection that proved the run's secret (any, when the run has none) says it is. One that sends no HELLO
// (silence, garbage, a line without end) is told why, logged with its address and dropped: it cannot stop or join
// the run. Returns -1 then.
std::optional<node_link::Hello> NodeLink::read_hello(Peer& peer, Clock::time_point deadline) {
  // A silent stranger holds the join for at most a few seconds, not the whole join timeout.
  const auto until = std::min(deadline, Clock::now() + std::chrono::seconds(5));
  std::string line;
  const bool said = read_line(peer.fd.get(), peer.inbox, line, until);
  const auto hello = said ? node_link::parse_hello(line) : std::nullopt;
  if (hello) return hello;
  const std::string refusal =
      !said && node_link::overlong(peer.inbox)
          ? "it sent more than a line may hold (" + std::to_string(node_link::kMaxLineBytes) + " bytes) without a newline"
          : std::string("it sent no HELLO naming its node rank and share");
  const std::string who = "a launcher at " + control::peer_address(peer.fd.get());
  std::fprintf(stderr, "[commsched launch] node 0 refused %s: %s\n", who.c_str(), refusal.c_str());
  write_all(peer.fd.get(), "ABORT 0 node 0 refused this launcher: " + refusal + "\n");
  return std::nullopt;
}

// A node: node 0's link from the store, dialled, proven both ways and greeted with this node's HELLO.
NodeLink::Peer NodeLink::dial_root(const node_link::Hello& hello, const std::string& host, int port,
                                   const std::string& secret, double timeout_s, Clock::time_point deadline) {
  const std::string root = address(host, port);
  int link_port = 0;
  try {
    collective::TcpStoreClient store(host, port, left_ms(deadline), secret);
    const std::string value = store.get(node_link::kLinkKey, deadline);
    link_port = static_cast<int>(parse_int(std::string("the store's ") + node_link::kLinkKey, value, 1, 65535));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("launch: node " + std::to_string(hello.node) + " could not join node 0 at " + root + " (" +
                             e.what() + "; join timeout " + std::to_string(static_cast<int>(timeout_s)) + " s)");
  }
  Peer peer;
  peer.node = 0;
  const std::string link = "launch: node 0's link at " + address(host, link_port);
  peer.fd = control::connect_tcp(host, link_port, deadline);
  control::tune_control_socket(peer.fd.get(), kSendTimeoutS);
  collective::LinkAuth(secret, kLinkName).prove(peer.fd.get(), deadline, link);
  write_all(peer.fd.get(), node_link::hello_line(hello) + "\n");
  return peer;
}

std::unique_ptr<NodeLink> NodeLink::join(int nnodes, int node_rank, const node_link::Share& share,
                                         const std::string& host, int port,
                                         std::map<std::string, std::string>& env, double timeout_s,
                                         const std::string& secret, double silence_s) {
  std::unique_ptr<NodeLink> link(new NodeLink(nnodes, node_rank));
  const auto deadline = deadline_after(timeout_s);
  link->shares_.assign(static_cast<size_t>(nnodes), node_link::Share{});
  link->shares_[0] = share;
  if (node_rank == 0) {
    link->accept_nodes(host, port, env, secret, timeout_s, deadline);
    link->watch_peers(silence_s);
    return link;
  }
  Peer root = dial_root({node_rank, share}, host, port, secret, timeout_s, deadline);
  std::string line;
  if (!read_line(root.fd.get(), root.inbox, line, deadline) || line.rfind("GO", 0) != 0) {
    throw std::runtime_error("launch: node 0 at " + address(host, port) + " did not start the run" +
                             (line.empty() ? std::string(" (no answer)") : ": " + line));
  }
  const std::string_view rest = line.size() > 3 ? std::string_view(line).substr(3) : std::string_view();
  const size_t space = std::min(rest.find(' '), rest.size());
  const auto shares = node_link::decode_shares(rest.substr(0, space));
  if (!shares || shares->size() != static_cast<size_t>(nnodes) || (*shares)[static_cast<size_t>(node_rank)] != share)
    throw std::runtime_error("launch: node 0 at " + address(host, port) + " started the run with shares '" +
                             std::string(rest.substr(0, space)) + "' that do not fit this node's (node " +
                             std::to_string(node_rank) + " of " + std::to_string(nnodes) + "; another commsched "
                             "version?)");
  link->shares_ = *shares;
  node_link::decode_env(rest.substr(std::min(space + 1, rest.size())), env);
  link->peers_.push_back(std::move(root));
  link->watch_peers(silence_s);
  return link;
}

void NodeLink::watch_peers(double silence_s) {
  if (silence_s <= 0) return;
  live_.emplace(silence_s);
  heartbeat_ = heartbeat_interval(silence_s);
  last_sent_ = Clock::now();
  for (const auto& p : peers_) live_->watch(static_cast<Liveness::Id>(p.node), last_sent_);
}

std::optional<LinkEvent> NodeLink::keep_alive() {
  if (!live_) return std::nullopt;
  const auto now = Clock::now();
  if (now - last_sent_ >= heartbeat_) broadcast("PING");
  const auto loss = live_->check(now);
  if (!loss) return std::nullopt;
  live_->forget(loss->peer);
  for (auto& p : peers_)
    if (p.fd.valid() && p.node == static_cast<int>(loss->peer))
      return lose(p, "its launcher went silent: " +
                         loss->explain([](Liveness::Id n) { return "node " + std::to_string(n); }));
  return std::nullopt;
}

// Node 0: serves the store, publishes its link there, waits for every other node's proven HELLO, then starts the run
// (GO with the root's environment). The store lives for the join only: nodes need nothing from it afterwards.
void NodeLink::accept_nodes(const std::string& host, int port, const std::map<std::string, std::string>& env,
                            const std::string& secret, double timeout_s, Clock::time_point deadline) {
  const std::string bind = is_loopback_host(host) ? "127.0.0.1" : "*";
  std::unique_ptr<collective::TcpStoreServer> server;
  try {
    server = std::make_unique<collective::TcpStoreServer>(bind, port, secret);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("launch: node 0 cannot serve its rendezvous store on port " + std::to_string(port) +
                             ": " + e.what());
  }
  listener_ = control::listen_tcp(bind, 0, 64);
  collective::TcpStoreClient("127.0.0.1", server->port(), left_ms(deadline), secret)
      .set(node_link::kLinkKey, std::to_string(control::bound_port(listener_.get())));
  collective::LinkAuth auth(secret, kLinkName, "node 0's launcher");  // logs and notes strangers
  std::vector<bool> joined(static_cast<size_t>(nnodes_), false);
  joined[0] = true;
  while (static_cast<int>(peers_.size()) < nnodes_ - 1) {
    if (!control::wait_readable(listener_.get(), deadline)) {
      std::string missing;
      for (int i = 1; i < nnodes_; ++i)
        if (!joined[static_cast<size_t>(i)]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      throw std::runtime_error("launch: node(s) " + missing + " did not join at " + address(host, port) +
                               " within " + std::to_string(static_cast<int>(timeout_s)) + " s" + auth.refusals());
    }
    Peer peer;
    peer.fd = control::accept_tcp(listener_.get());
    if (!peer.fd.valid()) continue;
    control::tune_control_socket(peer.fd.get(), kSendTimeoutS);
    if (!auth.admit(peer.fd.get(), deadline)) continue;
    const auto hello = read_hello(peer, deadline);
    if (!hello) continue;
    const int node = hello->node;
    if (node < 1 || node >= nnodes_ || joined[static_cast<size_t>(node)]) {
      write_all(peer.fd.get(), "ABORT 0 node 0 refused node " + std::to_string(node) + " (out of range or already joined)\n");
      throw std::runtime_error("launch: a launcher at " + address(host, port) + " joined as node " +
                               std::to_string(node) + ": node rank out of range [1, " + std::to_string(nnodes_) +
                               ") or already joined");
    }
    joined[static_cast<size_t>(node)] = true;
    shares_[static_cast<size_t>(node)] = hello->share;
    peer.node = node;
    peers_.push_back(std::move(peer));
  }
  const std::string go = "GO " + node_link::encode_shares(shares_) + " " + node_link::encode_env(env);
  if (go.size() + 1 > node_link::kMaxLineBytes)
    throw InvalidArgument("launch: the GO line for " + std::to_string(nnodes_) + " nodes is " +
                          std::to_string(go.size()) + " bytes, more than the node link's " +
                          std::to_string(node_link::kMaxLineBytes) + "-byte line");
  broadcast(go);
}

NodeLink::~NodeLink() = default;

void NodeLink::send(Peer& p, const std::string& line) {
  if (!p.fd.valid()) return;
  write_all(p.fd.get(), line + "\n");
  last_sent_ = Clock::now();
}

void NodeLink::broadcast(const std::string& line, int except_node) {
  for (auto& p : peers_)
    if (p.node != except_node) send(p, line);
}

void NodeLink::workers_done() {
  my_workers_done_ = true;
  if (node_rank_ != 0) broadcast("WDONE " + std::to_string(node_rank_));
}

void NodeLink::done() {
  my_done_ = true;
  if (node_rank_ != 0) broadcast("DONE " + std::to_string(node_rank_));
}

void NodeLink::abort(const std::string& why) { broadcast("ABORT " + std::to_string(node_rank_) + " " + why); }

std::optional<LinkEvent> NodeLink::handle_line(Peer& from, const std::string& line) {
  std::istringstream in(line);
  std::string verb;
  in >> verb;
  if (verb == "ABORT") {
    if (node_rank_ == 0) broadcast(line, from.node);  // relay to every other node
    return LinkEvent{LinkEvent::Kind::abort, node_link::abort_message(line)};
  }
  if (verb == "WDONE") from.workers_done = true;
  else if (verb == "DONE") {
    from.done = from.workers_done = true;
    if (live_) live_->forget(static_cast<Liveness::Id>(from.node));  // it leaves now: its silence is no loss
  }
  else if (verb == "WALLDONE") return LinkEvent{LinkEvent::Kind::all_workers_done, ""};
  return std::nullopt;
}

std::optional<LinkEvent> NodeLink::root_progress() {
  if (node_rank_ != 0) return std::nullopt;
  bool workers = my_workers_done_, all = my_done_;
  for (const auto& p : peers_) {
    workers = workers && p.workers_done;
    all = all && p.done;
  }
  if (workers && !walldone_sent_) {
    walldone_sent_ = true;
    broadcast("WALLDONE");
    return LinkEvent{LinkEvent::Kind::all_workers_done, ""};
  }
  if (all && !all_done_reported_) {
    all_done_reported_ = true;
    return LinkEvent{LinkEvent::Kind::all_done, ""};
  }
  return std::nullopt;
}

std::optional<LinkEvent> NodeLink::drain(Peer& p) {
  std::string line;
  while (node_link::take_line(p.inbox, line))
    if (auto e = handle_line(p, line)) return e;
  return std::nullopt;
}

LinkEvent NodeLink::lose(Peer& p, const std::string& why) {
  if (live_) live_->forget(static_cast<Liveness::Id>(p.node));
  p.fd.reset();
  p.inbox.clear();
  if (node_rank_ == 0 && survive_lost_nodes_) {
    p.done = p.workers_done = true;
    return LinkEvent{LinkEvent::Kind::node_lost, "node " + std::to_string(p.node) + ": " + why, p.node};
  }
  if (node_rank_ == 0) broadcast("ABORT " + std::to_string(p.node) + " " + why, p.node);
  return LinkEvent{LinkEvent::Kind::abort, "node " + std::to_string(p.node) + ": " + why};
}

std::optional<LinkEvent> NodeLink::poll(int timeout_ms) {
  for (auto& p : peers_)  // lines left over from an earlier read that returned an event
    if (auto e = drain(p)) return e;
  if (auto e = root_progress()) return e;
  if (auto e = keep_alive()) return e;
  std::vector<pollfd> fds;
  for (const auto& p : peers_)
    if (p.fd.valid()) fds.push_back({p.fd.get(), POLLIN, 0});
  if (fds.empty()) return std::nullopt;
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return std::nullopt;
  for (auto& p : peers_) {
    if (!p.fd.valid()) continue;
    pollfd q{p.fd.get(), POLLIN, 0};
    if (::poll(&q, 1, 0) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(p.fd.get(), buf, sizeof buf);
    if (n <= 0) {
      if (p.done || (node_rank_ != 0 && my_done_)) {
        if (live_) live_->forget(static_cast<Liveness::Id>(p.node));
        p.fd.reset();
        continue;
      }
      return lose(p, "its launcher is gone (connection closed before it finished)");
    }
    p.inbox.append(buf, static_cast<size_t>(n));
    if (live_) live_->heard(static_cast<Liveness::Id>(p.node), Clock::now());
    if (auto e = drain(p)) return e;
    // What is left is part of one line: a peer that keeps sending without a newline would grow it without bound.
    if (node_link::overlong(p.inbox))
      return lose(p, "its launcher sent more than a line may hold (" + std::to_string(node_link::kMaxLineBytes) +
                         " bytes) without a newline");
  }
  return root_progress();
}

}  // namespace commsched
