#include "comm_backends/collective/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "comm_backends/collective/wire.h"

namespace commsched::collective {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string endpoint(const std::string& host, int port) { return host + ":" + std::to_string(port); }

timeval to_timeval(double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

// Resolves host:port to IPv4 TCP addresses (the cluster contract speaks IPv4 addresses and host names).
struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

void resolve(const std::string& host, int port, int socktype, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = socktype;
  if (passive) hints.ai_flags = AI_PASSIVE;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out.list);
  if (rc != 0 || out.list == nullptr)
    throw std::runtime_error("cannot resolve " + endpoint(host, port) + ": " + gai_strerror(rc));
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Fd listen_tcp(const std::string& host, int port, int backlog) {
  AddrInfo ai;
  resolve(host, port, SOCK_STREAM, true, ai);
  Fd fd(::socket(ai.list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw std::runtime_error("socket() for " + endpoint(host, port) + ": " + errno_text());
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), ai.list->ai_addr, ai.list->ai_addrlen) != 0)
    throw std::runtime_error("cannot bind " + endpoint(host, port) + ": " + errno_text());
  if (::listen(fd.get(), backlog) != 0) throw std::runtime_error("cannot listen on " + endpoint(host, port) + ": " + errno_text());
  return fd;
}

int bound_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) throw std::runtime_error("getsockname: " + errno_text());
  return ntohs(addr.sin_port);
}

Fd connect_tcp(const std::string& host, int port, std::chrono::steady_clock::time_point deadline) {
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    AddrInfo ai;
    resolve(host, port, SOCK_STREAM, false, ai);
    Fd fd(::socket(ai.list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) throw std::runtime_error("socket() for " + endpoint(host, port) + ": " + errno_text());
    if (::connect(fd.get(), ai.list->ai_addr, ai.list->ai_addrlen) == 0) return fd;
    const int err = errno;
    // Refused/unreachable: the server is not listening yet; anything else is a real error.
    if (err != ECONNREFUSED && err != ENETUNREACH && err != ETIMEDOUT && err != EHOSTUNREACH && err != EAGAIN)
      throw std::runtime_error("cannot connect to " + endpoint(host, port) + ": " + std::strerror(err));
    if (std::chrono::steady_clock::now() + backoff > deadline)
      throw std::runtime_error("cannot connect to " + endpoint(host, port) + " before the timeout: " + std::strerror(err));
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

Fd accept_tcp(int listen_fd) {
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return Fd();
    throw std::runtime_error("accept: " + errno_text());
  }
  return Fd(fd);
}

void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void tune_control_socket(int fd, double send_timeout_s) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const timeval tv = to_timeval(send_timeout_s);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void send_all(int fd, std::string_view bytes, const std::string& what) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const bool timed_out = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    throw std::runtime_error(what + ": send failed: " + (timed_out ? std::string("timed out") : errno_text()));
  }
}

std::string recv_exact(int fd, size_t n, const std::string& what) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error(what + ": connection closed");
    throw std::runtime_error(what + ": receive failed: " +
                             ((errno == EAGAIN || errno == EWOULDBLOCK) ? std::string("timed out") : errno_text()));
  }
  return out;
}

std::string recv_frame(int fd, const std::string& what, uint32_t max_bytes) {
  const std::string len_bytes = recv_exact(fd, sizeof(uint32_t), what);
  uint32_t len;
  std::memcpy(&len, len_bytes.data(), sizeof len);
  if (len > max_bytes)
    throw std::runtime_error(what + ": oversized frame (" + std::to_string(len) + " bytes, at most " +
                             std::to_string(max_bytes) + ")");
  return recv_exact(fd, len, what);
}

void set_receive_timeout(int fd, double seconds) {
  const timeval tv = to_timeval(seconds);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

}  // namespace commsched::collective
