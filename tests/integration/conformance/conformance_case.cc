#include "tests/integration/conformance/conformance_case.h"

#include <cstring>
#include <sstream>

#include "comm_backends/reduce.h"
#include "scheduler/completion_waiter.h"
#include "scheduler/priority_credit_policy.h"
#include "scheduler/task.h"

namespace commsched::testing {

std::string_view backend_kind_name(BackendKind b) {
  switch (b) {
    case BackendKind::loopback: return "loopback";
    case BackendKind::ps: return "ps";
    case BackendKind::gloo: return "gloo";
    case BackendKind::nccl: return "nccl";
  }
  return "?";
}

BackendKind parse_backend_kind(std::string_view s) {
  for (BackendKind b : {BackendKind::loopback, BackendKind::ps, BackendKind::gloo, BackendKind::nccl})
    if (backend_kind_name(b) == s) return b;
  throw InvalidArgument("unknown backend '" + std::string(s) + "' (loopback, ps, gloo, nccl)");
}

std::string case_name(const ConformanceCase& c) {
  return std::string(backend_kind_name(c.backend)) + "_" + std::to_string(c.ranks) + "ranks_" +
         std::string(dtype_name(c.dtype)) + "_" + std::to_string(c.count) + "_" + std::string(op_name(c.op));
}

uint64_t partition_bytes(const ConformanceCase& c) {
  return c.count * dtype_size(c.dtype) >= (uint64_t{1} << 20) ? 256 * 1024 : 4096;
}

std::unique_ptr<Engine> make_conformance_engine(std::shared_ptr<CommBackend> backend, const ConformanceCase& c) {
  EngineConfig cfg;
  cfg.knobs.partition_bytes = partition_bytes(c);
  cfg.knobs.credit_bytes = credit_bytes(c);
  return std::make_unique<Engine>(std::make_unique<PriorityCreditPolicy>(credit_bytes(c)), std::move(backend), cfg);
}

namespace {

bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }

// A small integer in [-32, 32], different for every element, rank and round.
int64_t q(uint64_t j, int rank, int round) {
  return static_cast<int64_t>((j * 7 + static_cast<uint64_t>(rank) * 13 + static_cast<uint64_t>(round) * 5) % 65) - 32;
}

// Floats: q/8. Every value and every partial sum of up to four ranks is a multiple of 1/8 below 2^5 in magnitude,
// which needs at most 8 significant bits: exactly representable in bf16 (8), f16 (11), f32 and f64. Backends round
// each sum to nearest-even on store (comm_backends/reduce.h); on these values no rounding ever happens, so whatever
// order or precision a backend sums in, the result must equal the reference bit for bit.
// Integers: q scaled far beyond float precision plus a small odd part, so a backend that sums integers through
// float (24-bit) or double (53-bit) loses the low bits and fails; the sum of four ranks still fits the type.
int64_t int_value(DType t, uint64_t j, int rank, int round) {
  const int64_t scale = t == DType::i32 ? (int64_t{1} << 23) : (int64_t{1} << 50);
  return q(j, rank, round) * scale + static_cast<int64_t>(j % 977);
}
double float_value(uint64_t j, int rank, int round) { return static_cast<double>(q(j, rank, round)) / 8.0; }

void store(DType t, std::byte* base, uint64_t j, double f, int64_t i) {
  switch (t) {
    case DType::f32: { const float x = static_cast<float>(f); std::memcpy(base + j * 4, &x, 4); break; }
    case DType::f64: std::memcpy(base + j * 8, &f, 8); break;
    case DType::f16: { const uint16_t x = f32_to_f16(static_cast<float>(f)); std::memcpy(base + j * 2, &x, 2); break; }
    case DType::bf16: { const uint16_t x = f32_to_bf16(static_cast<float>(f)); std::memcpy(base + j * 2, &x, 2); break; }
    case DType::i32: { const int32_t x = static_cast<int32_t>(i); std::memcpy(base + j * 4, &x, 4); break; }
    case DType::i64: std::memcpy(base + j * 8, &i, 8); break;
  }
}

double load_float(DType t, const std::byte* base, uint64_t j) {
  switch (t) {
    case DType::f32: { float x; std::memcpy(&x, base + j * 4, 4); return x; }
    case DType::f64: { double x; std::memcpy(&x, base + j * 8, 8); return x; }
    case DType::f16: { uint16_t x; std::memcpy(&x, base + j * 2, 2); return f16_to_f32(x); }
    case DType::bf16: { uint16_t x; std::memcpy(&x, base + j * 2, 2); return bf16_to_f32(x); }
    default: return 0;
  }
}

int64_t load_int(DType t, const std::byte* base, uint64_t j) {
  if (t == DType::i32) {
    int32_t x;
    std::memcpy(&x, base + j * 4, 4);
    return x;
  }
  int64_t x;
  std::memcpy(&x, base + j * 8, 8);
  return x;
}

// The ranks whose inputs make up element j of the result: all of them for a sum, the root for a broadcast.
std::vector<int> contributors(const ConformanceCase& c) {
  if (c.op == Op::broadcast) return {broadcast_root(c)};
  std::vector<int> all(static_cast<size_t>(c.ranks));
  for (int r = 0; r < c.ranks; ++r) all[static_cast<size_t>(r)] = r;
  return all;
}

}  // namespace

void fill_input(const ConformanceCase& c, int rank, int round, std::byte* data) {
  for (uint64_t j = 0; j < c.count; ++j) store(c.dtype, data, j, float_value(j, rank, round), int_value(c.dtype, j, rank, round));
}

namespace {

std::string mismatch(const ConformanceCase& c, uint64_t j, int root, const std::string& got, const std::string& want) {
  return "element " + std::to_string(j) + " of " + std::to_string(c.count) + ": got " + got + ", want " + want +
         (c.op == Op::broadcast ? " (rank " + std::to_string(root) + "'s input)" : " (the sum)");
}

std::string str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

std::string check_output(const ConformanceCase& c, int round, const std::byte* data) {
  const std::vector<int> from = contributors(c);
  for (uint64_t j = 0; j < c.count; ++j) {
    if (is_float(c.dtype)) {
      double expect = 0;
      for (int r : from) expect += float_value(j, r, round);
      if (const double have = load_float(c.dtype, data, j); have != expect)
        return mismatch(c, j, from.front(), str(have), str(expect));
    } else {
      int64_t expect = 0;
      for (int r : from) expect += int_value(c.dtype, j, r, round);
      if (const int64_t have = load_int(c.dtype, data, j); have != expect)
        return mismatch(c, j, from.front(), std::to_string(have), std::to_string(expect));
    }
  }
  return "";
}

namespace {

class HostMemory final : public DeviceMemory {
 public:
  explicit HostMemory(size_t bytes) : data_(bytes) {}
  Buffer buffer() override { return Buffer{data_.empty() ? nullptr : data_.data(), Device::cpu, 0}; }
  void upload(const std::byte* host, size_t bytes) override { if (bytes) std::memcpy(data_.data(), host, bytes); }
  void download(std::byte* host, size_t bytes) override { if (bytes) std::memcpy(host, data_.data(), bytes); }

 private:
  std::vector<std::byte> data_;
};

}  // namespace

std::unique_ptr<DeviceMemory> host_memory(size_t bytes) { return std::make_unique<HostMemory>(bytes); }

std::string run_case_on_rank(Engine& engine, const ConformanceCase& c, int rank, DeviceMemory& memory) {
  const std::string who = case_name(c) + " rank " + std::to_string(rank);
  const size_t bytes = c.count * dtype_size(c.dtype);
  std::vector<std::byte> host(bytes);
  for (int round = 0; round < kRounds; ++round) {
    fill_input(c, rank, round, host.data());
    memory.upload(host.data(), bytes);
    CompletionWaiter waiter;
    Task t;
    t.name = "conformance." + case_name(c);
    t.op = c.op;
    t.dtype = c.dtype;
    t.count = c.count;
    t.buffer = memory.buffer();
    t.root = broadcast_root(c);
    t.on_done = waiter.callback();
    engine.submit(std::move(t));
    engine.backward_done();
    // Generous for a loaded 2-core machine; a backend that loses the task fails here instead of hanging the suite.
    if (const Status st = waiter.wait(std::chrono::seconds(60)); !st.ok()) {
      engine.shutdown();  // completes what is still pending, so no callback outlives `waiter`
      return who + " round " + std::to_string(round) + ": the task failed: " + st.message;
    }
    memory.download(host.data(), bytes);
    if (std::string bad = check_output(c, round, host.data()); !bad.empty())
      return who + " round " + std::to_string(round) + ": " + bad;
  }
  return "";
}

}  // namespace commsched::testing
