#include <gtest/gtest.h>

#include <cstdlib>

#include "scheduler/config.h"
#include "scheduler/policy_factory.h"

namespace commsched {
namespace {

// Asserts that `fn` throws InvalidArgument whose message contains every needle.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<const char*> needles) {
  try {
    fn();
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

TEST(Config, SizesTakeUnits) {
  EXPECT_EQ(parse_bytes("X", "4MiB"), 4u << 20);
  EXPECT_EQ(parse_bytes("X", "512KiB"), 512u << 10);
  EXPECT_EQ(parse_bytes("X", "1.5MB"), 1500000u);
  EXPECT_EQ(parse_bytes("X", "4096"), 4096u);
  EXPECT_EQ(parse_bytes("X", " 2 GiB "), 2ull << 30);
  EXPECT_EQ(parse_bytes("X", "unlimited", true), 0u);
}

TEST(Config, BadSizesNameVariableValueAndAllowed) {
  expect_error([] { parse_bytes("COMMSCHED_PARTITION_BYTES", "4XB"); }, {"COMMSCHED_PARTITION_BYTES", "4XB", "MiB"});
  expect_error([] { parse_bytes("COMMSCHED_CREDIT_BYTES", "-1", true); }, {"COMMSCHED_CREDIT_BYTES", "-1"});
  expect_error([] { parse_bytes("COMMSCHED_CREDIT_BYTES", "0", true); }, {"COMMSCHED_CREDIT_BYTES", "'0'", "unlimited"});
  expect_error([] { parse_bytes("V", ""); }, {"V"});
  expect_error([] { parse_bytes("V", "inf"); }, {"V", "inf"});
}

TEST(Config, RatesDurationsIntsBools) {
  EXPECT_DOUBLE_EQ(parse_rate_bps("R", "1Gbit"), 1e9);
  EXPECT_DOUBLE_EQ(parse_rate_bps("R", "25gbps"), 25e9);
  EXPECT_DOUBLE_EQ(parse_rate_bps("R", "100M"), 1e8);
  EXPECT_DOUBLE_EQ(parse_seconds("D", "1.5ms"), 1.5e-3);
  EXPECT_DOUBLE_EQ(parse_seconds("D", "5us"), 5e-6);
  EXPECT_EQ(parse_int("I", "42", 0, 100), 42);
  EXPECT_TRUE(parse_bool("B", "yes"));
  expect_error([] { parse_rate_bps("COMMSCHED_RATE", "fast"); }, {"COMMSCHED_RATE", "fast", "Gbit"});
  expect_error([] { parse_int("N", "101", 0, 100); }, {"N", "101", "[0, 100]"});
  expect_error([] { parse_int("N", "4x", 0, 100); }, {"N", "4x"});
  expect_error([] { parse_bool("B", "maybe"); }, {"B", "maybe"});
}

TEST(Config, EngineOptionsAndEnvironment) {
  EngineConfig c;
  c.set("policy", "wfbp");
  c.set("partition_bytes", "1MiB");
  EXPECT_EQ(c.policy, PolicyKind::wfbp);
  EXPECT_EQ(c.knobs.partition_bytes, 1u << 20);
  expect_error([&] { c.set("policy", "magic"); }, {"COMMSCHED_POLICY", "magic", "bytescheduler"});
  expect_error([&] { c.set("colour", "blue"); }, {"colour", "allowed"});

  ::setenv("COMMSCHED_CREDIT_BYTES", "8MiB", 1);
  ::setenv("COMMSCHED_POLICY", "bytescheduler", 1);
  const EngineConfig e = EngineConfig::from_env();
  EXPECT_EQ(e.knobs.credit_bytes, 8u << 20);
  ::setenv("COMMSCHED_CREDIT_BYTES", "lots", 1);
  expect_error([] { EngineConfig::from_env(); }, {"COMMSCHED_CREDIT_BYTES", "lots"});
  ::unsetenv("COMMSCHED_CREDIT_BYTES");
  ::unsetenv("COMMSCHED_POLICY");
}

// BytePS job files keep their tuning: its partition is bytes as ours, its credit counts partitions; COMMSCHED_* wins.
TEST(Config, BytepsKnobsAreHonouredBelowCommschedNames) {
  ::setenv("BYTEPS_PARTITION_BYTES", "4096000", 1);
  ::setenv("BYTEPS_SCHEDULING_CREDIT", "4", 1);
  EngineConfig e = EngineConfig::from_env();
  EXPECT_EQ(e.knobs.partition_bytes, 4096000u);
  EXPECT_EQ(e.knobs.credit_bytes, 4u * 4096000u);
  EXPECT_TRUE(e.partition_set && e.credit_set) << "given knobs are not replaced by the automatic ones";
  ::setenv("COMMSCHED_PARTITION_BYTES", "1MiB", 1);
  e = EngineConfig::from_env();
  EXPECT_EQ(e.knobs.partition_bytes, 1u << 20);
  EXPECT_EQ(e.knobs.credit_bytes, 4u << 20) << "the credit counts commsched's partitions";
  ::setenv("COMMSCHED_CREDIT_BYTES", "3MiB", 1);
  EXPECT_EQ(EngineConfig::from_env().knobs.credit_bytes, 3u << 20);
  ::unsetenv("COMMSCHED_CREDIT_BYTES");
  ::unsetenv("COMMSCHED_PARTITION_BYTES");
  ::unsetenv("BYTEPS_PARTITION_BYTES");
  expect_error([] { EngineConfig::from_env(); }, {"BYTEPS_SCHEDULING_CREDIT=4", "COMMSCHED_CREDIT_BYTES"});
  ::setenv("BYTEPS_SCHEDULING_CREDIT", "many", 1);
  expect_error([] { EngineConfig::from_env(); }, {"BYTEPS_SCHEDULING_CREDIT", "many"});
  ::unsetenv("BYTEPS_SCHEDULING_CREDIT");
  ::setenv("BYTEPS_PARTITION_BYTES", "huge", 1);
  expect_error([] { EngineConfig::from_env(); }, {"BYTEPS_PARTITION_BYTES", "huge"});
  ::unsetenv("BYTEPS_PARTITION_BYTES");
}

// A Horovod job keeps its timeline; COMMSCHED_TIMELINE wins. Horovod's fusion settings are not read: a job that
// exports HOROVOD_FUSION_THRESHOLD=0 (Horovod's "off", not a size commsched takes) still starts.
TEST(Config, HorovodVariablesAreHonouredBelowCommschedNames) {
  ::setenv("HOROVOD_TIMELINE", "/tmp/hvd.json", 1);
  ::setenv("HOROVOD_FUSION_THRESHOLD", "0", 1);
  ::setenv("HOROVOD_CYCLE_TIME", "0", 1);
  EXPECT_EQ(EngineConfig::from_env().timeline_path, "/tmp/hvd.json");
  ::setenv("COMMSCHED_TIMELINE", "/tmp/own.json", 1);
  EXPECT_EQ(EngineConfig::from_env().timeline_path, "/tmp/own.json");
  for (const char* v : {"COMMSCHED_TIMELINE", "HOROVOD_TIMELINE", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"})
    ::unsetenv(v);
}

TEST(Config, FactoryBuildsRequestedPolicy) {
  EngineConfig c;
  c.policy = PolicyKind::bytescheduler;
  EXPECT_EQ(make_policy(c)->name(), "bytescheduler");
  c.policy = PolicyKind::wfbp;
  EXPECT_EQ(make_policy(c)->name(), "wfbp");
}

TEST(Config, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(4u << 20), "4 MiB");
}

}  // namespace
}  // namespace commsched
