#include "simulator/flow_net.h"

#include <gtest/gtest.h>

#include <vector>

namespace commsched::sim {
namespace {

constexpr double kByteper_ns = 8e9;  // a link of 8 Gbit/s moves 1 byte per ns

struct Net {
  EventLoop loop;
  FlowNet net{loop};
  std::vector<Nanos> arrived;  // per message, in send order: when it arrived (-1: not yet)
  void send(int conn, uint64_t bytes, Nanos latency = 0) {
    const size_t i = arrived.size();
    arrived.push_back(-1);
    net.send(conn, bytes, latency, [this, i] { arrived[i] = loop.now(); });
  }
};

TEST(FlowNet, OneFlowTakesBytesOverRatePlusLatency) {
  Net n;
  const int c = n.net.add_connection(n.net.add_link(kByteper_ns), n.net.add_link(kByteper_ns));
  n.send(c, 1000, 50);
  n.loop.run();
  EXPECT_EQ(n.arrived, (std::vector<Nanos>{1050}));
}

// Two senders into one receiver share its downlink: both pushes finish together at 2p/rate (FIFO would finish the
// first at p/rate), which is when TCP acknowledges both.
TEST(FlowNet, IncastSharesTheReceiverFairly) {
  Net n;
  const int down = n.net.add_link(kByteper_ns);
  const int a = n.net.add_connection(n.net.add_link(kByteper_ns), down);
  const int b = n.net.add_connection(n.net.add_link(kByteper_ns), down);
  n.send(a, 1000);
  n.send(b, 1000);
  n.loop.run();
  EXPECT_EQ(n.arrived, (std::vector<Nanos>{2000, 2000}));
  EXPECT_EQ(n.net.busy(down), 2000);
}

// Max-min, not equal shares: A and B share a receiver of half the rate (a quarter each); C, which shares B's sender
// but not the receiver, gets the rest of that sender (three quarters) rather than an equal third.
TEST(FlowNet, ProgressiveFillingGivesTheUnbottleneckedFlowTheRest) {
  Net n;
  const int slow_down = n.net.add_link(kByteper_ns / 2);
  const int s2 = n.net.add_link(kByteper_ns);
  const int a = n.net.add_connection(n.net.add_link(kByteper_ns), slow_down);
  const int b = n.net.add_connection(s2, slow_down);
  const int c = n.net.add_connection(s2, n.net.add_link(kByteper_ns));
  n.send(a, 1000);
  n.send(b, 1000);
  n.send(c, 3000);
  n.loop.run();
  // A and B at 0.25 B/ns: 4000 ns. C at 0.75 until 4000 (3000 bytes): done at 4000 too.
  EXPECT_EQ(n.arrived, (std::vector<Nanos>{4000, 4000, 4000}));
}

// A flow speeds up when the one it shared with finishes: 1000 bytes each at 0.5 B/ns, then the rest alone.
TEST(FlowNet, AFlowTakesTheWholeLinkOnceTheOtherFinishes) {
  Net n;
  const int down = n.net.add_link(kByteper_ns);
  const int a = n.net.add_connection(n.net.add_link(kByteper_ns), down);
  const int b = n.net.add_connection(n.net.add_link(kByteper_ns), down);
  n.send(a, 3000);
  n.send(b, 1000);
  n.loop.run();
  EXPECT_EQ(n.arrived, (std::vector<Nanos>{4000, 2000}));
}

// Messages on one connection go one after another; an acknowledgement (0 bytes) waits for what is queued before it on
// its connection only.
TEST(FlowNet, AConnectionIsFifoAndAnAcknowledgementWaitsOnlyForItsOwnConnection) {
  Net n;
  const int up = n.net.add_link(kByteper_ns);
  const int c1 = n.net.add_connection(up, n.net.add_link(kByteper_ns));
  const int c2 = n.net.add_connection(up, n.net.add_link(kByteper_ns));
  n.send(c1, 1000, 10);
  n.send(c1, 1000, 10);
  n.send(c1, 0, 10);  // behind both
  n.send(c2, 0, 10);  // an idle connection: at once
  n.loop.run();
  // The two c1 messages share the uplink with nothing else: 1000 and 2000 ns, plus the latency.
  EXPECT_EQ(n.arrived, (std::vector<Nanos>{1010, 2010, 2010, 10}));
}

// Rates apply from the moment a message joins: one sent later shares only from then on.
TEST(FlowNet, ALaterFlowSharesFromWhenItStarts) {
  Net n;
  const int down = n.net.add_link(kByteper_ns);
  const int a = n.net.add_connection(n.net.add_link(kByteper_ns), down);
  const int b = n.net.add_connection(n.net.add_link(kByteper_ns), down);
  n.send(a, 2000);
  n.loop.at(1000, [&] { n.send(b, 500); });
  n.loop.run();
  // A alone until 1000 (1000 left), then 0.5 each: B done at 2000, A's last 500 alone: 2500.
  EXPECT_EQ(n.arrived, (std::vector<Nanos>{2500, 2000}));
}

TEST(FlowNet, RefusesBadLinksAndConnections) {
  EventLoop loop;
  FlowNet net(loop);
  EXPECT_THROW(net.add_link(0), std::invalid_argument);
  const int l = net.add_link(1e9);
  EXPECT_THROW(net.add_connection(l, l), std::invalid_argument);
  EXPECT_THROW(net.add_connection(l, 5), std::invalid_argument);
}

}  // namespace
}  // namespace commsched::sim
