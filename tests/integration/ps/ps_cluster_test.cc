// Multi-process tests of the parameter server: real server and worker processes on loopback, over every transport:
// ZeroMQ, UCX shared memory (UCX_TLS=sm,self) and UCX TCP (UCX_TLS=tcp). The UCX cases skip, saying so, in a build
// without UCX.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <tuple>
#include <iostream>
#include <thread>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/control/socket.h"
#include "comm_backends/ps/protocol.h"
#include "comm_backends/ps/transport.h"
#include "tests/integration/harness/local_cluster.h"

using namespace std::chrono_literals;
using commsched::testing::LocalCluster;

namespace {

const std::string kExe = PS_TEST_WORKER;

using Env = std::map<std::string, std::string>;

struct TransportCase {
  std::string name;
  Env env;
};

// ucx_env: UCX with the transports in COMMSCHED_TEST_UCX_TLS (scripts/rdma_checks.sh sets rc or ud there when an
// RDMA device exists); skipped, saying so, when unset.
const char* const kEnvTls = std::getenv("COMMSCHED_TEST_UCX_TLS");

const TransportCase kTransports[] = {
    {"zmq", {{"COMMSCHED_PS_TRANSPORT", "zmq"}}},
    {"ucx_shm", {{"COMMSCHED_PS_TRANSPORT", "ucx"}, {"UCX_TLS", "sm,self"}}},
    {"ucx_tcp", {{"COMMSCHED_PS_TRANSPORT", "ucx"}, {"UCX_TLS", "tcp"}}},
    {"ucx_env", {{"COMMSCHED_PS_TRANSPORT", "ucx"}, {"UCX_TLS", kEnvTls ? kEnvTls : ""}}},
};

void PrintTo(const TransportCase& t, std::ostream* os) { *os << t.name; }

bool is_ucx(const TransportCase& t) { return t.env.at("COMMSCHED_PS_TRANSPORT") == "ucx"; }

Env with(const TransportCase& t, Env extra = {}) {
  extra.insert(t.env.begin(), t.env.end());
  return extra;
}

#define SKIP_IF_UNAVAILABLE(t)                                                                                \
  if (is_ucx(t) && !commsched::ps::ucx_built_in()) GTEST_SKIP() << "this build has no UCX (install libucx-dev and rebuild)"; \
  if ((t).name == "ucx_env" && !kEnvTls)                                                                        \
  GTEST_SKIP() << "COMMSCHED_TEST_UCX_TLS is not set (scripts/rdma_checks.sh sets it when an RDMA device exists)"

class PsCluster : public ::testing::TestWithParam<TransportCase> {
 protected:
  void SetUp() override { SKIP_IF_UNAVAILABLE(GetParam()); }
  Env env(Env extra = {}) const { return with(GetParam(), std::move(extra)); }
};

std::string transport_name(const ::testing::TestParamInfo<TransportCase>& info) { return info.param.name; }

std::string all_logs(LocalCluster& c) {
  std::string s;
  for (auto& p : c.procs()) s += "---- " + p.name + " (exit " + (p.exit_code ? std::to_string(*p.exit_code) : "?") +
                                 ")\n" + c.read_log(p.name);
  return s;
}

// Every process exited 0, and none logged a UCX error: a clean run shows the user no error (a peer that ends its
// connection while another's close() flushes made UCX log one in about one clean shutdown in ten over TCP).
void expect_all_ok(LocalCluster& c) {
  for (auto& p : c.procs()) {
    EXPECT_EQ(p.exit_code.value_or(-1), 0) << p.name << "\n" << all_logs(c);
    EXPECT_EQ(c.read_log(p.name).find("UCX  ERROR"), std::string::npos) << p.name << "\n" << all_logs(c);
  }
}

// Whether server 0's log holds, for each entry, at least one of its alternatives.
bool logged_all(LocalCluster& c, const std::vector<std::vector<std::string>>& needed) {
  const std::string log = c.read_log("server 0");
  return std::all_of(needed.begin(), needed.end(), [&](const std::vector<std::string>& any) {
    return std::any_of(any.begin(), any.end(), [&](const std::string& s) { return log.find(s) != std::string::npos; });
  });
}

// A file the workers wait for before their first iteration (--hold-file): the run, and so its server, lasts until the
// test has seen what it waits for. Removed with the object.
struct HoldFile {
  std::string path = "/tmp/commsched-hold-" + std::to_string(::getpid()) + "-" + std::to_string(next++);
  static inline int next = 0;
  void release() const { std::ofstream(path) << "go\n"; }
  ~HoldFile() { std::remove(path.c_str()); }
};

// The port of server 0's transport, from its "listening on tcp://HOST:PORT;" line (within 10 s; 0 when it never
// says): the root port is the rendezvous store's, the data port is any free one.
int server0_data_port(LocalCluster& c) {
  const std::string said = "listening on tcp://";
  for (int i = 0; i < 2000; ++i) {
    const std::string log = c.read_log("server 0");
    if (const auto at = log.find(said); at != std::string::npos) {
      const auto colon = log.find(':', at + said.size());
      return std::atoi(log.c_str() + colon + 1);
    }
    std::this_thread::sleep_for(5ms);
  }
  return 0;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

bool wait_for_file(const std::string& path, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (std::ifstream(path).good()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

void send_bad_headers_zmq(int port) {
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  zmq_connect(s, ep.c_str());
  const char bad_magic[commsched::ps::kHeaderBytes] = "this is not a commsched header";
  zmq_send(s, bad_magic, sizeof bad_magic, 0);
  void* s2 = zmq_socket(ctx, ZMQ_DEALER);
  zmq_connect(s2, ep.c_str());
  zmq_send(s2, "short", 5, 0);
  // Delivery, not a pause: each peer waits for the server's error reply, which proves its message arrived.
  for (void* sock : {s, s2}) {
    int wait_ms = 10000;
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &wait_ms, sizeof wait_ms);
    char reply[commsched::ps::kHeaderBytes];
    EXPECT_GE(zmq_recv(sock, reply, sizeof reply, 0), 0) << "the server did not answer a malformed message";
  }
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s2, ZMQ_LINGER, &zero, sizeof zero);
  zmq_close(s);
  zmq_close(s2);
  zmq_ctx_term(ctx);
}

// The same through UCX (UCX_TLS of the test's own environment: set by the case below for the servers only, so
// this process uses UCX's default choice, which reaches them too).
void send_bad_headers_ucx(int port) {
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  auto t = commsched::ps::make_ucx_transport({});
  const char bad_magic[commsched::ps::kHeaderBytes] = "this is not a commsched header";
  t->send(t->connect(ep), std::as_bytes(std::span(bad_magic)));
  t->send(t->connect(ep), std::as_bytes(std::span("short", 5)));
  const auto end = std::chrono::steady_clock::now() + 300ms;
  while (std::chrono::steady_clock::now() < end) (void)t->receive(10ms);
  t->close(true);
}

}  // namespace

// 4 workers x 2 servers, 200 tensors from 1 byte to 8 MiB of every dtype, integer-valued data: exact sums, with
// partition boundaries changing every iteration, after a broadcast of initial parameters from rank 0.
TEST_P(PsCluster, ExactSumsEveryDtype) {
  LocalCluster c(kExe, 4, 2, {"--tensors", "200", "--iterations", "10", "--max-bytes", "8388608", "--mode", "exact"}, env());
  c.start();
  ASSERT_TRUE(c.wait_all(100s)) << all_logs(c);
  expect_all_ok(c);
  // The case ran on the transports it names (UCX logs its choice of lanes).
  const std::string log = c.read_log("worker 0");
  if (GetParam().name == "ucx_shm") {
    EXPECT_NE(log.find("over UCX transports: "), std::string::npos) << log;
    EXPECT_NE(log.find("memory"), std::string::npos) << log;
    EXPECT_EQ(log.find("tcp/"), std::string::npos) << log;
  } else if (GetParam().name == "ucx_tcp") {
    EXPECT_NE(log.find("over UCX transports: tcp/"), std::string::npos) << log;
  } else if (GetParam().name == "ucx_env") {
    EXPECT_NE(log.find("over UCX transports: "), std::string::npos) << log;
  } else {
    EXPECT_EQ(log.find("UCX"), std::string::npos) << log;
  }
}

// 8 workers and one server, each worker sending 500 small partitions (1 byte to 16 KiB), every one its own message,
// all at once, for 4 iterations: the senders outrun the server (over UCX shared memory they fill its FIFO) and must
// wait for it, not starve it. Every worker finishes every round with exact sums, so none was left unserved.
TEST_P(PsCluster, EightWorkersFloodingOneServerAllFinishWithExactSums) {
  LocalCluster c(kExe, 8, 1, {"--tensors", "500", "--iterations", "4", "--max-bytes", "16384", "--mode", "flood"}, env());
  c.start();
  ASSERT_TRUE(c.wait_all(120s)) << "the cluster did not finish\n" << all_logs(c);
  expect_all_ok(c);
}

// Per-worker credit of one partition, every worker ranking the tensors differently: without credit released on
// receipt, each worker's credit would hold partitions the others have not sent, and the cluster would wait forever.
TEST_P(PsCluster, EngineWithTinyCreditAndConflictingPrioritiesCompletes) {
  LocalCluster c(kExe, 4, 2, {"--tensors", "40", "--iterations", "3", "--max-bytes", "1048576", "--mode", "engine"}, env());
  c.start();
  ASSERT_TRUE(c.wait_all(60s)) << "deadlock: the cluster did not finish\n" << all_logs(c);
  expect_all_ok(c);
}

// Horovod's join over the PS: worker r runs 3 + r iterations, then joins; the servers stand in with zeros for the
// joined workers, every sum stays exact (the worker checks them, counting joined workers as zeros), join() names
// the last worker on every worker, and one more iteration of the same tensors after the join sums over all of them.
TEST_P(PsCluster, JoinedWorkersStandInWithZerosAndRoundsLineUpAfter) {
  LocalCluster c(kExe, 3, 2, {"--tensors", "20", "--iterations", "3", "--max-bytes", "400000", "--mode", "join"}, env());
  c.start();
  ASSERT_TRUE(c.wait_all(60s)) << "the cluster did not finish\n" << all_logs(c);
  expect_all_ok(c);
  for (int w = 0; w < 3; ++w)
    EXPECT_NE(c.read_log("worker " + std::to_string(w)).find("joined; last 2"), std::string::npos) << all_logs(c);
  EXPECT_NE(c.read_log("server 1").find("every worker has joined (worker 2 last)"), std::string::npos) << all_logs(c);
}

// The online tuner switches partition size and credit live over the PS (rank 0 decides; the decision is broadcast
// through the PS itself): every sum stays exact, and every worker ends with the same knobs.
TEST_P(PsCluster, LiveTuningKeepsSumsExactAndWorkersAgree) {
  LocalCluster c(kExe, 3, 2, {"--tensors", "30", "--iterations", "8", "--max-bytes", "2097152", "--mode", "tune"}, env());
  c.start();
  ASSERT_TRUE(c.wait_all(90s)) << all_logs(c);
  expect_all_ok(c);
  std::string first;
  for (auto& p : c.procs()) {
    if (p.name.rfind("worker", 0) != 0) continue;
    const std::string log = c.read_log(p.name);
    const auto at = log.find("final knobs ");
    ASSERT_NE(at, std::string::npos) << p.name << "\n" << log;
    const std::string knobs = log.substr(at, log.find('\n', at) - at);
    if (first.empty()) first = knobs;
    EXPECT_EQ(knobs, first) << p.name;
  }
  EXPECT_FALSE(first.empty());
}

// Deterministic mode: the same random float data gives bitwise identical sums in two separate runs.
TEST_P(PsCluster, DeterministicModeIsBitwiseReproducible) {
  std::string hashes[2];
  for (int run = 0; run < 2; ++run) {
    LocalCluster c(kExe, 4, 2,
                   {"--tensors", "40", "--iterations", "2", "--max-bytes", "2000000", "--mode", "random", "--out",
                    "{dir}/out{rank}"},
                   env({{"COMMSCHED_PS_DETERMINISTIC", "1"}}));
    c.start();
    ASSERT_TRUE(c.wait_all(60s)) << all_logs(c);
    expect_all_ok(c);
    hashes[run] = read_file(c.dir() + "/out0");
    for (int w = 1; w < 4; ++w) EXPECT_EQ(read_file(c.dir() + "/out" + std::to_string(w)), hashes[run]) << w;
  }
  EXPECT_FALSE(hashes[0].empty());
  EXPECT_EQ(hashes[0], hashes[1]);
}

class PsKill : public ::testing::TestWithParam<std::tuple<TransportCase, std::string, int>> {
 protected:
  void SetUp() override { SKIP_IF_UNAVAILABLE(std::get<0>(GetParam())); }
};

// kill -9 (a crash) or SIGSTOP (a hung peer: connections open and silent) of one process: every survivor exits
// non-zero within 10 s, naming the lost peer and its address; nothing is left behind.
TEST_P(PsKill, SurvivorsFailNamingThePeer) {
  const auto& [transport, victim, sig] = GetParam();
  Env env = sig == SIGSTOP ? Env{{"COMMSCHED_TIMEOUT", "3"}} : Env{};
  // UCX 1.13's TCP transport now and then aborts a survivor whose peer dies in the middle of a rendezvous PUT
  // (tcp_ep.c:939, assertion PUT_TX_WAITING_ACK; about 1 kill in 75 here), before our code sees the loss. That is
  // UCX's bug, documented with this workaround in comm_backends/ps/README.md; this test is about our handling.
  if (transport.name == "ucx_tcp") env["UCX_TCP_PUT_ENABLE"] = "n";
  LocalCluster c(kExe, 4, 2,
                 {"--tensors", "30", "--max-bytes", "300000", "--mode", "loop", "--ready", "{dir}/ready{rank}"},
                 with(transport, env));
  c.start();
  for (int w = 0; w < 4; ++w)
    ASSERT_TRUE(wait_for_file(c.dir() + "/ready" + std::to_string(w), 30s)) << all_logs(c);
  // Every worker has finished an iteration and loops on: the kill lands mid-run.
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(c.proc(victim).pid, sig);
  // A hung victim never exits by itself: wait for the survivors, then end it.
  const int victims_left = sig == SIGSTOP ? 1 : 0;
  while (c.alive() > victims_left && std::chrono::steady_clock::now() - killed_at < 15s) std::this_thread::sleep_for(20ms);
  if (sig == SIGSTOP) c.kill9(victim);
  ASSERT_TRUE(c.wait_all(5s)) << "processes still running 15 s after the kill\n" << all_logs(c);
  std::chrono::steady_clock::duration slowest{};
  for (auto& p : c.procs()) {
    if (p.name == victim) continue;
    slowest = std::max(slowest, p.exited - killed_at);
    const std::string log = c.read_log(p.name);
    EXPECT_NE(p.exit_code.value_or(0), 0) << p.name << " exited 0\n" << log;
    EXPECT_LT(p.exited - killed_at, 10s) << p.name << " took too long\n" << log;
    EXPECT_NE(log.find(victim), std::string::npos) << p.name << " does not name " << victim << "\n" << all_logs(c);
    // Named with its address on every transport, whichever side dialled (a ROUTER's peers included).
    EXPECT_NE(log.find(victim + " (127.0.0.1:"), std::string::npos) << p.name << "\n" << all_logs(c);
    std::istringstream lines(log);  // a report relayed over two hops still names one reporter, the first
    for (std::string line; std::getline(lines, line);) {
      const auto first = line.find("(reported by");
      EXPECT_TRUE(first == std::string::npos || line.find("(reported by", first + 1) == std::string::npos)
          << p.name << ": " << line;
    }
  }
  EXPECT_EQ(c.alive(), 0);
  std::cout << "every survivor of the kill of " << victim << " exited within "
            << std::chrono::duration<double>(slowest).count() << " s\n";
}
INSTANTIATE_TEST_SUITE_P(Victims, PsKill,
                         ::testing::Combine(::testing::ValuesIn(kTransports),
                                            ::testing::Values("worker 2", "server 1", "server 0"),
                                            ::testing::Values(SIGKILL, SIGSTOP)),
                         [](const auto& info) {
                           std::string n = std::get<1>(info.param);
                           n[n.find(' ')] = '_';
                           return std::get<0>(info.param).name + "_" + n +
                                  (std::get<2>(info.param) == SIGSTOP ? "_hung" : "_killed");
                         });

// The same key with different sizes on different workers: every worker fails with an error naming key and sizes.
TEST_P(PsCluster, MismatchedSizesNameKeyAndSizes) {
  LocalCluster c(kExe, 2, 1, {"--tensors", "3", "--iterations", "1", "--max-bytes", "4096", "--mode", "mismatch"}, env());
  c.start();
  ASSERT_TRUE(c.wait_all(30s)) << all_logs(c);
  for (const char* w : {"worker 0", "worker 1"}) {
    const std::string log = c.read_log(w);
    EXPECT_NE(c.proc(w).exit_code.value_or(0), 0) << log;
    EXPECT_NE(log.find("disagree"), std::string::npos) << log;
    EXPECT_NE(log.find("4000 bytes"), std::string::npos) << log;  // 1000 f32
    EXPECT_NE(log.find("4012 bytes"), std::string::npos) << log;  // 1003 f32
    EXPECT_NE(log.find("key "), std::string::npos) << log;
  }
}

// Foreign bytes on a server port (raw TCP garbage, and ZeroMQ peers sending bad headers) are dropped and logged, and
// garbage at the rendezvous store is dropped too; the server keeps serving the real workers, whose sums stay exact.
TEST_P(PsCluster, MalformedMessagesAreDroppedAndServingContinues) {
  LocalCluster c(kExe, 2, 1,
                 {"--tensors", "20", "--iterations", "400", "--max-bytes", "200000", "--mode", "exact"}, env());
  c.start();
  const int data_port = server0_data_port(c);
  ASSERT_GT(data_port, 0) << all_logs(c);
  // 1. Raw TCP garbage, at server 0's transport and at the rendezvous store on the root port.
  for (const int port : {data_port, c.root_port()}) {
    const commsched::control::Fd fd = commsched::control::connect_tcp("127.0.0.1", port, std::chrono::steady_clock::now() + 5s);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\xff\xff\xff\xff garbage garbage";
    commsched::control::send_bytes(fd.get(), std::string_view(junk, sizeof junk));
    ::shutdown(fd.get(), SHUT_WR);  // the junk, then end of stream: nothing here needs to wait for the server
  }
  // 2. A peer of the same transport with a bad magic, and one with a truncated header.
  if (is_ucx(GetParam())) {
    send_bad_headers_ucx(data_port);
  } else {
    send_bad_headers_zmq(data_port);
  }
  ASSERT_TRUE(c.wait_all(60s)) << all_logs(c);
  expect_all_ok(c);
  const std::string log = c.read_log("server 0");
  EXPECT_NE(log.find("bad magic"), std::string::npos) << log;
  EXPECT_NE(log.find("header frame is 5 bytes"), std::string::npos) << log;
  EXPECT_NE(log.find("still serving"), std::string::npos) << log;
}

// Pulls landing in the tensors: UCX only (ZeroMQ copies from its own frames, which the other suites cover). On
// ZeroMQ the shutdown case below showed a separate, older problem: the worker's bye sometimes does not arrive when
// it shuts down with answers in flight (about one run in ten here), and the server reports it lost.
class PsLanding : public PsCluster {};

// Pulls land in the tensors (UCX: the answer of a 4 MiB push_pull is fetched straight into it). Server 0 is killed
// while the worker loops on 8 such requests: every request fails naming the server, and its tensor, poisoned in the
// failure callback, is untouched once the backend is gone: no fetch wrote into it after its completion (exit 3, and
// not 5: a write after completion, or a crash).
TEST_P(PsLanding, ServerKilledMidPullWritesNoTensorAfterItsCompletion) {
  LocalCluster c(kExe, 1, 1,
                 {"--tensors", "8", "--max-bytes", "4194304", "--mode", "land", "--ready", "{dir}/ready{rank}"}, env());
  c.start();
  ASSERT_TRUE(wait_for_file(c.dir() + "/ready0", 30s)) << all_logs(c);
  ::kill(c.proc("server 0").pid, SIGKILL);
  ASSERT_TRUE(c.wait_all(15s)) << all_logs(c);
  const std::string log = c.read_log("worker 0");
  EXPECT_EQ(c.proc("worker 0").exit_code.value_or(-1), 3) << log;
  EXPECT_NE(log.find("server 0"), std::string::npos) << log;
  EXPECT_NE(log.find("their tensors untouched after"), std::string::npos) << log;
  EXPECT_EQ(log.find("written after its request completed"), std::string::npos) << log;
}

// The worker shuts down with 1 MiB pulls in flight (right after the first answer of a round of 8; UCX fetches them
// by rendezvous): the requests the shutdown cancels complete only once nothing can write into their tensors
// (poisoned in the callback, untouched after), the others carry exact sums, and the cluster ends cleanly: the
// worker's close lets the fetches in flight finish before it closes its endpoints (force-closing them mid-transfer
// made UCX's TCP transport abort the server), and it closes only once the server has answered its bye: over ZeroMQ,
// closing with answers still arriving reset the connection and the kernel dropped the bye still queued behind the
// pushes, so the server reported the worker lost (about 1 run in 15 before that).
TEST_P(PsLanding, ShutdownWithPullsInFlightWritesNoTensorAfterItsCompletion) {
  LocalCluster c(kExe, 1, 1, {"--tensors", "8", "--iterations", "3", "--max-bytes", "1048576", "--mode", "land-shutdown"},
                 env());
  c.start();
  ASSERT_TRUE(c.wait_all(60s)) << all_logs(c);
  expect_all_ok(c);
  const std::string log = c.read_log("worker 0");
  const auto at = log.find(" requests failed or cancelled, their tensors untouched after");
  ASSERT_NE(at, std::string::npos) << all_logs(c);
  std::cout << log.substr(log.rfind(' ', at - 1) + 1, at - log.rfind(' ', at - 1) - 1)
            << " of the last round's 8 requests were cancelled by the shutdown\n";
}

INSTANTIATE_TEST_SUITE_P(Transports, PsCluster, ::testing::ValuesIn(kTransports), transport_name);
INSTANTIATE_TEST_SUITE_P(Transports, PsLanding, ::testing::ValuesIn(kTransports), transport_name);

// Starts the cluster, waits until server 0 listens, and returns the well-formed hello of a worker claiming rank 1.
std::array<std::byte, commsched::ps::kHeaderBytes> start_until_listening(LocalCluster& c) {
  c.start();
  for (int i = 0; i < 1000 && c.read_log("server 0").find("listening") == std::string::npos; ++i)
    std::this_thread::sleep_for(5ms);
  std::array<std::byte, commsched::ps::kHeaderBytes> hello;
  commsched::ps::encode_header(
      commsched::ps::make_header(commsched::ps::MsgType::hello, commsched::ps::PeerRole::worker, 1), hello);
  return hello;
}

// The same over UCX shared memory: a UCX peer without the secret and one with another secret both dial server 0 and
// send a well-formed hello as worker 1. The first is dropped for not authenticating, the second leaves on finding the
// server's proof wrong (the server logs a connection that left before proving itself); neither takes a rank.
TEST(PsClusterAuth, UcxPeersWithoutTheSecretAreRefusedAndCannotTakeARank) {
  if (!commsched::ps::ucx_built_in()) GTEST_SKIP() << "this build has no UCX (install libucx-dev and rebuild)";
  const std::string secret = "integration-test-secret-0123456789";
  // The workers wait for the hold file, so the server lives until the test has seen both refusals (at full speed the
  // run took about 0.1 s, and a server gone before the strangers' handshakes logged neither refusal).
  const HoldFile hold;
  LocalCluster c(kExe, 2, 1, {"--tensors", "10", "--iterations", "100", "--max-bytes", "100000", "--mode", "exact",
                              "--hold-file", hold.path},
                 {{"COMMSCHED_SECRET", secret}, {"COMMSCHED_PS_TRANSPORT", "ucx"}, {"UCX_TLS", "sm,self"}});
  const auto hello = start_until_listening(c);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(server0_data_port(c));
  commsched::ps::TransportOptions wrong;
  wrong.auth_secret = "some-other-secret-0123456789";
  auto plain = commsched::ps::make_ucx_transport({});
  auto stranger = commsched::ps::make_ucx_transport(wrong);
  plain->send(plain->connect(ep), hello);
  stranger->send(stranger->connect(ep), hello);
  // Both handshakes need this side's progress: run them until server 0 has logged both refusals (or a generous
  // deadline, after which the expectations below say what is missing), then let the workers go.
  const std::vector<std::vector<std::string>> refusals = {{"did not authenticate"},
                                                          {"before proving it holds the shared secret"}};
  const auto end = std::chrono::steady_clock::now() + 30s;
  for (int i = 0; std::chrono::steady_clock::now() < end && !(i % 20 == 0 && logged_all(c, refusals)); ++i)
    (void)plain->receive(5ms), (void)stranger->receive(5ms);
  hold.release();
  plain->close(false);
  stranger->close(false);
  ASSERT_TRUE(c.wait_all(60s)) << all_logs(c);
  expect_all_ok(c);
  const std::string log = c.read_log("server 0");
  EXPECT_NE(log.find("did not authenticate"), std::string::npos) << log;                 // the plain peer
  EXPECT_NE(log.find("before proving it holds the shared secret"), std::string::npos) << log;  // the stranger
  EXPECT_EQ(log.find("already connected"), std::string::npos) << log;                     // no rank was taken
}

// With a shared secret, processes that do not have it cannot take a rank: a plain ZeroMQ peer and a CURVE peer with
// its own key pair (knowing the server's public key) both say a well-formed hello as worker 1, as soon as server 0
// listens. Both are refused during the handshake and logged with their reason, as are store clients without the
// secret or with another one; the real workers get every rank and finish with exact sums.
TEST(PsClusterAuth, PeersWithoutTheSecretAreRefusedAndCannotTakeARank) {
  const std::string secret = "integration-test-secret-0123456789";
  const HoldFile hold;  // the server lives until both strangers are refused (as above)
  LocalCluster c(kExe, 2, 1, {"--tensors", "10", "--iterations", "100", "--max-bytes", "100000", "--mode", "exact",
                              "--hold-file", hold.path},
                 {{"COMMSCHED_SECRET", secret}});
  const auto hello = start_until_listening(c);
  // At the rendezvous store (the root port): a client without the secret reads nothing, one with another secret is
  // refused before it can ask, each told why with the store named.
  using commsched::collective::TcpStoreClient;
  try {
    TcpStoreClient("127.0.0.1", c.root_port(), 5s).try_get("ps/server/0");
    ADD_FAILURE() << "a store client without the secret read a key";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rendezvous store at 127.0.0.1:" + std::to_string(c.root_port()) +
                                         " requires the run's shared secret"), std::string::npos) << e.what();
  }
  try {
    TcpStoreClient("127.0.0.1", c.root_port(), 5s, "some-other-secret-0123456789");
    ADD_FAILURE() << "a store client with another secret was admitted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("refused us: the shared secret differs"), std::string::npos) << e.what();
  }
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(server0_data_port(c));
  void* ctx = zmq_ctx_new();
  void* plain = zmq_socket(ctx, ZMQ_DEALER);
  zmq_connect(plain, ep.c_str());
  zmq_send(plain, hello.data(), hello.size(), ZMQ_DONTWAIT);
  void* stranger = zmq_socket(ctx, ZMQ_DEALER);
  char server_pub[41], server_sec[41], pub[41], sec[41];
  const auto sk = commsched::ClusterAuth::derive(secret, "commsched zmq curve v1");
  zmq_z85_encode(server_sec, sk.data(), sk.size());
  zmq_curve_public(server_pub, server_sec);
  zmq_curve_keypair(pub, sec);
  zmq_setsockopt(stranger, ZMQ_CURVE_SERVERKEY, server_pub, 40);
  zmq_setsockopt(stranger, ZMQ_CURVE_PUBLICKEY, pub, 40);
  zmq_setsockopt(stranger, ZMQ_CURVE_SECRETKEY, sec, 40);
  zmq_connect(stranger, ep.c_str());
  zmq_send(stranger, hello.data(), hello.size(), ZMQ_DONTWAIT);
  const auto end = std::chrono::steady_clock::now() + 30s;
  // The plain peer: a mechanism mismatch, or (when ZeroMQ notices it later in the greeting) a failed CURVE handshake.
  const std::vector<std::vector<std::string>> refusals = {
      {"does not authenticate", "no or a wrong shared secret"}, {"CURVE key is not this run's"}};
  while (std::chrono::steady_clock::now() < end && !logged_all(c, refusals)) std::this_thread::sleep_for(50ms);
  hold.release();
  ASSERT_TRUE(c.wait_all(60s)) << all_logs(c);
  expect_all_ok(c);
  const std::string log = c.read_log("server 0");
  // The plain peer: a mechanism mismatch, or (when ZeroMQ notices it later in the greeting) a failed CURVE handshake.
  EXPECT_TRUE(log.find("does not authenticate") != std::string::npos ||
              log.find("no or a wrong shared secret") != std::string::npos) << log;
  EXPECT_NE(log.find("CURVE key is not this run's"), std::string::npos) << log;        // the stranger
  EXPECT_EQ(log.find("already connected"), std::string::npos) << log;                  // no rank was taken
  EXPECT_NE(log.find("rendezvous store refused 127.0.0.1:"), std::string::npos) << log;  // the plain store client
  int zero = 0;
  for (void* s : {plain, stranger}) zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero), zmq_close(s);
  zmq_ctx_term(ctx);
}

// A slow but live worker (1.5 s of extra compute per iteration) is named in a warning, with how far behind it is;
// the run still completes with exact sums, and nobody else is blamed.
TEST(PsClusterLag, ASlowButLiveWorkerIsNamedWithItsLag) {
  LocalCluster c(kExe, 3, 1,
                 {"--tensors", "4", "--iterations", "3", "--max-bytes", "4096", "--mode", "exact", "--slow-rank", "1",
                  "--slow-ms", "1500"});
  c.start();
  ASSERT_TRUE(c.wait_all(60s)) << all_logs(c);
  expect_all_ok(c);
  const std::string log = c.read_log("server 0");
  EXPECT_NE(log.find("warning: worker 1 "), std::string::npos) << log;
  EXPECT_NE(log.find("is slow but alive"), std::string::npos) << log;
  EXPECT_NE(log.find(" s ago and wait for it"), std::string::npos) << log;
  EXPECT_EQ(log.find("warning: worker 0 "), std::string::npos) << log;
  EXPECT_EQ(log.find("warning: worker 2 "), std::string::npos) << log;
}
