#include "comm_backends/nccl/nccl_backend.h"

#include "comm_backends/collective/fusion_buffer.h"
#include "comm_backends/nccl/nccl_common.h"
#include "cuda/cuda_devices.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace commsched {
using namespace nccl;

namespace {
std::chrono::milliseconds to_ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }
}  // namespace

struct NcclBackend::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::unique_ptr<collective::FusionBuffer> fusion;  // device staging buffer for fused groups
  std::mutex event_mu;
  std::vector<cudaEvent_t> free_events;
  // Guards comm against ncclCommAbort (which frees it) racing with enqueues and error queries from other threads.
  std::mutex comm_mu;
  bool aborted = false;

  // ncclSuccess while healthy; the asynchronous error otherwise (ncclRemoteError, ...); ncclInternalError once aborted.
  ncclResult_t async_error() {
    std::lock_guard lock(comm_mu);
    if (aborted) return ncclInternalError;
    ncclResult_t r = ncclSuccess;
    ncclCommGetAsyncError(comm, &r);
    return r == ncclInProgress ? ncclSuccess : r;
  }

  cudaEvent_t take_event() {
    std::lock_guard lock(event_mu);
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void give_event(cudaEvent_t e) {
    std::lock_guard lock(event_mu);
    free_events.push_back(e);
  }
};

struct NcclBackend::Pending {
  cudaEvent_t event;
  GroupDone done;
};

NcclBackend::NcclBackend(const ClusterEnv& env, collective::CollectiveOptions opts)
    : CollectiveBackend(env.rank, env.num_workers), env_(env), rendezvous_(env, "commsched/nccl/"), impl_(std::make_unique<Impl>()) {
  env.validate();
  const std::string who = "nccl backend rank " + std::to_string(env.rank) + " of " + std::to_string(env.num_workers);
  const int devices = cuda_device_count();
  if (devices == 0) throw std::runtime_error(who + ": no CUDA device visible (cudaGetDeviceCount)");
  device_ = env.local_rank % devices;
  check_cuda(cudaSetDevice(device_), who + ": cudaSetDevice(" + std::to_string(device_) + ")");
  check_cuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), who + ": cudaStreamCreate");
  impl_->fusion = std::make_unique<collective::FusionBuffer>(std::make_unique<nccl::DeviceFusionMemory>(impl_->stream));

  impl_->comm = nccl_communicator(env.rank, env.num_workers, rendezvous_.store(), rendezvous_.scope() + "unique_id",
                                  env.timeout_s, who);
  poller_ = std::thread([this] { poll_completions(); });

  auto nopts = opts.negotiator_options(env);
  nopts.key_prefix = rendezvous_.scope() + "negotiator/";
  start_negotiation(nopts, rendezvous_.store());
}

NcclBackend::~NcclBackend() {
  stop_base();  // negotiator and executor stop, then drain() waits for the events
  if (impl_->comm && !impl_->aborted) ncclCommDestroy(impl_->comm);  // an aborted communicator is already freed
  cudaSetDevice(device_);
  impl_->fusion.reset();  // before the stream it synchronises on
  for (cudaEvent_t e : impl_->free_events) cudaEventDestroy(e);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void NcclBackend::enqueue_collective(void* data, size_t bytes, const TaskDesc& task) {
  const std::string what = "nccl " + std::string(op_name(task.op)) + " of task '" + task.name + "'";
  if (task.op == Op::broadcast) {
    check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, task.root, impl_->comm, impl_->stream), what);
  } else {
    check_nccl(ncclAllReduce(data, data, bytes / dtype_size(task.dtype), nccl_type(task.dtype), ncclSum, impl_->comm,
                             impl_->stream),
               what);
  }
}

void NcclBackend::execute_fused(std::span<const PartitionView> group) {
  impl_->fusion->run(group, [&](void* data, size_t bytes) { enqueue_collective(data, bytes, *group.front().task); });
}

void NcclBackend::execute(std::span<const PartitionView> group, GroupDone done) {
  for (const auto& p : group)
    if (p.task->buffer.device_index != device_)
      throw std::runtime_error("task '" + p.task->name + "' lives on CUDA device " + std::to_string(p.task->buffer.device_index) +
                               " but this rank's communicator uses device " + std::to_string(device_));
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  auto pending = std::make_unique<Pending>();
  pending->event = impl_->take_event();
  {
    std::lock_guard comm_lock(impl_->comm_mu);
    if (impl_->aborted) throw std::runtime_error("communicator aborted");
    if (group.size() > 1) execute_fused(group);
    else enqueue_collective(group.front().data(), group.front().bytes, *group.front().task);
    check_cuda(cudaEventRecord(pending->event, impl_->stream), "cudaEventRecord");
  }
  pending->done = std::move(done);
  {
    std::lock_guard lock(mu_);
    inflight_.push_back(std::move(pending));
    ++outstanding_;
  }
  cv_.notify_one();
}

void NcclBackend::poll_completions() {
  cudaSetDevice(device_);
  for (;;) {
    std::unique_ptr<Pending> front;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !inflight_.empty() || stop_poller_; });
      if (inflight_.empty()) return;
      front = std::move(inflight_.front());
      inflight_.pop_front();
    }
    // Events complete in stream order, so only the oldest needs polling.
    Status st;
    for (;;) {
      const ncclResult_t async = impl_->async_error();
      if (async != ncclSuccess) {
        st = Status::Error("nccl rank " + std::to_string(rank()) + ": communicator failed or aborted: " + ncclGetErrorString(async),
                           async == ncclInternalError ? Status::Code::peer_lost : Status::Code::error);
        break;
      }
      const cudaError_t q = cudaEventQuery(front->event);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        st = Status::Error("nccl rank " + std::to_string(rank()) + ": " + cudaGetErrorString(q));
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    impl_->give_event(front->event);
    front->done(st);
    {
      std::lock_guard lock(mu_);
      --outstanding_;
    }
    cv_.notify_all();
  }
}

void NcclBackend::on_fatal(const Status&) {
  // A dead rank never joins the running collective; aborting the communicator unblocks the stream.
  std::lock_guard lock(impl_->comm_mu);
  if (impl_->aborted || !impl_->comm) return;
  impl_->aborted = true;
  ncclCommAbort(impl_->comm);
}

void NcclBackend::drain() {
  std::unique_lock lock(mu_);
  stop_poller_ = true;
  cv_.notify_all();
  // Outstanding collectives get timeout_s to finish; past that the communicator is aborted so nothing hangs.
  if (!cv_.wait_for(lock, to_ms(env_.timeout_s), [&] { return outstanding_ == 0; })) {
    lock.unlock();
    on_fatal(Status::Error("shutdown timed out"));
    lock.lock();
  }
  lock.unlock();
  if (poller_.joinable()) poller_.join();
}

}  // namespace commsched
