// Authentication: the shared-secret rules (comm_backends/cluster_auth) and the ZeroMQ transport's CURVE handshake.
// A peer without this run's secret is refused during the handshake, reported with a reason, and never delivers a
// message (so it can never say hello and take a rank).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/ps/transport.h"
#include "base/types.h"

using namespace std::chrono_literals;
using commsched::ClusterAuth;
using commsched::SecretHandshake;
using commsched::InvalidArgument;
using commsched::ps::Incoming;
using commsched::ps::make_zmq_transport;
using commsched::ps::Transport;
using commsched::ps::TransportOptions;

namespace {

const std::string kSecret = "0123456789abcdef-this-run";

std::span<const std::byte> bytes_of(const std::string& s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }

std::unique_ptr<Transport> transport(const std::string& secret) {
  TransportOptions o;
  o.auth_secret = secret;
  return make_zmq_transport(o);
}

// Everything `t` reports within `d`: messages' text and events' details, one per line, prefixed by the kind.
std::string events_within(Transport& t, std::chrono::milliseconds d) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
    auto in = t.receive(50ms);
    if (!in) continue;
    if (in->kind == Incoming::Kind::message)
      out += "message:" + std::string(reinterpret_cast<const char*>(in->header.data()), in->header.size()) + "\n";
    else out += std::string(in->kind == Incoming::Kind::dropped ? "dropped:" : "disconnected:") + in->detail + "\n";
  }
  return out;
}

struct EnvGuard {
  explicit EnvGuard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* v : {"COMMSCHED_AUTH", "COMMSCHED_SECRET", "COMMSCHED_KEY_FILE"}) unsetenv(v);
    for (auto& [k, v] : vars) setenv(k, v, 1);
  }
  ~EnvGuard() {
    for (const char* v : {"COMMSCHED_AUTH", "COMMSCHED_SECRET", "COMMSCHED_KEY_FILE"}) unsetenv(v);
  }
};

}  // namespace

TEST(ClusterAuth, LoopbackNeedsNoSecretButBeyondLoopbackDoes) {
  EnvGuard g({});
  const ClusterAuth a = ClusterAuth::from_env();
  EXPECT_EQ(a.secret_for("127.0.0.1"), "");
  try {
    a.secret_for("10.0.0.2");
    FAIL() << "binding beyond loopback without a secret must be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_SECRET"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_AUTH=off"), std::string::npos) << e.what();
  }
  EXPECT_THROW(a.secret_for("*"), InvalidArgument);
  EXPECT_THROW(a.secret_for("eth0"), InvalidArgument);
}

// Server 0 asks for the secret once for its store and once for its transport: COMMSCHED_AUTH=off warns once. Counted
// in a process of its own (a death test runs this binary again), where nothing has warned yet.
namespace {
int auth_off_warnings_in_a_fresh_process() {
  EnvGuard g({{"COMMSCHED_AUTH", "off"}});
  testing::internal::CaptureStderr();
  ClusterAuth::from_env().secret_for("10.0.0.2");  // the store
  ClusterAuth::from_env().secret_for("10.0.0.2");  // the transport
  ClusterAuth::from_env().secret_for("*");
  const std::string err = testing::internal::GetCapturedStderr();
  int warnings = 0;
  for (size_t at = err.find("COMMSCHED_AUTH=off"); at != std::string::npos; at = err.find("COMMSCHED_AUTH=off", at + 1))
    ++warnings;
  return warnings;
}
}  // namespace

TEST(ClusterAuth, AuthOffWarnsOncePerProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(auth_off_warnings_in_a_fresh_process()), testing::ExitedWithCode(1), "");
}

TEST(ClusterAuth, SecretIsUsedEvenOnLoopbackAndOffSwitchDisablesIt) {
  {
    EnvGuard g({{"COMMSCHED_SECRET", kSecret.c_str()}});
    EXPECT_EQ(ClusterAuth::from_env().secret_for("127.0.0.1"), kSecret);
    EXPECT_EQ(ClusterAuth::from_env().secret_for("10.0.0.2"), kSecret);
  }
  {
    EnvGuard g({{"COMMSCHED_SECRET", kSecret.c_str()}, {"COMMSCHED_AUTH", "off"}});
    EXPECT_EQ(ClusterAuth::from_env().secret_for("10.0.0.2"), "");
  }
  {
    EnvGuard g({{"COMMSCHED_AUTH", "on"}});
    EXPECT_THROW(ClusterAuth::from_env().secret_for("127.0.0.1"), InvalidArgument);
  }
  {
    EnvGuard g({{"COMMSCHED_AUTH", "maybe"}});
    EXPECT_THROW(ClusterAuth::from_env(), InvalidArgument);
  }
  {
    EnvGuard g({{"COMMSCHED_SECRET", "short"}});
    EXPECT_THROW(ClusterAuth::from_env(), InvalidArgument);
  }
}

TEST(ClusterAuth, ItsVariablesAreRowsOfTheRegistryAndABadModeNamesTheVariable) {
  std::vector<std::string> vars;
  for (const auto& info : commsched::auth_option_table().infos()) vars.push_back(info.env);
  EXPECT_EQ(vars, (std::vector<std::string>{"COMMSCHED_AUTH", "COMMSCHED_SECRET", "COMMSCHED_KEY_FILE"}));
  EnvGuard g({{"COMMSCHED_AUTH", "maybe"}});
  try {
    ClusterAuth::from_env();
    FAIL() << "COMMSCHED_AUTH=maybe was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_AUTH='maybe'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, on, off"), std::string::npos) << e.what();
  }
  EnvGuard on({{"COMMSCHED_AUTH", "1"}});
  EXPECT_EQ(ClusterAuth::from_env().mode, ClusterAuth::Mode::on);
  EnvGuard off({{"COMMSCHED_AUTH", "OFF"}});
  EXPECT_EQ(ClusterAuth::from_env().mode, ClusterAuth::Mode::off);
}

TEST(ClusterAuth, KeyFileMustBePrivate) {
  char path[] = "/tmp/commsched-key-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << kSecret << "\n";
  EnvGuard g({{"COMMSCHED_KEY_FILE", path}});
  ASSERT_EQ(chmod(path, 0600), 0);
  EXPECT_EQ(ClusterAuth::from_env().secret, kSecret);
  ASSERT_EQ(chmod(path, 0644), 0);
  try {
    ClusterAuth::from_env();
    FAIL() << "a world-readable key file must be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  unlink(path);
}

TEST(ClusterAuth, DerivedKeysDependOnSecretAndPurposeAndFreshSecretsDiffer) {
  EXPECT_EQ(ClusterAuth::derive(kSecret, "a"), ClusterAuth::derive(kSecret, "a"));
  EXPECT_NE(ClusterAuth::derive(kSecret, "a"), ClusterAuth::derive(kSecret, "b"));
  EXPECT_NE(ClusterAuth::derive(kSecret, "a"), ClusterAuth::derive(kSecret + "x", "a"));
  const std::string s1 = ClusterAuth::generate_secret(), s2 = ClusterAuth::generate_secret();
  EXPECT_EQ(s1.size(), 64u);
  EXPECT_NE(s1, s2);
}

TEST(SecretHandshake, EachSideProvesTheSecretAndNoProofServesAnotherSideLinkOrSecret) {
  const SecretHandshake h(kSecret, "node link");
  const std::string sn = SecretHandshake::nonce(), cn = SecretHandshake::nonce();
  ASSERT_EQ(sn.size(), SecretHandshake::kNonceBytes);
  EXPECT_NE(sn, cn);
  EXPECT_TRUE(h.client_proved(h.client_proof(sn, cn), sn, cn));
  EXPECT_TRUE(h.server_proved(h.server_proof(cn, sn), cn, sn));
  // Reflected: a server's proof is not a client's, even over the same nonces in the client's order.
  EXPECT_FALSE(h.client_proved(h.server_proof(sn, cn), sn, cn));
  // Replayed against a fresh challenge.
  EXPECT_FALSE(h.client_proved(h.client_proof(sn, cn), SecretHandshake::nonce(), cn));
  // Another link's proof, another secret's proof, a truncated nonce.
  EXPECT_FALSE(h.client_proved(SecretHandshake(kSecret, "store").client_proof(sn, cn), sn, cn));
  EXPECT_FALSE(h.client_proved(SecretHandshake(kSecret + "x", "node link").client_proof(sn, cn), sn, cn));
  EXPECT_FALSE(h.client_proved(h.client_proof(sn, cn.substr(1)), sn, cn.substr(1)));
}

TEST(SecretHandshake, TheStoreLinkKeepsItsWireKeys) {
  // The rendezvous store's proofs are what they were before the handshake was shared (older peers still verify).
  const std::string sn(32, 's'), cn(32, 'c');
  const auto bytes = [](const std::string& s) { return std::as_bytes(std::span(s)); };
  EXPECT_EQ(SecretHandshake(kSecret, "store").client_proof(sn, cn),
            ClusterAuth::proof(kSecret, "commsched store hmac v1", "commsched store client v1", bytes(sn), bytes(cn)));
}

TEST(ZmqTransportAuth, PeersWithTheSecretTalk) {
  auto server = transport(kSecret);
  const std::string ep = server->bind("127.0.0.1", 0);
  auto client = transport(kSecret);
  client->send(client->connect(ep), bytes_of("hello"));
  const std::string seen = events_within(*server, 1500ms);
  EXPECT_NE(seen.find("message:hello"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("dropped"), std::string::npos) << seen;
}

// Without the secret, with a wrong one, or with an own key pair that knows the server's public key: refused and
// reported on both sides; not one message gets through.
TEST(ZmqTransportAuth, PeersWithoutTheSecretAreRefusedAndReported) {
  auto server = transport(kSecret);
  const std::string ep = server->bind("127.0.0.1", 0);

  auto plain = transport("");
  plain->send(plain->connect(ep), bytes_of("plain"));
  auto wrong = transport("a-different-secret-entirely");
  wrong->send(wrong->connect(ep), bytes_of("wrong"));

  // A CURVE client that learnt the server's public key (it is public, after all) but has its own key pair.
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  char server_pub[41], server_sec[41], pub[41], sec[41];
  const auto sk = ClusterAuth::derive(kSecret, "commsched zmq curve v1");
  zmq_z85_encode(server_sec, sk.data(), sk.size());
  zmq_curve_public(server_pub, server_sec);
  zmq_curve_keypair(pub, sec);
  zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_pub, 40);
  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40);
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40);
  zmq_connect(s, ep.c_str());
  zmq_send(s, "stranger", 8, ZMQ_DONTWAIT);

  const std::string seen = events_within(*server, 2500ms);
  EXPECT_EQ(seen.find("message:"), std::string::npos) << "a peer without the secret got a message through\n" << seen;
  // The plain and the wrong peer fail the handshake; the stranger passes the crypto but our key check refuses it.
  EXPECT_NE(seen.find("no or a wrong shared secret"), std::string::npos) << seen;
  EXPECT_NE(seen.find("refused: its CURVE key is not this run's"), std::string::npos) << seen;

  const std::string plain_saw = events_within(*plain, 300ms);
  const std::string wrong_saw = events_within(*wrong, 300ms);
  EXPECT_NE(wrong_saw.find("refused"), std::string::npos) << wrong_saw;
  (void)plain_saw;  // a peer without CURVE sees only ZeroMQ's closed connection and retries; the server logged it

  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_close(s);
  zmq_ctx_term(ctx);
}
