// One conformance case: which backend, how many ranks, which dtype, how many elements, which operation. The same
// code fills the inputs, runs the case on one rank through an Engine (partitions, credit, the scheduling policy, as a
// user's framework hook would) and checks the result, whether the ranks are threads (loopback) or processes (PS, Gloo,
// NCCL: conformance_rank_main.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm_backends/comm_backend.h"
#include "scheduler/engine.h"
#include "base/types.h"

namespace commsched::testing {

enum class BackendKind { loopback, ps, gloo, nccl };
std::string_view backend_kind_name(BackendKind b);
BackendKind parse_backend_kind(std::string_view s);

struct ConformanceCase {
  BackendKind backend = BackendKind::loopback;
  int ranks = 1;
  DType dtype = DType::f32;
  uint64_t count = 0;
  Op op = Op::allreduce;
};

// "gloo_3ranks_bf16_1025_allreduce": a GoogleTest parameter name.
std::string case_name(const ConformanceCase& c);

// The knobs of a case: partitions of 4 KiB, so every size above 4 KiB is split (and the odd sizes leave a short last
// partition), and a credit of four partitions, so big tensors wait for credit. Tensors of a MiB and more get 256 KiB
// partitions: still split, still with a short last one, but a dozen partitions instead of a thousand (each costs a
// few milliseconds of engine round trips on a loaded 2-core machine; the small cases already cover many partitions).
uint64_t partition_bytes(const ConformanceCase& c);
inline uint64_t credit_bytes(const ConformanceCase& c) { return 4 * partition_bytes(c); }
// Every case runs twice with different data: the second round reuses the task's name (key) as training does.
inline constexpr int kRounds = 2;
// Broadcasts come from the last rank: a root other than 0 catches backends that assume rank 0.
inline int broadcast_root(const ConformanceCase& c) { return c.ranks - 1; }

// The Engine a case runs through: PriorityCreditPolicy (the default scheduler) with the case's knobs.
std::unique_ptr<Engine> make_conformance_engine(std::shared_ptr<CommBackend> backend, const ConformanceCase& c);

// Writes rank `rank`'s input of round `round` into `data` (host memory of c.count elements).
void fill_input(const ConformanceCase& c, int rank, int round, std::byte* data);
// Checks `data` (host memory) against the expected result of round `round`; returns "" or the first wrong element.
std::string check_output(const ConformanceCase& c, int round, const std::byte* data);

// Moves host memory to where the task's buffer lives and back (the CUDA copies of the NCCL rank; identity on CPU).
struct DeviceMemory {
  virtual ~DeviceMemory() = default;
  virtual Buffer buffer() = 0;
  virtual void upload(const std::byte* host, size_t bytes) = 0;
  virtual void download(std::byte* host, size_t bytes) = 0;
};
// Host memory of `bytes`.
std::unique_ptr<DeviceMemory> host_memory(size_t bytes);

// Runs every round of `c` on rank `rank` through `engine`; returns "" or what went wrong (naming the case, the round
// and the failure). Never hangs: each round is bounded.
std::string run_case_on_rank(Engine& engine, const ConformanceCase& c, int rank, DeviceMemory& memory);

}  // namespace commsched::testing
