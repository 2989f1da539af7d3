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

#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/socket.h"

using namespace std::chrono_literals;
using commsched::collective::TcpStoreClient;
using commsched::collective::TcpStoreServer;

namespace {
const std::string kSecret = "store-secret-0123456789";

// The run's secret as ClusterAuth::from_env reads it, for the tests that build a Rendezvous from a ClusterEnv.
struct SecretGuard {
  explicit SecretGuard(const std::string& secret) { ::setenv("COMMSCHED_SECRET", secret.c_str(), 1); }
  ~SecretGuard() { ::unsetenv("COMMSCHED_SECRET"); }
};

// Member `rank` of a `size`-member process set that meets in the job's store at 127.0.0.1:`port`.
commsched::ClusterEnv set_member(int rank, int size, int port) {
  commsched::ClusterEnv env;
  env.rank = rank;
  env.num_workers = size;
  env.root_addr = "127.0.0.1";
  env.root_port = port;
  env.store_scope = "pset/7/";
  return env;
}
}  // namespace

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

// A listener on 127.0.0.1:`port` that never says a word (the kernel completes the connections; nobody reads or writes
// them); -1 when the port cannot be bound.
namespace {
int silent_listener(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 8) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}
}  // namespace

// A "store" that comes up late, lets the member connect and never challenges it: the member gives up at its connect
// timeout counted from its first try (not that timeout again once connected), naming the store's address.
TEST(KvStoreAuth, AStoreThatNeverChallengesFailsTheConnectWithinTheCallersTimeout) {
  const int port = commsched::control::free_port("127.0.0.1");
  int listener = -1;
  std::thread late([&] {
    std::this_thread::sleep_for(1500ms);  // half the timeout, the other half left to a loaded machine
    listener = silent_listener(port);
  });
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    TcpStoreClient member("127.0.0.1", port, 3000ms, kSecret);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  late.join();
  ASSERT_GE(listener, 0) << "the test's listener could not bind port " << port;
  ::close(listener);
  ASSERT_FALSE(error.empty()) << "a listener that never challenged was taken for the store";
  EXPECT_GE(waited, 2.9) << error;
  EXPECT_LT(waited, 4.0) << "waited the timeout again once connected (4.5 s): " << error;
  EXPECT_NE(error.find("rendezvous store at 127.0.0.1:" + std::to_string(port) + " sent no authentication challenge"),
            std::string::npos) << error;
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

// A process set's members are clients of the job's one store (the global group serves it): they publish their hosts
// under the set's prefix and count who shares theirs; none of them serves a store of its own.
TEST(ProcessSetStore, MembersMeetInTheJobsStoreUnderTheSetsKeys) {
  SecretGuard secret(kSecret);
  TcpStoreServer job_store("127.0.0.1", 0, kSecret);
  constexpr int kSize = 3;
  std::vector<commsched::ClusterEnv> envs;
  for (int r = 0; r < kSize; ++r) envs.push_back(set_member(r, kSize, job_store.port()));
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) threads.emplace_back([&, r] { commsched::collective::place_on_hosts(envs[r]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kSize; ++r) {
    EXPECT_EQ(envs[r].local_rank, r);  // every member is on this host
    EXPECT_EQ(envs[r].local_size, kSize);
  }
  TcpStoreClient reader("127.0.0.1", job_store.port(), 5000ms, kSecret);
  EXPECT_EQ(reader.try_get("pset/7/host/2"), std::optional<std::string>("127.0.0.1"));
  commsched::ClusterEnv later = set_member(0, kSize, job_store.port());
  later.generation = 3;
  EXPECT_EQ(commsched::collective::Rendezvous(later, "gloo/").scope(), "pset/7/gen3/gloo/");
}

TEST(ProcessSetStore, TheSetsFirstMemberServesNoStore) {
  SecretGuard secret(kSecret);
  const int port = commsched::control::free_port("127.0.0.1");
  try {
    commsched::collective::Rendezvous(set_member(0, 2, port), "gloo/", /*serves=*/true, 300ms);
    FAIL() << "a process set's rank 0 served a store of its own at port " << port;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(ProcessSetStore, AMemberWithAWrongSecretIsRefusedNamingTheStore) {
  TcpStoreServer job_store("127.0.0.1", 0, kSecret);
  SecretGuard secret("not-the-secret-of-this-run");
  commsched::ClusterEnv env = set_member(1, 2, job_store.port());
  try {
    commsched::collective::place_on_hosts(env);
    FAIL() << "a member with a wrong secret joined the set";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rendezvous store at 127.0.0.1:" + std::to_string(job_store.port())), std::string::npos)
        << what;
    EXPECT_NE(what.find("shared secret differs"), std::string::npos) << what;
  }
}

TEST(ProcessSetStore, PlacingNeedsTheSetsScope) {
  commsched::ClusterEnv env;
  EXPECT_THROW(commsched::collective::place_on_hosts(env), commsched::InvalidArgument);
}
