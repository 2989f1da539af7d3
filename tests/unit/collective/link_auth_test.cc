// The links' secret handshake (comm_backends/collective/link_auth) against a stranger that announces a big frame.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "comm_backends/collective/link_auth.h"
#include "comm_backends/collective/wire.h"

namespace commsched::collective {
namespace {

using namespace std::chrono_literals;
const std::string kSecret = "link-auth-test-secret-0123456789";

struct Pair {
  Fd mine, theirs;
};

// A connected socket pair whose far end has announced a 1 MiB frame and then says nothing more (but stays open).
Pair stranger_announcing_a_mebibyte() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  Pair p{Fd(fds[0]), Fd(fds[1])};
  const uint32_t announced = 1u << 20;
  send_all(p.theirs.get(), std::string(reinterpret_cast<const char*>(&announced), sizeof announced), "stranger");
  return p;
}

// Found while writing fuzz_link_auth: the handshake read its frames with the general 64 MiB bound, so a stranger's
// announcement made either side allocate what it asked for and wait for it until the deadline (10 s on a listener).
// Handshake frames are a few dozen bytes; more is refused before any of it is read.
TEST(LinkAuth, AConnectorRefusesAnOversizedChallengeAtOnce) {
  const Pair p = stranger_announcing_a_mebibyte();
  try {
    LinkAuth(kSecret, "store").prove(p.mine.get(), std::chrono::steady_clock::now() + 3s, "listener");
    FAIL() << "the connector accepted a stranger";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("oversized frame"), std::string::npos) << e.what();
  }
}

TEST(LinkAuth, AListenerRefusesAnOversizedAnswerWithoutWaitingForIt) {
  const Pair p = stranger_announcing_a_mebibyte();
  LinkAuth listener(kSecret, "store", "test listener");
  testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  const bool admitted = listener.admit(p.mine.get(), start + 8s);
  const auto waited = std::chrono::steady_clock::now() - start;
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(admitted);
  EXPECT_LT(waited, 4s) << "the listener waited for the mebibyte the stranger announced";
  EXPECT_NE(log.find("test listener refused"), std::string::npos) << log;
  EXPECT_NE(listener.refusals(), "");
}

}  // namespace
}  // namespace commsched::collective
