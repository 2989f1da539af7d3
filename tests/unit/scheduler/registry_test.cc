// The option, knob and policy registries: every row is usable, and what the rows say matches what the code does.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <set>

#include "scheduler/config.h"
#include "scheduler/policy_factory.h"

namespace commsched {
namespace {

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

TEST(OptionRegistry, EngineVariablesAreThePrefixedNames) {
  for (const OptionInfo& o : engine_option_table().infos()) {
    EXPECT_EQ(o.env, "COMMSCHED_" + upper(o.name)) << o.name;
    EXPECT_EQ(o.group, "engine");
    EXPECT_FALSE(o.doc.empty()) << o.name;
    EXPECT_FALSE(o.allowed.empty()) << o.name;
  }
}

// The documented default is what a default EngineConfig holds: applying it changes nothing.
TEST(OptionRegistry, DefaultsParseBackToTheDefaults) {
  for (const OptionInfo& o : engine_option_table().infos()) {
    if (o.default_value.empty()) continue;  // the empty timeline path: off
    EngineConfig c;
    c.set(o.name, o.default_value);
    const EngineConfig d;
    EXPECT_EQ(c.policy, d.policy) << o.name;
    EXPECT_EQ(c.knobs.partition_bytes, d.knobs.partition_bytes) << o.name << "=" << o.default_value;
    EXPECT_EQ(c.knobs.credit_bytes, d.knobs.credit_bytes) << o.name << "=" << o.default_value;
    EXPECT_EQ(c.fusion_bytes, d.fusion_bytes) << o.name;
    EXPECT_DOUBLE_EQ(c.fusion_cycle_s, d.fusion_cycle_s) << o.name;
    EXPECT_EQ(c.knobs.small_tensor_bytes, d.knobs.small_tensor_bytes) << o.name;
    EXPECT_EQ(c.credit_stall_guard, d.credit_stall_guard) << o.name;
    EXPECT_EQ(c.timeline_max_events, d.timeline_max_events) << o.name;
    EXPECT_DOUBLE_EQ(c.mg_alpha_s, d.mg_alpha_s) << o.name;
    EXPECT_NEAR(c.mg_beta_s_per_byte, d.mg_beta_s_per_byte, 1e-15) << o.name;
    EXPECT_EQ(c.compression, d.compression) << o.name;
  }
}

TEST(OptionRegistry, AliasesAndFlagSpellingsReachTheSameOption) {
  EngineConfig c;
  c.set("partition", "2MiB");
  EXPECT_EQ(c.knobs.partition_bytes, 2u << 20);
  EXPECT_TRUE(c.partition_set);
  EXPECT_FALSE(c.credit_set);
  c.set("credit-bytes", "unlimited");
  EXPECT_EQ(c.knobs.credit_bytes, 0u);
  EXPECT_TRUE(c.credit_set);
  c.set("SMALL_TENSOR", "0");  // 0 turns small-tensor fusion off (a flag's default)
  EXPECT_EQ(c.knobs.small_tensor_bytes, 0u);
  c.set("small_tensor_bytes", "64KiB");
  EXPECT_EQ(c.knobs.small_tensor_bytes, 64u << 10);
  EXPECT_TRUE(c.small_tensor_set);
}

TEST(OptionRegistry, ErrorsNameTheCallersVariable) {
  EngineConfig c;
  try {
    c.set("fusion_bytes", "lots", "--fusion-bytes");
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--fusion-bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("'lots'"), std::string::npos) << m;
    EXPECT_NE(m.find("MiB"), std::string::npos) << m;
  }
  try {
    c.set("colour", "blue");
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("partition_bytes"), std::string::npos) << "lists the allowed names: " << e.what();
  }
}

TEST(KnobSet, EveryKnobIsAnEngineOption) {
  for (const KnobSpec& k : kKnobs) {
    EXPECT_TRUE(engine_option_table().has(k.name)) << k.name;
    EngineConfig c;
    c.set(k.name, "12KiB");
    EXPECT_EQ(c.knobs.*k.field, 12u << 10) << k.name;
  }
}

TEST(PolicyRegistry, NamesAliasesAndFactoriesAgree) {
  std::set<std::string> seen;
  for (const PolicyInfo& p : policy_registry()) {
    EXPECT_TRUE(seen.insert(std::string(p.name)).second) << "duplicate " << p.name;
    EngineConfig c;
    c.set("policy", p.name);
    EXPECT_EQ(make_policy(c)->name(), p.name) << "the factory builds the policy it is registered as";
    for (std::string_view a : p.aliases) {
      EXPECT_EQ(parse_policy("V", a), PolicyKind(p.name)) << a;
      EXPECT_TRUE(seen.insert(std::string(a)).second) << "alias " << a << " is taken twice";
    }
    for (std::string_view o : p.options) EXPECT_TRUE(engine_option_table().has(o)) << p.name << " reads " << o;
  }
  EXPECT_EQ(parse_policy("V", " MG-WFBP "), PolicyKind::mgwfbp);
  EXPECT_EQ(all_policies().size(), policy_registry().size());
}

TEST(PolicyRegistry, UnknownPolicyListsTheRegisteredOnes) {
  try {
    parse_policy("COMMSCHED_POLICY", "magic");
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    for (const std::string& n : policy_names()) EXPECT_NE(m.find(n), std::string::npos) << m;
    EXPECT_NE(m.find("COMMSCHED_POLICY='magic'"), std::string::npos) << m;
  }
}

void arrive(Policy& p, uint64_t id, int32_t priority, Nanos now) {
  const PartRef part{id, 0, priority, id, 0, 4096};
  p.on_task_arrived(TaskArrival{id, priority, id, 4096, std::span<const PartRef>(&part, 1)}, now);
}

// Dispatches and completes everything the policy releases at `now`.
void drain(Policy& p, Nanos now) {
  for (int round = 0; round < 10; ++round) {
    std::vector<Batch> out;
    p.poll(now, out);
    if (out.empty()) return;
    for (const Batch& b : out) p.on_batch_done(b, now);
  }
}

// holds_tasks is what the Python plugin flushes by: after one backward (MG-WFBP learns its merge groups from it), a
// holding policy dispatches a lone task of the next backward only at the end of backward or on a flush, however long
// it waits; every other policy dispatches it on its own (fusion after its cycle).
TEST(PolicyRegistry, HoldsTasksMatchesTheBehaviour) {
  for (const PolicyInfo& info : policy_registry()) {
    EngineConfig c;
    c.policy = PolicyKind(info.name);
    auto p = make_policy(c);
    arrive(*p, 1, /*priority=*/1, 0);  // backward: the last layer first
    arrive(*p, 2, /*priority=*/0, 0);
    drain(*p, 0);
    p->on_backward_done(0);
    drain(*p, 0);
    ASSERT_EQ(p->queued_partitions(), 0u) << info.name;

    const Nanos start = 1'000'000'000, later = 2'000'000'000;
    arrive(*p, 3, /*priority=*/1, start);
    std::vector<Batch> out;
    p->poll(later, out);
    EXPECT_EQ(out.empty(), info.holds_tasks) << info.name;
    if (info.holds_tasks) {
      p->on_flush(later);
      p->poll(later, out);
      EXPECT_EQ(out.size(), 1u) << info.name << " releases its tasks on flush";
    }
  }
}

// The simulator's targets judge the scheduler against the baselines by this property, not by name.
TEST(PolicyRegistry, TheSchedulerIsTheOnlyNonBaseline) {
  std::vector<std::string_view> non_baselines;
  for (const PolicyInfo& p : policy_registry())
    if (!p.baseline) non_baselines.push_back(p.name);
  ASSERT_EQ(non_baselines.size(), 1u);
  EXPECT_EQ(non_baselines.front(), "bytescheduler");
}

}  // namespace
}  // namespace commsched
