// Host pool utilization under a long churn of mixed block sizes: live
// payload bytes / reserved bytes, for pool settings side by side.
//
// A full pool keeps taking blocks of a mix of sizes (the raw blocks of a few
// layouts and, with --compressed, blocks the importance policy compressed to
// 30..60% of a raw block, which land anywhere in the size classes), freeing
// the oldest live block whenever an allocation fails, as the cache's eviction
// does. After a warm-up of --ops operations it samples the utilization every
// 1000 operations for another --ops and prints the median and minimum.
//
// The slack (reserved - payload) is split, averaged over the samples, into
// rounding (chunk bytes - payload bytes of live blocks), free chunks in
// partly used spans, and span tails (a span's bytes past its last chunk).
//
// Settings "+ compaction" also act as the cache's compaction pass does
// (server/core/pool_compaction.cc): every 1000 operations the caller asks the
// pool for a plan (SlabPool::PlanCompaction), and moves each named block to a
// chunk from AllocateMoveTarget (copying its bytes), then frees the old
// chunk. "moved" is the bytes copied per byte allocated by the churn.
//
// With --per-class it also prints, at the end of each run, every size class in
// use: its span, spans reserved, chunk bytes live and payload bytes, so the
// slack (reserved - payload) can be told apart into rounding (chunk - payload)
// and partly used spans (reserved - chunk).
//
// --mix I runs only the I-th mix (from 0); --max-span-occupancy sets the
// compaction plan's max_span_occupancy, in percent.
//
//   pool_utilization_benchmark [--ops N] [--capacity-mib N] [--seed N] [--mix I]
//       [--max-span-occupancy PERCENT] [--per-class]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "server/core/slab_pool.h"

namespace kvcache {
namespace {

struct Mix {
  const char* name;
  std::vector<uint64_t> raw_sizes;  // block sizes of the layouts in use
  bool compressed = false;          // half the blocks compressed to 30..60%
};

struct Setting {
  const char* name;
  SlabPoolOptions options;
  bool compaction = false;
  CompactionPlanOptions plan;
};

struct Result {
  double median = 0;
  double minimum = 0;
  // Means over the samples, as fractions of reserved bytes.
  double rounding = 0;
  double free_chunks = 0;
  double tails = 0;
  double moved = 0;  // bytes moved / bytes allocated by the churn
};

struct Live {
  Allocation allocation;
  uint64_t size;
};

// Moves every live block the plan names, as the cache does: a target chunk
// in a span not draining, copy, repoint, free the source. Returns bytes moved.
uint64_t Compact(SlabPool& pool, const CompactionPlanOptions& options, std::deque<Live>& live) {
  absl::StatusOr<CompactionPlan> plan = pool.PlanCompaction(options);
  if (!plan.ok() || plan->moves.empty()) return 0;
  uint64_t moved = 0;
  for (Live& l : live) {
    if (!plan->Contains(l.allocation.data)) continue;
    absl::StatusOr<Allocation> target = pool.AllocateMoveTarget(l.allocation);
    if (!target.ok()) break;
    std::memcpy(target->data, l.allocation.data, l.size);
    pool.Free(l.allocation);
    l.allocation = *target;
    moved += l.size;
  }
  return moved;
}

// Prints every class with a span: reserved vs chunk bytes live vs payload.
void PrintClasses(const SlabPool& pool, const std::deque<Live>& live) {
  std::map<uint64_t, uint64_t> payload_by_chunk;  // chunk bytes -> payload bytes
  for (const Live& l : live) payload_by_chunk[l.allocation.bytes] += l.size;
  const SlabPoolStats total = pool.GetStats();
  std::printf(
      "  | chunk | span | spans | reserved MiB | chunks live MiB | payload MiB | "
      "partly used spans (%% of reserved) | rounding (%% of reserved) |\n");
  std::printf("  |---:|---:|---:|---:|---:|---:|---:|---:|\n");
  const double mib = 1 << 20;
  const double all = static_cast<double>(total.reserved_bytes);
  for (const SlabClassStats& c : pool.GetClassStats()) {
    if (c.spans == 0) continue;
    const double reserved = static_cast<double>(c.spans * c.span_bytes);
    const double chunks = static_cast<double>(c.live_chunks * c.chunk_bytes);
    const double payload = static_cast<double>(payload_by_chunk[c.chunk_bytes]);
    std::printf("  | %llu | %llu KiB x %llu | %llu | %.1f | %.1f | %.1f | %.2f | %.2f |\n",
                static_cast<unsigned long long>(c.chunk_bytes),
                static_cast<unsigned long long>(c.span_bytes >> 10),
                static_cast<unsigned long long>(c.chunks_per_span),
                static_cast<unsigned long long>(c.spans), reserved / mib, chunks / mib,
                payload / mib, 100 * (reserved - chunks) / all, 100 * (chunks - payload) / all);
  }
}

// Runs the churn; returns utilization over the samples and where the rest went.
Result Churn(const Setting& setting, const Mix& mix, uint64_t ops, uint64_t seed, bool per_class) {
  auto pool = SlabPool::Create(setting.options);
  if (!pool.ok()) {
    std::fprintf(stderr, "%s: %s\n", setting.name, pool.status().ToString().c_str());
    std::exit(2);
  }
  std::mt19937_64 rng(seed);
  std::deque<Live> live;  // oldest first
  uint64_t payload = 0;
  uint64_t allocated = 0, moved = 0;  // payload bytes, sampled part only
  std::vector<double> samples;
  Result result;
  for (uint64_t op = 0; op < 2 * ops; ++op) {
    uint64_t size = mix.raw_sizes[rng() % mix.raw_sizes.size()];
    if (mix.compressed && rng() % 2 == 0) {
      size = std::max<uint64_t>(64, size * (30 + rng() % 31) / 100);
    }
    while (true) {
      absl::StatusOr<Allocation> a = (*pool)->Allocate(size);
      if (a.ok()) {
        live.push_back({*a, size});
        payload += size;
        if (op >= ops) allocated += size;
        break;
      }
      if (live.empty()) {
        std::fprintf(stderr, "a block of %llu bytes never fits\n",
                     static_cast<unsigned long long>(size));
        std::exit(2);
      }
      // Evict: mostly the oldest, sometimes a random one (blocks do not all
      // leave in the order they came).
      const size_t victim = rng() % 4 == 0 ? rng() % live.size() : 0;
      (*pool)->Free(live[victim].allocation);
      payload -= live[victim].size;
      live.erase(live.begin() + static_cast<ptrdiff_t>(victim));
    }
    if (setting.compaction && op % 1000 == 999) {
      const uint64_t m = Compact(**pool, setting.plan, live);
      if (op >= ops) moved += m;
    }
    if (op >= ops && op % 1000 == 0) {
      const SlabPoolStats s = (*pool)->GetStats();
      const double reserved = static_cast<double>(s.reserved_bytes);
      samples.push_back(static_cast<double>(payload) / reserved);
      uint64_t tails = 0;
      for (const SlabClassStats& c : (*pool)->GetClassStats()) {
        tails += c.spans * (c.span_bytes - c.chunks_per_span * c.chunk_bytes);
      }
      result.rounding += static_cast<double>(s.allocated_bytes - payload) / reserved;
      result.tails += static_cast<double>(tails) / reserved;
      result.free_chunks +=
          static_cast<double>(s.reserved_bytes - s.allocated_bytes - tails) / reserved;
    }
  }
  const double n = static_cast<double>(samples.size());
  result.rounding /= n;
  result.tails /= n;
  result.free_chunks /= n;
  result.moved = static_cast<double>(moved) / static_cast<double>(allocated);
  if (per_class) PrintClasses(**pool, live);
  for (const Live& l : live) (*pool)->Free(l.allocation);
  std::sort(samples.begin(), samples.end());
  result.median = samples[samples.size() / 2];
  result.minimum = samples.front();
  return result;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  using kvcache::Mix;
  using kvcache::Setting;
  uint64_t ops = 200000, capacity_mib = 512, seed = 1;
  bool per_class = false;
  int only_mix = -1;
  double occupancy = kvcache::CompactionPlanOptions().max_span_occupancy;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> uint64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (arg == "--ops") {
      ops = next();
    } else if (arg == "--capacity-mib") {
      capacity_mib = next();
    } else if (arg == "--seed") {
      seed = next();
    } else if (arg == "--mix") {
      only_mix = static_cast<int>(next());
    } else if (arg == "--max-span-occupancy") {
      occupancy = static_cast<double>(next()) / 100;
    } else if (arg == "--per-class") {
      per_class = true;
    } else {
      std::printf(
          "pool_utilization_benchmark [--ops N] [--capacity-mib N] [--seed N] [--mix I]\n"
          "    [--max-span-occupancy PERCENT] [--per-class]\n"
          "Host pool utilization (live payload / reserved) under a churn of mixed block sizes.\n");
      return arg == "--help" ? 0 : 2;
    }
  }
  const uint64_t capacity = capacity_mib << 20;
  const Setting settings[] = {
      {"min class 4 KiB (before)",
       {.capacity_bytes = capacity, .slab_bytes = 4 << 20, .min_class_bytes = 4096}},
      {"min class 64 B (now)",
       {.capacity_bytes = capacity, .slab_bytes = 4 << 20, .min_class_bytes = 64}},
      {"min class 64 B + compaction",
       {.capacity_bytes = capacity, .slab_bytes = 4 << 20, .min_class_bytes = 64},
       true,
       {.max_span_occupancy = occupancy}},
  };
  const Mix mixes[] = {
      {"1 KiB blocks", {1024}},
      {"1, 2, 8 KiB blocks", {1024, 2048, 8192}},
      {"64 KiB, 256 KiB, 2 MiB blocks", {64 << 10, 256 << 10, 2 << 20}},
      {"40-layer blocks (5 x 2^k: 80 KiB, 320 KiB)", {80 << 10, 320 << 10}},
      {"1 KiB..2 MiB, half compressed to 30-60%", {1024, 8192, 64 << 10, 2 << 20}, true},
  };
  std::printf("capacity %llu MiB, 4 MiB slabs, %llu warm-up + %llu sampled operations, seed %llu\n",
              static_cast<unsigned long long>(capacity_mib), static_cast<unsigned long long>(ops),
              static_cast<unsigned long long>(ops), static_cast<unsigned long long>(seed));
  std::printf(
      "| block mix | setting | utilization (median) | utilization (min) | rounding | "
      "free chunks | span tails | moved |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (int m = 0; m < static_cast<int>(std::size(mixes)); ++m) {
    if (only_mix >= 0 && m != only_mix) continue;
    const Mix& mix = mixes[m];
    for (const Setting& setting : settings) {
      const kvcache::Result r = kvcache::Churn(setting, mix, ops, seed, per_class);
      std::printf("| %s | %s | %.3f | %.3f | %.1f%% | %.1f%% | %.1f%% | %.3f |\n", mix.name,
                  setting.name, r.median, r.minimum, 100 * r.rounding, 100 * r.free_chunks,
                  100 * r.tails, r.moved);
      std::fflush(stdout);
    }
  }
  return 0;
}
