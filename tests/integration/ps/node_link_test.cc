// The launchers' node link proves the run's secret both ways (SecretHandshake "node link"): nodes with the secret
// join; a stranger is refused with a reason and cannot stop the join; a node and a root that disagree on having a
// secret fail with an error that names the switches.
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

#include "comm_backends/cluster_auth.h"
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
                               double silence_s = 0) {
  return std::async(std::launch::async, [=] {
    Joined j;
    if (node == 0) j.env = {{"FROM_ROOT", "yes"}};
    j.link = NodeLink::join(nnodes, node, "127.0.0.1", port, j.env, timeout_s, secret, silence_s);
    return j;
  });
}

// A raw connection to node 0's listener (retried while it starts).
int connect_to_root(int port) {
  return control::connect_tcp("127.0.0.1", port, std::chrono::steady_clock::now() + std::chrono::seconds(5)).release();
}

// Connects as a stranger, reads the root's first line, says `hello`, and returns everything the root answered.
std::string stranger(int port, const std::string& hello) {
  const int fd = connect_to_root(port);
  std::string got;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf);  // OPEN or CHALLENGE <nonce>
  if (n > 0) got.assign(buf, static_cast<size_t>(n));
  for (size_t sent = 0; sent < hello.size();) {  // no SIGPIPE when the root hangs up first
    const ssize_t w = ::send(fd, hello.data() + sent, hello.size() - sent, MSG_NOSIGNAL);
    if (w <= 0) break;
    sent += static_cast<size_t>(w);
  }
  while ((n = ::read(fd, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return got;
}

TEST(NodeLinkAuth, NodesWithTheSecretJoinAndGetTheRootsEnvironment) {
  const int port = free_loopback_port();
  auto root = join_async(3, 0, port, kSecret);
  auto n1 = join_async(3, 1, port, kSecret), n2 = join_async(3, 2, port, kSecret);
  EXPECT_TRUE(root.get().link);
  EXPECT_EQ(n1.get().env.at("FROM_ROOT"), "yes");
  EXPECT_EQ(n2.get().env.at("FROM_ROOT"), "yes");
}

TEST(NodeLinkAuth, AStrangerIsRefusedWithAReasonAndTheRealNodeStillJoins) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, kSecret);
  const std::string fake_nonce(64, 'a'), fake_proof(64, 'b');
  const std::string told = stranger(port, "HELLO 1 " + fake_nonce + " " + fake_proof + "\n");
  EXPECT_NE(told.find("CHALLENGE "), std::string::npos) << told;
  EXPECT_NE(told.find("ABORT 0 node 0 refused this launcher: it did not prove the run's shared secret"),
            std::string::npos) << told;
  EXPECT_EQ(told.find("GO"), std::string::npos) << "a stranger must never see the run start: " << told;
  EXPECT_NE(stranger(port, "garbage\n").find("it sent no HELLO"), std::string::npos);
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
    EXPECT_NE(std::string(e.what()).find("refused this node"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("did not prove the run's shared secret"), std::string::npos) << e.what();
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
      EXPECT_NE(std::string(e.what()).find("requires the run's shared secret: set the same COMMSCHED_SECRET"),
                std::string::npos) << e.what();
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
      EXPECT_NE(std::string(e.what()).find("does not authenticate"), std::string::npos) << e.what();
    }
    EXPECT_THROW(root.get(), std::runtime_error);
  }
}

// Without a secret anyone may join, but a stranger's malformed HELLO is still only refused: it used to reach the
// node rank's parser, whose error ended node 0's launcher (found reading the link's parsers for fuzz_node_link).
TEST(NodeLinkAuth, WithoutASecretAMalformedHelloIsRefusedAndTheRealNodeStillJoins) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, "");
  for (const std::string hello : {"HELLO x\n", "HELLO 99999999999\n", "HELLO -1\n", "HELLO 1 2 3 4\n"}) {
    const std::string told = stranger(port, hello);
    EXPECT_NE(told.find("refused this launcher: it sent no HELLO naming its node rank"), std::string::npos)
        << hello << ": " << told;
  }
  auto node = join_async(2, 1, port, "");
  EXPECT_EQ(node.get().env.at("FROM_ROOT"), "yes");
  EXPECT_TRUE(root.get().link);
}

// Before the handshake anyone may connect: a line longer than any of ours is refused as soon as it passes the bound,
// not kept in memory until the stranger stops (a fast sender could otherwise fill node 0's memory).
TEST(NodeLinkAuth, AStrangersEndlessLineIsRefusedAtTheBound) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, kSecret);
  // Exactly one byte past the bound, so that node 0 has read all of it when it refuses (a clean close, no reset).
  const std::string told = stranger(port, std::string((1u << 20) + 1, 'x'));
  EXPECT_NE(told.find("refused this launcher: it sent more than a line may hold"), std::string::npos)
      << told.substr(0, 200);
  auto node = join_async(2, 1, port, kSecret);
  EXPECT_EQ(node.get().env.at("FROM_ROOT"), "yes");
  EXPECT_TRUE(root.get().link);
}

// After the join too: a joined launcher that sends without a newline is cut off at the bound and named, instead of
// node 0 buffering whatever it sends.
TEST(NodeLinkAuth, AJoinedNodesEndlessLineAbortsTheRunNamingIt) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, "");
  const int fd = connect_to_root(port);
  const std::string hello = "HELLO 1\n";
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

TEST(NodeLinkAuth, WithoutASecretOnEitherSideTheLinkIsOpenAsBefore) {
  const int port = free_loopback_port();
  auto root = join_async(2, 0, port, "");
  auto node = join_async(2, 1, port, "");
  EXPECT_EQ(node.get().env.at("FROM_ROOT"), "yes");
  EXPECT_TRUE(root.get().link);
}

// The heartbeat rule of every control loop (comm_backends/liveness.h): launchers that poll keep each other alive
// with PINGs; one that joined and then went silent (a hung or unreachable host) is lost, named, within the limit.
TEST(NodeLinkLiveness, PollingLaunchersStayAliveAndASilentOneIsLostNamingIt) {
  const int port = free_loopback_port();
  auto root = join_async(3, 0, port, "", 10, 0.4);
  auto n1 = join_async(3, 1, port, "", 10, 0.4);
  const int silent = connect_to_root(port);  // node 2: says HELLO, then nothing
  char buf[512];
  ASSERT_GT(::read(silent, buf, sizeof buf), 0);  // OPEN
  const std::string hello = "HELLO 2\n";
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
  EXPECT_NE(event->message.find("node 2: its launcher went silent: no message for 0.4 s"), std::string::npos)
      << event->message;
  EXPECT_GE(took, std::chrono::milliseconds(400));
}

}  // namespace
}  // namespace commsched
