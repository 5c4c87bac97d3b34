// Throughput of the request path across models, 1 to 8 worker threads, each
// thread on a model of its own: one Cache holding all eight models (every
// request takes the cache's one mutex) against eight Caches of one model
// each (nothing shared: what a lock per model could reach at best), measured
// in the same run. The ratio at each thread count is the cost of sharing.
//
// Two kinds of operation, on prompts each model has cached (2,048 tokens,
// 32 blocks of 64 tokens, 256-byte blocks so that locking, not copying,
// is what is measured):
//   kind 0  a worker's hit: Lookup of the prompt, then PrepareFetch of it
//           (its blocks pinned for the fetch, then let go)
//   kind 1  an append of the prompt again: every block hashed and found
//           cached (deduplicated); nothing is stored
//   kind 2  an append of a new turn: the prompt with its last block's tokens
//           new each time, so 31 blocks are deduplicated and one is stored.
//           These caches are small (64 MiB for the eight models, 8 MiB for
//           each model alone: the same capacity in all), so after the first
//           seconds every commit also evicts a block (and a prompt evicted
//           meanwhile is stored whole again)
//
//   build/server/core/cache_scaling_benchmark --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true --benchmark_min_time=0.5
//
// items_per_second counts the operations of all threads together, in real
// time; on a machine with fewer cores than threads the curve flattens from
// the core count on either way, and the ratio still shows what sharing costs.
#include <benchmark/benchmark.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/common/splitmix64.h"
#include "server/core/cache.h"

namespace kvcache {
namespace {

constexpr int kModels = 8;
constexpr uint32_t kBlockTokens = 64;
constexpr uint64_t kPromptTokens = 2048;
constexpr uint64_t kSequences = 128;  // cached prompts per model

ModelLayout Layout() { return ModelLayout{1, 1, 1, DType::kFp16, kBlockTokens}; }  // 256 B blocks

std::vector<Token> Prompt(int model, uint64_t s) {
  std::vector<Token> t(kPromptTokens);
  for (uint64_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<Token>(
        SplitMix64((uint64_t{static_cast<uint32_t>(model)} << 40) ^ (s << 20) ^ i) & 0xffffff);
  }
  return t;
}

std::unique_ptr<Cache> NewCache(uint64_t capacity_bytes) {
  SlabPoolOptions pool;
  pool.capacity_bytes = capacity_bytes;
  pool.min_class_bytes = 64;
  auto made = SlabPool::Create(pool);
  if (!made.ok()) std::abort();
  return std::make_unique<Cache>(CacheOptions{}, *std::move(made), NewLruPolicy(),
                                 SystemClock::Get());
}

ModelKey KeyOf(int model) { return {"default", "model-" + std::to_string(model)}; }

void Fill(Cache& cache, int model) {
  if (!cache.RegisterModel(KeyOf(model), Layout()).ok()) std::abort();
  const std::vector<std::byte> kv(kPromptTokens / kBlockTokens * Layout().BlockBytes(),
                                  std::byte{7});
  for (uint64_t s = 0; s < kSequences; ++s) {
    auto session = cache.BeginAppend(KeyOf(model), Prompt(model, s), 0, {}, {});
    if (!session.ok() || !(*session)->Write(kv).ok() || !(*session)->Commit().ok()) std::abort();
  }
}

struct World {
  std::unique_ptr<Cache> shared;                         // all eight models
  std::array<std::unique_ptr<Cache>, kModels> separate;  // one model each
  std::array<std::vector<std::vector<Token>>, kModels> prompts;
  std::vector<std::byte> kv;
};

World* NewWorld(uint64_t shared_capacity_bytes, uint64_t separate_capacity_bytes) {
  auto* w = new World;
  w->shared = NewCache(shared_capacity_bytes);
  for (int m = 0; m < kModels; ++m) {
    Fill(*w->shared, m);
    w->separate[m] = NewCache(separate_capacity_bytes);
    Fill(*w->separate[m], m);
    for (uint64_t s = 0; s < kSequences; ++s) w->prompts[m].push_back(Prompt(m, s));
  }
  w->kv.assign(kPromptTokens / kBlockTokens * Layout().BlockBytes(), std::byte{7});
  return w;
}

// Hits and deduplicated appends: room for everything.
World& GetWorld() {
  static World* world = NewWorld(uint64_t{1} << 30, uint64_t{1} << 30);
  return *world;
}

// New turns: the same capacity shared or split, small enough to fill.
World& GetNewTurnWorld() {
  static World* world = NewWorld(uint64_t{64} << 20, uint64_t{8} << 20);
  return *world;
}

// Gives the last block of `prompt` tokens no prompt has had before.
void MakeNewTurn(std::vector<Token>& prompt, uint64_t turn) {
  for (uint64_t t = kPromptTokens - kBlockTokens; t < kPromptTokens; ++t) {
    prompt[t] = static_cast<Token>(SplitMix64(turn ^ (t << 48)) & 0xffffff);
  }
}

void Run(benchmark::State& state, bool shared) {
  const int kind = static_cast<int>(state.range(0));
  World& w = kind == 2 ? GetNewTurnWorld() : GetWorld();
  const int model = state.thread_index() % kModels;
  Cache& cache = shared ? *w.shared : *w.separate[model];
  const ModelKey key = KeyOf(model);
  const auto& prompts = w.prompts[model];
  // New turns are numbered apart for every run of every thread.
  static std::atomic<uint64_t> next_run{1};
  uint64_t turn = next_run.fetch_add(1) << 32;
  std::vector<Token> new_turn;
  uint64_t i = static_cast<uint64_t>(state.thread_index()) * 17;
  uint64_t stored = 0;
  for (auto _ : state) {
    const std::vector<Token>* prompt = &prompts[i++ % prompts.size()];
    if (kind == 2) {
      new_turn = *prompt;
      MakeNewTurn(new_turn, ++turn);
      prompt = &new_turn;
    }
    if (kind != 0) {
      auto session = cache.BeginAppend(key, *prompt, 0, {}, {});
      if (!session.ok() || !(*session)->Write(w.kv).ok()) {
        state.SkipWithError("append failed");
        break;
      }
      auto committed = (*session)->Commit();
      // A new turn stores its last block, and the whole prompt again when
      // that was evicted meanwhile (the models idle at a lower thread
      // count go cold in the shared cache).
      if (!committed.ok() || (kind == 1) != (committed->stored_blocks == 0)) {
        state.SkipWithError("the append did not store what it should");
        break;
      }
      stored += committed->stored_blocks;
      continue;
    }
    auto found = cache.Lookup(key, *prompt);
    auto plan = cache.PrepareFetch(key, {.tokens = *prompt});
    if (!found.ok() || !plan.ok() || plan->matched_tokens != kPromptTokens) {
      state.SkipWithError("not a whole hit");
      break;
    }
    benchmark::DoNotOptimize(plan->blocks.data());
  }
  state.SetItemsProcessed(state.iterations());
  // Blocks a new turn stored on average: 1, more when prompts were evicted.
  if (kind == 2) {
    state.counters["stored_per_op"] =
        benchmark::Counter(static_cast<double>(stored), benchmark::Counter::kAvgIterations);
  }
}

void BM_OneCache(benchmark::State& state) { Run(state, /*shared=*/true); }
void BM_CachePerModel(benchmark::State& state) { Run(state, /*shared=*/false); }

void Threads(benchmark::internal::Benchmark* b) {
  b->ArgName("kind")->Arg(0)->Arg(1)->Arg(2)->UseRealTime();
  for (int t : {1, 2, 4, 8}) b->Threads(t);
}
BENCHMARK(BM_OneCache)->Apply(Threads);
BENCHMARK(BM_CachePerModel)->Apply(Threads);

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
