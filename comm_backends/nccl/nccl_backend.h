// NcclBackend: allreduce (sum) and broadcast of CUDA tensors with NCCL. One communicator per process, created from an
// ncclUniqueId that rank 0 publishes in the ClusterEnv rendezvous store; one non-blocking CUDA stream of its own;
// completion through CUDA events polled by a thread; small partitions that the negotiator groups are fused into one
// device buffer (one NCCL call instead of many latency-bound ones).
//
// The caller hands over buffers that are ready: whatever stream produced them must have finished (or be synchronised)
// before start(); the backend's stream does not wait on the framework's streams.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "comm_backends/cluster_env.h"
#include "comm_backends/collective/collective_backend.h"
#include "comm_backends/collective/kv_store.h"

namespace commsched {

class NcclBackend : public collective::CollectiveBackend {
 public:
  // Picks device local_rank % device count, creates the communicator (blocks until every rank has joined).
  // Throws std::runtime_error naming the rank and the CUDA/NCCL error.
  explicit NcclBackend(const ClusterEnv& env, collective::CollectiveOptions opts = collective::CollectiveOptions::from_env());
  ~NcclBackend() override;

  std::string_view name() const override { return "nccl"; }
  int device() const { return device_; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c = CollectiveBackend::capabilities();
    c.cuda_device = device_;
    return c;
  }

 protected:
  void execute(std::span<const PartitionView> group, GroupDone done) override;
  void on_fatal(const Status& status) override;
  void drain() override;

 private:
  struct Impl;  // CUDA/NCCL handles, kept out of the header so users need no CUDA include path
  struct Pending;

  void enqueue_collective(void* data, size_t bytes, const TaskDesc& task);
  void execute_fused(std::span<const PartitionView> group);
  void poll_completions();

  ClusterEnv env_;
  collective::Rendezvous rendezvous_;
  int device_ = 0;
  std::unique_ptr<Impl> impl_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Pending>> inflight_;
  size_t outstanding_ = 0;  // recorded but not yet completed (queued or being polled)
  bool stop_poller_ = false;
  std::thread poller_;
};

}  // namespace commsched
