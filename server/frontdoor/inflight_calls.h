// InflightCalls: the daemon's calls in flight that hold cache references
// (Append and Fetch streams, the shared-memory plane's appends and fetches),
// with their request id, peer, age and the payload bytes moved so far. The
// Admin DumpMemory call lists them, oldest first (FillInflightCalls), so an
// operator can see who keeps blocks from being evicted.
//
// A call registers as it starts and holds the returned Handle; the entry goes
// away when the Handle is destroyed (or Reset). Registering and unregistering
// take one short lock of one of kShards shards; counting bytes is a relaxed
// atomic add, no lock. Snapshot() locks the shards one at a time, so it sees
// each call that was in flight during the whole snapshot, and no call after
// its Handle was destroyed.
//
// Thread-safe. The InflightCalls must outlive every Handle it returned.
#ifndef KVCACHE_SERVER_FRONTDOOR_INFLIGHT_CALLS_H_
#define KVCACHE_SERVER_FRONTDOOR_INFLIGHT_CALLS_H_

#include <google/protobuf/repeated_ptr_field.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "kvcache/v1/admin.pb.h"
#include "server/common/clock.h"
#include "server/common/mutex.h"

namespace kvcache {

class InflightCalls {
 public:
  struct Entry {
    std::string method;  // "Fetch", "Append", "ShmFetchInto", ...
    std::string request_id;
    std::string peer;
    absl::Time start;
    uint64_t bytes = 0;  // payload bytes moved so far
  };

 private:
  struct Node {
    Entry entry;  // all but bytes, fixed once registered
    std::atomic<uint64_t> bytes{0};
    size_t shard = 0;
  };

 public:
  // One registered call; movable. An empty Handle (default-constructed, moved
  // from, or Reset) does nothing.
  class Handle {
   public:
    Handle() = default;
    Handle(Handle&& other) noexcept : calls_(other.calls_), node_(std::move(other.node_)) {}
    Handle& operator=(Handle&& other) noexcept;
    ~Handle() { Reset(); }

    // Counts `n` more payload bytes moved.
    void AddBytes(uint64_t n) {
      if (node_ != nullptr) node_->bytes.fetch_add(n, std::memory_order_relaxed);
    }
    // Unregisters the call now.
    void Reset();
    bool registered() const { return node_ != nullptr; }

   private:
    friend class InflightCalls;
    Handle(InflightCalls* calls, std::unique_ptr<Node> node)
        : calls_(calls), node_(std::move(node)) {}
    InflightCalls* calls_ = nullptr;
    std::unique_ptr<Node> node_;
  };

  // `clock` (the start times) outlives this.
  explicit InflightCalls(Clock* clock = SystemClock::Get()) : clock_(clock) {}
  InflightCalls(const InflightCalls&) = delete;
  InflightCalls& operator=(const InflightCalls&) = delete;

  // Registers a call starting now.
  Handle Register(std::string_view method, std::string_view request_id, std::string_view peer);

  // The calls in flight, the oldest first.
  std::vector<Entry> Snapshot() const;
  size_t size() const;

 private:
  static constexpr size_t kShards = 16;
  struct Shard {
    mutable Mutex mu;
    absl::flat_hash_set<Node*> nodes ABSL_GUARDED_BY(mu);
  };

  void Unregister(Node* node);

  Clock* const clock_;
  std::atomic<uint64_t> next_shard_{0};
  std::array<Shard, kShards> shards_;
};

// The calls in flight as DumpMemoryResponse.calls lists them (oldest first,
// age_ms from `now`); appended to `out`.
void FillInflightCalls(const InflightCalls& calls, absl::Time now,
                       google::protobuf::RepeatedPtrField<v1::InflightCall>* out);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_FRONTDOOR_INFLIGHT_CALLS_H_
