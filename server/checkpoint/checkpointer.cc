#include "server/checkpoint/checkpointer.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "server/checkpoint/checkpoint_directory.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_writer.h"
#include "server/checkpoint/records.h"
#include "server/common/token_bucket.h"
#include "server/core/checkpoint_source.h"
#include "spdlog/spdlog.h"

namespace kvcache::checkpoint {
namespace {

constexpr size_t kLowerIndexEntriesPerRecord = 4096;

std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

v1::CheckpointLowerIndex::Entry LowerEntry(uint32_t model, const BlockImage& b,
                                           const StoredLocation& where) {
  v1::CheckpointLowerIndex::Entry e;
  e.set_model(model);
  e.set_lookup_hash(b.lookup_hash);
  e.set_key(b.key);
  e.set_size(b.seal.size);
  e.set_checksum(b.seal.checksum);
  e.set_raw_checksum(b.seal.raw_checksum);
  e.set_decoded_checksum(b.seal.decoded_checksum);
  e.set_compressed(b.seal.compressed);
  v1::CheckpointLowerCopy* l = e.mutable_location();
  l->set_offset(where.offset);
  l->set_footprint(where.footprint);
  l->set_sequence(where.sequence);
  l->set_epoch(where.epoch);
  return e;
}

}  // namespace

Checkpointer::Checkpointer(Cache* cache, FileSystem* fs, CheckpointerOptions options,
                           uint64_t next_sequence)
    : cache_(cache), fs_(fs), options_(std::move(options)), next_sequence_(next_sequence) {}

absl::StatusOr<CheckpointRun> Checkpointer::Run(Pacing pacing) {
  MutexLock lock(&mu_);
  absl::StatusOr<CheckpointRun> run = RunLocked(pacing);
  writer_bytes_.store(0, std::memory_order_relaxed);
  if (!run.ok()) {
    // The next run starts over from a full checkpoint: what the failed one
    // wrote is gone, and the map may describe neither.
    have_previous_ = false;
    payloads_.clear();
    // What the lower tier retained for this run alone is free again; the
    // newest committed checkpoint's copies stay retained (within the budget).
    if (Tier* lower = cache_->tiers().lower_tier(); lower != nullptr && lower->persistent()) {
      lower->CheckpointFailed();
    }
  }
  return run;
}

void Checkpointer::SeedPayloads(PayloadMap payloads) {
  MutexLock lock(&mu_);
  have_previous_ = !payloads.empty();
  payloads_ = std::move(payloads);
  runs_since_full_ = 0;
}

absl::StatusOr<CheckpointRun> Checkpointer::RunLocked(Pacing pacing) {
  const absl::Time start = absl::Now();
  CheckpointRun run;
  run.sequence = next_sequence_++;
  run.full = !have_previous_ || runs_since_full_ + 1 >= options_.full_every;
  Tier* lower = cache_->tiers().lower_tier();
  const bool reattachable = lower != nullptr && lower->persistent();
  const uint64_t mark = reattachable ? lower->CheckpointStarted() : 0;

  absl::StatusOr<std::unique_ptr<CheckpointWriter>> writer =
      CheckpointWriter::Create(fs_, options_.dir, run.sequence,
                               {.zstd_level = options_.zstd_level, .mac_key = options_.mac_key});
  if (!writer.ok()) return writer.status();
  CheckpointWriter& w = **writer;

  const CheckpointSource source(cache_);
  const std::vector<ModelImage> models = source.CaptureModels();
  PayloadMap next;
  std::set<uint64_t> references;
  std::vector<v1::CheckpointLowerIndex::Entry> lower_entries;
  std::vector<BlockImage> batch;
  std::string scratch;
  bool compress = options_.zstd_level > 0;
  // Payload bytes written, at most this many a second.
  TokenBucket pace(pacing == Pacing::kLimited ? options_.max_write_bytes_per_second : 0);
  uint64_t probed_bytes = 0;   // payload bytes compressed to decide
  uint64_t probed_stored = 0;  // what they took in the file
  for (uint32_t ordinal = 0; ordinal < models.size(); ++ordinal) {
    const ModelImage& model = models[ordinal];
    EncodeModel(model, model.blocks.size()).SerializeToString(&scratch);
    if (auto s = w.Append(static_cast<uint8_t>(RecordType::kModel), AsBytes(scratch), false);
        !s.ok()) {
      return s.status();
    }
    ++run.models;
    const auto* previous =
        run.full ? nullptr : [&]() -> const absl::flat_hash_map<uint64_t, PayloadRecord>* {
      mu_.AssertHeld();  // the lambda runs within RunLocked
      auto it = payloads_.find(model.key);
      return it == payloads_.end() ? nullptr : &it->second;
    }();
    auto& written = next[model.key];
    for (size_t first = 0; first < model.blocks.size(); first += options_.batch_blocks) {
      const size_t n = std::min(options_.batch_blocks, model.blocks.size() - first);
      batch.clear();
      run.gone_blocks += source.CaptureBlocks(
          model.key, std::span<const uint64_t>(model.blocks).subspan(first, n), &batch);
      writer_bytes_.store(w.MemoryBytes(), std::memory_order_relaxed);
      uint64_t batch_payload_bytes = 0;  // as stored, for the pacing
      for (const BlockImage& b : batch) {
        std::optional<StoredLocation> where;
        if (b.lower != nullptr && reattachable) where = lower->Locate(*b.lower);
        if (b.host == nullptr && !where.has_value()) {
          // Only in a lower tier that cannot re-attach: nothing to record
          // (the restore skips what hangs below it).
          ++run.gone_blocks;
          continue;
        }
        if (where.has_value()) {
          lower_entries.push_back(LowerEntry(ordinal, b, *where));
          ++run.lower_copies;
        }
        EncodeBlock(b, where).SerializeToString(&scratch);
        if (auto s = w.Append(static_cast<uint8_t>(RecordType::kBlock), AsBytes(scratch), false);
            !s.ok()) {
          return s.status();
        }
        ++run.blocks;
        if (b.host == nullptr) continue;
        const PayloadRecord* before = nullptr;
        if (previous != nullptr) {
          auto it = previous->find(b.lookup_hash);
          if (it != previous->end() && it->second.checksum == b.seal.checksum) {
            before = &it->second;
          }
        }
        if (before != nullptr) {
          v1::CheckpointPayloadRef ref;
          ref.set_sequence(before->sequence);
          ref.set_offset(before->offset);
          ref.SerializeToString(&scratch);
          if (auto s =
                  w.Append(static_cast<uint8_t>(RecordType::kPayloadRef), AsBytes(scratch), false);
              !s.ok()) {
            return s.status();
          }
          written[b.lookup_hash] = *before;
          references.insert(before->sequence);
          ++run.referenced_payloads;
          continue;
        }
        const uint64_t stored_before = w.data_bytes();
        absl::StatusOr<RecordLocation> at =
            w.Append(static_cast<uint8_t>(RecordType::kPayload), b.host->data(), compress);
        if (!at.ok()) return at.status();
        batch_payload_bytes += w.data_bytes() - stored_before;
        if (compress && probed_bytes < options_.compression_probe_bytes) {
          // KV in fp16 barely compresses, and zstd costs more than the disk:
          // once the probe shows it saves too little, the rest goes raw.
          probed_bytes += b.host->size();
          probed_stored += w.data_bytes() - stored_before - kFrameHeaderBytes;
          if (probed_bytes >= options_.compression_probe_bytes &&
              static_cast<double>(probed_stored) >
                  (1.0 - options_.min_compression_saving) * static_cast<double>(probed_bytes)) {
            compress = false;
            run.compression_stopped = true;
          }
        }
        written[b.lookup_hash] = {
            .sequence = run.sequence, .offset = at->offset, .checksum = b.seal.checksum};
        ++run.host_payloads;
        run.payload_bytes += b.host->size();
      }
      // Paced between batches, once the batch's blocks are let go: a
      // checkpoint that sleeps pins nothing, so eviction and demotion go on.
      batch.clear();
      absl::SleepFor(pace.Take(batch_payload_bytes, absl::Now()));
    }
  }
  batch.clear();

  nlohmann::json lower_index = nlohmann::json::array();
  for (size_t first = 0; first < lower_entries.size(); first += kLowerIndexEntriesPerRecord) {
    v1::CheckpointLowerIndex record;
    const size_t end = std::min(lower_entries.size(), first + kLowerIndexEntriesPerRecord);
    for (size_t i = first; i < end; ++i) *record.add_entries() = std::move(lower_entries[i]);
    record.SerializeToString(&scratch);
    absl::StatusOr<RecordLocation> at =
        w.Append(static_cast<uint8_t>(RecordType::kLowerIndex), AsBytes(scratch), true);
    if (!at.ok()) return at.status();
    lower_index.push_back(at->offset);
  }
  // The copies the manifest will refer to must be on the device first.
  if (reattachable) {
    if (absl::Status s = lower->Sync(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("syncing the lower tier: ", s.message()));
    }
  }
  run.references.assign(references.begin(), references.end());
  nlohmann::json model_keys = nlohmann::json::array();
  for (const ModelImage& m : models) model_keys.push_back({m.key.ns, m.key.model_id});
  const nlohmann::json summary = {
      {"full", run.full},
      {"models", run.models},
      {"blocks", run.blocks},
      {"host_payloads", run.host_payloads},
      {"referenced_payloads", run.referenced_payloads},
      {"payload_bytes", run.payload_bytes},
      {"lower_copies", run.lower_copies},
      {"compression_stopped", run.compression_stopped},
      {"lower_index", lower_index},
      {"model_keys", model_keys},
  };
  absl::StatusOr<CheckpointInfo> committed = w.Commit(summary, run.references);
  if (!committed.ok()) return committed.status();
  run.data_bytes = committed->data_bytes;
  run.records = committed->record_count;
  run.duration = absl::Now() - start;

  payloads_ = std::move(next);
  have_previous_ = true;
  runs_since_full_ = run.full ? 0 : runs_since_full_ + 1;
  // Space freed before this checkpoint began is in no checkpoint we keep
  // relying on: the lower tier may reuse it.
  if (reattachable) lower->CheckpointCommitted(mark);
  if (absl::Status s =
          CheckpointDirectory(fs_, options_.dir, options_.mac_key).Prune(options_.keep).status();
      !s.ok()) {
    spdlog::warn("checkpoint: pruning {}: {}", options_.dir, s.ToString());
  }
  return run;
}

}  // namespace kvcache::checkpoint
