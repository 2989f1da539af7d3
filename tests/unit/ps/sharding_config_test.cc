// Shard assignment balance on real model tensor sizes, PsConfig parsing, the emulation token bucket.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm_backends/ps/ps_config.h"
#include "comm_backends/ps/sharder.h"
#include "comm_backends/ps/token_bucket.h"
#include "comm_backends/ps/transport.h"
#include "scheduler/task.h"

using namespace commsched;
using namespace commsched::ps;

namespace {

// ResNet-50 parameter tensors (elements), forward order: conv/bn weights of the 4 stages and the classifier.
std::vector<uint64_t> resnet50() {
  std::vector<uint64_t> t = {9408, 64, 64};
  const uint64_t widths[] = {64, 128, 256, 512};
  const int blocks[] = {3, 4, 6, 3};
  uint64_t in = 64;
  for (int s = 0; s < 4; ++s) {
    const uint64_t w = widths[s], out = w * 4;
    for (int b = 0; b < blocks[s]; ++b) {
      t.insert(t.end(), {in * w, w, w, 9 * w * w, w, w, w * out, out, out});
      if (b == 0) t.insert(t.end(), {in * out, out, out});
      in = out;
    }
  }
  t.insert(t.end(), {2048 * 1000, 1000});
  return t;
}

// BERT-large: embeddings, 24 encoder layers, pooler.
std::vector<uint64_t> bert_large() {
  const uint64_t h = 1024, f = 4096;
  std::vector<uint64_t> t = {30522 * h, 512 * h, 2 * h, h, h};
  for (int l = 0; l < 24; ++l)
    t.insert(t.end(), {h * h, h, h * h, h, h * h, h, h * h, h, h, h, h * f, f, f * h, h, h, h});
  t.insert(t.end(), {h * h, h});
  return t;
}

double imbalance(const std::vector<uint64_t>& elems, int servers, uint64_t partition_bytes) {
  Sharder s(servers);
  // Backward order (last layer first), as the engine produces them.
  for (size_t i = elems.size(); i-- > 0;) {
    const uint64_t key = task_key("t" + std::to_string(i));
    for (auto r : partition_ranges(elems[i], DType::f32, partition_bytes)) s.assign(key, r.offset, r.bytes);
  }
  return s.imbalance();
}

}  // namespace

TEST(PsSharder, ResNet50AndBertWithinTwentyPercentOfMean) {
  for (int servers : {2, 4, 8})
    for (uint64_t part : {uint64_t{1} << 20, uint64_t{4} << 20}) {
      EXPECT_LE(imbalance(resnet50(), servers, part), 1.2) << "resnet50 servers=" << servers << " part=" << part;
      EXPECT_LE(imbalance(bert_large(), servers, part), 1.2) << "bert servers=" << servers << " part=" << part;
    }
}

TEST(PsSharder, SameAnswerForTheSamePartition) {
  Sharder s(3);
  const int a = s.assign(1, 0, 100), b = s.assign(2, 0, 100), c = s.assign(1, 4096, 100);
  EXPECT_EQ(s.assign(1, 0, 999), a);
  EXPECT_NE(a, b);
  EXPECT_NE(c, a);  // partitions of one tensor spread over servers
}

TEST(PsConfig, ParsesAndRejectsNamingTheVariable) {
  PsConfig c;
  c.set("emulate_rate", "1gbit");
  EXPECT_DOUBLE_EQ(c.emulate_rate_bps, 1e9);
  c.set("deterministic", "1");
  EXPECT_TRUE(c.deterministic);
  c.set("parallel_sum_bytes", "2MiB");
  EXPECT_EQ(c.parallel_sum_bytes, 2u << 20);
  try {
    c.set("heartbeat", "fast");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("COMMSCHED_PS_HEARTBEAT"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.set("nonsense", "1"), InvalidArgument);
  c.heartbeat_s = 5;
  EXPECT_THROW(c.validate(10.0), InvalidArgument);  // heartbeats must be well inside the peer timeout
  setenv("COMMSCHED_EMULATE_RATE", "100mbit", 1);
  EXPECT_DOUBLE_EQ(PsConfig::from_env().emulate_rate_bps, 1e8);
  unsetenv("COMMSCHED_EMULATE_RATE");
}

// COMMSCHED_PS_TRANSPORT: zmq always, ucx when built in; anything else names the variable, the value and the choices.
TEST(PsConfig, TransportIsValidatedWithAClearError) {
  PsConfig c;
  EXPECT_EQ(c.transport, "zmq");
  try {
    c.set("transport", "tcp");
    FAIL();
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("COMMSCHED_PS_TRANSPORT='tcp'"), std::string::npos) << m;
    EXPECT_NE(m.find("zmq"), std::string::npos) << m;
  }
  if (ucx_built_in()) {
    c.set("transport", "ucx");
    EXPECT_EQ(c.transport, "ucx");
  } else {
    try {
      c.set("transport", "ucx");
      FAIL();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("no UCX"), std::string::npos) << e.what();
    }
  }
  setenv("COMMSCHED_PS_TRANSPORT", "zmq", 1);
  EXPECT_EQ(PsConfig::from_env().transport, "zmq");
  setenv("COMMSCHED_PS_TRANSPORT", "rdma", 1);
  EXPECT_THROW(PsConfig::from_env(), InvalidArgument);
  unsetenv("COMMSCHED_PS_TRANSPORT");
}

TEST(PsTokenBucket, PacesToTheConfiguredRate) {
  TokenBucket b(8e6, 0);  // 1 MB/s, no burst
  const auto t0 = TokenBucket::Clock::now();
  EXPECT_EQ(b.wait_s(t0), 0.0);
  b.charge(500'000, t0);
  EXPECT_NEAR(b.wait_s(t0), 0.5, 1e-9);
  EXPECT_NEAR(b.wait_s(t0 + std::chrono::milliseconds(250)), 0.25, 1e-6);
  EXPECT_EQ(b.wait_s(t0 + std::chrono::seconds(1)), 0.0);
}
