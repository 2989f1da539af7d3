// The collective rendezvous store with a shared secret: members read and write keys; a client without the secret,
// or with a wrong one, is refused (and logged) before it can read or write a single key.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/collective/kv_store.h"

using namespace std::chrono_literals;
using commsched::collective::TcpStoreClient;
using commsched::collective::TcpStoreServer;

namespace {
const std::string kSecret = "store-secret-0123456789";
}

TEST(KvStoreAuth, MembersWithTheSecretShareKeys) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  TcpStoreClient a("127.0.0.1", server.port(), 5000ms, kSecret), b("127.0.0.1", server.port(), 5000ms, kSecret);
  a.set("gloo/0", "address of rank 0");
  EXPECT_EQ(b.get("gloo/0", 2000ms), "address of rank 0");
}

TEST(KvStoreAuth, ClientWithAWrongSecretIsRefusedAtConnect) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  try {
    TcpStoreClient c("127.0.0.1", server.port(), 5000ms, "not-the-secret-of-this-run");
    FAIL() << "a client with a wrong secret was admitted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("secret"), std::string::npos) << e.what();
  }
}

// A client that does not authenticate never reads a key a member wrote, and never gets its own write in.
TEST(KvStoreAuth, ClientWithoutTheSecretCannotReadOrWrite) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  TcpStoreClient member("127.0.0.1", server.port(), 5000ms, kSecret);
  member.set("nccl/unique_id", "secret-id");
  TcpStoreClient stranger("127.0.0.1", server.port(), 5000ms);
  EXPECT_THROW(stranger.get("nccl/unique_id", 1000ms), std::runtime_error);
  TcpStoreClient writer("127.0.0.1", server.port(), 5000ms);
  try {
    writer.set("nccl/unique_id", "forged");
    writer.set("nccl/unique_id", "forged");  // the first reply may be the challenge; by now the server has hung up
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(member.get("nccl/unique_id", 1000ms), "secret-id");
}

// A client without the secret that meets the store's challenge is told at once that the store requires the secret,
// instead of reading the challenge as an absent key and waiting out its deadline.
TEST(KvStoreAuth, ClientWithoutTheSecretIsToldTheStoreRequiresIt) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  for (const bool write : {false, true}) {
    TcpStoreClient stranger("127.0.0.1", server.port(), 5000ms);
    const auto start = std::chrono::steady_clock::now();
    try {
      if (write) stranger.set("gloo/0", "forged");
      else stranger.get("gloo/0", 20000ms);
      FAIL() << "a client without the secret was answered";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("requires the run's shared secret"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  }
}

// A stranger that announces a frame far longer than a handshake's is hung up on at once: the store neither waits for
// nor buffers megabytes from someone who has proved nothing, and its members carry on.
TEST(KvStoreAuth, AStrangerAnnouncingAHugeFrameIsHungUpOnAtOnce) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const uint32_t announced = 60u << 20;  // within the general 64 MiB bound, far beyond a handshake's
  ASSERT_EQ(::send(fd, &announced, sizeof announced, 0), static_cast<ssize_t>(sizeof announced));
  const auto start = std::chrono::steady_clock::now();
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {  // the challenge, then the end of the connection
  }
  EXPECT_EQ(n, 0) << "the store kept the connection open (recv timed out)";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  ::close(fd);
  TcpStoreClient member("127.0.0.1", server.port(), 5000ms, kSecret);
  member.set("k", "v");
  EXPECT_EQ(member.get("k", 1000ms), "v");
}

// The other way round: a member with the secret refuses a store that cannot prove it (not this run's store).
TEST(KvStoreAuth, MemberRefusesAStoreWithoutTheSecret) {
  TcpStoreServer server("127.0.0.1", 0);
  EXPECT_THROW(TcpStoreClient("127.0.0.1", server.port(), 2000ms, kSecret), std::runtime_error);
}

// add() is one step of the server: clients adding at once each get a distinct number (elastic registration).
TEST(KvStore, AddGivesEveryClientADistinctNumber) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  constexpr int kClients = 4, kEach = 50;
  std::vector<std::vector<int64_t>> got(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&, c] {
      TcpStoreClient client("127.0.0.1", server.port(), 5000ms, kSecret);
      for (int i = 0; i < kEach; ++i) got[c].push_back(client.add("count", 1));
    });
  for (auto& t : threads) t.join();
  std::set<int64_t> all;
  for (const auto& g : got) all.insert(g.begin(), g.end());
  EXPECT_EQ(all.size(), size_t{kClients * kEach});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kClients * kEach);
  TcpStoreClient reader("127.0.0.1", server.port(), 5000ms, kSecret);
  EXPECT_EQ(reader.add("count", 0), kClients * kEach);
  EXPECT_EQ(reader.get("count", 1000ms), std::to_string(kClients * kEach));
}

// The rendezvous on the Store: every member publishes under its rank and reads everyone's; one that never comes is
// named at the deadline.
TEST(StoreRendezvous, MembersExchangeTheirValuesByRank) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  constexpr int kSize = 3;
  std::vector<std::vector<std::string>> got(kSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r)
    threads.emplace_back([&, r] {
      TcpStoreClient client("127.0.0.1", server.port(), 5000ms, kSecret);
      got[r] = commsched::control::exchange(client, "group/", r, kSize, "addr" + std::to_string(r),
                                            std::chrono::steady_clock::now() + 5s);
    });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, (std::vector<std::string>{"addr0", "addr1", "addr2"}));
}

TEST(StoreRendezvous, AMissingMemberIsNamedAtTheDeadline) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient client("127.0.0.1", server.port(), 5000ms);
  try {
    commsched::control::exchange(client, "group/", 1, 4, "x", std::chrono::steady_clock::now() + 100ms);
    ADD_FAILURE() << "the exchange completed without ranks 0, 2 and 3";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rendezvous 'group/': rank(s) 0, 2, 3 did not publish"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("rendezvous store at 127.0.0.1:"), std::string::npos) << e.what();
  }
  try {
    client.wait({"group/1", "never"}, std::chrono::steady_clock::now() + 50ms);
    ADD_FAILURE() << "waited for a key nobody set";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'never' did not appear"), std::string::npos) << e.what();
  }
  EXPECT_EQ(client.try_get("group/1"), std::optional<std::string>("x"));
}
