// gpu_tier_bench: what the GPU tier's per-block copies cost against one large copy.
//
// For each block size (64 KiB .. 8 MiB) it moves the same total bytes (default 512 MiB) three
// ways, host-to-device from pinned host memory (cudaHostAlloc), device-to-host into it, and
// device-to-device between two arenas, once as per-block copies through CudaDeviceMemory
// (CopyAsync on one stream, then Synchronize: the tier's path) and once as a single
// cudaMemcpyAsync of all the bytes (the peer). It prints GB/s of both and their ratio; the best
// of --reps runs counts. Then H2D from mmap'd host memory, pageable and after
// DeviceMemory::RegisterHost (the host pool's path with gpu_tier.pin_host_memory), against the
// same one-copy peer. Needs only the CUDA runtime.
//
// Usage: gpu_tier_bench [--total-mib N] [--reps N] [--require-device]
//   Without a usable device it prints "no device: <reason>" and exits 0 (1 with
//   --require-device).
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kvcache/gpu/cuda_device_memory.h"

namespace {

using kvcache::gpu::Arena;
using kvcache::gpu::CopyKind;
using kvcache::gpu::DeviceMemory;
using kvcache::gpu::GpuStatus;
using kvcache::gpu::StreamId;

bool Check(const GpuStatus& s, const char* what) {
  if (s.ok()) return true;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return false;
}

bool CheckCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

struct Buffers {
  std::byte* host = nullptr;  // pinned
  std::byte* dev_a = nullptr;
  std::byte* dev_b = nullptr;
};

// Seconds for one run; negative on error.
double TimeBlocks(DeviceMemory* device, StreamId stream, CopyKind kind, const Buffers& b,
                  uint64_t total, uint64_t block) {
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t off = 0; off < total; off += block) {
    void* dst = nullptr;
    const void* src = nullptr;
    switch (kind) {
      case CopyKind::kHostToDevice:
        dst = b.dev_a + off, src = b.host + off;
        break;
      case CopyKind::kDeviceToHost:
        dst = b.host + off, src = b.dev_a + off;
        break;
      case CopyKind::kDeviceToDevice:
        dst = b.dev_b + off, src = b.dev_a + off;
        break;
    }
    if (!Check(device->CopyAsync(kind, dst, src, block, stream), "CopyAsync")) return -1;
  }
  if (!Check(device->Synchronize(stream), "Synchronize")) return -1;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double TimeOne(cudaStream_t stream, CopyKind kind, const Buffers& b, uint64_t total) {
  const auto start = std::chrono::steady_clock::now();
  cudaError_t e = cudaSuccess;
  switch (kind) {
    case CopyKind::kHostToDevice:
      e = cudaMemcpyAsync(b.dev_a, b.host, total, cudaMemcpyHostToDevice, stream);
      break;
    case CopyKind::kDeviceToHost:
      e = cudaMemcpyAsync(b.host, b.dev_a, total, cudaMemcpyDeviceToHost, stream);
      break;
    case CopyKind::kDeviceToDevice:
      e = cudaMemcpyAsync(b.dev_b, b.dev_a, total, cudaMemcpyDeviceToDevice, stream);
      break;
  }
  if (!CheckCuda(e, "cudaMemcpyAsync") || !CheckCuda(cudaStreamSynchronize(stream), "sync")) {
    return -1;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t total_mib = 512;
  int reps = 5;
  bool require_device = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--require-device") == 0) {
      require_device = true;
    } else if (std::strcmp(argv[i], "--total-mib") == 0 && i + 1 < argc) {
      total_mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--total-mib N] [--reps N] [--require-device]\n", argv[0]);
      return 2;
    }
  }
  total_mib = std::max<uint64_t>(8, total_mib / 8 * 8);  // a multiple of the largest block
  const uint64_t total = total_mib << 20;

  auto device = kvcache::gpu::NewCudaDeviceMemory(0);
  const kvcache::gpu::DeviceInfo info = device->Probe();
  if (!info.usable) {
    std::printf("no device: %s\n", info.reason.c_str());
    return require_device ? 1 : 0;
  }
  std::printf("device: %s (sm_%d), driver %d, runtime %d, %.1f GiB\n", info.name.c_str(),
              info.compute_capability, info.driver_version, info.runtime_version,
              info.total_bytes / double(1 << 30));

  Arena a, b;
  StreamId stream = 0;
  Buffers buffers;
  if (!Check(device->AllocateArena(total, &a), "arena a") ||
      !Check(device->AllocateArena(total, &b), "arena b") ||
      !Check(device->CreateStream(&stream), "stream") ||
      !CheckCuda(
          cudaHostAlloc(reinterpret_cast<void**>(&buffers.host), total, cudaHostAllocDefault),
          "cudaHostAlloc")) {
    return 1;
  }
  buffers.dev_a = a.base;
  buffers.dev_b = b.base;
  std::memset(buffers.host, 0x5a, total);
  cudaStream_t peer_stream = nullptr;
  if (!CheckCuda(cudaStreamCreateWithFlags(&peer_stream, cudaStreamNonBlocking), "stream")) {
    return 1;
  }

  std::printf("%llu MiB per run, best of %d; GB/s = 1e9 bytes/s\n",
              static_cast<unsigned long long>(total_mib), reps);
  std::printf("%-6s %10s %8s %12s %12s %7s\n", "kind", "block", "copies", "blocks GB/s",
              "one-copy GB/s", "ratio");
  const CopyKind kinds[] = {CopyKind::kHostToDevice, CopyKind::kDeviceToHost,
                            CopyKind::kDeviceToDevice};
  const char* names[] = {"H2D", "D2H", "D2D"};
  for (int k = 0; k < 3; ++k) {
    double one = 1e30;
    for (int r = 0; r < reps; ++r) {
      const double t = TimeOne(peer_stream, kinds[k], buffers, total);
      if (t < 0) return 1;
      one = std::min(one, t);
    }
    for (uint64_t block = 64 << 10; block <= (8 << 20); block *= 2) {
      double blocks = 1e30;
      for (int r = 0; r < reps; ++r) {
        const double t = TimeBlocks(device.get(), stream, kinds[k], buffers, total, block);
        if (t < 0) return 1;
        blocks = std::min(blocks, t);
      }
      std::printf("%-6s %7llu KiB %8llu %12.1f %12.1f %7.2f\n", names[k],
                  static_cast<unsigned long long>(block >> 10),
                  static_cast<unsigned long long>(total / block), total / blocks / 1e9,
                  total / one / 1e9, one / blocks);
    }
  }

  // The host pool's memory: mmap'd (pageable), then the same pages after RegisterHost, as the
  // daemon registers its pool with gpu_tier.pin_host_memory. Per-block H2D against the one
  // pinned copy above.
  void* mapped = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  std::memset(mapped, 0x5a, total);
  double one = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t = TimeOne(peer_stream, CopyKind::kHostToDevice, buffers, total);
    if (t < 0) return 1;
    one = std::min(one, t);
  }
  Buffers pool = buffers;
  pool.host = static_cast<std::byte*>(mapped);
  for (const char* mode : {"pageable", "registered"}) {
    if (std::strcmp(mode, "registered") == 0 &&
        !Check(device->RegisterHost(mapped, total), "RegisterHost")) {
      return 1;
    }
    for (uint64_t block = 64 << 10; block <= (8 << 20); block *= 4) {
      double blocks = 1e30;
      for (int r = 0; r < reps; ++r) {
        const double t =
            TimeBlocks(device.get(), stream, CopyKind::kHostToDevice, pool, total, block);
        if (t < 0) return 1;
        blocks = std::min(blocks, t);
      }
      std::printf("H2D %-10s %7llu KiB %8llu %12.1f %12.1f %7.2f\n", mode,
                  static_cast<unsigned long long>(block >> 10),
                  static_cast<unsigned long long>(total / block), total / blocks / 1e9,
                  total / one / 1e9, one / blocks);
    }
  }
  if (!Check(device->UnregisterHost(mapped), "UnregisterHost")) return 1;
  munmap(mapped, total);

  cudaStreamDestroy(peer_stream);
  cudaFreeHost(buffers.host);
  return 0;
}
