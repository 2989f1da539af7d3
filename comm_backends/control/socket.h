// The one TCP helper of every control link: the rendezvous store, the order negotiation, the launchers' node link,
// the free ports a launcher hands out, and the address rules of every loop (which address this process binds to and
// advertises, how a peer is named in an error). Blocking sockets with deadlines; frames are a 32-bit length and the
// bytes (collective/wire.h writes them).
// Plain sockets rather than ZeroMQ: a closed connection tells us at once which peer died (one socket per peer), and a
// round trip costs one kernel hop each way instead of going through ZeroMQ's I/O thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <netinet/in.h>

#include "comm_backends/cluster_env.h"

struct sockaddr;

namespace commsched::control {

using Deadline = std::chrono::steady_clock::time_point;

// Control frames are small; anything bigger than this is a corrupted stream or a foreign client.
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Listens on host:port (host "" or "*": every interface; port 0: any free port). Throws std::runtime_error naming
// the address.
Fd listen_tcp(const std::string& host, int port, int backlog = 128);
// The port a listening socket is bound to, and its "ip:port" ("" when it has none).
int bound_port(int fd);
std::string bound_address(int fd);
// A TCP port on `host` nobody listens on, picked below the kernel's ephemeral range (32768 and up by default): a port
// found by bind(0) and closed again may be handed to the next bind(0) (another process's listener, seen with UCX:
// server 1 listened on the root's port before server 0 could bind it), while one below the range never is.
// For ports a launcher hands to processes it starts; a listener of our own binds port 0. Never one of the last 64 this
// process was handed (they may not be bound yet). Throws naming the host.
int free_port(const std::string& host = "127.0.0.1");
// Connects to host:port, retrying refused connections until `deadline` (the server may not be up yet).
Fd connect_tcp(const std::string& host, int port, Deadline deadline);
// host:port as an IPv4 socket address (host "" or "*": every interface; an interface name: its address). Throws
// std::runtime_error naming host:port when it cannot be resolved.
sockaddr_in resolve_ipv4(const std::string& host, int port);
// For an event loop: starts a non-blocking connect to `to` (TCP_NODELAY); the loop finishes it (writable, then
// SO_ERROR). An invalid Fd when it failed at once; `connected` says whether it stood at once.
Fd start_connect(const sockaddr_in& to, bool& connected);
// Accepts one connection (blocking unless the listener is non-blocking); returns an invalid Fd on EAGAIN.
Fd accept_tcp(int listen_fd);
void set_nonblocking(int fd, bool on);
// Low latency for small control messages, and a bounded blocking send so a stuck peer cannot hang us forever.
void tune_control_socket(int fd, double send_timeout_s);
// Waits until fd is readable (or closed) or the deadline passes; false at the deadline.
bool wait_readable(int fd, Deadline deadline);

// For transports this code does not write itself (Gloo's TCP pairs write with writev, which has no MSG_NOSIGNAL): a
// write to a peer that died raises SIGPIPE, whose default action kills this rank before it can report the loss and
// name the peer. Ignores SIGPIPE unless the program set its own disposition (Python already ignores it), so such a
// write fails with EPIPE instead. Returns whether it changed the disposition.
bool ignore_sigpipe_unless_handled();

// Writes all bytes (blocking socket); false when the peer is gone or the send timed out (errno says which).
bool send_bytes(int fd, std::string_view bytes);
// Writes all bytes (blocking socket). Throws std::runtime_error with `what` on failure or timeout.
void send_all(int fd, std::string_view bytes, const std::string& what);
// Reads exactly n bytes (blocking socket) or throws; `what` names the peer.
std::string recv_exact(int fd, size_t n, const std::string& what);
// Reads one length-prefixed frame from a blocking socket, its length prefix stripped; throws naming `what` when the
// socket fails, times out or announces more than max_bytes (before reading or allocating any of it).
std::string recv_frame(int fd, const std::string& what, uint32_t max_bytes = kMaxFrameBytes);
// The same, waiting for its first byte no longer than `deadline` ("<what>: no message before the deadline").
std::string recv_frame(int fd, const std::string& what, Deadline deadline, uint32_t max_bytes = kMaxFrameBytes);
// Bounds every blocking receive on fd (0: no bound), so a peer that says nothing cannot hold us.
void set_receive_timeout(int fd, double seconds);

// Host part to bind data sockets to: COMMSCHED_BIND (address or interface name, ZeroMQ accepts both; '*' for every
// interface) or else the local address of the route towards the root (127.0.0.1 when the root is on loopback).
std::string bind_host(const ClusterEnv& env);
// Address other processes use to reach us: COMMSCHED_BIND's address (an interface name is resolved to its IPv4
// address) or else the local address of the route towards the root. Throws std::runtime_error naming the culprit.
std::string advertised_host(const ClusterEnv& env);
// IPv4 address of the interface `name` ("" when there is none).
std::string interface_address(const std::string& name);
// The local address the kernel would use to reach host:port (a UDP "connect" picks the route and sends nothing).
// Throws std::runtime_error naming host:port when it cannot be resolved or has no route (callers pass the root).
std::string local_address_towards(const std::string& host, int port);
// "ip:port" of an IPv4 socket address ("" for any other family or none): how a peer is named in messages.
std::string address_text(const sockaddr* address);
// "ip:port" of the other end of the connected socket `fd` ("" when it has none).
std::string peer_address(int fd);

}  // namespace commsched::control
