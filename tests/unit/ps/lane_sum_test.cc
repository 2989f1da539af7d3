// Hierarchical lanes in the slot table: a lane push (kFlagLane) opens a slot that one worker per machine completes.
#include <gtest/gtest.h>

#include <cstring>

#include "comm_backends/ps/slot_table.h"
#include "comm_backends/ps/sum_kernels.h"
#include "tests/unit/ps/vec_payload.h"

using namespace commsched;
using namespace commsched::ps;
using commsched::ps::testing::bytes_of;
using commsched::ps::testing::VecPayload;

namespace {

Header lane_push(uint32_t worker, uint32_t machines, uint64_t offset = 0) {
  Header h;
  h.type = MsgType::push_pull;
  h.dtype = DType::f32;
  h.sender_rank = worker;
  h.key = 5;
  h.offset = offset;
  h.length = 8;
  h.tensor_bytes = 64;
  h.request_id = worker + 1;
  if (machines) {
    h.flags = kFlagLane;
    h.aux = machines;
  }
  return h;
}

std::unique_ptr<Payload> floats(float a, float b) { return std::make_unique<VecPayload>(bytes_of(std::vector<float>{a, b})); }

}  // namespace

// 2 machines x 2 workers: lane 0 is workers 0 and 2, lane 1 workers 1 and 3; each lane's slot completes with its two
// pushes (streaming and deterministic), and answers exactly them.
TEST(PsLanes, ALaneSlotCompletesWithOnePushPerMachine) {
  Summer summer(1, 1ull << 20);
  for (bool det : {false, true}) {
    SlotTable table(4, det, summer, BufferPool::create());
    std::vector<Outcome> out;
    table.push(lane_push(0, 2, 0), 1, floats(1, 2), out);
    table.push(lane_push(1, 2, 8), 2, floats(10, 20), out);
    EXPECT_TRUE(out.empty()) << "a lane slot completed with one of its two machines";
    table.push(lane_push(2, 2, 0), 3, floats(3, 4), out);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].error.empty()) << out[0].error;
    ASSERT_EQ(out[0].waiters.size(), 2u);
    EXPECT_EQ(out[0].waiters[0].rank + out[0].waiters[1].rank, 2u) << "answered workers other than 0 and 2";
    float s[2];
    std::memcpy(s, out[0].data.get(), 8);
    EXPECT_EQ(s[0], 4.f);
    EXPECT_EQ(s[1], 6.f);
    out.clear();
    table.push(lane_push(3, 2, 8), 4, floats(30, 40), out);
    ASSERT_EQ(out.size(), 1u);
    std::memcpy(s, out[0].data.get(), 8);
    EXPECT_EQ(s[0], 40.f);
    EXPECT_EQ(table.open_slots(), 0u);
  }
}

TEST(PsLanes, WithoutTheLaneFlagEveryWorkerIsWaitedFor) {
  Summer summer(1, 1ull << 20);
  SlotTable table(4, false, summer, BufferPool::create());
  std::vector<Outcome> out;
  for (uint32_t w = 0; w < 3; ++w) table.push(lane_push(w, 0), w + 1, floats(1, 1), out);
  EXPECT_TRUE(out.empty());
  table.push(lane_push(3, 0), 4, floats(1, 1), out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiters.size(), 4u);
}

TEST(PsLanes, ALaneAndAPlainPushOfOneRangeDisagreeAndBothHearWhy) {
  Summer summer(1, 1ull << 20);
  SlotTable table(4, false, summer, BufferPool::create());
  std::vector<Outcome> out;
  table.push(lane_push(0, 2), 1, floats(1, 1), out);
  table.push(lane_push(2, 0), 3, floats(1, 1), out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiters.size(), 2u);
  for (const char* part : {"key 5", "disagree", "hierarchical lanes", "expects 2 machines", "is no lane"})
    EXPECT_NE(out[0].error.find(part), std::string::npos) << "missing '" << part << "' in: " << out[0].error;
}

TEST(PsLanes, AMachineCountThatDoesNotDivideTheWorkersIsRefused) {
  Summer summer(1, 1ull << 20);
  SlotTable table(4, false, summer, BufferPool::create());
  std::vector<Outcome> out;
  table.push(lane_push(1, 3), 2, floats(1, 1), out);
  ASSERT_EQ(out.size(), 1u);
  for (const char* part : {"worker 1", "lane of 3 machines", "4 workers"})
    EXPECT_NE(out[0].error.find(part), std::string::npos) << "missing '" << part << "' in: " << out[0].error;
  EXPECT_EQ(table.open_slots(), 0u);
}

TEST(PsLanes, JoinedWorkersDoNotStandInForLanes) {
  Summer summer(1, 1ull << 20);
  SlotTable table(4, false, summer, BufferPool::create());
  std::vector<Outcome> out;
  table.push(lane_push(0, 2), 1, floats(1, 1), out);
  ASSERT_TRUE(table.join(3, out));
  EXPECT_TRUE(out.empty()) << "a joined worker completed a lane it is not part of";
  table.push(lane_push(2, 2), 3, floats(2, 2), out);
  ASSERT_EQ(out.size(), 1u);
  float s[2];
  std::memcpy(s, out[0].data.get(), 8);
  EXPECT_EQ(s[0], 3.f);
}
