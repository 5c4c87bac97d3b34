// CacheInspector: the operator's view (cache_inspector.h): verifying stored
// blocks, memory snapshots, per-token inspection of a cached sequence, top
// prefixes.
#include "server/core/cache_inspector.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/core/block_move.h"
#include "server/core/cache.h"
#include "server/importance/scoring.h"

namespace kvcache {
namespace {

constexpr size_t kVerifyBatchBlocks = 64;

// What is wrong with `bytes` as a copy sealed with `seal`; empty when nothing.
std::string CheckCopy(const BlockSeal& seal, std::span<const std::byte> bytes, uint64_t raw_bytes) {
  if (bytes.size() != seal.size) {
    return absl::StrCat("size ", bytes.size(), " differs from the sealed ", seal.size);
  }
  if (Checksum(bytes) != seal.checksum) return "checksum of the stored bytes";
  if (!seal.compressed) {
    if (bytes.size() != raw_bytes) {
      return absl::StrCat("raw block of ", bytes.size(), " bytes; the layout's is ", raw_bytes);
    }
    return "";
  }
  absl::StatusOr<importance::CompressedBlockView> view = importance::ParseCompressedBlock(bytes);
  if (!view.ok()) return absl::StrCat("compressed format: ", view.status().message());
  if (view->shape.raw_bytes() != raw_bytes) return "compressed block of another layout";
  std::vector<std::byte> decoded(raw_bytes);
  const absl::Status decode = importance::DecodeBlock(*view, decoded);
  if (!decode.ok()) return absl::StrCat("decoding: ", decode.message());
  if (Checksum(decoded) != seal.decoded_checksum) return "checksum of the decoded block";
  return "";
}

StoredPrecision FromCodec(importance::TokenPrecision p) {
  switch (p) {
    case importance::TokenPrecision::kFull:
      return StoredPrecision::kFull;
    case importance::TokenPrecision::kInt8:
      return StoredPrecision::kInt8;
    case importance::TokenPrecision::kInt4:
      return StoredPrecision::kInt4;
    case importance::TokenPrecision::kPruned:
      return StoredPrecision::kPruned;
  }
  return StoredPrecision::kFull;
}

}  // namespace

// --- VerifyBlocks -------------------------------------------------------------

std::vector<std::pair<ModelKey, ModelLayout>> CacheInspector::ListModels() const {
  std::vector<std::pair<ModelKey, ModelLayout>> out;
  CacheAccess::Locked locked(access_);
  locked.ForEachModel([&](const ModelState& m) { out.emplace_back(m.key, m.layout); });
  return out;
}

absl::StatusOr<VerifyProgress> CacheInspector::VerifyBlocks(const VerifyOptions& options) const {
  if (!options.prefix.empty() && !options.model.has_value()) {
    return absl::InvalidArgumentError("a prefix to verify needs its model");
  }
  std::optional<BlockHashes> prefix_hashes;
  if (!options.prefix.empty()) {
    absl::StatusOr<BlockHashes> hashes = access_.HashBlocks(*options.model, options.prefix);
    if (!hashes.ok()) return hashes.status();
    prefix_hashes = *std::move(hashes);
  }
  // The blocks to check, by where to find them again: nothing is referenced
  // until its batch, so a long walk pins no memory.
  struct Target {
    const PrefixIndex* index;
    uint64_t lookup_hash;
  };
  std::vector<Target> targets;
  VerifyProgress total;
  std::vector<ModelKey> walk;  // models whose every block is a target
  auto add = [&](const IndexNode* n) {
    const bool host = n->payload != nullptr;
    const bool lower = n->lower.any() && options.include_lower;
    if (!host && !lower) return;
    targets.push_back({n->index, n->lookup_hash});
    if (host) {
      ++total.blocks_total;
      total.bytes_total += n->payload->size();
    }
    if (lower) {  // each level's copy is checked
      total.blocks_total += n->lower.count();
      total.bytes_total += n->lower.bytes();
    }
  };
  {
    CacheAccess::Locked locked(access_);
    if (options.model.has_value()) {
      absl::StatusOr<const ModelState*> m = locked.FindModel(*options.model);
      if (!m.ok()) return m.status();
      if (prefix_hashes.has_value()) {
        std::vector<IndexNode*> path;
        (*m)->index.Match(options.prefix, *prefix_hashes, &path);
        for (const IndexNode* n : path) add(n);
      } else {
        walk.push_back(*options.model);
      }
    } else {
      locked.ForEachModel([&](const ModelState& m) {
        if (options.ns.empty() || m.key.ns == options.ns) walk.push_back(m.key);
      });
    }
  }
  // Whole models are listed in steps (CacheAccess::Walk), not under one hold, then
  // children put before their parents: a bad child is dropped on its own
  // before a bad parent takes the rest of its subtree.
  for (const ModelKey& key : walk) {
    const size_t first = targets.size();
    access_.Walk(key, {},
                 [&](const CacheAccess::Held&, const ModelState&, const IndexNode& n) { add(&n); });
    std::reverse(targets.begin() + static_cast<ptrdiff_t>(first), targets.end());
  }

  const absl::Time start = absl::Now();
  absl::Time next_report = start + options.progress_interval;
  VerifyProgress report;  // what the next callback carries beyond the totals
  auto send = [&](bool done) {
    total.done = done;
    if (!options.on_progress) return true;
    VerifyProgress p = total;
    p.bad_blocks = std::move(report.bad_blocks);
    report.bad_blocks.clear();
    return options.on_progress(p);
  };
  for (size_t first = 0; first < targets.size(); first += kVerifyBatchBlocks) {
    const size_t last = std::min(targets.size(), first + kVerifyBatchBlocks);
    struct Claimed {
      BlockMove move;                 // the host copy
      std::vector<BlockMove> levels;  // each lower copy (with include_lower)
      ModelKey model;
      uint64_t raw_bytes = 0;
      uint32_t depth = 0;
    };
    std::vector<Claimed> batch;
    {
      CacheAccess::Locked locked(access_);
      for (size_t i = first; i < last; ++i) {
        const ModelState* m = locked.ModelOf(targets[i].index);
        const IndexNode* n =
            m == nullptr ? nullptr : targets[i].index->FindByLookupHash(targets[i].lookup_hash);
        if (n == nullptr) {
          ++total.skipped_blocks;
          continue;
        }
        Claimed& c = batch.emplace_back(Claimed{.move = BlockMove::Claim(*n, PinReason::kInspect),
                                                .model = m->key,
                                                .raw_bytes = m->layout.BlockBytes(),
                                                .depth = n->depth});
        for (size_t level = 0; options.include_lower && level < kMaxLowerLevels; ++level) {
          if (n->lower.at(level) != nullptr) {
            c.levels.push_back(BlockMove::Claim(*n, level, PinReason::kInspect));
          }
        }
      }
    }
    for (Claimed& c : batch) {
      struct Finding {
        BlockTier tier;
        const BlockMove* claim;  // the copy's claim
        std::string problem;
      };
      std::vector<Finding> findings;
      if (c.move.host() != nullptr) {
        std::string problem = CheckCopy(c.move.host()->seal(), c.move.host()->data(), c.raw_bytes);
        ++total.blocks_checked;
        total.bytes_checked += c.move.host()->size();
        if (!problem.empty()) findings.push_back({BlockTier::kHost, &c.move, std::move(problem)});
      }
      for (const BlockMove& level : c.levels) {
        const PinnedCopy& copy = level.lower();
        std::vector<std::byte> bytes(copy->seal().size);
        const absl::Status read = access_.lower_tier(level.lower_level()).Read(*copy, bytes);
        std::string problem;
        if (!read.ok()) {
          problem = std::string(read.message());
        } else {
          problem = CheckCopy(copy->seal(), bytes, c.raw_bytes);
        }
        ++total.blocks_checked;
        total.bytes_checked += bytes.size();
        if (!problem.empty()) findings.push_back({BlockTier::kLower, &level, std::move(problem)});
      }
      for (Finding& f : findings) {
        BadBlockReport bad{.model = c.model,
                           .key = c.move.key(),
                           .index = c.depth,
                           .tier = f.tier == BlockTier::kLower
                                       ? access_.lower_name(f.claim->lower_level())
                                       : "host",
                           .problem = std::move(f.problem)};
        bool gone = false;  // the block left the cache (not just a copy)
        if (options.drop_bad) {
          std::vector<BlockRef> dropped;  // freed after the lock
          CacheAccess::Locked locked(access_);
          const std::optional<uint64_t> removed =
              locked.DropCorrupt(*f.claim, f.tier, "verify", &dropped);
          if (removed.has_value()) {
            total.dropped_blocks += *removed;
            bad.dropped = true;
            gone = *removed != 0;
            if (f.tier == BlockTier::kLower) {
              ++locked.tier_counters().lower[f.claim->lower_level()].checksum_failures;
            }
          }
        }
        report.bad_blocks.push_back(bad);
        total.bad_blocks.push_back(std::move(bad));
        if (gone) break;
      }
      c.move.Release();
      c.levels.clear();
      // Throttle: never ahead of max_bytes_per_second since the start.
      if (options.max_bytes_per_second > 0) {
        const absl::Duration due = absl::Seconds(static_cast<double>(total.bytes_checked) /
                                                 static_cast<double>(options.max_bytes_per_second));
        const absl::Duration ahead = due - (absl::Now() - start);
        if (ahead > absl::ZeroDuration()) absl::SleepFor(ahead);
      }
      if (absl::Now() >= next_report) {
        next_report = absl::Now() + options.progress_interval;
        if (!send(false)) {
          total.done = false;
          return total;
        }
      }
    }
  }
  send(true);
  total.done = true;
  return total;
}

// --- SnapshotMemory -----------------------------------------------------------

MemorySnapshot CacheInspector::SnapshotMemory(size_t max_leases) const {
  MemorySnapshot s;
  s.stats = access_.cache().GetStats();
  s.slab_classes = access_.PoolClasses();
  // Blocks a lease holds, by lookup hash per index (a lease keeps no node pointers).
  absl::flat_hash_map<std::pair<const PrefixIndex*, uint64_t>, int> lease_blocks;
  std::vector<ModelKey> keys;
  {
    CacheAccess::Locked locked(access_);
    s.taken = locked.Now();
    std::vector<LeaseSnapshot> leases;
    locked.ForEachLease([&](uint64_t id, const Lease& l) {
      LeaseSnapshot& out = leases.emplace_back();
      out.id = id;
      out.model = l.model;
      out.tokens = l.matched_tokens;
      out.blocks = l.blocks.size();
      for (const TieredBlock& b : l.blocks) out.bytes += b.seal().size;
      out.created = l.created;
      out.expires = l.expires;
    });
    s.leases_total = leases.size();
    std::sort(leases.begin(), leases.end(), [](const LeaseSnapshot& a, const LeaseSnapshot& b) {
      return a.created != b.created ? a.created < b.created : a.id < b.id;
    });
    if (leases.size() > max_leases) leases.resize(max_leases);
    s.leases = std::move(leases);
    locked.ForEachLease([&](uint64_t, const Lease& l) {
      for (const TieredBlock& b : l.blocks) ++lease_blocks[{l.index, b.lookup_hash}];
    });
    locked.ForEachModel([&](const ModelState& m) { keys.push_back(m.key); });
  }
  // Each model's blocks in steps (CacheAccess::Walk), so that requests go on
  // between them; a model removed meanwhile is left out.
  for (const ModelKey& key : keys) {
    ModelMemory out;
    out.model = key;
    const bool whole = access_.Walk(
        key, {}, [&](const CacheAccess::Held& held, const ModelState& m, const IndexNode& node) {
          const IndexNode* n = &node;
          const BlockTokenState& ts = n->tokens_state();
          if (n->payload != nullptr) {
            ++out.host_blocks;
            out.host_bytes += n->payload->size();
            // Pinned by a lease, a reader or a move.
            if (n->payload->pins().pinned()) ++out.referenced_blocks;
          }
          for (size_t r = 0; r < kPinReasons; ++r) {
            const auto reason = static_cast<PinReason>(r);
            if ((n->payload != nullptr && n->payload->pins().of(reason) != 0) ||
                n->lower.pinned_for(reason)) {
              ++out.pinned_by[r];
            }
          }
          if (n->lower.any()) {  // in some level below the host, each copy's bytes
            ++out.lower_blocks;
            out.lower_bytes += n->lower.bytes();
          }
          if (held.OnDevice(node)) ++out.device_blocks;
          if (!ts.compressed) {
            ++out.raw_blocks;
          } else if (ts.int8_entries + ts.int4_entries + ts.pruned_entries > 0) {
            ++out.budget_blocks;
          } else {
            ++out.int8_blocks;
          }
          out.raw_bytes += m.layout.BlockBytes();
          if (lease_blocks.contains({&m.index, n->lookup_hash})) ++out.leased_blocks;
          for (uint8_t p : ts.pinned) out.pinned_tokens += p != 0 ? 1 : 0;
          out.metadata_bytes += n->metadata_bytes;
        });
    if (whole) s.models.push_back(std::move(out));
  }
  return s;
}

// --- InspectSequence ----------------------------------------------------------

namespace {

// One block of an inspected path, copied out under the lock.
struct PathBlock {
  uint32_t depth = 0;
  uint64_t key = 0;
  PinnedBlock host;  // pinned while the inspection reads it
  PinnedCopy lower;  // the top lower copy, at lower_level
  size_t lower_level = 0;
  BlockSeal seal;
  float importance = 0;
  std::vector<Token> tokens;
  BlockTokenState state;
};

}  // namespace

absl::StatusOr<SequenceInspection> CacheInspector::InspectSequence(const ModelKey& model,
                                                                   std::span<const Token> tokens,
                                                                   bool include_heads) const {
  absl::StatusOr<BlockHashes> hashes = access_.HashBlocks(model, tokens);
  if (!hashes.ok()) return hashes.status();
  return InspectPath(model, include_heads, [&](const ModelState& m, std::vector<IndexNode*>* path) {
    m.index.Match(tokens, *hashes, path);
  });
}

absl::StatusOr<SequenceInspection> CacheInspector::InspectHottestPath(const ModelKey& model,
                                                                      uint64_t first_block_key,
                                                                      bool include_heads) const {
  return InspectPath(model, include_heads, [&](const ModelState& m, std::vector<IndexNode*>* path) {
    // Every use of a cached sequence uses each of its blocks, so a child's
    // own count is the uses of everything below it: follow the largest.
    IndexNode* next = nullptr;
    m.index.VisitChildren(nullptr, [&](IndexNode* n) {
      if (n->key == first_block_key) next = n;
    });
    while (next != nullptr) {
      path->push_back(next);
      IndexNode* best = nullptr;
      m.index.VisitChildren(next, [&](IndexNode* c) {
        if (best == nullptr || c->references > best->references) best = c;
      });
      next = best;
    }
  });
}

absl::StatusOr<SequenceInspection> CacheInspector::InspectPath(
    const ModelKey& model, bool include_heads,
    absl::FunctionRef<void(const ModelState&, std::vector<IndexNode*>*)> find_path) const {
  SequenceInspection out;
  std::vector<PathBlock> blocks;
  int64_t sequence_tokens = 0;
  absl::Time now;
  const double half_life = access_.options().importance.activity_half_life_seconds;
  {
    CacheAccess::Locked locked(access_);
    absl::StatusOr<const ModelState*> found = locked.FindModel(model);
    if (!found.ok()) return found.status();
    const ModelState& m = **found;
    now = locked.Now();
    out.layout = m.layout;
    out.policy = m.policy;
    out.attention_reports = m.attention_reports;
    std::vector<IndexNode*> path;
    find_path(m, &path);
    if (path.empty()) return out;
    // The sequence a block belongs to ends at the deepest block cached below
    // it, as compaction sees it.
    uint32_t deepest = 0;
    m.index.VisitSubtree(path.back(), [&](IndexNode* n) { deepest = std::max(deepest, n->depth); });
    sequence_tokens = (int64_t{deepest} + 1) * m.layout.block_tokens;
    blocks.reserve(path.size());
    for (const IndexNode* n : path) {
      PathBlock& b = blocks.emplace_back();
      b.depth = n->depth;
      b.key = n->key;
      b.host = PinnedBlock(n->payload, PinReason::kInspect);
      const int top = n->lower.top();
      b.lower = PinnedCopy(n->lower.top_copy(), PinReason::kInspect);
      b.lower_level = top == LowerCopies::kNone ? 0 : static_cast<size_t>(top);
      b.seal = n->seal();
      b.importance = n->importance();
      const std::span<const Token> t = n->tokens();
      b.tokens.assign(t.begin(), t.end());
      b.state = n->tokens_state();
    }
  }

  const ModelLayout& layout = out.layout;
  const uint32_t bt = layout.block_tokens;
  const uint64_t n_tokens = uint64_t{bt} * blocks.size();
  const uint64_t heads = uint64_t{layout.num_layers} * layout.num_kv_heads;
  out.matched_tokens = n_tokens;
  out.tokens.reserve(n_tokens);
  out.importance.resize(n_tokens);
  out.activity.assign(n_tokens, 0.0f);
  out.novelty.assign(n_tokens, 0.0f);
  out.position.resize(n_tokens);
  out.pinned.assign(n_tokens, 0);
  out.is_protected.assign(n_tokens, 0);
  out.precision.assign(n_tokens, StoredPrecision::kFull);
  const bool any_heads = std::any_of(blocks.begin(), blocks.end(), [&](const PathBlock& b) {
    return b.state.head_activity.size() == heads * bt;
  });
  if (include_heads) {
    if (any_heads) out.head_activity.assign(heads * n_tokens, 0.0f);
    out.head_precision.assign(heads * n_tokens, StoredPrecision::kFull);
  }
  const ImportancePolicy& policy = out.policy;
  for (const PathBlock& b : blocks) {
    const uint64_t first = uint64_t{b.depth} * bt;
    const uint64_t base = out.tokens.size();  // this block's first token in the arrays
    out.tokens.insert(out.tokens.end(), b.tokens.begin(), b.tokens.end());
    const BlockTokenState& ts = b.state;
    const double elapsed = ts.SecondsSinceActivity(now);
    for (uint32_t i = 0; i < bt; ++i) {
      const uint64_t t = base + i;
      if (ts.activity.size() == bt) {
        out.activity[t] = importance::DecayActivity(ts.activity[i], elapsed, half_life, 0, 0);
      }
      if (ts.novelty.size() == bt) out.novelty[t] = ts.novelty[i];
      out.position[t] =
          kernels::PositionFactor(static_cast<int64_t>(first + i), sequence_tokens, policy.params);
      out.pinned[t] = !ts.pinned.empty() && ts.pinned[i] != 0 ? 1 : 0;
      const bool structural = importance::IsStructurallyProtected(
          policy.params, static_cast<int64_t>(first + i), sequence_tokens);
      const bool kept =
          out.pinned[t] != 0 || (policy.mode == CompressionMode::kBudget
                                     ? static_cast<int64_t>(first + i) < policy.params.sink_tokens
                                     : structural);
      out.is_protected[t] = kept ? 1 : 0;
    }
    importance::ScoreTokens(policy.params, static_cast<int64_t>(first), sequence_tokens,
                            std::span<const float>(out.activity).subspan(base, bt),
                            std::span<const float>(out.novelty).subspan(base, bt),
                            std::span<float>(out.importance).subspan(base, bt));
    if (include_heads && any_heads && ts.head_activity.size() == heads * bt) {
      for (uint64_t h = 0; h < heads; ++h) {
        for (uint32_t i = 0; i < bt; ++i) {
          out.head_activity[h * n_tokens + base + i] =
              importance::DecayActivity(ts.head_activity[h * bt + i], elapsed, half_life, 0, 0);
        }
      }
    }

    InspectedBlock& ib = out.blocks.emplace_back();
    ib.index = b.depth;
    ib.key = b.key;
    ib.in_host = b.host != nullptr;
    ib.in_lower = b.lower != nullptr;
    if (ib.in_lower) ib.lower_kind = access_.lower_name(b.lower_level);
    ib.lossy = b.seal.compressed;
    ib.stored_bytes = b.seal.size;
    ib.raw_bytes = layout.BlockBytes();
    ib.importance = b.importance;
    if (!b.seal.compressed) continue;
    // The precision map is in the stored bytes: the host copy's, or the
    // lower copy read back (verified) when there is no host copy.
    std::vector<std::byte> read;
    std::span<const std::byte> bytes;
    if (b.host != nullptr) {
      bytes = b.host->data();
    } else if (b.lower != nullptr) {
      read.resize(b.lower->seal().size);
      if (!access_.lower_tier(b.lower_level).Read(*b.lower, read).ok()) continue;
      bytes = read;
    }
    absl::StatusOr<importance::CompressedBlockView> view = importance::ParseCompressedBlock(bytes);
    if (!view.ok()) continue;
    ib.format_version = view->version;
    for (uint32_t i = 0; i < bt; ++i) {
      std::optional<StoredPrecision> token;
      for (uint32_t l = 0; l < layout.num_layers; ++l) {
        for (uint32_t h = 0; h < layout.num_kv_heads; ++h) {
          const StoredPrecision p = FromCodec(view->EntryPrecision(l, h, i));
          if (!token.has_value()) {
            token = p;
          } else if (*token != p) {
            token = StoredPrecision::kMixed;
          }
          if (include_heads) {
            const uint64_t row = uint64_t{l} * layout.num_kv_heads + h;
            out.head_precision[row * n_tokens + base + i] = p;
          }
        }
      }
      out.precision[base + i] = token.value_or(StoredPrecision::kFull);
    }
  }
  return out;
}

// --- TopPrefixes --------------------------------------------------------------

std::vector<PrefixSummary> CacheInspector::TopPrefixes(size_t limit) const {
  // Ranked by the first block's own uses: every use of a cached sequence uses
  // its first block, so that counts the whole subtree's. Both passes walk in
  // steps (CacheAccess::Walk): the first blocks of every model, keeping the `limit`
  // used most, then the subtrees of those for their totals.
  struct First {
    size_t model;  // in `keys`
    uint64_t lookup_hash;
    uint64_t key;
    uint16_t references;
  };
  auto before = [](const First& a, const First& b) {
    if (a.references != b.references) return a.references > b.references;
    return a.key < b.key;
  };
  std::vector<ModelKey> keys;
  {
    CacheAccess::Locked locked(access_);
    locked.ForEachModel([&](const ModelState& m) { keys.push_back(m.key); });
  }
  std::vector<First> firsts;
  auto keep_best = [&](size_t n) {
    if (firsts.size() <= n) return;
    std::nth_element(firsts.begin(), firsts.begin() + static_cast<ptrdiff_t>(n), firsts.end(),
                     before);
    firsts.resize(n);
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    access_.Walk(keys[i], {.max_depth = 0},
                 [&](const CacheAccess::Held&, const ModelState&, const IndexNode& n) {
                   firsts.push_back({i, n.lookup_hash, n.key, n.references});
                   if (firsts.size() >= 2 * limit + 64) keep_best(limit);
                 });
  }
  keep_best(limit);
  std::sort(firsts.begin(), firsts.end(), before);

  std::vector<PrefixSummary> out;
  out.reserve(firsts.size());
  for (const First& f : firsts) {
    PrefixSummary s;
    s.model = keys[f.model];
    s.key = f.key;
    s.references = f.references;
    const bool whole = access_.Walk(
        keys[f.model], {.top_lookup_hash = f.lookup_hash},
        [&](const CacheAccess::Held&, const ModelState&, const IndexNode& node) {
          const IndexNode* n = &node;
          if (n->depth == 0) {
            const std::span<const Token> t = n->tokens();
            s.first_tokens.assign(t.begin(), t.begin() + std::min<size_t>(t.size(), 16));
          }
          ++s.blocks;
          s.bytes += (n->payload != nullptr ? n->payload->size() : 0) + n->lower.bytes();
          s.depth = std::max(s.depth, n->depth + 1);
          s.last_access = std::max(s.last_access, n->last_access);
        });
    if (whole) out.push_back(std::move(s));  // a prefix evicted meanwhile is left out
  }
  return out;
}

}  // namespace kvcache
