// What the NCCL backend and the NCCL local collective of hierarchical mode share: error checks, dtype mapping, the
// fusion buffer's device memory and the communicator's creation from a unique id in a rendezvous store.
// Internal to comm_backends/nccl (it includes the CUDA and NCCL headers).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "comm_backends/collective/fusion_buffer.h"
#include "comm_backends/collective/kv_store.h"
#include "base/types.h"

namespace commsched::nccl {

inline void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

inline void check_nccl(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress) throw std::runtime_error(what + ": " + ncclGetErrorString(r));
}

inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  throw std::invalid_argument("nccl: unknown dtype value " + std::to_string(static_cast<int>(t)));
}

// Device memory for a fusion buffer: copies are ordered on `stream`, before and after the collective; a buffer is
// freed only once the stream no longer reads it.
class DeviceFusionMemory final : public collective::FusionBuffer::Memory {
 public:
  explicit DeviceFusionMemory(cudaStream_t stream) : stream_(stream) {}
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "nccl fusion buffer of " + std::to_string(bytes) + " bytes");
    return p;
  }
  void release(void* buffer) override {
    cudaStreamSynchronize(stream_);  // rare: only when the fused size grows, and at shutdown
    cudaFree(buffer);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "nccl fusion copy");
  }

 private:
  cudaStream_t stream_;
};

// One communicator of `size` ranks: rank 0 makes the unique id and publishes it under `id_key`, the others read it
// (waiting up to max(60 s, 3 x timeout_s)). `who` prefixes errors. Blocks until every rank has joined.
ncclComm_t nccl_communicator(int rank, int size, control::Store& store, const std::string& id_key, double timeout_s,
                             const std::string& who);

}  // namespace commsched::nccl
