// Grants at the servers in the every-worker PS model (PsParams::grants, scheduler/push_grants.h): the server admits the
// most urgent announced push of any worker, and the announce and the grant cost what a message costs.
#include <gtest/gtest.h>

#include <stdexcept>
#include <tuple>
#include <vector>

#include "simulator/ps_cluster.h"
#include "simulator/sim_policy.h"
#include "simulator/simulator.h"
#include "tests/unit/sim/sim_test_util.h"

namespace commsched::sim {
namespace {

using Events = std::vector<std::tuple<char, int, size_t, Nanos>>;
using E = Events::value_type;

struct Recorder final : BatchSink {
  Events events;
  void batch_sent(int w, size_t id, Nanos now) override { events.emplace_back('s', w, id, now); }
  void batch_done(int w, size_t id, Nanos now) override { events.emplace_back('d', w, id, now); }
};

Batch one_part(int32_t priority, uint64_t bytes) { return {PartRef{0, 0, priority, 0, 0, bytes}}; }

// 1 byte per ns everywhere, no latency, no per-message cost, one server.
PsParams plain(int workers, bool grants, uint64_t window) {
  PsParams p{workers, 1, 8e9, 8e9, 0, 0, true, true};
  p.grants = grants;
  p.grant_window_bytes = window;
  p.grant_min_bytes = 1;  // every push waits for its grant
  return p;
}

// Workers 1 and 2 are still in their backward: each pushes two bulk partitions of 1000 bytes (priorities 9 and 8) at
// 0; worker 0 pushes its first-needed partition (priority 0) at 0 too, after them. When each push is in (its receipt:
// no latency).
Events receipts(const PsParams& p) {
  PsClusterFabric fabric(p);
  EventLoop loop;
  Recorder sink;
  fabric.start(loop, sink);
  for (int w : {1, 2}) {
    fabric.dispatch(w, 0, one_part(9, 1000), 0);
    fabric.dispatch(w, 1, one_part(8, 1000), 0);
  }
  fabric.dispatch(0, 0, one_part(0, 1000), 0);
  loop.run();  // no round completes (each key has one worker's push), so only receipts come
  return sink.events;
}

// FIFO at the server's downlink: worker 0's urgent push gets the link after both bulk pushes that started before it.
// With grants (one push on its way at a time) the server admits it as soon as the first bulk push is in, and the
// remaining bulk follows most urgent first (priority 8 before 9), ties in announcement order (worker 1 before 2).
// (An announce made while a granted push holds the downlink arrives behind it, as any message would.)
TEST(PsClusterGrants, TheServerAdmitsTheMostUrgentAnnouncedPushOfAnyWorker) {
  const Events fifo = {E{'s', 1, 0, 1000}, E{'s', 2, 0, 2000}, E{'s', 0, 0, 3000}, E{'s', 1, 1, 4000},
                       E{'s', 2, 1, 5000}};
  EXPECT_EQ(receipts(plain(3, false, 0)), fifo);
  const Events granted = {E{'s', 1, 0, 1000}, E{'s', 0, 0, 2000}, E{'s', 1, 1, 3000}, E{'s', 2, 1, 4000},
                          E{'s', 2, 0, 5000}};
  EXPECT_EQ(receipts(plain(3, true, 1000)), granted);
}

// One worker, one push of 1000 bytes, latency 100 ns, 10 ns per message on each link: the announce (10 ns on the
// worker's uplink and the server's downlink, then a latency) and the grant (the same back) delay the data by two
// latencies and two messages' costs, 220 ns; a push below the grant threshold goes at once.
PsParams one_link(bool grants, uint64_t min_bytes) {
  PsParams p{1, 1, 8e9, 8e9, 100e-9, 0, true, true};
  p.message_s = 10e-9;
  p.grants = grants;
  p.grant_window_bytes = 4096;
  p.grant_min_bytes = min_bytes;
  return p;
}

TEST(PsClusterGrants, TheAnnounceAndTheGrantCostTwoMessagesAndTwoLatencies) {
  auto run = [](bool grants, uint64_t min_bytes) {
    PsClusterFabric fabric(one_link(grants, min_bytes));
    EventLoop loop;
    Recorder sink;
    fabric.start(loop, sink);
    fabric.dispatch(0, 0, one_part(3, 1000), 0);
    loop.run();
    return sink.events;
  };
  // Without: in at 1010 + 100 (its bytes and the message's cost, a latency), the receipt back a latency later, and the
  // sum 1010 + 100 after the push is in.
  EXPECT_EQ(run(false, 0), (Events{E{'s', 0, 0, 1210}, E{'d', 0, 0, 2220}}));
  EXPECT_EQ(run(true, 1), (Events{E{'s', 0, 0, 1430}, E{'d', 0, 0, 2440}}));
  EXPECT_EQ(run(true, 1001), (Events{E{'s', 0, 0, 1210}, E{'d', 0, 0, 2220}}));
}

// The Homa-like variant, the same link as above (a push alone: receipt at 1210 without a grant, 1430 with one). One
// worker pushes A (priority 3) at 0 and B (priority 4) at `b_at`, 1000 bytes each, every push of at least 1 byte
// subject to grants. When each push's receipt comes.
Events homa_like(uint64_t unscheduled, int32_t urgent_below, Nanos b_at) {
  PsParams p = one_link(true, 1);
  p.grant_unscheduled_bytes = unscheduled;
  p.grant_urgent_below = urgent_below;
  PsClusterFabric fabric(p);
  EventLoop loop;
  Recorder sink;
  fabric.start(loop, sink);
  fabric.dispatch(0, 0, one_part(3, 1000), 0);
  loop.at(b_at, [&] { fabric.dispatch(0, 1, one_part(4, 1000), b_at); });
  loop.run();
  Events sent;
  for (const E& e : sink.events)
    if (std::get<0>(e) == 's') sent.push_back(e);
  return sent;
}

// Within its server's budget, or urgent, a push goes at once; beyond the budget it is announced and waits for a grant;
// the budget is whole again once the worker learns the unscheduled push is in (its receipt, 1210).
TEST(PsClusterGrants, UnscheduledPushesSkipTheGrantWithinTheBudgetOrWhenUrgent) {
  EXPECT_EQ(homa_like(0, 0, 5000), (Events{E{'s', 0, 0, 1430}, E{'s', 0, 1, 6430}})) << "every push waits";
  EXPECT_EQ(homa_like(1000, 0, 5000), (Events{E{'s', 0, 0, 1210}, E{'s', 0, 1, 6210}}));
  // At 1209 A's bytes still count, so B asks; its grant waits behind A's sum (1010 ns from 1110) on the server's link.
  EXPECT_EQ(homa_like(1000, 0, 1209), (Events{E{'s', 0, 0, 1210}, E{'s', 0, 1, 3440}}));
  EXPECT_EQ(homa_like(1000, 0, 1211), (Events{E{'s', 0, 0, 1210}, E{'s', 0, 1, 1211 + 1210}}));
  EXPECT_EQ(homa_like(0, 4, 5000), (Events{E{'s', 0, 0, 1210}, E{'s', 0, 1, 6430}})) << "only priority 3 is urgent";
  EXPECT_EQ(homa_like(0, 5, 5000), (Events{E{'s', 0, 0, 1210}, E{'s', 0, 1, 6210}}));
  EXPECT_EQ(homa_like(0, 5, 0), (Events{E{'s', 0, 0, 1210}, E{'s', 0, 1, 1010 + 1210}}))
      << "urgent B: no budget, no grant; it leaves after A";
}

TEST(PsClusterGrants, WholeRunsFinishAndStayAboveTheLowerBound) {
  const auto m = testing::vgg_like();
  PsParams p{4, 2, 4e9, 4e9, 25e-6, 1 << 20, true, true};
  p.message_s = 5e-6;
  p.grants = true;
  EngineConfig c;
  c.policy = PolicyKind::bytescheduler;
  c.knobs = {256 << 10, 2 << 20};
  SimOptions o;
  o.partition_bytes = 256 << 10;
  PsNetwork net(p);
  const SimResult r = simulate_each_worker(m, p, [&] { return make_sim_policy(c, net, false); }, o);
  ASSERT_EQ(r.iteration_start_s.size(), size_t(o.iterations + 1));
  EXPECT_GE(r.iteration_s, r.lower_bound_s * 0.999);
}

TEST(PsClusterGrants, OnlyFifoLinksOfRealNicsModelThem) {
  PsParams fair = plain(2, true, 1000);
  fair.fair_share = true;
  EXPECT_THROW(PsClusterFabric{fair}, std::invalid_argument);
  PsParams emulated = plain(2, true, 1000);
  emulated.server_ingress_limited = false;
  EXPECT_THROW(PsClusterFabric{emulated}, std::invalid_argument);
}

}  // namespace
}  // namespace commsched::sim
