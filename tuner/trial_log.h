// One CSV row per tuning trial, flushed as it is written so that a run killed mid-tuning still leaves its history.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "scheduler/policy.h"

namespace commsched::tuner {

struct TrialRecord {
  int trial = 0;             // 1-based
  Knobs knobs;
  double score = 0.0;        // median window throughput, iterations per second
  int iterations = 0;        // iterations the trial took, warm-up included
  uint64_t first_iteration = 0;
  double best_score = 0.0;   // the kept (best) configuration's score after this trial
  double noise = 0.0;        // relative standard error of the score (0: a single iteration measured)
};

class TrialLog {
 public:
  TrialLog() = default;
  // Opens (truncates) the file and writes the header; throws std::runtime_error naming the path on failure.
  explicit TrialLog(const std::string& path);
  bool is_open() const { return out_.is_open(); }
  void append(const TrialRecord& r);

  // trial, one column per knob of the knob set (options/knobs.h kKnobs, by name), then the measurements.
  static std::string header();

 private:
  std::ofstream out_;
};

}  // namespace commsched::tuner
