// Stage: one step a partition takes between the scheduler and the backend (encode, device-to-host copy, ...) and
// its inverse on the way back (decode, host-to-device copy). The engine runs each stage on its own flow-graph node
// with the stage's own concurrency, so the stages of different partitions overlap; a stage sees one partition at a
// time and never the policy, the backend's internals or other partitions.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "scheduler/task.h"

namespace commsched {

class CommBackend;

// What a stage keeps for one partition between encode and decode (its wire buffer, say). Owned by the engine.
class StageState {
 public:
  virtual ~StageState() = default;
};

class Stage {
 public:
  virtual ~Stage() = default;
  virtual std::string_view name() const = 0;
  // How many partitions this stage may work on at once; 0: no limit.
  virtual size_t concurrency() const { return 0; }
  // Whether the stage does anything to this task's partitions; the others pass it untouched (bitwise).
  virtual bool applies(const TaskDesc& task) const = 0;
  // Why this stage cannot run this task on this backend (empty: it can). The engine refuses such a task at submit.
  virtual std::string refusal(const TaskDesc& /*task*/, const CommBackend& /*backend*/) const { return {}; }

  // Memory stages (a device-to-host copy) run before the engine's compression stage, which reads bytes on the host;
  // the others after it. Encode in chain order, decode in reverse.
  enum class Placement { memory, transform };
  virtual Placement placement() const { return Placement::transform; }
  // The device of the buffer this stage hands on for a task it applies to (a device-to-host copy: the host); nullopt:
  // the device it was given. The engine checks the backend against what the last stage hands on, not the task's.
  virtual std::optional<Device> output_device(const TaskDesc& /*task*/) const { return std::nullopt; }
  // Whether encode and decode touch the bytes on the host (a CPU codec): such a stage needs host memory at its input.
  virtual bool reads_host_memory() const { return false; }

  // Before the backend: `out` starts equal to `in`; the stage may point it at a buffer it keeps in `state` (and at a
  // TaskDesc describing that buffer: the wire's dtype and sizes). Called once per partition; may throw.
  virtual void encode(const PartitionView& in, PartitionView& out, std::unique_ptr<StageState>& state) = 0;
  // After the backend succeeded: turns the result in `wire` (the `out` of encode) into `target` (its `in`).
  virtual void decode(const PartitionView& wire, const PartitionView& target, std::unique_ptr<StageState>& state) = 0;
};

}  // namespace commsched
