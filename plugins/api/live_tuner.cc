#include "plugins/api/live_tuner.h"

#include <condition_variable>
#include <limits>
#include <mutex>
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
  CommBackend& backend = engine_.backend();
  if (backend.size() == 1) return mine;
  int64_t message[3] = {0, 0, 0};
  if (backend.rank() == 0) encode_decision(mine, std::span<int64_t, 3>(message));
  TaskDesc desc;
  desc.id = std::numeric_limits<uint64_t>::max();
  desc.name = kDecisionTask;
  desc.key = task_key(desc.name);
  desc.priority = std::numeric_limits<int32_t>::min();
  desc.op = Op::broadcast;
  desc.dtype = DType::i64;
  desc.count = 3;
  desc.buffer.data = message;
  desc.root = 0;
  desc.iteration = engine_.iteration();
  desc.round = agreements_ - 1;  // every rank agrees at the same steps, so the rounds match
  desc.num_partitions = 1;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  backend.start({PartitionView{&desc, 0, 0, desc.bytes()}}, [&](const Status& s) {
    std::lock_guard lk(mu);
    status = s;
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return done; });  // backends complete or fail every batch (a lost peer within the timeout)
  }
  if (!status.ok())
    throw std::runtime_error("auto-tuner: broadcasting rank 0's decision through the " + std::string(backend.name()) +
                             " backend failed: " + status.message);
  return decode_decision(std::span<const int64_t, 3>(message));
}

}  // namespace commsched
