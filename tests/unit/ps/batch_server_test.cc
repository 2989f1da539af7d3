// A real server (run_server on a thread) against a worker played by hand: a push_pull_batch is summed and answered
// once with a sum_batch of its layout, and a batch whose table is malformed fails the server with an error naming
// the sender and the entry. Over ZeroMQ (the server's checks are the transport's business nowhere).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "comm_backends/ps/server.h"
#include "tests/integration/harness/local_cluster.h"

using namespace std::chrono_literals;
using namespace commsched;
using namespace commsched::ps;

namespace {

void send(Transport& t, PeerId to, const Header& h, OutPayload p = {}) {
  std::array<std::byte, kHeaderBytes> buf;
  encode_header(h, buf);
  t.send(to, buf, std::move(p));
}

// One server with one worker (this test): the server runs on its own thread until the worker says bye or it fails.
class OneServer {
 public:
  OneServer() {
    env_.role = Role::server;
    env_.num_workers = 1;
    env_.num_servers = 1;
    env_.root_addr = env_.bind = "127.0.0.1";
    env_.root_port = commsched::testing::free_tcp_port();
    env_.timeout_s = 20;
    done_ = std::async(std::launch::async, [this] { return run_server(env_, PsConfig{}); });
    t_ = make_transport("zmq", {});
    server_ = t_->connect("tcp://127.0.0.1:" + std::to_string(env_.root_port));
    Header hello = make_header(MsgType::hello, PeerRole::worker, 0);
    hello.aux = PsConfig{}.mode_word();
    send(*t_, server_, hello);
    EXPECT_TRUE(next(MsgType::peers)) << "no rendezvous";
  }
  ~OneServer() {
    send(*t_, server_, make_header(MsgType::bye, PeerRole::worker, 0));
    if (done_.valid() && done_.wait_for(20s) == std::future_status::ready) done_.get();
    t_->close(false);
  }
  // The next message of type `t` from the server (others skipped), within 10 s.
  std::optional<Incoming> next(MsgType t) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < end) {
      auto in = t_->receive(50ms);
      if (!in || in->kind != Incoming::Kind::message) continue;
      const Decoded d = decode_header(in->header, in->payload ? std::optional<uint64_t>(in->payload->bytes().size())
                                                              : std::nullopt);
      if (d.header && d.header->type == t) return in;
    }
    return std::nullopt;
  }
  void send_batch(const Header& h, std::vector<std::byte>& payload) {
    send(*t_, server_, h, OutPayload{payload.data(), payload.size(), {}});
  }
  // The server's exit status, once it has stopped (within 20 s).
  int exit_status() { return done_.wait_for(20s) == std::future_status::ready ? done_.get() : -1; }

 private:
  ClusterEnv env_;
  std::future<int> done_;
  std::unique_ptr<Transport> t_;
  PeerId server_ = 0;
};

// Two f32 ranges and an i64 range, their bytes counting up (one worker: no arithmetic on them).
struct Batch {
  Header h = make_header(MsgType::push_pull_batch, PeerRole::worker, 0);
  std::vector<BatchEntry> entries = {{101, 0, 40, 40, 0, DType::f32, 0}, {102, 8, 12, 64, 0, DType::f32, 0},
                                     {103, 16, 16, 32, 0, DType::i64, 0}};
  std::vector<std::byte> payload;
  Batch() {
    payload.resize(batch_layout(entries));
    encode_batch_table(entries, payload);
    for (const BatchEntry& e : entries)
      for (uint64_t i = 0; i < e.length; ++i) payload[e.at + i] = static_cast<std::byte>(i + 1);
    h.request_id = 5;
    h.aux = static_cast<uint32_t>(entries.size());
    h.length = payload.size();
  }
};

}  // namespace

TEST(PsBatchServer, AnswersABatchOnceInItsLayout) {
  OneServer s;
  Batch b;
  s.send_batch(b.h, b.payload);
  auto in = s.next(MsgType::sum_batch);
  ASSERT_TRUE(in) << "no sum_batch";
  const Decoded d = decode_header(in->header, in->payload->bytes().size());
  ASSERT_TRUE(d.header) << d.error;
  EXPECT_EQ(d.header->request_id, 5u);
  const DecodedBatch got = decode_batch(*d.header, in->payload->bytes());
  ASSERT_TRUE(got.error.empty()) << got.error;
  ASSERT_EQ(got.entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got.entries[i].key, b.entries[i].key);
    // One worker: the sum is its push, byte for byte, at the same place.
    EXPECT_EQ(0, std::memcmp(in->payload->bytes().data() + got.entries[i].at, b.payload.data() + b.entries[i].at,
                             b.entries[i].length));
  }
}

TEST(PsBatchServer, AMalformedBatchFailsTheServerNamingTheSenderAndEntry) {
  ::testing::internal::CaptureStderr();
  int status;
  {
    OneServer s;
    Batch b;
    b.payload[kBatchEntryBytes + 45] = std::byte{1};  // entry 1's reserved bytes
    s.send_batch(b.h, b.payload);
    status = s.exit_status();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1) << log;
  EXPECT_NE(log.find("error: worker 0 ("), std::string::npos) << log;
  EXPECT_NE(log.find(") sent a malformed message: push_pull_batch entry 1: reserved bytes not zero"),
            std::string::npos) << log;
}
