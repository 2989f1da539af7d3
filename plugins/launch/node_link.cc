#include "plugins/launch/node_link.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <stdexcept>

#include "comm_backends/cluster_auth.h"
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

// Loopback only when the root address is loopback: a run that never leaves this machine is not reachable from others.
control::Fd listen_on(int port, bool loopback_only) {
  try {
    return control::listen_tcp(loopback_only ? "127.0.0.1" : "*", port, 64);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("launch: node 0 cannot listen on port " + std::to_string(port) + ": " + e.what());
  }
}

}  // namespace

std::pair<std::string, int> parse_host_port(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw InvalidArgument("--root '" + s + "': expected HOST:PORT (node 0's address and a free port)");
  const int port = static_cast<int>(parse_int("--root", s.substr(colon + 1), 1, 65534));
  return {s.substr(0, colon), port};
}

// Who a node is, once it proved the run's secret (or at once when the run has none). A stranger (no or wrong proof,
// silence, garbage) is told why, logged with its address and dropped: it cannot stop or join the run. Returns -1 then.
int NodeLink::admit(Peer& peer, const std::string& secret, Clock::time_point deadline) {
  // A silent stranger holds the join for at most a few seconds, not the whole join timeout.
  const auto until = std::min(deadline, Clock::now() + std::chrono::seconds(5));
  const std::string server_nonce = SecretHandshake::nonce();
  write_all(peer.fd.get(), secret.empty() ? std::string("OPEN\n") : "CHALLENGE " + to_hex(server_nonce) + "\n");
  std::string line;
  const bool said = read_line(peer.fd.get(), peer.inbox, line, until);
  const auto hello = said ? node_link::parse_hello(line) : std::nullopt;
  const std::string who = "a launcher at " + control::peer_address(peer.fd.get());
  std::string refusal;
  if (!said && node_link::overlong(peer.inbox)) {
    refusal = "it sent more than a line may hold (" + std::to_string(node_link::kMaxLineBytes) +
              " bytes) without a newline";
  } else if (!hello) {
    refusal = "it sent no HELLO naming its node rank";
  } else if (!secret.empty()) {
    const SecretHandshake handshake(secret, "node link");
    const auto client_nonce = from_hex(hello->nonce_hex), mac = from_hex(hello->proof_hex);
    if (!client_nonce || !mac || !handshake.client_proved(*mac, server_nonce, *client_nonce))
      refusal = "it did not prove the run's shared secret (no or another COMMSCHED_SECRET / COMMSCHED_KEY_FILE)";
    else
      write_all(peer.fd.get(), "WELCOME " + to_hex(handshake.server_proof(*client_nonce, server_nonce)) + "\n");
  }
  if (!refusal.empty()) {
    std::fprintf(stderr, "[commsched launch] node 0 refused %s: %s\n", who.c_str(), refusal.c_str());
    write_all(peer.fd.get(), "ABORT 0 node 0 refused this launcher: " + refusal + "\n");
    return -1;
  }
  return hello->node;
}

// The root's answer to this node's connection: nothing to prove (OPEN), or the challenge it must answer.
void NodeLink::greet_root(Peer& root, int node_rank, const std::string& secret, const std::string& where,
                          Clock::time_point deadline) {
  std::string line;
  if (!read_line(root.fd.get(), root.inbox, line, deadline))
    throw std::runtime_error("launch: node 0 at " + where + " did not answer (is it a commsched launch?)");
  const std::string hello = "HELLO " + std::to_string(node_rank);
  if (line == "OPEN") {
    if (!secret.empty())
      throw std::runtime_error("launch: node 0 at " + where + " does not authenticate but this node has a shared "
                               "secret: every node needs the same COMMSCHED_SECRET / COMMSCHED_KEY_FILE / "
                               "COMMSCHED_AUTH");
    write_all(root.fd.get(), hello + "\n");
    return;
  }
  const auto server_nonce = line.rfind("CHALLENGE ", 0) == 0 ? from_hex(line.substr(10)) : std::nullopt;
  if (!server_nonce || server_nonce->size() != SecretHandshake::kNonceBytes)
    throw std::runtime_error("launch: node 0 at " + where + " sent '" + line.substr(0, 80) + "', not a challenge");
  if (secret.empty())
    throw std::runtime_error("launch: node 0 at " + where + " requires the run's shared secret: set the same "
                             "COMMSCHED_SECRET or COMMSCHED_KEY_FILE on every node");
  const SecretHandshake handshake(secret, "node link");
  const std::string mine = SecretHandshake::nonce();
  write_all(root.fd.get(), hello + " " + to_hex(mine) + " " + to_hex(handshake.client_proof(*server_nonce, mine)) + "\n");
  if (!read_line(root.fd.get(), root.inbox, line, deadline) || line.rfind("WELCOME ", 0) != 0)
    throw std::runtime_error("launch: node 0 at " + where + " refused this node" +
                             (line.empty() ? std::string(" (no answer)") : ": " + line));
  const auto mac = from_hex(line.substr(8));
  if (!mac || !handshake.server_proved(*mac, mine, *server_nonce))
    throw std::runtime_error("launch: the launcher at " + where + " did not prove the run's shared secret: not this "
                             "run's node 0");
}

std::unique_ptr<NodeLink> NodeLink::join(int nnodes, int node_rank, const std::string& host, int port,
                                         std::map<std::string, std::string>& env, double timeout_s,
                                         const std::string& secret, double silence_s) {
  std::unique_ptr<NodeLink> link(new NodeLink(nnodes, node_rank));
  const auto deadline = deadline_after(timeout_s);
  if (node_rank == 0) {
    link->accept_nodes(host, port, env, secret, timeout_s, deadline);
    link->watch_peers(silence_s);
    return link;
  }
  Peer root;
  root.node = 0;
  try {
    root.fd = control::connect_tcp(host, port, deadline);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("launch: node " + std::to_string(node_rank) + " could not reach node 0 at " +
                             address(host, port) + " within " + std::to_string(static_cast<int>(timeout_s)) + " s (" +
                             e.what() + ")");
  }
  control::tune_control_socket(root.fd.get(), kSendTimeoutS);
  greet_root(root, node_rank, secret, address(host, port), deadline);
  std::string line;
  if (!read_line(root.fd.get(), root.inbox, line, deadline) || line.rfind("GO", 0) != 0) {
    throw std::runtime_error("launch: node 0 at " + address(host, port) + " did not start the run" +
                             (line.empty() ? std::string(" (no answer)") : ": " + line));
  }
  node_link::decode_env(line.size() > 3 ? std::string_view(line).substr(3) : std::string_view(), env);
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

// Node 0: waits for every other node's proven HELLO, then starts the run (GO with the root's environment).
void NodeLink::accept_nodes(const std::string& host, int port, const std::map<std::string, std::string>& env,
                            const std::string& secret, double timeout_s, Clock::time_point deadline) {
  listener_ = listen_on(port, is_loopback_host(host));
  std::vector<bool> joined(static_cast<size_t>(nnodes_), false);
  joined[0] = true;
  while (static_cast<int>(peers_.size()) < nnodes_ - 1) {
    if (!control::wait_readable(listener_.get(), deadline)) {
      std::string missing;
      for (int i = 1; i < nnodes_; ++i)
        if (!joined[static_cast<size_t>(i)]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      throw std::runtime_error("launch: node(s) " + missing + " did not join at " + address(host, port) +
                               " within " + std::to_string(static_cast<int>(timeout_s)) + " s");
    }
    Peer peer;
    peer.fd = control::accept_tcp(listener_.get());
    if (!peer.fd.valid()) continue;
    control::tune_control_socket(peer.fd.get(), kSendTimeoutS);
    const int node = admit(peer, secret, deadline);
    if (node < 0) continue;
    if (node < 1 || node >= nnodes_ || joined[static_cast<size_t>(node)]) {
      write_all(peer.fd.get(), "ABORT 0 node 0 refused node " + std::to_string(node) + " (out of range or already joined)\n");
      throw std::runtime_error("launch: a launcher at " + address(host, port) + " joined as node " +
                               std::to_string(node) + ": node rank out of range [1, " + std::to_string(nnodes_) +
                               ") or already joined");
    }
    joined[static_cast<size_t>(node)] = true;
    peer.node = node;
    peers_.push_back(std::move(peer));
  }
  broadcast("GO " + node_link::encode_env(env));
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
