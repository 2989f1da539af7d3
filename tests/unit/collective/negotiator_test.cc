// The negotiator over real loopback sockets, ranks as threads in one process.
#include "comm_backends/collective/negotiator.h"

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/collective_backend.h"
#include "comm_backends/collective/link_auth.h"
#include "tests/unit/collective/negotiator_fixture.h"
#include "scheduler/bsp_policy.h"
#include "scheduler/fifo_policy.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched::collective {
namespace {

using namespace test;

using namespace std::chrono_literals;

TEST(Negotiator, EveryRankExecutesTheSameOrderWhateverItsSubmissionOrder) {
  const int size = 4;
  Group g(size, 4096);
  for (uint64_t round = 0; round < 3; ++round) {
    for (int r = 0; r < size; ++r) {
      std::vector<Submission> subs;
      for (uint64_t k = 1; k <= 40; ++k) subs.push_back(sub(k, k * 200, static_cast<int32_t>(k % 7), round));
      std::shuffle(subs.begin(), subs.end(), std::mt19937(static_cast<unsigned>(r * 10 + round)));
      // Submit in a few chunks so reports interleave across ranks.
      for (size_t i = 0; i < subs.size(); i += 7)
        g.rank(r).submit(std::vector<Submission>(subs.begin() + i, subs.begin() + std::min(subs.size(), i + 7)));
    }
    for (int r = 0; r < size; ++r) ASSERT_TRUE(g.log(r).wait_settled(40 * (round + 1), 10s)) << "rank " << r;
  }
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(g.log(r).failures.empty()) << g.log(r).failures.front().second.message;
    EXPECT_EQ(g.log(r).groups, g.log(0).groups) << "rank " << r << " executed a different order";
  }
  const auto stats = g.rank(1).stats();
  EXPECT_EQ(stats.submitted, 120u);
  EXPECT_EQ(stats.cached_reports, 80u) << "rounds 1 and 2 report by cache id";
}

// Rank 2 reports round 1 late: rank 0 sees it lag and tells every rank (Negotiator::stragglers), then clears it.
TEST(Negotiator, EveryRankLearnsWhichRankLags) {
  Group g(3);
  for (int r = 0; r < 3; ++r) g.rank(r).submit({sub(1, 400, 0, 0)});
  for (int r = 0; r < 2; ++r) g.rank(r).submit({sub(2, 400, 0, 1)});  // another tensor, at round 1
  const auto heard = [&](int r) {
    for (const Straggler& s : g.rank(r).stragglers())
      if (s.rank == 2 && s.iterations == 1 && s.seconds >= 0.1) return true;
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!(heard(0) && heard(1)) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(heard(0) && heard(1)) << "ranks 0 and 1 did not both hear that rank 2 lags";
  g.rank(2).submit({sub(2, 400, 0, 1)});
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(g.log(r).wait_settled(2, 10s)) << "rank " << r;
  const auto cleared = std::chrono::steady_clock::now() + 10s;
  while (!g.rank(1).stragglers().empty() && std::chrono::steady_clock::now() < cleared) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(g.rank(1).stragglers().empty()) << "rank 1 still hears of a lag after rank 2 caught up";
}

TEST(Negotiator, MismatchedSizesFailOnBothRanksNamingTheKey) {
  Group g(2);
  g.rank(0).submit({sub(5, 400, 0)});
  g.rank(1).submit({sub(5, 800, 0)});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(g.log(r).wait_settled(1, 10s));
    ASSERT_EQ(g.log(r).failures.size(), 1u);
    const Status& st = g.log(r).failures[0].second;
    EXPECT_EQ(st.code, Status::Code::invalid);
    EXPECT_NE(st.message.find("task 't5' (key 0x5)"), std::string::npos) << st.message;
    EXPECT_NE(st.message.find("400"), std::string::npos) << st.message;
    EXPECT_NE(st.message.find("800"), std::string::npos) << st.message;
  }
}

// Rank 1 submits under another name what rank 0 submits (an unnamed operation counted from another point): nothing
// pairs them, and each rank would wait for the other forever. After COMMSCHED_STALL_SHUTDOWN both fail on their
// rank, each naming its task and the rank it waited for.
TEST(Negotiator, TensorsTheRanksNameDifferentlyFailAfterTheStallShutdownNamingTheRankMissing) {
  Group g(2, 0, 5, false, {}, {}, [](NegotiatorOptions& o) {
    o.stall.check_s = 0.2;
    o.stall.shutdown_s = 0.5;
  });
  g.rank(0).submit({sub(5, 400, 0)});
  g.rank(1).submit({sub(6, 400, 0)});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(g.log(r).wait_settled(1, 20s)) << "rank " << r << " still waits";
    std::lock_guard lock(g.log(r).mu);
    ASSERT_EQ(g.log(r).failures.size(), 1u);
    const std::string& m = g.log(r).failures[0].second.message;
    const std::string task = r == 0 ? "task 't5' (key 0x5)" : "task 't6' (key 0x6)";
    const std::string missing = r == 0 ? "for rank 1 (submitted by rank 0)" : "for rank 0 (submitted by rank 1)";
    EXPECT_NE(m.find(task), std::string::npos) << m;
    EXPECT_NE(m.find(missing), std::string::npos) << m;
    EXPECT_NE(m.find("COMMSCHED_STALL_SHUTDOWN"), std::string::npos) << m;
  }
}

// Ranks 0 and 1 are real negotiators; rank 2 is a raw socket that joins like one and then does what the test says.
TEST(Negotiator, ARankThatVanishesFailsPendingWorkWithPeerLost) {
  TwoRanksAndAFake g;
  g.submit_pending();
  g.fake.reset();  // the "crash"
  for (RankLog* l : {&g.l0, &g.l1}) {
    ASSERT_TRUE(l->wait_settled(1, 10s));
    ASSERT_EQ(l->failures.size(), 1u);
    EXPECT_EQ(l->failures[0].second.code, Status::Code::peer_lost);
    EXPECT_NE(l->failures[0].second.message.find("rank 2"), std::string::npos) << l->failures[0].second.message;
  }
  // Rank 0 saw it; rank 1 was told by rank 0: the lost rank named first, then the reporter, once.
  const std::string& seen = g.l0.failures[0].second.message;
  const std::string& told = g.l1.failures[0].second.message;
  EXPECT_TRUE(starts_with(seen, "rank 2 lost: closed the connection")) << seen;
  EXPECT_EQ(seen.find("reported by"), std::string::npos) << seen;
  EXPECT_EQ(told, seen + " (reported by rank 0)");
  // After the loss, new work fails at once.
  g.n1->submit({sub(2, 64, 0)});
  ASSERT_TRUE(g.l1.wait_settled(2, 10s));
  EXPECT_EQ(g.l1.failures.back().second.code, Status::Code::peer_lost);
}

// A rank that fails tells rank 0, which passes it on: every rank fails with the same message, naming the first
// reporter once.
TEST(Negotiator, AFailureReportedByARankReachesEveryOtherRank) {
  TwoRanksAndAFake g;
  g.submit_pending();
  send_all(g.fake.get(), encode_peer_lost(-1, "negotiator rank 2: the backend broke"), "fake rank");
  for (RankLog* l : {&g.l0, &g.l1}) {
    ASSERT_TRUE(l->wait_settled(1, 10s));
    ASSERT_EQ(l->failures.size(), 1u);
    EXPECT_EQ(l->failures[0].second.code, Status::Code::peer_lost);
    EXPECT_EQ(l->failures[0].second.message, "negotiator rank 2: the backend broke (reported by rank 2)");
  }
}

// A malformed frame from a rank: rank 0 names it and tells the others at once (they do not wait for rank 0's
// silence: the timeout here is far longer than the wait).
TEST(Negotiator, AMalformedFrameStopsEveryRankAtOnceNamingTheSender) {
  TwoRanksAndAFake g(/*timeout_s=*/60);
  g.submit_pending();
  ByteWriter w;
  w.put<uint8_t>(99);  // no such message type
  send_all(g.fake.get(), w.take_frame(), "fake rank");
  for (RankLog* l : {&g.l0, &g.l1}) {
    ASSERT_TRUE(l->wait_settled(1, 10s));
    ASSERT_EQ(l->failures.size(), 1u);
    EXPECT_TRUE(starts_with(l->failures[0].second.message, "rank 2 sent a malformed message: "))
        << l->failures[0].second.message;
  }
  EXPECT_NE(g.l0.failures[0].second.message.find("unknown type 99"), std::string::npos) << g.l0.failures[0].second.message;
  EXPECT_EQ(g.l1.failures[0].second.code, Status::Code::peer_lost);
  EXPECT_TRUE(ends_with(g.l1.failures[0].second.message, " (reported by rank 0)")) << g.l1.failures[0].second.message;
}

// Everyone's goodbye passes the barrier at once: shutdown does not wait for the deadline (timeout_s).
TEST(Negotiator, ShutdownPassesTheBarrierOnceEveryRankSaidBye) {
  Group g(3, 0, /*timeout_s=*/30);
  for (int r = 0; r < 3; ++r) g.rank(r).submit({sub(1, 64, 0)});
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(g.log(r).wait_settled(1, 10s));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r) ts.emplace_back([&g, r] { g.rank(r).shutdown(); });
  for (auto& t : ts) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s) << "the barrier waited for its deadline";
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(g.log(r).failures.empty()) << g.log(r).failures.front().second.message;
}

// A rank that never says bye holds rank 0's shutdown for timeout_s at most; rank 0's goodbye (all_bye) then ends that
// rank too, as a shutdown (cancelled), not as a loss.
TEST(Negotiator, ARankThatNeverSaysByeHoldsTheBarrierOnlyUntilTheTimeout) {
  Group g(2, 0, /*timeout_s=*/1);
  const auto t0 = std::chrono::steady_clock::now();
  g.rank(0).shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 6s);
  g.rank(1).submit({sub(1, 64, 0)});
  ASSERT_TRUE(g.log(1).wait_settled(1, 10s));
  ASSERT_EQ(g.log(1).failures.size(), 1u);
  EXPECT_EQ(g.log(1).failures[0].second.code, Status::Code::cancelled) << g.log(1).failures[0].second.message;
}

TEST(Negotiator, ACollectiveLongerThanTheTimeoutOnTheNegotiatorThreadIsNotADeath) {
  // Groups run on the negotiator thread (as GlooBackend does). One rank's group takes three timeouts while the other's
  // returns at once (it waits for its data elsewhere): the busy rank's heartbeats must keep flowing from the heartbeat
  // thread, and its own judgement of silence must wait until it has read what arrived meanwhile.
  Group g(2, 0, /*timeout_s=*/0.4, /*execute_blocks=*/true);
  for (uint64_t round = 0; round < 2; ++round) {
    g.log(0).execute_ms = round == 0 ? 1200 : 0;  // round 0: the coordinator is busy; round 1: the other rank
    g.log(1).execute_ms = round == 0 ? 0 : 1200;
    g.rank(0).submit({sub(1, 64, 0, round)});
    g.rank(1).submit({sub(1, 64, 0, round)});
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(round + 1, 10s)) << "rank " << r;
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(g.log(r).failures.empty()) << g.log(r).failures.front().second.message;
    EXPECT_EQ(g.log(r).groups.size(), 2u);
  }
}

// Rank 0's submitting thread runs the coordinator's step and sends the order itself: while rank 0's negotiator thread
// is inside a collective, a partition rank 0 submits still gets ordered, and rank 1 (which here runs groups at once)
// runs it. When the order had to wait for rank 0's negotiator thread, rank 1 waited for that collective to end.
TEST(Negotiator, RankZerosSubmitterOrdersWhileItsNegotiatorThreadRunsACollective) {
  Group g(2, 0, 5, /*execute_blocks=*/true);
  g.log(0).set_hold(true);
  g.rank(1).submit({sub(1, 64, 0), sub(2, 64, 1)});  // one report: rank 0 knows both ready on rank 1 at once
  g.rank(0).submit({sub(1, 64, 0)});
  ASSERT_TRUE(g.log(0).wait_entered(1, 10s)) << "partition 1 was never ordered";
  ASSERT_TRUE(g.log(1).wait_settled(1, 10s));
  g.rank(0).submit({sub(2, 64, 1)});  // rank 0's negotiator thread is still inside partition 1's collective
  EXPECT_TRUE(g.log(1).wait_settled(2, 10s)) << "the order of partition 2 waited for rank 0's negotiator thread";
  {
    std::lock_guard lock(g.log(0).mu);
    EXPECT_EQ(g.log(0).settled, 0u);
  }
  g.log(0).set_hold(false);
  ASSERT_TRUE(g.log(0).wait_settled(2, 10s));
  EXPECT_EQ(g.log(1).groups, g.log(0).groups);
}

TEST(Negotiator, ACreditSetAtRunTimeHoldsWorkUntilRankZeroCompletesSome) {
  Group g(2);
  g.log(0).auto_complete = false;
  g.rank(0).order_inbox().post(knobs(100));  // one 64-byte partition in flight at a time
  g.rank(1).order_inbox().post(knobs(1));    // ignored: rank 0 decides
  for (int r = 0; r < 2; ++r) g.rank(r).submit({sub(1, 64, 0), sub(2, 64, 1), sub(3, 64, 2)});
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(1, 10s));
  // Readiness signal instead of a pause: a probe the ranks disagree on fails at once, credit or not, and its error
  // reaches each rank after every order the coordinator published before it. Once it has arrived, a wrong second
  // partition let through by the credit would have arrived too.
  g.rank(0).submit({sub(9, 64, 3)});
  g.rank(1).submit({sub(9, 128, 3)});
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(2, 10s));
  {
    std::lock_guard lock(g.log(0).mu);
    ASSERT_EQ(g.log(0).failures.size(), 1u);
    EXPECT_EQ(g.log(0).failures.front().first, 9u);
    EXPECT_EQ(g.log(0).groups.size(), 1u) << "the credit let a second partition through before anything completed";
  }
  g.rank(0).completed();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(3, 10s));
  g.rank(0).order_inbox().post(knobs(0));  // no limit: the last one goes without another completion
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(4, 10s));
  EXPECT_EQ(g.log(1).groups, g.log(0).groups);
  EXPECT_EQ(g.log(0).groups.size(), 3u);
}

// The policy handed over on rank 0 (an engine's own) is the one that orders; another rank's is never run. Once the
// default has ordered, a late policy is refused, naming why.
TEST(Negotiator, ThePolicyHandedOverOnRankZeroOrders) {
  Group g(2, /*fusion=*/4096);  // the default (bytescheduler) would fuse these three
  g.rank(0).order_inbox().adopt(std::make_unique<FifoPolicy>());  // never fuses
  g.rank(1).order_inbox().adopt(std::make_unique<PriorityCreditPolicy>(0, 4096));  // ignored: rank 0 decides
  for (int r = 0; r < 2; ++r) g.rank(r).submit({sub(1, 64, 0), sub(2, 64, 1), sub(3, 64, 2)});
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(3, 10s));
  {
    std::lock_guard lock(g.log(0).mu);
    EXPECT_EQ(g.log(0).groups.size(), 3u) << "rank 0's handed-over FIFO orders each partition alone";
    EXPECT_EQ(g.log(1).groups, g.log(0).groups);
  }

  Group d(2, 4096);
  for (int r = 0; r < 2; ++r) d.rank(r).submit({sub(1, 64, 0), sub(2, 64, 1)});
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(d.log(r).wait_settled(2, 10s));
  try {
    d.rank(0).order_inbox().adopt(std::make_unique<FifoPolicy>());
    ADD_FAILURE() << "a policy handed over after the default ordered was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("build the engine before using the backend"), std::string::npos) << e.what();
  }
}

// Iteration marks cross the wire: rank 0's BSP (handed over by an engine, which sends marks) orders nothing until
// every rank's end of backward has come, counted behind that rank's reports; then it orders the iteration.
TEST(Negotiator, RankZerosBspWaitsForEveryRanksEndOfBackward) {
  Group g(2);
  g.rank(0).order_inbox().adopt(std::make_unique<BspPolicy>(), /*marks=*/true);
  for (int r = 0; r < 2; ++r) g.rank(r).submit({sub(1, 64, 0), sub(2, 64, 1)});
  g.rank(0).order_inbox().mark(true);
  // Readiness signal instead of a pause: a probe the ranks disagree on fails at once, after every order rank 0
  // published before it (as in the credit test above); rank 1's reports of 1 and 2 reached rank 0 before its probe.
  g.rank(0).submit({sub(9, 64, 3)});
  g.rank(1).submit({sub(9, 128, 3)});
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(1, 10s));
  {
    std::lock_guard lock(g.log(0).mu);
    ASSERT_EQ(g.log(0).failures.size(), 1u);
    EXPECT_TRUE(g.log(0).groups.empty()) << "BSP ordered before rank 1's end of backward";
  }
  g.rank(1).order_inbox().mark(true);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(3, 10s));
  std::lock_guard lock(g.log(0).mu);
  EXPECT_EQ(g.log(0).groups.size(), 2u);
  EXPECT_EQ(g.log(1).groups, g.log(0).groups);
}

// The fusion bound is a tuner knob too: set at run time on rank 0, it fuses what the credit holds back (before it,
// the same queue went one partition at a time). Rank 1's call is ignored, as its credit is.
TEST(Negotiator, AFusionBoundSetAtRunTimeFusesWhatTheCreditHolds) {
  Group g(2);  // no fusion at start
  g.log(0).auto_complete = false;
  g.rank(0).order_inbox().post(knobs(100));  // one 64-byte partition in flight at a time
  // One submission is one report per rank, so rank 0 knows all five ready everywhere once it orders the first.
  for (int r = 0; r < 2; ++r) g.rank(r).submit({sub(1, 64, 0), sub(2, 64, 1), sub(3, 64, 2), sub(4, 64, 3), sub(5, 64, 4)});
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(1, 10s));
  g.rank(0).completed();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(2, 10s));
  {
    std::lock_guard lock(g.log(0).mu);
    ASSERT_EQ(g.log(0).groups.size(), 2u);
    EXPECT_EQ(g.log(0).groups[1].size(), 1u) << "fused with no fusion bound";
  }
  g.rank(1).order_inbox().post(knobs(100, 1));     // ignored: rank 0 decides
  g.rank(0).order_inbox().post(knobs(100, 1024));  // applied before the completion below (same thread, same order)
  g.rank(0).completed();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g.log(r).wait_settled(5, 10s));
  std::lock_guard lock(g.log(0).mu);
  ASSERT_EQ(g.log(0).groups.size(), 3u) << "the three held partitions did not go as one fused group";
  EXPECT_EQ(g.log(0).groups[2].size(), 3u);
  EXPECT_EQ(g.log(1).groups, g.log(0).groups);
}

// Rendezvous through the control plane's admission rule (control::Roster): a rank that never comes is named when
// rank 0 gives up, and a second process claiming a rank already taken is refused, saying so.
std::string join_error(std::future<void>& f) {
  try {
    f.get();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Negotiator, RankZeroNamesTheRanksThatNeverJoined) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient store("127.0.0.1", server.port(), 5000ms);
  RankLog log;
  NegotiatorOptions o = options(0, 3);
  o.join_timeout_s = 0.5;
  auto f = std::async(std::launch::async, [&] { Negotiator n(o, store, log.callbacks()); });
  const std::string what = join_error(f);
  EXPECT_NE(what.find("ranks 1, 2 did not join within"), std::string::npos) << what;
}

TEST(Negotiator, ASecondClaimOfARankIsRefused) {
  TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::unique_ptr<TcpStoreClient>> stores;
  for (int i = 0; i < 3; ++i) stores.push_back(std::make_unique<TcpStoreClient>("127.0.0.1", server.port(), 5000ms));
  RankLog logs[3];
  std::vector<std::future<void>> fs;
  for (int i = 0; i < 3; ++i) {
    NegotiatorOptions o = options(i == 0 ? 0 : 1, 3);  // two processes both say they are rank 1
    o.join_timeout_s = 5;
    fs.push_back(std::async(std::launch::async, [&, i, o] { Negotiator n(o, *stores[i], logs[i].callbacks()); }));
  }
  const std::string what = join_error(fs[0]);
  EXPECT_NE(what.find("joined as rank 1 of 3 and was refused"), std::string::npos) << what;
  EXPECT_NE(what.find("already connected"), std::string::npos) << what;
  for (int i = 1; i < 3; ++i) EXPECT_FALSE(join_error(fs[i]).empty());  // neither impostor nor victim goes on alone
}

constexpr const char* kSecret = "negotiation-secret-0123456789";

// Every rank submits the same partitions; each must execute them, in one order on all ranks, with no failure.
void expect_all_reduce_as_before(Group& g, int size) {
  for (int r = 0; r < size; ++r) g.rank(r).submit({sub(1, 400, 0), sub(2, 800, 1)});
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(g.log(r).wait_settled(2, 10s)) << "rank " << r;
    EXPECT_TRUE(g.log(r).failures.empty()) << g.log(r).failures.front().second.message;
    EXPECT_EQ(g.log(r).groups, g.log(0).groups) << "rank " << r;
  }
}

TEST(NegotiatorAuth, RanksWithTheSecretNegotiateAsBefore) {
  Group g(3, 0, 5, false, kSecret);
  expect_all_reduce_as_before(g, 3);
}

// Connects to rank 0's negotiation port (from the store) and returns the connection.
Fd connect_to_coordinator(control::Store& store) {
  const std::string addr = store.get("commsched/negotiator/coordinator", 10000ms);
  const auto colon = addr.rfind(':');
  return connect_tcp(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)), std::chrono::steady_clock::now() + 5s);
}

// Waits until rank 0 closes `fd` (true) or 10 s pass (false), discarding what it sends.
bool closed_by_peer(const Fd& fd) {
  set_receive_timeout(fd.get(), 10);
  char buf[256];
  for (;;) {
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return false;
  }
}

TEST(NegotiatorAuth, AStrangerAtTheNegotiationPortIsRefusedAndTheRanksStillFinish) {
  std::string impostor_error;
  Fd silent;
  testing::internal::CaptureStderr();
  Group g(3, 0, 5, false, kSecret, [&](control::Store& store) {
    // One with another secret, one that skips the handshake and says hello as rank 1, one that never says a word
    // (rank 0 gives up on it after 10 s: the real ranks wait in the accept queue meanwhile).
    try {
      LinkAuth("another-secret-0123456789", "negotiation")
          .prove(connect_to_coordinator(store).get(), std::chrono::steady_clock::now() + 5s, "rank 0");
    } catch (const std::exception& e) {
      impostor_error = e.what();
    }
    const Fd fd = connect_to_coordinator(store);
    send_all(fd.get(), encode_hello(1, 3), "stranger");
    EXPECT_TRUE(closed_by_peer(fd)) << "rank 0 kept a connection that never proved the secret";
    silent = connect_to_coordinator(store);
  });
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(impostor_error.find("refused us: the shared secret differs"), std::string::npos) << impostor_error;
  EXPECT_NE(log.find("negotiator rank 0 refused 127.0.0.1:"), std::string::npos) << log;
  size_t refusals = 0;
  for (size_t at = log.find("negotiator rank 0 refused"); at != std::string::npos; at = log.find("negotiator rank 0 refused", at + 1))
    ++refusals;
  EXPECT_EQ(refusals, 3u) << log;
  EXPECT_NE(log.find("did not prove the run's shared secret"), std::string::npos) << log;
  expect_all_reduce_as_before(g, 3);
}

// Rank 0 with one secret and rank 1 with `secret1`: both constructors throw; returns their messages and the seconds
// the slower one took.
std::pair<std::array<std::string, 2>, double> join_with_secrets(const std::string& secret1) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStoreClient store0("127.0.0.1", server.port(), 5000ms), store1("127.0.0.1", server.port(), 5000ms);
  RankLog logs[2];
  const auto t0 = std::chrono::steady_clock::now();
  std::array<std::future<void>, 2> fs;
  for (int r = 0; r < 2; ++r) {
    NegotiatorOptions o = options(r, 2);
    o.join_timeout_s = 3;
    o.secret = r == 0 ? kSecret : secret1;
    fs[r] = std::async(std::launch::async, [&, r, o] { Negotiator n(o, r == 0 ? store0 : store1, logs[r].callbacks()); });
  }
  std::array<std::string, 2> what{join_error(fs[0]), join_error(fs[1])};
  return {what, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

TEST(NegotiatorAuth, RanksWithDifferentSecretsFailNamingTheMismatchWithinSeconds) {
  testing::internal::CaptureStderr();
  const auto [what, seconds] = join_with_secrets("another-secret-0123456789");
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(what[1].find("refused us: the shared secret differs"), std::string::npos) << what[1];
  EXPECT_NE(what[0].find("ranks 1 did not join"), std::string::npos) << what[0];
  EXPECT_NE(what[0].find("refused connections that did not prove the run's shared secret"), std::string::npos) << what[0];
  EXPECT_NE(log.find("negotiator rank 0 refused 127.0.0.1:"), std::string::npos) << log;
  EXPECT_LT(seconds, 10) << "a mismatch must not wait out the long timeouts";
}

TEST(NegotiatorAuth, ARankWithoutTheSecretIsToldRankZeroRequiresIt) {
  testing::internal::CaptureStderr();
  const auto [what, seconds] = join_with_secrets("");
  testing::internal::GetCapturedStderr();
  EXPECT_NE(what[1].find("requires the run's shared secret"), std::string::npos) << what[1];
  EXPECT_LT(seconds, 10);
}

TEST(NegotiatorAuth, TheBackendsHandTheNegotiationTheRunsSecret) {
  ::setenv("COMMSCHED_SECRET", kSecret, 1);
  ClusterEnv env;
  env.num_workers = 2;
  const NegotiatorOptions o = CollectiveOptions{}.negotiator_options(env);
  ::unsetenv("COMMSCHED_SECRET");
  EXPECT_EQ(o.secret, kSecret);
  EXPECT_EQ(CollectiveOptions{}.negotiator_options(env).secret, "") << "no secret configured, none on loopback";
}

TEST(Negotiator, RoundTripLatencyOnLoopback) {
  // Not a timed assertion: prints the per-round cost for the record (one partition ready on both ranks -> ordered).
  Group g(2);
  const int rounds = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) {
    g.rank(1).submit({sub(1, 64, 0, static_cast<uint64_t>(i))});
    g.rank(0).submit({sub(1, 64, 0, static_cast<uint64_t>(i))});
    ASSERT_TRUE(g.log(0).wait_settled(static_cast<size_t>(i) + 1, 10s));
    ASSERT_TRUE(g.log(1).wait_settled(static_cast<size_t>(i) + 1, 10s));
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / rounds;
  std::cout << "[ negotiation ] " << us << " us per round (2 ranks, cached, loopback)\n";
  EXPECT_EQ(g.log(0).groups.size(), static_cast<size_t>(rounds));
}

}  // namespace
}  // namespace commsched::collective
