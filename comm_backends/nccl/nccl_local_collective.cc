#include "comm_backends/nccl/nccl_local_collective.h"

#include "comm_backends/nccl/nccl_common.h"
#include "cuda/cuda_devices.h"

namespace commsched {
using namespace nccl;

struct NcclLocalCollective::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
};

NcclLocalCollective::NcclLocalCollective(const ClusterEnv& env, int local_rank, int local_size,
                                         control::Store& store, const std::string& prefix)
    : rank_(local_rank), size_(local_size), impl_(std::make_unique<Impl>()) {
  const std::string who = "hierarchical nccl local rank " + std::to_string(local_rank) + " of " + std::to_string(local_size);
  const int devices = cuda_device_count();
  if (devices == 0) throw std::runtime_error(who + ": no CUDA device visible (cudaGetDeviceCount)");
  if (devices < local_size)  // NCCL refuses two ranks of one communicator on one GPU
    throw InvalidArgument(who + ": COMMSCHED_HIERARCHICAL=nccl needs one GPU per worker of a machine, but " +
                          std::to_string(local_size) + " workers see " + std::to_string(devices) + " GPU(s)");
  device_ = local_rank % devices;
  check_cuda(cudaSetDevice(device_), who + ": cudaSetDevice(" + std::to_string(device_) + ")");
  check_cuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), who + ": cudaStreamCreate");
  // Blocking sync: the waiting thread sleeps instead of spinning a core the PS transport needs.
  check_cuda(cudaEventCreateWithFlags(&impl_->done, cudaEventDisableTiming | cudaEventBlockingSync), who + ": cudaEventCreate");
  impl_->comm = nccl_communicator(local_rank, local_size, store, prefix + "unique_id", env.timeout_s, who);
}

NcclLocalCollective::~NcclLocalCollective() {
  cudaSetDevice(device_);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
  if (impl_->done) cudaEventDestroy(impl_->done);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

std::unique_ptr<collective::FusionBuffer::Memory> NcclLocalCollective::fusion_memory() {
  return std::make_unique<DeviceFusionMemory>(impl_->stream);
}

// Waits for what was enqueued on the stream (its event, never the default stream) and for NCCL's own errors.
void NcclLocalCollective::finish(const char* what) {
  check_cuda(cudaEventRecord(impl_->done, impl_->stream), std::string(what) + ": cudaEventRecord");
  check_cuda(cudaEventSynchronize(impl_->done), std::string(what) + ": cudaEventSynchronize");
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(impl_->comm, &async);
  check_nccl(async, what);
}

void NcclLocalCollective::reduce_scatter(std::byte* data, DType dtype, std::span<const uint64_t> slices) {
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  const size_t es = dtype_size(dtype);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  std::byte* at = data;
  for (int r = 0; r < size_; ++r) {
    const uint64_t n = slices[static_cast<size_t>(r)];
    if (n > 0)
      check_nccl(ncclReduce(at, at, n, nccl_type(dtype), ncclSum, r, impl_->comm, impl_->stream),
                 "hierarchical reduce-scatter: ncclReduce");
    at += n * es;
  }
  check_nccl(ncclGroupEnd(), "hierarchical reduce-scatter: ncclGroupEnd");
  finish("hierarchical reduce-scatter");
}

void NcclLocalCollective::all_gather(std::byte* data, DType dtype, std::span<const uint64_t> slices) {
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  const size_t es = dtype_size(dtype);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  std::byte* at = data;
  for (int r = 0; r < size_; ++r) {
    const uint64_t bytes = slices[static_cast<size_t>(r)] * es;
    if (bytes > 0)
      check_nccl(ncclBroadcast(at, at, bytes, ncclUint8, r, impl_->comm, impl_->stream),
                 "hierarchical all-gather: ncclBroadcast");
    at += bytes;
  }
  check_nccl(ncclGroupEnd(), "hierarchical all-gather: ncclGroupEnd");
  finish("hierarchical all-gather");
}

}  // namespace commsched
