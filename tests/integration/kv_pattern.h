// Deterministic KV payloads and layouts for tests: the bytes of a block are a function of
// the block's token prefix, so any misplaced or corrupted byte is caught.
#ifndef KVCACHE_TESTS_INTEGRATION_KV_PATTERN_H_
#define KVCACHE_TESTS_INTEGRATION_KV_PATTERN_H_

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/client.h"
#include "kvcache/v1/admin.pb.h"
#include "kvcache/v1/kvcache.pb.h"

namespace kvcache::testing {

// Fills `out` with the pattern for the block that ends at token `end` of
// `tokens` (the pattern depends on the whole prefix tokens[0, end)).
inline void FillBlock(std::span<const uint32_t> tokens, size_t end, std::span<std::byte> out) {
  uint64_t state = XXH3_64bits(tokens.data(), end * sizeof(uint32_t)) | 1;
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(out.data() + i, &state, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(state >> (8 * (i % 8)));
}

// The KV of blocks [first_block, first_block + n) of `tokens`.
inline std::vector<std::byte> MakeKv(std::span<const uint32_t> tokens, uint32_t block_tokens,
                                     uint64_t block_bytes, size_t first_block, size_t n) {
  std::vector<std::byte> kv(n * block_bytes);
  for (size_t b = 0; b < n; ++b) {
    FillBlock(tokens, (first_block + b + 1) * block_tokens,
              std::span<std::byte>(kv).subspan(b * block_bytes, block_bytes));
  }
  return kv;
}

// The XXH3-64 checksum of each `block_bytes` block of `kv`: what an append
// header carries in block_checksums (the daemon refuses appends without them
// unless security.require_block_checksums is false).
inline std::vector<uint64_t> BlockChecksums(std::span<const std::byte> kv, uint64_t block_bytes) {
  std::vector<uint64_t> sums;
  for (uint64_t at = 0; at + block_bytes <= kv.size(); at += block_bytes) {
    sums.push_back(BlockChecksum(kv.subspan(at, block_bytes)));
  }
  return sums;
}

inline v1::ModelLayout MakeLayout(uint32_t layers, uint32_t heads, uint32_t dim, v1::DType dtype,
                                  uint32_t block_tokens) {
  v1::ModelLayout l;
  l.set_num_layers(layers);
  l.set_num_kv_heads(heads);
  l.set_head_dim(dim);
  l.set_dtype(dtype);
  l.set_block_tokens(block_tokens);
  return l;
}

// Random-looking but reproducible tokens.
inline std::vector<uint32_t> MakeTokens(uint64_t seed, size_t n) {
  std::vector<uint32_t> t(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : t) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<uint32_t>(s % 50000);
  }
  return t;
}

// Fetches `tokens` (whole blocks: `blocks` of `block_bytes`) of `model` and
// EXPECTs the call to succeed and every byte fetched to be the pattern
// MakeKv appends; returns the blocks matched (0 on error). `what` names the
// sequence in failures.
inline size_t FetchVerified(Client& client, std::string_view model,
                            std::span<const uint32_t> tokens, uint32_t block_tokens,
                            uint64_t block_bytes, size_t blocks, const std::string& what) {
  std::vector<std::byte> out(blocks * block_bytes);
  auto f = client.Fetch(model, tokens, out);
  EXPECT_TRUE(f.ok()) << what << ": " << f.status();
  if (!f.ok()) return 0;
  const size_t matched = f->matched_tokens / block_tokens;
  const std::vector<std::byte> expected = MakeKv(tokens, block_tokens, block_bytes, 0, blocks);
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + matched * block_bytes, expected.begin()))
      << what << ": fetched bytes that were never appended";
  return matched;
}

// The entry of tier `name` ("gpu", "host", "ssd") in GetStats, or null.
inline const v1::TierStats* FindTier(const v1::GetStatsResponse& stats, std::string_view name) {
  for (const v1::TierStats& t : stats.tiers()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_KV_PATTERN_H_
