// Small blocking/non-blocking TCP helpers for the rendezvous store and the order negotiator (the route towards the
// root is comm_backends/control/net_util.h's, shared with the parameter server).
// Plain sockets rather than ZeroMQ: a closed connection tells us at once which peer died (one socket per rank), and a
// round trip costs one kernel hop each way instead of going through ZeroMQ's I/O thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "comm_backends/collective/wire.h"

namespace commsched::collective {

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

// Listens on host:port (port 0: any free port). Throws std::runtime_error naming the address.
Fd listen_tcp(const std::string& host, int port, int backlog = 128);
// The port a listening socket is bound to.
int bound_port(int fd);
// Connects to host:port, retrying refused connections until `deadline` (the server may not be up yet).
Fd connect_tcp(const std::string& host, int port, std::chrono::steady_clock::time_point deadline);
// Accepts one connection (blocking unless the listener is non-blocking); returns an invalid Fd on EAGAIN.
Fd accept_tcp(int listen_fd);
void set_nonblocking(int fd, bool on);
// Low latency for small control messages, and a bounded blocking send so a stuck peer cannot hang us forever.
void tune_control_socket(int fd, double send_timeout_s);
// Writes all bytes (blocking socket). Throws std::runtime_error with `what` on failure or timeout.
void send_all(int fd, std::string_view bytes, const std::string& what);
// Reads exactly n bytes (blocking socket) or throws; `what` names the peer.
std::string recv_exact(int fd, size_t n, const std::string& what);
// Reads one length-prefixed frame (wire.h) from a blocking socket, its length prefix stripped; throws naming `what`
// when the socket fails, times out or announces more than max_bytes (before reading or allocating any of it).
std::string recv_frame(int fd, const std::string& what, uint32_t max_bytes = kMaxFrameBytes);
// Bounds every blocking receive on fd (0: no bound), so a peer that says nothing cannot hold us.
void set_receive_timeout(int fd, double seconds);

}  // namespace commsched::collective
