// One rank of a multi-process conformance case (conformance_test.cc starts it through LocalCluster, on loopback).
// With COMMSCHED_ROLE=server it runs a parameter server; otherwise it builds the backend named by --backend from the
// COMMSCHED_* environment, runs the case through an Engine and checks the result.
//
//   conformance_rank --backend ps|gloo|nccl --ranks N --dtype f32 --count C --op push_pull|allreduce|broadcast
//
// Exit codes: 0 the result is right, 1 wrong result or failed task (message on stderr), 4 bad usage.
#include <cstring>
#include <iostream>
#include <string>

#include "comm_backends/cluster_env.h"
#include "comm_backends/backend_registry.h"
#include "comm_backends/ps/ps_backend.h"
#include "comm_backends/ps/server.h"
#include "tests/integration/conformance/conformance_case.h"
#if COMMSCHED_HAVE_GLOO
#include "comm_backends/gloo/gloo_backend.h"
#endif
#if COMMSCHED_HAVE_CUDA
#include <cuda_runtime.h>

#include "comm_backends/nccl/nccl_backend.h"
#endif

using namespace commsched;
using namespace commsched::testing;

namespace {

#if COMMSCHED_HAVE_CUDA
// The task's buffer on the rank's GPU: NCCL reduces device memory.
class CudaMemory final : public DeviceMemory {
 public:
  CudaMemory(size_t bytes, int device) : device_(device) {
    cudaSetDevice(device);
    if (bytes > 0 && cudaMalloc(&data_, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  ~CudaMemory() override { if (data_) cudaFree(data_); }
  Buffer buffer() override { return Buffer{data_, Device::cuda, device_}; }
  void upload(const std::byte* host, size_t bytes) override {
    if (bytes && cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) throw std::runtime_error("upload failed");
  }
  void download(std::byte* host, size_t bytes) override {
    if (bytes && cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("download failed");
  }

 private:
  int device_;
  void* data_ = nullptr;
};
#endif

// Built the way the product builds it: through the backend registry.
std::shared_ptr<CommBackend> make_backend(BackendKind kind, const ClusterEnv& env) {
  return find_backend(backend_kind_name(kind))->make(env, EngineConfig::from_env());
}

std::unique_ptr<DeviceMemory> memory_for(BackendKind kind, size_t bytes, [[maybe_unused]] CommBackend& backend) {
#if COMMSCHED_HAVE_CUDA
  if (kind == BackendKind::nccl) return std::make_unique<CudaMemory>(bytes, static_cast<NcclBackend&>(backend).device());
#endif
  (void)kind;
  return host_memory(bytes);
}

ConformanceCase parse_args(int argc, char** argv) {
  ConformanceCase c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--backend") c.backend = parse_backend_kind(v);
    else if (k == "--ranks") c.ranks = std::stoi(v);
    else if (k == "--dtype") c.dtype = parse_dtype(v);
    else if (k == "--count") c.count = std::stoull(v);
    else if (k == "--op") c.op = parse_op(v);
    else throw InvalidArgument("unknown argument " + k);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const ClusterEnv env = ClusterEnv::from_env();
    if (env.role == Role::server) return run_server(env, PsConfig::from_env(), /*owns_process=*/true);
    const ConformanceCase c = parse_args(argc, argv);
    auto backend = make_backend(c.backend, env);
    const Device device = c.backend == BackendKind::nccl ? Device::cuda : Device::cpu;
    if (!backend->supports(c.op, device)) {
      std::cerr << case_name(c) << ": backend '" << backend->name() << "' says it does not support " << op_name(c.op)
                << "; the test's table of supported operations is wrong\n";
      return 1;
    }
    auto memory = memory_for(c.backend, c.count * dtype_size(c.dtype), *backend);
    auto engine = make_conformance_engine(backend, c);
    const std::string bad = run_case_on_rank(*engine, c, env.rank, *memory);
    engine->shutdown();
    if (!bad.empty()) {
      std::cerr << bad << "\n";
      return 1;
    }
    std::cout << case_name(c) << " rank " << env.rank << ": ok\n";
    return 0;
  } catch (const InvalidArgument& e) {
    std::cerr << "conformance_rank: " << e.what() << "\n";
    return 4;
  } catch (const std::exception& e) {
    std::cerr << "conformance_rank: " << e.what() << "\n";
    return 1;
  }
}
