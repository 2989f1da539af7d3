// How every rank learns who lags, written once for the parameter server and the all-reduce: whoever sees every rank's
// progress (each PS server, the negotiator's rank 0) sends its current laggards to every rank as a small text
// ("rank iterations seconds" per line), and each rank keeps the reports of each source on a StragglerBoard, which
// merges them (the worst per rank) and says which log lines are due (rate-limited). A rank's last reported lag is
// kept for `keep_s` after the reports stop naming it: in synchronous training the others' step returns just when
// the straggler has caught up, so a board showing only the latest report would be empty whenever it is asked.
// Pure: no I/O, the caller passes the clock.
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
  // `repeat` at most. keep_s: how long a rank's last lag is still shown once no report names it.
  StragglerBoard(size_t sources, double warn_s = 1.0, std::chrono::seconds repeat = std::chrono::seconds(5),
                 double keep_s = 3.0);
  // Source `source` reports `lags` (its whole current list). Returns the log lines due now.
  std::vector<std::string> report(size_t source, std::vector<Straggler> lags, Clock::time_point now);
  // The lags reported within keep_s of `now`, every source merged: the worst per rank, most seconds first.
  std::vector<Straggler> current(Clock::time_point now) const;

 private:
  struct Heard {
    Straggler lag;
    Clock::time_point at;
  };
  std::vector<std::vector<Heard>> by_source_;  // per source: each rank's last reported lag
  std::vector<std::pair<int, Clock::time_point>> warned_;  // rank, when it was last logged
  double warn_s_;
  std::chrono::seconds repeat_;
  double keep_s_;
};

}  // namespace commsched
