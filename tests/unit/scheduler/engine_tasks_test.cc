// The engine's task table: a reused TaskState starts clean, and the name registry keeps its rules with one entry per
// name (scheduler/engine_tasks.h).
#include <gtest/gtest.h>

#include "scheduler/engine_tasks.h"

namespace commsched {
namespace {

TEST(TaskPool, ARecycledStateIsResetAndReused) {
  TaskPool pool;
  std::unique_ptr<TaskState> t = pool.take();
  t->desc.name = "a fairly long tensor name, longer than the short-string buffer";
  t->desc.id = 7;
  t->parts.assign(5, PartRef{});
  t->remaining = 3;
  t->in_flight = 2;
  t->staged = true;
  t->status = Status::Error("failed");
  t->first_dispatch = 11;
  bool called = false;
  t->callback = [&](const Status&) { called = true; };
  TaskState* raw = t.get();
  pool.recycle(std::move(t));

  std::unique_ptr<TaskState> again = pool.take();
  ASSERT_EQ(again.get(), raw) << "the kept state is handed out again";
  EXPECT_TRUE(again->desc.name.empty());
  EXPECT_EQ(again->desc.id, 0u);
  EXPECT_TRUE(again->parts.empty());
  EXPECT_GE(again->parts.capacity(), 5u) << "the partition list keeps its capacity";
  EXPECT_EQ(again->remaining, 0u);
  EXPECT_EQ(again->in_flight, 0u);
  EXPECT_FALSE(again->staged);
  EXPECT_TRUE(again->status.ok());
  EXPECT_EQ(again->first_dispatch, -1);
  EXPECT_FALSE(again->callback);
  EXPECT_FALSE(called);
  EXPECT_NE(pool.take().get(), raw) << "an empty pool makes a new state";
}

TEST(TaskRegistry, NamesInFlightAreRefusedAndRoundsCount) {
  TaskRegistry reg;
  EXPECT_EQ(reg.admit("w"), std::make_pair(uint64_t{0}, uint64_t{0}));
  EXPECT_THROW(reg.admit("w"), InvalidArgument);
  EXPECT_EQ(reg.admit("b"), std::make_pair(uint64_t{1}, uint64_t{0}));
  reg.release("w");
  EXPECT_EQ(reg.admit("w"), std::make_pair(uint64_t{2}, uint64_t{1})) << "a released name's next round";
  reg.release("w");
  reg.release("b");
  reg.restart_rounds();
  EXPECT_EQ(reg.admit("w"), std::make_pair(uint64_t{3}, uint64_t{0})) << "rounds start again, ids do not";
  EXPECT_EQ(reg.submitted(), 4u);
}

}  // namespace
}  // namespace commsched
