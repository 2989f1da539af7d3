#include <gtest/gtest.h>

#include "scheduler/task.h"

namespace commsched {
namespace {

class PartitionCover : public ::testing::TestWithParam<std::tuple<DType, uint64_t, uint64_t>> {};

TEST_P(PartitionCover, CoversEveryByteExactlyOnceAligned) {
  const auto [dtype, count, pbytes] = GetParam();
  const uint64_t esz = dtype_size(dtype);
  const auto ranges = partition_ranges(count, dtype, pbytes);
  ASSERT_EQ(ranges.size(), partition_count(count, dtype, pbytes));
  uint64_t expect_offset = 0;
  const uint64_t cap = pbytes == 0 ? UINT64_MAX : std::max<uint64_t>(pbytes / esz * esz, esz);
  for (const auto& r : ranges) {
    EXPECT_EQ(r.offset, expect_offset) << "ranges must be contiguous";
    EXPECT_EQ(r.offset % esz, 0u);
    EXPECT_EQ(r.bytes % esz, 0u);
    EXPECT_GT(r.bytes, 0u);
    EXPECT_LE(r.bytes, cap);
    expect_offset += r.bytes;
  }
  EXPECT_EQ(expect_offset, count * esz);
  if (count == 0) {
    EXPECT_TRUE(ranges.empty());
  }
  // Every range but the last is full-sized: the split wastes nothing.
  for (size_t i = 0; i + 1 < ranges.size(); ++i) EXPECT_EQ(ranges[i].bytes, cap);
}

// The engine fills partitions without the list (for_each_partition): the same ranges, indexed in order.
TEST_P(PartitionCover, EachPartitionInTurnIsTheList) {
  const auto [dtype, count, pbytes] = GetParam();
  const auto ranges = partition_ranges(count, dtype, pbytes);
  uint32_t seen = 0;
  for_each_partition(count, dtype, pbytes, [&](uint32_t i, ByteRange r) {
    ASSERT_EQ(i, seen) << "in order";
    ASSERT_LT(i, ranges.size());
    EXPECT_EQ(r.offset, ranges[i].offset) << i;
    EXPECT_EQ(r.bytes, ranges[i].bytes) << i;
    ++seen;
  });
  EXPECT_EQ(seen, ranges.size());
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypesAwkwardSizes, PartitionCover,
    ::testing::Combine(::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64),
                       ::testing::Values(0u, 1u, 2u, 3u, 7u, 1000u, 1001u, 65537u),
                       ::testing::Values(0u, 1u, 3u, 5u, 8u, 100u, 4096u, 1u << 20)));

TEST(Partition, PartitionSmallerThanElementStillMakesProgress) {
  const auto ranges = partition_ranges(3, DType::f64, 4);
  ASSERT_EQ(ranges.size(), 3u);
  for (const auto& r : ranges) EXPECT_EQ(r.bytes, 8u);
}

TEST(Partition, TaskKeyIsStableAndDistinguishesNames) {
  EXPECT_EQ(task_key("layer1.weight"), task_key("layer1.weight"));
  EXPECT_NE(task_key("layer1.weight"), task_key("layer1.bias"));
  EXPECT_EQ(task_key(""), 1469598103934665603ULL);  // FNV-1a offset basis: the same on every rank and run
}

TEST(Partition, ValidateRejectsBadTasks) {
  float x = 0;
  Task t{"w", 0, Op::allreduce, DType::f32, 1, Buffer{&x}, 0, {}, {}};
  EXPECT_NO_THROW(validate_task(t));
  Task null_buf = t;
  null_buf.buffer.data = nullptr;
  try {
    validate_task(null_buf);
    FAIL() << "null buffer accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("null buffer"), std::string::npos) << e.what();
  }
  Task bad_dtype = t;
  bad_dtype.dtype = static_cast<DType>(42);
  EXPECT_THROW(validate_task(bad_dtype), InvalidArgument);
  Task no_name = t;
  no_name.name.clear();
  EXPECT_THROW(validate_task(no_name), InvalidArgument);
  Task empty = t;  // zero elements need no buffer
  empty.count = 0;
  empty.buffer.data = nullptr;
  EXPECT_NO_THROW(validate_task(empty));
}

TEST(Types, DtypeParsingAndSizes) {
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_dtype("BF16"), DType::bf16);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  try {
    parse_dtype("complex64");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("complex64"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << "lists what is allowed";
  }
}

}  // namespace
}  // namespace commsched
