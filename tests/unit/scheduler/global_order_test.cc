// The negotiation's decision logic, driven directly (no sockets): ordering, fusion, caching and errors, and that the
// order is the real policy's decision over the partitions ready on every rank.
#include "scheduler/global_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>

#include "scheduler/bsp_policy.h"
#include "scheduler/fifo_policy.h"
#include "scheduler/policy_factory.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {
namespace {

PartitionDesc desc(uint64_t key, uint64_t offset, uint64_t bytes, DType dtype = DType::f32, uint64_t task_bytes = 0) {
  return PartitionDesc{key, offset, bytes, task_bytes ? task_bytes : offset + bytes, dtype, Op::allreduce, 0};
}

ReadyReport report(const PartitionDesc& d, int32_t priority, uint64_t round = 0) {
  ReadyReport r;
  r.desc = d;
  r.name = "t" + std::to_string(d.key);
  r.round = round;
  r.priority = priority;
  return r;
}

// The global order over bytescheduler: small tensors fused up to `fusion` bytes, `credit` bytes in flight (0: no limit).
GlobalOrder make(int size, uint64_t fusion, uint64_t credit = 0) {
  return GlobalOrder(size, std::make_unique<PriorityCreditPolicy>(credit, fusion, /*stall_guard=*/false));
}

std::vector<uint64_t> ordered_keys(const GlobalOrderOutput& out) {
  std::vector<uint64_t> keys;
  for (const auto& g : out.order.groups)
    for (const auto& e : g) {
      auto it = std::find_if(out.order.defines.begin(), out.order.defines.end(),
                             [&](const CacheDefine& d) { return d.cache_id == e.cache_id; });
      keys.push_back(it == out.order.defines.end() ? ~0ull : it->desc.key);
    }
  return keys;
}

// `ranks` report the partition ready (priority 5).
void ready_on(GlobalOrder& c, std::initializer_list<int> ranks, const PartitionDesc& d, GlobalOrderOutput& out,
              uint64_t round = 0) {
  for (int r : ranks) c.on_ready(r, std::vector{report(d, 5, round)}, out);
}

TEST(GlobalOrder, OrdersOnlyWhatEveryRankHasReady) {
  GlobalOrder c = make(3, 0);
  GlobalOrderOutput out;
  ready_on(c, {0, 1}, desc(1, 0, 64), out);
  c.flush(0, out);
  EXPECT_TRUE(out.order.groups.empty());
  EXPECT_EQ(c.pending(), 1u);
  c.on_ready(2, std::vector{report(desc(1, 0, 64), 5)}, out);
  c.flush(0, out);
  ASSERT_EQ(out.order.groups.size(), 1u);
  EXPECT_EQ(ordered_keys(out), std::vector<uint64_t>{1});
  EXPECT_TRUE(out.errors.empty());
  EXPECT_EQ(c.pending(), 0u);
}

// The policy can come after the partitions' reports (an engine built after its backend joined): the knobs set before
// it apply to it. With none by the time a partition is ready everywhere, the order starts with its default
// (bytescheduler), and a policy that comes later is refused.
TEST(GlobalOrder, APolicyAdoptedLateGetsTheKnobsAndNoneMeansTheDefault) {
  GlobalOrder c(2);
  Knobs k;
  k.small_tensor_bytes = 4096;
  c.set_knobs(k);
  GlobalOrderOutput out;
  ready_on(c, {0}, desc(1, 0, 64), out);
  ready_on(c, {0}, desc(2, 0, 64), out);
  EXPECT_FALSE(c.needs_policy()) << "nothing is ready everywhere yet";
  auto policy = std::make_unique<PriorityCreditPolicy>(0, 0, /*stall_guard=*/false);
  const PriorityCreditPolicy& p = *policy;
  c.adopt(std::move(policy));
  EXPECT_EQ(p.small_tensor_bytes(), 4096u) << "knobs set before the policy came";
  ready_on(c, {1}, desc(1, 0, 64), out);
  ready_on(c, {1}, desc(2, 0, 64), out);
  c.flush(0, out);
  ASSERT_EQ(out.order.groups.size(), 1u) << "the adopted policy fuses by the knobs' bound";

  GlobalOrder d(2);
  GlobalOrderOutput none;
  ready_on(d, {0, 1}, desc(1, 0, 64), none);
  EXPECT_TRUE(d.needs_policy());
  d.flush(0, none);
  EXPECT_EQ(ordered_keys(none), std::vector<uint64_t>{1}) << "the default orders";
  EXPECT_THROW(d.adopt(std::make_unique<FifoPolicy>()), std::logic_error);
}

// With iteration marks (an engine on every rank), a policy that waits for the end of backward (BSP) hears it when
// every rank's mark is covered by what that rank has reported, whatever order marks and reports arrive in.
TEST(GlobalOrder, EndOfBackwardIsEveryRanksMarkCoveredByItsReports) {
  GlobalOrder c(2);
  c.adopt(std::make_unique<BspPolicy>(), /*marks=*/true);
  GlobalOrderOutput out;
  ready_on(c, {0, 1}, desc(1, 0, 64), out);
  ready_on(c, {0}, desc(2, 0, 64), out);
  c.on_mark(0, {true, 2});
  c.on_mark(1, {true, 2});  // its second report is still on its way
  c.flush(0, out);
  EXPECT_TRUE(out.order.groups.empty()) << "BSP released before rank 1's backward was covered";
  ready_on(c, {1}, desc(2, 0, 64), out);
  c.flush(0, out);
  std::vector<uint64_t> keys = ordered_keys(out);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<uint64_t>{1, 2}));

  // Without marks (a backend driven directly) the policy is told a flush after the arrivals of each flush().
  GlobalOrder plain(2, std::make_unique<BspPolicy>());
  GlobalOrderOutput each;
  ready_on(plain, {0, 1}, desc(1, 0, 64), each);
  plain.flush(0, each);
  EXPECT_EQ(ordered_keys(each), std::vector<uint64_t>{1});
}

// A rank that has joined holds no mark back: the others' end of backward reaches the policy without it.
TEST(GlobalOrder, AJoinedRankHoldsNoMarkBack) {
  GlobalOrder c(3);
  c.adopt(std::make_unique<BspPolicy>(), /*marks=*/true);
  GlobalOrderOutput out;
  c.on_join(2, out);
  ready_on(c, {0, 1}, desc(1, 0, 64), out);
  c.on_mark(0, {true, 1});
  c.flush(0, out);
  EXPECT_TRUE(out.order.groups.empty()) << "rank 1's mark has not come";
  c.on_mark(1, {true, 1});
  c.flush(0, out);
  EXPECT_EQ(ordered_keys(out), std::vector<uint64_t>{1});
}

// Horovod's join: a joined rank counts as ready (it runs the collective with zeros) for partitions already pending and
// for new ones, until every rank has joined; the last one is named, and partitions wait for every rank again.
TEST(GlobalOrder, JoinedRanksCountAsReadyUntilEveryRankHasJoined) {
  GlobalOrder c = make(3, 0);
  GlobalOrderOutput out;
  ready_on(c, {0, 1}, desc(1, 0, 64), out);
  c.on_join(2, out);
  EXPECT_FALSE(out.all_joined);
  c.flush(0, out);
  EXPECT_EQ(ordered_keys(out), std::vector<uint64_t>{1});  // pending when rank 2 joined
  out = {};
  c.on_ready(0, std::vector{report(desc(2, 0, 64), 5)}, out);
  c.flush(0, out);
  EXPECT_TRUE(out.order.groups.empty());  // rank 1 has not joined
  c.on_join(1, out);
  c.flush(0, out);
  EXPECT_EQ(ordered_keys(out), std::vector<uint64_t>{2});
  out = {};
  c.on_ready(0, std::vector{report(desc(3, 0, 64), 5)}, out);  // new after both joined: only rank 0 reports it
  c.flush(0, out);
  EXPECT_EQ(ordered_keys(out), std::vector<uint64_t>{3});
  // A joined rank that submits is told why it cannot.
  out = {};
  c.on_ready(1, std::vector{report(desc(4, 0, 64), 5)}, out);
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_NE(out.errors[0].message.find("after joining"), std::string::npos) << out.errors[0].message;
  out = {};
  c.on_join(0, out);
  ASSERT_TRUE(out.all_joined);
  EXPECT_EQ(*out.all_joined, 0);
  out = {};
  ready_on(c, {0, 1}, desc(5, 0, 64), out, /*round=*/1);
  c.flush(0, out);
  EXPECT_TRUE(out.order.groups.empty());  // every rank counts again
}

TEST(GlobalOrder, ReadyTogetherMeansPriorityOrderWhateverTheReportOrder) {
  GlobalOrder c = make(2, 0);
  GlobalOrderOutput out;
  // Rank 0 reports keys 1..6 with priority = key; rank 1 reports them reversed. Ordered once all are in: by priority.
  std::vector<ReadyReport> r0, r1;
  for (uint64_t k = 1; k <= 6; ++k) r0.push_back(report(desc(k, 0, 1 << 20), static_cast<int32_t>(k)));
  r1.assign(r0.rbegin(), r0.rend());
  c.on_ready(0, r0, out);
  c.on_ready(1, r1, out);
  c.flush(0, out);
  EXPECT_EQ(ordered_keys(out), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(out.order.groups.size(), 6u) << "fusion is off";
}

TEST(GlobalOrder, FusesSmallCompatiblePartitionsUpToTheThreshold) {
  GlobalOrder c = make(2, 1000);
  GlobalOrderOutput out;
  std::vector<ReadyReport> reps{report(desc(1, 0, 400), 1), report(desc(2, 0, 400), 2), report(desc(3, 0, 400), 3),
                                report(desc(4, 0, 400, DType::f64), 4), report(desc(5, 0, 5000), 5)};
  c.on_ready(0, reps, out);
  c.on_ready(1, reps, out);
  c.flush(0, out);
  ASSERT_EQ(out.order.groups.size(), 4u);
  EXPECT_EQ(out.order.groups[0].size(), 2u);  // 1+2 (800 bytes); 3 would exceed 1000
  EXPECT_EQ(out.order.groups[1].size(), 1u);  // 3 alone: 4 has another dtype
  EXPECT_EQ(out.order.groups[2].size(), 1u);
  EXPECT_EQ(out.order.groups[3].size(), 1u);  // big: never fused
}

TEST(GlobalOrder, SecondRoundIsReportedAndOrderedByCacheId) {
  GlobalOrder c = make(2, 0);
  GlobalOrderOutput first;
  const auto d = desc(9, 128, 256);
  c.on_ready(0, std::vector{report(d, 0, 0)}, first);
  c.on_ready(1, std::vector{report(d, 0, 0)}, first);
  c.flush(0, first);
  ASSERT_EQ(first.order.defines.size(), 1u);
  const uint32_t id = first.order.defines[0].cache_id;

  ReadyReport cached;
  cached.cache_id = id;
  cached.round = 1;
  GlobalOrderOutput second;
  c.on_ready(0, std::vector{cached}, second);
  c.on_ready(1, std::vector{cached}, second);
  c.flush(0, second);
  EXPECT_TRUE(second.order.defines.empty()) << "a cached partition needs no new definition";
  ASSERT_EQ(second.order.groups.size(), 1u);
  EXPECT_EQ(second.order.groups[0][0].cache_id, id);
  EXPECT_EQ(second.order.groups[0][0].round, 1u);
  EXPECT_EQ(c.stats().cached_reports, 2u);
}

// Orders round 0 of `d` on every rank of a vouching order; returns its cache id.
uint32_t order_once(GlobalOrder& c, int size, const PartitionDesc& d) {
  GlobalOrderOutput out;
  for (int r = 0; r < size; ++r) c.on_ready(r, std::vector{report(d, 0, 0)}, out);
  c.flush(0, out);
  EXPECT_EQ(out.order.groups.size(), 1u);
  c.on_group_done(0);
  return out.order.defines.at(0).cache_id;
}

ReadyReport by_id(uint32_t id, uint64_t round) {
  ReadyReport r;
  r.cache_id = id;
  r.round = round;
  return r;
}

// Rank 0 vouches for a partition every rank ran before: it is ordered on rank 0's report alone, and the others'
// reports of it, when they come, are counted off (they start nothing new); the next round is vouched for again.
TEST(GlobalOrder, RankZeroVouchesForAPartitionEveryRankRanBefore) {
  GlobalOrder c = make(3, 0);
  c.set_vouching(true);
  const auto d = desc(9, 0, 256);
  const uint32_t id = order_once(c, 3, d);
  EXPECT_EQ(c.stats().vouched, 0u) << "a partition no rank ran before waits for every rank's report";
  for (uint64_t round = 1; round <= 2; ++round) {
    GlobalOrderOutput out;
    c.on_ready(0, std::vector{by_id(id, round)}, out);
    c.flush(0, out);
    ASSERT_EQ(out.order.groups.size(), 1u) << "round " << round;
    EXPECT_EQ(out.order.groups[0][0].cache_id, id);
    EXPECT_EQ(out.order.groups[0][0].round, round);
    c.on_ready(1, std::vector{by_id(id, round)}, out);
    c.on_ready(2, std::vector{report(d, 0, round)}, out);  // by description: counted off alike
    c.flush(0, out);
    EXPECT_EQ(out.order.groups.size(), 1u) << "the others' reports ordered it again";
    EXPECT_TRUE(out.errors.empty()) << out.errors[0].message;
    EXPECT_EQ(c.pending(), 0u);
    c.on_group_done(0);
  }
  EXPECT_EQ(c.stats().vouched, 2u);
}

// Without vouching, and for ranks that joined or left, the ordinary rules hold: wait for every rank's report; a
// joined rank is not waited for; a rank gone fails what it never reported.
TEST(GlobalOrder, VouchingWaitsForNobodyWhoJoinedAndIsOffUnlessAsked) {
  GlobalOrder off = make(2, 0);
  const auto d = desc(4, 0, 64);
  const uint32_t id = order_once(off, 2, d);
  GlobalOrderOutput out;
  off.on_ready(0, std::vector{by_id(id, 1)}, out);
  off.flush(0, out);
  EXPECT_TRUE(out.order.groups.empty()) << "an order that does not vouch waits for rank 1";

  GlobalOrder c = make(3, 0);
  c.set_vouching(true);
  const uint32_t cid = order_once(c, 3, d);
  GlobalOrderOutput joined;
  c.on_join(2, joined);
  c.on_ready(0, std::vector{by_id(cid, 1)}, joined);
  c.flush(0, joined);
  ASSERT_EQ(joined.order.groups.size(), 1u);
  c.on_ready(1, std::vector{by_id(cid, 1)}, joined);  // rank 1's report is expected; rank 2's is not
  c.flush(0, joined);
  EXPECT_EQ(joined.order.groups.size(), 1u);
  EXPECT_TRUE(joined.errors.empty());
  EXPECT_EQ(c.pending(), 0u);
  c.on_group_done(0);

  GlobalOrderOutput gone;
  c.on_bye(1, gone);
  c.on_ready(0, std::vector{by_id(cid, 2)}, gone);
  c.flush(0, gone);
  EXPECT_TRUE(gone.order.groups.empty()) << "rank 1 has shut down: nothing may be ordered in its name";
  ASSERT_FALSE(gone.errors.empty());
  EXPECT_NE(gone.errors[0].message.find("rank 1 has shut down"), std::string::npos) << gone.errors[0].message;
}

// The two tests below: a 3-rank order that vouches ran partition 7 once; ranks 0 and 2 report its round 1 into `out`,
// rank 1 does not, and nothing is flushed yet.
void vouch_without_rank_one(GlobalOrder& c, GlobalOrderOutput& out) {
  c.set_vouching(true);
  const uint32_t id = order_once(c, 3, desc(7, 0, 256));
  for (int r : {0, 2}) c.on_ready(r, std::vector{by_id(id, 1)}, out);
}

// A rank that shuts down before reporting what rank 0 vouched for: the partition is ordered already (its collective
// runs on rank 0 and fails on the closed connection), so every rank is told it failed because that rank shut down.
TEST(GlobalOrder, ARankThatShutsDownBeforeWhatRankZeroVouchedForIsNamedInItsError) {
  GlobalOrder c = make(3, 0);
  GlobalOrderOutput out;
  vouch_without_rank_one(c, out);
  c.flush(0, out);
  ASSERT_EQ(out.order.groups.size(), 1u) << "rank 0 did not vouch";
  GlobalOrderOutput bye;
  c.on_bye(1, bye);
  ASSERT_EQ(bye.errors.size(), 1u) << "rank 1 left what rank 0 ordered in its name unexplained";
  EXPECT_EQ(bye.errors[0].key, 7u);
  EXPECT_EQ(bye.errors[0].round, 1u);
  EXPECT_EQ(bye.errors[0].code, Status::Code::cancelled);
  EXPECT_NE(bye.errors[0].message.find("rank 1 shut down before it ran"), std::string::npos) << bye.errors[0].message;
  GlobalOrderOutput again;
  c.on_bye(2, again);  // rank 2 had reported it: nothing more to say
  EXPECT_TRUE(again.errors.empty()) << again.errors[0].message;
}

// A vouched partition not yet ordered when a rank leaves is not failed ahead of its order: the order still names it,
// and a rank that had failed it already would find the order naming a partition it no longer has.
TEST(GlobalOrder, AVouchedPartitionNotYetOrderedIsNotFailedWhenARankLeaves) {
  GlobalOrder c = make(3, 0);
  GlobalOrderOutput out;
  vouch_without_rank_one(c, out);
  GlobalOrderOutput bye;
  c.on_bye(1, bye);  // before the flush: rank 0 vouched, nothing ordered yet
  EXPECT_TRUE(bye.errors.empty()) << bye.errors[0].message;
  c.flush(0, out);
  EXPECT_EQ(out.order.groups.size(), 1u) << "the vouched partition is still ordered";
  EXPECT_TRUE(out.errors.empty());
}

TEST(GlobalOrder, MismatchedSizeFailsOnEveryRankNamingKeyRanksAndSizes) {
  GlobalOrder c = make(3, 0);
  GlobalOrderOutput out;
  c.on_ready(0, std::vector{report(desc(42, 0, 400), 0)}, out);
  c.on_ready(2, std::vector{report(desc(42, 0, 800), 0)}, out);
  ASSERT_EQ(out.errors.size(), 1u);
  const std::string& m = out.errors[0].message;
  EXPECT_EQ(out.errors[0].key, 42u);
  EXPECT_EQ(out.errors[0].code, Status::Code::invalid);
  EXPECT_NE(m.find("task 't42'"), std::string::npos) << m;
  EXPECT_NE(m.find("key 0x2a"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 0 submitted f32 allreduce bytes [0, 400)"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 2 submitted f32 allreduce bytes [0, 800)"), std::string::npos) << m;
  // The rank that reports last also learns the error, and nothing is ever ordered.
  c.on_ready(1, std::vector{report(desc(42, 0, 400), 0)}, out);
  c.flush(0, out);
  EXPECT_EQ(out.errors.size(), 2u);
  EXPECT_TRUE(out.order.groups.empty());
  EXPECT_EQ(c.pending(), 0u);
}

TEST(GlobalOrder, MismatchedDtypeIsAnErrorToo) {
  GlobalOrder c = make(2, 0);
  GlobalOrderOutput out;
  c.on_ready(0, std::vector{report(desc(7, 0, 400, DType::f32), 0)}, out);
  c.on_ready(1, std::vector{report(desc(7, 0, 400, DType::i32), 0)}, out);
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_NE(out.errors[0].message.find("i32"), std::string::npos) << out.errors[0].message;
}

// Two ranks that name one collective differently (rank 2 counted its unnamed operations from 0 again) each wait for
// the others forever; the stall report names both tasks and who is missing, and fail_stalled ends them everywhere.
TEST(GlobalOrder, TasksWaitingForSomeRanksAreReportedLongestFirstAndCanBeFailed) {
  constexpr Nanos kS = 1'000'000'000;
  GlobalOrder c = make(3, 0);
  GlobalOrderOutput out;
  c.on_ready(0, std::vector{report(desc(5, 0, 64), 0), report(desc(5, 64, 64), 0)}, out, 1 * kS);
  c.on_ready(1, std::vector{report(desc(5, 0, 64), 0), report(desc(5, 64, 64), 0)}, out, 2 * kS);
  c.on_ready(2, std::vector{report(desc(9, 0, 64), 0)}, out, 3 * kS);
  c.on_ready(0, std::vector{report(desc(6, 0, 64), 0)}, out, 4 * kS);
  c.on_ready(1, std::vector{report(desc(6, 0, 64), 0)}, out, 4 * kS);
  c.on_ready(2, std::vector{report(desc(6, 0, 64), 0)}, out, 4 * kS);  // ready everywhere: not stalled
  c.flush(4 * kS, out);
  EXPECT_TRUE(c.stalled(4 * kS, 60 * kS).empty());
  const std::vector<StalledTask> s = c.stalled(63 * kS, 60 * kS);
  ASSERT_EQ(s.size(), 2u);  // task 5 once for its two partitions
  EXPECT_EQ(s[0].key, 5u);
  EXPECT_EQ(s[0].waited, 62 * kS);
  EXPECT_EQ(s[0].ready, (std::vector<int>{0, 1}));
  EXPECT_EQ(s[0].missing, std::vector<int>{2});
  EXPECT_EQ(s[1].key, 9u);
  EXPECT_EQ(s[1].missing, (std::vector<int>{0, 1}));
  const std::string text = describe_stalls(s);
  EXPECT_NE(text.find("task 't5' (key 0x5) waits 62s for rank 2 (submitted by ranks 0, 1)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("task 't9' (key 0x9) waits 60s for ranks 0, 1 (submitted by rank 2)"), std::string::npos)
      << text;
  const std::string first = describe_stalls(s, 1);
  EXPECT_TRUE(first.ends_with("; and 1 more") && first.find("t9") == std::string::npos) << first;

  ASSERT_TRUE(out.errors.empty());
  c.fail_stalled(5, "stalled", out);
  ASSERT_EQ(out.errors.size(), 2u);  // both partitions, on every rank holding them
  EXPECT_EQ(out.errors[0].key, 5u);
  EXPECT_EQ(out.errors[1].key, 5u);
  EXPECT_EQ(out.errors[0].message, "stalled");
  EXPECT_EQ(c.stalled(63 * kS, 60 * kS).size(), 1u);  // failed ones are not reported again
  c.on_ready(2, std::vector{report(desc(5, 0, 64), 0)}, out, 64 * kS);  // a late report learns the error too
  EXPECT_EQ(out.errors.size(), 3u);
  // The ranks that caught the error go on: the task's next round starts afresh (not "submitted twice").
  c.on_ready(0, std::vector{report(desc(5, 0, 64), 0, 1)}, out, 65 * kS);
  EXPECT_EQ(out.errors.size(), 3u) << out.errors.back().message;
}

// Once a task ran, rank 0 orders it on its own readiness (vouching); a rank that then skips it leaves the others in
// the collective: the stall report names it too, and failing it tells every rank.
TEST(GlobalOrder, AVouchedPartitionARankNeverSubmitsIsReportedAsStalled) {
  constexpr Nanos kS = 1'000'000'000;
  GlobalOrder c = make(3, 0);
  c.set_vouching(true);
  const auto d = desc(7, 0, 256);
  const uint32_t id = order_once(c, 3, d);
  GlobalOrderOutput out;
  c.on_ready(0, std::vector{by_id(id, 1)}, out, 1 * kS);
  c.on_ready(2, std::vector{by_id(id, 1)}, out, 1 * kS);
  c.flush(1 * kS, out);
  ASSERT_EQ(out.order.groups.size(), 1u);  // vouched and ordered
  const std::vector<StalledTask> s = c.stalled(100 * kS, 60 * kS);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].key, 7u);
  EXPECT_EQ(s[0].ready, (std::vector<int>{0, 2}));
  EXPECT_EQ(s[0].missing, std::vector<int>{1});
  c.fail_stalled(7, "stalled", out);
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_EQ(out.errors[0].round, 1u);
  EXPECT_TRUE(c.stalled(100 * kS, 60 * kS).empty());
  c.on_ready(1, std::vector{by_id(id, 1)}, out, 101 * kS);  // rank 1 after all: told the error
  EXPECT_EQ(out.errors.size(), 2u);
  EXPECT_EQ(out.errors[1].message, "stalled");
}

TEST(GlobalOrder, ByeFailsWhatCanNeverCompleteButKeepsWhatIsComplete) {
  GlobalOrder c = make(2, 0);
  GlobalOrderOutput out;
  c.on_ready(0, std::vector{report(desc(1, 0, 8), 0), report(desc(2, 0, 8), 0)}, out);
  c.on_ready(1, std::vector{report(desc(1, 0, 8), 0)}, out);
  c.on_bye(1, out);
  c.flush(0, out);
  EXPECT_EQ(ordered_keys(out), std::vector<uint64_t>{1});
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_EQ(out.errors[0].key, 2u);
  EXPECT_EQ(out.errors[0].code, Status::Code::cancelled);
}

TEST(GlobalOrder, GlobalCreditHoldsBackAndLetsLaterUrgentWorkOvertake) {
  GlobalOrder c = make(2, 0, /*credit=*/1000);
  GlobalOrderOutput out;
  std::vector<ReadyReport> reps;
  for (uint64_t k = 10; k < 14; ++k) reps.push_back(report(desc(k, 0, 400), static_cast<int32_t>(k)));
  c.on_ready(0, reps, out);
  c.on_ready(1, reps, out);
  c.flush(0, out);
  EXPECT_EQ(ordered_keys(out), (std::vector<uint64_t>{10, 11})) << "800 of 1000 bytes; a third would exceed";
  EXPECT_EQ(c.bytes_in_flight(), 800u);
  // A more urgent partition becomes ready everywhere while 12 and 13 wait for credit: it goes first.
  GlobalOrderOutput more;
  c.on_ready(0, std::vector{report(desc(1, 0, 400), 1)}, more);
  c.on_ready(1, std::vector{report(desc(1, 0, 400), 1)}, more);
  c.on_group_done(0);  // 10 is done
  c.flush(0, more);
  EXPECT_EQ(ordered_keys(more), std::vector<uint64_t>{1});
  GlobalOrderOutput rest;
  c.on_group_done(0);  // 11
  c.on_group_done(0);  // 1
  c.flush(0, rest);
  EXPECT_EQ(ordered_keys(rest), (std::vector<uint64_t>{12, 13}));
  EXPECT_EQ(c.pending(), 0u);
}

// Partitions that become ready one at a time while two groups are ordered and running wait in the policy, which fuses
// them once rank 0 finishes one; without the limit each would be ordered alone, at once.
// Partitions 1..n become ready on both ranks one at a time, a flush after each.
void ready_one_by_one(GlobalOrder& c, uint64_t n, GlobalOrderOutput& out) {
  for (uint64_t k = 1; k <= n; ++k) {
    const auto rep = std::vector{report(desc(k, 0, 64), static_cast<int32_t>(k))};
    c.on_ready(0, rep, out);
    c.on_ready(1, rep, out);
    c.flush(0, out);
  }
}

TEST(GlobalOrder, ALimitOfGroupsAheadHoldsLaterArrivalsForFusion) {
  GlobalOrder c = make(2, /*fusion=*/4096);
  c.limit_groups_ahead(2);
  GlobalOrderOutput out;
  ready_one_by_one(c, 6, out);
  EXPECT_EQ(out.order.groups.size(), 2u) << "ordered past the limit";
  EXPECT_EQ(ordered_keys(out), (std::vector<uint64_t>{1, 2}));
  EXPECT_FALSE(c.next_wakeup()) << "held back: only a completion can let the policy dispatch";
  GlobalOrderOutput rest;
  c.on_group_done(0);
  c.flush(0, rest);
  ASSERT_EQ(rest.order.groups.size(), 1u) << "the four held partitions did not go as one fused group";
  EXPECT_EQ(ordered_keys(rest), (std::vector<uint64_t>{3, 4, 5, 6}));

  GlobalOrder unlimited = make(2, 4096);
  GlobalOrderOutput each;
  ready_one_by_one(unlimited, 6, each);
  EXPECT_EQ(each.order.groups.size(), 6u);
}

TEST(GlobalOrder, CreditNeverStarvesAPartitionBiggerThanTheCredit) {
  GlobalOrder c = make(2, 0, /*credit=*/100);
  GlobalOrderOutput out;
  c.on_ready(0, std::vector{report(desc(1, 0, 4096), 0)}, out);
  c.on_ready(1, std::vector{report(desc(1, 0, 4096), 0)}, out);
  c.flush(0, out);
  EXPECT_EQ(ordered_keys(out), std::vector<uint64_t>{1});
}

TEST(GlobalOrder, RandomInterleavingsOrderEachPartitionExactlyOnce) {
  std::mt19937 rng(17);
  const int ranks = 4;
  GlobalOrder c = make(ranks, 4096);
  std::vector<ReadyReport> all;
  for (uint64_t k = 1; k <= 50; ++k) all.push_back(report(desc(k, 0, 64 * k), static_cast<int32_t>(rng() % 10)));
  std::vector<std::pair<int, size_t>> events;
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < all.size(); ++i) events.push_back({r, i});
  std::shuffle(events.begin(), events.end(), rng);
  std::vector<uint64_t> keys;
  for (const auto& [r, i] : events) {
    GlobalOrderOutput out;
    c.on_ready(r, std::vector{all[i]}, out);
    if (rng() % 3 == 0) c.flush(0, out);
    EXPECT_TRUE(out.errors.empty());
    for (auto k : ordered_keys(out)) keys.push_back(k);
  }
  GlobalOrderOutput last;
  c.flush(0, last);
  for (auto k : ordered_keys(last)) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  ASSERT_EQ(keys.size(), all.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(keys[i], i + 1);
}

// The order is the real policy's decision: a GlobalOrder over policy P, told a sequence of partitions that become
// ready on every rank (each rank reporting in its own order) and of rank 0's completions, orders exactly the batches a
// fresh P decides when told the same arrivals (in the order they became ready everywhere), flushes and completions.
class CoordinatorRunsThePolicy : public ::testing::TestWithParam<PolicyKind> {};

std::string keys_of(const std::vector<std::vector<uint64_t>>& batches) {
  std::string s;
  for (const auto& b : batches) {
    s += "[";
    for (uint64_t k : b) s += std::to_string(k) + " ";
    s += "]";
  }
  return s;
}

TEST_P(CoordinatorRunsThePolicy, OrderEqualsThePolicysBatchesForTheSameReadySets) {
  EngineConfig cfg;
  cfg.policy = GetParam();
  cfg.knobs.small_tensor_bytes = 2048;  // bytescheduler fuses
  cfg.fusion_bytes = 6000;        // fusion's threshold
  cfg.fusion_cycle_s = 0.001;
  cfg.credit_stall_guard = false;
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    const int ranks = 3;
    Knobs knobs = cfg.knobs;
    knobs.credit_bytes = 8192;
    GlobalOrder c(ranks, make_policy(cfg));
    c.set_knobs(knobs);
    auto reference = make_policy(cfg);
    reference->set_knobs(knobs);

    std::map<uint64_t, uint64_t> key_of_seq;  // the reference's task ids are the global order's first-report order
    uint64_t next_seq = 0, next_key = 1;
    std::vector<std::vector<uint64_t>> got, want;
    std::deque<std::vector<uint64_t>> running;  // the global order's groups, as keys, oldest first
    std::deque<Batch> ref_running;
    auto poll_reference = [&](Nanos now) {
      std::vector<Batch> out;
      reference->poll(now, out);
      for (Batch& b : out) {
        std::vector<uint64_t> keys;
        for (const PartRef& p : b) keys.push_back(key_of_seq.at(p.task_id));
        want.push_back(keys);
        ref_running.push_back(std::move(b));
      }
    };
    std::map<uint32_t, uint64_t> key_of_id;
    auto take = [&](const GlobalOrderOutput& out) {
      ASSERT_TRUE(out.errors.empty()) << out.errors.front().message;
      for (const auto& d : out.order.defines) key_of_id[d.cache_id] = d.desc.key;
      for (const auto& g : out.order.groups) {
        std::vector<uint64_t> keys;
        for (const auto& e : g) keys.push_back(key_of_id.at(e.cache_id));
        got.push_back(keys);
        running.push_back(keys);
      }
    };
    Nanos now = 0;
    for (int step = 0; step < 40; ++step) {
      now += static_cast<Nanos>(rng() % 700'000);
      GlobalOrderOutput out;
      if (rng() % 3 != 0) {
        // A few new partitions (sizes spanning small and big), reported by rank 0 first, then the others shuffled.
        std::vector<ReadyReport> reps;
        const int n = 1 + static_cast<int>(rng() % 6);
        for (int i = 0; i < n; ++i) {
          const uint64_t bytes = 4ull << (rng() % 12);
          reps.push_back(report(desc(next_key++, 0, bytes), static_cast<int32_t>(rng() % 20)));
        }
        c.on_ready(0, reps, out);
        std::vector<ReadyReport> last;
        for (int r = 1; r < ranks; ++r) {
          std::shuffle(reps.begin(), reps.end(), rng);
          c.on_ready(r, reps, out);
          last = reps;
        }
        for (const auto& rep : last) {  // ready everywhere in the last rank's order
          const uint64_t seq = next_seq + (rep.desc.key - (next_key - n));
          key_of_seq[seq] = rep.desc.key;
          const PartRef part{seq, 0, rep.priority, seq, 0, rep.desc.bytes};
          reference->on_task_arrived({seq, rep.priority, seq, rep.desc.bytes, std::span<const PartRef>(&part, 1)}, now);
        }
        next_seq += n;
        reference->on_flush(now);
      } else if (!running.empty()) {
        // Rank 0 completes its oldest collective.
        running.pop_front();
        c.on_group_done(now);
        reference->on_batch_done(ref_running.front(), now);
        ref_running.pop_front();
      }
      c.flush(now, out);
      take(out);
      poll_reference(now);
      ASSERT_EQ(keys_of(got), keys_of(want)) << policy_name(cfg.policy) << " seed " << seed << " step " << step;
    }
    EXPECT_GT(got.size(), 10u) << "the run ordered too little to compare";
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, CoordinatorRunsThePolicy,
                         ::testing::Values(PolicyKind::bytescheduler, PolicyKind::wfbp, PolicyKind::bsp,
                                           PolicyKind::fusion, PolicyKind::mgwfbp),
                         [](const auto& info) { return std::string(policy_name(info.param)); });

}  // namespace
}  // namespace commsched
