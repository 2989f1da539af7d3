// The simulator's compression model: compressed bytes on the wrapped network, encode and decode time around them.
#include <gtest/gtest.h>

#include "simulator/compression_model.h"

namespace commsched::sim {
namespace {

Batch one_partition(uint64_t bytes) { return {PartRef{0, 0, 0, 0, 0, bytes}}; }

TEST(SimCompression, CompressedBytesCrossTheNetworkAfterTheEncodeStage) {
  const uint64_t mib4 = 4u << 20;
  RingAllreduceNetwork plain(RingParams{2, 8e9, 0});  // 1 GB/s; a ring moves 2(W-1)/W = 1x the bytes
  const Transfer p = plain.transfer(one_partition(mib4), 0);
  CompressedNetwork fp16(std::make_unique<RingAllreduceNetwork>(RingParams{2, 8e9, 0}),
                         CompressionModel{{compression::Scheme::fp16}, 1e-3, 2e-3});
  const Transfer c = fp16.transfer(one_partition(mib4), 0);
  const Nanos encode = 4'000'000, decode = 8'000'000;  // 1 ms and 2 ms per MiB
  EXPECT_EQ(c.begin, encode);
  EXPECT_NEAR(static_cast<double>(c.end - c.begin - decode), (p.end - p.begin) / 2.0, 1e3) << "half the bytes";
  // The encoder is one resource: a second batch dispatched at once waits for the first's encoding.
  const Transfer c2 = fp16.transfer(one_partition(mib4), 0);
  EXPECT_GE(c2.begin, 2 * encode);
  EXPECT_LT(fp16.comm_lower_bound_s(mib4, 1), plain.comm_lower_bound_s(mib4, 1));
  CompressedNetwork topk(std::make_unique<RingAllreduceNetwork>(RingParams{2, 8e9, 0}),
                         CompressionModel{{compression::Scheme::topk, 0.01}, 0, 0});
  const Transfer t = topk.transfer(one_partition(mib4), 0);
  EXPECT_NEAR(static_cast<double>(t.end - t.begin), (p.end - p.begin) * 0.02, 1e4) << "1% of elements, 8 bytes each";
}

TEST(SimCompression, NoneLeavesTheNetworkAsItIs) {
  auto net = std::make_unique<RingAllreduceNetwork>(RingParams{2, 8e9, 0});
  NetworkModel* raw = net.get();
  EXPECT_EQ(with_compression(std::move(net), CompressionModel{}).get(), raw);
}

}  // namespace
}  // namespace commsched::sim
