#include "comm_backends/control/socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <set>
#include <stdexcept>
#include <thread>

namespace commsched::control {
namespace {

// A connected loopback pair: the peer address of each end is the other end's "ip:port".
TEST(ControlSocket, PeerAddressNamesTheOtherEndOfAConnection) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const int dialer = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(dialer, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const int accepted = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  sockaddr_in mine{};
  len = sizeof mine;
  ::getsockname(dialer, reinterpret_cast<sockaddr*>(&mine), &len);

  EXPECT_EQ(peer_address(dialer), "127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  EXPECT_EQ(peer_address(accepted), "127.0.0.1:" + std::to_string(ntohs(mine.sin_port)));
  EXPECT_EQ(peer_address(listener), "");  // not connected
  EXPECT_EQ(peer_address(-1), "");
  for (int fd : {accepted, dialer, listener}) ::close(fd);
}

TEST(ControlSocket, AddressTextIsIpv4Only) {
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  EXPECT_EQ(address_text(reinterpret_cast<const sockaddr*>(&v6)), "");
  EXPECT_EQ(address_text(nullptr), "");
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  v4.sin_port = htons(4711);
  inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr);
  EXPECT_EQ(address_text(reinterpret_cast<const sockaddr*>(&v4)), "10.1.2.3:4711");
}

using namespace std::chrono_literals;

Deadline in(std::chrono::milliseconds ms) { return std::chrono::steady_clock::now() + ms; }

// What a test's error text says, so an assertion can name the expected words.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Pair {
  Fd listener, dialer, accepted;
};

Pair connected_pair() {
  Pair p;
  p.listener = listen_tcp("127.0.0.1", 0);
  p.dialer = connect_tcp("127.0.0.1", bound_port(p.listener.get()), in(2000ms));
  p.accepted = accept_tcp(p.listener.get());
  return p;
}

TEST(ControlSocket, ListensOnAFreePortAndNamesIt) {
  const Fd a = listen_tcp("127.0.0.1", 0), b = listen_tcp("*", 0);
  EXPECT_GT(bound_port(a.get()), 0);
  EXPECT_NE(bound_port(a.get()), bound_port(b.get()));
  EXPECT_EQ(bound_address(a.get()), "127.0.0.1:" + std::to_string(bound_port(a.get())));
  EXPECT_NE(error_of([&] { listen_tcp("127.0.0.1", bound_port(a.get())); }).find("cannot bind 127.0.0.1:"),
            std::string::npos);
}

TEST(ControlSocket, FreePortIsBelowTheEphemeralRangeAndBindable) {
  const int port = free_port("127.0.0.1");
  EXPECT_GE(port, 20000);
  EXPECT_LT(port, 32000);
  EXPECT_TRUE(listen_tcp("127.0.0.1", port).valid());
}

// Two ports asked for before either is bound (a rendezvous port and a store port) are never the same one.
TEST(ControlSocket, FreePortNeverHandsOutARecentPortAgain) {
  std::set<int> seen;
  for (int i = 0; i < 64; ++i) EXPECT_TRUE(seen.insert(free_port("127.0.0.1")).second) << "port handed out twice";
}

TEST(ControlSocket, ConnectRetriesUntilTheServerListens) {
  const int port = free_port("127.0.0.1");
  std::thread late([port] {
    std::this_thread::sleep_for(150ms);
    Fd l = listen_tcp("127.0.0.1", port);
    Fd c = accept_tcp(l.get());
    send_all(c.get(), std::string("\x02\0\0\0hi", 6), "server");
    std::this_thread::sleep_for(100ms);
  });
  Fd fd = connect_tcp("127.0.0.1", port, in(5000ms));
  EXPECT_EQ(recv_frame(fd.get(), "server", in(2000ms)), "hi");
  late.join();
}

TEST(ControlSocket, ConnectGivesUpAtTheDeadlineNamingTheAddress) {
  const int port = free_port("127.0.0.1");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string why = error_of([&] { connect_tcp("127.0.0.1", port, in(200ms)); });
  EXPECT_NE(why.find("cannot connect to 127.0.0.1:" + std::to_string(port) + " before the timeout"), std::string::npos)
      << why;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST(ControlSocket, FramesRoundTripAndASilentPeerMeetsTheDeadline) {
  Pair p = connected_pair();
  const std::string payload = "a frame";
  uint32_t len = static_cast<uint32_t>(payload.size());
  std::string frame(reinterpret_cast<const char*>(&len), sizeof len);
  send_all(p.dialer.get(), frame + payload, "dialer");
  EXPECT_EQ(recv_frame(p.accepted.get(), "peer 1", in(2000ms)), payload);
  const std::string why = error_of([&] { recv_frame(p.accepted.get(), "peer 1", in(50ms)); });
  EXPECT_EQ(why, "peer 1: no message before the deadline");
}

TEST(ControlSocket, AnOversizedFrameIsRefusedBeforeItIsRead) {
  Pair p = connected_pair();
  const uint32_t len = 4096;
  send_all(p.dialer.get(), std::string(reinterpret_cast<const char*>(&len), sizeof len), "dialer");
  const std::string why = error_of([&] { recv_frame(p.accepted.get(), "peer 2", in(2000ms), 1024); });
  EXPECT_NE(why.find("peer 2: oversized frame (4096 bytes, at most 1024)"), std::string::npos) << why;
}

TEST(ControlSocket, AClosedPeerIsNamed) {
  Pair p = connected_pair();
  p.dialer.reset();
  EXPECT_EQ(error_of([&] { recv_frame(p.accepted.get(), "rank 3", in(2000ms)); }), "rank 3: connection closed");
  // Writing to it fails (at the latest once the kernel has seen the reset), and never raises SIGPIPE.
  bool sent = true;
  for (int i = 0; i < 100 && sent; ++i) sent = send_bytes(p.accepted.get(), std::string(65536, 'x'));
  EXPECT_FALSE(sent);
}

// A rank whose Gloo pair writes to a killed peer must see EPIPE, not die of SIGPIPE; a program's own handler stays.
TEST(ControlSocket, SigpipeIsIgnoredUnlessTheProgramHandlesIt) {
  struct sigaction saved {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &saved), 0);
  ::signal(SIGPIPE, SIG_DFL);
  EXPECT_TRUE(ignore_sigpipe_unless_handled());
  struct sigaction now {};
  ::sigaction(SIGPIPE, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  EXPECT_FALSE(ignore_sigpipe_unless_handled()) << "already ignored";
  static void (*const own)(int) = [](int) {};
  ::signal(SIGPIPE, own);
  EXPECT_FALSE(ignore_sigpipe_unless_handled());
  ::sigaction(SIGPIPE, nullptr, &now);
  EXPECT_EQ(now.sa_handler, own) << "the program's handler was replaced";
  ::sigaction(SIGPIPE, &saved, nullptr);
}

// The event loops' pieces (the UCX transport's dialler): an address resolved once, a connect finished by the loop.
TEST(ControlSocket, ResolvesAndStartsANonBlockingConnect) {
  EXPECT_EQ(resolve_ipv4("*", 5).sin_addr.s_addr, htonl(INADDR_ANY));
  const sockaddr_in local = resolve_ipv4("127.0.0.1", 4711);
  EXPECT_EQ(address_text(reinterpret_cast<const sockaddr*>(&local)), "127.0.0.1:4711");
  EXPECT_NE(error_of([] { resolve_ipv4("no-such-host.invalid", 1); }).find("cannot resolve no-such-host.invalid:1"),
            std::string::npos);
  const Fd listener = listen_tcp("127.0.0.1", 0);
  bool connected = false;
  const Fd fd = start_connect(resolve_ipv4("127.0.0.1", bound_port(listener.get())), connected);
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(wait_readable(listener.get(), in(2000ms)));
  const Fd accepted = accept_tcp(listener.get());
  EXPECT_TRUE(accepted.valid());
  EXPECT_EQ(peer_address(accepted.get()), bound_address(fd.get()));
}

}  // namespace
}  // namespace commsched::control
