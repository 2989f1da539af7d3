#include "scheduler/config.h"

#include <cctype>

#include "scheduler/policy_factory.h"

namespace commsched {
namespace {

std::string upper(std::string_view s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string env_of(std::string_view option) { return "COMMSCHED_" + upper(option); }

ValueType<PolicyKind> policy_value() {
  return {"policy", "one of " + join_names(policy_names()),
          [](std::string_view var, std::string_view value) { return parse_policy(var, value); },
          [](const PolicyKind& p) { return std::string(p.name()); }};
}

ValueType<compression::Spec> compression_value() {
  return {"compression", compression::specs_allowed(),
          [](std::string_view var, std::string_view value) { return compression::parse_spec(var, value); },
          [](const compression::Spec& s) { return compression::to_string(s); }};
}

// The flag that records a knob was given, for the knobs the automatic choice replaces otherwise
// (scheduler/auto_knobs.h); null for the others.
bool* given_flag(EngineConfig& c, std::string_view knob) {
  if (knob == "partition_bytes") return &c.partition_set;
  if (knob == "credit_bytes") return &c.credit_set;
  if (knob == "small_tensor_bytes") return &c.small_tensor_set;
  return nullptr;
}

// The knob rows (options/knobs.h) as engine options.
void add_knob_options(OptionTable<EngineConfig>& t) {
  for (const KnobSpec& k : kKnobs) {
    const ValueType<uint64_t> size = size_value(k.zero);
    const EngineConfig defaults;
    OptionInfo info{"", std::string(k.name), {std::string(k.alias)}, env_of(k.name), size.type, size.show(defaults.knobs.*k.field),
                    size.allowed, std::string(k.doc)};
    t.add(std::move(info), [k, parse = size.parse](EngineConfig& c, const std::string& var, std::string_view value) {
      c.knobs.*k.field = parse(var, value);
      if (bool* given = given_flag(c, k.name)) *given = true;
    });
  }
}

OptionTable<EngineConfig> build_engine_table() {
  OptionTable<EngineConfig> t("engine", "engine");
  t.bind("policy", env_of("policy"), [](EngineConfig& c) -> PolicyKind& { return c.policy; }, policy_value(),
         "scheduling policy (aliases: see `commsched options --policies`)");
  add_knob_options(t);
  t.bind("credit_stall_guard", env_of("credit_stall_guard"), [](EngineConfig& c) -> bool& { return c.credit_stall_guard; },
         bool_value(), "bytescheduler lends credit to a partition the credit would stall (see PriorityCreditPolicy)");
  t.bind("fusion_bytes", env_of("fusion_bytes"), [](EngineConfig& c) -> uint64_t& { return c.fusion_bytes; },
         size_value(), "fusion policy: fuse tensors up to this many bytes");
  t.bind("fusion_cycle", env_of("fusion_cycle"), [](EngineConfig& c) -> double& { return c.fusion_cycle_s; },
         duration_value(), "fusion policy: cycle time");
  t.bind("mg_alpha", env_of("mg_alpha"), [](EngineConfig& c) -> double& { return c.mg_alpha_s; }, duration_value(),
         "MG-WFBP: per-message latency of its cost model");
  const ValueType<double> rate = rate_value();
  t.add({"", "mg_bandwidth", {}, env_of("mg_bandwidth"), rate.type, rate.show(8.0 / EngineConfig{}.mg_beta_s_per_byte),
         rate.allowed, "MG-WFBP: link rate of its cost model"},
        [parse = rate.parse](EngineConfig& c, const std::string& var, std::string_view value) {
          c.mg_beta_s_per_byte = 8.0 / parse(var, value);
        });
  t.bind("compression", env_of("compression"), [](EngineConfig& c) -> compression::Spec& { return c.compression; },
         compression_value(),
         "gradient compression of reduce tasks on the engine's compression stage; topk (error feedback) and signsgd "
         "(1 bit + scale, error feedback) only where the reduction decodes them (the parameter server decodes, sums and "
         "answers in the same scheme; one rank; refused for a multi-rank all-reduce)");
  t.bind("timeline", env_of("timeline"), [](EngineConfig& c) -> std::string& { return c.timeline_path; },
         text_value("a file path ({rank} is replaced by the rank); empty: off"),
         "Chrome trace of this engine, for Perfetto; the rank goes into the name (t.json: t.rank0.json)");
  t.bind("timeline_max_events", env_of("timeline_max_events"),
         [](EngineConfig& c) -> uint64_t& { return c.timeline_max_events; }, int_value(16, int64_t{1} << 40),
         "the trace stops recording after this many events (the file stays valid)");
  return t;
}

// BytePS's and Horovod's names of the knobs their job files set, below the COMMSCHED_* variables. Horovod's timeline
// is per rank here (t.json: t.rank0.json, ...). Its fusion threshold and cycle time are not read: their values
// (0 turns fusion off) do not mean what commsched's fusion knobs do, and a job that exports them must still start.
constexpr ForeignVariable kForeignEngineVariables[] = {
    {"BYTEPS_PARTITION_BYTES", "partition_bytes"},
    {"HOROVOD_TIMELINE", "timeline"},
};

// BytePS counts its credit in partitions, commsched in bytes: honoured as credit x partition when the partition size
// is given.
void apply_byteps_credit(EngineConfig& c) {
  const auto credit = env_value("BYTEPS_SCHEDULING_CREDIT");
  if (!credit || env_value(env_of("credit_bytes"))) return;
  const int64_t n = parse_int("BYTEPS_SCHEDULING_CREDIT", *credit, 1, 1 << 20);
  if (!c.partition_set || c.knobs.partition_bytes == 0)
    throw InvalidArgument("BYTEPS_SCHEDULING_CREDIT=" + *credit + " counts partitions and no partition size is set "
                          "(BYTEPS_PARTITION_BYTES or " + env_of("partition_bytes") + "): set " +
                          env_of("credit_bytes") + ", commsched's credit in bytes, instead");
  c.knobs.credit_bytes = static_cast<uint64_t>(n) * c.knobs.partition_bytes;
  c.credit_set = true;
}

}  // namespace

const OptionTable<EngineConfig>& engine_option_table() {
  static const OptionTable<EngineConfig> table = build_engine_table();
  return table;
}

std::string_view policy_name(PolicyKind p) { return p.name(); }

PolicyKind parse_policy(std::string_view var, std::string_view value) {
  if (const PolicyInfo* p = find_policy(value)) return PolicyKind(p->name);
  reject_value(var, value, "one of " + join_names(policy_names()));
}

void EngineConfig::set(std::string_view option, std::string_view value, std::string_view var) {
  engine_option_table().set(*this, option, value, var);
}

EngineConfig EngineConfig::from_env() {
  EngineConfig c;
  engine_option_table().set_from_env(c);
  engine_option_table().set_from_foreign_env(c, kForeignEngineVariables);
  apply_byteps_credit(c);
  c.validate();
  return c;
}

void EngineConfig::validate() const {
  if (fusion_cycle_s <= 0 && policy == PolicyKind::fusion)
    throw InvalidArgument("COMMSCHED_FUSION_CYCLE must be positive for the fusion policy");
  if (mg_beta_s_per_byte <= 0) throw InvalidArgument("COMMSCHED_MG_BANDWIDTH must be positive");
}

}  // namespace commsched
