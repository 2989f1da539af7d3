// The PS worker (PsBackend) against two scripted servers on loopback: the root assigns the request to server 1, and
// the root, not server 1, answers it. An answer from a server other than the one asked is an error naming that
// server (and the one asked), never accepted as the sum. Over ZeroMQ, and over UCX when built in (where the payload
// sink already refuses to land such an answer; the check behind it must refuse it too).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/ps/ps_backend.h"
#include "tests/unit/control/test_store.h"

using namespace std::chrono_literals;
using namespace commsched;
using ps::MsgType;
using ps::PeerRole;

namespace {

void send(ps::Transport& t, ps::PeerId to, const ps::Header& h, ps::OutPayload p = {}) {
  std::array<std::byte, ps::kHeaderBytes> buf;
  ps::encode_header(h, buf);
  t.send(to, buf, std::move(p));
}

// Server 0 (the root) and server 1, played by hand on one thread: their endpoints in the rendezvous store, then the
// root assigns every range to server 1, and when server 1 receives a push_pull the root answers it with a sum of 7s.
class ScriptedServers {
 public:
  explicit ScriptedServers(const std::string& kind) {
    root_ = ps::make_transport(kind, {});
    s1_ = ps::make_transport(kind, {});
    root_ep_ = root_->bind("127.0.0.1", 0);
    s1_ep_ = s1_->bind("127.0.0.1", 0);
    store_.publish({root_ep_, s1_ep_}, true);
    thread_ = std::thread([this] { loop(); });
  }
  ~ScriptedServers() {
    stop_ = true;
    thread_.join();
    root_->close(false);
    s1_->close(false);
  }
  int root_port() const { return store_.port(); }

 private:
  void loop() {
    while (!stop_) {
      if (auto in = root_->receive(2ms)) at_root(*in);
      if (auto in = s1_->receive(2ms)) at_server1(*in);
    }
  }
  static std::optional<ps::Header> header_of(const ps::Incoming& in) {
    if (in.kind != ps::Incoming::Kind::message) return std::nullopt;
    std::optional<uint64_t> size;
    if (in.payload) size = in.payload->bytes().size();
    return ps::decode_header(in.header, size).header;
  }
  void at_root(const ps::Incoming& in) {
    const auto h = header_of(in);
    if (!h) return;
    if (h->type == MsgType::hello && h->sender_role == PeerRole::worker) {
      worker_at_root_ = in.peer;
    } else if (h->type == MsgType::assign_req) {
      ps::Header r = ps::make_header(MsgType::assign_rep, PeerRole::server, 0);
      r.key = h->key;
      r.offset = h->offset;
      r.aux = 1;  // server 1 owns it
      send(*root_, in.peer, r);
    }
  }
  void at_server1(const ps::Incoming& in) {
    const auto h = header_of(in);
    if (!h || h->type != MsgType::push_pull) return;
    ps::Header sum = *h;  // the right request, range and size: only the sender is wrong
    sum.type = MsgType::sum;
    sum.sender_role = PeerRole::server;
    sum.sender_rank = 0;
    sum.flags = 0;
    auto data = std::make_shared<std::vector<float>>(h->length / sizeof(float), 7.0f);
    send(*root_, worker_at_root_, sum,
         ps::OutPayload{reinterpret_cast<const std::byte*>(data->data()), h->length, [data] {}});
  }

  control::test_support::TestStore store_;
  std::unique_ptr<ps::Transport> root_, s1_;
  std::string root_ep_, s1_ep_;
  ps::PeerId worker_at_root_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class PsWorkerAnswers : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "ucx" && !ps::ucx_built_in()) GTEST_SKIP() << "this build has no UCX (install libucx-dev and rebuild)";
  }
};

}  // namespace

TEST_P(PsWorkerAnswers, AnAnswerFromAServerNotAskedIsAnErrorNamingIt) {
  ScriptedServers servers(GetParam());
  ClusterEnv env;
  env.role = Role::worker;
  env.num_workers = 1;
  env.num_servers = 2;
  env.root_port = servers.root_port();
  PsConfig cfg;
  cfg.transport = GetParam();
  PsBackend backend(env, cfg);

  TaskDesc d;
  d.name = "answered.by.the.wrong.server";
  d.key = task_key(d.name);
  d.count = 1024;  // 4 KiB
  std::vector<float> data(d.count, 1.0f);
  d.buffer.data = data.data();
  std::promise<Status> done;
  backend.start({PartitionView{&d, 0, 0, d.bytes()}}, [&](const Status& st) { done.set_value(st); });
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready) << "the batch never completed";
  const Status st = f.get();
  ASSERT_FALSE(st.ok()) << "an answer from server 0 to a request sent to server 1 was accepted";
  EXPECT_EQ(st.message.rfind("server 0 ", 0), 0u) << st.message;  // the culprit first
  EXPECT_NE(st.message.find("sent to server 1"), std::string::npos) << st.message;
  EXPECT_EQ(data[0], 1.0f) << "the wrong server's answer was written into the tensor";
}

INSTANTIATE_TEST_SUITE_P(Transports, PsWorkerAnswers, ::testing::Values("zmq", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
