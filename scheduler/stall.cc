#include "scheduler/stall.h"

#include <algorithm>

#include "options/parse.h"

namespace commsched {

const OptionTable<StallOptions>& StallOptions::table() {
  static const OptionTable<StallOptions> t = [] {
    OptionTable<StallOptions> t("stall", "stall");
    t.bind("stall_check", "COMMSCHED_STALL_CHECK", [](StallOptions& o) -> double& { return o.check_s; },
           duration_value(),
           "a tensor some ranks submitted and others have not for this long is logged, with both lists of ranks, "
           "by the all-reduce's rank 0 or the PS server holding it, again each interval (0: never)");
    t.bind("stall_shutdown", "COMMSCHED_STALL_SHUTDOWN", [](StallOptions& o) -> double& { return o.shutdown_s; },
           duration_value(),
           "such a tensor fails on every rank after this long, naming the ranks missing (0: never; it waits as long "
           "as the missing ranks take)");
    return t;
  }();
  return t;
}

StallOptions StallOptions::from_env() {
  StallOptions o;
  table().set_from_env(o);
  constexpr ForeignVariable horovod[] = {{"HOROVOD_STALL_CHECK_TIME_SECONDS", "stall_check", "s"},
                                         {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "stall_shutdown", "s"}};
  table().set_from_foreign_env(o, horovod);
  if (auto off = env_value("HOROVOD_STALL_CHECK_DISABLE");
      off && !env_value("COMMSCHED_STALL_CHECK") && parse_bool("HOROVOD_STALL_CHECK_DISABLE", *off))
    o.check_s = o.shutdown_s = 0;  // Horovod's switch turns its whole stall inspector off
  return o;
}

double StallWatch::min_wait_s() const {
  if (o_.check_s > 0 && o_.shutdown_s > 0) return std::min(o_.check_s, o_.shutdown_s);
  return std::max(o_.check_s, o_.shutdown_s);
}

bool StallWatch::log_due(double now_s, double longest_wait_s) {
  if (o_.check_s <= 0 || longest_wait_s < o_.check_s || now_s < next_log_s_) return false;
  next_log_s_ = now_s + o_.check_s;
  return true;
}

std::string StallWatch::advice() const {
  return std::string("Every rank must submit the same tensors under the same names: a rank missing one submitted "
                     "another name (an unnamed operation counted differently), skipped it, or is busy elsewhere") +
         (o_.shutdown_s > 0 ? "" : " (COMMSCHED_STALL_SHUTDOWN fails them after a while instead)");
}

std::string rank_list(const std::vector<int>& ranks, const std::string& noun) {
  std::string s = noun + (ranks.size() == 1 ? " " : "s ");
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace commsched
