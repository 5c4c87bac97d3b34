// The DeviceMemory behaviour suite over CUDA: every case skips without a usable device. The
// two-process case is a real CUDA IPC round trip (the child is a fresh exec of this binary).
// Without a device, the start-up path runs instead: Probe() says why, everything is UNAVAILABLE.
#include "kvcache/gpu/cuda_device_memory.h"

#include "device_suite.h"

namespace kvcache::gpu::test {

std::unique_ptr<DeviceMemory> MakeTestDevice() { return NewCudaDeviceMemory(0); }

namespace {

TEST(CudaDeviceMemory, WithoutADeviceProbeSaysWhyAndCallsAreUnavailable) {
  auto device = NewCudaDeviceMemory(0);
  const DeviceInfo info = device->Probe();
  EXPECT_EQ(info.kind, "cuda");
  if (info.usable) return;  // not a skip: run.sh fails on skips when a GPU is present
  EXPECT_FALSE(info.reason.empty());
  std::printf("Probe(): %s (driver %d, runtime %d)\n", info.reason.c_str(), info.driver_version,
              info.runtime_version);
  Arena arena;
  EXPECT_EQ(device->AllocateArena(4096, &arena).code, GpuCode::kUnavailable);
  GpuBlockPoolOptions options;
  options.checksum = TestChecksum;
  std::unique_ptr<GpuBlockPool> pool;
  EXPECT_EQ(GpuBlockPool::Create(device.get(), options, &pool).code, GpuCode::kUnavailable);
}

TEST(CudaDeviceMemory, BadDeviceOrdinalIsNotUsable) {
  auto device = NewCudaDeviceMemory(1000);
  const DeviceInfo info = device->Probe();
  EXPECT_FALSE(info.usable);
  EXPECT_FALSE(info.reason.empty());
}

}  // namespace
}  // namespace kvcache::gpu::test
