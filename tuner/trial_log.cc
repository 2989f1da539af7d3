#include "tuner/trial_log.h"

#include <stdexcept>

namespace commsched::tuner {

TrialLog::TrialLog(const std::string& path) : out_(path, std::ios::trunc) {
  if (!out_) throw std::runtime_error("cannot open tuner trial CSV " + path);
  out_ << kHeader << '\n' << std::flush;
}

void TrialLog::append(const TrialRecord& r) {
  if (!out_.is_open()) return;
  out_ << r.trial << ',' << r.knobs.partition_bytes << ',' << r.knobs.credit_bytes << ',' << r.score << ','
       << r.iterations << ',' << r.first_iteration << ',' << r.best_score << '\n'
       << std::flush;
}

}  // namespace commsched::tuner
