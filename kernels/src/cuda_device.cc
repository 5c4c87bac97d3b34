#include <cuda_runtime_api.h>

#include "kvcache/kernels/cuda_kernels.h"

namespace kvcache::kernels {

bool CudaDeviceAvailable() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // Clear the error so it does not leak into later calls.
    return false;
  }
  return count > 0;
}

}  // namespace kvcache::kernels
