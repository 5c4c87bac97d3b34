// Pins: who besides the index holds a copy of a block, counted by reason.
//
// A copy (a host payload, a lower-tier or GPU-tier copy) is shared through a
// std::shared_ptr, so its memory stays valid for as long as anyone holds it.
// Whether the cache may evict, demote, drop or re-encode a copy is another
// question: it may not while a lease, a fetch, an append, a move, a device
// placement, a checkpoint or an inspection is using it, because dropping the
// index's reference would then free nothing (and, for a move, lose the move's
// work). Those holders hold the copy through a PinnedRef, which counts itself
// on the copy under a reason; the index's own reference is a plain
// shared_ptr and counts as no pin. "Evictable" is then `!pins().pinned()`,
// and an operator can see why a block is held (cache inspection).
//
//   PinnedRef<BlockPayload> held(node->payload, PinReason::kFetch);
//   ... node->payload->pins().pinned() is true while `held` lives ...
//
// Copying a PinnedRef takes another pin with the same reason; moving one
// moves its pin. A plain shared_ptr copied out of a PinnedRef (ref()) holds
// memory but no pin: use it only for copies no longer in the index.
//
// Thread-safety: PinCounts is atomic (pins come and go outside the cache's
// lock, as holders finish); a read of the counts is a snapshot, exact under
// the cache's lock for everything taken or dropped under that lock. A
// PinnedRef is a value: not synchronized, like the shared_ptr it wraps.
#ifndef KVCACHE_SERVER_CORE_PIN_H_
#define KVCACHE_SERVER_CORE_PIN_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

namespace kvcache {

enum class PinReason : uint8_t {
  kLease = 0,       // a worker's lease (Lookup with a lease, PlaceOnDevice)
  kFetch = 1,       // a fetch plan and the blocks it is sending
  kAppend = 2,      // the cached prefix an append session extends
  kMove = 3,        // a tier move, compaction or re-encoding that claimed it
  kCheckpoint = 4,  // a checkpoint capturing it
  kInspect = 5,     // an inspection reading it
};
inline constexpr size_t kPinReasons = 6;

// "lease", "fetch", "append", "move", "checkpoint", "inspect".
std::string_view PinReasonName(PinReason reason);

class PinCounts {
 public:
  PinCounts() = default;
  PinCounts(const PinCounts&) = delete;
  PinCounts& operator=(const PinCounts&) = delete;

  void Add(PinReason reason) const {
    counts_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
  }
  void Remove(PinReason reason) const {
    counts_[static_cast<size_t>(reason)].fetch_sub(1, std::memory_order_relaxed);
  }
  uint32_t of(PinReason reason) const {
    return counts_[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
  }
  uint32_t total() const {
    uint32_t sum = 0;
    for (const auto& c : counts_) sum += c.load(std::memory_order_relaxed);
    return sum;
  }
  bool pinned() const { return total() != 0; }
  // True when the only pins are `n` of `reason` (a move checking that
  // nothing but itself holds the copy).
  bool only(PinReason reason, uint32_t n) const { return total() == n && of(reason) == n; }

 private:
  mutable std::array<std::atomic<uint32_t>, kPinReasons> counts_{};
};

// A shared reference to a copy that pins it. T is BlockPayload or
// const StoredCopy (anything with `const PinCounts& pins() const`).
template <typename T>
class PinnedRef {
 public:
  PinnedRef() = default;
  PinnedRef(std::nullptr_t) {}  // NOLINT: null converts implicitly, as for shared_ptr
  PinnedRef(std::shared_ptr<T> ref, PinReason reason) : ref_(std::move(ref)), reason_(reason) {
    if (ref_ != nullptr) ref_->pins().Add(reason_);
  }
  PinnedRef(const PinnedRef& other) : ref_(other.ref_), reason_(other.reason_) {
    if (ref_ != nullptr) ref_->pins().Add(reason_);
  }
  PinnedRef(PinnedRef&& other) noexcept : ref_(std::move(other.ref_)), reason_(other.reason_) {}
  PinnedRef& operator=(PinnedRef other) noexcept {
    swap(other);
    return *this;
  }
  ~PinnedRef() { reset(); }

  void swap(PinnedRef& other) noexcept {
    ref_.swap(other.ref_);
    std::swap(reason_, other.reason_);
  }
  // Drops the pin and the reference.
  void reset() {
    if (ref_ != nullptr) {
      ref_->pins().Remove(reason_);
      ref_.reset();
    }
  }

  // Drops the pin and hands back the reference (a copy going into the index).
  std::shared_ptr<T> Unpin() {
    if (ref_ != nullptr) ref_->pins().Remove(reason_);
    return std::move(ref_);
  }

  T* get() const { return ref_.get(); }
  T* operator->() const { return ref_.get(); }
  T& operator*() const { return *ref_; }
  explicit operator bool() const { return ref_ != nullptr; }
  // The reference without the pin (see the file comment).
  const std::shared_ptr<T>& ref() const { return ref_; }
  PinReason reason() const { return reason_; }

  friend bool operator==(const PinnedRef& a, std::nullptr_t) { return a.ref_ == nullptr; }
  friend bool operator==(const PinnedRef& a, const PinnedRef& b) { return a.ref_ == b.ref_; }
  // The same copy as `b` (the index's reference).
  template <typename U>
  friend bool operator==(const PinnedRef& a, const std::shared_ptr<U>& b) {
    return a.ref_ == b;
  }

 private:
  std::shared_ptr<T> ref_;
  PinReason reason_ = PinReason::kFetch;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CORE_PIN_H_
