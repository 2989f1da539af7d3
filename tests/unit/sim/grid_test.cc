#include "simulator/grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <tuple>

#include "compression/codec.h"
#include "scheduler/policy_factory.h"
#include "simulator/report.h"
#include "simulator/row_label.h"
#include "simulator/sim_policy.h"
#include "workload/profile.h"
#include "tests/unit/sim/sim_test_util.h"

namespace commsched::sim {
namespace {

GridSpec small_spec() {
  GridSpec s;
  s.models = {testing::vgg_like()};
  s.bandwidths_bps = {5e9, 50e9};
  s.grid("partition_bytes") = {1 << 20, 4 << 20};
  s.grid("credit_bytes") = {1, 4};
  s.grid("small_tensor_bytes") = {0};
  return s;
}

TEST(RowLabel, NamesAndReadsBackEveryKnobSource) {
  for (KnobSource k : {KnobSource::given, KnobSource::automatic, KnobSource::tuned}) {
    const RowLabel row = parse_row(row_name("bytescheduler", k));
    EXPECT_EQ(row.policy, "bytescheduler");
    EXPECT_EQ(row.knobs, k);
  }
  EXPECT_EQ(row_name("wfbp", KnobSource::automatic), "wfbp-auto");
  EXPECT_EQ(row_name("bytescheduler", KnobSource::tuned), "bytescheduler+tune");
  EXPECT_EQ(auto_row_label(PolicyKind::fusion), "fusion-auto");
  EXPECT_EQ(parse_row("mg-wfbp").policy, "mg-wfbp");  // a hyphen inside a policy's name is not a suffix
  EXPECT_EQ(parse_row("mg-wfbp").knobs, KnobSource::given);
}

TEST(Grid, ReportsEveryCellWithSpeedupsOverWfbp) {
  const GridSpec spec = small_spec();
  const auto cells = run_grid(spec);
  // Every policy, plus the scheduler at its automatic knobs, in both cells.
  ASSERT_EQ(cells.size(), 2 * (spec.policies.size() + 1));
  EXPECT_EQ(std::count_if(cells.begin(), cells.end(), [](const CellResult& c) { return c.policy == kAutoKnobsRow; }), 2);
  for (const CellResult& c : cells) {
    EXPECT_GT(c.iteration_s, 0);
    EXPECT_GE(c.iteration_s, c.lower_bound_s * (1 - 1e-9)) << c.policy;
    if (c.policy == "wfbp") {
      EXPECT_DOUBLE_EQ(c.speedup_vs_wfbp, 1.0);
    }
    if (c.policy == "bytescheduler") {
      EXPECT_NE(c.knobs.find("partition"), std::string::npos);
    }
    if (c.policy == kAutoKnobsRow) {  // 8 workers x 8 servers: 128 KiB at 5 Gbit/s, 512 KiB at 50, credit 18 of them
      const uint64_t partition = c.bandwidth_bps < 10e9 ? 128u << 10 : 512u << 10;
      EXPECT_EQ(c.config.knobs.partition_bytes, partition) << c.bandwidth_bps;
      EXPECT_EQ(c.config.knobs.credit_bytes, 18u * partition);
      EXPECT_NE(c.knobs.find("(automatic)"), std::string::npos) << c.knobs;
    }
  }
}

// The grid reads the policy registry: every registered policy is a row by default, a policy gets an automatic-knobs
// row exactly when its registry entry reads a knob, and each row's knobs are the options its entry lists.
TEST(Grid, PoliciesAndTheirKnobsComeFromTheRegistry) {
  GridSpec spec = small_spec();
  spec.bandwidths_bps = {5e9};
  EXPECT_EQ(spec.policies, all_policies());
  const auto cells = run_grid(spec);
  size_t auto_rows = 0;
  for (const PolicyInfo& info : policy_registry()) {
    const PolicyKind kind(info.name);
    const bool reads_knobs = std::find(info.options.begin(), info.options.end(), "partition_bytes") != info.options.end();
    EXPECT_EQ(has_auto_knobs(kind), reads_knobs) << info.name;
    auto_rows += has_auto_knobs(kind);
    const auto row = std::find_if(cells.begin(), cells.end(), [&](const CellResult& c) { return c.policy == info.name; });
    ASSERT_NE(row, cells.end()) << info.name;
    EXPECT_EQ(row->config.policy, kind);
    const bool has_auto_row = std::any_of(cells.begin(), cells.end(),
                                          [&](const CellResult& c) { return c.policy == auto_row_label(kind); });
    EXPECT_EQ(has_auto_row, has_auto_knobs(kind)) << info.name;
    // A searched knob shows in the row's label only when the policy reads it.
    EXPECT_EQ(row->knobs.find("partition") != std::string::npos, reads_knobs) << info.name << ": " << row->knobs;
  }
  EXPECT_EQ(cells.size(), spec.policies.size() + auto_rows);
  const auto fusion = std::find_if(cells.begin(), cells.end(), [](const CellResult& c) { return c.policy == "fusion"; });
  ASSERT_NE(fusion, cells.end());
  EXPECT_EQ(fusion->knobs, "threshold 64 MiB, cycle 5ms");
}

TEST(Grid, EveryPolicyThatReadsKnobOptionsIsSearchedOverTheirProduct) {
  GridSpec spec = small_spec();
  spec.grid("partition_bytes") = {1 << 20};
  spec.grid("credit_bytes") = {0};
  spec.grid("small_tensor_bytes") = {0};
  // With one value per axis the search has one candidate: exactly those values.
  const CellResult one = run_cell(spec, spec.models[0], 5e9, 8, PolicyKind::bytescheduler);
  EXPECT_EQ(one.config.knobs.partition_bytes, 1u << 20);
  EXPECT_EQ(one.config.knobs.credit_bytes, 1u);
  EXPECT_EQ(one.knobs, "partition 1 MiB, credit one batch in flight, small_tensor off");
  // A policy that reads none of them ignores the axes.
  const CellResult wfbp = run_cell(spec, spec.models[0], 5e9, 8, PolicyKind::wfbp);
  EXPECT_EQ(wfbp.knobs, "");
  EXPECT_EQ(wfbp.config.knobs.partition_bytes, spec.base.knobs.partition_bytes);
}

TEST(Grid, TargetCheckJudgesTheSchedulerAtItsAutomaticKnobs) {
  std::vector<CellResult> cell(3);
  cell[0].policy = std::string(kAutoKnobsRow);
  cell[0].iteration_s = 1.2;
  cell[0].lower_bound_s = cell[0].dependency_bound_s = 1.0;
  cell[1].policy = "bytescheduler";  // the best of the grid: faster, but not what a user gets by default
  cell[1].iteration_s = 1.0;
  cell[2].policy = "wfbp";
  cell[2].iteration_s = 1.5;
  const TargetCheck t = check_targets(cell);
  ASSERT_TRUE(t.have);
  EXPECT_EQ(t.best_baseline, "wfbp");  // the grid's bytescheduler row is no baseline
  EXPECT_DOUBLE_EQ(t.vs_best_baseline, 1.5 / 1.2);
  EXPECT_DOUBLE_EQ(t.vs_lower_bound, 1.2);
}

TEST(Grid, BytescheduluerIsTheBestOfItsKnobGrid) {
  GridSpec spec = small_spec();
  const CellResult best = run_cell(spec, spec.models[0], 5e9, 8, PolicyKind::bytescheduler);
  spec.grid("partition_bytes") = {4 << 20};
  spec.grid("credit_bytes") = {1};
  const CellResult one = run_cell(spec, spec.models[0], 5e9, 8, PolicyKind::bytescheduler);
  EXPECT_LE(best.iteration_s, one.iteration_s);
}

// The search abandons candidates that are sure to be slower than the best so far and, with every PS worker simulated,
// tries them in the order the symmetric model predicts: it still reports the candidate a full, ordered run of the
// whole grid ranks first (the first in grid order among equals), with the same time.
TEST(Grid, AbandoningSlowCandidatesKeepsTheBestOfTheGrid) {
  GridSpec spec;
  spec.models = {load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/resnet50.json")};
  spec.ps_each_worker_max = 8;
  spec.sim.iterations = 5;
  spec.sim.warmup = 2;
  spec.grid("partition_bytes") = {256 << 10, 1 << 20, 4 << 20};
  spec.grid("credit_bytes") = {0, 2, 8};
  spec.grid("small_tensor_bytes") = {0, 64 << 10};
  for (int workers : {4, 8}) {
    const CellResult best = run_cell(spec, spec.models[0], 10e9, workers, PolicyKind::bytescheduler);
    const std::vector<CellResult> ranked =
        rank_candidates(spec, spec.models[0], 10e9, workers, PolicyKind::bytescheduler);
    EXPECT_EQ(best.knobs, ranked.front().knobs) << workers << " workers";
    EXPECT_EQ(best.iteration_s, ranked.front().iteration_s) << workers << " workers";
  }
}

TEST(Simulator, AbandonsARunOnceItsPeriodIsSureToExceedTheLimit) {
  const ModelProfile m = load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/resnet50.json");
  const PsParams p{4, 4, 10e9, 10e9, 25e-6, 4 << 20, true, true};
  const PsNetwork net(p);
  EngineConfig config;
  config.policy = PolicyKind::wfbp;
  SimOptions o;
  const SimResult full = simulate_each_worker(m, p, [&] { return make_sim_policy(config, net, false); }, o);
  ASSERT_FALSE(full.abandoned);
  o.abandon_above_s = full.iteration_s * 0.5;
  const SimResult cut = simulate_each_worker(m, p, [&] { return make_sim_policy(config, net, false); }, o);
  EXPECT_TRUE(cut.abandoned);
  EXPECT_GT(cut.iteration_s, o.abandon_above_s);
  EXPECT_LE(cut.iteration_s, full.iteration_s * (1 + 1e-9));  // a lower bound of the period
  EXPECT_LT(cut.iteration_start_s.size(), full.iteration_start_s.size());
  o.abandon_above_s = full.iteration_s * 1.001;
  EXPECT_FALSE(simulate_each_worker(m, p, [&] { return make_sim_policy(config, net, false); }, o).abandoned);
}

// The bound abandoning stops on (what is left of each worker's compute and of the pushes its iterations still owe)
// never exceeds the period the run reports, on every link model, with compression and with symmetric workers: a run
// given exactly its own period as the limit finishes. It is tighter than the time since the first measured start:
// a run 5% over the limit stops in its fifth measured iteration, not its last.
TEST(Simulator, AbandonsEarlyButNeverARunAtOrBelowTheLimit) {
  const ModelProfile m = load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/resnet50.json");
  EngineConfig config;
  config.policy = PolicyKind::bytescheduler;
  config.knobs = {256 << 10, 1 << 20, 64 << 10};
  SimOptions o;
  o.iterations = 12;
  o.warmup = 4;
  o.partition_bytes = config.knobs.partition_bytes;
  struct Case {
    const char* name;
    PsParams params;
    const char* compression;
  };
  PsParams fifo{4, 4, 10e9, 10e9, 25e-6, 4 << 20, true, true};
  PsParams fair = fifo, emulated = fifo;
  fair.fair_share = true;
  emulated.server_ingress_limited = false;
  for (const Case& c : {Case{"fifo", fifo, ""}, Case{"fair", fair, ""}, Case{"emulated", emulated, ""},
                        Case{"fifo fp16", fifo, "fp16"}}) {
    const PsNetwork net(c.params);
    const CompressionModel comp =
        *c.compression ? measured_compression(compression::parse_spec("compression", c.compression)) : CompressionModel{};
    auto run = [&](double limit) {
      SimOptions with = o;
      with.abandon_above_s = limit;
      return simulate_each_worker(m, c.params, [&] { return make_sim_policy(config, net, false); }, with, comp);
    };
    const SimResult full = run(0);
    const SimResult at = run(full.iteration_s);
    EXPECT_FALSE(at.abandoned) << c.name;
    EXPECT_EQ(at.iteration_s, full.iteration_s) << c.name;
    if (std::string(c.name) != "fifo") continue;
    const SimResult cut = run(full.iteration_s / 1.05);
    EXPECT_TRUE(cut.abandoned);
    // The former bound, now minus the first measured start, passed this limit only in the last measured iteration.
    EXPECT_LE(cut.iteration_start_s.size(), size_t(o.warmup + 6)) << "stopped in iteration " << cut.iteration_start_s.size() - 1;
  }
  PsNetwork symmetric({16, 16, 10e9, 10e9, 25e-6, 4 << 20, true, true});
  auto policy = [&] { return make_sim_policy(config, symmetric); };
  const SimResult full = simulate(m, symmetric, *policy(), o);
  SimOptions at = o;
  at.abandon_above_s = full.iteration_s;
  const SimResult same = simulate(m, symmetric, *policy(), at);
  EXPECT_FALSE(same.abandoned);
  EXPECT_EQ(same.iteration_s, full.iteration_s);
}

// Every worker's tasks are cut once per run, so policies that cut them differently cannot share one.
TEST(Simulator, RefusesWorkersWhosePoliciesSplitTasksDifferently) {
  const ModelProfile m = load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/resnet50.json");
  const PsParams p{2, 2, 10e9, 10e9, 25e-6, 4 << 20, true, true};
  const PsNetwork net(p);
  int made = 0;
  auto mixed = [&] {
    EngineConfig c;
    c.policy = made++ == 0 ? PolicyKind::bytescheduler : PolicyKind::wfbp;
    return make_sim_policy(c, net, false);
  };
  EXPECT_THROW(simulate_each_worker(m, p, mixed, SimOptions{}), InvalidArgument);
}

TEST(Grid, TunedKnobsComeFromTheBayesianOptimiserAndAreReplayedInTimelines) {
  GridSpec spec = small_spec();
  spec.tune_trials = 8;
  spec.policies = {PolicyKind::bytescheduler};
  const CellResult tuned = run_cell(spec, spec.models[0], 5e9, 8, PolicyKind::bytescheduler);
  EXPECT_NE(tuned.knobs.find("(tuned)"), std::string::npos) << tuned.knobs;
  EXPECT_GE(tuned.config.knobs.partition_bytes, uint64_t(spec.tune_bounds["partition_bytes"].min));
  EXPECT_LE(tuned.config.knobs.partition_bytes, uint64_t(spec.tune_bounds["partition_bytes"].max));
  EXPECT_EQ(run_cell(spec, spec.models[0], 5e9, 8, PolicyKind::bytescheduler).iteration_s, tuned.iteration_s)
      << "deterministic for a fixed seed";
  const auto timelines = run_timelines(spec, spec.models[0], 5e9, 8, {tuned});
  ASSERT_EQ(timelines.size(), 1u);
  EXPECT_EQ(timelines[0].knobs, tuned.knobs);  // the tuned configuration, not the grid's first
}

TEST(Grid, WritersProduceTablesAndTimelines) {
  const GridSpec spec = small_spec();
  const auto cells = run_grid(spec);
  std::ostringstream csv, md, tl;
  write_csv(csv, cells);
  write_markdown(md, cells, "t");
  const std::string csv_text = csv.str();
  EXPECT_EQ(std::count(csv_text.begin(), csv_text.end(), '\n'), long(cells.size() + 1));
  EXPECT_NE(md.str().find("| 5 Gbit/s | 8 |"), std::string::npos) << md.str();
  const auto timelines = run_timelines(spec, spec.models[0], 5e9, 8, cells);
  ASSERT_EQ(timelines.size(), spec.policies.size());
  for (const auto& t : timelines) EXPECT_FALSE(t.spans.empty()) << t.policy;
  write_timelines(tl, "vgg-like", 5e9, 8, timelines);
  EXPECT_NE(tl.str().find("\"lane\":\"comm\""), std::string::npos);
}

// The grid keeps the timelines of its timeline cell's rows as it runs them, so run_timelines simulates nothing
// again; they are what a run again shows, span for span.
TEST(Grid, KeptTimelinesAreThoseOfARunAgain) {
  GridSpec spec = small_spec();
  const auto again = run_timelines(spec, spec.models[0], 5e9, 8, run_grid(spec));
  spec.timeline_bandwidth_bps = 5e9;
  spec.timeline_workers = 8;
  const auto cells = run_grid(spec);
  for (const CellResult& c : cells)
    EXPECT_EQ(c.timeline.has_value(), c.bandwidth_bps == 5e9 && c.policy != kAutoKnobsRow) << c.policy;
  const auto kept = run_timelines(spec, spec.models[0], 5e9, 8, cells);
  ASSERT_EQ(kept.size(), again.size());
  auto fields = [](const Span& s) {
    return std::tuple(s.lane, s.iteration, s.start, s.end, s.first_priority, s.last_priority, s.bytes, s.parts);
  };
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].policy, again[i].policy);
    EXPECT_EQ(kept[i].knobs, again[i].knobs);
    EXPECT_EQ(kept[i].iteration_start_s, again[i].iteration_start_s) << kept[i].policy;
    ASSERT_EQ(kept[i].spans.size(), again[i].spans.size()) << kept[i].policy;
    EXPECT_FALSE(kept[i].spans.empty()) << kept[i].policy;
    for (size_t j = 0; j < kept[i].spans.size(); ++j)
      ASSERT_EQ(fields(kept[i].spans[j]), fields(again[i].spans[j])) << kept[i].policy << " span " << j;
  }
}

TEST(Grid, TargetCheckComparesWithTheBestBaseline) {
  std::vector<CellResult> cell(3);
  cell[0].policy = "bytescheduler";
  cell[0].iteration_s = 1.0;
  cell[0].lower_bound_s = 0.95;
  cell[0].dependency_bound_s = 0.98;
  cell[1].policy = "wfbp";
  cell[1].iteration_s = 1.5;
  cell[2].policy = "bsp";
  cell[2].iteration_s = 0.99;
  const TargetCheck t = check_targets(cell);
  ASSERT_TRUE(t.have);
  EXPECT_EQ(t.best_baseline, "bsp");
  EXPECT_DOUBLE_EQ(t.vs_best_baseline, 0.99);
  EXPECT_NEAR(t.vs_lower_bound, 1.0 / 0.95, 1e-12);
}

}  // namespace
}  // namespace commsched::sim
