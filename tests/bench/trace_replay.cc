// kvcache-bench trace: replays a Mooncake-format JSONL trace against the
// daemon and measures its prefix hit ratio.
//
// Each line is {"timestamp", "input_length", "output_length", "hash_ids"};
// hash_ids are prefix hashes of 512-token blocks, ceil(input_length/512) of
// them (../shared/traces/SOURCES.md beside the repository). The replay:
//  - registers --model with block_tokens=512 and a layout of --bytes-per-token
//    bytes per token (1+ layers x 1 kv head x head_dim, fp16), and evicts what
//    the model had cached (unless --keep-cache);
//  - maps hash id h to the 512 tokens (h*512 + i) mod 2^32, i < 512, so equal
//    ids are equal blocks and different ids (below 2^23) different blocks;
//  - treats every hash id as a whole 512-token block, the last (partial) one
//    included: block counts match SOURCES.md's "total blocks", and a request's
//    token hit count is min(matched tokens, input_length);
//  - per request, in trace order, as fast as it can or (--speedup N) at its
//    timestamp / N after the first request's, so that a policy whose time
//    constants are N times smaller sees the trace's own timing (the report
//    says how late requests started: the client is one thread): Lookup the
//    sequence, optionally Fetch the hit (--fetch-hits, verifying every byte),
//    then Append the missing blocks from the first miss (start_token =
//    matched) with a payload derived from each block's hash id.
// The cache capacity is the daemon's (--capacity-bytes on its command line),
// so a hit ratio at a capacity is measured by starting the daemon with it. The
// report also gives the ideal hit ratio of an unbounded cache for comparison.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench_common.h"
#include "trace_file.h"

namespace kvcache::bench {
namespace {

// The layout with `bytes_per_token` bytes of KV per token: fp16 K and V of
// one kv head, head_dim = bytes_per_token / 4 split over as many layers as
// keep head_dim <= 4096.
absl::StatusOr<v1::ModelLayout> TraceLayout(uint32_t bytes_per_token) {
  if (bytes_per_token == 0 || bytes_per_token % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bytes-per-token is ", bytes_per_token, "; it must be a multiple of 4"));
  }
  uint32_t layers = 1;
  uint32_t elems = bytes_per_token / 4;
  while (elems > 4096 && elems % 2 == 0) {
    elems /= 2;
    layers *= 2;
  }
  if (elems > 4096 || layers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bytes-per-token ", bytes_per_token,
                     " cannot be split into <= 1024 layers of "
                     "head_dim <= 4096; use a power-of-two multiple of 4"));
  }
  v1::ModelLayout l;
  l.set_num_layers(layers);
  l.set_num_kv_heads(1);
  l.set_head_dim(elems);
  l.set_dtype(v1::DTYPE_FP16);
  l.set_block_tokens(kTraceBlockTokens);
  return l;
}

// Block contents depend on the hash id alone (a prefix hash fixes the block).
constexpr uint64_t kTraceKey = 0x7472616365ull;

struct Counters {
  uint64_t requests = 0, blocks = 0, hit_blocks = 0, input_tokens = 0, hit_tokens = 0;
  uint64_t ideal_hit_blocks = 0, ideal_hit_tokens = 0;
  uint64_t stored = 0, dedup = 0, corrupt = 0;
  uint64_t ssd_hit_blocks = 0, ssd_hit_tokens = 0;  // hits only the SSD tier held
};

}  // namespace

int RunTrace(const BenchOptions& opts) {
  if (opts.trace.empty()) {
    std::fprintf(stderr, "kvcache-bench: trace mode needs --trace FILE.jsonl\n");
    return 2;
  }
  absl::StatusOr<v1::ModelLayout> layout = TraceLayout(opts.bytes_per_token);
  if (!layout.ok()) {
    std::fprintf(stderr, "kvcache-bench: %s\n", std::string(layout.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::vector<TraceRequest>> trace = LoadTrace(opts.trace, opts.limit);
  if (!trace.ok()) {
    std::fprintf(stderr, "kvcache-bench: %s\n", trace.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = ConnectClient(opts);
  if (!client.ok()) {
    std::fprintf(stderr, "kvcache-bench: %s\n", client.status().ToString().c_str());
    return 1;
  }
  Client& c = **client;
  absl::StatusOr<v1::RegisterModelResponse> reg = c.RegisterModel(opts.model, *layout);
  if (!reg.ok()) {
    std::fprintf(stderr, "kvcache-bench: RegisterModel(%s): %s\n", opts.model.c_str(),
                 reg.status().ToString().c_str());
    return 1;
  }
  if (!opts.keep_cache) {
    if (auto e = c.EvictModel(opts.model); !e.ok()) {
      std::fprintf(stderr, "kvcache-bench: EvictModel: %s\n", e.status().ToString().c_str());
      return 1;
    }
  }
  const uint64_t block_bytes = reg->block_bytes();
  std::printf(
      "mode=trace trace=%s requests=%zu model=%s block=512 tokens x %llu bytes "
      "(%u bytes/token)%s\n",
      opts.trace.c_str(), trace->size(), opts.model.c_str(),
      static_cast<unsigned long long>(block_bytes), opts.bytes_per_token,
      opts.fetch_hits ? " fetch-hits" : "");

  OpStats lookup_st, append_st, fetch_st;
  Counters n;
  absl::flat_hash_set<uint64_t> seen;  // the unbounded cache, for the ideal ratio
  std::vector<uint32_t> tokens;
  std::vector<std::byte> buf;
  const absl::Time t0 = absl::Now();
  const uint64_t first_ms = trace->empty() ? 0 : trace->front().timestamp_ms;
  std::vector<double> late_ms;  // --speedup: how late each request started
  const size_t progress_every = std::max<size_t>(trace->size() / 10, 1);
  for (const TraceRequest& req : *trace) {
    if (opts.speedup > 0) {
      const absl::Time due = t0 + absl::Milliseconds((static_cast<double>(req.timestamp_ms) -
                                                      static_cast<double>(first_ms)) /
                                                     opts.speedup);
      const absl::Time now = absl::Now();
      if (due > now) absl::SleepFor(due - now);
      late_ms.push_back(std::max(0.0, absl::ToDoubleMilliseconds(now - due)));
    }
    const size_t nblocks = req.hash_ids.size();
    tokens.resize(nblocks * kTraceBlockTokens);
    for (size_t b = 0; b < nblocks; ++b) {
      for (uint32_t i = 0; i < kTraceBlockTokens; ++i) {
        tokens[b * kTraceBlockTokens + i] =
            static_cast<uint32_t>(req.hash_ids[b] * kTraceBlockTokens + i);
      }
    }
    ++n.requests;
    n.blocks += nblocks;
    n.input_tokens += req.input_length;
    size_t ideal = 0;
    while (ideal < nblocks && seen.contains(req.hash_ids[ideal])) ++ideal;
    n.ideal_hit_blocks += ideal;
    n.ideal_hit_tokens += std::min<uint64_t>(ideal * kTraceBlockTokens, req.input_length);
    seen.insert(req.hash_ids.begin(), req.hash_ids.end());

    absl::Time t = absl::Now();
    absl::StatusOr<LookupResult> hit = c.Lookup(opts.model, tokens);
    if (!hit.ok()) {
      lookup_st.Error(hit.status().code());
      std::fprintf(stderr, "kvcache-bench: Lookup: %s\n", hit.status().ToString().c_str());
      return 1;
    }
    lookup_st.Record(absl::Now() - t, 0);
    const uint64_t matched_blocks = hit->matched_tokens / kTraceBlockTokens;
    n.hit_blocks += matched_blocks;
    n.hit_tokens += std::min<uint64_t>(hit->matched_tokens, req.input_length);
    for (size_t b = 0; b < hit->blocks.size(); ++b) {
      if (hit->blocks[b].tier() != "ssd") continue;
      ++n.ssd_hit_blocks;
      // The last block of a request may be partial.
      const uint64_t begin = b * kTraceBlockTokens;
      n.ssd_hit_tokens += std::min<uint64_t>(kTraceBlockTokens, req.input_length - begin);
    }

    if (opts.fetch_hits && matched_blocks > 0) {
      buf.resize(matched_blocks * block_bytes);
      t = absl::Now();
      absl::StatusOr<FetchResult> f = c.Fetch(opts.model, tokens, buf);
      if (!f.ok()) {
        fetch_st.Error(f.status().code());
      } else {
        fetch_st.Record(absl::Now() - t, f->bytes);
        for (uint32_t b = 0; b < f->blocks; ++b) {
          if (CheckBlock(kTraceKey, req.hash_ids[b],
                         std::span(buf).subspan(b * block_bytes, block_bytes)) >= 0) {
            ++n.corrupt;
          }
        }
      }
    }

    if (matched_blocks < nblocks) {
      buf.resize((nblocks - matched_blocks) * block_bytes);
      for (size_t b = matched_blocks; b < nblocks; ++b) {
        FillBlock(kTraceKey, req.hash_ids[b],
                  std::span(buf).subspan((b - matched_blocks) * block_bytes, block_bytes));
      }
      AppendOptions ao;
      ao.start_token = hit->matched_tokens;
      t = absl::Now();
      absl::StatusOr<AppendResult> a = c.Append(opts.model, tokens, buf, ao);
      if (!a.ok()) {
        append_st.Error(a.status().code());
        const absl::StatusCode code = a.status().code();
        if (code != absl::StatusCode::kResourceExhausted &&
            code != absl::StatusCode::kFailedPrecondition) {
          std::fprintf(stderr, "kvcache-bench: Append: %s\n", a.status().ToString().c_str());
          return 1;
        }
      } else {
        append_st.Record(absl::Now() - t, buf.size());
        n.stored += a->stored_blocks;
        n.dedup += a->deduplicated_blocks;
      }
    }
    if (n.requests % progress_every == 0) {
      std::fprintf(stderr, "  %llu/%zu requests, block hit ratio so far %.3f\n",
                   static_cast<unsigned long long>(n.requests), trace->size(),
                   n.blocks ? static_cast<double>(n.hit_blocks) / n.blocks : 0.0);
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);

  auto ratio = [](uint64_t a, uint64_t b) { return b ? static_cast<double>(a) / b : 0.0; };
  std::printf("requests=%llu elapsed=%.2fs (%.1f req/s)\n",
              static_cast<unsigned long long>(n.requests), seconds, n.requests / seconds);
  if (!late_ms.empty()) {
    std::sort(late_ms.begin(), late_ms.end());
    std::printf("pacing: speedup=%g late p50=%.1fms p99=%.1fms max=%.1fms\n", opts.speedup,
                late_ms[late_ms.size() / 2], late_ms[late_ms.size() * 99 / 100], late_ms.back());
  }
  std::printf("blocks: total=%llu hit=%llu hit_ratio=%.4f (unbounded cache: %.4f)\n",
              static_cast<unsigned long long>(n.blocks),
              static_cast<unsigned long long>(n.hit_blocks), ratio(n.hit_blocks, n.blocks),
              ratio(n.ideal_hit_blocks, n.blocks));
  std::printf("tokens: input=%llu hit=%llu hit_ratio=%.4f (unbounded cache: %.4f)\n",
              static_cast<unsigned long long>(n.input_tokens),
              static_cast<unsigned long long>(n.hit_tokens), ratio(n.hit_tokens, n.input_tokens),
              ratio(n.ideal_hit_tokens, n.input_tokens));
  std::printf("hit tokens by tier: host=%llu (%.4f of input) ssd=%llu (%.4f of input)\n",
              static_cast<unsigned long long>(n.hit_tokens - n.ssd_hit_tokens),
              ratio(n.hit_tokens - n.ssd_hit_tokens, n.input_tokens),
              static_cast<unsigned long long>(n.ssd_hit_tokens),
              ratio(n.ssd_hit_tokens, n.input_tokens));
  std::printf("unique blocks=%zu (%.1f MiB of KV); appended: stored=%llu deduplicated=%llu\n",
              seen.size(), seen.size() * block_bytes / 1048576.0,
              static_cast<unsigned long long>(n.stored), static_cast<unsigned long long>(n.dedup));
  PrintOpTable({{"lookup", &lookup_st}, {"append", &append_st}, {"fetch", &fetch_st}}, seconds);
  if (opts.fetch_hits) {
    std::printf("verified fetched blocks against the pattern: %llu wrong\n",
                static_cast<unsigned long long>(n.corrupt));
  }
  PrintServerStats(c, opts.model);
  return n.corrupt == 0 ? 0 : 1;
}

}  // namespace kvcache::bench
