// Shared helpers for the Cache unit tests (cache_test.cc, cache_eviction_test.cc,
// tier_test.cc, tier_levels_test.cc and the others that include it): test
// models, deterministic block patterns, and the CacheTest fixture over a real
// SlabPool and a ManualClock. Test-only.
#ifndef KVCACHE_SERVER_CORE_CACHE_TEST_UTIL_H_
#define KVCACHE_SERVER_CORE_CACHE_TEST_UTIL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/common/splitmix64.h"
#include "server/common/status_macros.h"
#include "server/core/cache.h"
#include "server/core/cache_inspector.h"

namespace kvcache {
namespace cache_test {

using enum ::absl::StatusCode;
using ::testing::FieldsAre;
using ::testing::HasSubstr;

constexpr uint32_t kBt = 16;
constexpr uint64_t kSlab = uint64_t{64} << 10;

struct TestModel {
  ModelKey key;
  ModelLayout layout;
  uint64_t salt;
};

inline ModelLayout Layout(uint32_t head_dim, DType dtype) {
  return ModelLayout{1, 1, head_dim, dtype, kBt};  // layers, kv heads, head_dim, dtype, tokens
}
inline TestModel Small() { return {{"default", "small"}, Layout(8, DType::kFp16), 11}; }  // 512 B
inline TestModel Mid() { return {{"default", "mid"}, Layout(16, DType::kFp32), 22}; }     // 2 KiB
inline TestModel Big() { return {{"default", "big"}, Layout(64, DType::kFp32), 33}; }     // 8 KiB
const ModelKey kUnregistered{"default", "nope"};

using Ids = std::vector<uint32_t>;

// Block `id` is tokens id*1024 .. id*1024+15; `extra` tokens make a partial tail.
inline std::vector<Token> Seq(const Ids& ids, uint32_t extra = 0) {
  std::vector<Token> tokens;
  for (uint32_t id : ids) {
    for (uint32_t t = 0; t < kBt; ++t) tokens.push_back(id * 1024 + t);
  }
  for (uint32_t t = 0; t < extra; ++t) tokens.push_back(900'000'000 + t);
  return tokens;
}

inline uint64_t PrefixKey(std::span<const Token> tokens, size_t block) {
  uint64_t key = 0;
  for (size_t b = 0; b <= block; ++b)
    key = BlockHasher::Unkeyed()->ChainKey(key, tokens.subspan(b * kBt, kBt));
  return key;
}

inline std::vector<std::byte> Pattern(const TestModel& m, std::span<const Token> tokens,
                                      size_t block) {
  const uint64_t key = PrefixKey(tokens, block) ^ SplitMix64(m.salt);
  std::vector<std::byte> out(m.layout.BlockBytes());
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t word = SplitMix64(key + i);
    std::memcpy(out.data() + i, &word, std::min<size_t>(8, out.size() - i));
  }
  return out;
}

inline std::vector<std::byte> Kv(const TestModel& m, std::span<const Token> tokens, size_t first,
                                 size_t count) {
  std::vector<std::byte> kv;
  for (size_t b = first; b < first + count; ++b) {
    std::vector<std::byte> block = Pattern(m, tokens, b);
    kv.insert(kv.end(), block.begin(), block.end());
  }
  return kv;
}

inline std::vector<uint64_t> Checksums(const TestModel& m, std::span<const Token> tokens,
                                       size_t first) {
  std::vector<uint64_t> sums;
  for (size_t b = first; b < tokens.size() / kBt; ++b)
    sums.push_back(Checksum(Pattern(m, tokens, b)));
  return sums;
}

inline absl::Status WriteInChunks(AppendSession& session, std::span<const std::byte> kv) {
  static constexpr size_t kChunks[] = {1, 7, 333, 4093, 64, 100003, 5};
  for (size_t i = 0; !kv.empty(); ++i) {
    const size_t n = std::min(kv.size(), kChunks[i % std::size(kChunks)]);
    KVCACHE_RETURN_IF_ERROR(session.Write(kv.first(n)));
    kv = kv.subspan(n);
  }
  return absl::OkStatus();
}

// BeginAppend, Write in odd-sized chunks, Commit.
inline absl::StatusOr<AppendResult> Append(Cache& cache, const TestModel& m,
                                           const std::vector<Token>& tokens,
                                           uint64_t start_token = 0, AppendHints hints = {},
                                           bool checksums = false) {
  const size_t first = start_token / kBt;
  auto session =
      cache.BeginAppend(m.key, tokens, start_token, hints,
                        checksums ? Checksums(m, tokens, first) : std::vector<uint64_t>{});
  if (!session.ok()) return session.status();
  const size_t count = (tokens.size() - start_token) / kBt;
  KVCACHE_RETURN_IF_ERROR(WriteInChunks(**session, Kv(m, tokens, first, count)));
  return (*session)->Commit();
}

// Every block of `plan` holds exactly the pattern of its prefix of `tokens`.
inline ::testing::AssertionResult PlanHolds(const FetchPlan& plan, const TestModel& m,
                                            std::span<const Token> tokens) {
  if (plan.layout != m.layout) return ::testing::AssertionFailure() << "wrong layout";
  if (plan.matched_tokens != plan.blocks.size() * kBt || plan.matched_tokens > tokens.size()) {
    return ::testing::AssertionFailure() << "matched_tokens " << plan.matched_tokens << " for "
                                         << plan.blocks.size() << " blocks";
  }
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    const std::vector<std::byte> expected = Pattern(m, tokens, b);
    std::span<const std::byte> got = plan.blocks[b]->data();
    if (!std::equal(got.begin(), got.end(), expected.begin(), expected.end())) {
      return ::testing::AssertionFailure() << "block " << b << " holds wrong bytes";
    }
    if (plan.blocks[b]->checksum() != Checksum(expected)) {
      return ::testing::AssertionFailure() << "block " << b << " has a wrong checksum";
    }
  }
  return ::testing::AssertionSuccess();
}

// The counts of an append result every test checks, as a tuple-like struct
// for FieldsAre: stored, deduplicated, stored bytes, cached tokens.
struct AppendCounts {
  uint32_t stored_blocks;
  uint32_t deduplicated_blocks;
  uint64_t stored_bytes;
  uint64_t cached_tokens;
};
inline AppendCounts CountsOf(const AppendResult& r) {
  return {r.stored_blocks, r.deduplicated_blocks, r.stored_bytes, r.cached_tokens};
}

// The identity of a looked-up block: index, key, checksum, bytes.
struct BlockIdentity {
  uint32_t index;
  uint64_t key;
  uint64_t checksum;
  uint64_t bytes;
};
inline BlockIdentity IdentityOf(const BlockInfo& b) {
  return {b.index, b.key, b.checksum, b.bytes};
}

template <typename T>
inline absl::StatusCode CodeOf(const absl::StatusOr<T>& s) {
  return s.status().code();
}

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeCache(4); }

  // A cache of `slabs` slabs evicting with `policy` (nullptr: LRU).
  void MakeCache(uint64_t slabs, const CacheOptions& options = {},
                 std::unique_ptr<EvictionPolicy> policy = nullptr) {
    cache_.reset();
    auto pool = SlabPool::Create({.capacity_bytes = slabs * kSlab,
                                  .slab_bytes = kSlab,
                                  .min_class_bytes = 64,
                                  .thread_cache_bytes = pool_thread_cache_bytes_});
    ASSERT_TRUE(pool.ok()) << pool.status();
    if (policy == nullptr) policy = NewLruPolicy();
    cache_ = std::make_unique<Cache>(options, *std::move(pool), std::move(policy), &clock_);
  }

  // The pool's per-CPU caches (SlabPoolOptions::thread_cache_bytes) for
  // MakeCache. A test that expects chunks carved in order (exact spans)
  // sets 0: a cache refills from the central lists in batches parked on
  // the CPU the thread ran on, so a thread that moves to another CPU
  // carves its next chunks from another span.
  uint64_t pool_thread_cache_bytes_ = SlabPoolOptions{}.thread_cache_bytes;

  void Register(const TestModel& m) {
    auto r = cache_->RegisterModel(m.key, m.layout);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  uint64_t Matched(const TestModel& m, std::span<const Token> tokens) {
    auto r = cache_->Lookup(m.key, tokens);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->matched_tokens : 0;
  }

  // Fetches the cached prefix of `tokens`, checks every byte, returns its length.
  uint64_t Fetched(const TestModel& m, std::span<const Token> tokens) {
    auto plan = cache_->PrepareFetch(m.key, {.tokens = tokens});
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return 0;
    EXPECT_TRUE(PlanHolds(*plan, m, tokens));
    return plan->matched_tokens;
  }

  uint64_t Allocated() const { return cache_->GetStats().host_pool.allocated_bytes; }

  // The layout `model` is registered with, if it is.
  std::optional<ModelLayout> LayoutOf(const ModelKey& model) const {
    for (const auto& [key, layout] : CacheInspector(cache_.get()).ListModels()) {
      if (key == model) return layout;
    }
    return std::nullopt;
  }

  ModelStats StatsOf(const TestModel& m) const {
    for (const ModelStats& s : cache_->GetStats().models) {
      if (s.model == m.key) return s;
    }
    ADD_FAILURE() << "no stats for " << m.key.ToString();
    return {};
  }

  ManualClock clock_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace cache_test
}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_CACHE_TEST_UTIL_H_
