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
// every UCX callback runs inside ucp_worker_progress() on that thread. wake() touches only our own flag and eventfd.
// Receive buffers come from a BufferPool, so after the first rounds the same addresses recur and UCX's registration
// cache (used by RDMA rendezvous) hits; send buffers are the callers' tensors, registered through the same cache.
// With a PayloadSink (the PS worker's pulls), a payload lands in the owner's memory instead: a rendezvous message is
// fetched straight into it (one CMA copy or RDMA read, no copy after), an eager one is copied into it from UCX's
// buffer (the one copy it would otherwise take into the pool). Only proven peers' messages are offered to the sink.
//
// One class over three files, by job: ucx_transport.cc (the Transport calls, setup and close, the I/O loop),
// ucx_connection.cc (each connection's TCP socket: dialing, the hello and its authentication, loss),
// ucx_data_path.cc (messages as UCP active messages: sending, receiving, delivery in order). Internal to
// comm_backends/ps: included only by those three.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "comm_backends/ps/buffer_pool.h"
#include "comm_backends/ps/token_bucket.h"
#include "comm_backends/ps/transport.h"

namespace commsched::ps::ucx {

using Clock = std::chrono::steady_clock;
constexpr unsigned kAmId = 0;
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
constexpr auto kSocketPollEvery = std::chrono::milliseconds(1);
// Sends of one peer UCX may hold uncompleted. A send UCX takes at once (eager, room in the peer's FIFO) is complete
// and never counts; the rest are rendezvous waiting for the peer to fetch them, or sends waiting for room. Beyond
// this, a peer that falls behind costs its senders nothing: they hold the rest and sleep (see kStuckNap).
constexpr size_t kMaxPostedPerPeer = 64;
// How long a transport whose sends wait for room in a peer's shared FIFO sleeps before trying again (receive()).
constexpr auto kStuckNap = std::chrono::microseconds(50);


inline std::string ucs_err(const std::string& what, ucs_status_t s) { return what + ": " + ucs_status_string(s); }

// Set on the I/O thread while close() runs: its flush and endpoint closes (see filter_ucx_log in ucx_transport.cc).
extern thread_local bool in_close;

class UcxTransport;

struct OutMsg {  // one message until UCX lets go of its payload
  PeerId peer = 0;
  std::vector<std::byte> header;  // the peer's id and token for us, then the header frame
  OutPayload payload;
  std::vector<ucp_dt_iov_t> iov;  // the payload's pieces, while UCX reads them
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
  // Sends not yet given to UCX: made before the connection stood, or while UCX held kMaxPostedPerPeer of ours.
  std::deque<std::unique_ptr<OutMsg>> waiting;
  size_t posted = 0;  // sends UCX has taken and not completed (waiting for room in the peer's FIFO, or a rendezvous)
  std::deque<std::shared_ptr<InMsg>> inbox;     // arrival order (a rendezvous may finish after a later eager message)
  std::string failure;
  bool reported = false;
  bool lanes_logged = false;
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportOptions& o);
  ~UcxTransport() override;
  std::string bind(const std::string& host, int port) override;
  PeerId connect(const std::string& endpoint) override;
  void send(PeerId peer, std::span<const std::byte> header, OutPayload payload) override;
  void send_ping(PeerId peer, std::span<const std::byte> header) override;
  std::optional<Incoming> receive(std::chrono::milliseconds timeout) override;
  void wake() override;
  void set_payload_sink(PayloadSink sink) override { sink_ = std::move(sink); }
  void close(bool graceful) override;
  std::string describe(PeerId peer) const override;

 private:
  void check(ucs_status_t s, const char* what);
  template <class T>
  static T pop_front(std::deque<T>& q) {
    T v = std::move(q.front());
    q.pop_front();
    return v;
  }
  Incoming pop_event() { return pop_front(events_); }
  bool any_waiting() const;

  // ---- connections (ucx_connection.cc): the TCP socket (hello, then liveness) ---------------------------------
  void start_dial(PeerId id, Peer& p);
  void dialed(PeerId id, Peer& p);
  void schedule_redial(Peer& p);
  void redial_due();
  void write_all(PeerId id, Peer& p, std::span<const std::byte> bytes);
  void send_hello(PeerId id, Peer& p);
  bool authenticates() const { return !opts_.auth_secret.empty(); }
  std::string proof_for(const Peer& p, std::string_view tag) const;
  bool proof_holds(const Peer& p, std::string_view tag, std::span<const std::byte> proof) const;
  static void append(std::vector<std::byte>& out, const std::string& bytes);
  void accept_all();
  void readable(PeerId id, Peer& p);
  bool handshake(PeerId id, Peer& p);
  bool take_dialer_proof(PeerId id, Peer& p);
  void stand_up(PeerId id, Peer& p);
  void refuse(PeerId id, Peer& p, const std::string& why);
  void socket_ended(PeerId id, Peer& p, const std::string& why);
  void lose(PeerId id, Peer& p, const std::string& why);
  void close_fd(Peer& p);
  void* close_ep(ucp_ep_h ep);
  void close_retired();
  void flush_all(Clock::time_point deadline);
  void log_lanes(Peer& p);

  // ---- sending (ucx_data_path.cc) -------------------------------------------------------------------------------
  std::unique_ptr<OutMsg> out_msg(PeerId peer, std::span<const std::byte> header, OutPayload payload);
  void flush_backlog();
  void dispatch(std::unique_ptr<OutMsg> m);
  void post(PeerId id, Peer& p, std::unique_ptr<OutMsg> m);
  void post_waiting(PeerId id, Peer& p);
  void post_freed();
  static void on_sent(void* req, ucs_status_t /*status*/, void* user_data);

  // ---- receiving (ucx_data_path.cc) -----------------------------------------------------------------------------
  static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                            const ucp_am_recv_param_t* param);
  ucs_status_t arrived(const void* header, size_t hlen, void* data, size_t len, const ucp_am_recv_param_t& prm);
  void fetch_rendezvous();
  static void on_fetched(void* req, ucs_status_t status, size_t /*length*/, void* user_data);
  void fetched(InMsg& m, ucs_status_t status);
  std::byte* landing(PeerId id, std::span<const std::byte> header, size_t len);
  void deliver(PeerId id);

  // ---- the I/O loop (ucx_transport.cc) --------------------------------------------------------------------------
  void drain_ucx();
  void progress();
  void progress_or_nap();
  void poll_sockets(std::chrono::microseconds timeout, bool ucx_events = true);
  bool stuck_on_peers() const;
  bool took_wake();

  TransportOptions opts_;
  TokenBucket bucket_;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::byte> address_;  // our UCP worker address, sent in every hello
  int listen_fd_ = -1;
  int efd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> wake_flag_{false};  // wake() was called since the I/O thread last looked (took_wake)
  PeerId next_peer_ = 1;
  std::unordered_map<PeerId, Peer> peers_;
  std::vector<ucp_ep_h> retiring_;
  std::unordered_set<OutMsg*> in_flight_;
  std::vector<PeerId> freed_;  // peers with waiting sends whose completions freed room (post_freed)
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
  Clock::time_point last_socket_poll_{};
  static constexpr std::chrono::microseconds spin_{100};
};

}  // namespace commsched::ps::ucx
