#include "comm_backends/control/net_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace commsched::control {
namespace {

// A connected loopback pair: the peer address of each end is the other end's "ip:port".
TEST(NetUtil, PeerAddressNamesTheOtherEndOfAConnection) {
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

TEST(NetUtil, AddressTextIsIpv4Only) {
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

}  // namespace
}  // namespace commsched::control
