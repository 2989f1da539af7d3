// The one loop that drives a Policy (scheduler/policy_driver.h), on the real credit policy and on small scripted ones.
#include <gtest/gtest.h>

#include <stdexcept>

#include "scheduler/policy_driver.h"
#include "scheduler/priority_credit_policy.h"

namespace commsched {
namespace {

void arrive(PolicyDriver& d, uint64_t id, int32_t prio, int parts, uint64_t bytes, Nanos now = 0) {
  std::vector<PartRef> refs;
  for (int i = 0; i < parts; ++i)
    refs.push_back(PartRef{id, static_cast<uint32_t>(i), prio, id, static_cast<uint64_t>(i) * bytes, bytes});
  d.arrived(TaskArrival{id, prio, id, bytes * parts, refs}, now);
}

// Records what it is handed; answers `in_flight` (false: the batch ended at once) and holds polls while `hold`.
struct RecordingSink final : DispatchSink {
  bool dispatch(Batch& b, Nanos) override {
    got.push_back(b);
    return in_flight;
  }
  bool may_poll() const override { return !hold; }
  std::vector<Batch> got;
  bool in_flight = true;
  bool hold = false;
};

TEST(PolicyDriver, HandsBatchesInThePolicysOrderWithinCredit) {
  PriorityCreditPolicy p(/*credit=*/200, 0, /*stall_guard=*/false);
  PolicyDriver d(p);
  arrive(d, 0, /*prio=*/5, 3, 100);
  arrive(d, 1, /*prio=*/1, 1, 100);
  RecordingSink sink;
  EXPECT_FALSE(d.pump(0, sink).has_value());
  ASSERT_EQ(sink.got.size(), 2u) << "credit 200 admits two 100-byte partitions";
  EXPECT_EQ(sink.got[0][0].task_id, 1u) << "most urgent first";
  EXPECT_EQ(sink.got[1][0].task_id, 0u);
  d.batch_done(sink.got[0], 1);
  d.pump(1, sink);
  EXPECT_EQ(sink.got.size(), 3u) << "a completion frees credit for one more";
}

TEST(PolicyDriver, ABatchThatEndsAtOnceFreesItsCreditAndThePolicyIsAskedAgain) {
  PriorityCreditPolicy p(/*credit=*/100, 0, false);
  PolicyDriver d(p);
  arrive(d, 0, 0, 3, 100);
  RecordingSink sink;
  sink.in_flight = false;
  d.pump(0, sink);
  EXPECT_EQ(sink.got.size(), 3u) << "each batch ended at once, so the next one fit in the credit";
  EXPECT_EQ(p.bytes_in_flight(), 0u);
}

TEST(PolicyDriver, AHeldSinkIsNotAskedAndThePolicyKeepsItsPartitions) {
  PriorityCreditPolicy p(0, 0, false);
  PolicyDriver d(p);
  arrive(d, 0, 0, 2, 100);
  RecordingSink sink;
  sink.hold = true;
  EXPECT_FALSE(d.pump(0, sink).has_value());
  EXPECT_TRUE(sink.got.empty());
  EXPECT_EQ(p.queued_partitions(), 2u);
}

// Asks to be polled again "now" forever without dispatching anything.
class AlwaysNow final : public Policy {
 public:
  std::string_view name() const override { return "always-now"; }
  void on_task_arrived(const TaskArrival&, Nanos) override {}
  void on_batch_done(const Batch&, Nanos) override {}
  void poll(Nanos now, std::vector<Batch>&) override {
    ++polls;
    last = now;
  }
  std::optional<Nanos> next_wakeup() const override { return last; }
  size_t queued_partitions() const override { return 0; }
  uint64_t bytes_in_flight() const override { return 0; }
  int polls = 0;
  Nanos last = 0;
};

TEST(PolicyDriver, APolicyAskingForNowIsAskedTwiceThenLeftToTheCaller) {
  AlwaysNow p;
  PolicyDriver d(p);
  RecordingSink sink;
  const auto wake = d.pump(7, sink);
  ASSERT_TRUE(wake.has_value());
  EXPECT_LE(*wake, 7);
  EXPECT_EQ(p.polls, 2);
}

class Throwing final : public Policy {
 public:
  std::string_view name() const override { return "throwing"; }
  void on_task_arrived(const TaskArrival&, Nanos) override { throw std::runtime_error("boom"); }
  void on_batch_done(const Batch&, Nanos) override {}
  void poll(Nanos, std::vector<Batch>& out) override { out.push_back(Batch{PartRef{}}); }
  size_t queued_partitions() const override { return 0; }
  uint64_t bytes_in_flight() const override { return 0; }
};

TEST(PolicyDriver, APolicysExceptionNamesThePolicyAndTheCallASinksPassesUntouched) {
  Throwing p;
  PolicyDriver d(p);
  try {
    arrive(d, 0, 0, 1, 8);
    FAIL() << "expected a PolicyFault";
  } catch (const PolicyFault& f) {
    EXPECT_STREQ(f.what(), "policy 'throwing' threw in on_task_arrived: boom");
  }
  struct Failing final : DispatchSink {
    bool dispatch(Batch&, Nanos) override { throw std::logic_error("sink's own"); }
  } sink;
  EXPECT_THROW(d.pump(0, sink), std::logic_error);
}

}  // namespace
}  // namespace commsched
