// The compression stage: encodes a reduce task's partitions with the task's scheme (compression/codec.h) before the
// backend and decodes the result after it. Keeps the error-feedback residual of every tensor (by name) on this worker.
// Partitions of one tensor touch disjoint ranges of its residual, so they encode in parallel.
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/stage.h"

namespace commsched {

class CompressionStage final : public Stage {
 public:
  explicit CompressionStage(size_t concurrency = 0) : concurrency_(concurrency) {}
  std::string_view name() const override { return "compression"; }
  size_t concurrency() const override { return concurrency_; }
  bool applies(const TaskDesc& task) const override { return task.compression.scheme != compression::Scheme::none; }
  // Top-k and signSGD need a reduction that decodes them: on more than one rank they are refused for all-reduce, and
  // for a backend that cannot sum them.
  std::string refusal(const TaskDesc& task, const CommBackend& backend) const override;
  bool reads_host_memory() const override { return true; }  // the codecs run on the CPU
  void encode(const PartitionView& in, PartitionView& out, std::unique_ptr<StageState>& state) override;
  void decode(const PartitionView& wire, const PartitionView& target, std::unique_ptr<StageState>& state) override;

  // The residual of tensor `name` (residual_dtype elements), empty when it has none yet. For tests and tools.
  std::vector<std::byte> residual(const std::string& name) const;

 private:
  struct Residual {
    DType dtype = DType::f32;
    uint64_t count = 0;
    std::vector<std::byte> data;  // count elements of residual_dtype(dtype), zero at first
  };
  std::byte* residual_for(const TaskDesc& t);

  size_t concurrency_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Residual> residuals_;  // node-based: entries stay put while others are added
};

}  // namespace commsched
