// The prefix index at scale: lookups of 32K-token prompts against about a
// million cached blocks.
//
// The tree (one per block size, built once and reused by every benchmark of
// that size) holds `--index_blocks` blocks (default 2^20) as sequences of
// 32K random tokens: each starts with one of 64 shared 2K-token "system
// prompts" and goes on with its own tokens, so the root and the nodes where
// the prompts end have many children (hash maps) and every other node has
// one. Each iteration looks up a different cached sequence, so the walk
// misses the CPU caches as a server's would.
//
//   BM_Match        PrefixIndex::Match alone (its own tree, one shared payload)
//   BM_CacheLookup  Cache::Lookup of a registered model whose tiny payloads
//                   (1 layer, 1 KV head, head_dim 1, fp16) come from a SlabPool,
//                   with the system clock and the LRU policy
//   BM_CacheLookupLease  the same, taking a lease (released in the loop)
//   BM_IndexWalk    a post-order walk of the whole tree reading each node's
//                   payload pointer: what Compactor::CompactPool does under the
//                   cache lock to find the blocks of the spans it drains
//
// Kinds (the second argument): 0 a full hit of all 32K tokens; 1 a partial
// hit (the prompt differs from a cached one at token 16K); 2 a miss (the
// first block is not cached); 3 a full hit of the same prompt every time
// (its nodes stay in the CPU caches: the floor without memory misses). Counters: matched tokens per
// lookup, and for the tree, heap bytes per cached block (mallinfo2 before and after building it)
// and, for the cache, what its metadata accounting counts per block.
//
// Flags besides Google Benchmark's: --index_blocks=N (a smaller tree for
// callgrind), --no_deadlock_detection (as slab_pool_benchmark).
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/common/splitmix64.h"
#include "server/core/block_test_util.h"
#include "server/core/cache.h"
#include "server/core/prefix_index.h"

namespace kvcache {
namespace {

constexpr uint64_t kPromptTokens = 32 << 10;
constexpr uint64_t kSystemPromptTokens = 2 << 10;
constexpr uint32_t kSystemPrompts = 64;
uint64_t g_index_blocks = uint64_t{1} << 20;

// Sequence `s`: system prompt s % 64, then tokens of its own.
std::vector<Token> Sequence(uint64_t s) {
  std::vector<Token> tokens(kPromptTokens);
  for (uint64_t t = 0; t < kPromptTokens; ++t) {
    const uint64_t seed = t < kSystemPromptTokens ? (s % kSystemPrompts) << 32 : (s + 1000) << 32;
    tokens[t] = static_cast<Token>(SplitMix64(seed + t) % 128000);
  }
  return tokens;
}

uint64_t HeapInUse() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

// One block size's trees and the prompts to look up.
struct World {
  uint32_t block_tokens = 0;
  uint64_t sequences = 0;
  PrefixIndex* index = nullptr;  // for BM_Match
  std::unique_ptr<PrefixIndex> owned_index;
  double index_heap_per_block = 0;
  std::unique_ptr<Cache> cache;
  ModelKey model{"default", "bench"};
  double cache_heap_per_block = 0;
  double cache_metadata_per_block = 0;
  // Per kind: prompts to cycle through.
  std::vector<std::vector<Token>> prompts[4];
};

ModelLayout TinyLayout(uint32_t block_tokens) {
  return ModelLayout{1, 1, 1, DType::kFp16, block_tokens};  // 4 bytes a token
}

std::unique_ptr<World> Build(uint32_t block_tokens) {
  auto w = std::make_unique<World>();
  w->block_tokens = block_tokens;
  const uint64_t blocks_per_seq = kPromptTokens / block_tokens;
  const uint64_t shared = kSystemPromptTokens / block_tokens;
  // Shared prefixes are stored once: total = 64 * shared + S * (per - shared).
  w->sequences = (g_index_blocks - kSystemPrompts * shared) / (blocks_per_seq - shared);

  // The bare index.
  const uint64_t heap0 = HeapInUse();
  w->owned_index = std::make_unique<PrefixIndex>(block_tokens);
  const BlockRef payload = SealedHeapBlock(std::vector<std::byte>(64));
  for (uint64_t s = 0; s < w->sequences; ++s) {
    const std::vector<Token> tokens = Sequence(s);
    IndexNode* node = nullptr;
    for (uint64_t b = 0; b < blocks_per_seq; ++b) {
      std::span<const Token> block =
          std::span<const Token>(tokens).subspan(b * block_tokens, block_tokens);
      IndexNode* child = w->owned_index->FindChild(node, block);
      if (child == nullptr) child = w->owned_index->AddChild(node, block, payload);
      node = child;
    }
  }
  w->index = w->owned_index.get();
  w->index_heap_per_block =
      static_cast<double>(HeapInUse() - heap0) / static_cast<double>(w->index->num_blocks());

  // The cache, filled through the append path.
  const ModelLayout layout = TinyLayout(block_tokens);
  SlabPoolOptions pool_options;
  pool_options.capacity_bytes = uint64_t{4} << 30;
  pool_options.min_class_bytes = 64;
  auto pool = SlabPool::Create(pool_options);
  if (!pool.ok()) std::abort();
  const uint64_t heap1 = HeapInUse();
  w->cache =
      std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(), SystemClock::Get());
  if (!w->cache->RegisterModel(w->model, layout).ok()) std::abort();
  const std::vector<std::byte> kv(blocks_per_seq * layout.BlockBytes(), std::byte{7});
  for (uint64_t s = 0; s < w->sequences; ++s) {
    auto session = w->cache->BeginAppend(w->model, Sequence(s), 0, {}, {});
    if (!session.ok() || !(*session)->Write(kv).ok() || !(*session)->Commit().ok()) std::abort();
  }
  const CacheStats stats = w->cache->GetStats();
  w->cache_heap_per_block =
      static_cast<double>(HeapInUse() - heap1) / static_cast<double>(stats.blocks);
  w->cache_metadata_per_block =
      static_cast<double>(stats.metadata_bytes) / static_cast<double>(stats.blocks);

  // Prompts: 256 of each kind, spread over the cached sequences.
  for (uint64_t i = 0; i < 256; ++i) {
    const uint64_t s = SplitMix64(i) % w->sequences;
    w->prompts[0].push_back(Sequence(s));
    std::vector<Token> partial = Sequence(s);
    partial[kPromptTokens / 2] ^= 0x40000000;
    w->prompts[1].push_back(std::move(partial));
    std::vector<Token> miss = Sequence(w->sequences + i);  // not cached...
    miss[0] ^= 0x40000000;                                 // ...not even its system prompt
    w->prompts[2].push_back(std::move(miss));
  }
  w->prompts[3].push_back(w->prompts[0][0]);
  return w;
}

// The world of `block_tokens`, built on first use; building another frees it.
World& GetWorld(uint32_t block_tokens) {
  static std::unique_ptr<World> world;
  static absl::Mutex mu;
  absl::MutexLock lock(&mu);
  if (world == nullptr || world->block_tokens != block_tokens) {
    world.reset();
    world = Build(block_tokens);
  }
  return *world;
}

void ReportTree(benchmark::State& state, const World& w, uint64_t matched, uint64_t lookups) {
  // Per thread, averaged over threads.
  constexpr auto kAvg = benchmark::Counter::kAvgThreads;
  state.counters["matched_tokens"] = {static_cast<double>(matched) / static_cast<double>(lookups),
                                      kAvg};
  state.counters["blocks"] = {static_cast<double>(w.index->num_blocks()), kAvg};
  state.SetItemsProcessed(static_cast<int64_t>(lookups));
}

void BM_Match(benchmark::State& state) {
  World& w = GetWorld(static_cast<uint32_t>(state.range(0)));
  const auto& prompts = w.prompts[state.range(1)];
  std::vector<IndexNode*> path;
  path.reserve(kPromptTokens / w.block_tokens);
  uint64_t i = 0, matched = 0;
  for (auto _ : state) {
    path.clear();
    w.index->Match(prompts[i++ % prompts.size()], &path);
    matched += path.size() * w.block_tokens;
    benchmark::DoNotOptimize(path.data());
  }
  ReportTree(state, w, matched, i);
  state.counters["heap_per_block"] = w.index_heap_per_block;
}

void LookupLoop(benchmark::State& state, bool lease) {
  World& w = GetWorld(static_cast<uint32_t>(state.range(0)));
  const auto& prompts = w.prompts[state.range(1)];
  uint64_t i = state.thread_index() * 17, lookups = 0, matched = 0;
  for (auto _ : state) {
    auto r = w.cache->Lookup(w.model, prompts[i++ % prompts.size()], {.acquire = lease});
    if (!r.ok()) {
      state.SkipWithError("Lookup failed");
      break;
    }
    ++lookups;
    matched += r->matched_tokens;
    if (r->lease_id != 0) w.cache->ReleaseLease(r->lease_id);
    benchmark::DoNotOptimize(r->blocks.data());
  }
  ReportTree(state, w, matched, lookups);
  state.counters["heap_per_block"] = {w.cache_heap_per_block, benchmark::Counter::kAvgThreads};
  state.counters["metadata_per_block"] = {w.cache_metadata_per_block,
                                          benchmark::Counter::kAvgThreads};
}

void BM_CacheLookup(benchmark::State& state) { LookupLoop(state, /*lease=*/false); }
void BM_CacheLookupLease(benchmark::State& state) { LookupLoop(state, /*lease=*/true); }

void BM_IndexWalk(benchmark::State& state) {
  World& w = GetWorld(static_cast<uint32_t>(state.range(0)));
  uint64_t seen = 0;
  for (auto _ : state) {
    w.index->VisitPostOrder(
        [&](IndexNode* n) { seen += reinterpret_cast<uintptr_t>(n->payload.get()) & 1; });
    benchmark::DoNotOptimize(seen);
  }
  state.counters["blocks"] = static_cast<double>(w.index->num_blocks());
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(w.index->num_blocks()));
}

benchmark::internal::Benchmark* Configure(benchmark::internal::Benchmark* b, int64_t bt,
                                          int64_t kind) {
  return b->ArgNames({"bt", "kind"})->Args({bt, kind})->Unit(benchmark::kMicrosecond);
}

// Every benchmark of one block size before the next, so each tree is built once.
void RegisterAll() {
  for (int64_t bt : {64, 16}) {
    for (int64_t kind : {0, 1, 2, 3}) {
      Configure(benchmark::RegisterBenchmark("BM_Match", BM_Match), bt, kind);
    }
    for (int64_t kind : {0, 1, 2, 3}) {
      Configure(benchmark::RegisterBenchmark("BM_CacheLookup", BM_CacheLookup), bt, kind);
    }
    Configure(benchmark::RegisterBenchmark("BM_CacheLookup", BM_CacheLookup), bt, 0)
        ->Threads(2)
        ->UseRealTime();
    Configure(benchmark::RegisterBenchmark("BM_CacheLookupLease", BM_CacheLookupLease), bt, 0);
    benchmark::RegisterBenchmark("BM_IndexWalk", BM_IndexWalk)
        ->ArgName("bt")
        ->Arg(bt)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg == "--no_deadlock_detection") {
      absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    } else if (arg.starts_with("--index_blocks=")) {
      kvcache::g_index_blocks = std::strtoull(argv[i] + 15, nullptr, 10);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  kvcache::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
