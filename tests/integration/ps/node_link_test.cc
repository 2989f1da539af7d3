// The launchers meet through node 0's rendezvous store, and the store and the link each prove the run's secret both
// ways: nodes with the secret join; a stranger (at the store or at the link) is refused with a logged reason and
// cannot stop the join; a node and a root that disagree on having a secret fail with an error that names the switches.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/socket.h"
#include "plugins/launch/process_group.h"
#include "plugins/launch/node_link.h"
#include "plugins/launch/node_link_lines.h"
#include "base/types.h"

namespace commsched {
namespace {

const std::string kSecret = "node-link-test-secret-0123456789";
const std::string kOther = "another-runs-secret-0123456789ab";

struct Joined {
  std::unique_ptr<NodeLink> link;
  std::map<std::string, std::string> env;
};

std::future<Joined> join_async(int nnodes, int node, int port, std::string secret, double timeout_s = 10,
                               double silence_s = 0, node_link::Share share = {}) {
  return std::async(std::launch::async, [=] {
    Joined j;
    if (node == 0) j.env = {{"FROM_ROOT", "yes"}};
    j.link = NodeLink::join(nnodes, node, share, "127.0.0.1", port, j.env, timeout_s, secret, silence_s);
    return j;
  });
}

// A raw connection to `port` (retried while node 0 starts).
int connect_to(int port) {
  return control::connect_tcp("127.0.0.1", port, std::chrono::steady_clock::now() + std::chrono::seconds(5)).release();
}

// The port of node 0's link, as a member reads it from node 0's store (a stranger could find it by scanning).
int link_port(int store_port, const std::string& secret) {
  collective::TcpStoreClient store("127.0.0.1", store_port, std::chrono::seconds(5), secret);
  return std::stoi(store.get(node_link::kLinkKey, std::chrono::seconds(5)));
}

// Connects as a stranger to `port`, says `hello`, and returns everything it was answered until the connection closed.
std::string stranger(int port, const std::string& hello) {
  const int fd = connect_to(port);
  for (size_t sent = 0; sent < hello.size();) {  // no SIGPIPE when the root hangs up first
    const ssize_t w = ::send(fd, hello.data() + sent, hello.size() - sent, MSG_NOSIGNAL);
    if (w <= 0) break;
    sent += static_cast<size_t>(w);
  }
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return got;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(NodeLinkAuth, NodesWithTheSecretJoinAndGetTheRootsEnvironment) {
  const int port = free_loopback_port();
  auto root = join_async(3, 0, port, kSecret);
  auto n1 = join_async(3, 1, port, kSecret), n2 = join_async(3, 2, port, kSecret);
  EXPECT_TRUE(root.get().link);
  EXPECT_EQ(n1.get().env.at("FROM_ROOT"), "yes");
  EXPECT_EQ(n2.get().env.at("FROM_ROOT"), "yes");
}

// Strangers at the store and at the link (a HELLO without the proof the link asks for) are refused, each logged with
// its address and the reason; neither sees the run start, and the real node still joins.
TEST(NodeLinkAuth, AStrangerIsRefusedWithAReasonAndTheRealNodeStillJoins) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, kSecret);
  const int link = link_port(port, kSecret);
  testing::internal::CaptureStderr();
  const std::string at_store = stranger(port, "HELLO 1\n");
  const std::string at_link = stranger(link, "HELLO 1\n");
  const std::string logged = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(logged, "rendezvous store refused 127.0.0.1:")) << logged;
  EXPECT_TRUE(has(logged, "node 0's launcher refused 127.0.0.1:")) << logged;
  EXPECT_TRUE(has(logged, "it did not prove the run's shared secret")) << logged;
  EXPECT_FALSE(has(at_store, std::to_string(link))) << "a stranger must not read the link's address";
  EXPECT_FALSE(has(at_link, "GO")) << "a stranger must never see the run start: " << at_link;
  auto node = join_async(2, 1, port, kSecret);
  EXPECT_EQ(node.get().env.at("FROM_ROOT"), "yes");
  EXPECT_TRUE(root.get().link);
}

TEST(NodeLinkAuth, ANodeWithAnotherSecretIsRefused) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, kSecret, 3);
  auto node = join_async(2, 1, port, kOther, 3);
  try {
    node.get();
    FAIL() << "a node with another secret joined";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(has(e.what(), "could not join node 0 at 127.0.0.1:" + std::to_string(port))) << e.what();
    EXPECT_TRUE(has(e.what(), "refused us: the shared secret differs")) << e.what();
  }
  EXPECT_THROW(root.get(), std::runtime_error);  // node 1 never joined: the join times out naming it
}

TEST(NodeLinkAuth, SecretOnOneSideOnlyFailsNamingTheSwitches) {
  {
    const int port = free_loopback_port();
    auto root = join_async(2, 0, port, kSecret, 3);
    auto node = join_async(2, 1, port, "", 3);
    try {
      node.get();
      FAIL() << "a node without the secret joined";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(has(e.what(), "requires the run's shared secret: set the same COMMSCHED_SECRET")) << e.what();
    }
    EXPECT_THROW(root.get(), std::runtime_error);
  }
  {
    const int port = free_loopback_port();
    auto root = join_async(2, 0, port, "", 3);
    auto node = join_async(2, 1, port, kSecret, 3);
    try {
      node.get();
      FAIL() << "a node with a secret followed a root without one";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(has(e.what(), "sent no authentication challenge")) << e.what();
      EXPECT_TRUE(has(e.what(), "COMMSCHED_SECRET")) << e.what();
    }
    EXPECT_THROW(root.get(), std::runtime_error);
  }
}

// Without a secret anyone may join, but a stranger's malformed HELLO is still only refused: it used to reach the
// node rank's parser, whose error ended node 0's launcher (found reading the link's parsers for fuzz_node_link).
TEST(NodeLinkAuth, WithoutASecretAMalformedHelloIsRefusedAndTheRealNodeStillJoins) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, "");
  const int link = link_port(port, "");
  for (const std::string hello : {"HELLO x\n", "HELLO 99999999999\n", "HELLO -1\n", "HELLO 1 2 3 4\n",
                                 "HELLO 1 ab cd\n", "HELLO 1\n", "HELLO 1 0 0\n", "HELLO 1 2 -1\n"}) {
    const std::string told = stranger(link, hello);
    EXPECT_NE(told.find("refused this launcher: it sent no HELLO naming its node rank"), std::string::npos)
        << hello << ": " << told;
  }
  auto node = join_async(2, 1, port, "");
  EXPECT_EQ(node.get().env.at("FROM_ROOT"), "yes");
  EXPECT_TRUE(root.get().link);
}

// Without a secret anyone may connect to the link: a line longer than any of ours is refused as soon as it passes the
// bound, not kept in memory until the stranger stops (a fast sender could otherwise fill node 0's memory). (With a
// secret, the handshake's own frame bound refuses it first.)
TEST(NodeLinkAuth, AStrangersEndlessLineIsRefusedAtTheBound) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, "");
  // Exactly one byte past the bound, so that node 0 has read all of it when it refuses (a clean close, no reset).
  const std::string told = stranger(link_port(port, ""), std::string((1u << 20) + 1, 'x'));
  EXPECT_NE(told.find("refused this launcher: it sent more than a line may hold"), std::string::npos)
      << told.substr(0, 200);
  auto node = join_async(2, 1, port, "");
  EXPECT_EQ(node.get().env.at("FROM_ROOT"), "yes");
  EXPECT_TRUE(root.get().link);
}

// After the join too: a joined launcher that sends without a newline is cut off at the bound and named, instead of
// node 0 buffering whatever it sends.
TEST(NodeLinkAuth, AJoinedNodesEndlessLineAbortsTheRunNamingIt) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, "");
  const int fd = connect_to(link_port(port, ""));
  const std::string hello = "HELLO 1 1 0\n";
  ASSERT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
  std::string got;
  char buf[512];
  for (ssize_t n; got.find("GO") == std::string::npos && (n = ::read(fd, buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  ASSERT_NE(got.find("GO"), std::string::npos) << got;
  std::unique_ptr<NodeLink> link = root.get().link;
  std::thread flood([fd] {  // one byte past the bound, as a stream of chunks
    const std::string chunk(64 * 1024, 'x');
    for (size_t sent = 0; sent <= node_link::kMaxLineBytes;) {
      const ssize_t w = ::send(fd, chunk.data(), std::min(chunk.size(), node_link::kMaxLineBytes + 1 - sent),
                               MSG_NOSIGNAL);
      if (w <= 0) break;
      sent += static_cast<size_t>(w);
    }
  });
  std::optional<LinkEvent> event;  // poll reads at most 4 KiB per peer per call
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!event && std::chrono::steady_clock::now() < deadline) event = link->poll(50);
  flood.join();
  ::close(fd);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, LinkEvent::Kind::abort);
  EXPECT_NE(event->message.find("node 1: its launcher sent more than a line may hold"), std::string::npos)
      << event->message;
}

// The nodes refuse a line longer than the bound, so node 0 refuses to send a GO line that long, naming the reason.
TEST(NodeLinkLines, AnEnvironmentLongerThanALineIsRefusedBeforeItIsSent) {
  const std::map<std::string, std::string> env = {{"BIG", std::string(node_link::kMaxLineBytes, 'v')}};
  try {
    node_link::encode_env(env);
    FAIL() << "a GO line longer than the nodes accept was encoded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("more than the node link's 1048576-byte line"), std::string::npos) << e.what();
  }
  EXPECT_EQ(node_link::encode_env({{"A", "1"}, {"B", "x=y"}}), "A=1\tB=x=y");
}

// Nodes of different sizes (horovodrun -H a:4,b:2,c:1): every node learns every node's share, in node order, and so
// where its own ranks start.
TEST(NodeLinkShares, EveryNodeLearnsEveryNodesShareInNodeOrder) {
  const int port = free_loopback_port();
  auto root = join_async(3, 0, port, kSecret, 10, 0, {4, 1});
  auto n2 = join_async(3, 2, port, kSecret, 10, 0, {1, 0});  // joins before node 1: the order is the node rank's
  auto n1 = join_async(3, 1, port, kSecret, 10, 0, {2, 1});
  const std::vector<node_link::Share> want = {{4, 1}, {2, 1}, {1, 0}};
  EXPECT_EQ(root.get().link->shares(), want);
  EXPECT_EQ(n1.get().link->shares(), want);
  Joined j2 = n2.get();
  EXPECT_EQ(j2.link->shares(), want);
  EXPECT_EQ(j2.env.at("FROM_ROOT"), "yes");
}

TEST(NodeLinkLines, HelloAndSharesReadBackWhatWasWritten) {
  const node_link::Hello hello{3, {4, 2}};
  EXPECT_EQ(node_link::hello_line(hello), "HELLO 3 4 2");
  EXPECT_EQ(node_link::parse_hello("HELLO 3 4 2"), hello);
  const std::vector<node_link::Share> shares = {{4, 1}, {2, 0}};
  EXPECT_EQ(node_link::encode_shares(shares), "4:1,2:0");
  EXPECT_EQ(node_link::decode_shares("4:1,2:0"), shares);
  for (const char* bad : {"", "4:1,", ",4:1", "4", "0:1", "4:-1", "4:1:2", "x:1", "4:1,,2:0"})
    EXPECT_FALSE(node_link::decode_shares(bad)) << bad;
}

TEST(NodeLinkAuth, WithoutASecretOnEitherSideTheLinkIsOpenAsBefore) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, "");
  auto node = join_async(2, 1, port, "");
  EXPECT_EQ(node.get().env.at("FROM_ROOT"), "yes");
  EXPECT_TRUE(root.get().link);
}

// The heartbeat rule of every control loop (comm_backends/liveness.h): launchers that poll keep each other alive
// with PINGs; one that joined and then went silent (a hung or unreachable host) is lost, named, within the limit.
// A 1.5 s timeout: with 0.4 s this failed once at load ~18 (its output was not kept; a scheduling gap longer than the
// timeout fits it), and passed five times after.
TEST(NodeLinkLiveness, PollingLaunchersStayAliveAndASilentOneIsLostNamingIt) {
  const int port = free_loopback_port();
  auto root = join_async(3, 0, port, "", 10, 1.5);
  auto n1 = join_async(3, 1, port, "", 10, 1.5);
  const int silent = connect_to(link_port(port, ""));  // node 2: says HELLO, then nothing
  const std::string hello = "HELLO 2 1 0\n";
  ASSERT_EQ(::send(silent, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
  std::unique_ptr<NodeLink> link0 = root.get().link, link1 = n1.get().link;
  const auto start = std::chrono::steady_clock::now();
  std::optional<LinkEvent> event;
  while (!event && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    event = link0->poll(10);
    if (!event) {
      EXPECT_FALSE(link1->poll(10)) << "node 1 polls and hears node 0's heartbeats";
    }
  }
  const auto took = std::chrono::steady_clock::now() - start;
  ::close(silent);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, LinkEvent::Kind::abort);
  EXPECT_NE(event->message.find("node 2: its launcher went silent: no message for 1.5 s"), std::string::npos)
      << event->message;
  EXPECT_GE(took, std::chrono::milliseconds(1500));
}

// Elastic runs: node 0 reports a node whose launcher is gone as lost, to itself alone (no ABORT reaches the other
// nodes), and counts it as finished, so the run still ends when the others are done.
TEST(NodeLinkElastic, ALostNodeIsReportedToNodeZeroAloneAndCountsAsFinished) {
  const int port = free_loopback_port();
  auto root = join_async(3, 0, port, "");
  auto n1 = join_async(3, 1, port, "");
  const int lost = connect_to(link_port(port, ""));  // node 2: says HELLO, then its launcher dies
  const std::string hello = "HELLO 2 1 0\n";
  ASSERT_EQ(::send(lost, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
  std::unique_ptr<NodeLink> link0 = root.get().link, link1 = n1.get().link;
  link0->survive_lost_nodes();
  ::close(lost);
  std::optional<LinkEvent> event;
  for (int i = 0; i < 500 && !event; ++i) event = link0->poll(10);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, LinkEvent::Kind::node_lost);
  EXPECT_EQ(event->node, 2);
  EXPECT_NE(event->message.find("node 2: its launcher is gone"), std::string::npos) << event->message;
  for (int i = 0; i < 20; ++i) {
    const auto heard = link1->poll(10);
    EXPECT_TRUE(!heard || heard->kind != LinkEvent::Kind::abort) << heard->message;
  }
  link1->workers_done();
  link1->done();
  link0->workers_done();
  link0->done();
  bool all_done = false;
  for (int i = 0; i < 500 && !all_done; ++i)
    if (const auto e = link0->poll(10)) all_done = e->kind == LinkEvent::Kind::all_done;
  EXPECT_TRUE(all_done) << "node 0 waits for the lost node forever";
}

}  // namespace
}  // namespace commsched
