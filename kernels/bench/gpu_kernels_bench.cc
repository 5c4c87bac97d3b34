// gpu_kernels_bench: throughput of the CUDA kernels against cudaMemcpy device-to-device.
//
// Needs only the CUDA runtime (no Google Benchmark), so it runs on a bare GPU machine:
//   gpu_kernels_bench [--require-device] [--iterations=N]
// Without a device it prints a note and exits 0 (1 with --require-device). Before timing it
// checks a small case against the CPU twins and exits 1 on any mismatch.
//
// Columns: kv GB/s = uncompressed KV bytes (the fp16/bf16/fp32 slice) per second; dram GB/s =
// all bytes read and written per second (for memcpy: 2x the buffer); % = kv GB/s relative to
// memcpy of the same uncompressed buffer.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvcache/kernels/convert.h"
#include "kvcache/kernels/cuda_kernels.h"

namespace kvcache::kernels {
namespace {

#define BENCH_CHECK_CUDA(expr)                                                                   \
  do {                                                                                           \
    const cudaError_t e = (expr);                                                                \
    if (e != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

#define BENCH_CHECK_OK(expr)                                                                   \
  do {                                                                                         \
    const KernelStatus s = (expr);                                                             \
    if (s != KernelStatus::kOk) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, KernelStatusName(s)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

int iterations = 20;

// Mean milliseconds per call of `fn` on the default stream (after 3 warm-up calls).
double TimeMs(const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  BENCH_CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iterations; ++i) fn();
  BENCH_CHECK_CUDA(cudaEventRecord(stop));
  BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CHECK_CUDA(cudaEventDestroy(start));
  BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  BENCH_CHECK_CUDA(cudaGetLastError());
  return ms / iterations;
}

double GBps(double bytes, double ms) { return bytes / (ms * 1e6); }

std::vector<float> Pseudorandom(size_t n, uint32_t seed) {
  std::vector<float> out(n);
  for (float& x : out) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(seed >> 8) - (1 << 23)) / (1 << 22);
  }
  return out;
}

// Fills `bytes` of device memory with a repeating pseudo-random pattern of `dtype` values.
void FillDevice(void* dst, size_t bytes, DType dtype) {
  const size_t tile_elems = size_t{1} << 20;
  const std::vector<float> values = Pseudorandom(tile_elems, 7);
  std::vector<uint8_t> tile(tile_elems * DTypeSize(dtype));
  BENCH_CHECK_OK(ConvertCpu(values.data(), DType::kFloat32, static_cast<int64_t>(tile_elems), dtype,
                            tile.data()));
  for (size_t off = 0; off < bytes; off += tile.size()) {
    const size_t n = bytes - off < tile.size() ? bytes - off : tile.size();
    BENCH_CHECK_CUDA(
        cudaMemcpy(static_cast<char*>(dst) + off, tile.data(), n, cudaMemcpyHostToDevice));
  }
}

// Small case against the CPU twins; returns false on a mismatch.
bool CheckParity() {
  const int64_t heads = 8, tokens = 64, dim = 128, n = heads * tokens * dim;
  const std::vector<float> x = Pseudorandom(static_cast<size_t>(n), 3);
  std::vector<uint16_t> src(static_cast<size_t>(n));
  BENCH_CHECK_OK(ConvertCpu(x.data(), DType::kFloat32, n, DType::kFloat16, src.data()));
  void *d_src = nullptr, *d_codes = nullptr, *d_scales = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&d_src, n * 2));
  BENCH_CHECK_CUDA(cudaMalloc(&d_codes, n));
  BENCH_CHECK_CUDA(cudaMalloc(&d_scales, n * sizeof(float)));
  BENCH_CHECK_CUDA(cudaMemcpy(d_src, src.data(), n * 2, cudaMemcpyHostToDevice));
  bool ok = true;
  for (QuantAxis axis : {QuantAxis::kPerChannel, QuantAxis::kPerToken}) {
    const int64_t ns = Int8ScaleCount(axis, heads, tokens, dim);
    std::vector<int8_t> cpu_codes(n), gpu_codes(n);
    std::vector<float> cpu_scales(ns), gpu_scales(ns);
    BENCH_CHECK_OK(QuantizeInt8Cpu(src.data(), DType::kFloat16, heads, tokens, dim, axis,
                                   cpu_codes.data(), cpu_scales.data()));
    BENCH_CHECK_OK(QuantizeInt8Cuda(d_src, DType::kFloat16, heads, tokens, dim, axis,
                                    static_cast<int8_t*>(d_codes), static_cast<float*>(d_scales),
                                    nullptr));
    BENCH_CHECK_CUDA(cudaMemcpy(gpu_codes.data(), d_codes, n, cudaMemcpyDeviceToHost));
    BENCH_CHECK_CUDA(
        cudaMemcpy(gpu_scales.data(), d_scales, ns * sizeof(float), cudaMemcpyDeviceToHost));
    ok = ok && gpu_codes == cpu_codes &&
         std::memcmp(gpu_scales.data(), cpu_scales.data(), ns * sizeof(float)) == 0;
  }
  BENCH_CHECK_CUDA(cudaFree(d_src));
  BENCH_CHECK_CUDA(cudaFree(d_codes));
  BENCH_CHECK_CUDA(cudaFree(d_scales));
  return ok;
}

void QuantizeTable() {
  const int64_t kHeads = 8, kTokens = 64, kDim = 128;
  std::printf("\nINT8 quantize / dequantize (KV blocks of %lldx%lldx%lld, heads x tokens x dim)\n",
              static_cast<long long>(kHeads), static_cast<long long>(kTokens),
              static_cast<long long>(kDim));
  std::printf("%-5s %-12s %7s %10s | %-10s %9s %9s %6s\n", "dtype", "op", "blocks", "MiB", "time",
              "kv GB/s", "dram GB/s", "% cpy");
  for (int64_t blocks : {int64_t{1}, int64_t{64}, int64_t{4096}}) {
    const int64_t heads = kHeads * blocks, n = heads * kTokens * kDim;
    for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
      const size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype);
      void *src = nullptr, *copy = nullptr, *codes = nullptr, *scales = nullptr;
      BENCH_CHECK_CUDA(cudaMalloc(&src, bytes));
      BENCH_CHECK_CUDA(cudaMalloc(&copy, bytes));
      BENCH_CHECK_CUDA(cudaMalloc(&codes, n));
      // Per channel there is a scale per (head, dim) column, per token one per
      // (head, token) row: room for whichever is more.
      const int64_t max_scales =
          std::max(Int8ScaleCount(QuantAxis::kPerChannel, heads, kTokens, kDim),
                   Int8ScaleCount(QuantAxis::kPerToken, heads, kTokens, kDim));
      BENCH_CHECK_CUDA(cudaMalloc(&scales, max_scales * sizeof(float)));
      FillDevice(src, bytes, dtype);
      const double mib = bytes / 1048576.0;
      const double cpy_ms = TimeMs(
          [&] { BENCH_CHECK_CUDA(cudaMemcpyAsync(copy, src, bytes, cudaMemcpyDeviceToDevice)); });
      const double cpy = GBps(bytes, cpy_ms);
      std::printf("%-5s %-12s %7lld %10.2f | %7.4f ms %9.1f %9.1f %6s\n", DTypeName(dtype),
                  "memcpy d2d", static_cast<long long>(blocks), mib, cpy_ms, cpy, 2 * cpy, "100");
      for (QuantAxis axis : {QuantAxis::kPerChannel, QuantAxis::kPerToken}) {
        const int64_t ns = Int8ScaleCount(axis, heads, kTokens, kDim);
        const double dram = static_cast<double>(bytes) + n + ns * sizeof(float);
        const char* tag = axis == QuantAxis::kPerChannel ? "K" : "V";
        const double q_ms = TimeMs([&] {
          BENCH_CHECK_OK(QuantizeInt8Cuda(src, dtype, heads, kTokens, kDim, axis,
                                          static_cast<int8_t*>(codes), static_cast<float*>(scales),
                                          nullptr));
        });
        const double d_ms = TimeMs([&] {
          BENCH_CHECK_OK(DequantizeInt8Cuda(static_cast<int8_t*>(codes),
                                            static_cast<float*>(scales), heads, kTokens, kDim, axis,
                                            dtype, copy, nullptr));
        });
        for (int op = 0; op < 2; ++op) {
          const double ms = op == 0 ? q_ms : d_ms;
          const std::string name = std::string(op == 0 ? "quantize " : "dequantize ") + tag;
          std::printf("%-5s %-12s %7lld %10.2f | %7.4f ms %9.1f %9.1f %6.0f\n", DTypeName(dtype),
                      name.c_str(), static_cast<long long>(blocks), mib, ms, GBps(bytes, ms),
                      GBps(dram, ms), 100.0 * GBps(bytes, ms) / cpy);
        }
      }
      BENCH_CHECK_CUDA(cudaFree(src));
      BENCH_CHECK_CUDA(cudaFree(copy));
      BENCH_CHECK_CUDA(cudaFree(codes));
      BENCH_CHECK_CUDA(cudaFree(scales));
    }
  }
}

void OtherKernels() {
  // One layer of a 32K-token context: 8 KV heads x 32768 tokens x 128 dims, fp16 (64 MiB).
  const int64_t heads = 8, tokens = 32768, dim = 128, n = heads * tokens * dim;
  const size_t bytes = static_cast<size_t>(n) * 2;
  void *keys = nullptr, *out = nullptr, *novelty = nullptr, *kept = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&keys, bytes));
  BENCH_CHECK_CUDA(cudaMalloc(&out, bytes));
  BENCH_CHECK_CUDA(cudaMalloc(&novelty, tokens * sizeof(float)));
  BENCH_CHECK_CUDA(cudaMalloc(&kept, tokens * sizeof(int32_t)));
  FillDevice(keys, bytes, DType::kFloat16);
  std::vector<int32_t> half;
  for (int32_t t = 0; t < tokens; t += 2) half.push_back(t);
  BENCH_CHECK_CUDA(
      cudaMemcpy(kept, half.data(), half.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  std::printf("\nOther kernels (fp16 keys, %lld heads x %lld tokens x %lld dims, %.0f MiB)\n",
              static_cast<long long>(heads), static_cast<long long>(tokens),
              static_cast<long long>(dim), bytes / 1048576.0);
  const double nov_ms = TimeMs([&] {
    BENCH_CHECK_OK(KeyNoveltyCuda(keys, DType::kFloat16, heads, tokens, dim,
                                  static_cast<float*>(novelty), nullptr));
  });
  std::printf("  key novelty            %8.4f ms  %8.1f GB/s of keys\n", nov_ms,
              GBps(bytes, nov_ms));
  const double gat_ms = TimeMs([&] {
    BENCH_CHECK_OK(GatherTokensCuda(keys, DType::kFloat16, heads, tokens, dim,
                                    static_cast<int32_t*>(kept), static_cast<int64_t>(half.size()),
                                    out, nullptr));
  });
  std::printf("  gather every 2nd token %8.4f ms  %8.1f GB/s written\n", gat_ms,
              GBps(bytes / 2.0, gat_ms));
  const ImportanceParams params;
  const double imp_ms = TimeMs([&] {
    BENCH_CHECK_OK(ImportanceScoresCuda(static_cast<float*>(novelty), static_cast<float*>(novelty),
                                        tokens, params, static_cast<float*>(out), nullptr));
  });
  std::printf("  importance scores      %8.4f ms  (%lld tokens)\n", imp_ms,
              static_cast<long long>(tokens));
  // Reference attention, fp32: 32 queries over 8192 keys x 128 dims.
  const int64_t nq = 32, nk = 8192;
  void *q = nullptr, *kv = nullptr, *attn = nullptr;
  BENCH_CHECK_CUDA(cudaMalloc(&q, nq * dim * sizeof(float)));
  BENCH_CHECK_CUDA(cudaMalloc(&kv, nk * dim * sizeof(float)));
  BENCH_CHECK_CUDA(cudaMalloc(&attn, nq * dim * sizeof(float)));
  FillDevice(q, nq * dim * sizeof(float), DType::kFloat32);
  FillDevice(kv, nk * dim * sizeof(float), DType::kFloat32);
  const double att_ms = TimeMs([&] {
    BENCH_CHECK_OK(ReferenceAttentionCuda(static_cast<float*>(q), static_cast<float*>(kv),
                                          static_cast<float*>(kv), nq, nk, dim,
                                          static_cast<float*>(attn), nullptr, nullptr));
  });
  std::printf("  reference attention    %8.4f ms  (%lld queries x %lld keys, fp32)\n", att_ms,
              static_cast<long long>(nq), static_cast<long long>(nk));
  for (void* p : {keys, out, novelty, kept, q, kv, attn}) BENCH_CHECK_CUDA(cudaFree(p));
}

}  // namespace
}  // namespace kvcache::kernels

int main(int argc, char** argv) {
  using namespace kvcache::kernels;  // NOLINT(build/namespaces)
  bool require_device = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--require-device") == 0) {
      require_device = true;
    } else if (std::strncmp(argv[i], "--iterations=", 13) == 0) {
      iterations = std::atoi(argv[i] + 13);
      if (iterations < 1) iterations = 1;
    } else {
      std::fprintf(stderr, "usage: %s [--require-device] [--iterations=N]\n", argv[0]);
      return 2;
    }
  }
  if (!CudaDeviceAvailable()) {
    std::printf("gpu_kernels_bench: no CUDA device%s\n",
                require_device ? " (required: failing)" : "; nothing to measure");
    return require_device ? 1 : 0;
  }
  cudaDeviceProp prop;
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s, %d SMs, %.1f GiB, compute capability %d.%d\n", prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor);
  if (!CheckParity()) {
    std::printf("FAILED: CUDA quantize differs from the CPU twin\n");
    return 1;
  }
  std::printf("parity check (fp16 quantize, both axes): bit-identical to CPU\n");
  QuantizeTable();
  OtherKernels();
  return 0;
}
