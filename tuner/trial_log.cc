#include "tuner/trial_log.h"

#include <stdexcept>

#include "scheduler/config.h"

namespace commsched::tuner {

TrialLog::TrialLog(const std::string& path) : out_(path, std::ios::trunc) {
  if (!out_) throw std::runtime_error("cannot open tuner trial CSV " + path);
  out_ << header() << '\n' << std::flush;
}

std::string TrialLog::header() {
  std::string h = "trial";
  for (const KnobSpec& k : kKnobs) h += "," + std::string(k.name);
  return h + ",score_iter_per_s,noise_rel,iterations,first_iteration,best_score_iter_per_s";
}

void TrialLog::append(const TrialRecord& r) {
  if (!out_.is_open()) return;
  out_ << r.trial;
  for (const KnobSpec& k : kKnobs) out_ << ',' << r.knobs.*k.field;
  out_ << ',' << r.score << ',' << r.noise << ',' << r.iterations << ',' << r.first_iteration << ',' << r.best_score
       << '\n' << std::flush;
}

}  // namespace commsched::tuner
