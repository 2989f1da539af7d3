// Fixtures of the negotiator's tests: ranks as threads in one process over loopback sockets, each with a log of what
// it executed and what failed.
#pragma once

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/collective/kv_store.h"
#include "comm_backends/collective/negotiator.h"

namespace commsched::collective::test {

using namespace std::chrono_literals;
// What one rank saw: executed groups (as token lists) and failures.
struct RankLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<uint64_t>> groups;
  std::vector<std::thread::id> runners;  // the thread that ran each group
  std::vector<std::pair<uint64_t, Status>> failures;
  size_t settled = 0;
  std::atomic<int> execute_ms{0};  // execute blocks this long, like a collective run on the negotiator thread
  // Each executed group is reported done (Negotiator::completed) at once, as a backend does when it ends; a test of
  // the credit turns this off and completes groups itself.
  std::atomic<bool> auto_complete{true};
  std::function<void()> completed;  // set once the negotiator exists, before anything is submitted
  // While `hold` is set (under mu), execute waits inside the callback, as a long collective would; `entered` counts
  // the calls that began.
  bool hold = false;
  size_t entered = 0;
  // After join(): tokens standing in (zeros) for what the others run, counted from here (apart from the keys).
  std::atomic<uint64_t> next_stand_in{1u << 30};

  NegotiatorCallbacks callbacks() {
    NegotiatorCallbacks cb;
    cb.execute = [this](std::vector<uint64_t>&& g) {
      if (const int ms = execute_ms.load(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      {
        std::unique_lock lock(mu);
        ++entered;
        cv.notify_all();
        cv.wait(lock, [&] { return !hold; });
        settled += g.size();
        groups.push_back(std::move(g));
        runners.push_back(std::this_thread::get_id());
        cv.notify_all();
      }
      if (auto_complete && completed) completed();
    };
    cb.stand_in = [this](const PartitionDesc&) { return next_stand_in++; };
    cb.fail = [this](uint64_t token, const Status& st) {
      std::lock_guard lock(mu);
      ++settled;
      failures.emplace_back(token, st);
      cv.notify_all();
    };
    return cb;
  }
  void set_hold(bool on) {
    std::lock_guard lock(mu);
    hold = on;
    cv.notify_all();
  }
  bool wait_entered(size_t n, std::chrono::seconds limit) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return entered >= n; });
  }
  bool wait_settled(size_t n, std::chrono::seconds limit) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return settled >= n; });
  }
};

inline NegotiatorOptions options(int rank, int size, uint64_t fusion = 0, double timeout_s = 5) {
  NegotiatorOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout_s = timeout_s;
  o.join_timeout_s = 20;
  o.knobs.small_tensor_bytes = fusion;  // bytescheduler (rank 0's default policy) fuses small tensors up to this
  return o;
}

// The knobs an engine hands over: the global credit (0: no limit) and the small-tensor fusion bound.
inline Knobs knobs(uint64_t credit, uint64_t fusion = 0) {
  Knobs k;
  k.credit_bytes = credit;
  k.small_tensor_bytes = fusion;
  return k;
}

inline Submission sub(uint64_t key, uint64_t bytes, int32_t priority, uint64_t round = 0) {
  Submission s;
  s.token = key;  // the key doubles as the token, so logs compare across ranks
  s.desc = PartitionDesc{key, 0, bytes, bytes, DType::f32, Op::allreduce, 0};
  s.name = "t" + std::to_string(key);
  s.round = round;
  s.priority = priority;
  return s;
}

// Runs `size` negotiators on threads (they join concurrently), each given the same store server.
class Group {
 public:
  // execute_blocks: the ranks run their groups on the negotiator thread (see RankLog::execute_ms). secret: the run's
  // shared secret every rank proves (empty: none). meanwhile: when set, rank 0 starts alone and this runs (given a
  // store of its own) before the other ranks start. adjust: changes every rank's options last.
  Group(int size, uint64_t fusion = 0, double timeout_s = 5, bool execute_blocks = false, std::string secret = {},
        const std::function<void(control::Store&)>& meanwhile = {},
        const std::function<void(NegotiatorOptions&)>& adjust = {})
      : server_("127.0.0.1", 0), logs_(size) {
    std::vector<std::future<void>> joins;
    negotiators_.resize(size);
    // Every store first: the joining threads index stores_, which must not grow under them.
    for (int r = 0; r <= size; ++r) stores_.push_back(std::make_unique<TcpStoreClient>("127.0.0.1", server_.port(), 5000ms));
    for (int r = 0; r < size; ++r) {
      if (r == 1 && meanwhile) meanwhile(*stores_[size]);
      joins.push_back(std::async(std::launch::async, [=, this] {
        NegotiatorOptions o = options(r, size, fusion, timeout_s);
        o.execute_blocks = execute_blocks;
        o.secret = secret;
        if (adjust) adjust(o);
        negotiators_[r] = std::make_unique<Negotiator>(o, *stores_[r], logs_[r].callbacks());
      }));
    }
    for (auto& j : joins) j.get();
    for (int r = 0; r < size; ++r) logs_[r].completed = [n = negotiators_[r].get()] { n->completed(); };
  }
  ~Group() {
    // Shut down concurrently: the goodbye barrier needs every rank.
    std::vector<std::thread> ts;
    for (auto& n : negotiators_) ts.emplace_back([&n] { n->shutdown(); });
    for (auto& t : ts) t.join();
  }
  Negotiator& rank(int r) { return *negotiators_[r]; }
  RankLog& log(int r) { return logs_[r]; }

 private:
  TcpStoreServer server_;
  std::vector<std::unique_ptr<TcpStoreClient>> stores_;
  std::vector<RankLog> logs_;
  std::vector<std::unique_ptr<Negotiator>> negotiators_;
};

struct TwoRanksAndAFake {
  // execute_blocks: the real ranks run their groups on the negotiator thread (or a helping caller's).
  explicit TwoRanksAndAFake(double timeout_s = 5, bool execute_blocks = false) {
    const auto opts = [=](int rank) {
      NegotiatorOptions o = options(rank, 3, 0, timeout_s);
      o.execute_blocks = execute_blocks;
      return o;
    };
    auto fake_join = std::async(std::launch::async, [&] {
      const std::string addr = s2.get("commsched/negotiator/coordinator", 10000ms);
      const auto colon = addr.rfind(':');
      Fd fd = connect_tcp(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)), std::chrono::steady_clock::now() + 10s);
      send_all(fd.get(), encode_hello(2, 3), "fake rank");
      recv_exact(fd.get(), 5, "fake rank welcome");
      return fd;
    });
    auto join1 = std::async(std::launch::async,
                            [&] { return std::make_unique<Negotiator>(opts(1), s1, l1.callbacks()); });
    n0 = std::make_unique<Negotiator>(opts(0), s0, l0.callbacks());
    n1 = join1.get();
    fake = fake_join.get();
  }
  // Work pending on both real ranks (the coordinator waits for rank 2's report).
  void submit_pending() {
    n0->submit({sub(1, 64, 0)});
    n1->submit({sub(1, 64, 0)});
  }

  TcpStoreServer server{"127.0.0.1", 0};
  TcpStoreClient s0{"127.0.0.1", server.port(), 5000ms}, s1{"127.0.0.1", server.port(), 5000ms},
      s2{"127.0.0.1", server.port(), 5000ms};
  RankLog l0, l1;
  std::unique_ptr<Negotiator> n0, n1;
  Fd fake;
};

inline bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace commsched::collective::test
