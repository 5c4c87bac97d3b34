// The DeviceMemory behaviour suite over the host-memory stand-in (always runs), plus what only
// the stand-in can show: a plain fork() child, the "no device" start-up path, device OOM.
#include <sys/wait.h>
#include <unistd.h>

#include "device_suite.h"

namespace kvcache::gpu::test {

std::unique_ptr<DeviceMemory> MakeTestDevice() { return NewHostStandInMemory(); }

namespace {

TEST_F(DeviceSuite, ForkedChildOpensTheExportedArena) {
  auto pool = MakePool();
  const GpuBlockHandle handle = PutRandom(pool.get(), 70000, 5);
  const ExportedArena exported = pool->Export().at(0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto device = NewHostStandInMemory();
    _exit(IpcChildBody(device.get(), exported, handle.offset, handle.bytes, handle.checksum));
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::byte* device_ptr = nullptr;
  ASSERT_TRUE(pool->Locate(handle, &device_ptr).ok());
  std::vector<std::byte> back(handle.bytes);
  ASSERT_TRUE(device_->Copy(CopyKind::kDeviceToHost, back.data(), device_ptr, back.size()).ok());
  EXPECT_EQ(back, Xor5A(RandomBytes(70000, 5)));
}

TEST(HostStandIn, OpensItsOwnHandlesToo) {
  auto device = NewHostStandInMemory();
  Arena arena;
  ASSERT_TRUE(device->AllocateArena(100000, &arena).ok());
  ArenaIpcHandle handle;
  ASSERT_TRUE(device->ExportArena(arena.id, &handle).ok());
  EXPECT_EQ(handle.arena_bytes, 100000u);
  ArenaMapping mapping;
  ASSERT_TRUE(device->OpenArena(handle, &mapping).ok());
  EXPECT_NE(mapping.base, arena.base);
  const std::vector<std::byte> data = RandomBytes(1000, 3);
  ASSERT_TRUE(device->Copy(CopyKind::kHostToDevice, arena.base + 500, data.data(), 1000).ok());
  std::vector<std::byte> back(1000);
  ASSERT_TRUE(device->Copy(CopyKind::kDeviceToHost, back.data(), mapping.base + 500, 1000).ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(device->Copy(CopyKind::kDeviceToHost, back.data(), mapping.base + 99999, 2).code,
            GpuCode::kInvalidArgument);
  EXPECT_TRUE(device->CloseArena(mapping.id).ok());
  EXPECT_EQ(device->CloseArena(mapping.id).code, GpuCode::kNotFound);
  ASSERT_TRUE(device->FreeArena(arena.id).ok());
  EXPECT_FALSE(device->OpenArena(handle, &mapping).ok());  // the memfd is gone
  ArenaIpcHandle garbage = handle;
  garbage.opaque[0] ^= 1;
  EXPECT_EQ(device->OpenArena(garbage, &mapping).code, GpuCode::kInvalidArgument);
}

TEST(HostStandIn, UnusableDeviceSaysWhyAndRefusesEverything) {
  HostStandInOptions options;
  options.usable = false;
  options.unusable_reason = "no CUDA device";
  auto device = NewHostStandInMemory(options);
  const DeviceInfo info = device->Probe();
  EXPECT_FALSE(info.usable);
  EXPECT_EQ(info.reason, "no CUDA device");
  Arena arena;
  EXPECT_EQ(device->AllocateArena(4096, &arena).code, GpuCode::kUnavailable);
  StreamId stream;
  EXPECT_EQ(device->CreateStream(&stream).code, GpuCode::kUnavailable);
  GpuBlockPoolOptions pool_options;
  pool_options.checksum = TestChecksum;
  std::unique_ptr<GpuBlockPool> pool;
  const GpuStatus s = GpuBlockPool::Create(device.get(), pool_options, &pool);
  EXPECT_EQ(s.code, GpuCode::kUnavailable);
  EXPECT_NE(s.message.find("no CUDA device"), std::string::npos) << s.message;
}

TEST(HostStandIn, DeviceOutOfMemoryIsResourceExhausted) {
  HostStandInOptions options;
  options.device_bytes = uint64_t{6} << 20;
  auto device = NewHostStandInMemory(options);
  // The pool's capacity allows four arenas, the device holds one: the device's limit wins.
  GpuBlockPoolOptions pool_options;
  pool_options.allocator = {uint64_t{16} << 20, uint64_t{4} << 20, uint64_t{1} << 20, 65536};
  pool_options.checksum = TestChecksum;
  std::unique_ptr<GpuBlockPool> pool;
  ASSERT_TRUE(GpuBlockPool::Create(device.get(), pool_options, &pool).ok());
  const std::vector<std::byte> data = RandomBytes(1 << 20, 1);
  const uint64_t checksum = TestChecksum(data.data(), data.size());
  GpuBlockHandle handle;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool->Put(data.data(), 1 << 20, checksum, &handle).ok());
  const GpuStatus s = pool->Put(data.data(), 1 << 20, checksum, &handle);
  EXPECT_EQ(s.code, GpuCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message.find("out of memory"), std::string::npos) << s.message;
  EXPECT_EQ(pool->Stats().allocator.arenas, 1u);
}

TEST(GpuStatus, CodesAreTheAbslNumbers) {
  EXPECT_EQ(static_cast<int>(GpuCode::kResourceExhausted), 8);
  EXPECT_EQ(static_cast<int>(GpuCode::kDataLoss), 15);
  EXPECT_EQ(GpuStatus::Error(GpuCode::kNotFound, "x").ToString(), "not_found: x");
  EXPECT_EQ(GpuStatus::Ok().ToString(), "ok");
}

}  // namespace
}  // namespace kvcache::gpu::test
