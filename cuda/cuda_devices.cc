#include "cuda/cuda_devices.h"

#include <cuda_runtime_api.h>

namespace commsched {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return n;
}

}  // namespace commsched
