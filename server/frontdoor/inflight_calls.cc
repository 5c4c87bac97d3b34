#include "server/frontdoor/inflight_calls.h"

#include <algorithm>

namespace kvcache {

InflightCalls::Handle& InflightCalls::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Reset();
    calls_ = other.calls_;
    node_ = std::move(other.node_);
  }
  return *this;
}

void InflightCalls::Handle::Reset() {
  if (node_ == nullptr) return;
  calls_->Unregister(node_.get());
  node_.reset();
}

InflightCalls::Handle InflightCalls::Register(std::string_view method, std::string_view request_id,
                                              std::string_view peer) {
  auto node = std::make_unique<Node>();
  node->entry.method = std::string(method);
  node->entry.request_id = std::string(request_id);
  node->entry.peer = std::string(peer);
  node->entry.start = clock_->Now();
  // Round robin: concurrent calls land on different shards.
  node->shard = next_shard_.fetch_add(1, std::memory_order_relaxed) % kShards;
  Shard& shard = shards_[node->shard];
  {
    MutexLock lock(&shard.mu);
    shard.nodes.insert(node.get());
  }
  return Handle(this, std::move(node));
}

void InflightCalls::Unregister(Node* node) {
  Shard& shard = shards_[node->shard];
  MutexLock lock(&shard.mu);
  shard.nodes.erase(node);
}

std::vector<InflightCalls::Entry> InflightCalls::Snapshot() const {
  std::vector<Entry> entries;
  for (const Shard& shard : shards_) {
    MutexLock lock(&shard.mu);
    for (const Node* node : shard.nodes) {
      entries.push_back(node->entry);
      entries.back().bytes = node->bytes.load(std::memory_order_relaxed);
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.start < b.start; });
  return entries;
}

size_t InflightCalls::size() const {
  size_t n = 0;
  for (const Shard& shard : shards_) {
    MutexLock lock(&shard.mu);
    n += shard.nodes.size();
  }
  return n;
}

void FillInflightCalls(const InflightCalls& calls, absl::Time now,
                       google::protobuf::RepeatedPtrField<v1::InflightCall>* out) {
  for (InflightCalls::Entry& e : calls.Snapshot()) {
    v1::InflightCall* call = out->Add();
    call->set_method(std::move(e.method));
    call->set_request_id(std::move(e.request_id));
    call->set_peer(std::move(e.peer));
    call->set_age_ms(
        static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(now - e.start))));
    call->set_bytes(e.bytes);
  }
}

}  // namespace kvcache
