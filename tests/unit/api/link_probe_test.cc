// The link measured at startup (plugins/api/link_probe.h): the arithmetic on a modelled link, the agreement on rank
// 0's numbers, the refusals, the warm start taking the probe's numbers, and the exchange through real engines.
#include "plugins/api/link_probe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm_backends/loopback/loopback_backend.h"
#include "scheduler/priority_credit_policy.h"
#include "simulator/warm_start.h"

namespace commsched {
namespace {

// A link whose reduce of b bytes takes `fixed_s` plus the busiest link's bytes at `rate_bps`, as the probe models it.
struct ModelledLink {
  ProbeShape shape;
  double rate_bps = 200e6;
  double fixed_s = 200e-6;
  std::vector<uint64_t> sizes;  // every reduce, in order

  ProbeExchange exchange() {
    ProbeExchange x;
    x.leader = true;
    x.reduce = [this](uint64_t b) {
      sizes.push_back(b);
      return fixed_s + 8.0 * busiest_link_bytes_per_byte(shape, b) * double(b) / rate_bps;
    };
    x.share = [](std::span<int64_t>) {};  // rank 0's words are its own
    return x;
  }
};

ProbeShape ps_shape(int workers, int servers, uint64_t partition) { return {true, workers, servers, partition}; }

TEST(LinkProbe, RecoversTheRateAndLatencyOfAModelledParameterServer) {
  ModelledLink link;
  link.shape = ps_shape(4, 2, 256 << 10);
  const LinkMeasurement m = measure_link(link.shape, link.exchange());
  EXPECT_NEAR(m.rate_bps, 200e6, 200e6 * 1e-3);
  EXPECT_NEAR(m.latency_s, 100e-6, 1e-6) << "half a one-message push_pull";
  // The pilot is a partition per server; the bandwidth tensor a whole number of them, at least 4, at most 16 MiB.
  const uint64_t large = link.sizes.back();
  EXPECT_EQ(link.sizes.at(8), 2u * (256 << 10)) << "the pilot, after 8 latency rounds";
  EXPECT_EQ(large % (2 * (256 << 10)), 0u) << large;
  EXPECT_GE(large, 4u * 2 * (256 << 10));
  EXPECT_LE(large, 16u << 20);
  EXPECT_EQ(link.sizes.front(), 4u) << "the latency rounds reduce one float";
  for (const char* said : {"200 Mbit/s", "push_pull", "over 2 servers", "latency 100 us per message"})
    EXPECT_NE(m.how.find(said), std::string::npos) << said << " in: " << m.how;
}

// A rate a hair under 1 Gbit/s (as an emulated 1 Gbit/s link measures) is a plain number in the line, not "1e+03".
TEST(LinkProbe, ARateJustUnderAGigabitReadsAsAPlainNumber) {
  ModelledLink link;
  link.shape = ps_shape(2, 1, 1 << 20);
  link.rate_bps = 999.8e6;
  const LinkMeasurement m = measure_link(link.shape, link.exchange());
  EXPECT_NEAR(m.rate_bps, 999.8e6, 999.8e6 * 1e-3);
  EXPECT_EQ(m.how.find("e+"), std::string::npos) << m.how;
  EXPECT_NE(m.how.find("1000 Mbit/s"), std::string::npos) << m.how;
}

TEST(LinkProbe, RecoversTheRateAndLatencyOfAModelledRing) {
  ModelledLink link;
  link.shape = {false, 4, 0, 4 << 20};
  link.rate_bps = 5e9;
  link.fixed_s = 600e-6;
  const LinkMeasurement m = measure_link(link.shape, link.exchange());
  EXPECT_NEAR(m.rate_bps, 5e9, 5e9 * 1e-3);
  EXPECT_NEAR(m.latency_s, 100e-6, 1e-7) << "a one-float all-reduce's 2(W - 1) steps";
  EXPECT_DOUBLE_EQ(busiest_link_bytes_per_byte(link.shape, 1 << 20), 1.5);
  // About 30 ms more than the pilot (256 KiB): 5 Gbit/s x 1.5 gives 12.5 MB in 30 ms.
  const double extra_s = 8.0 * 1.5 * double(link.sizes.back() - (256 << 10)) / link.rate_bps;
  EXPECT_GT(extra_s, 0.02);
  EXPECT_LT(extra_s, 0.04);
}

TEST(LinkProbe, ThePartitionsAndServersSetTheBusiestLinksShare) {
  EXPECT_DOUBLE_EQ(busiest_link_bytes_per_byte(ps_shape(2, 1, 256 << 10), 4 << 20), 2.0);
  EXPECT_DOUBLE_EQ(busiest_link_bytes_per_byte(ps_shape(4, 4, 256 << 10), 4 << 20), 1.0);
  EXPECT_DOUBLE_EQ(busiest_link_bytes_per_byte(ps_shape(4, 2, 0), 4 << 20), 4.0) << "not split: one server has it all";
  EXPECT_DOUBLE_EQ(busiest_link_bytes_per_byte(ps_shape(8, 4, 1 << 20), 2 << 20), 4.0) << "two partitions, two servers";
}

// Every rank plans with rank 0's numbers, whatever it timed itself.
TEST(LinkProbe, AnotherRankTakesRankZerosNumbers) {
  ModelledLink link;
  link.shape = ps_shape(2, 1, 256 << 10);
  ProbeExchange x = link.exchange();
  x.leader = false;
  int shares = 0;
  x.share = [&](std::span<int64_t> w) {
    if (shares++ == 0) {
      w[0] = 4 << 20;  // rank 0's bandwidth tensor
    } else {
      w[0] = 1'000'000'000, w[1] = 42'000;  // rank 0's rate (1 Gbit/s) and latency (42 us)
    }
  };
  const LinkMeasurement m = measure_link(link.shape, x);
  EXPECT_EQ(link.sizes.back(), 4u << 20) << "the size rank 0 chose";
  EXPECT_DOUBLE_EQ(m.rate_bps, 1e9);
  EXPECT_DOUBLE_EQ(m.latency_s, 42e-6);
}

TEST(LinkProbe, AnUntimeableLinkOrAMalformedShareIsRefused) {
  ProbeExchange flat;
  flat.leader = true;
  flat.reduce = [](uint64_t) { return 1e-3; };  // a big reduce no slower than a small one
  flat.share = [](std::span<int64_t>) {};
  try {
    measure_link(ps_shape(2, 1, 256 << 10), flat);
    FAIL() << "a flat link was measured";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("could not time the link"), std::string::npos) << e.what();
  }
  ProbeExchange bad = flat;
  bad.leader = false;
  bad.share = [](std::span<int64_t> w) { w[0] = (1 << 20) + 3; };  // not a whole float
  EXPECT_THROW(measure_link(ps_shape(2, 1, 256 << 10), bad), std::runtime_error);
}

// On a fast link one disturbed round can make the sized tensor look no slower than the pilot: rank 0 asks every rank
// once more with the largest tensor (16 MiB), and measures from that.
TEST(LinkProbe, ASecondTryWithTheLargestTensorWhenTheFirstCouldNotBeTimed) {
  ModelledLink link;
  link.shape = {false, 2, 0, 4 << 20};
  link.rate_bps = 2e9;  // the first sized tensor: about 7 MiB, 30 ms more than the pilot
  ProbeExchange x = link.exchange();
  const auto timed = x.reduce;
  const double pilot_s = link.fixed_s + 8.0 * double(256 << 10) / link.rate_bps;  // the ring's 256 KiB pilot
  x.reduce = [&, timed](uint64_t b) {
    const double t = timed(b);
    // The rounds of the first sized tensor (after 8 latency and 4 pilot rounds) took no longer than the pilot.
    return link.sizes.size() > 12 && link.sizes.size() <= 16 ? pilot_s : t;
  };
  const LinkMeasurement m = measure_link(link.shape, x);
  EXPECT_EQ(link.sizes.back(), 16u << 20);
  EXPECT_NEAR(m.rate_bps, 2e9, 2e9 * 1e-3);
  EXPECT_NE(m.how.find("16 MiB"), std::string::npos) << m.how;
}

// The warm start simulates the probe's rate and latency, not the estimate, and its log line says so.
TEST(LinkProbe, TheWarmStartTakesTheProbesNumbers) {
  ModelledLink link;
  link.shape = ps_shape(2, 1, 256 << 10);
  link.rate_bps = 300e6;
  link.fixed_s = 2e-3;  // 1 ms one way
  const LinkEstimate estimate{1e9, true, "emulated link COMMSCHED_EMULATE_RATE=1gbit"};
  const LinkEstimate measured = measured_link(estimate, measure_link(link.shape, link.exchange()));
  EXPECT_TRUE(measured.measured);
  EXPECT_TRUE(measured.emulated) << "the transport's pacing is the estimate's to say";

  LiveWarmStartJob job;
  for (int i = 0; i < 20; ++i) {
    job.tensor_bytes.push_back(1 << 20);
    job.ready_s.push_back(0.002 * (20 - i));
  }
  job.workers = 2;
  job.servers = 1;
  job.config.knobs = Knobs{256 << 10, 1536 << 10};
  job.link = measured;
  const LiveWarmStart with_probe = plan_live_warm_start(job);

  sim::WarmStartJob w;
  w.workers = 2;
  w.servers = 1;
  w.link_bps = measured.rate_bps;
  w.latency_s = measured.latency_s;
  w.emulated_links = true;
  w.base = job.config;
  const sim::WarmStartPlan direct = sim::plan_warm_start(sim::measured_profile(job.tensor_bytes, job.ready_s), w, 3);
  // The same candidates in the same order; the current knobs first when none is predicted clearly faster.
  const bool keeps = direct.ranked.front().predicted_s > direct.current.predicted_s * (1 - kWarmStartMinGain);
  const size_t first = keeps ? 1 : 0;
  if (keeps) {
    EXPECT_EQ(with_probe.trials.front(), job.config.knobs);
  }
  std::vector<sim::WarmStartCandidate> want;
  for (const auto& c : direct.ranked)
    if (!keeps || c.knobs != job.config.knobs) want.push_back(c);
  ASSERT_EQ(with_probe.predicted_s.size(), want.size() + first);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(with_probe.predicted_s[first + i], want[i].predicted_s, 1e-9) << i;
    EXPECT_EQ(with_probe.trials[first + i], want[i].knobs) << i;
  }
  EXPECT_NE(with_probe.why.find("link measured at startup: 300 Mbit/s"), std::string::npos) << with_probe.why;
  EXPECT_NE(with_probe.why.find("latency 1 ms per message"), std::string::npos) << with_probe.why;
  EXPECT_EQ(with_probe.why.find("assumed"), std::string::npos) << with_probe.why;

  job.link = estimate;  // not measured: the estimate, and the simulator's latency, said to be assumed
  const LiveWarmStart without = plan_live_warm_start(job);
  EXPECT_LT(without.predicted_s.front(), with_probe.predicted_s.front()) << "1 Gbit/s is faster than 300 Mbit/s";
  EXPECT_NE(without.why.find("link estimated (emulated link COMMSCHED_EMULATE_RATE=1gbit)"), std::string::npos)
      << without.why;
  EXPECT_NE(without.why.find("latency assumed 25 us per message"), std::string::npos) << without.why;
}

// Through real engines over the loopback backend (ranks as threads), whose link sends at 200 Mbit/s: both ranks
// agree on one measurement, and it finds the link's rate (the loopback's sends are its only limit).
TEST(LinkProbe, MeasuresALoopbackLinkThroughTheEngines) {
  auto backends = make_loopback_group(2, LinkModel{200e6, 50e-6});
  EngineConfig cfg;
  cfg.knobs = Knobs{256 << 10, 4 << 20};
  std::vector<std::unique_ptr<Engine>> engines;
  for (auto& b : backends) engines.push_back(std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(cfg.knobs.credit_bytes), b, cfg));
  const ProbeShape ring{false, 2, 0, cfg.knobs.partition_bytes};
  LinkMeasurement got[2];
  std::string errors[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        got[r] = measure_link(ring, engine_exchange(*engines[r], Op::allreduce, std::chrono::seconds(20)));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_EQ(got[0].rate_bps, got[1].rate_bps) << "rank 0's numbers, on every rank";
  EXPECT_EQ(got[0].latency_s, got[1].latency_s);
  // A loaded machine only delays deliveries (slower), never speeds the link up.
  EXPECT_GT(got[0].rate_bps, 0.4 * 200e6) << got[0].how;
  EXPECT_LT(got[0].rate_bps, 1.15 * 200e6) << got[0].how;
  EXPECT_GT(got[0].latency_s, 0.0);
}

}  // namespace
}  // namespace commsched
