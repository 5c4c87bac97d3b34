// One behaviour suite for every DeviceMemory (house style, practice 6): included by exactly one
// test file per implementation, which defines MakeTestDevice(). Tests skip (never fail) when
// Probe() says the device is not usable.
#ifndef KVCACHE_GPU_TESTS_DEVICE_SUITE_H_
#define KVCACHE_GPU_TESTS_DEVICE_SUITE_H_

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ipc_child.h"
#include "kvcache/gpu/arena_mappings.h"
#include "kvcache/gpu/device_memory.h"
#include "kvcache/gpu/gpu_block_pool.h"
#include "test_util.h"

namespace kvcache::gpu::test {

inline std::string ToHex(const void* data, size_t bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

inline bool FromHex(const std::string& hex, void* data, size_t bytes) {
  if (hex.size() != 2 * bytes) return false;
  auto* p = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    p[i] = static_cast<unsigned char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return true;
}

inline std::vector<std::byte> Xor5A(std::vector<std::byte> bytes) {
  for (std::byte& b : bytes) b ^= std::byte{0x5a};
  return bytes;
}

// The child's work, in whatever process runs it.
inline int IpcChildBody(DeviceMemory* device, const ExportedArena& exported, uint64_t offset,
                        uint64_t bytes, uint64_t checksum) {
  if (!device->Probe().usable) return 10;
  ArenaMappings mappings(device);
  if (!mappings.Map(exported).ok()) return 11;
  if (!mappings.Map(exported).ok() || mappings.size() != 1) return 11;  // mapped once
  std::byte* remote = nullptr;
  if (!mappings.Resolve(exported.arena, offset, bytes, &remote).ok()) return 12;
  Arena own;
  if (!device->AllocateArena(bytes, &own).ok()) return 13;
  if (!device->Copy(CopyKind::kDeviceToDevice, own.base, remote, bytes).ok()) return 14;
  std::vector<std::byte> host(bytes);
  if (!device->Copy(CopyKind::kDeviceToHost, host.data(), own.base, bytes).ok()) return 14;
  if (TestChecksum(host.data(), bytes) != checksum) return 15;
  host = Xor5A(std::move(host));
  if (!device->Copy(CopyKind::kHostToDevice, own.base, host.data(), bytes).ok()) return 16;
  if (!device->Copy(CopyKind::kDeviceToDevice, remote, own.base, bytes).ok()) return 16;
  if (!device->FreeArena(own.id).ok()) return 17;
  if (!mappings.CloseAll().ok()) return 17;
  return 0;
}

int RunIpcChild(int argc, char** argv) {
  if (argc != 4) return 20;
  ExportedArena exported;
  if (!FromHex(argv[0], &exported, sizeof(exported))) return 20;
  auto device = MakeTestDevice();
  return IpcChildBody(device.get(), exported, std::strtoull(argv[1], nullptr, 10),
                      std::strtoull(argv[2], nullptr, 10), std::strtoull(argv[3], nullptr, 10));
}

// Runs the child as a fresh process (fork + exec of this binary); its exit code, or -1.
inline int RunChildProcess(const ExportedArena& exported, const GpuBlockHandle& handle) {
  const std::string hex = ToHex(&exported, sizeof(exported));
  const std::string offset = std::to_string(handle.offset);
  const std::string bytes = std::to_string(handle.bytes);
  const std::string checksum = std::to_string(handle.checksum);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const char* args[] = {"ipc-child",   "--ipc-child",    hex.c_str(), offset.c_str(),
                          bytes.c_str(), checksum.c_str(), nullptr};
    execv("/proc/self/exe", const_cast<char* const*>(args));
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

class DeviceSuite : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = MakeTestDevice();
    info_ = device_->Probe();
    if (!info_.usable) GTEST_SKIP() << "no usable device (" << info_.reason << "); skipped";
  }

  // A pool of small arenas: 4 MiB arenas of 1 MiB slabs, 64 KiB smallest class.
  std::unique_ptr<GpuBlockPool> MakePool(uint64_t capacity_bytes = uint64_t{16} << 20) {
    GpuBlockPoolOptions options;
    options.allocator.capacity_bytes = capacity_bytes;
    options.allocator.arena_bytes = uint64_t{4} << 20;
    options.allocator.slab_bytes = uint64_t{1} << 20;
    options.allocator.min_block_bytes = uint64_t{64} << 10;
    options.checksum = TestChecksum;
    std::unique_ptr<GpuBlockPool> pool;
    const GpuStatus s = GpuBlockPool::Create(device_.get(), options, &pool);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return pool;
  }

  GpuBlockHandle PutRandom(GpuBlockPool* pool, size_t bytes, uint64_t seed) {
    const std::vector<std::byte> data = RandomBytes(bytes, seed);
    GpuBlockHandle handle;
    const GpuStatus s = pool->Put(data.data(), bytes, TestChecksum(data.data(), bytes), &handle);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return handle;
  }

  std::unique_ptr<DeviceMemory> device_;
  DeviceInfo info_;
};

TEST_F(DeviceSuite, ProbeDescribesTheDevice) {
  EXPECT_TRUE(info_.reason.empty());
  EXPECT_FALSE(info_.kind.empty());
  EXPECT_FALSE(info_.name.empty());
  EXPECT_GT(info_.total_bytes, 0u);
  EXPECT_LE(info_.free_bytes, info_.total_bytes);
}

TEST_F(DeviceSuite, SyncCopiesRoundTrip) {
  Arena arena;
  ASSERT_TRUE(device_->AllocateArena(uint64_t{3} << 20, &arena).ok());
  EXPECT_NE(arena.id, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.base) % 256, 0u);
  const std::vector<std::byte> data = RandomBytes(1 << 20, 1);
  ASSERT_TRUE(device_->Copy(CopyKind::kHostToDevice, arena.base, data.data(), data.size()).ok());
  ASSERT_TRUE(
      device_->Copy(CopyKind::kDeviceToDevice, arena.base + (2 << 20), arena.base, data.size())
          .ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(
      device_->Copy(CopyKind::kDeviceToHost, back.data(), arena.base + (2 << 20), back.size())
          .ok());
  EXPECT_EQ(back, data);
  EXPECT_TRUE(device_->Copy(CopyKind::kHostToDevice, arena.base, data.data(), 0).ok());
  EXPECT_TRUE(device_->FreeArena(arena.id).ok());
  EXPECT_EQ(device_->FreeArena(arena.id).code, GpuCode::kNotFound);
}

TEST_F(DeviceSuite, RegisteredHostMemoryCopiesBothWays) {
  // Two page-aligned ranges of one mapping, as a host pool registers its spans.
  const size_t bytes = size_t{2} << 20;
  void* mapped =
      mmap(nullptr, 2 * bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  auto* host = static_cast<std::byte*>(mapped);
  ASSERT_TRUE(device_->RegisterHost(host, bytes).ok());
  ASSERT_TRUE(device_->RegisterHost(host + bytes, bytes).ok());
  EXPECT_EQ(device_->registered_host_bytes(), 2 * bytes);
  // Overlapping, empty and null ranges are refused and change nothing.
  EXPECT_EQ(device_->RegisterHost(host + 4096, 4096).code, GpuCode::kInvalidArgument);
  EXPECT_EQ(device_->RegisterHost(host + bytes - 4096, 8192).code, GpuCode::kInvalidArgument);
  EXPECT_EQ(device_->RegisterHost(host, 0).code, GpuCode::kInvalidArgument);
  EXPECT_EQ(device_->RegisterHost(nullptr, 4096).code, GpuCode::kInvalidArgument);
  EXPECT_EQ(device_->UnregisterHost(host + 4096).code, GpuCode::kNotFound);
  EXPECT_EQ(device_->registered_host_bytes(), 2 * bytes);

  const std::vector<std::byte> data = RandomBytes(bytes, 7);
  std::memcpy(host, data.data(), bytes);
  Arena arena;
  ASSERT_TRUE(device_->AllocateArena(bytes, &arena).ok());
  ASSERT_TRUE(device_->Copy(CopyKind::kHostToDevice, arena.base, host, bytes).ok());
  ASSERT_TRUE(device_->Copy(CopyKind::kDeviceToHost, host + bytes, arena.base, bytes).ok());
  EXPECT_EQ(std::memcmp(host + bytes, data.data(), bytes), 0);

  ASSERT_TRUE(device_->UnregisterHost(host).ok());
  ASSERT_TRUE(device_->UnregisterHost(host + bytes).ok());
  EXPECT_EQ(device_->UnregisterHost(host).code, GpuCode::kNotFound);
  EXPECT_EQ(device_->registered_host_bytes(), 0u);
  EXPECT_TRUE(device_->FreeArena(arena.id).ok());
  munmap(mapped, 2 * bytes);
}

TEST_F(DeviceSuite, AsyncCopiesOnStreams) {
  Arena arena;
  ASSERT_TRUE(device_->AllocateArena(uint64_t{8} << 20, &arena).ok());
  StreamId a = 0, b = 0;
  ASSERT_TRUE(device_->CreateStream(&a).ok());
  ASSERT_TRUE(device_->CreateStream(&b).ok());
  EXPECT_NE(a, b);
  std::vector<std::vector<std::byte>> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(RandomBytes(1 << 20, 100 + i));
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(device_
                    ->CopyAsync(CopyKind::kHostToDevice, arena.base + (uint64_t{1} << 20) * i,
                                blocks[i].data(), blocks[i].size(), i % 2 ? a : b)
                    .ok());
  }
  ASSERT_TRUE(device_->Synchronize(a).ok());
  ASSERT_TRUE(device_->Synchronize(b).ok());
  std::vector<std::vector<std::byte>> back(8, std::vector<std::byte>(1 << 20));
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(device_
                    ->CopyAsync(CopyKind::kDeviceToHost, back[i].data(),
                                arena.base + (uint64_t{1} << 20) * i, back[i].size(), a)
                    .ok());
  }
  ASSERT_TRUE(device_->Synchronize(a).ok());
  EXPECT_EQ(back, blocks);
  EXPECT_TRUE(device_->DestroyStream(a).ok());
  EXPECT_EQ(device_->Synchronize(a).code, GpuCode::kNotFound);
  EXPECT_EQ(device_->CopyAsync(CopyKind::kHostToDevice, arena.base, blocks[0].data(), 1, a).code,
            GpuCode::kNotFound);
  EXPECT_TRUE(device_->DestroyStream(b).ok());
  EXPECT_TRUE(device_->FreeArena(arena.id).ok());
}

TEST_F(DeviceSuite, CopiesOutsideArenasAreRejected) {
  Arena arena;
  ASSERT_TRUE(device_->AllocateArena(1 << 20, &arena).ok());
  std::vector<std::byte> host(64);
  // Past the end by one byte, wholly outside, and a host pointer given as the device side.
  GpuStatus s =
      device_->Copy(CopyKind::kHostToDevice, arena.base + (1 << 20) - 63, host.data(), 64);
  EXPECT_EQ(s.code, GpuCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message.find("destination"), std::string::npos) << s.message;
  s = device_->Copy(CopyKind::kDeviceToHost, host.data(), host.data(), 64);
  EXPECT_EQ(s.code, GpuCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message.find("source"), std::string::npos) << s.message;
  EXPECT_TRUE(
      device_->Copy(CopyKind::kHostToDevice, arena.base + (1 << 20) - 64, host.data(), 64).ok());
  ASSERT_TRUE(device_->FreeArena(arena.id).ok());
  EXPECT_EQ(device_->Copy(CopyKind::kHostToDevice, arena.base, host.data(), 64).code,
            GpuCode::kInvalidArgument);
  EXPECT_EQ(device_->CloseArena(12345).code, GpuCode::kNotFound);
  ArenaIpcHandle bogus;
  bogus.arena_bytes = 0;
  EXPECT_FALSE(device_->OpenArena(bogus, nullptr).ok());
}

TEST_F(DeviceSuite, PoolRoundTripsVerifiedBlocks) {
  auto pool = MakePool();
  ASSERT_NE(pool, nullptr);
  const std::vector<size_t> sizes = {1, 4096, 65536, 65537, 200000, 1 << 20};
  std::vector<GpuBlockHandle> handles;
  for (size_t i = 0; i < sizes.size(); ++i) handles.push_back(PutRandom(pool.get(), sizes[i], i));
  for (size_t i = 0; i < sizes.size(); ++i) {
    const GpuBlockHandle& h = handles[i];
    EXPECT_EQ(h.bytes, sizes[i]);
    EXPECT_GE(h.slot_bytes, h.bytes);
    std::vector<std::byte> back(h.bytes);
    const GpuStatus s = pool->Get(h, back.data(), back.size());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(back, RandomBytes(sizes[i], i));
  }
  const GpuBlockPoolStats stats = pool->Stats();
  EXPECT_EQ(stats.puts, sizes.size());
  EXPECT_EQ(stats.gets, sizes.size());
  EXPECT_EQ(stats.allocator.live_blocks, sizes.size());
  EXPECT_EQ(pool->Export().size(), stats.allocator.arenas);
  std::vector<std::byte> small(10);
  EXPECT_EQ(pool->Get(handles[1], small.data(), small.size()).code, GpuCode::kInvalidArgument);
  for (const GpuBlockHandle& h : handles) EXPECT_TRUE(pool->Free(h).ok());
  EXPECT_EQ(pool->Free(handles[0]).code, GpuCode::kInvalidArgument);  // double free
  EXPECT_EQ(pool->Stats().allocator.live_blocks, 0u);
}

TEST_F(DeviceSuite, PoolRejectsAWrongChecksumOnPut) {
  auto pool = MakePool();
  const std::vector<std::byte> data = RandomBytes(4096, 7);
  GpuBlockHandle handle;
  EXPECT_EQ(
      pool->Put(data.data(), data.size(), TestChecksum(data.data(), data.size()) + 1, &handle).code,
      GpuCode::kDataLoss);
  EXPECT_EQ(pool->Stats().allocator.live_blocks, 0u);
}

TEST_F(DeviceSuite, PoolDetectsCorruptedDeviceBytes) {
  auto pool = MakePool();
  const GpuBlockHandle handle = PutRandom(pool.get(), 300000, 9);
  std::byte* device_ptr = nullptr;
  ASSERT_TRUE(pool->Locate(handle, &device_ptr).ok());
  const std::byte flipped = RandomBytes(300000, 9)[123456] ^ std::byte{1};
  ASSERT_TRUE(device_->Copy(CopyKind::kHostToDevice, device_ptr + 123456, &flipped, 1).ok());
  std::vector<std::byte> back(handle.bytes);
  const GpuStatus s = pool->Get(handle, back.data(), back.size());
  EXPECT_EQ(s.code, GpuCode::kDataLoss) << s.ToString();
  EXPECT_EQ(pool->Stats().corrupt_blocks, 1u);
}

TEST_F(DeviceSuite, FullTierAnswersResourceExhausted) {
  auto pool = MakePool(uint64_t{8} << 20);  // two arenas, eight 1 MiB slabs
  std::vector<GpuBlockHandle> handles;
  for (int i = 0; i < 8; ++i) handles.push_back(PutRandom(pool.get(), 1 << 20, 50 + i));
  const std::vector<std::byte> data = RandomBytes(1 << 20, 99);
  const uint64_t checksum = TestChecksum(data.data(), data.size());
  GpuBlockHandle extra;
  GpuStatus s = pool->Put(data.data(), data.size(), checksum, &extra);
  EXPECT_EQ(s.code, GpuCode::kResourceExhausted) << s.ToString();
  s = pool->Put(data.data(), 1000, TestChecksum(data.data(), 1000), &extra);
  EXPECT_EQ(s.code, GpuCode::kResourceExhausted) << s.ToString();
  GpuBlockPoolStats stats = pool->Stats();
  EXPECT_EQ(stats.allocator.reserved_bytes, uint64_t{8} << 20);
  EXPECT_EQ(stats.allocator.failed_allocations, 2u);
  EXPECT_DOUBLE_EQ(stats.allocator.utilization(), 1.0);
  ASSERT_TRUE(pool->Free(handles[3]).ok());
  s = pool->Put(data.data(), data.size(), checksum, &extra);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(pool->Get(extra, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
}

TEST_F(DeviceSuite, ConcurrentPutsAndGets) {
  auto pool = MakePool(uint64_t{32} << 20);
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const size_t bytes = 65536 * (1 + (i + t) % 8);
        const std::vector<std::byte> data = RandomBytes(bytes, t * 1000 + i);
        GpuBlockHandle h;
        std::vector<std::byte> back(bytes);
        if (!pool->Put(data.data(), bytes, TestChecksum(data.data(), bytes), &h).ok() ||
            !pool->Get(h, back.data(), bytes).ok() || back != data || !pool->Free(h).ok()) {
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
  EXPECT_EQ(pool->Stats().allocator.live_blocks, 0u);
}

// The worker path: another process maps the pool's arena, copies the block device-to-device,
// verifies it, and writes it back changed; this process sees the change.
TEST_F(DeviceSuite, TwoProcessExportOpenRoundTrip) {
  auto pool = MakePool();
  const GpuBlockHandle handle = PutRandom(pool.get(), 400000, 77);
  const std::vector<ExportedArena> exported = pool->Export();
  ASSERT_EQ(exported.size(), 1u);
  ASSERT_EQ(exported[0].arena, handle.arena);
  EXPECT_EQ(exported[0].handle.arena_bytes, uint64_t{4} << 20);
  ASSERT_EQ(RunChildProcess(exported[0], handle), 0);
  std::vector<std::byte> back(handle.bytes);
  EXPECT_EQ(pool->Get(handle, back.data(), back.size()).code, GpuCode::kDataLoss);
  EXPECT_EQ(back, Xor5A(RandomBytes(400000, 77)));
}

}  // namespace kvcache::gpu::test

#endif  // KVCACHE_GPU_TESTS_DEVICE_SUITE_H_
