#include "server/core/memory_tier.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "server/common/mutex.h"

namespace kvcache {
namespace {

constexpr uint64_t kPage = 4096;

class MemoryStore;

class MemoryCopy final : public StoredCopy {
 public:
  MemoryCopy(std::shared_ptr<MemoryStore> store, uint64_t key, const BlockSeal& seal,
             std::span<const std::byte> bytes)
      : StoredCopy(key, seal, (bytes.size() + kPage - 1) / kPage * kPage),
        store_(std::move(store)),
        bytes_(bytes.begin(), bytes.end()) {}
  ~MemoryCopy() override;

  std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  const std::shared_ptr<MemoryStore> store_;
  mutable std::vector<std::byte> bytes_;  // mutable: Corrupt() flips bytes
};

class MemoryStore final : public MemoryTier, public std::enable_shared_from_this<MemoryStore> {
 public:
  MemoryStore(uint64_t capacity, std::string kind) : kind_(std::move(kind)) {
    stats_.capacity_bytes = capacity;
  }

  absl::StatusOr<StoredRef> Write(uint64_t key, const BlockPayload& payload) override {
    const uint64_t footprint = (payload.size() + kPage - 1) / kPage * kPage;
    {
      MutexLock lock(&mu_);
      if (footprint > stats_.capacity_bytes) {
        return absl::InvalidArgumentError(absl::StrCat("a block of ", payload.size(),
                                                       " bytes can never fit a store of ",
                                                       stats_.capacity_bytes, " bytes"));
      }
      if (stats_.allocated_bytes + footprint > stats_.capacity_bytes) {
        ++stats_.failed_writes;
        return absl::ResourceExhaustedError("memory tier is full");
      }
      stats_.allocated_bytes += footprint;
      stats_.payload_bytes += payload.size();
      ++stats_.live_copies;
      ++stats_.writes;
      stats_.write_bytes += payload.size();
    }
    auto copy =
        std::make_shared<MemoryCopy>(shared_from_this(), key, payload.seal(), payload.data());
    MutexLock lock(&mu_);
    by_key_[key].insert(copy.get());
    return copy;
  }

  absl::Status Read(const StoredCopy& copy, std::span<std::byte> out) override {
    const auto& c = static_cast<const MemoryCopy&>(copy);
    if (out.size() != c.bytes().size()) {
      return absl::InvalidArgumentError("read buffer size differs from the copy's size");
    }
    {
      MutexLock lock(&mu_);  // Corrupt() writes under the lock too
      std::memcpy(out.data(), c.bytes().data(), out.size());
      ++stats_.reads;
      stats_.read_bytes += out.size();
    }
    if (Checksum(out) != c.seal().checksum) {
      MutexLock lock(&mu_);
      ++stats_.checksum_failures;
      return absl::DataLossError(
          absl::StrCat("stored copy of block ", c.key(), " does not match its checksum"));
    }
    return absl::OkStatus();
  }

  TierStats GetStats() const override {
    MutexLock lock(&mu_);
    TierStats s = stats_;
    s.kind = kind_;
    return s;
  }

  int Corrupt(uint64_t key, uint64_t offset) override {
    MutexLock lock(&mu_);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return 0;
    int changed = 0;
    for (const MemoryCopy* copy : it->second) {
      if (offset < copy->bytes().size()) {
        copy->bytes()[offset] ^= std::byte{0x5a};
        ++changed;
      }
    }
    return changed;
  }

  void Release(const MemoryCopy* copy, uint64_t footprint, uint64_t size) {
    MutexLock lock(&mu_);
    if (auto it = by_key_.find(copy->key()); it != by_key_.end()) {
      it->second.erase(copy);
      if (it->second.empty()) by_key_.erase(it);
    }
    stats_.allocated_bytes -= footprint;
    stats_.payload_bytes -= size;
    --stats_.live_copies;
  }

 private:
  const std::string kind_;
  mutable Mutex mu_;
  TierStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<const MemoryCopy*>> by_key_
      ABSL_GUARDED_BY(mu_);
};

MemoryCopy::~MemoryCopy() { store_->Release(this, footprint(), seal().size); }

}  // namespace

std::shared_ptr<MemoryTier> MemoryTier::Create(uint64_t capacity_bytes, std::string kind) {
  return std::make_shared<MemoryStore>(capacity_bytes, std::move(kind));
}

}  // namespace kvcache
