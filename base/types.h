// Basic vocabulary shared by every part of commsched: data types, operations, devices, status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace commsched {

// Element types a task may carry. The numeric values are part of the wire protocol; never renumber.
enum class DType : uint8_t { f32 = 0, f64 = 1, f16 = 2, bf16 = 3, i32 = 4, i64 = 5 };
inline constexpr int kNumDTypes = 6;

// Size of one element in bytes.
size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses "f32", "float32", "float", "fp16", "bfloat16", ... Throws std::invalid_argument naming the value.
DType parse_dtype(std::string_view s);
// True when v is a valid DType value (used by decoders of untrusted input).
bool is_valid_dtype(uint8_t v);

// What a task asks of the backend. Numeric values are part of the wire protocol.
enum class Op : uint8_t {
  push_pull = 0,  // parameter-server semantics: push a gradient, pull the sum of all workers
  allreduce = 1,  // collective sum over all ranks
  broadcast = 2,  // copy the root rank's buffer to every rank
};
std::string_view op_name(Op op);
Op parse_op(std::string_view s);

enum class Device : uint8_t { cpu = 0, cuda = 1 };

// A tensor's memory: a pointer plus where it lives. The engine never owns or copies it.
struct Buffer {
  void* data = nullptr;
  Device device = Device::cpu;
  int device_index = 0;
  // CUDA only: an event (cudaEvent_t) the producer recorded on its stream after writing the data; work that reads the
  // buffer waits for it on the device instead of the producer syncing its stream. Null: the data is ready now.
  void* ready_event = nullptr;
};

// Result of a communication step. Cheap when ok (empty message).
struct Status {
  enum class Code : uint8_t { ok = 0, error = 1, cancelled = 2, peer_lost = 3, invalid = 4 };
  Code code = Code::ok;
  std::string message;

  static Status Ok() { return {}; }
  static Status Error(std::string msg, Code c = Code::error) { return {c, std::move(msg)}; }
  bool ok() const { return code == Code::ok; }
};

// Nanoseconds on whatever clock drives a Policy: the steady clock in the engine, simulated time in the simulator.
using Nanos = int64_t;

// Thrown for invalid user input at API boundaries (bad config, bad task). what() names the culprit.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Knob values a tuner may change live (the knob set, options/knobs.h kKnobs). partition_bytes == 0: do not split;
// credit_bytes == 0: no limit. Here, not in policy.h, because a backend that keeps the credit (CommBackend::set_knobs)
// is handed them too.
struct Knobs {
  uint64_t partition_bytes = 4ull << 20;
  uint64_t credit_bytes = 16ull << 20;
  uint64_t small_tensor_bytes = 0;  // bytescheduler's fusion bound (0: off)
  bool operator==(const Knobs&) const = default;  // every knob (code comparing configurations names none)
};

}  // namespace commsched
