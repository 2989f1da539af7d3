// UCX implementation of Transport over UCP active messages: a message is one AM (id 0) whose AM header is our header
// frame and whose AM data is the payload, so UCX picks eager or rendezvous (zero-copy: shared memory via CMA, RDMA
// reads on verbs) per message. Which UCX transports carry it is UCX's choice within UCX_TLS (read by UCX itself);
// the lanes of each new connection are logged.
//
// Connections: each side keeps one TCP socket per peer, on the IP socket address of the endpoint ("tcp://host:port",
// as with ZeroMQ). Over it the two sides exchange a versioned hello carrying their UCP worker address and the id and
// token the other side must put in front of every message, then create UCP endpoints to each other; afterwards the
// socket only tells liveness: a closed or killed peer's socket ends at once (EOF), a frozen peer's stays open and the protocol's
// heartbeat timeout finds it. We do not use UCX's own client-server mode: in UCX 1.13 its endpoints (with peer error
// handling) never use shared memory. Endpoints run without UCX error handling (shared memory has none): the socket is
// the failure detector, and a lost peer's endpoint is force-closed. A connection we dial is redialled every 100 ms
// until it first stands (the listener may not be up yet), as ZeroMQ does; sends made meanwhile wait in order.
// Foreign bytes on the port fail the hello check and that connection is dropped (logged), the others are served.
//
// Authentication (TransportOptions::auth_secret): the handshake is
//   dialer -> acceptor   hello_d
//   acceptor -> dialer   hello_a, proof_a = HMAC(key, "accept" || hello_d || hello_a)
//   dialer -> acceptor   proof_d = HMAC(key, "dial" || hello_a || hello_d)
// where each hello carries a fresh random nonce, so a proof can be neither replayed nor reflected, and covers the
// sender's UCP address and token, so neither can be swapped. The dialer trusts the acceptor once proof_a checks, the
// acceptor the dialer once proof_d does; a side without the secret (or with another one) is refused and logged before
// it is a peer. Every UCX message carries the receiver's per-connection random token, and messages of a connection
// that never proved itself are never delivered, so knowing a worker address and guessing a peer id is not enough to
// inject one. The UCX data path itself is not encrypted (as RDMA is not): use the ZeroMQ transport (CURVE) on
// networks that can be snooped. Without a secret the same handshake runs with empty proofs, and both sides must agree.
//
// Threading: the worker is UCS_THREAD_MODE_SERIALIZED (made on one thread, then driven by the I/O thread only);
// every UCX callback runs inside ucp_worker_progress() on that thread. wake() touches only our own eventfd.
// Receive buffers come from a BufferPool, so after the first rounds the same addresses recur and UCX's registration
// cache (used by RDMA rendezvous) hits; send buffers are the callers' tensors, registered through the same cache.
// With a PayloadSink (the PS worker's pulls), a payload lands in the owner's memory instead: a rendezvous message is
// fetched straight into it (one CMA copy or RDMA read, no copy after), an eager one is copied into it from UCX's
// buffer (the one copy it would otherwise take into the pool). Only proven peers' messages are offered to the sink.
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/ps/buffer_pool.h"
#include "comm_backends/control/net_util.h"
#include "comm_backends/ps/token_bucket.h"
#include "comm_backends/ps/transport.h"

namespace commsched::ps {
namespace {

using Clock = std::chrono::steady_clock;
constexpr unsigned kAmId = 0;

// Set on the I/O thread while close() runs: its flush and endpoint closes (see filter_ucx_log).
thread_local bool in_close = false;

// Our endpoints run without UCX error handling (shared memory has none in UCX 1.13), so UCX logs two ordinary events
// as errors. This handler, run before UCX's own, takes exactly those; every other message goes on to UCX's handler.
//  - A peer process dies while UCX copies from or into its memory (a CMA rendezvous: process_vm_readv/writev fail
//    with ESRCH): logged at FATAL level, and UCX's default handler aborts the survivor with a backtrace. That death
//    is an ordinary lost peer (its socket ends at once and the protocol names it): one line on stderr, and the copy
//    fails normally.
//  - A peer ends its connection while close() flushes its endpoint: "error during flush: Endpoint timeout", at
//    ERROR level, in about one clean shutdown in ten over UCX's TCP transport (a worker exits the moment the
//    server's answering goodbye reaches it, while the server flushes). The goodbyes already settled what each side
//    needed, and a loss before them was reported by the protocol. Dropped, only inside close().
ucs_log_func_rc_t filter_ucx_log(const char* file, unsigned, const char*, ucs_log_level_t level,
                                 const ucs_log_component_config_t*, const char* format, va_list ap) {
  if (!file) return UCS_LOG_FUNC_RC_CONTINUE;
  if (in_close && level == UCS_LOG_LEVEL_ERROR && std::strstr(file, "flush.c") &&
      std::strstr(format, "error during flush"))
    return UCS_LOG_FUNC_RC_STOP;
  if (level != UCS_LOG_LEVEL_FATAL || !std::strstr(file, "cma_ep.c")) return UCS_LOG_FUNC_RC_CONTINUE;
  char text[512];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof text, format, copy);
  va_end(copy);
  if (!std::strstr(text, std::strerror(ESRCH))) return UCS_LOG_FUNC_RC_CONTINUE;
  std::fprintf(stderr, "[commsched ps ucx] a peer process exited during a shared-memory copy (%s); its connection "
               "reports the loss\n", text);
  return UCS_LOG_FUNC_RC_STOP;
}

void install_log_handler_once() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(filter_ucx_log); });
}
// How long a graceful close() may spend delivering last words (bye, peer_lost) to a live peer.
constexpr auto kGracefulLinger = std::chrono::milliseconds(500);
constexpr auto kRedialDelay = std::chrono::milliseconds(100);
// The hello on a new connection's socket: magic, the id and token the receiver puts before each message to us, our
// nonce, flags, the length of our address, our address.
constexpr char kHelloMagic[8] = {'c', 's', 'u', 'c', 'x', '/', '2', '\n'};
constexpr size_t kHelloFixed = 8 + 8 + 8 + 16 + 4 + 4;
constexpr size_t kProofBytes = 32;
constexpr uint32_t kFlagAuthenticates = 1;
constexpr uint32_t kMaxWorkerAddress = 64 * 1024;
constexpr size_t kPrefix = 16;  // before each message's header frame: the receiver's id and token for the sender
// Messages a connection may have sent before it finished proving itself (the dialer's first words race its proof).
constexpr size_t kMaxUnprovenMessages = 4096;
constexpr const char* kProofPurpose = "commsched ucx hello v2";

std::string ucs_err(const std::string& what, ucs_status_t s) { return what + ": " + ucs_status_string(s); }

sockaddr_in resolve(const std::string& host, int port, const std::string& what) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (host == "*" || host.empty()) {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    return a;
  }
  const std::string ip = control::interface_address(host);  // COMMSCHED_BIND may name an interface
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(ip.empty() ? host.c_str() : ip.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw std::runtime_error("cannot resolve " + what);
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return a;
}

// "tcp://host:port" (or "ucx://host:port") to a socket address.
sockaddr_in parse_endpoint(const std::string& ep) {
  const auto scheme = ep.find("://");
  const auto colon = ep.rfind(':');
  if (scheme == std::string::npos || colon == std::string::npos || colon <= scheme + 3)
    throw std::runtime_error("UCX transport: endpoint '" + ep + "' is not tcp://host:port");
  int port = 0;
  try {
    port = std::stoi(ep.substr(colon + 1));
  } catch (const std::exception&) {
    throw std::runtime_error("UCX transport: endpoint '" + ep + "' has no port");
  }
  return resolve(ep.substr(scheme + 3, colon - scheme - 3), port, "endpoint '" + ep + "'");
}

// The UCX transports (tl/device) on an endpoint's lanes, from UCX's own description of the endpoint.
std::string lanes_of(ucp_ep_h ep) {
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (!f) return "?";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string out;
  std::set<std::string> seen;
  const std::string all(text, len);
  std::free(text);
  for (size_t at = all.find("lane["); at != std::string::npos; at = all.find("lane[", at + 1)) {
    // "lane[0]:  2:posix/memory.0 md[2] ... am am_bw#0": the token after "N:" up to the ".index".
    const size_t colon = all.find(':', all.find(']', at));
    size_t b = all.find_first_not_of(' ', colon + 1);
    b = all.find(':', b) + 1;
    const size_t e = all.find_first_of(" \n", b);
    std::string tl = all.substr(b, e - b);
    if (auto dot = tl.rfind('.'); dot != std::string::npos && dot > tl.find('/')) tl.resize(dot);
    if (!tl.empty() && seen.insert(tl).second) out += (out.empty() ? "" : ", ") + tl;
  }
  return out.empty() ? "?" : out;
}

class UcxTransport;

struct OutMsg {  // one message until UCX lets go of its payload
  PeerId peer = 0;
  std::vector<std::byte> header;  // the peer's id and token for us, then the header frame
  OutPayload payload;
  UcxTransport* owner = nullptr;
  void release() {
    if (payload.release) std::exchange(payload.release, nullptr)();
  }
};

struct InMsg {  // one arrived message until it is complete and every earlier message of its peer is delivered
  enum class State { receiving, ready, failed };
  State state = State::receiving;
  Incoming in;
  std::shared_ptr<std::byte> buf;
  std::byte* dest = nullptr;  // the sink's destination (then buf is empty): the payload lands there
  size_t size = 0;
  void* desc = nullptr;  // rendezvous data descriptor, until fetched
  std::byte* target() const { return dest ? dest : buf.get(); }
  UcxTransport* owner = nullptr;
};

struct Peer {
  // dialing: TCP connect in flight; hello: waiting for theirs; proving: we accepted, waiting for the dialer's proof
  enum class State { dialing, hello, proving, up, failed };
  State state = State::hello;
  bool was_up = false;  // proved itself once: only then are its messages delivered
  int fd = -1;
  ucp_ep_h ep = nullptr;
  uint64_t their_id = 0;     // what this peer wants in front of our messages
  uint64_t their_token = 0;  // ... and the token it issued us
  uint64_t token = 0;        // the token we issued it (random per connection)
  std::vector<std::byte> my_hello, their_hello;  // both hellos, signed by the proofs
  std::string addr;
  std::optional<sockaddr_in> dial;  // connections we made: redialled until they first stand
  Clock::time_point redial_at{};
  std::vector<std::byte> rx;                    // the hello, as it arrives
  std::deque<std::unique_ptr<OutMsg>> waiting;  // sends made before the connection stood
  std::deque<std::shared_ptr<InMsg>> inbox;     // arrival order (a rendezvous may finish after a later eager message)
  std::string failure;
  bool reported = false;
  bool lanes_logged = false;
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportOptions& o) : opts_(o), bucket_(o.emulate_rate_bps, 256.0 * 1024) {
    if (!opts_.auth_secret.empty()) (void)ClusterAuth::derive(opts_.auth_secret, kProofPurpose);  // sodium ready
    install_log_handler_once();
    ucp_config_t* config = nullptr;
    if (auto s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) throw std::runtime_error(ucs_err("ucp_config_read", s));
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
    p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 0;
    p.name = "commsched-ps";
    const ucs_status_t s = ucp_init(&p, config, &ctx_);
    ucp_config_release(config);
    if (s != UCS_OK) throw std::runtime_error(ucs_err("ucp_init (check UCX_TLS)", s));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    if (auto ws = ucp_worker_create(ctx_, &wp, &worker_); ws != UCS_OK) {
      ucp_cleanup(ctx_);
      throw std::runtime_error(ucs_err("ucp_worker_create", ws));
    }
    ucp_am_handler_param_t h{};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    h.id = kAmId;
    h.cb = &UcxTransport::on_am;
    h.arg = this;
    check(ucp_worker_set_am_recv_handler(worker_, &h), "ucp_worker_set_am_recv_handler");
    check(ucp_worker_get_efd(worker_, &efd_), "ucp_worker_get_efd");
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    check(ucp_worker_get_address(worker_, &addr, &len), "ucp_worker_get_address");
    const auto* a = reinterpret_cast<const std::byte*>(addr);
    address_.assign(a, a + len);
    ucp_worker_release_address(worker_, addr);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed: " + std::string(std::strerror(errno)));
  }
  ~UcxTransport() override {
    close(false);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  std::string bind(const std::string& host, int port) override {
    if (listen_fd_ >= 0) throw std::runtime_error("transport already bound");
    sockaddr_in a = resolve(host, port, "bind address '" + host + "'");
    const std::string ep = "tcp://" + (host.empty() ? "*" : host) + ":" + std::to_string(port);
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 128) != 0) {
      const std::string why = std::strerror(errno);
      if (listen_fd_ >= 0) ::close(listen_fd_);
      listen_fd_ = -1;
      throw std::runtime_error("UCX transport: cannot bind " + ep + ": " + why);
    }
    socklen_t len = sizeof a;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    return "tcp://" + control::address_text(reinterpret_cast<const sockaddr*>(&a));
  }

  PeerId connect(const std::string& endpoint) override {
    const PeerId id = next_peer_++;
    Peer& p = peers_[id];
    p.dial = parse_endpoint(endpoint);
    p.addr = endpoint.substr(endpoint.find("://") + 3);
    start_dial(id, p);
    return id;
  }

  void send(PeerId peer, std::span<const std::byte> header, OutPayload payload) override {
    if (!worker_) {  // closed
      if (payload.release) payload.release();
      return;
    }
    auto m = out_msg(peer, header, std::move(payload));
    if (bucket_.enabled()) {
      backlog_.push_back(std::move(m));
      flush_backlog();
    } else {
      dispatch(std::move(m));
    }
  }

  void send_ping(PeerId peer, std::span<const std::byte> header) override {
    if (worker_) dispatch(out_msg(peer, header, {}));  // never behind the emulated link's backlog
  }

  std::optional<Incoming> receive(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    if (!worker_) return std::nullopt;  // closed
    for (;;) {
      progress();
      if (!events_.empty()) return pop_event();
      if (std::exchange(woken_, false)) return std::nullopt;
      const auto now = Clock::now();
      if (now >= deadline) return std::nullopt;
      long wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
      if (!backlog_.empty()) wait = std::min<long>(wait, static_cast<long>(bucket_.wait_s(now) * 1000) + 1);
      if (redial_pending_) wait = std::min<long>(wait, kRedialDelay.count());
      // Sends UCX could not start yet (a full shared-memory FIFO) advance only when we progress, and no event says
      // when there is room: while any are outstanding, look again every millisecond.
      if (!in_flight_.empty()) wait = std::min<long>(wait, 1);
      // Traffic comes in bursts and every rendezvous takes a round trip: keep polling for 100 us after the last
      // progress instead of paying a sleep and a wake-up per message (64 KiB messages over shared memory: ~0.2 GB/s
      // sleeping at once, ~2 GB/s with the spin, on a loaded 2-core machine). An idle transport sleeps.
      if (now - last_progress_ < spin_) {
        sched_yield();
        continue;
      }
      const ucs_status_t armed = ucp_worker_arm(worker_);
      if (armed == UCS_ERR_BUSY) continue;  // more to progress first
      poll_sockets(armed == UCS_OK ? wait : std::min<long>(wait, 1));  // returns early when woken (woken_)
    }
  }

  void wake() override {
    uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof one);
  }

  void set_payload_sink(PayloadSink sink) override { sink_ = std::move(sink); }

  void close(bool graceful) override {
    sink_ = nullptr;  // nothing arriving from here on lands in the owner's memory
    if (!worker_) return;
    closing_ = true;
    in_close = true;
    struct Reset { ~Reset() { in_close = false; } } reset;  // later UCX messages of this thread: judged as before
    const auto deadline = Clock::now() + kGracefulLinger;
    if (graceful) {
      while (!backlog_.empty()) dispatch(pop_front(backlog_));
      // Also let the fetches of arriving messages finish: force-closing an endpoint while its peer still moves a
      // rendezvous payload to us made UCX 1.13's TCP transport abort the peer (tcp_ep.c PUT_TX_WAITING_ACK).
      while ((!in_flight_.empty() || any_waiting() || fetching_ > 0) && Clock::now() < deadline) progress_or_nap();
      flush_all(deadline);  // what UCX reported sent has reached the peers before their sockets end
    }
    std::vector<void*> closing;
    for (auto& [id, p] : peers_) {
      if (p.ep) closing.push_back(close_ep(p.ep));
      p.ep = nullptr;
      close_fd(p);
    }
    for (ucp_ep_h ep : retiring_) closing.push_back(close_ep(ep));
    retiring_.clear();
    const auto close_deadline = Clock::now() + std::chrono::milliseconds(200);
    for (void* r : closing) {
      while (r && ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < close_deadline) progress_or_nap();
      if (r) ucp_request_free(r);  // one still closing is freed by UCX when it finishes
    }
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    for (auto& m : fetch_) ucp_am_data_release(worker_, m->desc);
    fetch_.clear();
    // Completes what is still outstanding (callbacks run here). From here on UCX writes into no destination the
    // sink gave: a rendezvous fetch has finished or is gone with the worker (the owner may free its memory).
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
    ucp_cleanup(ctx_);
    ctx_ = nullptr;
    // UCX is gone: nothing reads any payload any more, whether or not its completion was reported.
    for (OutMsg* m : in_flight_) m->release(), delete m;
    in_flight_.clear();
    for (auto& m : backlog_) m->release();
    backlog_.clear();
    for (auto& [id, p] : peers_)
      for (auto& m : p.waiting) m->release();
    peers_.clear();
    events_.clear();
  }

  std::string describe(PeerId peer) const override {
    auto it = peers_.find(peer);
    return it == peers_.end() ? std::string() : it->second.addr;
  }

 private:
  void check(ucs_status_t s, const char* what) {
    if (s != UCS_OK) throw std::runtime_error(ucs_err(what, s));
  }

  template <class T>
  static T pop_front(std::deque<T>& q) {
    T v = std::move(q.front());
    q.pop_front();
    return v;
  }

  Incoming pop_event() { return pop_front(events_); }

  bool any_waiting() const {
    for (auto& [id, p] : peers_)
      if (!p.waiting.empty() && p.state != Peer::State::failed) return true;
    return false;
  }

  // ---- connections: the TCP socket (hello, then liveness) -----------------------------------------------------

  void start_dial(PeerId id, Peer& p) {
    p.state = Peer::State::dialing;
    p.rx.clear();
    p.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (p.fd < 0) return schedule_redial(p);
    const int one = 1;
    setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(p.fd, reinterpret_cast<const sockaddr*>(&*p.dial), sizeof(sockaddr_in)) == 0) return dialed(id, p);
    if (errno != EINPROGRESS) return schedule_redial(p);
  }

  void dialed(PeerId id, Peer& p) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return schedule_redial(p);
    p.state = Peer::State::hello;
    send_hello(id, p);
  }

  void schedule_redial(Peer& p) {
    close_fd(p);
    p.state = Peer::State::dialing;
    p.redial_at = Clock::now() + kRedialDelay;
    redial_pending_ = true;
  }

  void redial_due() {
    if (!redial_pending_) return;
    redial_pending_ = false;
    const auto now = Clock::now();
    for (auto& [id, p] : peers_) {
      if (p.state != Peer::State::dialing || p.fd >= 0) continue;
      if (now >= p.redial_at) start_dial(id, p);
      else redial_pending_ = true;
    }
  }

  // Blocking write of a few hundred bytes on a fresh socket: fits in its buffer at once.
  void write_all(PeerId id, Peer& p, std::span<const std::byte> bytes) {
    size_t off = 0;
    while (off < bytes.size() && p.fd >= 0) {
      const ssize_t n = ::send(p.fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n > 0) off += static_cast<size_t>(n);
      else if (n < 0 && (errno == EAGAIN || errno == EINTR)) ::poll(nullptr, 0, 1);
      else return socket_ended(id, p, "connection closed during the hello");
    }
  }

  // Our hello to this peer: a fresh token (what it must put before its messages to us) and a fresh nonce.
  void send_hello(PeerId id, Peer& p) {
    std::vector<std::byte>& h = p.my_hello;
    h.assign(kHelloFixed, std::byte{0});
    std::memcpy(h.data(), kHelloMagic, 8);
    ClusterAuth::random_bytes({reinterpret_cast<std::byte*>(&p.token), sizeof p.token});
    const uint64_t mine = id;
    const uint32_t flags = authenticates() ? kFlagAuthenticates : 0;
    const uint32_t len = static_cast<uint32_t>(address_.size());
    std::memcpy(h.data() + 8, &mine, 8);
    std::memcpy(h.data() + 16, &p.token, 8);
    ClusterAuth::random_bytes(std::span(h).subspan(24, 16));
    std::memcpy(h.data() + 40, &flags, 4);
    std::memcpy(h.data() + 44, &len, 4);
    h.insert(h.end(), address_.begin(), address_.end());
    std::vector<std::byte> out = h;
    if (!p.dial) append(out, proof_for(p, "accept"));  // the acceptor answers with its hello and its proof at once
    write_all(id, p, out);
  }

  bool authenticates() const { return !opts_.auth_secret.empty(); }

  // Our proof for this connection: over their hello, then ours. Empty-secret runs send zeros (never checked).
  std::string proof_for(const Peer& p, std::string_view tag) const {
    if (!authenticates()) return std::string(kProofBytes, '\0');
    return ClusterAuth::proof(opts_.auth_secret, kProofPurpose, tag, p.their_hello, p.my_hello);
  }

  // Whether the peer's proof (over our hello, then theirs) shows it holds our secret.
  bool proof_holds(const Peer& p, std::string_view tag, std::span<const std::byte> proof) const {
    if (!authenticates()) return true;
    const std::string want = ClusterAuth::proof(opts_.auth_secret, kProofPurpose, tag, p.my_hello, p.their_hello);
    return ClusterAuth::same_proof(want, {reinterpret_cast<const char*>(proof.data()), proof.size()});
  }

  static void append(std::vector<std::byte>& out, const std::string& bytes) {
    const auto* b = reinterpret_cast<const std::byte*>(bytes.data());
    out.insert(out.end(), b, b + bytes.size());
  }

  void accept_all() {
    for (;;) {
      sockaddr_in from{};
      socklen_t len = sizeof from;
      const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      const PeerId id = next_peer_++;
      Peer& p = peers_[id];
      p.fd = fd;
      p.addr = control::address_text(reinterpret_cast<const sockaddr*>(&from));
      p.state = Peer::State::hello;
    }
  }

  // Socket readable: the handshake while connecting, afterwards only the end of the connection.
  void readable(PeerId id, Peer& p) {
    std::byte buf[4096];
    for (;;) {
      const ssize_t n = ::recv(p.fd, buf, sizeof buf, 0);
      if (n == 0) return socket_ended(id, p, "connection closed");
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        return socket_ended(id, p, std::strerror(errno));
      }
      if (p.state != Peer::State::hello && p.state != Peer::State::proving)
        return refuse(id, p, "bytes after the hello (not a commsched UCX peer)");
      p.rx.insert(p.rx.end(), buf, buf + n);
      if (!handshake(id, p)) return;
    }
  }

  // True while the handshake waits for more bytes; false once it is done or refused.
  bool handshake(PeerId id, Peer& p) {
    if (p.state == Peer::State::proving) return take_dialer_proof(id, p);
    const size_t have = std::min(p.rx.size(), sizeof kHelloMagic);
    if (std::memcmp(p.rx.data(), kHelloMagic, have) != 0) {
      const bool old = have == sizeof kHelloMagic && std::memcmp(p.rx.data(), kHelloMagic, 6) == 0;
      return refuse(id, p, old ? "speaks another version of the commsched UCX hello (mixed commsched builds?)"
                               : "not a commsched UCX hello (foreign or malformed bytes)"), false;
    }
    if (p.rx.size() < kHelloFixed) return true;
    uint32_t flags = 0, len = 0;
    std::memcpy(&p.their_id, p.rx.data() + 8, 8);
    std::memcpy(&p.their_token, p.rx.data() + 16, 8);
    std::memcpy(&flags, p.rx.data() + 40, 4);
    std::memcpy(&len, p.rx.data() + 44, 4);
    if (len == 0 || len > kMaxWorkerAddress)
      return refuse(id, p, "hello with a worker address of " + std::to_string(len) + " bytes"), false;
    const size_t need = kHelloFixed + len + (p.dial ? kProofBytes : 0);  // the acceptor's proof follows its hello
    if (p.rx.size() < need) return true;
    if (p.rx.size() > need) return refuse(id, p, "bytes after the hello"), false;
    p.their_hello.assign(p.rx.begin(), p.rx.begin() + static_cast<long>(kHelloFixed + len));
    // The acceptor answers before judging, so that a dialer it refuses learns why from the flags of this hello.
    if (!p.dial) send_hello(id, p);
    if (p.state == Peer::State::failed) return false;
    if (const bool theirs = flags & kFlagAuthenticates; theirs != authenticates())
      return refuse(id, p, theirs ? "it authenticates with a shared secret and this process has none (set the same "
                                    "COMMSCHED_SECRET or COMMSCHED_KEY_FILE on every process)"
                                  : "it did not authenticate: a peer without the shared secret (COMMSCHED_SECRET / "
                                    "COMMSCHED_KEY_FILE) is refused"), false;
    if (!p.dial) {  // accepted: it is a peer once its proof checks
      p.rx.clear();
      p.state = Peer::State::proving;
      return false;
    }
    if (!proof_holds(p, "accept", std::span(p.rx).subspan(kHelloFixed + len)))
      return refuse(id, p, "failed authentication: it holds a different shared secret (COMMSCHED_SECRET)"), false;
    std::vector<std::byte> proof;
    append(proof, proof_for(p, "dial"));
    write_all(id, p, proof);
    if (p.state == Peer::State::failed) return false;
    stand_up(id, p);
    return false;
  }

  bool take_dialer_proof(PeerId id, Peer& p) {
    if (p.rx.size() < kProofBytes) return true;
    if (p.rx.size() > kProofBytes) return refuse(id, p, "bytes after the hello"), false;
    if (!proof_holds(p, "dial", p.rx))
      return refuse(id, p, "failed authentication: it holds a different shared secret (COMMSCHED_SECRET)"), false;
    stand_up(id, p);
    return false;
  }

  // The handshake is done: reach the peer's UCP worker, deliver what it sent meanwhile, post what waited for it.
  void stand_up(PeerId id, Peer& p) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(p.their_hello.data() + kHelloFixed);
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;  // the socket detects failures (see the top of the file)
    if (auto s = ucp_ep_create(worker_, &ep, &p.ep); s != UCS_OK) {
      p.ep = nullptr;
      return refuse(id, p, ucs_err("cannot reach its UCX worker address", s));
    }
    for (auto* v : {&p.rx, &p.my_hello, &p.their_hello}) v->clear(), v->shrink_to_fit();
    p.state = Peer::State::up;
    p.was_up = true;
    log_lanes(p);
    deliver(id);
    while (!p.waiting.empty() && p.state == Peer::State::up) post(id, p, pop_front(p.waiting));
  }

  void refuse(PeerId id, Peer& p, const std::string& why) {
    if (p.state == Peer::State::up || p.dial) return lose(id, p, why);
    Incoming e;  // a stranger on our port: dropped, the others are served
    e.kind = Incoming::Kind::dropped;
    e.detail = "connection from " + p.addr + " dropped: " + why;
    events_.push_back(std::move(e));
    close_fd(p);
    p.inbox.clear();  // whatever it sent before failing its proof is never delivered
    p.state = Peer::State::failed;
    p.reported = true;
  }

  void socket_ended(PeerId id, Peer& p, const std::string& why) {
    if (p.dial && p.state != Peer::State::up) return schedule_redial(p);  // not there yet: dial again
    if (p.state == Peer::State::proving)  // it had our hello and proof, and left instead of proving itself
      return refuse(id, p, why + " during the handshake, before proving it holds the shared secret");
    if (p.state != Peer::State::up) {  // an accepted connection that never said hello (a port probe)
      close_fd(p);
      p.inbox.clear();
      p.state = Peer::State::failed;
      p.reported = true;
      return;
    }
    drain_ucx();  // its last words (bye, peer_lost) travelled over UCX: take them before the disconnection
    lose(id, p, why);
  }

  // The peer is gone (or dropped by us): its delivered messages stay, a disconnection follows them.
  void lose(PeerId id, Peer& p, const std::string& why) {
    if (p.state == Peer::State::failed) return;
    const bool was_up = p.state == Peer::State::up;
    p.state = Peer::State::failed;
    p.failure = why;
    close_fd(p);
    if (p.ep) retiring_.push_back(p.ep);
    p.ep = nullptr;
    for (auto& m : p.waiting) m->release();
    p.waiting.clear();
    if (!was_up && !p.dial) p.reported = true;  // never a peer of the protocol
    deliver(id);
  }

  void close_fd(Peer& p) {
    if (p.fd >= 0) ::close(p.fd);
    p.fd = -1;
  }

  void* close_ep(ucp_ep_h ep) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;  // no UCX-level goodbye: the peer learns from the socket
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &rp);
    return UCS_PTR_IS_PTR(r) ? r : nullptr;
  }

  void close_retired() {
    for (ucp_ep_h ep : retiring_)
      if (void* r = close_ep(ep)) ucp_request_free(r);  // UCX frees it when the close completes
    retiring_.clear();
  }

  void flush_all(Clock::time_point deadline) {
    ucp_request_param_t rp{};
    void* r = ucp_worker_flush_nbx(worker_, &rp);
    if (!UCS_PTR_IS_PTR(r)) return;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) progress_or_nap();
    ucp_request_free(r);
  }

  void log_lanes(Peer& p) {
    if (p.lanes_logged || !p.ep) return;
    p.lanes_logged = true;
    const std::string lanes = lanes_of(p.ep);
    if (lanes == last_lanes_) return;  // say it once per distinct choice, not per peer
    last_lanes_ = lanes;
    const char* tls = std::getenv("UCX_TLS");
    std::fprintf(stderr, "[commsched ps ucx] connection to %s over UCX transports: %s (UCX_TLS=%s), %s\n",
                 p.addr.c_str(), lanes.c_str(), tls ? tls : "unset: UCX's choice",
                 authenticates() ? "peer authenticated by the shared secret" : "unauthenticated (no shared secret)");
    std::fflush(stderr);
  }

  // ---- sending --------------------------------------------------------------------------------------------------

  std::unique_ptr<OutMsg> out_msg(PeerId peer, std::span<const std::byte> header, OutPayload payload) {
    auto m = std::make_unique<OutMsg>();
    m->peer = peer;
    m->header.resize(kPrefix + header.size());  // room for the peer's id and token for us, filled in when posted
    std::copy(header.begin(), header.end(), m->header.begin() + kPrefix);
    m->payload = std::move(payload);
    m->owner = this;
    return m;
  }

  void flush_backlog() {
    if (backlog_.empty()) return;
    const auto now = Clock::now();
    while (!backlog_.empty() && bucket_.wait_s(now) <= 0) {
      bucket_.charge(backlog_.front()->header.size() - kPrefix + backlog_.front()->payload.size, now);
      dispatch(pop_front(backlog_));
    }
  }

  void dispatch(std::unique_ptr<OutMsg> m) {
    auto it = peers_.find(m->peer);
    if (it == peers_.end()) return m->release();
    Peer& p = it->second;
    switch (p.state) {
      case Peer::State::failed: m->release(); return deliver(m->peer);
      case Peer::State::up: return post(it->first, p, std::move(m));
      default: p.waiting.push_back(std::move(m));
    }
  }

  void post(PeerId id, Peer& p, std::unique_ptr<OutMsg> m) {
    std::memcpy(m->header.data(), &p.their_id, 8);
    std::memcpy(m->header.data() + 8, &p.their_token, 8);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = &UcxTransport::on_sent;
    rp.user_data = m.get();
    ucs_status_ptr_t r = ucp_am_send_nbx(p.ep, kAmId, m->header.data(), m->header.size(), m->payload.data,
                                         m->payload.size, &rp);
    if (UCS_PTR_IS_PTR(r)) {
      in_flight_.insert(m.release());
      return;
    }
    m->release();
    if (UCS_PTR_IS_ERR(r)) lose(id, p, ucs_err("send failed", UCS_PTR_STATUS(r)));
  }

  static void on_sent(void* req, ucs_status_t /*status*/, void* user_data) {
    auto* m = static_cast<OutMsg*>(user_data);
    m->owner->in_flight_.erase(m);
    m->release();
    delete m;
    ucp_request_free(req);
  }

  // ---- receiving ------------------------------------------------------------------------------------------------

  static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                            const ucp_am_recv_param_t* param) {
    return static_cast<UcxTransport*>(arg)->arrived(header, header_length, data, length, *param);
  }

  ucs_status_t arrived(const void* header, size_t hlen, void* data, size_t len, const ucp_am_recv_param_t& prm) {
    if (hlen < kPrefix) return UCS_OK;
    PeerId id = 0;
    uint64_t token = 0;
    std::memcpy(&id, header, 8);
    std::memcpy(&token, static_cast<const std::byte*>(header) + 8, 8);
    auto it = peers_.find(id);
    // Not a connection of ours (dropped, or a stranger that guessed an id): its token is not the one we issued.
    if (it == peers_.end() || it->second.token != token) return UCS_OK;
    Peer& p = it->second;
    // The dialer is up once it has sent its proof, so its first messages may overtake the proof: keep them (up to a
    // bound) until the proof is read; they are delivered only if it holds.
    if (p.state != Peer::State::up && p.state != Peer::State::proving) return UCS_OK;
    if (p.state == Peer::State::proving && p.inbox.size() >= kMaxUnprovenMessages) {
      refuse(id, p, "sent " + std::to_string(kMaxUnprovenMessages) + " messages without finishing its handshake");
      return UCS_OK;
    }
    hlen -= kPrefix;
    if (opts_.max_message_bytes > 0 && hlen + len > opts_.max_message_bytes) {
      lose(id, p, "dropped: sent a message of " + std::to_string(hlen + len) + " bytes, over the limit of " +
                      std::to_string(opts_.max_message_bytes));
      return UCS_OK;
    }
    auto m = std::make_shared<InMsg>();
    m->owner = this;
    m->in.peer = id;
    const auto* h = static_cast<const std::byte*>(header) + kPrefix;
    m->in.header.assign(h, h + hlen);
    m->size = len;
    if (len > 0 && p.state == Peer::State::up) m->dest = landing(id, m->in.header, len);
    if (len > 0 && !m->dest) m->buf = pool_->acquire(len);
    p.inbox.push_back(m);
    if (prm.recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      m->desc = data;  // fetched right after this callback (zero-copy into our buffer, or the sink's)
      fetch_.push_back(std::move(m));
      return UCS_INPROGRESS;
    }
    // Eager: small, and UCX's buffer is reused when we return, so one copy, into the sink's destination if any.
    if (len > 0) std::memcpy(m->target(), data, len);
    m->state = InMsg::State::ready;
    deliver(id);
    return UCS_OK;
  }

  void fetch_rendezvous() {
    while (!fetch_.empty()) {
      std::shared_ptr<InMsg> m = pop_front(fetch_);
      ucp_request_param_t rp{};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      rp.cb.recv_am = &UcxTransport::on_fetched;
      auto* holder = new std::shared_ptr<InMsg>(m);
      rp.user_data = holder;
      ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, m->desc, m->target(), m->size, &rp);
      m->desc = nullptr;
      if (UCS_PTR_IS_PTR(r)) {
        ++fetching_;
        continue;
      }
      delete holder;
      fetched(*m, UCS_PTR_STATUS(r));
    }
  }

  static void on_fetched(void* req, ucs_status_t status, size_t /*length*/, void* user_data) {
    auto* holder = static_cast<std::shared_ptr<InMsg>*>(user_data);
    --(*holder)->owner->fetching_;
    (*holder)->owner->fetched(**holder, status);
    delete holder;
    ucp_request_free(req);
  }

  // A rendezvous fetch ended. One that failed loses its message; when that message was to land in the owner's memory
  // the owner waits for it, so the connection is lost (and named) rather than left one answer short. Not while
  // closing: close() itself cancels what is in flight.
  void fetched(InMsg& m, ucs_status_t status) {
    m.state = status == UCS_OK ? InMsg::State::ready : InMsg::State::failed;
    if (m.state == InMsg::State::failed && m.dest && !closing_)
      if (auto it = peers_.find(m.in.peer); it != peers_.end())
        return lose(it->first, it->second, ucs_err("the payload of a message could not be fetched", status));
    deliver(m.in.peer);
  }

  // The sink's destination for a payload of `len` bytes, when it names one of exactly that size.
  std::byte* landing(PeerId id, std::span<const std::byte> header, size_t len) {
    if (!sink_) return nullptr;
    const std::optional<std::span<std::byte>> at = sink_(id, header, len);
    return at && at->size() == len ? at->data() : nullptr;
  }

  // Moves the peer's complete messages, in arrival order, to the event queue; its disconnection after the last.
  // Nothing of a connection that has not proved itself.
  void deliver(PeerId id) {
    auto it = peers_.find(id);
    if (it == peers_.end()) return;
    Peer& p = it->second;
    if (!p.was_up) {
      if (p.state == Peer::State::failed) p.inbox.clear();
      if (p.state != Peer::State::failed || p.reported) return;
    }
    while (!p.inbox.empty() && (p.inbox.front()->state != InMsg::State::receiving || p.state == Peer::State::failed)) {
      std::shared_ptr<InMsg> m = pop_front(p.inbox);
      if (m->state != InMsg::State::ready) continue;  // cut off by the peer's loss
      if (m->dest) m->in.payload = std::make_unique<LandedPayload>(std::span(m->dest, m->size));
      else if (m->size > 0) m->in.payload = std::make_unique<PooledPayload>(std::move(m->buf), m->size);
      events_.push_back(std::move(m->in));
    }
    if (p.state == Peer::State::failed && p.inbox.empty() && !p.reported) {
      p.reported = true;
      Incoming e;
      e.kind = Incoming::Kind::disconnected;
      e.peer = id;
      e.detail = p.addr.empty() ? p.failure : p.addr + " (" + p.failure + ")";
      events_.push_back(std::move(e));
    }
  }

  // ---- the I/O loop -----------------------------------------------------------------------------------------------

  void drain_ucx() {
    for (;;) {
      unsigned n = 0;
      while (ucp_worker_progress(worker_)) ++n;
      const bool fetched = !fetch_.empty();
      fetch_rendezvous();
      if (n == 0 && !fetched) break;
      last_progress_ = Clock::now();
    }
  }

  void progress() {
    flush_backlog();
    drain_ucx();
    poll_sockets(0);
    close_retired();
    redial_due();
  }

  void progress_or_nap() {
    progress();
    if (ucp_worker_arm(worker_) == UCS_OK) poll_sockets(1);
  }

  // Handles whatever the sockets have (accepts, hellos, ends); waits up to timeout_ms. A wake() seen here sets
  // woken_ for receive() to return on, wherever the poll happened: progress() polls too, and a wake it swallowed
  // once left receive() asleep until its timeout (a heartbeat: ~100 ms per iteration of a small-tensor job).
  void poll_sockets(long timeout_ms) {
    fds_.clear();
    fd_peer_.clear();
    fds_.push_back({wake_fd_, POLLIN, 0});
    fds_.push_back({efd_, POLLIN, 0});
    fds_.push_back({listen_fd_, POLLIN, 0});
    for (auto& [id, p] : peers_) {
      if (p.fd < 0) continue;
      fds_.push_back({p.fd, static_cast<short>(p.state == Peer::State::dialing ? POLLOUT : POLLIN), 0});
      fd_peer_.push_back(id);
    }
    if (::poll(fds_.data(), fds_.size(), static_cast<int>(std::min<long>(timeout_ms, 1 << 30))) <= 0) return;
    if (fds_[2].revents & POLLIN) accept_all();
    for (size_t i = 3; i < fds_.size(); ++i) {
      if (!fds_[i].revents) continue;
      const PeerId id = fd_peer_[i - 3];
      Peer& p = peers_[id];
      if (p.fd != fds_[i].fd) continue;
      if (p.state == Peer::State::dialing) dialed(id, p);
      else readable(id, p);
    }
    if (fds_[0].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
      woken_ = true;
    }
  }

  TransportOptions opts_;
  TokenBucket bucket_;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::byte> address_;  // our UCP worker address, sent in every hello
  int listen_fd_ = -1;
  int efd_ = -1;
  int wake_fd_ = -1;
  bool woken_ = false;  // wake() was called since receive() last returned
  PeerId next_peer_ = 1;
  std::unordered_map<PeerId, Peer> peers_;
  std::vector<ucp_ep_h> retiring_;
  std::unordered_set<OutMsg*> in_flight_;
  std::deque<std::unique_ptr<OutMsg>> backlog_;
  std::deque<std::shared_ptr<InMsg>> fetch_;
  std::deque<Incoming> events_;
  std::vector<pollfd> fds_;
  std::vector<PeerId> fd_peer_;
  std::shared_ptr<BufferPool> pool_ = BufferPool::create();
  PayloadSink sink_;
  bool closing_ = false;  // inside close(): failed fetches are cancellations, not losses
  size_t fetching_ = 0;   // rendezvous fetches UCX is still doing
  std::string last_lanes_;
  bool redial_pending_ = false;
  Clock::time_point last_progress_{};
  static constexpr std::chrono::microseconds spin_{100};
};

}  // namespace

std::unique_ptr<Transport> make_ucx_transport(const TransportOptions& opts) {
  return std::make_unique<UcxTransport>(opts);
}

}  // namespace commsched::ps
