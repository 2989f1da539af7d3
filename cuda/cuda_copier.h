// CudaCopier: the DeviceCopier on CUDA. Pinned memory from cudaHostAlloc; per device one non-blocking stream per
// direction (cudaStreamNonBlocking: never ordered after the legacy default stream, so training work there does not
// hold the copies back); completions are pooled events waited on with cudaEventSynchronize by the waiting thread
// alone. Errors are std::runtime_error naming the CUDA call and its arguments.
#pragma once

#include <memory>

#include "scheduler/stages/device_copier.h"

namespace commsched {

// Touches no device until the first copy: a process without a GPU can build it, and a CUDA task there fails with the
// runtime's error (cudaSetDevice: no CUDA-capable device) as that task's error.
std::shared_ptr<DeviceCopier> make_cuda_copier();

}  // namespace commsched
