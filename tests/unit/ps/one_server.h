// A real parameter server (run_server on a thread) with one worker played by hand over ZeroMQ, for tests of what
// the server answers and in what order.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <future>
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "comm_backends/collective/kv_store.h"
#include "comm_backends/ps/server.h"
#include "tests/integration/harness/local_cluster.h"

namespace commsched::ps::harness {

using namespace std::chrono_literals;

inline void send(Transport& t, PeerId to, const Header& h, OutPayload p = {}) {
  std::array<std::byte, kHeaderBytes> buf;
  encode_header(h, buf);
  t.send(to, buf, std::move(p));
}

// One server with one worker (the test): the server runs on its own thread until the worker says bye or it fails.
class OneServer {
 public:
  explicit OneServer(PsConfig cfg = {}) : cfg_(std::move(cfg)) {
    env_.role = Role::server;
    env_.num_workers = 1;
    env_.num_servers = 1;
    env_.root_addr = env_.bind = "127.0.0.1";
    env_.root_port = commsched::testing::free_tcp_port();
    env_.timeout_s = 20;
    done_ = std::async(std::launch::async, [this] { return run_server(env_, cfg_); });
    // The worker's rendezvous: server 0's endpoint from its store, a hello, and the store's word that all have come.
    collective::TcpStoreClient store("127.0.0.1", env_.root_port, 10s);
    t_ = make_transport("zmq", {});
    server_ = t_->connect(store.get("ps/server/0", 10s));
    Header hello = make_header(MsgType::hello, PeerRole::worker, 0);
    hello.aux = cfg_.mode_word();
    send(*t_, server_, hello);
    EXPECT_NO_THROW(store.get("ps/assembled", 10s)) << "no rendezvous";
  }
  ~OneServer() {
    send(*t_, server_, make_header(MsgType::bye, PeerRole::worker, 0));
    if (done_.valid() && done_.wait_for(20s) == std::future_status::ready) done_.get();
    t_->close(false);
  }
  // The next message of type `t` from the server (others skipped), within 10 s.
  std::optional<Incoming> next(MsgType t) {
    auto m = next_matching({t});
    return m ? std::optional<Incoming>(std::move(m->first)) : std::nullopt;
  }
  // The header of the next message of one of `types` (others skipped), within 10 s.
  std::optional<Header> next_of(std::initializer_list<MsgType> types) {
    auto m = next_matching(types);
    return m ? std::optional<Header>(m->second) : std::nullopt;
  }
  // A message with `payload`, which must outlive the send.
  void push(const Header& h, std::vector<std::byte>& payload) {
    send(*t_, server_, h, OutPayload{payload.data(), payload.size(), {}});
  }
  // The server's exit status, once it has stopped (within 20 s).
  int exit_status() { return done_.wait_for(20s) == std::future_status::ready ? done_.get() : -1; }

 private:
  std::optional<std::pair<Incoming, Header>> next_matching(std::initializer_list<MsgType> types) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < end) {
      auto in = t_->receive(50ms);
      if (!in || in->kind != Incoming::Kind::message) continue;
      const Decoded d = decode_header(in->header, in->payload ? std::optional<uint64_t>(in->payload->bytes().size())
                                                              : std::nullopt);
      if (d.header && std::find(types.begin(), types.end(), d.header->type) != types.end())
        return std::make_pair(std::move(*in), *d.header);
    }
    return std::nullopt;
  }

  PsConfig cfg_;
  ClusterEnv env_;
  std::future<int> done_;
  std::unique_ptr<Transport> t_;
  PeerId server_ = 0;
};

}  // namespace commsched::ps::harness
