// ZeroMQ implementation of Transport: one ROUTER for the bound endpoint (peers identified by routing id) and one
// DEALER per outgoing connection, each DEALER watched by a socket monitor so a closed connection is reported at once.
// A ROUTER cannot see which peer disconnected, so it runs with ROUTER_MANDATORY: sending to a vanished peer fails with
// EHOSTUNREACH, which we report as `disconnected` (the server pings every peer each heartbeat tick).
//
// Authentication (TransportOptions::auth_secret): every process derives the same CURVE key pair from the shared secret.
// The ROUTER is a CURVE server with that secret key, every DEALER a CURVE client that expects that server key and
// presents the same pair. A peer without the secret cannot complete the handshake (it does not know the server key,
// or cannot prove the client key), and our ZAP handler also refuses any client key but ours. A refused connection
// never delivers a message, so it cannot say hello or take a rank; it is reported as `dropped` with the reason.
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "comm_backends/control/socket.h"
#include "comm_backends/ps/token_bucket.h"
#include "comm_backends/ps/transport.h"
#include "comm_backends/ps/zmq_auth.h"
#include "comm_backends/ps/zmq_message.h"

namespace commsched::ps {
namespace {

constexpr PeerId kRouterPeerBase = 1ull << 32;
// How long a graceful close() may spend delivering last words (bye, peer_lost) to a live peer.
constexpr int kGracefulLingerMs = 500;

struct Pending {  // a message waiting for the emulated link
  PeerId peer;
  std::vector<std::byte> header;
  zmq_msg_t payload;
  bool has_payload;
};

class ZmqTransport final : public Transport {
 public:
  explicit ZmqTransport(const TransportOptions& o)
      : opts_(o), bucket_(o.emulate_rate_bps, 256.0 * 1024) {
    if (!o.auth_secret.empty()) {
      if (!zmq_has("curve")) throw std::runtime_error("authentication needs a libzmq built with CURVE (libsodium)");
      keys_ = std::make_unique<CurveKeys>(o.auth_secret);
    }
    ctx_ = zmq_ctx_new();
    if (!ctx_) throw std::runtime_error(zmq_err("zmq_ctx_new"));
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, std::max(1, o.io_threads));
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed: " + std::string(std::strerror(errno)));
  }
  ~ZmqTransport() override {
    close(false);
    ::close(wake_fd_);
  }

  std::string bind(const std::string& host, int port) override {
    if (router_) throw std::runtime_error("transport already bound");
    if (keys_) zap_ = bind_zap_handler(ctx_, kGracefulLingerMs);
    router_ = make_socket(ZMQ_ROUTER);
    int one = 1;
    zmq_setsockopt(router_, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (keys_) {
      zmq_setsockopt(router_, ZMQ_CURVE_SERVER, &one, sizeof one);
      zmq_setsockopt(router_, ZMQ_CURVE_SECRETKEY, keys_->secret_z85, 40);
      zmq_setsockopt(router_, ZMQ_ZAP_DOMAIN, "commsched", 9);
    }
    const std::string ep = "tcp://" + host + ":" + (port == 0 ? std::string("*") : std::to_string(port));
    if (zmq_bind(router_, ep.c_str()) != 0) throw std::runtime_error(zmq_err("cannot bind " + ep));
    // Disconnections too: a ROUTER forgets a peer silently, and the owner would otherwise learn of a closed or
    // over-limit connection only when its heartbeats stop (seconds later; UCX reports it at once).
    router_mon_ = monitor(router_, kHandshakeFailed | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPTED);
    char buf[256];
    size_t len = sizeof buf;
    zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, buf, &len);
    return std::string(buf);
  }

  PeerId connect(const std::string& endpoint) override {
    Conn c;
    c.sock = make_socket(ZMQ_DEALER);
    c.endpoint = endpoint;
    if (keys_) {
      zmq_setsockopt(c.sock, ZMQ_CURVE_SERVERKEY, keys_->public_z85, 40);
      zmq_setsockopt(c.sock, ZMQ_CURVE_PUBLICKEY, keys_->public_z85, 40);
      zmq_setsockopt(c.sock, ZMQ_CURVE_SECRETKEY, keys_->secret_z85, 40);
    }
    c.mon = monitor(c.sock, ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | kHandshakeFailed);
    if (zmq_connect(c.sock, endpoint.c_str()) != 0) throw std::runtime_error(zmq_err("cannot connect to " + endpoint));
    conns_.push_back(c);
    return conns_.size();
  }

  void send(PeerId peer, std::span<const std::byte> header, OutPayload payload) override {
    Pending p{peer, std::vector<std::byte>(header.begin(), header.end()), {}, payload.size > 0 || payload.release};
    init_out_msg(&p.payload, payload);
    if (bucket_.enabled()) {
      backlog_.push_back(std::move(p));
      flush_backlog();
    } else {
      send_now(p);
    }
  }

  void send_ping(PeerId peer, std::span<const std::byte> header) override {
    Pending p{peer, std::vector<std::byte>(header.begin(), header.end()), {}, false};
    OutPayload none;
    init_out_msg(&p.payload, none);
    send_now(p);  // never behind the emulated link's backlog (Transport::send_ping)
  }

  std::optional<Incoming> receive(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      flush_backlog();
      if (!events_.empty()) return pop_event();
      if (auto m = try_receive()) return m;
      if (!events_.empty()) return pop_event();
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return std::nullopt;
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
      if (!backlog_.empty()) wait = std::min<long>(wait, static_cast<long>(bucket_.wait_s(now) * 1000) + 1);
      if (poll(wait)) return std::nullopt;  // woken
    }
  }

  void wake() override {
    uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof one);
  }

  void close(bool graceful) override {
    if (!ctx_) return;
    if (graceful) {
      while (!backlog_.empty()) send_now(backlog_.front()), backlog_.pop_front();
    }
    for (auto& p : backlog_) zmq_msg_close(&p.payload);
    backlog_.clear();
    const int linger = graceful ? kGracefulLingerMs : 0;
    auto close_sock = [&](void*& s) {
      if (!s) return;
      zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
      zmq_close(s);
      s = nullptr;
    };
    for (auto& c : conns_) {
      zmq_socket_monitor(c.sock, nullptr, 0);
      close_sock(c.mon);
      close_sock(c.sock);
    }
    if (router_) zmq_socket_monitor(router_, nullptr, 0);
    close_sock(router_mon_);
    close_sock(router_);
    close_sock(zap_);
    events_.clear();
    zmq_ctx_term(ctx_);  // returns once every socket is gone and every zero-copy message released
    ctx_ = nullptr;
  }

  std::string describe(PeerId peer) const override {
    if (peer >= kRouterPeerBase) {
      auto it = router_addr_.find(peer);
      return it == router_addr_.end() ? std::string() : it->second;
    }
    if (peer < 1 || peer > conns_.size()) return {};
    const std::string& e = conns_[peer - 1].endpoint;  // "tcp://host:port": named "host:port", as the other peers
    return e.rfind("tcp://", 0) == 0 ? e.substr(6) : e;
  }

 private:
  struct Conn {
    void* sock = nullptr;
    void* mon = nullptr;
    std::string endpoint;
    bool authenticated = false;  // a handshake succeeded at least once
  };

  void* make_socket(int type) {
    void* s = zmq_socket(ctx_, type);
    if (!s) throw std::runtime_error(zmq_err("zmq_socket"));
    set_linger(s);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);  // never drop or block: flow control is the scheduler's job
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    if (opts_.max_message_bytes > 0) {
      int64_t max = static_cast<int64_t>(opts_.max_message_bytes);
      zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max);
    }
    return s;
  }

  // A finite linger from the start, not only at close(): ZeroMQ copies a socket's options into its listener at bind
  // and into every connection's session at accept/connect. When a peer disconnects, the listener ends that connection
  // with the linger of ITS copy; with ZeroMQ's default (-1, infinite) a connection whose peer vanished while our close()
  // was ending it, with a message of ours still queued for it (server 0's bye to a server leaving at the same moment),
  // waits forever for a delivery that cannot happen, and zmq_ctx_term() in close() never returns. Setting ZMQ_LINGER
  // just before zmq_close() does not reach those copies.
  static void set_linger(void* s) {
    const int linger = kGracefulLingerMs;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  }

  void* monitor(void* sock, int events) {
    const std::string addr = "inproc://mon-" + std::to_string(monitor_seq_++);
    if (zmq_socket_monitor(sock, addr.c_str(), events) != 0) throw std::runtime_error(zmq_err("zmq_socket_monitor"));
    void* pair = zmq_socket(ctx_, ZMQ_PAIR);
    if (!pair) throw std::runtime_error(zmq_err("zmq_socket"));
    set_linger(pair);
    if (zmq_connect(pair, addr.c_str()) != 0) throw std::runtime_error(zmq_err("monitor connect"));
    return pair;
  }

  Incoming pop_event() {
    Incoming e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

  void flush_backlog() {
    if (backlog_.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    while (!backlog_.empty() && bucket_.wait_s(now) <= 0) {
      Pending& p = backlog_.front();
      bucket_.charge(p.header.size() + zmq_msg_size(&p.payload), now);
      send_now(p);
      backlog_.pop_front();
    }
  }

  void send_now(Pending& p) {
    void* sock = nullptr;
    if (p.peer >= kRouterPeerBase) {
      auto it = router_ids_.find(p.peer);
      if (!router_ || it == router_ids_.end() ||
          zmq_send(router_, it->second.data(), it->second.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&p.payload);
        report_gone(p.peer);
        return;
      }
      sock = router_;
    } else {
      if (p.peer == 0 || p.peer > conns_.size()) {
        zmq_msg_close(&p.payload);
        return;
      }
      sock = conns_[p.peer - 1].sock;
    }
    // Never block: a DEALER whose connection is gone has no pipe and would wait forever.
    if (zmq_send(sock, p.header.data(), p.header.size(), ZMQ_DONTWAIT | (p.has_payload ? ZMQ_SNDMORE : 0)) < 0) {
      zmq_msg_close(&p.payload);
      report_gone(p.peer);
      return;
    }
    if (p.has_payload && zmq_msg_send(&p.payload, sock, ZMQ_DONTWAIT) < 0) zmq_msg_close(&p.payload);
    if (!p.has_payload) zmq_msg_close(&p.payload);
  }

  // An outgoing connection the other side would not authenticate: reported once, as `dropped` from that peer.
  void report_refused(PeerId conn, const std::string& why) {
    if (!gone_.insert_or_assign(conn, true).second) return;
    Incoming e;
    e.kind = Incoming::Kind::dropped;
    e.peer = conn;
    e.detail = "connection to " + describe(conn) + " refused: " + why;
    events_.push_back(std::move(e));
  }

  void report_gone(PeerId peer, const std::string& why = "") {
    if (!gone_.insert_or_assign(peer, true).second) return;  // already reported
    Incoming e;
    e.kind = Incoming::Kind::disconnected;
    e.peer = peer;
    e.detail = describe(peer) + why;
    events_.push_back(std::move(e));
  }

  // Returns true when woken by wake().
  bool poll(long timeout_ms) {
    std::vector<zmq_pollitem_t> items;
    if (router_) items.push_back({router_, 0, ZMQ_POLLIN, 0});
    if (router_mon_) items.push_back({router_mon_, 0, ZMQ_POLLIN, 0});
    if (zap_) items.push_back({zap_, 0, ZMQ_POLLIN, 0});
    for (auto& c : conns_) {
      items.push_back({c.sock, 0, ZMQ_POLLIN, 0});
      items.push_back({c.mon, 0, ZMQ_POLLIN, 0});
    }
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    zmq_poll(items.data(), static_cast<int>(items.size()), timeout_ms);
    if (items.back().revents & ZMQ_POLLIN) {
      uint64_t v;
      [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
      return true;
    }
    return false;
  }

  // Data before monitor events: a peer's last words (peer_lost, bye) precede its disconnection.
  std::optional<Incoming> try_receive() {
    const size_t n = conns_.size() + 1;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (rr_ + k) % n;
      std::optional<Incoming> m = i == 0 ? (router_ ? recv_from(router_, true, 0) : std::nullopt)
                                         : recv_from(conns_[i - 1].sock, false, i);
      if (m) {
        rr_ = i + 1;
        return m;
      }
    }
    if (zap_)
      for (std::string& why : serve_zap(zap_, *keys_)) {
        Incoming e;
        e.kind = Incoming::Kind::dropped;
        e.detail = std::move(why);
        events_.push_back(std::move(e));
      }
    if (router_mon_) drain_router_monitor();
    for (size_t i = 0; i < conns_.size(); ++i) drain_monitor(conns_[i].mon, i + 1);
    return std::nullopt;
  }

  // The monitor of outgoing connection `conn`.
  void drain_monitor(void* mon, PeerId conn) {
    while (auto e = next_monitor_event(mon)) {
      if (e->event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        conns_[conn - 1].authenticated = true;
      } else if (e->event == ZMQ_EVENT_DISCONNECTED && (conns_[conn - 1].authenticated || !keys_)) {
        report_gone(conn);
      } else {
        // Our connection never got through: with CURVE the server closes a handshake it cannot decrypt.
        report_refused(conn, e->event == ZMQ_EVENT_DISCONNECTED
                                 ? "closed during the CURVE handshake (wrong shared secret?)"
                                 : handshake_reason(e->event, e->value, keys_ != nullptr));
      }
    }
  }

  // The ROUTER's monitor names a connection only by its socket number, which the kernel hands to the next connection
  // accepted once it closes: a DISCONNECTED still queued when a new peer on the same number speaks is not that peer's.
  // So connections are counted per number: reading the monitor counts each ACCEPTED at once, and every other event
  // waits in router_events_ stamped with the count (the connection it is about) to be acted on in order.
  void read_router_monitor() {
    while (auto e = next_monitor_event(router_mon_)) {
      if (e->event == ZMQ_EVENT_ACCEPTED) {
        ++accepts_of_fd_[e->value];
        continue;
      }
      const uint64_t nth = e->event == ZMQ_EVENT_DISCONNECTED ? accepts_of_fd_[e->value] : 0;
      router_events_.emplace_back(std::move(*e), nth);
    }
  }

  // Acts on the ROUTER's monitor events in order: disconnections, and handshakes that failed.
  void drain_router_monitor() {
    read_router_monitor();
    while (!router_events_.empty()) {
      auto [e, nth] = std::move(router_events_.front());
      router_events_.pop_front();
      if (e.event == ZMQ_EVENT_DISCONNECTED) {
        accepted_gone(e.value, nth);
      } else {
        Incoming in;
        in.kind = Incoming::Kind::dropped;
        in.detail = "connection on " + e.where + " dropped: " + handshake_reason(e.event, e.value, keys_ != nullptr);
        events_.push_back(std::move(in));
      }
    }
  }

  std::optional<Incoming> recv_from(void* sock, bool is_router, PeerId conn) {
    zmq_msg_t first;
    zmq_msg_init(&first);
    if (zmq_msg_recv(&first, sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&first);
      return std::nullopt;
    }
    Incoming in;
    in.peer = conn;
    if (is_router) {
      in.peer = router_peer(&first);
      if (!zmq_msg_more(&first)) {  // a lone routing-id frame: nothing to deliver
        zmq_msg_close(&first);
        in.extra_frames = 1;
        return in;
      }
      zmq_msg_close(&first);
      zmq_msg_init(&first);
      zmq_msg_recv(&first, sock, 0);
      note_address(in.peer, &first);
    }
    const auto* h = static_cast<const std::byte*>(zmq_msg_data(&first));
    in.header.assign(h, h + zmq_msg_size(&first));
    bool more = zmq_msg_more(&first);
    zmq_msg_close(&first);
    while (more) {
      zmq_msg_t part;
      zmq_msg_init(&part);
      zmq_msg_recv(&part, sock, 0);
      more = zmq_msg_more(&part);
      if (!in.payload) in.payload = std::make_unique<ZmqPayload>(&part);
      else ++in.extra_frames;
      zmq_msg_close(&part);
    }
    return in;
  }

  PeerId router_peer(zmq_msg_t* id_frame) {
    std::string id(static_cast<char*>(zmq_msg_data(id_frame)), zmq_msg_size(id_frame));
    auto [it, fresh] = router_peer_of_.try_emplace(id, 0);
    if (fresh) {
      it->second = next_router_peer_++;
      router_ids_[it->second] = id;
    }
    return it->second;
  }

  // A connecting peer's "ip:port", from the socket its first message came in on, so that messages name it as the
  // other side's are named. (ZeroMQ's "Peer-Address" property carries no port, and was absent on some messages.)
  // The socket is remembered too: the ROUTER's monitor names a closed connection only by it.
  void note_address(PeerId peer, zmq_msg_t* msg) {
    std::string& addr = router_addr_[peer];
    if (!addr.empty()) return;
    const int fd = zmq_msg_get(msg, ZMQ_SRCFD);
    addr = control::peer_address(fd);
    if (fd < 0) return;
    read_router_monitor();  // counts this connection: ZeroMQ queues its ACCEPTED before any of its messages
    router_peer_of_fd_[fd] = {peer, accepts_of_fd_[fd]};
  }

  // The `nth` accepted connection on socket number `fd` closed (its peer left, or ZeroMQ cut it for a message over
  // ZMQ_MAXMSGSIZE, which it does without saying so). A connection that never delivered a message is no peer of the
  // owner's: nothing to report, even when a later connection on the same number has a peer.
  void accepted_gone(int fd, uint64_t nth) {
    auto it = router_peer_of_fd_.find(fd);
    if (it == router_peer_of_fd_.end()) {
      take_readable_router_messages();
      it = router_peer_of_fd_.find(fd);
      if (it == router_peer_of_fd_.end()) return;
    }
    if (it->second.nth > nth) return;  // an earlier connection on this number: closed before the peer's was accepted
    const PeerId peer = it->second.peer;
    router_peer_of_fd_.erase(it);
    report_gone(peer, opts_.max_message_bytes == 0 ? "" : " (it closed the connection, or sent a message over the limit of " +
                                                              std::to_string(opts_.max_message_bytes) + " bytes)");
  }

  // The monitor can be ahead of the data: ZeroMQ throttles a socket's processing of its commands, so a closed
  // connection's last messages may not be readable yet when its DISCONNECTED event is. Reading ZMQ_EVENTS processes
  // them; the messages are queued before the disconnection (in order), and their connection becomes known by its
  // socket. (Dismissing the event instead lost the disconnection of a peer cut for an over-limit message.)
  void take_readable_router_messages() {
    int events = 0;
    size_t len = sizeof events;
    zmq_getsockopt(router_, ZMQ_EVENTS, &events, &len);
    while (auto m = recv_from(router_, true, 0)) events_.push_back(std::move(*m));
  }

  TransportOptions opts_;
  void* ctx_ = nullptr;
  void* router_ = nullptr;
  void* router_mon_ = nullptr;
  void* zap_ = nullptr;
  std::unique_ptr<CurveKeys> keys_;
  std::vector<Conn> conns_;
  std::unordered_map<std::string, PeerId> router_peer_of_;
  std::unordered_map<PeerId, std::string> router_ids_;
  std::unordered_map<PeerId, std::string> router_addr_;
  struct FdPeer {
    PeerId peer;
    uint64_t nth;  // its connection: the nth accepted on this socket number
  };
  std::unordered_map<int, FdPeer> router_peer_of_fd_;  // accepted connections that delivered a message, by socket
  std::unordered_map<int, uint64_t> accepts_of_fd_;    // connections accepted per socket number, as the monitor said
  std::deque<std::pair<MonitorEvent, uint64_t>> router_events_;  // read from the monitor, not yet acted on
  std::unordered_map<PeerId, bool> gone_;
  PeerId next_router_peer_ = kRouterPeerBase;
  std::deque<Incoming> events_;
  std::deque<Pending> backlog_;
  TokenBucket bucket_;
  int wake_fd_ = -1;
  int monitor_seq_ = 0;
  size_t rr_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_zmq_transport(const TransportOptions& opts) {
  return std::make_unique<ZmqTransport>(opts);
}

}  // namespace commsched::ps
