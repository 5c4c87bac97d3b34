// GatedTier: a Tier for tests whose reads wait while its gate is closed, so
// a test can hold reads in flight on purpose. It counts the reads that
// reached the gate.
#ifndef KVCACHE_SERVER_CORE_GATED_TIER_H_
#define KVCACHE_SERVER_CORE_GATED_TIER_H_

#include <atomic>
#include <memory>
#include <utility>

#include "absl/synchronization/notification.h"
#include "server/core/tier.h"

namespace kvcache {

class GatedTier final : public Tier {
 public:
  explicit GatedTier(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<StoredRef> Write(uint64_t key, const BlockPayload& payload) override {
    return inner_->Write(key, payload);
  }
  absl::Status Read(const StoredCopy& copy, std::span<std::byte> out) override {
    if (closed_.load()) {
      waiting_.fetch_add(1);
      open_.WaitForNotification();
    }
    return inner_->Read(copy, out);
  }
  TierStats GetStats() const override { return inner_->GetStats(); }
  void Close() { closed_ = true; }
  void Open() {
    if (!opened_.exchange(true)) open_.Notify();
  }
  // Reads that found the gate closed (and waited, or wait still).
  int waiting() const { return waiting_.load(); }

 private:
  std::shared_ptr<Tier> inner_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> opened_{false};
  std::atomic<int> waiting_{0};
  absl::Notification open_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_GATED_TIER_H_
