// How every rank learns who lags, written once for the parameter server and the all-reduce: whoever sees every rank's
// progress (each PS server, the negotiator's rank 0) sends its current laggards to every rank as a small text
// ("rank iterations seconds" per line), and each rank keeps the latest report of each source on a StragglerBoard,
// which merges them (the worst per rank) and says which log lines are due (rate-limited). Pure: no I/O, the caller
// passes the clock.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm_backends/comm_backend.h"

namespace commsched {

// Laggards are reported from this lag on; shorter ones are the ordinary spread of one iteration.
inline constexpr double kStragglerReportS = 0.02;

std::string encode_stragglers(const std::vector<Straggler>& lags);
// nullopt: not a report (a line is not three numbers, or the rank is outside [0, ranks)).
std::optional<std::vector<Straggler>> decode_stragglers(std::string_view text, int ranks);

class StragglerBoard {
 public:
  using Clock = std::chrono::steady_clock;
  // sources: how many report (PS: the servers; all-reduce: 1). warn_s: a rank lagging this long is logged, once per
  // `repeat` at most.
  StragglerBoard(size_t sources, double warn_s = 1.0, std::chrono::seconds repeat = std::chrono::seconds(5));
  // Source `source` reports `lags` (its whole current list). Returns the log lines due now.
  std::vector<std::string> report(size_t source, std::vector<Straggler> lags, Clock::time_point now);
  // Every source's reports merged: the worst report per rank, most seconds first.
  std::vector<Straggler> current() const;

 private:
  std::vector<std::vector<Straggler>> by_source_;
  std::vector<std::pair<int, Clock::time_point>> warned_;  // rank, when it was last logged
  double warn_s_;
  std::chrono::seconds repeat_;
};

}  // namespace commsched
