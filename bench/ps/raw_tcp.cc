#include "bench/ps/raw_tcp.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm_backends/control/socket.h"

namespace commsched::bench {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A bench has no caller to tell: a socket that cannot be set up ends the run, naming the address.
[[noreturn]] void fail(const std::exception& e) {
  std::fprintf(stderr, "raw TCP: %s\n", e.what());
  std::exit(1);
}

int dial(const std::string& addr, int port) {
  try {
    return control::connect_tcp(addr, port, std::chrono::steady_clock::now() + std::chrono::seconds(5)).release();
  } catch (const std::exception& e) {
    fail(e);
  }
}

bool read_full(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r, n -= static_cast<size_t>(r);
  }
  return true;
}
// Sends are the control plane's (no SIGPIPE, EINTR retried); a failed one is seen by the reader (bytes missing).
void write_full(int fd, const void* p, size_t n) { control::send_bytes(fd, {static_cast<const char*>(p), n}); }

}  // namespace

int listen_on(const std::string& addr, int port) {
  try {
    return control::listen_tcp(addr, port, 4).release();
  } catch (const std::exception& e) {
    fail(e);
  }
}

void raw_server(int lfd) {
  std::vector<char> buf(4 << 20);
  for (;;) {
    int fd;
    try {
      fd = control::accept_tcp(lfd).release();
    } catch (const std::exception&) {
      return;  // the listening socket was shut or closed
    }
    if (fd < 0) continue;  // interrupted, or the client gave up before we took it
    char mode = 0;
    uint64_t total = 0;
    if (read_full(fd, &mode, 1) && read_full(fd, &total, 8)) {
      uint64_t left = total;
      while (left) {
        const ssize_t r = ::read(fd, buf.data(), std::min<uint64_t>(left, buf.size()));
        if (r <= 0) break;
        if (mode == 'E') write_full(fd, buf.data(), static_cast<size_t>(r));
        left -= static_cast<uint64_t>(r);
      }
      if (mode == 'D') write_full(fd, "k", 1);
    }
    ::close(fd);
  }
}

// A receiver thread drains the echo while the sender keeps the window full.
double raw_echo(const std::string& addr, int port, uint64_t part, uint64_t total, uint64_t window_bytes) {
  const int fd = dial(addr, port);
  char mode = 'E';
  write_full(fd, &mode, 1);
  write_full(fd, &total, 8);
  std::atomic<uint64_t> received{0};
  std::vector<char> out(part, 'x');
  const auto t0 = Clock::now();
  std::thread rx([&] {
    std::vector<char> in(4 << 20);
    while (received < total) {
      const ssize_t r = ::read(fd, in.data(), std::min<uint64_t>(in.size(), total - received));
      if (r <= 0) break;
      received += static_cast<uint64_t>(r);
    }
  });
  for (uint64_t sent = 0; sent < total; sent += part) {
    while (sent - received.load() + part > window_bytes) std::this_thread::yield();
    write_full(fd, out.data(), part);
  }
  rx.join();
  const double secs = seconds_since(t0);
  ::close(fd);
  return received == total ? static_cast<double>(total) / secs : 0;  // 0: the echo broke off
}

double raw_oneway(const std::string& addr, int port, uint64_t part, uint64_t total) {
  const int fd = dial(addr, port);
  char mode = 'D', ack;
  write_full(fd, &mode, 1);
  write_full(fd, &total, 8);
  std::vector<char> out(part, 'x');
  const auto t0 = Clock::now();
  for (uint64_t sent = 0; sent < total; sent += part) write_full(fd, out.data(), part);
  const bool answered = read_full(fd, &ack, 1);
  const double secs = seconds_since(t0);
  ::close(fd);
  return answered ? static_cast<double>(total) / secs : 0;  // 0: the server did not take it all
}

}  // namespace commsched::bench
