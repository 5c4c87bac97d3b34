// Helpers for the GPU parity tests: a fixture that skips without a device, and device buffers.
#ifndef KVCACHE_KERNELS_TESTS_CUDA_TEST_UTIL_H_
#define KVCACHE_KERNELS_TESTS_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvcache/kernels/cuda_kernels.h"

namespace kvcache::kernels::test {

// Every parity test derives from this: it skips (never fails) on machines without a device.
class CudaParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device; parity test skipped";
  }
};

template <typename P>
class CudaParityTestWithParam : public ::testing::TestWithParam<P> {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device; parity test skipped";
  }
};

// Device allocation of `bytes` bytes plus `offset` leading bytes, so tests can hand kernels a
// deliberately misaligned pointer. Move-only; frees on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, size_t offset = 0) : bytes_(bytes), offset_(offset) {
    EXPECT_EQ(cudaMalloc(&base_, bytes + offset + 1), cudaSuccess);
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host, size_t offset = 0)
      : DeviceBuffer(host.size() * sizeof(T), offset) {
    Upload(host);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (base_ != nullptr) cudaFree(base_);
  }

  template <typename T = void>
  T* get() const {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + offset_);
  }

  template <typename T>
  void Upload(const std::vector<T>& host) {
    ASSERT_LE(host.size() * sizeof(T), bytes_);
    ASSERT_EQ(cudaMemcpy(get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }

  template <typename T>
  std::vector<T> Download(size_t count) const {
    std::vector<T> host(count);
    EXPECT_LE(count * sizeof(T), bytes_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), get(), count * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_;
  size_t offset_;
};

}  // namespace kvcache::kernels::test

#endif  // KVCACHE_KERNELS_TESTS_CUDA_TEST_UTIL_H_
