// A deterministic random workload for collective tests and benchmarks: the same tasks (names, dtypes, sizes, ops,
// priorities) on every rank from one seed; per-rank contents whose sums are exact in every dtype (small integers).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "scheduler/task.h"

namespace commsched::testing {

struct WorkloadTask {
  TaskDesc desc;
  std::vector<std::byte> data;
  std::vector<ByteRange> parts;
};

// Element j of task i on rank r, as a small integer (exact in bf16/f16 after summing up to 16 ranks).
inline int64_t input_value(int task, uint64_t j, int rank) { return static_cast<int64_t>((task * 31 + j * 7 + rank * 13) % 17) - 8; }
inline int64_t broadcast_value(int task, uint64_t j, int rank) { return (rank + 1) * 3 + static_cast<int64_t>((j + task) % 5); }

inline void store_value(std::byte* base, DType t, uint64_t j, int64_t v) {
  switch (t) {
    case DType::f32: reinterpret_cast<float*>(base)[j] = static_cast<float>(v); break;
    case DType::f64: reinterpret_cast<double*>(base)[j] = static_cast<double>(v); break;
    case DType::i32: reinterpret_cast<int32_t*>(base)[j] = static_cast<int32_t>(v); break;
    case DType::i64: reinterpret_cast<int64_t*>(base)[j] = v; break;
    case DType::f16: reinterpret_cast<uint16_t*>(base)[j] = f32_to_f16(static_cast<float>(v)); break;
    case DType::bf16: reinterpret_cast<uint16_t*>(base)[j] = f32_to_bf16(static_cast<float>(v)); break;
  }
}

inline double load_value(const std::byte* base, DType t, uint64_t j) {
  switch (t) {
    case DType::f32: return reinterpret_cast<const float*>(base)[j];
    case DType::f64: return reinterpret_cast<const double*>(base)[j];
    case DType::i32: return reinterpret_cast<const int32_t*>(base)[j];
    case DType::i64: return static_cast<double>(reinterpret_cast<const int64_t*>(base)[j]);
    case DType::f16: return f16_to_f32(reinterpret_cast<const uint16_t*>(base)[j]);
    case DType::bf16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(base)[j]);
  }
  return 0;
}

// Tasks for one iteration (`round`), identical on every rank for the same seed.
inline std::vector<std::unique_ptr<WorkloadTask>> make_workload(uint64_t seed, int num_tasks, uint64_t max_elems,
                                                                 uint64_t partition_bytes, int size, uint64_t round) {
  std::mt19937_64 rng(seed);
  std::vector<std::unique_ptr<WorkloadTask>> tasks;
  for (int i = 0; i < num_tasks; ++i) {
    auto t = std::make_unique<WorkloadTask>();
    TaskDesc& d = t->desc;
    d.id = static_cast<uint64_t>(i) + 1;
    d.name = "layer" + std::to_string(i) + ".grad";
    d.key = task_key(d.name);
    d.priority = i;
    d.dtype = static_cast<DType>(rng() % kNumDTypes);
    // Mostly small tensors (fusion), some big ones (partitioning).
    d.count = (rng() % 4 == 0) ? 1 + rng() % max_elems : 1 + rng() % 64;
    d.op = (rng() % 5 == 0) ? Op::broadcast : Op::allreduce;
    d.root = static_cast<int>(rng() % static_cast<uint64_t>(size));
    d.round = round;
    d.iteration = round;
    t->data.resize(d.bytes());
    d.buffer.data = t->data.data();
    t->parts = partition_ranges(d.count, d.dtype, partition_bytes);
    d.num_partitions = static_cast<uint32_t>(t->parts.size());
    tasks.push_back(std::move(t));
  }
  return tasks;
}

inline void fill_inputs(std::vector<std::unique_ptr<WorkloadTask>>& tasks, int rank) {
  for (size_t i = 0; i < tasks.size(); ++i) {
    auto& t = *tasks[i];
    for (uint64_t j = 0; j < t.desc.count; ++j) {
      const int64_t v = t.desc.op == Op::broadcast ? broadcast_value(static_cast<int>(i), j, rank) : input_value(static_cast<int>(i), j, rank);
      store_value(t.data.data(), t.desc.dtype, j, v);
    }
  }
}

// Returns an empty string when every element holds the expected result, else a description of the first mismatch.
inline std::string check_results(const std::vector<std::unique_ptr<WorkloadTask>>& tasks, int size) {
  for (size_t i = 0; i < tasks.size(); ++i) {
    const auto& t = *tasks[i];
    for (uint64_t j = 0; j < t.desc.count; ++j) {
      int64_t want = 0;
      if (t.desc.op == Op::broadcast) want = broadcast_value(static_cast<int>(i), j, t.desc.root);
      else
        for (int r = 0; r < size; ++r) want += input_value(static_cast<int>(i), j, r);
      const double got = load_value(t.data.data(), t.desc.dtype, j);
      if (got != static_cast<double>(want))
        return "task '" + t.desc.name + "' (" + std::string(dtype_name(t.desc.dtype)) + " " + std::string(op_name(t.desc.op)) +
               ", " + std::to_string(t.desc.count) + " elements) element " + std::to_string(j) + ": got " +
               std::to_string(got) + ", want " + std::to_string(want);
    }
  }
  return {};
}

}  // namespace commsched::testing
