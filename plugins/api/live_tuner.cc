#include "plugins/api/live_tuner.h"

#include <future>
#include <limits>
#include <stdexcept>
#include <string>

namespace commsched {
namespace {
constexpr const char* kDecisionTask = "commsched.tuner.decision";
}  // namespace

void encode_decision(const tuner::Decision& d, std::span<int64_t, 3> out) {
  out[0] = static_cast<int64_t>(d.knobs.partition_bytes);
  out[1] = static_cast<int64_t>(d.knobs.credit_bytes);
  out[2] = d.final ? 1 : 0;
}

tuner::Decision decode_decision(std::span<const int64_t, 3> in) {
  if (in[0] < 0 || in[1] < 0 || (in[2] != 0 && in[2] != 1))
    throw InvalidArgument("tuner decision from rank 0 is malformed (partition " + std::to_string(in[0]) + ", credit " +
                          std::to_string(in[1]) + ", final " + std::to_string(in[2]) + ")");
  tuner::Decision d;
  d.knobs.partition_bytes = static_cast<uint64_t>(in[0]);
  d.knobs.credit_bytes = static_cast<uint64_t>(in[1]);
  d.final = in[2] == 1;
  return d;
}

LiveTuner::LiveTuner(Engine& engine, tuner::TuningKey key, tuner::TunerOptions options, tuner::LogFn log)
    : engine_(engine) {
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
  int64_t message[3] = {0, 0, 0};
  if (backend.rank() == 0) encode_decision(mine, std::span<int64_t, 3>(message));
  std::promise<Status> done;
  Task t;
  t.name = kDecisionTask;  // the same name on every rank; the engine numbers its rounds alike everywhere
  t.priority = std::numeric_limits<int32_t>::min();
  t.op = Op::broadcast;
  t.dtype = DType::i64;
  t.count = 3;
  t.buffer.data = message;
  t.root = 0;
  t.on_done = [&done](const Status& s) { done.set_value(s); };
  engine_.submit(std::move(t));
  engine_.flush();
  // The engine completes or fails every task (a lost peer within the backend's timeout), so this returns.
  const Status status = done.get_future().get();
  if (!status.ok())
    throw std::runtime_error("auto-tuner: broadcasting rank 0's decision through the " + std::string(backend.name()) +
                             " backend failed: " + status.message);
  return decode_decision(std::span<const int64_t, 3>(message));
}

}  // namespace commsched
