// LiveTuner: the online auto-tuner (tuner/online_tuner.h) attached to a running Engine.
//
// It measures each training step (the caller reports its wall time), runs the tuner's trials and switches the
// engine's knobs (partition size, credit, fusion bound) with Engine::set_knobs, which takes effect at the next
// backward_done(): the same step on every rank, because every rank counts the same steps. Rank 0 decides; its
// decision (partition, credit, fusion bound, final) reaches the other ranks as a small broadcast task (one int64 per knob of the knob set, then the final flag) submitted to the engine like any other, so it works for
// every backend that can broadcast (parameter server, Gloo, NCCL, loopback) without a side channel, and the engine
// keeps its view of everything the backend carries (credit, collective order negotiation, timeline).
//
// The task is the most urgent there is and is followed by Engine::flush(): a policy that holds tasks until the end of
// backward (BSP, MG-WFBP) sends it at once, without ending the iteration or learning a merge plan from it, while the
// caller is blocked in the agreement.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "scheduler/config.h"
#include "scheduler/engine.h"
#include "tuner/online_tuner.h"

namespace commsched {

class LiveTuner {
 public:
  // `key` names the model and cluster shape for the store of best configurations (see tuner::model_signature).
  // A rank waits at most `agreement_limit` for rank 0's decision, then on_step throws.
  LiveTuner(Engine& engine, tuner::TuningKey key, tuner::TunerOptions options, tuner::LogFn log = {},
            std::chrono::nanoseconds agreement_limit = std::chrono::minutes(5));

  // One training step has ended, taking `seconds` of wall time (> 0), after its backward_done(). Blocks at a trial
  // boundary until rank 0's decision has arrived. Throws std::runtime_error naming the backend and the agreement
  // when the broadcast fails or does not complete within the agreement limit.
  void on_step(double seconds);
  // Starts tuning at the end of a step without a time (the first one); on_step() measures from the next.
  void begin() { tuner_->begin(steps_++); }
  // Configurations to try first (tuner::OnlineTuner::warm_start); before the first on_step().
  void warm_start(std::vector<Knobs> first_trials, std::vector<double> predicted_s = {}) {
    tuner_->warm_start(std::move(first_trials), std::move(predicted_s));
  }

  const tuner::OnlineTuner& tuner() const { return *tuner_; }
  bool finished() const { return tuner_->finished(); }
  // Decisions broadcast so far (for tests and logs).
  uint64_t agreements() const { return agreements_; }

 private:
  tuner::Decision agree(const tuner::Decision& mine);

  Engine& engine_;
  std::chrono::nanoseconds agreement_limit_;
  uint64_t steps_ = 0;
  uint64_t agreements_ = 0;
  std::unique_ptr<tuner::OnlineTuner> tuner_;
};

// The agreement message: every knob of the knob set (options/knobs.h kKnobs, in order), then the final flag.
inline constexpr size_t kDecisionWordCount = kKnobCount + 1;
using DecisionWords = std::span<int64_t, kDecisionWordCount>;
using ConstDecisionWords = std::span<const int64_t, kDecisionWordCount>;
// Encodes and decodes the agreement message; decode throws InvalidArgument on values no rank 0 would send.
void encode_decision(const tuner::Decision& d, DecisionWords out);
tuner::Decision decode_decision(ConstDecisionWords in);

}  // namespace commsched
