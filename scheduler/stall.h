// Stalls: a tensor some ranks submitted and the others have not, for a while. Every rank must submit the same
// collectives (or PS rounds) under the same names; a rank that submits another name (an unnamed operation counted
// differently), skips one or never gets there leaves the others waiting with no error. Whoever sees every rank's
// submissions reports such waits, as Horovod's stall inspector does: the all-reduce negotiator's rank 0
// (scheduler/global_order.h GlobalOrder::stalled) and each PS server (comm_backends/ps/slot_table.h
// SlotTable::stalled). Options and the reporting rule are shared here; pure (the caller passes the clock).
#pragma once

#include <string>
#include <vector>

#include "options/option_table.h"

namespace commsched {

struct StallOptions {
  double check_s = 60;    // COMMSCHED_STALL_CHECK: log what waited this long, again each interval (0: never)
  double shutdown_s = 0;  // COMMSCHED_STALL_SHUTDOWN: fail what waited this long, on every rank (0: never)
  // COMMSCHED_STALL_*, else Horovod's HOROVOD_STALL_CHECK_TIME_SECONDS, _SHUTDOWN_TIME_SECONDS, _CHECK_DISABLE (which
  // turns both off unless COMMSCHED_STALL_CHECK is set).
  static StallOptions from_env();
  static const OptionTable<StallOptions>& table();
};

// When a reporter looks, logs and fails, given how long its longest stall has waited.
class StallWatch {
 public:
  explicit StallWatch(StallOptions o) : o_(o) {}
  // The shortest wait worth listing (0: stalls are never looked for).
  double min_wait_s() const;
  // Whether to log the stalls now: the longest has waited check_s, and none was logged within check_s.
  bool log_due(double now_s, double longest_wait_s);
  // Whether a stall that has waited this long fails now.
  bool fails(double wait_s) const { return o_.shutdown_s > 0 && wait_s >= o_.shutdown_s; }
  // The advice after a logged list of stalls.
  std::string advice() const;

 private:
  StallOptions o_;
  double next_log_s_ = 0;
};

// "ranks 0, 1" / "rank 2" (`noun` "worker" gives "workers 0, 1").
std::string rank_list(const std::vector<int>& ranks, const std::string& noun = "rank");

}  // namespace commsched
