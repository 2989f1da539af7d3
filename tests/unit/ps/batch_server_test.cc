// Batches (push_pull_batch) from both ends, over ZeroMQ (neither end's batch handling depends on the transport):
// a real server (run_server on a thread) against a worker played by hand answers a batch once with a sum_batch of
// its layout and fails, naming the sender and the entry, on a malformed table; a real worker (PsBackend) against a
// server played by hand sends a batch's small partitions as one push_pull_batch.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/collective/kv_store.h"
#include "comm_backends/ps/ps_backend.h"
#include "comm_backends/ps/server.h"
#include "tests/integration/harness/local_cluster.h"
#include "tests/unit/control/test_store.h"
#include "tests/unit/ps/one_server.h"

using namespace std::chrono_literals;
using namespace commsched;
using namespace commsched::ps;
using commsched::ps::harness::OneServer;
using commsched::ps::harness::send;

namespace {

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
  s.push(b.h, b.payload);
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
    s.push(b.h, b.payload);
    status = s.exit_status();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 1) << log;
  EXPECT_NE(log.find("error: worker 0 ("), std::string::npos) << log;
  EXPECT_NE(log.find(") sent a malformed message: push_pull_batch entry 1: reserved bytes not zero"),
            std::string::npos) << log;
}

namespace {

// One server played by hand for a real worker (PsBackend): its endpoint in the rendezvous store, then every data
// message is counted by type and answered with its own floats plus one (a sum_batch for a batch, a sum otherwise), and a bye with a bye.
class ScriptedServer {
 public:
  ScriptedServer() : t_(make_transport("zmq", {})), endpoint_(t_->bind("127.0.0.1", 0)) {
    store_.publish({endpoint_}, true);
    thread_ = std::thread([this] {
      while (!stop_)
        if (auto in = t_->receive(2ms); in && in->kind == Incoming::Kind::message) serve(*in);
    });
  }
  ~ScriptedServer() {
    stop_ = true;
    thread_.join();
    t_->close(false);
  }
  int port() const { return store_.port(); }  // the root port: where the store is
  std::vector<std::pair<MsgType, uint32_t>> seen() {  // data messages: type and entries
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void serve(Incoming& in) {
    const uint64_t size = in.payload ? in.payload->bytes().size() : 0;
    const Decoded d = decode_header(in.header, in.payload ? std::optional<uint64_t>(size) : std::nullopt);
    if (!d.header) return;
    Header r = *d.header;
    r.sender_role = PeerRole::server;
    r.sender_rank = 0;
    r.flags = 0;
    switch (d.header->type) {
      case MsgType::bye: return send(*t_, in.peer, make_header(MsgType::bye, PeerRole::server, 0));
      case MsgType::push_pull_batch: r.type = MsgType::sum_batch; break;
      case MsgType::push_pull: r.type = MsgType::sum; break;
      default: return;
    }
    {
      std::lock_guard lock(mu_);
      seen_.emplace_back(d.header->type, d.header->type == MsgType::push_pull ? 1 : d.header->aux);
    }
    auto out = std::make_shared<std::vector<std::byte>>(in.payload->bytes().begin(), in.payload->bytes().end());
    plus_one(*d.header, *out);
    send(*t_, in.peer, r, OutPayload{out->data(), out->size(), [out] {}});
  }
  // Every float of the data (a batch's table stays as it is).
  static void plus_one(const Header& h, std::vector<std::byte>& bytes) {
    std::vector<BatchEntry> es{BatchEntry{0, 0, bytes.size(), 0, 0, DType::f32, 0}};
    if (h.type == MsgType::push_pull_batch) es = decode_batch(h, bytes).entries;
    for (const BatchEntry& e : es)
      for (uint64_t at = e.at; at < e.at + e.length; at += 4) {
        float f;
        std::memcpy(&f, bytes.data() + at, 4);
        f += 1;
        std::memcpy(bytes.data() + at, &f, 4);
      }
  }

  control::test_support::TestStore store_;
  std::unique_ptr<Transport> t_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::pair<MsgType, uint32_t>> seen_;
  std::thread thread_;
};

}  // namespace

// Three 4 KiB partitions and one of 64 KiB in one batch: the small ones travel as one push_pull_batch (answered by one
// sum_batch, whose sums land in each tensor), the big one alone.
TEST(PsBatchWorker, SmallPartitionsOfABatchTravelAsOnePushPullBatch) {
  ScriptedServer server;
  ClusterEnv env;
  env.role = Role::worker;
  env.num_workers = 1;
  env.num_servers = 1;
  env.root_port = server.port();
  PsBackend backend(env, PsConfig{});
  std::vector<TaskDesc> tasks(4);
  std::vector<std::vector<float>> data;
  std::vector<PartitionView> batch;
  for (size_t i = 0; i < tasks.size(); ++i) {
    tasks[i].name = "batched." + std::to_string(i);
    tasks[i].key = task_key(tasks[i].name);
    tasks[i].count = i == 3 ? 16384 : 1024;
    data.emplace_back(tasks[i].count, static_cast<float>(i));
  }
  for (size_t i = 0; i < tasks.size(); ++i) {
    tasks[i].buffer.data = data[i].data();
    batch.push_back(PartitionView{&tasks[i], 0, 0, tasks[i].bytes()});
  }
  std::promise<Status> done;
  backend.start(std::move(batch), [&](const Status& st) { done.set_value(st); });
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready) << "the batch never completed";
  ASSERT_TRUE(f.get().ok());
  backend.shutdown();
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(MsgType::push_pull_batch, 3u));
  EXPECT_EQ(seen[1], std::make_pair(MsgType::push_pull, 1u));
  for (size_t i = 0; i < tasks.size(); ++i)
    for (float v : data[i]) ASSERT_EQ(v, static_cast<float>(i) + 1) << tasks[i].name;
}
