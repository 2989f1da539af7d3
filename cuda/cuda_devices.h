// What CUDA devices this process sees. The one place that asks (backends, tests and benchmarks that need a GPU).
#pragma once

namespace commsched {

// Number of CUDA devices visible to this process; 0 when there is no driver or no device (never throws).
int cuda_device_count();

}  // namespace commsched
