#include "simulator/ps_cluster.h"

#include <gtest/gtest.h>

#include "workload/profile.h"
#include "simulator/sim_policy.h"
#include "simulator/simulator.h"
#include "tests/unit/sim/sim_test_util.h"

namespace commsched::sim {
namespace {

using testing::kMs;

TEST(Sender, TokenBucketLetsAMessageLeaveWholeThenOwesItsSize) {
  Sender paced(8e9, 1000, true);  // 1 byte per ns, 1000 bytes of burst
  EXPECT_EQ(paced.send(0, 3000), 0);       // the bucket is not in debt: it leaves at once
  EXPECT_EQ(paced.send(0, 100), 3000);     // then waits until the 3000 bytes are paid
  EXPECT_EQ(paced.start_of(3050), 3100);   // 100 more owed
  EXPECT_EQ(paced.send(10'000, 1500), 10'000);  // idle long enough: a full bucket (1000), now 500 in debt
  EXPECT_EQ(paced.send(10'000, 0), 10'500);     // a header-only message still queues behind
}

TEST(Sender, LinkIsBusyForTheMessageAfterItStarts) {
  Sender link(8e9, 1000, false);
  EXPECT_EQ(link.send(0, 3000), 0);
  EXPECT_EQ(link.send(0, 100), 3000);
  EXPECT_EQ(link.start_of(0), 3100);
}

struct Recorder final : BatchSink {
  EventLoop* loop = nullptr;
  std::vector<std::tuple<char, int, size_t, Nanos>> events;
  void batch_sent(int w, size_t id, Nanos now) override { events.emplace_back('s', w, id, now); }
  void batch_done(int w, size_t id, Nanos now) override { events.emplace_back('d', w, id, now); }
};

Batch one_part(int32_t key, uint64_t bytes) { return {PartRef{0, 0, key, 0, 0, bytes}}; }

using Events = std::vector<std::tuple<char, int, size_t, Nanos>>;
using E = Events::value_type;

// Two workers, one server, 1 byte per ns everywhere, no latency: worker 1 pushes 1000 bytes of key 7 at 0 and worker
// 0 at 500. What the fabric reported, and the fabric (for its link use).
Events two_pushes(PsClusterFabric& fabric) {
  EventLoop loop;
  Recorder sink;
  fabric.start(loop, sink);
  EXPECT_EQ(fabric.dispatch(1, 0, one_part(7, 1000), 0), 0);
  loop.at(500, [&] { EXPECT_EQ(fabric.dispatch(0, 0, one_part(7, 1000), 500), 500); });
  loop.run();
  return sink.events;
}

// The server sums a chunk once every worker has pushed it and answers in the order the pushes arrived; each push is
// acknowledged as soon as it is in. Worker 0's bytes queue behind worker 1's at the server's downlink until 1000.
TEST(PsClusterFabric, SumWaitsForEveryWorkerAndAnswersInArrivalOrder) {
  PsClusterFabric fabric({2, 1, 8e9, 8e9, 0, 0, true, true});  // real NICs
  const Events want = {E{'s', 1, 0, 1000}, E{'s', 0, 0, 2000},   // receipts on arrival
                       E{'d', 1, 0, 3000}, E{'d', 0, 0, 4000}};  // sums: worker 1 pushed first
  EXPECT_EQ(two_pushes(fabric), want);
}

// The same with a fixed cost of 100 ns per message on every link: each message holds its sender's link and its
// receiver's downlink for 1100 ns, so the second push is in at 2200 and the sums leave one after another from there.
TEST(PsClusterFabric, PerMessageCostHoldsEachLinkItCrosses) {
  PsParams p{2, 1, 8e9, 8e9, 0, 0, true, true};
  p.message_s = 100e-9;
  PsClusterFabric fabric(p);
  const Events want = {E{'s', 1, 0, 1100}, E{'s', 0, 0, 2200}, E{'d', 1, 0, 3300}, E{'d', 0, 0, 4400}};
  EXPECT_EQ(two_pushes(fabric), want);
}

// The same pushes with links shared fairly (TCP): worker 1 alone until 500, then both at half the server's downlink,
// so worker 1's push is in at 1500 rather than 1000 and worker 0's at 2000; the server then sends both sums at once,
// each at half its uplink, and both are back at 4000 (FIFO: 3000 and 4000).
TEST(PsClusterFabric, FairSharingAcknowledgesIncastPushesLaterAndSendsSumsTogether) {
  PsParams p{2, 1, 8e9, 8e9, 0, 0, true, true};
  p.fair_share = true;
  PsClusterFabric fabric(p);
  const Events want = {E{'s', 1, 0, 1500}, E{'s', 0, 0, 2000}, E{'d', 1, 0, 4000}, E{'d', 0, 0, 4000}};
  EXPECT_EQ(two_pushes(fabric), want);
  const LinkUse use = fabric.link_use(4000);
  EXPECT_DOUBLE_EQ(use.server_in.max, 0.5);   // 2000 bytes in 4000 ns
  EXPECT_DOUBLE_EQ(use.server_out.max, 0.5);
  EXPECT_DOUBLE_EQ(use.worker_up.mean, 0.25);
}

TEST(PsClusterFabric, EmulatedLinksDeliverOnDepartureAndPaceTheSender) {
  PsParams p{2, 1, 8e9, 8e9, 0, 0, true, false};
  p.emulated_burst_bytes = 0;
  PsClusterFabric fabric(p);
  EventLoop loop;
  Recorder sink;
  fabric.start(loop, sink);
  fabric.dispatch(0, 0, one_part(1, 1000), 0);  // leaves at 0; worker 0's bucket owes 1000 ns
  fabric.dispatch(0, 1, one_part(2, 1000), 0);  // leaves at 1000
  fabric.dispatch(1, 0, one_part(1, 1000), 0);
  fabric.dispatch(1, 1, one_part(2, 1000), 0);
  loop.run();
  // Key 1 is summed at 0: the server's sends leave as its bucket allows, receipts ahead of sums (scheduler/
  // reply_order.h): key 1's receipts and worker 0's sum at 0; at 1000 key 2's receipts, in by then, go before worker
  // 1's sum of key 1; key 2's sums at 2000 and 3000.
  const Events want = {E{'s', 0, 0, 0},    E{'s', 1, 0, 0},    E{'d', 0, 0, 0},    E{'s', 0, 1, 1000},
                       E{'s', 1, 1, 1000}, E{'d', 1, 0, 1000}, E{'d', 0, 1, 2000}, E{'d', 1, 1, 3000}};
  EXPECT_EQ(sink.events, want);
}

// The server's reply order is the product's rule (scheduler/reply_order.h). One worker (each push is its own sum at
// once), one server, 1 byte per ns everywhere: the first push (4000 bytes, priority 5) is in at 4000 and its sum holds
// the server's link until 8000, while pushes of 1000 bytes and priorities 3, 9 and 1 arrive at 5000, 6000 and 7000;
// then the rule picks among them.
// Its order is replayed on the rule itself: the sums arrive in the order the rule pops them.
std::vector<size_t> sim_sum_order(uint64_t bound) {
  PsParams p{1, 1, 8e9, 8e9, 0, 0, true, true};
  p.reply_overtakes = bound;
  PsClusterFabric fabric(p);
  EventLoop loop;
  Recorder sink;
  fabric.start(loop, sink);
  const int32_t priorities[] = {5, 3, 9, 1};
  for (size_t b = 0; b < 4; ++b) fabric.dispatch(0, b, one_part(priorities[b], b == 0 ? 4000 : 1000), 0);
  loop.run();
  std::vector<size_t> done;
  for (const auto& [what, worker, batch, at] : sink.events)
    if (what == 'd') done.push_back(batch);
  return done;
}

std::vector<size_t> rule_sum_order(uint64_t bound) {
  ReplyOrder<std::pair<bool, size_t>> q(bound);  // (receipt, batch)
  const int32_t priorities[] = {5, 3, 9, 1};
  std::vector<size_t> sums;
  auto pop_until_sum = [&] {
    while (!q.empty())
      if (auto [receipt, batch] = q.pop(); !receipt) return sums.push_back(batch);
  };
  q.push({true, 0}, true, 5);  // at 4000: the first push's receipt and sum, sent at once
  q.push({false, 0}, false, 5);
  pop_until_sum();
  for (size_t b = 1; b < 4; ++b) {  // 5000..7000: the others, while the link is busy
    q.push({true, b}, true, priorities[b]);
    q.push({false, b}, false, priorities[b]);
  }
  while (!q.empty()) pop_until_sum();  // from 8000: one sum each time the link frees
  return sums;
}

TEST(PsClusterFabric, ServerSendsItsReadyRepliesInTheRulesOrder) {
  EXPECT_EQ(sim_sum_order(ReplyOrder<int>::kDefaultMaxOvertakes), (std::vector<size_t>{0, 3, 1, 2}));
  for (uint64_t bound : {uint64_t{1}, uint64_t{2}, uint64_t{3}, ReplyOrder<int>::kDefaultMaxOvertakes})
    EXPECT_EQ(sim_sum_order(bound), rule_sum_order(bound)) << "bound " << bound;
  EXPECT_EQ(sim_sum_order(0), (std::vector<size_t>{0, 1, 2, 3}));  // 0: arrival order
}

EngineConfig config(PolicyKind kind, uint64_t credit) {
  EngineConfig c;
  c.policy = kind;
  c.knobs = {1 << 20, credit};  // 1 MiB partitions
  return c;
}

SimOptions mib_partitions() {
  SimOptions o;
  o.partition_bytes = 1 << 20;
  return o;
}

// With one worker and one server there is nothing to be asymmetric about: the per-worker simulation must agree with
// the symmetric model exactly, when its servers answer in arrival order as the symmetric model does.
TEST(SimulateEachWorker, OneWorkerAgreesWithTheSymmetricModel) {
  const auto m = testing::vgg_like();
  PsParams p{1, 1, 2e9, 2e9, 30e-6, 1 << 20, true, true};
  p.reply_overtakes = 0;  // the symmetric model's server answers in arrival order
  for (PolicyKind kind : {PolicyKind::wfbp, PolicyKind::bytescheduler, PolicyKind::fusion, PolicyKind::mgwfbp}) {
    const EngineConfig c = config(kind, 3 << 20);
    PsNetwork net(p);
    const SimOptions o = mib_partitions();
    auto policy = make_sim_policy(c, net);
    const SimResult one = simulate(m, net, *policy, o);
    const SimResult each = simulate_each_worker(m, p, [&] { return make_sim_policy(c, net); }, o);
    EXPECT_EQ(each.iteration_start_s, one.iteration_start_s) << policy_name(kind);
    EXPECT_EQ(each.batches, one.batches) << policy_name(kind);
  }
}

TEST(SimulateEachWorker, EveryPolicyFinishesAndNoneBeatsTheLowerBound) {
  const auto m = testing::vgg_like();
  for (bool emulated : {false, true}) {
    const PsParams p{4, 2, 4e9, 4e9, 25e-6, 1 << 20, true, !emulated};
    for (PolicyKind kind : {PolicyKind::wfbp, PolicyKind::bytescheduler, PolicyKind::bsp, PolicyKind::fusion,
                            PolicyKind::mgwfbp}) {
      const EngineConfig c = config(kind, 2 << 20);
      PsNetwork net(p);
      const SimOptions o = mib_partitions();
      const SimResult r = simulate_each_worker(m, p, [&] { return make_sim_policy(c, net, false); }, o);
      ASSERT_EQ(r.iteration_start_s.size(), size_t(o.iterations + 1)) << policy_name(kind);
      // Four workers share two servers: each server sends twice what a worker does.
      EXPECT_GE(r.iteration_s, r.lower_bound_s * 0.999) << policy_name(kind) << (emulated ? " emulated" : "");
      EXPECT_GT(r.comm_bound_s, m.total_bytes() * 8.0 / 4e9 * 1.99);
      const SimResult again = simulate_each_worker(m, p, [&] { return make_sim_policy(c, net, false); }, o);
      EXPECT_EQ(again.iteration_start_s, r.iteration_start_s) << "not deterministic: " << policy_name(kind);
    }
  }
}

// The server answers workers one after another, so they cannot all be in step, and the symmetric model, whose
// representative waits for every push and then for every sum, is pessimistic: staggered workers overlap the later
// workers' pushes with the earlier workers' sums (each NIC is full duplex).
TEST(SimulateEachWorker, StaggeredWorkersOverlapPushesWithSums) {
  const auto m = testing::one_tensor(4'000'000, kMs, 2 * kMs);
  const PsParams p{4, 1, 8e9, 8e9, 0, 0, true, true};  // 1 byte per ns, one server for four workers
  EngineConfig c;
  c.policy = PolicyKind::wfbp;
  PsNetwork net(p);
  auto policy = make_sim_policy(c, net);
  const SimResult one = simulate(m, net, *policy, SimOptions{});
  const SimResult each = simulate_each_worker(m, p, [&] { return make_sim_policy(c, net); }, SimOptions{});
  // Symmetric: 3 ms of compute, 16 ms for four pushes into the server, 16 ms for four sums out of it.
  EXPECT_NEAR(one.iteration_s, 35e-3, 1e-6);
  // Each worker: worker k pushes in [3 + 4k, 7 + 4k) ms (one after another into the server), the sum is complete at
  // 19 ms and worker 0's is out first, at 23 ms; every later iteration repeats that, staggered by 4 ms per worker.
  EXPECT_NEAR(each.iteration_s, 23e-3, 1e-6);
  EXPECT_GE(each.iteration_s, each.lower_bound_s);
}

TEST(SimulateEachWorker, RejectsBadParameters) {
  const auto m = testing::one_tensor(1000, kMs, kMs);
  EngineConfig c;
  PsParams p{0, 1, 1e9, 1e9, 0};
  PsNetwork ok({1, 1, 1e9, 1e9, 0});
  EXPECT_THROW(simulate_each_worker(m, p, [&] { return make_sim_policy(c, ok); }, SimOptions{}), InvalidArgument);
}

}  // namespace
}  // namespace commsched::sim
