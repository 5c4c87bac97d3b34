#include "server/rpc/rpc_tally.h"

namespace kvcache {

void RpcTally::OnRpcDone(std::string_view method, absl::StatusCode code, absl::Duration latency,
                         uint64_t bytes) {
  {
    MutexLock lock(&mu_);
    auto it = counts_.find(method);
    if (it == counts_.end()) {
      it = counts_.emplace(std::string(method), RpcCount{.method = std::string(method)}).first;
    }
    RpcCount& c = it->second;
    ++c.calls;
    if (code != absl::StatusCode::kOk) ++c.errors;
    c.payload_bytes += bytes;
    c.latency_us_sum +=
        static_cast<uint64_t>(std::max<int64_t>(absl::ToInt64Microseconds(latency), 0));
  }
  if (next_ != nullptr) next_->OnRpcDone(method, code, latency, bytes);
}

void RpcTally::OnStreamTimeout(std::string_view method) {
  if (next_ != nullptr) next_->OnStreamTimeout(method);
}

void RpcTally::OnLimitReached(std::string_view method, std::string_view limit) {
  if (next_ != nullptr) next_->OnLimitReached(method, limit);
}

std::vector<RpcCount> RpcTally::Counts() const {
  MutexLock lock(&mu_);
  std::vector<RpcCount> out;
  out.reserve(counts_.size());
  for (const auto& [name, c] : counts_) out.push_back(c);
  return out;
}

}  // namespace kvcache
