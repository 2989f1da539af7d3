#include "plugins/api/live_tuner.h"

#include <memory>
#include <limits>
#include <stdexcept>
#include <string>

#include "scheduler/completion_waiter.h"
#include "scheduler/config.h"

namespace commsched {
namespace {
constexpr const char* kDecisionTask = "commsched.tuner.decision";
}  // namespace

void encode_decision(const tuner::Decision& d, DecisionWords out) {
  for (size_t i = 0; i < kKnobCount; ++i) out[i] = static_cast<int64_t>(d.knobs.*kKnobs[i].field);
  out[kKnobCount] = d.final ? 1 : 0;
}

tuner::Decision decode_decision(ConstDecisionWords in) {
  std::string values;
  bool bad = in[kKnobCount] != 0 && in[kKnobCount] != 1;
  for (size_t i = 0; i < kKnobCount; ++i) {
    bad |= in[i] < 0;
    values += std::string(kKnobs[i].name) + " " + std::to_string(in[i]) + ", ";
  }
  if (bad)
    throw InvalidArgument("tuner decision from rank 0 is malformed (" + values + "final " +
                          std::to_string(in[kKnobCount]) + ")");
  tuner::Decision d;
  for (size_t i = 0; i < kKnobCount; ++i) d.knobs.*kKnobs[i].field = static_cast<uint64_t>(in[i]);
  d.final = in[kKnobCount] == 1;
  return d;
}

LiveTuner::LiveTuner(Engine& engine, tuner::TuningKey key, tuner::TunerOptions options, tuner::LogFn log,
                     std::chrono::nanoseconds agreement_limit)
    : engine_(engine), agreement_limit_(agreement_limit) {
  const bool leader = engine.backend().rank() == 0;
  tuner_ = std::make_unique<tuner::OnlineTuner>(
      engine, std::move(key), std::move(options), [this](const tuner::Decision& d) { return agree(d); },
      std::move(log), leader);
}

void LiveTuner::on_step(double seconds) { tuner_->on_iteration_end(steps_++, seconds); }

tuner::Decision LiveTuner::agree(const tuner::Decision& mine) {
  ++agreements_;
  const CommBackend& backend = engine_.backend();
  if (backend.size() == 1) return mine;
  // The message and the waiter belong to the task as much as to this call: when the wait gives up, the broadcast may
  // still complete later and write into them.
  struct Agreement {
    int64_t message[kDecisionWordCount] = {};
    CompletionWaiter waiter;
  };
  const auto a = std::make_shared<Agreement>();
  if (backend.rank() == 0) encode_decision(mine, DecisionWords(a->message));
  Task t;
  t.name = kDecisionTask;  // the same name on every rank; the engine numbers its rounds alike everywhere
  t.priority = std::numeric_limits<int32_t>::min();
  t.op = Op::broadcast;
  t.dtype = DType::i64;
  t.count = kDecisionWordCount;
  t.buffer.data = a->message;
  t.root = 0;
  a->waiter.expect(1);
  t.on_done = [a](const Status& s) { a->waiter.settle(s); };
  engine_.submit(std::move(t));
  engine_.flush();
  // The engine completes or fails every task (a lost peer within the backend's timeout); the limit covers a rank 0
  // that never reaches the same trial boundary.
  const Status status = a->waiter.wait(agreement_limit_);
  if (!status.ok())
    throw std::runtime_error("auto-tuner: rank " + std::to_string(backend.rank()) + " waiting for rank 0's decision "
                             "(agreement " + std::to_string(agreements_) + ", a broadcast through the " +
                             std::string(backend.name()) + " backend): " + status.message);
  return decode_decision(ConstDecisionWords(a->message));
}

}  // namespace commsched
