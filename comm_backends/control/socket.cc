#include "comm_backends/control/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

namespace commsched::control {
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
  const bool any = host.empty() || host == "*";  // every interface
  const std::string iface = any ? std::string() : interface_address(host);  // COMMSCHED_BIND may name an interface
  const std::string name = iface.empty() ? host : iface;
  const int rc = getaddrinfo(any ? nullptr : name.c_str(), service.c_str(), &hints, &out.list);
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

std::string bound_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (fd < 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return {};
  return address_text(reinterpret_cast<const sockaddr*>(&a));
}

int bound_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) throw std::runtime_error("getsockname: " + errno_text());
  return ntohs(addr.sin_port);
}

int free_port(const std::string& host) {
  static std::mt19937 rng(std::random_device{}());
  static std::mutex mu;
  // The ports handed out lately: a port is only known free when it is picked, and a caller that asks for two before
  // it binds the first (a rendezvous port and a store port) must not get the same one twice (a test failed so).
  static std::deque<int> recent;
  std::lock_guard lock(mu);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    if (std::find(recent.begin(), recent.end(), port) != recent.end()) continue;
    try {
      listen_tcp(host, port, 1);  // closed again at once: nobody listened there
      recent.push_back(port);
      if (recent.size() > 64) recent.pop_front();
      return port;
    } catch (const std::runtime_error&) {
    }
  }
  throw std::runtime_error("no free TCP port on " + host + " in 20000-31999");
}

Fd connect_tcp(const std::string& host, int port, Deadline deadline) {
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

sockaddr_in resolve_ipv4(const std::string& host, int port) {
  AddrInfo ai;
  resolve(host, port, SOCK_STREAM, true, ai);
  sockaddr_in a{};
  std::memcpy(&a, ai.list->ai_addr, sizeof a);
  return a;
}

Fd start_connect(const sockaddr_in& to, bool& connected) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fd;
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  connected = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0;
  if (!connected && errno != EINPROGRESS) fd.reset();
  return fd;
}

bool wait_readable(int fd, Deadline deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
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

bool ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return false;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  return ::sigaction(SIGPIPE, &ignore, nullptr) == 0;
}

bool send_bytes(int fd, std::string_view bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EPIPE;
    return false;
  }
  return true;
}

void send_all(int fd, std::string_view bytes, const std::string& what) {
  if (send_bytes(fd, bytes)) return;
  const bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
  throw std::runtime_error(what + ": send failed: " + (timed_out ? std::string("timed out") : errno_text()));
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

std::string recv_frame(int fd, const std::string& what, Deadline deadline, uint32_t max_bytes) {
  if (!wait_readable(fd, deadline)) throw std::runtime_error(what + ": no message before the deadline");
  return recv_frame(fd, what, max_bytes);
}

void set_receive_timeout(int fd, double seconds) {
  const timeval tv = to_timeval(seconds);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}


std::string interface_address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && name == a->ifa_name) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
      break;
    }
  }
  freeifaddrs(list);
  return found;
}

std::string local_address_towards(const std::string& host, int port) {
  AddrInfo ai;
  try {
    if (host.empty()) throw std::runtime_error("empty");
    resolve(host, port, SOCK_DGRAM, false, ai);
  } catch (const std::runtime_error&) {
    throw std::runtime_error("cannot resolve the rendezvous root COMMSCHED_ROOT_ADDR='" + host + "'");
  }
  // A UDP "connect" picks the route and sends nothing.
  const Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  std::string out;
  if (fd.valid() && ::connect(fd.get(), ai.list->ai_addr, ai.list->ai_addrlen) == 0) {
    out = bound_address(fd.get());
    out = out.substr(0, out.rfind(':'));
  }
  if (out.empty()) throw std::runtime_error("no route to the rendezvous root " + host + ":" + std::to_string(port));
  return out;
}

// Never every interface by default: the one that faces the root (loopback for a one-host run), so a port is not
// reachable from networks the run does not use. COMMSCHED_BIND='*' asks for every interface explicitly.
std::string bind_host(const ClusterEnv& env) {
  if (!env.bind.empty()) return env.bind;
  return local_address_towards(env.root_addr, env.root_port);
}

std::string advertised_host(const ClusterEnv& env) {
  if (env.bind.empty()) return local_address_towards(env.root_addr, env.root_port);
  if (auto a = interface_address(env.bind); !a.empty()) return a;
  in_addr probe{};
  if (inet_pton(AF_INET, env.bind.c_str(), &probe) == 1) return env.bind;
  throw std::runtime_error("COMMSCHED_BIND='" + env.bind + "' is neither an IPv4 address nor an interface with one");
}

std::string address_text(const sockaddr* address) {
  if (!address || address->sa_family != AF_INET) return {};
  const auto* in = reinterpret_cast<const sockaddr_in*>(address);
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
}

std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (fd < 0 || getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return {};
  return address_text(reinterpret_cast<const sockaddr*>(&a));
}

}  // namespace commsched::control
