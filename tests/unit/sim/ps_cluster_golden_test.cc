// The every-worker PS simulation keeps its results when its event machinery is made cheaper: step times of small
// cases on the real profiles, over every link model and with compression, against the values the first, slower
// implementation (one event per receipt and per sum, one callback allocated per event) computed.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "simulator/compression_model.h"
#include "simulator/ps_cluster.h"
#include "simulator/sim_policy.h"
#include "simulator/simulator.h"
#include "workload/profile.h"

namespace commsched::sim {
namespace {

constexpr uint64_t KiB = 1 << 10, MiB = 1 << 20;

struct GoldenCase {
  std::string name;
  std::string model;
  PsParams params;
  PolicyKind policy;
  Knobs knobs;
  std::string compression;  // parse_spec's text; empty: none
  std::vector<double> starts_s;  // worker 0's iteration starts, as the slower implementation computed them
  double iteration_s;            // the mean period over every worker
  friend void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.name; }
};

PsParams params(int workers, int servers, double bps, bool ingress_limited = true, bool fair = false) {
  PsParams p{workers, servers, bps, bps, 25e-6, 4 * MiB, true, ingress_limited};
  p.fair_share = fair;
  p.reply_overtakes = 0;  // these values are of the servers' arrival order (the reply rule has its own test)
  return p;
}

SimResult run(const GoldenCase& c) {
  const ModelProfile model = load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/" + c.model + ".json");
  EngineConfig config;
  config.policy = c.policy;
  config.knobs = c.knobs;
  CompressionModel compression;
  if (!c.compression.empty()) compression = measured_compression(compression::parse_spec("compression", c.compression));
  const PsNetwork net(c.params);
  SimOptions opt;
  opt.iterations = 5;
  opt.warmup = 1;
  opt.partition_bytes = c.knobs.partition_bytes;
  return simulate_each_worker(model, c.params, [&] { return make_sim_policy(config, net, false); }, opt, compression);
}

class PsClusterGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(PsClusterGolden, StepTimesMatchTheFirstImplementation) {
  const GoldenCase& c = GetParam();
  const SimResult r = run(c);
  ASSERT_EQ(r.iteration_start_s.size(), c.starts_s.size());
  for (size_t i = 0; i < c.starts_s.size(); ++i)
    EXPECT_NEAR(r.iteration_start_s[i], c.starts_s[i], 1e-12 * (1 + c.starts_s[i])) << "iteration " << i;
  EXPECT_NEAR(r.iteration_s, c.iteration_s, 1e-12 * c.iteration_s);
}

const Knobs kSmallParts{256 * KiB, 1 * MiB, 64 * KiB};

INSTANTIATE_TEST_SUITE_P(
    SmallCases, PsClusterGolden,
    ::testing::Values(
        GoldenCase{"resnet50_fifo", "resnet50", params(4, 4, 10e9), PolicyKind::bytescheduler, kSmallParts, "",
                   {0, 0.09080653100000001, 0.19063952, 0.293772171, 0.39749514500000005, 0.501218119},
                   0.10266452437500001},
        GoldenCase{"vgg16_chunked_wfbp", "vgg16", params(3, 2, 1e9), PolicyKind::wfbp, {}, "",
                   {0, 6.786939662, 13.599561360000001, 20.412183058, 27.224804756, 34.037426454000006},
                   6.812621698000001},
        GoldenCase{"bert_emulated", "bert-base", params(4, 4, 10e9, false), PolicyKind::bytescheduler,
                   {1 * MiB, 4 * MiB, 0}, "",
                   {0, 0.338360263, 0.69811025, 1.109686863, 1.51599286, 1.91013359},
                   0.39271507668750005},
        GoldenCase{"resnet50_topk", "resnet50", params(4, 4, 10e9), PolicyKind::bytescheduler, kSmallParts,
                   "topk:0.01",
                   {0, 0.092338138, 0.47604543400000005, 0.85974196, 1.243438486, 1.627135012},
                   0.3836992185},
        GoldenCase{"vgg16_fp16_mgwfbp", "vgg16", params(4, 4, 25e9), PolicyKind::mgwfbp, {}, "fp16",
                   {0, 0.303951798, 0.750973192, 1.2362910580000002, 1.721475066, 2.206659074},
                   0.47574152318750007},
        GoldenCase{"resnet50_fair", "resnet50", params(4, 4, 10e9, true, true), PolicyKind::bytescheduler,
                   {256 * KiB, 2 * MiB, 0}, "",
                   {0, 0.090618894, 0.181237788, 0.271856682, 0.362475576, 0.45309447},
                   0.090618894}),
    [](const ::testing::TestParamInfo<GoldenCase>& i) { return i.param.name; });

}  // namespace
}  // namespace commsched::sim
