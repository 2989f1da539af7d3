#include "plugins/cli/options_command.h"

#include <cstdio>

#include "comm_backends/cluster_env.h"
#include "comm_backends/launcher_env.h"
#include "options/knobs.h"
#include "plugins/api/option_catalogue.h"

namespace commsched {
namespace {

struct OptionsArgs {
  bool markdown = false;
  bool policies = false;
  bool backends = false;
  bool knobs = false;
};

void print_plain() {
  for (const OptionInfo& i : all_options())
    std::printf("%-38s %-11s %-10s default %-12s %s\n    allowed: %s\n", i.env.c_str(), i.group.c_str(), i.type.c_str(),
                i.default_value.empty() ? "(empty)" : i.default_value.c_str(), i.doc.c_str(), i.allowed.c_str());
}

}  // namespace

void add_options_subcommand(CLI::App& app) {
  auto a = std::make_shared<OptionsArgs>();
  CLI::App* s = app.add_subcommand("options", "list every COMMSCHED_* option (name, variable, type, default, allowed "
                                              "values), the policies or the backends");
  s->add_flag("--markdown", a->markdown, "print the options as the README's Markdown table");
  s->add_flag("--policies", a->policies, "print the policy registry (Markdown)");
  s->add_flag("--backends", a->backends, "print the backend registry for this build (Markdown)");
  s->add_flag("--knobs", a->knobs, "print the knob rows as the README's knob table (Markdown)");
  s->callback([a] {
    if (a->policies) std::fputs(policies_markdown().c_str(), stdout);
    else if (a->backends) std::fputs(backends_markdown().c_str(), stdout);
    else if (a->knobs) std::fputs(knobs_markdown().c_str(), stdout);
    else if (a->markdown) std::fputs(options_markdown().c_str(), stdout);
    else print_plain();
  });
}

void add_env_subcommand(CLI::App& app) {
  CLI::App* s = app.add_subcommand("env", "print the launcher detected in this environment (torchrun/Ray, Slurm, Open "
                                          "MPI, DMLC_*) and the cluster contract derived from it, field by field");
  s->callback([] {
    if (const std::string notice = scheduler_role_notice(); !notice.empty()) {
      std::puts(notice.c_str());
      return;
    }
    try {
      std::fputs(ClusterEnv::explain_env().c_str(), stdout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "commsched env: %s\n", e.what());
      throw CLI::RuntimeError(2);
    }
  });
}

}  // namespace commsched
