#include "simulator/network.h"

#include <gtest/gtest.h>

namespace commsched::sim {
namespace {

Batch one(uint64_t bytes) { return Batch{PartRef{1, 0, 0, 1, 0, bytes}}; }

TEST(PsNetwork, OneMessageTakesPushPlusPull) {
  // 8 workers, 2 servers, 10 Gbit/s, keys spread evenly: servers carry 4x the worker's bytes and are the bottleneck.
  PsNetwork net({8, 2, 10e9, 10e9, 10e-6, 0, false});
  const uint64_t bytes = 1'250'000;  // 1 ms at 10 Gbit/s
  EXPECT_EQ(net.transfer(one(bytes), 0).end, 2 * (4'000'000 + 10'000));
  EXPECT_DOUBLE_EQ(net.comm_lower_bound_s(bytes, 1), 4e-3);
}

// The bound counts the per-message cost at the fewest messages: a tensor is at least one message per chunk, and the
// busier end (here the servers, W / S of every message) pays it.
TEST(PsNetwork, LowerBoundChargesTheFewestMessages) {
  PsParams p{8, 2, 8e9, 8e9, 0, 250};  // 1 byte per ns, chunks of 250 bytes
  p.message_s = 5e-6;
  const PsNetwork net(p);
  EXPECT_EQ(net.min_messages(0), 0u);
  EXPECT_EQ(net.min_messages(250), 1u);
  EXPECT_EQ(net.min_messages(251), 2u);
  const double m = 5e-6 - 1e-9;  // each message's time may round a nanosecond short
  EXPECT_DOUBLE_EQ(net.comm_lower_bound_s(1000, 4), 4 * (1e-6 + 4 * m));
  p.servers = 8;  // the worker's link and each server's carry the same
  EXPECT_DOUBLE_EQ(PsNetwork(p).comm_lower_bound_s(1000, 4), 1e-6 + 4 * m);
  p.fair_share = true;  // the fair link model charges no per-message cost
  EXPECT_DOUBLE_EQ(PsNetwork(p).comm_lower_bound_s(1000, 4), 1e-6);
  p.fair_share = false;
  p.server_ingress_limited = false;  // nor do emulated links
  EXPECT_DOUBLE_EQ(PsNetwork(p).comm_lower_bound_s(1000, 4), 1e-6);
}

TEST(PsNetwork, PushOfTheNextMessageOverlapsThePullOfThePrevious) {
  PsNetwork net({1, 1, 8e9, 8e9, 0});  // 1 byte per ns
  EXPECT_EQ(net.transfer(one(1000), 0).end, 2000);
  const Transfer second = net.transfer(one(1000), 0);  // pushed 1000..2000, pulled 2000..3000
  EXPECT_EQ(second.begin, 1000);
  EXPECT_EQ(second.end, 3000);
}

TEST(PsNetwork, ChunkedMessagePullsWhilePushing) {
  PsNetwork whole({1, 1, 8e9, 8e9, 0, 0});      // 1 byte per ns
  PsNetwork chunked({1, 1, 8e9, 8e9, 0, 250});  // 4 chunks of 250 bytes
  EXPECT_EQ(whole.transfer(one(1000), 0).end, 2000);
  const Transfer t = chunked.transfer(one(1000), 0);
  EXPECT_EQ(t.begin, 0);
  EXPECT_EQ(t.end, 1250);  // the last chunk is pushed by 1000 and pulled by 1250
}

TEST(PsNetwork, ReceiptOfThePushComesBeforeTheSum) {
  PsNetwork net({1, 1, 8e9, 8e9, 100e-9});  // 1 byte per ns, 100 ns latency
  const Transfer first = net.transfer(one(1000), 0);  // pushed by 1100, receipt back at 1200, pulled by 2200
  EXPECT_EQ(first.sent, 1200);
  EXPECT_EQ(first.end, 2200);
  // The second push arrives at 2100; its receipt queues behind the first pull (server sends until 2100), then 100 ns.
  const Transfer second = net.transfer(one(1000), 0);
  EXPECT_EQ(second.sent, 2200);
  EXPECT_EQ(second.end, 3200);
}

TEST(PsNetwork, ChunkedMessageIsSentWhenEveryChunkHasArrived) {
  PsNetwork net({1, 1, 8e9, 8e9, 0, 250});  // 4 chunks of 250 bytes
  const Transfer t = net.transfer(one(1000), 0);
  EXPECT_EQ(t.sent, 1000);  // the last chunk arrives at 1000; the server's queue is free then (pulls end at 1000)
  EXPECT_EQ(t.end, 1250);
}

TEST(PsNetwork, ShardedChunkLivesOnOneServer) {
  // 2 workers, 2 servers, 1 byte per ns: a chunk's server receives it from both workers and sends the sum to both.
  PsNetwork net({2, 2, 8e9, 8e9, 0, 0, true});
  Batch two{PartRef{1, 0, 5, 1, 0, 1000}, PartRef{2, 0, 6, 2, 0, 1000}};  // two tensors: one on each server
  const Transfer t = net.transfer(two, 0);
  // Tensor 5 on server 0: pushed by 1000 (server ingress 2000 ns... for 2 x 1000 bytes), so in by 2000, out by 4000.
  // Tensor 6 on server 1: worker pushes 1000..2000, server 1 ingress 0..2000 in parallel, pulled 2000..4000.
  EXPECT_EQ(t.sent, 2000);
  EXPECT_EQ(t.end, 4000);
  // The same tensor again lands on the same server (first-sight assignment): its ingress queues behind the first.
  const Transfer again = net.transfer(Batch{PartRef{3, 0, 5, 3, 0, 1000}}, 0);
  EXPECT_EQ(again.sent, 4000);  // ingress 2000..4000; the receipt leaves as server 0's pull of the first ends (4000)
  EXPECT_EQ(again.end, 6000);
}

TEST(PsNetwork, EmulatedLinksPaceSendsOnly) {
  // COMMSCHED_EMULATE_RATE paces what each process sends; a server receives its W workers' pushes in parallel.
  PsNetwork net({2, 2, 8e9, 8e9, 0, 0, true, false});
  const Transfer t = net.transfer(Batch{PartRef{1, 0, 5, 1, 0, 1000}}, 0);
  EXPECT_EQ(t.sent, 1000);  // pushed at the worker's rate, not 2 x 1000 bytes into one server NIC
  EXPECT_EQ(t.end, 3000);   // the server still sends 2 sums of 1000 bytes
}

// A message's fixed cost (PsParams::message_s) holds every real NIC it crosses: a server takes W pushes and sends W
// sums of each partition, so one partition costs 2 W messages' worth more; emulated links leave it out.
TEST(PsNetwork, PerMessageCostHoldsEveryRealLinkItCrosses) {
  PsParams p{2, 1, 8e9, 8e9, 0};  // 1 byte per ns, two workers into one server
  p.message_s = 100e-9;
  PsNetwork net(p);
  // Pushes: 2 x (1000 + 100) ns into the server; sums: 2 x (1000 + 100) ns out of it.
  EXPECT_EQ(net.transfer(one(1000), 0).end, 4400);
  EXPECT_NEAR(net.cost_model().alpha_s, 2 * 2 * 100e-9, 1e-15) << "the server's two messages per one a worker sends";
  EXPECT_NE(net.describe().find("0.1 us per message"), std::string::npos) << net.describe();

  p.server_ingress_limited = false;  // emulated links: the calibrated pacing model, no per-message cost
  PsNetwork emulated(p);
  EXPECT_EQ(emulated.transfer(one(1000), 0).end, 3000);
  EXPECT_EQ(emulated.cost_model().alpha_s, 0);
}

TEST(RingAllreduceNetwork, AlphaBetaCost) {
  RingAllreduceNetwork net({4, 8e9, 1e-6});
  // 2(W-1)/W * bytes / B + 2(W-1) alpha = 1.5 * 1000 ns + 6 us
  EXPECT_EQ(net.transfer(one(1000), 0).end, 1500 + 6000);
  const Transfer second = net.transfer(one(1000), 0);  // collectives run one at a time
  EXPECT_EQ(second.begin, 7500);
  EXPECT_EQ(second.end, 2 * 7500);
  // An iteration's gradients take at least one collective: its alpha counts once, however many tensors.
  EXPECT_DOUBLE_EQ(net.comm_lower_bound_s(1000, 3), 1.5e-6 + 6e-6 - 0.5e-9);  // less the rounding
  EXPECT_EQ(net.min_messages(1000), 1u);
  EXPECT_DOUBLE_EQ(net.comm_lower_bound_s(0, 0), 0);
}

TEST(NetworkModels, RejectBadParameters) {
  EXPECT_THROW(PsNetwork({0, 1, 1e9, 1e9, 0}), InvalidArgument);
  EXPECT_THROW(PsNetwork({1, 1, 0, 1e9, 0}), InvalidArgument);
  PsParams negative{1, 1, 1e9, 1e9, 0};
  negative.message_s = -1e-6;
  EXPECT_THROW(PsNetwork{negative}, InvalidArgument);
  EXPECT_THROW(RingAllreduceNetwork({2, -1, 0}), InvalidArgument);
}

}  // namespace
}  // namespace commsched::sim
