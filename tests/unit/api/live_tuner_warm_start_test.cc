// The live tuner's warm start in a training process (plugins/api/live_tuner_warm_start.h): the link estimate, the
// backward samples and the simulated plan.
#include "plugins/api/live_tuner_warm_start.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace commsched {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

// A /sys/class/net look-alike: lo, a NIC that is down, a virtual one without a speed, and a 25 Gbit/s one.
fs::path fake_net_dir() {
  const fs::path dir = fs::path(testing::TempDir()) / "commsched_net";
  fs::remove_all(dir);
  write(dir / "lo" / "operstate", "unknown");
  write(dir / "eth0" / "operstate", "down");
  write(dir / "eth0" / "speed", "100000");
  write(dir / "veth1" / "operstate", "up");
  write(dir / "ens5" / "operstate", "up");
  write(dir / "ens5" / "speed", "25000");
  return dir;
}

TEST(LinkEstimate, EmulatedRateFirstThenTheFastestNicThatIsUpThenAssumed) {
  ::unsetenv("COMMSCHED_EMULATE_RATE");
  const LinkEstimate nic = estimate_link(fake_net_dir().string());
  EXPECT_DOUBLE_EQ(nic.rate_bps, 25e9);
  EXPECT_FALSE(nic.emulated);
  EXPECT_NE(nic.source.find("ens5"), std::string::npos) << nic.source;

  ::setenv("COMMSCHED_EMULATE_RATE", "2gbit", 1);
  const LinkEstimate emulated = estimate_link(fake_net_dir().string());
  ::unsetenv("COMMSCHED_EMULATE_RATE");
  EXPECT_DOUBLE_EQ(emulated.rate_bps, 2e9);
  EXPECT_TRUE(emulated.emulated);
  EXPECT_NE(emulated.source.find("COMMSCHED_EMULATE_RATE=2gbit"), std::string::npos) << emulated.source;

  const LinkEstimate none = estimate_link((fs::path(testing::TempDir()) / "commsched_no_such_dir").string());
  EXPECT_EQ(none.rate_bps, 0);
  EXPECT_NE(none.source.find("assumed"), std::string::npos) << none.source;
}

TEST(BackwardSamples, KeepsTheShortestBackward) {
  BackwardSamples s;
  EXPECT_FALSE(s.best());
  s.add({-1.0, -1.0});  // nothing seen: ignored
  EXPECT_FALSE(s.best());
  s.add({0.030, 0.010, 0.0});
  s.add({0.050, 0.020, 0.0});  // slower: disturbed
  ASSERT_TRUE(s.best());
  EXPECT_DOUBLE_EQ((*s.best())[0], 0.030);
  s.add({1.020, 1.010, 1.0});
  EXPECT_DOUBLE_EQ((*s.best())[0], 1.020);
}

// 40 tensors of 1 MiB, 2 ms of backward each (80 ms of backward, 40 MiB of gradients), 2 workers and 1 server.
LiveWarmStartJob forty_layers() {
  LiveWarmStartJob job;
  for (int i = 0; i < 40; ++i) {
    job.tensor_bytes.push_back(1 << 20);
    job.ready_s.push_back(0.002 * (40 - i));
  }
  job.workers = 2;
  job.servers = 1;
  return job;
}

TEST(LiveWarmStart, SimulatesTheMeasuredModelAndSaysWhatItChoseAndWhy) {
  LiveWarmStartJob job = forty_layers();
  job.link = {1e9, true, "emulated link COMMSCHED_EMULATE_RATE=1gbit"};
  job.config.knobs = Knobs{4 << 20, 16 << 20};
  const LiveWarmStart w = plan_live_warm_start(job);
  // Link-bound at 1 Gbit/s: no knobs are predicted 5% faster than these, so they come first, then the 3 candidates.
  ASSERT_EQ(w.trials.size(), 4u);
  ASSERT_EQ(w.predicted_s.size(), 4u);
  EXPECT_EQ(w.trials.front(), job.config.knobs);
  for (size_t i = 2; i < w.predicted_s.size(); ++i) EXPECT_GE(w.predicted_s[i], w.predicted_s[i - 1]);
  // 40 MiB through one server at 1 Gbit/s is at least 0.33 s per step; the compute is 0.12 s.
  EXPECT_GT(w.predicted_s[0], 0.3);
  for (const char* said : {"2 workers x 1 servers", "COMMSCHED_EMULATE_RATE=1gbit", "40 gradients", "measured backward",
                           "keeps the current partition 4 MiB", "predicted", "less than 5% faster"})
    EXPECT_NE(w.why.find(said), std::string::npos) << said << " in: " << w.why;
  job.ready_s.assign(40, -1.0);
  EXPECT_THROW(plan_live_warm_start(job), InvalidArgument) << "no gradient seen";
}

// A candidate predicted less than kWarmStartMinGain faster than the current knobs is inside the simulator's error:
// tuning starts from the current knobs (measured first, so the tuner keeps them unless a trial beats them) and the
// candidate comes next. Knobs far from the best start from the best candidate.
TEST(LiveWarmStart, StartsFromTheCurrentKnobsUnlessACandidateIsPredictedClearlyFaster) {
  LiveWarmStartJob job = forty_layers();
  job.link = {10e9, true, "emulated link COMMSCHED_EMULATE_RATE=10gbit"};  // compute-bound: the knobs matter
  job.config.knobs = Knobs{4 << 10, 4 << 10};  // 10,240 round trips one after another: far from the best
  const LiveWarmStart far = plan_live_warm_start(job);
  ASSERT_FALSE(far.trials.empty());
  EXPECT_NE(far.trials.front(), job.config.knobs);
  EXPECT_NE(far.why.find("chose"), std::string::npos) << far.why;
  EXPECT_LT(far.predicted_s.front(), 0.5) << far.why;

  job.config.knobs = far.trials.front();  // already the best the simulator knows
  const LiveWarmStart near = plan_live_warm_start(job);
  ASSERT_GE(near.trials.size(), 2u);
  EXPECT_EQ(near.trials.front(), job.config.knobs);
  EXPECT_EQ(std::count(near.trials.begin(), near.trials.end(), job.config.knobs), 1) << "tried once";
  EXPECT_EQ(near.trials.size(), near.predicted_s.size());
  EXPECT_GT(near.predicted_s[1], near.predicted_s[0] * (1 - kWarmStartMinGain));
  EXPECT_NE(near.why.find("keeps the current"), std::string::npos) << near.why;
}

// `commsched run` knows each layer's compute from its profile: the warm start simulates the profile, not a measured
// backward, on the same link and under the same rule for where tuning starts.
TEST(LiveWarmStart, SimulatesAGivenProfileInPlaceOfAMeasuredBackward) {
  LiveWarmStartJob job = forty_layers();
  job.link = {1e9, true, "emulated link COMMSCHED_EMULATE_RATE=1gbit"};
  job.config.knobs = Knobs{4 << 20, 16 << 20};
  const LiveWarmStart measured = plan_live_warm_start(job);

  std::vector<sim::TensorProfile> tensors;
  for (int i = 0; i < 40; ++i)  // the same gradients, with 20 ms of backward each: 10x the measured compute
    tensors.push_back({"t" + std::to_string(i), i, DType::f32, (1 << 20) / 4, 10'000'000, 20'000'000});
  job.profile = sim::make_profile("forty", std::move(tensors));
  job.ready_s.assign(40, -1.0);  // no backward seen: the profile is enough
  const LiveWarmStart given = plan_live_warm_start(job);
  ASSERT_FALSE(given.predicted_s.empty());
  // 1.2 s of compute per step: far more than the 0.12 s measured, and more than the link's 0.33 s.
  EXPECT_GT(given.predicted_s.front(), 1.2);
  EXPECT_LT(measured.predicted_s.front(), 1.0);
  for (const char* said : {"the profile's compute 1200.0 ms", "40 gradients", "2 workers x 1 servers"})
    EXPECT_NE(given.why.find(said), std::string::npos) << said << " in: " << given.why;
  EXPECT_EQ(given.why.find("measured backward"), std::string::npos) << given.why;
}

}  // namespace
}  // namespace commsched
