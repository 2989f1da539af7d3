// The control plane against a scripted transport (no sockets, no threads): what a Van sends and when it closes, for
// the goodbye handshake (a leaving node waits for each member's answering bye, so its own bye is never lost behind
// traffic still in flight when its connections end) and for loss reports relayed over several hops (the lost peer
// named first, then the first reporter, once).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <string>
#include <vector>

#include "comm_backends/control/van.h"
#include "tests/unit/control/van_test_options.h"

using namespace std::chrono_literals;
using namespace commsched;
using namespace commsched::control;
using ps::MsgType;

namespace {

class TextPayload final : public ps::Payload {
 public:
  explicit TextPayload(std::string s) : s_(std::move(s)) {}
  std::span<const std::byte> bytes() const override { return std::as_bytes(std::span(s_.data(), s_.size())); }

 private:
  std::string s_;
};

// Delivers what the test queued in `inbox`, in order, and records every send and the close.
class ScriptedTransport final : public ps::Transport {
 public:
  struct Sent {
    ps::PeerId peer;
    ps::Header header;
    std::string text;
  };

  std::string bind(const std::string&, int) override { return "tcp://127.0.0.1:1"; }
  ps::PeerId connect(const std::string&) override { return ++dialed_; }
  void send(ps::PeerId peer, std::span<const std::byte> header, ps::OutPayload p) override {
    const ps::Decoded d = ps::decode_header(header, p.size ? std::optional<uint64_t>(p.size) : std::nullopt);
    EXPECT_TRUE(d.header) << d.error;
    if (d.header) sent.push_back({peer, *d.header, std::string(reinterpret_cast<const char*>(p.data), p.size)});
    if (p.release) p.release();
  }
  std::optional<ps::Incoming> receive(std::chrono::milliseconds timeout) override {
    ++receives;
    if (inbox.empty()) {
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(timeout, 1ms));
      return std::nullopt;
    }
    ps::Incoming in = std::move(inbox.front());
    inbox.pop_front();
    return in;
  }
  void wake() override {}
  void close(bool) override { closed = true; }
  std::string describe(ps::PeerId peer) const override { return "fake:" + std::to_string(peer); }

  // A message from `peer` as `role` `rank`.
  void deliver(ps::PeerId peer, MsgType t, PeerRole role, uint32_t rank, std::optional<std::string> text = {},
               uint32_t aux = 0) {
    ps::Header h = ps::make_header(t, role, rank);
    h.aux = aux;
    std::array<std::byte, ps::kHeaderBytes> buf;
    ps::encode_header(h, buf);
    ps::Incoming in;
    in.peer = peer;
    in.header.assign(buf.begin(), buf.end());
    if (text) in.payload = std::make_unique<TextPayload>(*text);
    inbox.push_back(std::move(in));
  }
  void disconnect(ps::PeerId peer) {
    ps::Incoming in;
    in.kind = ps::Incoming::Kind::disconnected;
    in.peer = peer;
    inbox.push_back(std::move(in));
  }
  std::vector<Sent> sent_of(MsgType t) const {
    std::vector<Sent> out;
    for (const Sent& s : sent)
      if (s.header.type == t) out.push_back(s);
    return out;
  }

  std::deque<ps::Incoming> inbox;
  std::vector<Sent> sent;
  bool closed = false;
  int receives = 0;

 private:
  ps::PeerId dialed_ = 0;
};

class Recorder final : public VanProtocol {
 public:
  void on_message(ps::PeerId, const Roster::Member&, const ps::Header& h, std::unique_ptr<ps::Payload>) override {
    messages.push_back(std::string(ps::msg_type_name(h.type)));
  }
  void on_failed(const Status& st) override { failure = st; }
  std::vector<std::string> messages;
  std::optional<Status> failure;
};

VanOptions options(PeerRole role, uint32_t rank, int workers, int servers) {
  return test_support::van_test_options(role, rank, workers, servers);
}

// A store where server 0 has published its endpoint (only a name: the scripted transport connects nowhere) and, when
// `assembled`, that the whole job has come.
struct PublishedRoot {
  test_support::TestStore store;
  std::unique_ptr<Store> client = store.client();
  explicit PublishedRoot(bool assembled) { store.publish({"tcp://127.0.0.1:1"}, assembled); }
};

void poll_until_empty(Van& van, ScriptedTransport& t) {
  for (int i = 0; i < 100 && !t.inbox.empty(); ++i) van.poll(1ms);
}

// A worker of a one-server cluster, past the rendezvous: the root (server 0) is its peer 1.
struct Worker {
  PublishedRoot root{true};
  ScriptedTransport t;
  Recorder proto;
  std::vector<std::string> logs;  // before the Van, which logs into it
  Van van;
  explicit Worker(double timeout_s = 2)
      : van(with_timeout(options(PeerRole::worker, 0, 1, 1), timeout_s, logs), t, proto, *root.client) {
    van.start();
    for (int i = 0; i < 1000 && !van.ready(); ++i) van.poll(1ms);  // until it reads "assembled"
  }
  static VanOptions with_timeout(VanOptions o, double s, std::vector<std::string>& logs) {
    o.timeout_s = s;
    o.log = [&logs](const std::string& line) { logs.push_back(line); };
    return o;
  }
};

}  // namespace

// The worker's bye is answered by the server's, and the worker closes only once that answer is in: what the server
// still had on its way to the worker (here the receipt of a request) is taken first, and the bye, sent before any of
// it, has reached the server by the time the connection ends.
TEST(VanGoodbye, LeaveWaitsForTheAnsweringByeAndTakesWhatArrivesBeforeIt) {
  Worker w;
  ASSERT_TRUE(w.van.ready());
  w.t.deliver(1, MsgType::received, PeerRole::server, 0);  // in flight when the worker says bye
  w.t.deliver(1, MsgType::bye, PeerRole::server, 0);  // the server's answer to it
  w.van.leave();
  ASSERT_EQ(w.t.sent_of(MsgType::bye).size(), 1u);
  EXPECT_EQ(w.t.sent_of(MsgType::bye)[0].peer, 1u);
  EXPECT_TRUE(w.t.closed);
  EXPECT_TRUE(w.t.inbox.empty()) << "closed before the server's answering bye arrived";
  EXPECT_EQ(w.proto.messages, std::vector<std::string>{"received"});
  EXPECT_FALSE(w.proto.failure) << w.proto.failure->message;
}

// A node told bye by a member answers with its own bye, once: the answer the leaving member waits for.
TEST(VanGoodbye, AServerAnswersAWorkersByeWithItsOwn) {
  test_support::TestStore store;
  const auto client = store.client();
  ScriptedTransport t;
  Recorder proto;
  Van van(options(PeerRole::server, 0, 2, 1), t, proto, *client);
  van.start();
  t.deliver(100, MsgType::hello, PeerRole::worker, 0);
  t.deliver(101, MsgType::hello, PeerRole::worker, 1);
  t.deliver(100, MsgType::bye, PeerRole::worker, 0);
  poll_until_empty(van, t);
  ASSERT_TRUE(van.ready());
  auto byes = t.sent_of(MsgType::bye);
  ASSERT_EQ(byes.size(), 1u);
  EXPECT_EQ(byes[0].peer, 100u);
  EXPECT_FALSE(van.all_left(PeerRole::worker));
  t.deliver(101, MsgType::bye, PeerRole::worker, 1);
  poll_until_empty(van, t);
  EXPECT_TRUE(van.all_left(PeerRole::worker));
  van.leave();  // nobody left to tell or wait for: both have said bye and been answered
  byes = t.sent_of(MsgType::bye);
  ASSERT_EQ(byes.size(), 2u);
  EXPECT_EQ(byes[1].peer, 101u);
  EXPECT_TRUE(t.closed);
  EXPECT_FALSE(proto.failure);
}

// Two nodes leaving at once (servers at the goodbye barrier) each take the other's bye as the answer to their own:
// nobody answers a bye it has already sent.
TEST(VanGoodbye, CrossingByesAreNotAnsweredAgain) {
  Worker w;
  w.t.deliver(1, MsgType::bye, PeerRole::server, 0);  // crosses the worker's own
  w.van.leave();
  EXPECT_EQ(w.t.sent_of(MsgType::bye).size(), 1u);
  EXPECT_TRUE(w.t.closed);
}

// No answer: a member whose connection ends is not waited for, and a silent one only for COMMSCHED_TIMEOUT. Leaving
// is not failing either way.
TEST(VanGoodbye, LeaveStopsWaitingForAClosedOrSilentMember) {
  {
    Worker w;
    w.t.disconnect(1);
    const auto t0 = std::chrono::steady_clock::now();
    w.van.leave();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
    EXPECT_TRUE(w.t.closed);
    EXPECT_FALSE(w.proto.failure);
  }
  {
    Worker w(0.3);
    const auto t0 = std::chrono::steady_clock::now();
    w.van.leave();
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(took, 300ms);
    EXPECT_LT(took, 5s);
    EXPECT_TRUE(w.t.closed);
    EXPECT_FALSE(w.proto.failure);
    ASSERT_EQ(w.logs.size(), 1u);
    EXPECT_EQ(w.logs[0], "closing after 0.3 s without an answering bye from every member (COMMSCHED_TIMEOUT)");
  }
}

// A loss heard from a server names the lost peer first, then that server; relayed again, it keeps its first
// reporter and gains no second "(reported by ...)".
TEST(VanLossReport, ALossRelayedTwiceNamesTheLostPeerAndItsFirstReporterOnce) {
  {
    Worker w;
    w.t.deliver(1, MsgType::peer_lost, PeerRole::server, 0, "worker 1 (10.0.0.3:4711) lost: connection closed");
    poll_until_empty(w.van, w.t);
    ASSERT_TRUE(w.proto.failure);
    EXPECT_EQ(w.proto.failure->message,
              "worker 1 (10.0.0.3:4711) lost: connection closed (reported by server 0 (fake:1))");
    EXPECT_EQ(w.proto.failure->code, Status::Code::peer_lost);
  }
  {
    Worker w;
    const std::string relayed = "worker 1 (10.0.0.3:4711) lost: connection closed (reported by server 1 (10.0.0.2:5))";
    w.t.deliver(1, MsgType::peer_lost, PeerRole::server, 0, relayed);
    poll_until_empty(w.van, w.t);
    ASSERT_TRUE(w.proto.failure);
    EXPECT_EQ(w.proto.failure->message, relayed);
  }
}

// The first hop: a server told by the root passes the report on to its workers with the root as reporter, and not
// back to the root.
TEST(VanLossReport, AServerRelaysTheRootsReportNamingTheRoot) {
  PublishedRoot root(false);
  ScriptedTransport t;
  Recorder proto;
  Van van(options(PeerRole::server, 1, 2, 2), t, proto, *root.client);
  van.start();  // dials the root: peer 1
  t.deliver(100, MsgType::hello, PeerRole::worker, 0);
  t.deliver(101, MsgType::hello, PeerRole::worker, 1);
  t.deliver(1, MsgType::peer_lost, PeerRole::server, 0, "worker 1 (10.0.0.3:4711) lost: connection closed");
  poll_until_empty(van, t);
  ASSERT_TRUE(proto.failure);
  const auto told = t.sent_of(MsgType::peer_lost);
  ASSERT_EQ(told.size(), 2u);
  for (const auto& s : told) {
    EXPECT_NE(s.peer, 1u);
    EXPECT_EQ(s.text, "worker 1 (10.0.0.3:4711) lost: connection closed (reported by server 0 (fake:1))");
  }
}
