// Transport: moves framed messages between PS processes. The protocol, server and worker code talk only to this
// interface (no ZeroMQ or UCX header), so the transports are interchangeable (COMMSCHED_PS_TRANSPORT).
// Endpoints are "tcp://host:port" IP socket addresses for both: UCX's connection manager listens on one too.
//
// Threading: every call except wake() comes from one thread (the owner's I/O loop); a transport may be handed from
// the thread that made it to the I/O thread once (a thread start orders the two).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace commsched::ps {

// Transport-assigned handle of a remote peer (a connection we made, or one that reached our bound endpoint).
using PeerId = uint64_t;

// A received payload frame. Zero-copy: the bytes live in the transport's own buffer until this object dies, or in
// the destination the owner's PayloadSink chose (landed()).
class Payload {
 public:
  virtual ~Payload() = default;
  virtual std::span<const std::byte> bytes() const = 0;
  // True: bytes() is the destination the PayloadSink returned for this message, and the payload already sits there
  // (the receiver must not copy it again).
  virtual bool landed() const { return false; }
};

// A payload that the transport wrote straight into the sink's destination: it owns nothing.
class LandedPayload final : public Payload {
 public:
  explicit LandedPayload(std::span<std::byte> at) : at_(at) {}
  std::span<const std::byte> bytes() const override { return at_; }
  bool landed() const override { return true; }

 private:
  std::span<std::byte> at_;
};

// Where an arriving message's payload should land, asked by the transport on its I/O thread (the owner's thread,
// inside receive()/close()) before the payload is received: the peer, the message's header frame and the payload's
// size. A span of exactly `payload_bytes` bytes: the payload is written there and delivered as a landed() Payload
// (unless the transport ignores sinks, see set_payload_sink); nullopt: the transport's own buffer, as without a sink.
// A span of another size is a bug of the owner's; the transport then uses its own buffer too.
// Lifetime: the transport may write into a returned span until it delivers that message, or, when the message is
// never delivered (its peer was lost, the transport closed), until close() returns. close() forgets the sink first.
using PayloadSink = std::function<std::optional<std::span<std::byte>>(PeerId peer, std::span<const std::byte> header,
                                                                      size_t payload_bytes)>;

// A payload to send without copying. `release` runs (on any thread) once the transport will never read `data` again.
// With `pieces` (see gathered()), the payload is those ranges one after another and `data` is unused: a transport
// that sends a gather list (UCX: an IOV datatype) reads them in place, the others copy them into one buffer.
struct OutPayload {
  const std::byte* data = nullptr;
  size_t size = 0;
  std::function<void()> release;
  std::vector<std::span<const std::byte>> pieces = {};
};

// A payload of several ranges (size: their total); `release` runs once none of them is read any more.
OutPayload gathered(std::vector<std::span<const std::byte>> pieces, std::function<void()> release);

struct Incoming {
  enum class Kind {
    message,        // header (+ optional payload) from `peer`
    disconnected,   // `peer` went away (connection closed or unroutable)
    dropped,        // the transport refused a connection or message (foreign bytes); `detail` says why
  };
  Kind kind = Kind::message;
  PeerId peer = 0;
  std::vector<std::byte> header;
  std::unique_ptr<Payload> payload;  // null: no payload frame
  size_t extra_frames = 0;           // frames beyond header+payload (a malformed message)
  std::string detail;                // for disconnected/dropped: remote address or reason
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Listens on `host` (an address or an interface name) at `port` (0: any free port). Returns the endpoint others
  // connect to ("tcp://10.0.0.2:40123"). Throws std::runtime_error naming the endpoint on failure.
  virtual std::string bind(const std::string& host, int port) = 0;
  // Starts connecting to an endpoint (returns at once; messages queue until connected).
  virtual PeerId connect(const std::string& endpoint) = 0;
  // Queues a message: the header is copied, the payload is sent zero-copy. A gone peer is reported by receive().
  virtual void send(PeerId peer, std::span<const std::byte> header, OutPayload payload = {}) = 0;
  // A header-only liveness message (a ping). Under an EMULATED rate it skips the emulation's send queue: a real NIC
  // interleaves a small packet with bulk flows, while that one FIFO would hold it behind every payload queued (seconds
  // of a big model's sums at 2 Gbit/s), and the peer would judge us lost. Unpaced, it may overtake earlier messages.
  virtual void send_ping(PeerId peer, std::span<const std::byte> header) { send(peer, header); }
  // The next event, waiting at most `timeout`; nullopt on timeout or after wake().
  virtual std::optional<Incoming> receive(std::chrono::milliseconds timeout) = 0;
  // Makes a concurrent or the next receive() return early. Thread-safe.
  virtual void wake() = 0;
  // Closes every connection. graceful: try to deliver what is queued (up to 0.5 s); otherwise drop it.
  // On return no payload is referenced any more (every `release` has run).
  virtual void close(bool graceful) = 0;
  // Human-readable remote address of a peer, for logs and errors ("" when unknown).
  virtual std::string describe(PeerId peer) const = 0;
  // Registers the sink that may choose where payloads land (empty: none). Call from the owner's thread. A transport
  // may ignore it (this default): the ZeroMQ transport does, because its frames arrive in ZeroMQ's own buffers, so
  // landing in the owner's memory would still be one copy, the same one the owner makes from the delivered frame.
  virtual void set_payload_sink(PayloadSink sink) { (void)sink; }
};

struct TransportOptions {
  double emulate_rate_bps = 0;      // >0: EMULATION of a link of this rate (token bucket on our sends); 0: off
  uint64_t max_message_bytes = 0;   // >0: connections sending bigger messages are dropped
  int io_threads = 1;
  // Non-empty: every connection is authenticated and encrypted with keys derived from this shared secret (ZeroMQ
  // CURVE); a peer without it is refused during the handshake, reported as `dropped`, and never delivers a message.
  std::string auth_secret;
  // UCX over shared memory only: this side's rendezvous sends are copied by this side into the receiver's memory
  // (UCX's put scheme), not read by the receiver. The PS worker sets it: with the server's sends read by the worker
  // (UCX's default), the worker makes both copies of a push_pull, each against the server's pooled huge-page buffers,
  // and the server's I/O thread copies nothing (ucx_transport.cc says what it measured).
  bool sender_writes_rendezvous = false;
};

std::unique_ptr<Transport> make_zmq_transport(const TransportOptions& opts);
// UCX (UCP active messages: shared memory, TCP, InfiniBand/RoCE verbs, as UCX_TLS allows). Only when ucx_built_in().
std::unique_ptr<Transport> make_ucx_transport(const TransportOptions& opts);
bool ucx_built_in();
// The transport a validated COMMSCHED_PS_TRANSPORT names: "zmq" or "ucx".
std::unique_ptr<Transport> make_transport(const std::string& kind, const TransportOptions& opts);

}  // namespace commsched::ps
