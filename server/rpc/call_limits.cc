#include "server/rpc/call_limits.h"

#include "absl/strings/str_cat.h"

namespace kvcache {

StreamLimiter::StreamLimiter(uint32_t max_total, uint32_t max_per_client)
    : max_total_(max_total), max_per_client_(max_per_client) {}

absl::Status StreamLimiter::Acquire(std::string_view peer, std::string_view* limit) {
  MutexLock lock(&mu_);
  if (total_ >= max_total_) {
    if (limit != nullptr) *limit = "max_concurrent_streams";
    return absl::ResourceExhaustedError(absl::StrCat("max_concurrent_streams (", max_total_,
                                                     ") Append/Fetch streams are in flight; "
                                                     "retry later"));
  }
  uint32_t& mine = per_peer_[std::string(peer)];
  if (mine >= max_per_client_) {
    if (limit != nullptr) *limit = "max_streams_per_client";
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_streams_per_client (", max_per_client_, ") Append/Fetch streams of this client (",
        std::string(peer), ") are in flight; retry later"));
  }
  ++mine;
  ++total_;
  return absl::OkStatus();
}

void StreamLimiter::Release(std::string_view peer) {
  MutexLock lock(&mu_);
  auto it = per_peer_.find(std::string(peer));
  if (it == per_peer_.end()) return;
  --total_;
  if (--it->second == 0) per_peer_.erase(it);
}

int StreamLimiter::active() const {
  MutexLock lock(&mu_);
  return static_cast<int>(total_);
}

int StreamLimiter::active(std::string_view peer) const {
  MutexLock lock(&mu_);
  auto it = per_peer_.find(std::string(peer));
  return it == per_peer_.end() ? 0 : static_cast<int>(it->second);
}

absl::Status UnaryLimiter::Acquire() {
  int current = in_flight_.load();
  do {
    if (current >= static_cast<int>(max_)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_concurrent_unary (", max_,
                       ") Lookup/Evict/ReportAttention calls are in flight; "
                       "retry later"));
    }
  } while (!in_flight_.compare_exchange_weak(current, current + 1));
  return absl::OkStatus();
}

}  // namespace kvcache
