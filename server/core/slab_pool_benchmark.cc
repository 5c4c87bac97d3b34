// SlabPool Allocate+Free against malloc/free and operator new/delete.
//
// Each iteration allocates one block, touches its first byte (so the page is
// really there) and frees it. Sizes: 4 KiB and 256 KiB (class chunks with the
// default 4 MiB slab), 4 MiB (a whole-slab class) and 8 MiB (a large run,
// mapped once and then reused from the free-run list). The multi-threaded
// variants share one pool.
//
// --no_deadlock_detection turns off Abseil's mutex deadlock detection; the
// pool locks a std::mutex, so it only matters for comparisons with code that
// uses absl::Mutex.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "server/core/slab_pool.h"

namespace kvcache {
namespace {

SlabPool& SharedPool() {
  static SlabPool* const pool = [] {
    SlabPoolOptions options;  // 4 MiB slabs, 64-byte smallest class
    options.capacity_bytes = uint64_t{1} << 30;
    return SlabPool::Create(options).value().release();
  }();
  return *pool;
}

void BM_SlabPool(benchmark::State& state) {
  SlabPool& pool = SharedPool();
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  for (auto _ : state) {
    absl::StatusOr<Allocation> a = pool.Allocate(bytes);
    if (!a.ok()) {
      state.SkipWithError("SlabPool::Allocate failed");
      break;
    }
    a->data[0] = std::byte{1};
    benchmark::DoNotOptimize(a->data);
    pool.Free(*a);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Malloc(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    auto* p = static_cast<char*>(std::malloc(bytes));
    p[0] = 1;
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_OperatorNew(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    auto* p = static_cast<char*>(::operator new(bytes));
    p[0] = 1;
    benchmark::DoNotOptimize(p);
    ::operator delete(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {int64_t{4} << 10, int64_t{256} << 10, int64_t{4} << 20, int64_t{8} << 20}) {
    b->Arg(bytes);
  }
  b->Threads(1)->Threads(4)->Threads(8)->UseRealTime();
}

BENCHMARK(BM_SlabPool)->Apply(Sizes);
BENCHMARK(BM_Malloc)->Apply(Sizes);
BENCHMARK(BM_OperatorNew)->Apply(Sizes);

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--no_deadlock_detection") {
      absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
