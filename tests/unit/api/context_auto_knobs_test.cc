// The Context applies the automatic knobs (scheduler/auto_knobs.h) to an all-reduce backend too: two Gloo ranks as
// threads on loopback, their engine configuration after construction.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "plugins/api/context.h"
#include "scheduler/auto_knobs.h"
#include "comm_backends/control/socket.h"

namespace commsched {
namespace {

int free_port() { return control::free_port("127.0.0.1"); }

// The engine configuration each of two Gloo ranks ends up with.
std::vector<EngineConfig> gloo_configs(const EngineConfig& given) {
  const int port = free_port();
  std::vector<EngineConfig> out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      ContextOptions o;
      o.backend = "gloo";
      o.engine_config = given;
      o.cluster = ClusterEnv{};
      o.cluster->num_workers = 2;
      o.cluster->rank = o.cluster->local_rank = r;
      o.cluster->local_size = 2;
      o.cluster->root_port = port;
      o.cluster->timeout_s = 10;
      Context ctx(o);
      out[r] = ctx.engine_config();
      ctx.shutdown();
    });
  for (auto& t : threads) t.join();
  return out;
}

TEST(ContextAutoKnobs, AllReduceBackendsGetTheRingRuleWhereNothingWasSet) {
#ifndef COMMSCHED_HAVE_GLOO
  GTEST_SKIP() << "this build has no Gloo";
#endif
  const AutoKnobs want = auto_knobs({2, 0});
  for (const EngineConfig& c : gloo_configs(EngineConfig{})) {
    EXPECT_EQ(c.knobs.partition_bytes, want.knobs.partition_bytes);
    EXPECT_EQ(c.knobs.credit_bytes, 1u) << "one batch in flight";
    EXPECT_EQ(c.knobs.small_tensor_bytes, want.knobs.small_tensor_bytes);
  }
  EngineConfig set;
  set.set("credit_bytes", "32MiB");
  for (const EngineConfig& c : gloo_configs(set)) EXPECT_EQ(c.knobs.credit_bytes, 32u << 20) << "kept";
}

TEST(ContextAutoKnobs, AGivenCollectiveFusionBoundIsKept) {
#ifndef COMMSCHED_HAVE_GLOO
  GTEST_SKIP() << "this build has no Gloo";
#endif
  ::setenv("COMMSCHED_COLLECTIVE_FUSION_BYTES", "2MiB", 1);
  const std::vector<EngineConfig> configs = gloo_configs(EngineConfig{});
  ::unsetenv("COMMSCHED_COLLECTIVE_FUSION_BYTES");
  for (const EngineConfig& c : configs) EXPECT_EQ(c.knobs.small_tensor_bytes, 2u << 20);
}

}  // namespace
}  // namespace commsched
