#include "server/tier/ssd_tier.h"

#include <optional>
#include <utility>
#include <vector>

namespace kvcache {
namespace {

class SsdCopy final : public StoredCopy {
 public:
  SsdCopy(std::shared_ptr<SsdStore> store, SsdRef extent, const BlockSeal& seal)
      : StoredCopy(extent->key(), seal, extent->footprint()),
        store_(std::move(store)),
        extent_(std::move(extent)) {}
  ~SsdCopy() override {
    extent_.reset();  // before the store it returns to
  }
  const SsdExtent& extent() const { return *extent_; }

 private:
  const std::shared_ptr<SsdStore> store_;
  SsdRef extent_;
};

class SsdTier final : public Tier {
 public:
  explicit SsdTier(std::shared_ptr<SsdStore> store) : store_(std::move(store)) {}

  absl::StatusOr<StoredRef> Write(uint64_t key, const BlockPayload& payload) override {
    absl::StatusOr<SsdRef> extent = store_->Write(key, payload.data(), payload.checksum());
    if (!extent.ok()) return extent.status();
    return std::make_shared<SsdCopy>(store_, *std::move(extent), payload.seal());
  }

  absl::Status Read(const StoredCopy& copy, std::span<std::byte> out) override {
    return store_->Read(static_cast<const SsdCopy&>(copy).extent(), out);
  }

  void ReadBatch(std::span<StoredRead> reads) override {
    std::vector<SsdReadRequest> requests;
    requests.reserve(reads.size());
    for (StoredRead& r : reads) {
      requests.push_back({.extent = &static_cast<const SsdCopy*>(r.copy)->extent(),
                          .out = r.out,
                          .status = &r.status});
    }
    store_->ReadBatch(requests);
  }

  TierStats GetStats() const override {
    const SsdStoreStats s = store_->GetStats();
    return {.kind = "ssd",
            .capacity_bytes = s.capacity_bytes,
            .allocated_bytes = s.allocated_bytes,
            .payload_bytes = s.payload_bytes,
            .live_copies = s.live_extents,
            .writes = s.writes,
            .write_bytes = s.write_bytes,
            .reads = s.reads,
            .read_bytes = s.read_bytes,
            .checksum_failures = s.checksum_failures,
            .failed_writes = s.failed_writes,
            .retained_bytes = s.retained_bytes,
            .retained_reused = s.retained_reused,
            .reattached = s.reattached,
            .staging_bytes = s.staging_cached_bytes + s.staging_in_use_bytes};
  }

  bool persistent() const override { return true; }

  std::optional<StoredLocation> Locate(const StoredCopy& copy) const override {
    const SsdExtent& e = static_cast<const SsdCopy&>(copy).extent();
    return StoredLocation{.offset = e.offset(),
                          .footprint = e.footprint(),
                          .sequence = e.sequence(),
                          .epoch = e.epoch()};
  }

  void ReattachBatch(std::span<ReattachRequest> requests) override {
    std::vector<SsdReattachRequest> ssd;
    ssd.reserve(requests.size());
    for (const ReattachRequest& r : requests) {
      ssd.push_back({.key = r.key,
                     .size = r.seal.size,
                     .checksum = r.seal.checksum,
                     .offset = r.location.offset,
                     .footprint = r.location.footprint,
                     .sequence = r.location.sequence,
                     .epoch = r.location.epoch});
    }
    store_->ReattachBatch(ssd);
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].status = std::move(ssd[i].status);
      requests[i].copy =
          ssd[i].extent == nullptr
              ? nullptr
              : std::make_shared<SsdCopy>(store_, std::move(ssd[i].extent), requests[i].seal);
    }
  }

  absl::Status Sync() override { return store_->Sync(); }
  void SetRetention(bool on) override { store_->SetRetention(on); }
  void SetRetentionBudget(uint64_t bytes) override { store_->SetRetentionBudget(bytes); }
  uint64_t CheckpointStarted() override { return store_->CheckpointStarted(); }
  void CheckpointCommitted(uint64_t mark) override { store_->CheckpointCommitted(mark); }
  void CheckpointFailed() override { store_->CheckpointFailed(); }

  const SsdStore& store() const { return *store_; }

 private:
  const std::shared_ptr<SsdStore> store_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Tier>> OpenSsdTier(const SsdStoreOptions& options) {
  absl::StatusOr<std::unique_ptr<SsdStore>> store = SsdStore::Open(options);
  if (!store.ok()) return store.status();
  return std::make_shared<SsdTier>(std::shared_ptr<SsdStore>(*std::move(store)));
}

const SsdExtent& SsdExtentOf(const StoredCopy& copy) {
  return static_cast<const SsdCopy&>(copy).extent();
}

SsdStoreStats SsdStatsOf(const Tier& store) {
  return static_cast<const SsdTier&>(store).store().GetStats();
}

}  // namespace kvcache
