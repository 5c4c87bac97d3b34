// Google Benchmark driver for the kernel library.
//
// Throughput is reported as bytes of *uncompressed* KV processed per second (the fp16/bf16/fp32
// slice read by quantize, written by dequantize; the int8 codes and scales are not counted),
// next to memcpy of a buffer of the same size (bytes copied per second), so "quantize at X% of
// memcpy" reads directly. Shapes: one KV block for one layer (8 heads x 64 tokens x 128 dims,
// 128 KiB in 16-bit, 256 KiB in fp32), a 1 MiB slice (512 tokens in 16-bit, 256 in fp32) and
// 1024 tokens (2 MiB in 16-bit, 4 MiB in fp32); BM_Memcpy covers each of those sizes. With a
// CUDA device (and a CUDA build) the CUDA twins are timed too, with CUDA events, against
// cudaMemcpy device-to-device.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/convert.h"
#include "kvcache/kernels/gather.h"
#include "kvcache/kernels/importance.h"
#include "kvcache/kernels/novelty.h"
#include "kvcache/kernels/quantize.h"

#if defined(KVCACHE_KERNELS_BENCH_CUDA)
#include <cuda_runtime_api.h>

#include "kvcache/kernels/cuda_kernels.h"
#endif

namespace kvcache::kernels {
namespace {

constexpr int64_t kHeads = 8;
constexpr int64_t kHeadDim = 128;

std::vector<float> Pseudorandom(size_t n) {
  std::vector<float> out(n);
  uint32_t s = 12345;
  for (float& x : out) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / static_cast<float>(1 << 22);
  }
  return out;
}

std::vector<uint8_t> EncodedSlice(DType dtype, int64_t tokens) {
  const std::vector<float> x = Pseudorandom(static_cast<size_t>(kHeads * tokens * kHeadDim));
  std::vector<uint8_t> bytes(x.size() * DTypeSize(dtype));
  ConvertCpu(x.data(), DType::kFloat32, static_cast<int64_t>(x.size()), dtype, bytes.data());
  return bytes;
}

std::string Label(DType dtype, QuantAxis axis, int64_t tokens) {
  return std::string(DTypeName(dtype)) +
         (axis == QuantAxis::kPerChannel ? " keys/per-channel " : " values/per-token ") +
         std::to_string(kHeads) + "x" + std::to_string(tokens) + "x" + std::to_string(kHeadDim);
}

// Args: dtype, axis, tokens. Block (64 tokens), 1 MiB and 1024-token slices for each dtype.
void QuantizeArgs(benchmark::internal::Benchmark* b) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    const int64_t mib_tokens = (int64_t{1} << 20) / (kHeads * kHeadDim * DTypeSize(dtype));
    for (QuantAxis axis : {QuantAxis::kPerChannel, QuantAxis::kPerToken}) {
      for (int64_t tokens : {int64_t{64}, mib_tokens, int64_t{1024}}) {
        b->Args({static_cast<int64_t>(dtype), static_cast<int64_t>(axis), tokens});
      }
    }
  }
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> src(bytes, 1), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_Memcpy)->Arg(128 << 10)->Arg(256 << 10)->Arg(1 << 20)->Arg(2 << 20)->Arg(4 << 20);

void BM_QuantizeInt8(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const auto axis = static_cast<QuantAxis>(state.range(1));
  const int64_t tokens = state.range(2);
  const std::vector<uint8_t> src = EncodedSlice(dtype, tokens);
  std::vector<int8_t> codes(static_cast<size_t>(kHeads * tokens * kHeadDim));
  std::vector<float> scales(static_cast<size_t>(Int8ScaleCount(axis, kHeads, tokens, kHeadDim)));
  for (auto _ : state) {
    QuantizeInt8Cpu(src.data(), dtype, kHeads, tokens, kHeadDim, axis, codes.data(), scales.data());
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * src.size()));
  state.SetLabel(Label(dtype, axis, tokens) + " (" + std::to_string(src.size() >> 10) + " KiB)");
}
BENCHMARK(BM_QuantizeInt8)->Apply(QuantizeArgs);

void BM_DequantizeInt8(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const auto axis = static_cast<QuantAxis>(state.range(1));
  const int64_t tokens = state.range(2);
  std::vector<uint8_t> out = EncodedSlice(dtype, tokens);
  std::vector<int8_t> codes(static_cast<size_t>(kHeads * tokens * kHeadDim));
  std::vector<float> scales(static_cast<size_t>(Int8ScaleCount(axis, kHeads, tokens, kHeadDim)));
  QuantizeInt8Cpu(out.data(), dtype, kHeads, tokens, kHeadDim, axis, codes.data(), scales.data());
  for (auto _ : state) {
    DequantizeInt8Cpu(codes.data(), scales.data(), kHeads, tokens, kHeadDim, axis, dtype,
                      out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * out.size()));
  state.SetLabel(Label(dtype, axis, tokens) + " (" + std::to_string(out.size() >> 10) + " KiB)");
}
BENCHMARK(BM_DequantizeInt8)->Apply(QuantizeArgs);

void BM_KeyNoveltyF16(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const std::vector<uint8_t> keys = EncodedSlice(DType::kFloat16, tokens);
  std::vector<float> novelty(static_cast<size_t>(tokens));
  for (auto _ : state) {
    KeyNoveltyCpu(keys.data(), DType::kFloat16, kHeads, tokens, kHeadDim, novelty.data());
    benchmark::DoNotOptimize(novelty.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * keys.size()));
}
BENCHMARK(BM_KeyNoveltyF16)->Arg(64)->Arg(512);

void BM_ImportanceScores(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const std::vector<float> attention = Pseudorandom(static_cast<size_t>(tokens));
  std::vector<float> scores(static_cast<size_t>(tokens));
  const ImportanceParams params;
  for (auto _ : state) {
    ImportanceScoresCpu(attention.data(), attention.data(), tokens, params, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens);
}
BENCHMARK(BM_ImportanceScores)->Arg(4096);

void BM_GatherHalfF16(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const std::vector<uint8_t> src = EncodedSlice(DType::kFloat16, tokens);
  std::vector<int32_t> kept;
  for (int32_t t = 0; t < tokens; t += 2) kept.push_back(t);
  std::vector<uint8_t> dst(src.size() / 2);
  for (auto _ : state) {
    GatherTokensCpu(src.data(), DType::kFloat16, kHeads, tokens, kHeadDim, kept.data(),
                    static_cast<int64_t>(kept.size()), dst.data());
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * dst.size()));
}
BENCHMARK(BM_GatherHalfF16)->Arg(64)->Arg(512);

void BM_ReferenceAttention(benchmark::State& state) {
  const int64_t keys = state.range(0);
  const std::vector<float> q = Pseudorandom(kHeadDim), kv = Pseudorandom(keys * kHeadDim);
  std::vector<float> out(kHeadDim), weights(static_cast<size_t>(keys));
  for (auto _ : state) {
    ReferenceAttentionCpu(q.data(), kv.data(), kv.data(), 1, keys, kHeadDim, out.data(),
                          weights.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * keys);
}
BENCHMARK(BM_ReferenceAttention)->Arg(4096);

#if defined(KVCACHE_KERNELS_BENCH_CUDA)
// Times `body` (which enqueues work on the default stream) with CUDA events.
template <typename Body>
void TimeCuda(benchmark::State& state, size_t bytes, Body body) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  body();  // Warm-up.
  cudaDeviceSynchronize();
  for (auto _ : state) {
    cudaEventRecord(start);
    body();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void RegisterCudaBenchmarks() {
  // tokens: one block (64) and a batch of 4096 blocks' worth (256 MiB of fp16).
  for (int64_t tokens : {int64_t{64}, int64_t{64} * 4096}) {
    const std::string shape = "/8x" + std::to_string(tokens) + "x128";
    const size_t elements = static_cast<size_t>(kHeads * tokens * kHeadDim);
    const size_t bytes = elements * 2;
    benchmark::RegisterBenchmark(("BM_CudaMemcpyD2D" + shape).c_str(), [=](benchmark::State&
                                                                               state) {
      void *a = nullptr, *b = nullptr;
      cudaMalloc(&a, bytes);
      cudaMalloc(&b, bytes);
      TimeCuda(state, bytes, [&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
      cudaFree(a);
      cudaFree(b);
    })->UseManualTime();
    for (QuantAxis axis : {QuantAxis::kPerChannel, QuantAxis::kPerToken}) {
      const std::string name =
          std::string(axis == QuantAxis::kPerChannel ? "PerChannel" : "PerToken") + "F16" + shape;
      const size_t num_scales = static_cast<size_t>(Int8ScaleCount(axis, kHeads, tokens, kHeadDim));
      benchmark::RegisterBenchmark(("BM_CudaQuantize" + name).c_str(), [=](benchmark::State&
                                                                               state) {
        void* src = nullptr;
        int8_t* codes = nullptr;
        float* scales = nullptr;
        cudaMalloc(&src, bytes);
        cudaMemset(src, 0x3C, bytes);
        cudaMalloc(reinterpret_cast<void**>(&codes), elements);
        cudaMalloc(reinterpret_cast<void**>(&scales), num_scales * sizeof(float));
        TimeCuda(state, bytes, [&] {
          QuantizeInt8Cuda(src, DType::kFloat16, kHeads, tokens, kHeadDim, axis, codes, scales,
                           nullptr);
        });
        cudaFree(src);
        cudaFree(codes);
        cudaFree(scales);
      })->UseManualTime();
      benchmark::RegisterBenchmark(("BM_CudaDequantize" + name).c_str(), [=](benchmark::State&
                                                                                 state) {
        void* dst = nullptr;
        int8_t* codes = nullptr;
        float* scales = nullptr;
        cudaMalloc(&dst, bytes);
        cudaMalloc(reinterpret_cast<void**>(&codes), elements);
        cudaMemset(codes, 1, elements);
        cudaMalloc(reinterpret_cast<void**>(&scales), num_scales * sizeof(float));
        cudaMemset(scales, 0, num_scales * sizeof(float));
        TimeCuda(state, bytes, [&] {
          DequantizeInt8Cuda(codes, scales, kHeads, tokens, kHeadDim, axis, DType::kFloat16, dst,
                             nullptr);
        });
        cudaFree(dst);
        cudaFree(codes);
        cudaFree(scales);
      })->UseManualTime();
    }
  }
}
#endif

}  // namespace
}  // namespace kvcache::kernels

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
#if defined(KVCACHE_KERNELS_BENCH_CUDA)
  if (kvcache::kernels::CudaDeviceAvailable()) kvcache::kernels::RegisterCudaBenchmarks();
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
