#include "server/checkpoint/restorer.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_directory.h"
#include "server/checkpoint/checkpoint_reader.h"
#include "server/checkpoint/records.h"
#include "server/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kvcache::checkpoint {
namespace {

constexpr size_t kReattachBatch = 1024;

// The manifest summary's keys the restore and the admin RPCs read, with their
// types (docs/checkpoint-format.md, "Record contents"). Missing keys are fine.
absl::Status CheckSummaryTypes(const nlohmann::json& summary) {
  auto bad = [](absl::string_view key, absl::string_view want) {
    return absl::DataLossError(absl::StrCat("the manifest summary's ", key, " is not ", want));
  };
  if (!summary.is_object()) return absl::DataLossError("the manifest summary is not an object");
  if (const auto it = summary.find("full"); it != summary.end() && !it->is_boolean()) {
    return bad("full", "a boolean");
  }
  for (const char* key : {"models", "blocks", "host_payloads", "referenced_payloads",
                          "payload_bytes", "lower_copies"}) {
    if (const auto it = summary.find(key); it != summary.end() && !it->is_number_unsigned()) {
      return bad(key, "an unsigned integer");
    }
  }
  if (const auto it = summary.find("lower_index"); it != summary.end()) {
    if (!it->is_array()) return bad("lower_index", "an array");
    for (const nlohmann::json& offset : *it) {
      if (!offset.is_number_unsigned()) return bad("lower_index", "an array of offsets");
    }
  }
  if (const auto it = summary.find("model_keys"); it != summary.end()) {
    if (!it->is_array()) return bad("model_keys", "an array");
    for (const nlohmann::json& key : *it) {
      if (!key.is_array() || key.size() != 2 || !key[0].is_string() || !key[1].is_string()) {
        return bad("model_keys", "an array of [namespace, model id] pairs");
      }
    }
  }
  return absl::OkStatus();
}

template <typename Message>
absl::Status Parse(const Record& record, Message* out) {
  if (!out->ParseFromArray(record.bytes.data(), static_cast<int>(record.bytes.size()))) {
    return absl::DataLossError(absl::StrCat("checkpoint ", record.location.sequence,
                                            ": a record at offset ", record.location.offset,
                                            " does not parse"));
  }
  return absl::OkStatus();
}

// Reads a checkpoint's records on a thread of its own, ahead of the thread
// that verifies and inserts them, so the disk stays busy while the CPU works
// (up to kAheadBytes in flight). A payload reference is resolved here too, so
// only this thread touches the reader.
class RecordPrefetcher {
 public:
  struct Item {
    Record record;
    Record referenced;    // the payload a kPayloadRef record points to
    absl::Status status;  // a read error: the last item
    bool end = false;     // no more records
  };

  RecordPrefetcher(CheckpointReader& reader, const std::atomic<bool>& stop)
      : reader_(reader), stop_(stop), thread_([this] { Produce(); }) {}
  ~RecordPrefetcher() {
    {
      MutexLock lock(&mu_);
      closed_ = true;
    }
    space_.notify_all();
    thread_.join();
  }

  // The next item (blocks until it is read).
  Item Next() {
    MutexLock lock(&mu_);
    ready_.wait(mu_, [this] {
      mu_.AssertHeld();
      return !queue_.empty();
    });
    Item item = std::move(queue_.front());
    queue_.pop_front();
    bytes_ -= SizeOf(item);
    space_.notify_all();
    return item;
  }

 private:
  static constexpr uint64_t kAheadBytes = uint64_t{64} << 20;

  static uint64_t SizeOf(const Item& item) {
    return item.record.bytes.size() + item.referenced.bytes.size() + 64;
  }

  void Produce() {
    while (true) {
      Item item;
      if (stop_.load()) {
        item.end = true;
      } else if (absl::StatusOr<bool> more = reader_.Next(&item.record); !more.ok()) {
        item.status = more.status();
      } else if (!*more) {
        item.end = true;
      } else if (static_cast<RecordType>(item.record.type) == RecordType::kPayloadRef) {
        v1::CheckpointPayloadRef ref;
        if (!ref.ParseFromArray(item.record.bytes.data(),
                                static_cast<int>(item.record.bytes.size()))) {
          item.status = absl::DataLossError(absl::StrCat(
              "a payload reference at offset ", item.record.location.offset, " does not parse"));
        } else {
          item.status = reader_.ReadRecordAt({ref.sequence(), ref.offset()}, &item.referenced);
        }
      }
      const bool last = item.end || !item.status.ok();
      MutexLock lock(&mu_);
      space_.wait(mu_, [this] {
        mu_.AssertHeld();
        return closed_ || bytes_ < kAheadBytes;
      });
      if (closed_) return;
      bytes_ += SizeOf(item);
      queue_.push_back(std::move(item));
      ready_.notify_all();
      if (last) return;
    }
  }

  CheckpointReader& reader_;
  const std::atomic<bool>& stop_;
  Mutex mu_;
  std::condition_variable_any ready_;
  std::condition_variable_any space_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is set up
};

BlockSeal SealOf(const v1::CheckpointLowerIndex::Entry& e) {
  return {.size = e.size(),
          .checksum = e.checksum(),
          .raw_checksum = e.raw_checksum(),
          .decoded_checksum = e.decoded_checksum(),
          .compressed = e.compressed()};
}

}  // namespace

std::string_view RestoreStateName(RestoreState state) {
  switch (state) {
    case RestoreState::kOff:
      return "off";
    case RestoreState::kReattaching:
      return "reattaching";
    case RestoreState::kRestoring:
      return "restoring";
    case RestoreState::kDone:
      return "done";
    case RestoreState::kFailed:
      return "failed";
    case RestoreState::kStopped:
      return "stopped";
  }
  return "unknown";
}

// A block record whose payload record comes next.
struct Restorer::Pending {
  BlockImage image;
};

Restorer::Restorer(Cache* cache, FileSystem* fs, std::string dir, const CheckpointKey& mac_key)
    : cache_(cache), target_(cache), fs_(fs), dir_(std::move(dir)), mac_key_(mac_key) {}

Restorer::~Restorer() = default;

absl::StatusOr<std::unique_ptr<CheckpointReader>> Restorer::OpenReader(uint64_t sequence) const {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(fs_, dir_, sequence, {.mac_key = mac_key_});
  if (!reader.ok()) return reader.status();
  if (absl::Status s = CheckSummaryTypes((*reader)->info().summary); !s.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", sequence, ": ", s.message()));
  }
  return reader;
}

absl::Status Restorer::Prepare() {
  started_ = absl::Now();
  if (!fs_->Exists(dir_)) return absl::OkStatus();
  CheckpointDirectory directory(fs_, dir_, mac_key_);
  absl::StatusOr<std::vector<CheckpointInfo>> listed = directory.List();
  if (!listed.ok()) return listed.status();
  std::vector<CheckpointInfo> infos = *std::move(listed);
  std::sort(infos.begin(), infos.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.sequence > b.sequence;
  });
  if (!infos.empty() && infos.front().state == CheckpointState::kUnsupported) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", infos.front().sequence, " in ", dir_, ": ", infos.front().reason,
        "; move it away to start without it, or run the kvcached that wrote it"));
  }
  std::vector<uint64_t> candidates;
  for (const CheckpointInfo& info : infos) {
    if (info.state == CheckpointState::kComplete) {
      candidates.push_back(info.sequence);
    } else {
      spdlog::error("checkpoint {} in {} is {}: {}", info.sequence, dir_,
                    std::string(CheckpointStateName(info.state)), info.reason);
      if (info.state == CheckpointState::kCorrupt) {
        MutexLock lock(&mu_);
        ++progress_.failed_checkpoints;
        progress_.error = absl::StrCat("checkpoint ", info.sequence, ": ", info.reason);
      }
    }
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = OpenReader(candidates[i]);
    if (!reader.ok()) {
      spdlog::error("checkpoint {} in {} cannot be read: {}; trying the one before it",
                    candidates[i], dir_, reader.status().ToString());
      MutexLock lock(&mu_);
      ++progress_.failed_checkpoints;
      progress_.error = std::string(reader.status().message());
      continue;
    }
    reader_ = *std::move(reader);
    fallbacks_.assign(candidates.begin() + static_cast<std::ptrdiff_t>(i) + 1, candidates.end());
    break;
  }
  if (reader_ == nullptr) return absl::OkStatus();
  {
    MutexLock lock(&mu_);
    progress_.state = RestoreState::kReattaching;
    progress_.sequence = reader_->info().sequence;
    progress_.records_total = reader_->info().record_count;
  }
  spdlog::info("restoring checkpoint {} from {} ({} records, {} bytes)", reader_->info().sequence,
               dir_, reader_->info().record_count, reader_->info().data_bytes);
  if (absl::Status s = ReattachLower(*reader_); !s.ok()) {
    // The lower copies are lost, not the checkpoint: host payloads still restore.
    spdlog::error("checkpoint {}: re-attaching the lower tier's copies: {}",
                  reader_->info().sequence, s.ToString());
    MutexLock lock(&mu_);
    progress_.error = std::string(s.message());
  }
  MutexLock lock(&mu_);
  progress_.state = RestoreState::kRestoring;
  return absl::OkStatus();
}

absl::Status Restorer::ReattachLower(CheckpointReader& reader) {
  Tier* lower = cache_->tiers().lower_tier();
  const nlohmann::json& summary = reader.info().summary;  // CheckSummaryTypes passed
  if (!summary.contains("lower_index") || summary["lower_index"].empty()) {
    return absl::OkStatus();
  }
  if (lower == nullptr || !lower->persistent()) {
    return absl::FailedPreconditionError(
        "the checkpoint lists lower-tier copies but this daemon has no persistent lower tier");
  }
  std::vector<ModelKey> keys;
  for (const auto& k : summary.value("model_keys", nlohmann::json::array())) {
    keys.push_back({k.at(0).get<std::string>(), k.at(1).get<std::string>()});
  }
  std::vector<ReattachRequest> requests;
  std::vector<std::pair<uint32_t, uint64_t>> owners;  // model ordinal, lookup hash
  auto flush = [&] {
    lower->ReattachBatch(std::span<ReattachRequest>(requests));
    uint64_t ok = 0;
    uint64_t failed = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].status.ok() && requests[i].copy != nullptr) {
        lower_[keys[owners[i].first]][owners[i].second] = std::move(requests[i].copy);
        ++ok;
      } else {
        ++failed;
        spdlog::debug("checkpoint: a lower copy did not re-attach: {}",
                      requests[i].status.ToString());
      }
    }
    requests.clear();
    owners.clear();
    MutexLock lock(&mu_);
    progress_.reattached_copies += ok;
    progress_.reattach_failures += failed;
  };
  for (const auto& offset : summary["lower_index"]) {
    Record record;
    if (absl::Status s =
            reader.ReadRecordAt({reader.info().sequence, offset.get<uint64_t>()}, &record);
        !s.ok()) {
      return s;
    }
    v1::CheckpointLowerIndex index;
    KVCACHE_RETURN_IF_ERROR(Parse(record, &index));
    for (const v1::CheckpointLowerIndex::Entry& e : index.entries()) {
      if (e.model() >= keys.size()) return absl::DataLossError("a lower-index entry of no model");
      const v1::CheckpointLowerCopy& l = e.location();
      requests.push_back({.key = e.key(),
                          .seal = SealOf(e),
                          .location = {.offset = l.offset(),
                                       .footprint = l.footprint(),
                                       .sequence = l.sequence(),
                                       .epoch = l.epoch()}});
      owners.emplace_back(e.model(), e.lookup_hash());
      if (requests.size() == kReattachBatch) flush();
    }
  }
  if (!requests.empty()) flush();
  return absl::OkStatus();
}

void Restorer::Run(const std::atomic<bool>& stop) {
  while (reader_ != nullptr) {
    absl::Status s = Replay(*reader_, stop);
    const uint64_t sequence = reader_->info().sequence;
    reader_.reset();
    if (stop.load()) break;
    if (s.ok()) break;
    spdlog::error("checkpoint {}: {}; continuing from the checkpoint before it", sequence,
                  s.ToString());
    {
      MutexLock lock(&mu_);
      ++progress_.failed_checkpoints;
      progress_.error = absl::StrCat("checkpoint ", sequence, ": ", s.message());
    }
    while (!fallbacks_.empty() && reader_ == nullptr) {
      const uint64_t next = fallbacks_.front();
      fallbacks_.erase(fallbacks_.begin());
      absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = OpenReader(next);
      if (reader.ok()) {
        reader_ = *std::move(reader);
        MutexLock lock(&mu_);
        progress_.sequence = next;
        progress_.records_done = 0;
        progress_.records_total = reader_->info().record_count;
      } else {
        spdlog::error("checkpoint {} cannot be read: {}", next, reader.status().ToString());
      }
    }
  }
  target_.EndRestore();  // blocks re-hashed under other keys need no other names now
  MutexLock lock(&mu_);
  progress_.duration = absl::Now() - started_;
  if (progress_.state == RestoreState::kOff) return;
  if (stop.load()) {
    progress_.state = RestoreState::kStopped;
  } else {
    progress_.state = progress_.failed_checkpoints > 0 && progress_.restored_blocks == 0
                          ? RestoreState::kFailed
                          : RestoreState::kDone;
  }
  spdlog::info(
      "restore {}: {} blocks ({} payload bytes) in {}; {} lower copies re-attached ({} did not "
      "verify); skipped: {} cached already, {} without a parent, {} lost, {} corrupt, {} other",
      RestoreStateName(progress_.state), progress_.restored_blocks, progress_.restored_bytes,
      absl::FormatDuration(progress_.duration), progress_.reattached_copies,
      progress_.reattach_failures, progress_.present_blocks, progress_.orphan_blocks,
      progress_.lost_blocks, progress_.corrupt_payloads, progress_.skipped_blocks);
}

void Restorer::Count(RestoreOutcome outcome, uint64_t bytes) {
  MutexLock lock(&mu_);
  switch (outcome) {
    case RestoreOutcome::kRestored:
      ++progress_.restored_blocks;
      progress_.restored_bytes += bytes;
      break;
    case RestoreOutcome::kPresent:
      ++progress_.present_blocks;
      break;
    case RestoreOutcome::kOrphan:
      ++progress_.orphan_blocks;
      break;
    case RestoreOutcome::kLost:
      ++progress_.lost_blocks;
      break;
    case RestoreOutcome::kUnknownModel:
    case RestoreOutcome::kMismatch:
      ++progress_.skipped_blocks;
      break;
  }
}

absl::Status Restorer::Replay(CheckpointReader& reader, const std::atomic<bool>& stop) {
  std::optional<ModelKey> model;  // the current model, when it restored
  uint32_t block_tokens = 0;
  const absl::flat_hash_map<uint64_t, StoredRef>* lower = nullptr;
  std::optional<BlockImage> pending;  // a block whose payload record comes next
  absl::Time last_log = absl::Now();
  RecordPrefetcher records(reader, stop);
  // Inserts `image` (host copy or not); a block with no copy left is lost.
  auto insert = [&](BlockImage image) {
    const uint64_t bytes = image.host != nullptr ? image.seal.size : 0;
    Count(target_.RestoreBlock(*model, std::move(image)), bytes);
  };
  while (!stop.load()) {
    RecordPrefetcher::Item item = records.Next();
    if (!item.status.ok()) return item.status;
    if (item.end) break;
    const Record& record = item.record;
    {
      MutexLock lock(&mu_);
      ++progress_.records_done;
    }
    if (absl::Now() - last_log > absl::Seconds(5)) {
      last_log = absl::Now();
      RestoreProgress p = progress();
      spdlog::info("restoring checkpoint {}: {} of {} records, {} blocks", p.sequence,
                   p.records_done, p.records_total, p.restored_blocks);
    }
    const auto type = static_cast<RecordType>(record.type);
    if (pending.has_value() && type != RecordType::kPayload && type != RecordType::kPayloadRef) {
      return absl::DataLossError(absl::StrCat("a block record at offset ", record.location.offset,
                                              " is not followed by its payload"));
    }
    switch (type) {
      case RecordType::kModel: {
        v1::CheckpointModel m;
        KVCACHE_RETURN_IF_ERROR(Parse(record, &m));
        absl::StatusOr<ModelImage> image = DecodeModel(m);
        if (!image.ok()) return image.status();
        model.reset();
        if (absl::Status s = target_.RestoreModel(*image); !s.ok()) {
          spdlog::error("restore: model {} not restored: {}", image->key.ToString(), s.ToString());
          MutexLock lock(&mu_);
          progress_.skipped_blocks += m.blocks();
          break;
        }
        model = image->key;
        block_tokens = image->layout.block_tokens;
        auto it = lower_.find(image->key);
        lower = it == lower_.end() ? nullptr : &it->second;
        break;
      }
      case RecordType::kBlock: {
        v1::CheckpointBlock b;
        KVCACHE_RETURN_IF_ERROR(Parse(record, &b));
        if (!model.has_value()) {
          if (b.has_host_copy()) pending.emplace();  // skip its payload record too
          break;
        }
        absl::StatusOr<BlockImage> image = DecodeBlock(b, block_tokens);
        if (!image.ok()) return image.status();
        if (lower != nullptr && b.has_lower()) {
          if (auto it = lower->find(image->lookup_hash);
              it != lower->end() && it->second->key() == image->key &&
              it->second->seal().checksum == image->seal.checksum) {
            image->lower = PinnedCopy(it->second, PinReason::kCheckpoint);
          }
        }
        if (b.has_host_copy()) {
          pending = *std::move(image);
        } else {
          insert(*std::move(image));
        }
        break;
      }
      case RecordType::kPayload:
      case RecordType::kPayloadRef: {
        if (!pending.has_value()) {
          return absl::DataLossError(absl::StrCat("a payload record at offset ",
                                                  record.location.offset, " follows no block"));
        }
        BlockImage image = *std::move(pending);
        pending.reset();
        if (!model.has_value()) break;  // its model was not restored
        // A reference was resolved by the prefetcher.
        const Record* payload = type == RecordType::kPayloadRef ? &item.referenced : &record;
        std::span<const std::byte> bytes(payload->bytes);
        if (bytes.size() != image.seal.size || Checksum(bytes) != image.seal.checksum) {
          spdlog::error("restore: block {:016x} of {}: its payload does not match its checksum",
                        image.key, model->ToString());
          {
            MutexLock lock(&mu_);
            ++progress_.corrupt_payloads;
          }
          insert(std::move(image));  // its lower copy, if any
          break;
        }
        absl::StatusOr<StagingBlock> host = target_.AllocateRestoredPayload(bytes.size());
        if (host.ok()) {
          std::memcpy(host->data().data(), bytes.data(), bytes.size());
          image.host =
              PinnedBlock(std::move(*host).Seal(image.key, image.seal), PinReason::kCheckpoint);
        }
        const uint64_t lookup_hash = image.lookup_hash;
        const uint64_t checksum = image.seal.checksum;
        const bool in_host = image.host != nullptr;
        const uint64_t size = in_host ? image.seal.size : 0;
        const RestoreOutcome outcome = target_.RestoreBlock(*model, std::move(image));
        Count(outcome, size);
        if (outcome == RestoreOutcome::kRestored && in_host) {
          payloads_[*model][lookup_hash] = {.sequence = payload->location.sequence,
                                            .offset = payload->location.offset,
                                            .checksum = checksum};
        }
        break;
      }
      case RecordType::kLowerIndex:
        break;
      default:
        return absl::DataLossError(absl::StrCat("a record of unknown type ", record.type,
                                                " at offset ", record.location.offset));
    }
  }
  return absl::OkStatus();
}

RestoreProgress Restorer::progress() const {
  MutexLock lock(&mu_);
  RestoreProgress p = progress_;
  if (p.state == RestoreState::kReattaching || p.state == RestoreState::kRestoring) {
    p.duration = absl::Now() - started_;
  }
  return p;
}

bool Restorer::finished() const {
  MutexLock lock(&mu_);
  return progress_.state != RestoreState::kReattaching &&
         progress_.state != RestoreState::kRestoring;
}

}  // namespace kvcache::checkpoint
