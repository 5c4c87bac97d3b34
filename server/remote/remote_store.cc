#include "server/remote/remote_store.h"

#include <array>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/block.h"

namespace kvcache {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'R', 'B'};
constexpr uint8_t kValueVersion = 1;
constexpr size_t kHeaderBytes = 4 + 1 + 3 + 8;

void PutLittleEndian64(uint64_t v, std::byte* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t GetLittleEndian64(const std::byte* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteStore>> RemoteStore::Start(const RemoteStoreOptions& options,
                                                                const DaemonSecret& shared) {
  if (options.write_queue_blocks == 0 || options.write_batch_blocks == 0 ||
      options.breaker_failures == 0 || options.breaker_cooldown <= absl::ZeroDuration() ||
      options.batch_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "remote store: write_queue_blocks, write_batch_blocks and breaker_failures must be at "
        "least 1, and breaker_cooldown and batch_deadline positive");
  }
  if (options.cluster.seeds.empty()) {
    return absl::InvalidArgumentError("remote store: no seed node of the Redis Cluster");
  }
  return std::unique_ptr<RemoteStore>(new RemoteStore(options, shared));
}

RemoteStore::RemoteStore(const RemoteStoreOptions& options, const DaemonSecret& shared)
    : options_(options), sealer_(shared) {
  writer_thread_ = std::thread([this] { WriteLoop(); });
}

absl::Status RemoteStore::Connect() {
  MutexLock lock(&read_mu_);
  return ConnectReaderLocked();
}

absl::Status RemoteStore::ConnectReaderLocked() {
  if (reader_ != nullptr) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<ClusterClient>> client = ClusterClient::Connect(options_.cluster);
  if (!client.ok()) return client.status();
  reader_ = *std::move(client);
  return absl::OkStatus();
}

RemoteStore::~RemoteStore() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  writer_thread_.join();
}

bool RemoteStore::Put(std::string ns, std::string key, uint64_t checksum,
                      std::vector<std::byte> bytes) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || queue_.size() >= options_.write_queue_blocks) {
      ++stats_.writes_dropped_full;
      return false;
    }
    if (absl::Now() < open_until_) {
      ++stats_.writes_dropped_open;
      return false;
    }
    ++stats_.writes_queued;
    queue_.push_back({.ns = std::move(ns),
                      .key = std::move(key),
                      .checksum = checksum,
                      .bytes = std::move(bytes)});
  }
  changed_.notify_all();
  return true;
}

void RemoteStore::Flush() {
  mu_.Lock();
  changed_.wait(mu_, [this] {
    mu_.AssertHeld();
    return (queue_.empty() && in_flight_ == 0) || stopping_;
  });
  mu_.Unlock();
}

bool RemoteStore::MayTry() const {
  MutexLock lock(&mu_);
  return absl::Now() >= open_until_;
}

void RemoteStore::Reached(bool any) {
  MutexLock lock(&mu_);
  if (any) {
    failures_in_a_row_ = 0;
    return;
  }
  if (++failures_in_a_row_ >= options_.breaker_failures && absl::Now() >= open_until_) {
    ++stats_.breaker_opens;
    open_until_ = absl::Now() + options_.breaker_cooldown;
    failures_in_a_row_ = 0;
  }
}

std::string RemoteStore::ValueOf(const Write& w) const {
  std::array<std::byte, kHeaderBytes> header{};
  std::memcpy(header.data(), kMagic, 4);
  header[4] = static_cast<std::byte>(kValueVersion);
  PutLittleEndian64(w.checksum, header.data() + 8);
  const std::span<const std::byte> pieces[] = {header, w.bytes};
  std::string sealed;
  sealed.reserve(kHeaderBytes + w.bytes.size() + ValueSealer::kOverheadBytes);
  sealer_.Seal(w.ns, w.key, pieces, &sealed);
  return sealed;
}

void RemoteStore::WriteLoop() {
  for (;;) {
    std::vector<Write> batch;
    {
      mu_.Lock();
      changed_.wait(mu_, [this] {
        mu_.AssertHeld();
        return !queue_.empty() || stopping_;
      });
      if (stopping_) {
        stats_.writes_dropped_full += queue_.size();
        queue_.clear();
        mu_.Unlock();
        changed_.notify_all();
        return;
      }
      while (!queue_.empty() && batch.size() < options_.write_batch_blocks) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      in_flight_ = batch.size();
      mu_.Unlock();
    }
    uint64_t done = 0, failed = 0, dropped = 0, bytes = 0;
    if (!MayTry()) {
      dropped = batch.size();
    } else {
      std::vector<KeyedCommand> commands;
      commands.reserve(batch.size());
      for (const Write& w : batch) {
        commands.push_back({w.key, {"SET", w.key, ValueOf(w)}});
      }
      bool any = false;
      if (writer_ == nullptr) {
        absl::StatusOr<std::unique_ptr<ClusterClient>> client =
            ClusterClient::Connect(options_.cluster);
        if (client.ok()) writer_ = *std::move(client);
      }
      if (writer_ == nullptr) {
        failed = batch.size();  // the cluster cannot be reached (yet)
      } else {
        const std::vector<absl::StatusOr<RespValue>> replies =
            writer_->Run(commands, absl::Now() + options_.batch_deadline);
        for (size_t i = 0; i < replies.size(); ++i) {
          any = any || replies[i].ok();
          if (replies[i].ok() && !replies[i]->is_error()) {
            ++done;
            bytes += commands[i].command[2].size();  // the sealed value
          } else {
            ++failed;
          }
        }
      }
      Reached(any);
    }
    {
      MutexLock lock(&mu_);
      stats_.writes_done += done;
      stats_.writes_failed += failed;
      stats_.writes_dropped_open += dropped;
      stats_.written_bytes += bytes;
      in_flight_ = 0;
    }
    changed_.notify_all();
  }
}

bool RemoteStore::SealedBlocks::Holds(size_t i, uint64_t block_bytes) const {
  const absl::StatusOr<RespValue>& reply = replies_[i];
  return reply.ok() && reply->type == RespValue::Type::kString &&
         ValueSealer::OpenedBytes(reply->str.size()) == kHeaderBytes + block_bytes;
}

RemoteStore::ReadOutcome RemoteStore::OpenValue(const SealedBlocks& blocks, size_t i,
                                                std::vector<std::byte>* bytes,
                                                uint64_t* checksum) const {
  const absl::StatusOr<RespValue>& reply = blocks.replies_[i];
  if (!reply.ok() || reply->is_error()) return ReadOutcome::kUnavailable;
  if (reply->is_nil()) return ReadOutcome::kAbsent;
  const std::string& sealed = reply->str;
  const size_t opened = ValueSealer::OpenedBytes(sealed.size());
  if (reply->type != RespValue::Type::kString || opened < kHeaderBytes) {
    return ReadOutcome::kUnreadable;
  }
  // The header and the bytes open straight into their places.
  std::array<std::byte, kHeaderBytes> header;
  bytes->resize(opened - kHeaderBytes);
  const std::span<std::byte> pieces[] = {header, *bytes};
  if (!sealer_.Open(blocks.ns_, blocks.keys_[i], sealed, pieces).ok() ||
      std::memcmp(header.data(), kMagic, 4) != 0 ||
      header[4] != static_cast<std::byte>(kValueVersion)) {
    return ReadOutcome::kUnreadable;
  }
  *checksum = GetLittleEndian64(header.data() + 8);
  if (Checksum(*bytes) != *checksum) return ReadOutcome::kChecksum;
  return ReadOutcome::kHit;
}

void RemoteStore::Count(ReadOutcome outcome, uint64_t bytes) {
  MutexLock lock(&mu_);
  switch (outcome) {
    case ReadOutcome::kHit:
      ++stats_.hits;
      stats_.read_bytes += bytes;
      break;
    case ReadOutcome::kAbsent:
      ++stats_.misses_absent;
      break;
    case ReadOutcome::kUnreadable:
      ++stats_.misses_unreadable;
      break;
    case ReadOutcome::kChecksum:
      ++stats_.misses_checksum;
      break;
    case ReadOutcome::kUnavailable:
      ++stats_.misses_unavailable;
      break;
  }
}

RemoteStore::SealedBlocks RemoteStore::ReadSealed(std::string_view ns,
                                                  std::span<const std::string> keys) {
  SealedBlocks blocks;
  blocks.ns_ = std::string(ns);
  blocks.keys_.assign(keys.begin(), keys.end());
  if (!MayTry()) {
    blocks.replies_.assign(keys.size(), absl::UnavailableError("the breaker is open"));
  } else {
    std::vector<KeyedCommand> commands;
    commands.reserve(keys.size());
    for (const std::string& key : keys) {
      commands.push_back({.key = key, .command = {"GET", key}, .read_only = true});
    }
    MutexLock lock(&read_mu_);
    const absl::Status connected = ConnectReaderLocked();
    if (connected.ok()) {
      blocks.replies_ = reader_->Run(commands, absl::Now() + options_.batch_deadline);
    } else {
      blocks.replies_.assign(keys.size(), connected);
    }
    bool any = keys.empty();
    for (const absl::StatusOr<RespValue>& reply : blocks.replies_) any = any || reply.ok();
    Reached(any);
  }
  MutexLock lock(&mu_);
  stats_.reads += keys.size();
  for (const absl::StatusOr<RespValue>& reply : blocks.replies_) {
    if (!reply.ok() || reply->is_error()) {
      ++stats_.misses_unavailable;
    } else if (reply->is_nil()) {
      ++stats_.misses_absent;
    }
  }
  return blocks;
}

std::optional<uint64_t> RemoteStore::Open(const SealedBlocks& blocks, size_t i,
                                          std::vector<std::byte>* bytes, bool count) {
  uint64_t checksum = 0;
  const ReadOutcome outcome = OpenValue(blocks, i, bytes, &checksum);
  // ReadSealed counted the misses that needed no opening.
  const bool counted = outcome == ReadOutcome::kUnavailable || outcome == ReadOutcome::kAbsent;
  if (count && !counted) Count(outcome, bytes->size());
  if (outcome != ReadOutcome::kHit) return std::nullopt;
  return checksum;
}

std::optional<uint64_t> RemoteStore::PeekChecksum(const SealedBlocks& blocks, size_t i) const {
  const absl::StatusOr<RespValue>& reply = blocks.replies_[i];
  if (!reply.ok() || reply->type != RespValue::Type::kString) return std::nullopt;
  std::array<std::byte, kHeaderBytes> header;
  if (!sealer_.Peek(blocks.ns_, blocks.keys_[i], reply->str, header).ok() ||
      std::memcmp(header.data(), kMagic, 4) != 0 ||
      header[4] != static_cast<std::byte>(kValueVersion)) {
    return std::nullopt;
  }
  return GetLittleEndian64(header.data() + 8);
}

std::vector<std::optional<RemoteBlock>> RemoteStore::Get(std::string_view ns,
                                                         std::span<const std::string> keys) {
  const SealedBlocks sealed = ReadSealed(ns, keys);
  std::vector<std::optional<RemoteBlock>> blocks(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    RemoteBlock block;
    if (std::optional<uint64_t> checksum = Open(sealed, i, &block.bytes); checksum.has_value()) {
      block.checksum = *checksum;
      blocks[i] = std::move(block);
    }
  }
  return blocks;
}

RemoteStore::Stats RemoteStore::stats() const {
  MutexLock lock(&mu_);
  Stats s = stats_;
  s.write_queue = queue_.size() + in_flight_;
  s.breaker_open = absl::Now() < open_until_;
  return s;
}

}  // namespace kvcache
