// The fusion buffer shared by the collective backends: a group goes in one after another, the collective sees one
// contiguous buffer, and the result lands back in every partition.
#include "comm_backends/collective/fusion_buffer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace commsched::collective {
namespace {

TEST(FusionBuffer, GathersRunsOnceAndScattersBackEvenWhenItGrows) {
  FusionBuffer fusion(host_fusion_memory());
  size_t largest = 0;
  for (size_t elements : {3u, 40u, 7u}) {  // grows, then reuses the larger buffer
    std::vector<std::vector<int32_t>> tensors(3, std::vector<int32_t>(elements));
    std::vector<TaskDesc> tasks(3);
    std::vector<PartitionView> group;
    for (int i = 0; i < 3; ++i) {
      std::iota(tensors[i].begin(), tensors[i].end(), 100 * i);
      tasks[i].name = "t" + std::to_string(i);
      tasks[i].dtype = DType::i32;
      tasks[i].count = elements;
      tasks[i].buffer.data = tensors[i].data();
    }
    // The middle tensor contributes only its second half, as a partition would.
    group.push_back(PartitionView{&tasks[0], 0, 0, elements * 4});
    group.push_back(PartitionView{&tasks[1], 1, (elements / 2) * 4, (elements - elements / 2) * 4});
    group.push_back(PartitionView{&tasks[2], 0, 0, elements * 4});
    const size_t total = (2 * elements + elements - elements / 2) * 4;
    largest = std::max(largest, total);
    int calls = 0;
    fusion.run(group, [&](void* data, size_t bytes) {
      ++calls;
      ASSERT_EQ(bytes, total);
      auto* v = static_cast<int32_t*>(data);
      EXPECT_EQ(v[0], 0);
      EXPECT_EQ(v[elements], static_cast<int32_t>(100 + elements / 2)) << "the partition's bytes follow the first tensor";
      for (size_t i = 0; i < bytes / 4; ++i) v[i] = -v[i];
    });
    EXPECT_EQ(calls, 1);
    for (size_t j = 0; j < elements; ++j) {
      EXPECT_EQ(tensors[0][j], -static_cast<int32_t>(j));
      EXPECT_EQ(tensors[2][j], -static_cast<int32_t>(200 + j));
      EXPECT_EQ(tensors[1][j], j < elements / 2 ? static_cast<int32_t>(100 + j) : -static_cast<int32_t>(100 + j))
          << "bytes outside the partition stay";
    }
    EXPECT_EQ(fusion.capacity(), largest) << "grows to the largest group and keeps it";
  }
}

}  // namespace
}  // namespace commsched::collective
