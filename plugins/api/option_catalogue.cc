#include "plugins/api/option_catalogue.h"

#include <sstream>

#include "comm_backends/backend_registry.h"
#include "comm_backends/cluster_auth.h"
#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/collective_backend.h"
#include "comm_backends/comm_backend.h"
#include "comm_backends/hierarchical/hierarchical_backend.h"
#include "comm_backends/ps/ps_config.h"
#include "scheduler/config.h"
#include "scheduler/stall.h"
#include "scheduler/policy_factory.h"
#include "tuner/tuner_config.h"

namespace commsched {
namespace {

OptionTable<ContextEnvOptions> build_context_table() {
  OptionTable<ContextEnvOptions> t("context", "context");
  // Every registered backend is allowed here; one this build lacks fails when it is built, naming what is missing.
  t.bind("backend", "COMMSCHED_BACKEND", [](ContextEnvOptions& o) -> std::string& { return o.backend; },
         choice_value(backend_names()),
         "backend of the Python plugin and any Context; unset: ps with servers (commsched launch), loopback for one "
         "worker, else gloo (`commsched options --backends`)");
  t.bind("tune", "COMMSCHED_TUNE", [](ContextEnvOptions& o) -> bool& { return o.tune; }, bool_value(),
         "online auto-tuning of partition size, credit and the small-tensor fusion bound (COMMSCHED_TUNER_* configure it)");
  t.bind("link_probe", "COMMSCHED_LINK_PROBE", [](ContextEnvOptions& o) -> std::string& { return o.link_probe; },
         choice_value({"auto", "off"}),
         "auto: when tuning, time the link before the first step (a few reduces through the backend, well under a "
         "second; rank 0's numbers broadcast) for the tuner's warm start; off: the estimated link and assumed latency");
  t.bind("cross_iteration", "COMMSCHED_CROSS_ITERATION", [](ContextEnvOptions& o) -> bool& { return o.cross_iteration; },
         bool_value(),
         "PyTorch and Keras DistributedOptimizer: step() returns at once and each update is applied just before the "
         "next forward reads it (0: step() waits for every gradient); their cross_iteration= argument overrides it");
  return t;
}

// Markdown cells must not break the table.
std::string cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out.empty() ? std::string("(empty)") : out;
}

std::string code(const std::string& s) { return s.empty() ? std::string("(empty)") : "`" + s + "`"; }

template <class T>
void append(std::vector<OptionInfo>& out, const T& table) {
  for (OptionInfo& i : table.infos()) out.push_back(std::move(i));
}

}  // namespace

const OptionTable<ContextEnvOptions>& context_option_table() {
  static const OptionTable<ContextEnvOptions> table = build_context_table();
  return table;
}

ContextEnvOptions ContextEnvOptions::from_env() {
  ContextEnvOptions o;
  context_option_table().set_from_env(o);
  constexpr ForeignVariable horovod[] = {{"HOROVOD_AUTOTUNE", "tune"}};  // a Horovod job keeps its tuning switch
  context_option_table().set_from_foreign_env(o, horovod);
  return o;
}

std::vector<OptionInfo> all_options() {
  std::vector<OptionInfo> out;
  append(out, engine_option_table());
  append(out, context_option_table());
  append(out, tuner::tuner_option_table());
  append(out, ps_option_table());
  append(out, collective::CollectiveOptions::table());
  append(out, StallOptions::table());
  append(out, HierarchicalOptions::table());
  append(out, cluster_option_table());
  append(out, auth_option_table());
  return out;
}

std::string options_markdown() {
  std::ostringstream o;
  o << "| Variable | Option | Layer | Type | Default | Allowed | Description |\n"
    << "|---|---|---|---|---|---|---|\n";
  for (const OptionInfo& i : all_options()) {
    std::string names = "`" + i.name + "`";
    for (const std::string& a : i.aliases) names += ", `" + a + "`";
    o << "| `" << i.env << "` | " << names << " | " << i.group << " | " << i.type << " | " << code(i.default_value)
      << " | " << cell(i.allowed) << " | " << cell(i.doc) << " |\n";
  }
  return o.str();
}

std::string policies_markdown() {
  std::ostringstream o;
  o << "| Policy | Aliases | Holds tasks until backward ends | Options it reads | Description |\n"
    << "|---|---|---|---|---|\n";
  for (const PolicyInfo& p : policy_registry()) {
    std::string aliases, options;
    for (std::string_view a : p.aliases) aliases += (aliases.empty() ? "" : ", ") + std::string(a);
    for (std::string_view k : p.options) options += (options.empty() ? "" : ", ") + std::string(k);
    o << "| `" << p.name << "` | " << cell(aliases) << " | " << (p.holds_tasks ? "yes" : "no") << " | " << cell(options)
      << " | " << cell(std::string(p.description)) << " |\n";
  }
  return o.str();
}

std::string backends_markdown() {
  std::ostringstream o;
  o << "| Backend | In this build | Operations | Devices | Description |\n|---|---|---|---|---|\n";
  for (const BackendInfo& b : backend_registry()) {
    std::string ops, devices;
    for (Op op : b.ops) ops += (ops.empty() ? "" : ", ") + std::string(op_name(op));
    for (Device d : b.devices) devices += (devices.empty() ? "" : ", ") + std::string(d == Device::cpu ? "cpu" : "cuda");
    o << "| `" << b.name << "` | " << (b.available ? "yes" : "no (" + std::string(b.missing) + ")") << " | " << ops
      << " | " << devices << " | " << cell(std::string(b.description)) << " |\n";
  }
  return o.str();
}

}  // namespace commsched
