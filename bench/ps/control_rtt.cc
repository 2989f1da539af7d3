// Round trip of one small control message (an 80-byte header, a negotiation report's size) between two threads on
// loopback, side by side: the plain TCP sockets the collective negotiation writes to directly from the submitting
// thread, and the `Transport`s the control plane (comm_backends/control/van.h) runs on, driven by their owner thread
// ("direct") and, as the negotiation would have to use them (transports are single-threaded), through a queue and
// wake() to an I/O thread that owns the transport ("via I/O thread").
//
//   control_rtt [--rounds N] [--reps R]     median over R interleaved repetitions of N round trips each
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm_backends/control/socket.h"
#include "comm_backends/ps/protocol.h"
#include "comm_backends/ps/transport.h"

namespace {
using namespace commsched;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMsg = ps::kHeaderBytes;

double us_per_round(Clock::time_point t0, int rounds) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / rounds;
}

// ---- plain TCP: blocking writes from the caller, poll + recv for the answer (the negotiation's pattern) ----
double tcp_rtt(int rounds) {
  control::Fd listener = control::listen_tcp("127.0.0.1", 0);
  const int port = control::bound_port(listener.get());
  std::thread echo([&] {
    control::Fd c = control::accept_tcp(listener.get());
    control::tune_control_socket(c.get(), 10);
    try {
      for (;;) control::send_all(c.get(), control::recv_exact(c.get(), kMsg, "echo"), "echo");
    } catch (const std::exception&) {  // the client closed: done
    }
  });
  control::Fd fd = control::connect_tcp("127.0.0.1", port, Clock::now() + std::chrono::seconds(5));
  control::tune_control_socket(fd.get(), 10);
  const std::string msg(kMsg, 'x');
  auto once = [&] {
    control::send_all(fd.get(), msg, "client");
    pollfd p{fd.get(), POLLIN, 0};
    ::poll(&p, 1, 1000);
    (void)control::recv_exact(fd.get(), kMsg, "client");
  };
  for (int i = 0; i < 200; ++i) once();
  const auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) once();
  const double us = us_per_round(t0, rounds);
  fd.reset();
  echo.join();
  return us;
}

// ---- a Transport: an echo thread owns the bound side ----
struct Echo {
  std::unique_ptr<ps::Transport> t;
  std::string endpoint;
  std::atomic<bool> stop{false};
  std::thread th;
  explicit Echo(std::function<std::unique_ptr<ps::Transport>()> make) : t(make()) {
    endpoint = t->bind("127.0.0.1", 0);
    th = std::thread([this] {
      while (!stop)
        if (auto in = t->receive(milliseconds(20)); in && in->kind == ps::Incoming::Kind::message)
          t->send(in->peer, in->header);
    });
  }
  ~Echo() {
    stop = true;
    th.join();
    t->close(false);
  }
};

bool await_message(ps::Transport& t) {
  for (int i = 0; i < 1000; ++i)
    if (auto in = t.receive(milliseconds(100)); in && in->kind == ps::Incoming::Kind::message) return true;
  return false;
}

// The caller owns the transport and drives it itself.
double transport_direct(const std::function<std::unique_ptr<ps::Transport>()>& make, int rounds) {
  Echo echo(make);
  auto t = make();
  const ps::PeerId peer = t->connect(echo.endpoint);
  const std::array<std::byte, kMsg> msg{};
  auto once = [&] {
    t->send(peer, msg);
    if (!await_message(*t)) throw std::runtime_error("no echo");
  };
  for (int i = 0; i < 200; ++i) once();
  const auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) once();
  const double us = us_per_round(t0, rounds);
  t->close(false);
  return us;
}

// The caller hands the message to an I/O thread that owns the transport (queue + wake()) and waits for the answer.
double transport_via_io_thread(const std::function<std::unique_ptr<ps::Transport>()>& make, int rounds) {
  Echo echo(make);
  auto t = make();
  const ps::PeerId peer = t->connect(echo.endpoint);
  std::mutex mu;
  std::condition_variable cv;
  int queued = 0, answered = 0;
  bool stop = false;
  std::thread io([&] {
    const std::array<std::byte, kMsg> msg{};
    for (;;) {
      int to_send;
      {
        std::lock_guard lock(mu);
        if (stop) return;
        to_send = std::exchange(queued, 0);
      }
      for (int i = 0; i < to_send; ++i) t->send(peer, msg);
      if (auto in = t->receive(milliseconds(20)); in && in->kind == ps::Incoming::Kind::message) {
        std::lock_guard lock(mu);
        ++answered;
        cv.notify_all();
      }
    }
  });
  auto once = [&] {
    std::unique_lock lock(mu);
    const int want = answered + 1;
    ++queued;
    lock.unlock();
    t->wake();
    lock.lock();
    cv.wait(lock, [&] { return answered >= want; });
  };
  for (int i = 0; i < 200; ++i) once();
  const auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) once();
  const double us = us_per_round(t0, rounds);
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  t->wake();
  io.join();
  t->close(false);
  return us;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = {{"--rounds", "2000"}, {"--reps", "5"}};
  for (int i = 1; i + 1 < argc; i += 2) opt[argv[i]] = argv[i + 1];
  const int rounds = std::stoi(opt["--rounds"]), reps = std::stoi(opt["--reps"]);

  struct Kind {
    std::string name, ucx_tls;  // ucx_tls empty: ZeroMQ
  };
  std::vector<Kind> kinds = {{"zmq", ""}};
  if (ps::ucx_built_in()) kinds.push_back({"ucx shm", "sm,self"}), kinds.push_back({"ucx tcp", "tcp"});
  auto maker = [](const Kind& k) -> std::function<std::unique_ptr<ps::Transport>()> {
    return [k] {
      if (k.ucx_tls.empty()) return ps::make_zmq_transport({});
      ::setenv("UCX_TLS", k.ucx_tls.c_str(), 1);  // read when the UCP context is made
      return ps::make_ucx_transport({});
    };
  };
  std::map<std::string, std::vector<double>> results;
  for (int r = 0; r < reps; ++r) {  // interleaved: load changes hit every column alike
    results["plain TCP (negotiation today)"].push_back(tcp_rtt(rounds));
    for (const Kind& k : kinds) {
      results[k.name + " direct"].push_back(transport_direct(maker(k), rounds));
      results[k.name + " via I/O thread"].push_back(transport_via_io_thread(maker(k), rounds));
    }
  }
  const double base = median(results["plain TCP (negotiation today)"]);
  std::printf("| path (80-byte message, loopback) | median us per round trip | vs plain TCP |\n|---|---:|---:|\n");
  std::printf("| plain TCP (negotiation today) | %.1f | 1.00 |\n", base);
  for (const Kind& k : kinds)
    for (const char* how : {" direct", " via I/O thread"}) {
      const double us = median(results[k.name + how]);
      std::printf("| %s%s | %.1f | %.2f |\n", k.name.c_str(), how, us, us / base);
    }
  return 0;
}
