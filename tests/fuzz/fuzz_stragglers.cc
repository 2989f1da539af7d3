// Lag reports (comm_backends/straggler): the text a PS server sends in its `lags` message and the negotiator's rank 0
// in its `lags` frame, as every worker decodes it and keeps it on its StragglerBoard. Any text must either be refused
// (nullopt) or give lags of ranks in [0, ranks) with a finite, non-negative lag; the board must only ever show such
// lags, and what a source reports must survive the encoder (the rounding of seconds aside).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string_view>

#include "comm_backends/straggler.h"
#include "tests/fuzz/fuzz_target.h"

using namespace commsched;

namespace {

void check_lags(const std::vector<Straggler>& lags, int ranks) {
  for (const Straggler& s : lags) {
    FUZZ_CHECK(s.rank >= 0 && s.rank < ranks);
    FUZZ_CHECK(std::isfinite(s.seconds) && s.seconds >= 0);
  }
}

}  // namespace

// First byte: how many ranks the run has (1..64) and which of 2 sources reports; the rest is the report's text.
int fuzz_stragglers(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int ranks = 1 + data[0] % 64;
  const size_t source = (data[0] >> 6) & 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto lags = decode_stragglers(text, ranks);
  if (!lags) return 0;
  check_lags(*lags, ranks);
  StragglerBoard board(2, /*warn_s=*/0.0);
  const auto now = StragglerBoard::Clock::now();
  board.report(source, *lags, now);
  board.report(1 - source, *lags, now + std::chrono::seconds(1));
  check_lags(board.current(now + std::chrono::seconds(1)), ranks);
  // Re-encoding what was accepted keeps every rank and iteration count (a report of a lag too large to print would
  // come back torn, and a worker would refuse every later report of that server).
  if (std::all_of(lags->begin(), lags->end(), [](const Straggler& s) { return s.seconds < 1e12; })) {
    const auto again = decode_stragglers(encode_stragglers(*lags), ranks);
    FUZZ_CHECK(again && again->size() == lags->size());
    for (size_t i = 0; i < lags->size(); ++i)
      FUZZ_CHECK((*again)[i].rank == (*lags)[i].rank && (*again)[i].iterations == (*lags)[i].iterations);
  }
  return 0;
}

COMMSCHED_FUZZ_TARGET(fuzz_stragglers)
