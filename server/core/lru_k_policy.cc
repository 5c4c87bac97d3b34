#include "server/core/lru_k_policy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

constexpr uint32_t kNoReference = IndexNode::PolicyHook::kNoReference;
// What an infinite fewer_than_k_penalty subtracts: more than any base,
// priority and importance terms can make up (times stay below 2^42 ms,
// |priority| * priority_step below 2^31 * 1 day < 2^58 ms).
constexpr int64_t kInfinitePenaltyMs = int64_t{1} << 62;
// The rank of a block PickVictim found blocked by its children: behind every
// rank the formula can give (those stay below 2^59 ms).
constexpr int64_t kBlockedRank = int64_t{1} << 62;
constexpr absl::Duration kMaxStep = absl::Hours(24);
constexpr absl::Duration kMaxPenalty = absl::Hours(24 * 3660);

uint32_t AddAge(uint32_t age, int64_t ms) {
  if (age == kNoReference) return kNoReference;
  return static_cast<uint32_t>(std::min<int64_t>(int64_t{age} + ms, kNoReference - 1));
}

int CountReferences(const uint32_t (&age)[LruKOptions::kMaxK]) {
  int n = 0;
  while (n < LruKOptions::kMaxK && age[n] != kNoReference) ++n;
  return n;
}

}  // namespace

int LruKOptions::KFor(uint8_t workload) const {
  switch (workload) {  // WorkloadKind (proto/kvcache/v1/kvcache.proto)
    case 1:
      return chat_k;
    case 2:
      return code_k;
    case 3:
      return document_k;
    default:
      return default_k;
  }
}

absl::Status LruKOptions::Validate() const {
  for (auto [field, k] : {std::pair<std::string_view, int>{"default_k", default_k},
                          {"chat_k", chat_k},
                          {"code_k", code_k},
                          {"document_k", document_k}}) {
    if (k < 1 || k > kMaxK) {
      return absl::InvalidArgumentError(
          absl::StrCat("lru_k.", std::string(field), " is ", k, "; it must be in 1..", kMaxK));
    }
  }
  if (correlated_period < absl::ZeroDuration() || correlated_period > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("lru_k.correlated_period is ",
                                                   absl::FormatDuration(correlated_period),
                                                   "; it must be in [0, 24h]"));
  }
  for (auto [field, d] :
       {std::pair<std::string_view, absl::Duration>{"priority_step", priority_step},
        {"importance_step", importance_step}}) {
    if (d < absl::ZeroDuration() || d > kMaxStep) {
      return absl::InvalidArgumentError(absl::StrCat("lru_k.", std::string(field), " is ",
                                                     absl::FormatDuration(d),
                                                     "; it must be in [0, 24h]"));
    }
  }
  if (fewer_than_k_penalty != absl::InfiniteDuration() &&
      (fewer_than_k_penalty < absl::ZeroDuration() || fewer_than_k_penalty > kMaxPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat("lru_k.fewer_than_k_penalty is ",
                                                   absl::FormatDuration(fewer_than_k_penalty),
                                                   "; it must be in [0, 3660 days] or infinite"));
  }
  if (!(probation_share >= 0.0 && probation_share <= 0.9)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lru_k.probation_share is ", probation_share, "; it must be in [0, 0.9]"));
  }
  return absl::OkStatus();
}

std::unique_ptr<EvictionPolicy> NewLruKPolicy(const LruKOptions& options, Clock* clock) {
  return std::make_unique<LruKPolicy>(options, clock);
}

LruKPolicy::LruKPolicy(const LruKOptions& options, Clock* clock)
    : LruKPolicy(options, clock, std::make_shared<Shared>()) {}

LruKPolicy::LruKPolicy(const LruKOptions& options, Clock* clock, std::shared_ptr<Shared> shared)
    : options_(options),
      clock_(clock),
      correlated_ms_(absl::ToInt64Milliseconds(options.correlated_period)),
      priority_step_ms_(absl::ToInt64Milliseconds(options.priority_step)),
      importance_step_ms_(absl::ToInt64Milliseconds(options.importance_step)),
      penalty_ms_(options.fewer_than_k_penalty == absl::InfiniteDuration()
                      ? kInfinitePenaltyMs
                      : absl::ToInt64Milliseconds(options.fewer_than_k_penalty)),
      shared_(std::move(shared)) {}

std::unique_ptr<EvictionPolicy> LruKPolicy::NewSibling() const {
  return std::unique_ptr<EvictionPolicy>(new LruKPolicy(options_, clock_, shared_));
}

EvictionOrder LruKPolicy::OrderOf(const IndexNode& node) const {
  const IndexNode::PolicyHook::Order& o = node.policy_hook.order;
  return {.rank = o.rank, .seq = o.seq & ~kMainBit};
}

int64_t LruKPolicy::NowMs() const { return absl::ToUnixMillis(clock_->Now()); }

bool LruKPolicy::Reference(IndexNode::PolicyHook& hook, int64_t now_ms) const {
  uint32_t(&age)[LruKOptions::kMaxK] = hook.history_age_ms;
  if (age[0] == kNoReference) {  // the first reference
    hook.last_ms = now_ms;
    age[0] = 0;
    return true;
  }
  const int64_t since_last = std::max<int64_t>(now_ms - hook.last_ms, 0);  // clocks may step back
  hook.last_ms += since_last;
  if (since_last < correlated_ms_) {  // correlated: the ages grow, no new reference
    for (uint32_t& a : age) a = AddAge(a, since_last);
    return false;
  }
  for (int i = LruKOptions::kMaxK - 1; i > 0; --i) age[i] = AddAge(age[i - 1], since_last);
  age[0] = 0;
  return true;
}

int64_t LruKPolicy::Rank(const IndexNode& node) const {
  const IndexNode::PolicyHook& hook = node.policy_hook;
  const int k = options_.KFor(node.workload);
  const int64_t base = hook.history_age_ms[k - 1] != kNoReference
                           ? hook.last_ms - hook.history_age_ms[k - 1]
                           : hook.last_ms - penalty_ms_;
  return base + int64_t{node.priority} * priority_step_ms_ +
         std::llround(static_cast<double>(node.importance()) *
                      static_cast<double>(importance_step_ms_));
}

bool LruKPolicy::Hinted(const IndexNode& node) const {
  return node.priority > 0 || node.importance() >= LruKOptions::kProtectImportance;
}

void LruKPolicy::Place(IndexNode* node, bool used, bool main) {
  IndexNode::PolicyHook& hook = node->policy_hook;
  main = main || options_.probation_share == 0 || Hinted(*node);
  const uint64_t seq =
      (used ? shared_->seq.Next(&last_seq_) : hook.order.seq & ~kMainBit) | (main ? kMainBit : 0);
  hook.order = {.rank = Rank(*node), .seq = seq};
  (main ? order_ : probation_).insert(node);
}

bool LruKPolicy::Unplace(IndexNode* node) {
  // (rank, seq) is unique among tracked blocks, so a node is found only in
  // the segment that holds it, and a block of another policy in neither.
  for (Order* segment : {&probation_, &order_}) {
    auto it = segment->find(node);
    if (it != segment->end() && *it == node) {
      segment->erase(it);
      return true;
    }
  }
  return false;
}

void LruKPolicy::Insert(IndexNode* node) {
  IndexNode::PolicyHook& hook = node->policy_hook;
  hook.last_ms = 0;
  std::fill(std::begin(hook.history_age_ms), std::end(hook.history_age_ms), kNoReference);
  if (options_.retained_history != 0) {
    Shared& shared = *shared_;
    MutexLock lock(&shared.mu);
    if (auto it = shared.by_key.find(RetainedKey{node->index, node->key});
        it != shared.by_key.end()) {
      hook.last_ms = it->second->last_ms;
      std::copy(std::begin(it->second->history_age_ms), std::end(it->second->history_age_ms),
                hook.history_age_ms);
      shared.retained.erase(it->second);
      shared.by_key.erase(it);
    }
  }
  Reference(hook, NowMs());
  Place(node, /*used=*/true, /*main=*/References(*node) >= 2);
}

void LruKPolicy::Touch(IndexNode* node) {
  Unplace(node);
  const bool again = Reference(node->policy_hook, NowMs());
  Place(node, /*used=*/true, /*main=*/InMain(*node) || again);
}

void LruKPolicy::Erase(IndexNode* node) {
  Retain(*node);
  Release(node);
}

void LruKPolicy::Release(IndexNode* node) {
  Unplace(node);
  node->policy_hook.order = {.rank = 0, .seq = 0};
  // Its parent may be a leaf now: back to its own rank if it was set aside
  // (by this policy: the parent may belong to another tier's).
  if (IndexNode* parent = node->parent;
      parent != nullptr && parent->policy_hook.order.rank == kBlockedRank && Unplace(parent)) {
    Place(parent, /*used=*/false, InMain(*parent));
  }
}

void LruKPolicy::Adopt(IndexNode* node) {
  Place(node, /*used=*/true, /*main=*/References(*node) >= 2);
}

void LruKPolicy::SetImportance(IndexNode* node, float importance) {
  Unplace(node);
  node->set_importance(importance);
  Place(node, /*used=*/false, InMain(*node));
}

IndexNode* LruKPolicy::PickVictim(absl::FunctionRef<bool(const IndexNode&)> evictable) {
  // Probation first while it holds more than its share, the main segment
  // first otherwise; the other segment when the first has no victim.
  const bool probation_first =
      !probation_.empty() &&
      (order_.empty() || static_cast<double>(probation_.size()) >
                             options_.probation_share * static_cast<double>(size()));
  Order& first = probation_first ? probation_ : order_;
  Order& second = probation_first ? order_ : probation_;
  for (Order* segment : {&first, &second}) {
    if (IndexNode* victim = PickRanked(*segment, evictable)) return victim;
  }
  for (Order* segment : {&first, &second}) {
    if (IndexNode* victim = PickSetAside(*segment, evictable)) return victim;
  }
  return nullptr;
}

IndexNode* LruKPolicy::PickRanked(Order& segment,
                                  absl::FunctionRef<bool(const IndexNode&)> evictable) {
  IndexNode* victim = nullptr;
  blocked_.clear();
  for (IndexNode* node : segment) {
    if (node->policy_hook.order.rank == kBlockedRank) break;  // only set-aside blocks follow
    if (evictable(*node)) {
      victim = node;
      break;
    }
    if (!node->is_leaf()) blocked_.push_back(node);
  }
  // Rejected blocks with children go behind the others until their next use
  // or until a child of theirs is erased, so that the next call does not
  // walk them again.
  for (IndexNode* node : blocked_) {
    segment.erase(node);
    node->policy_hook.order.rank = kBlockedRank;
    segment.insert(node);
  }
  return victim;
}

IndexNode* LruKPolicy::PickSetAside(Order& segment,
                                    absl::FunctionRef<bool(const IndexNode&)> evictable) {
  // The set-aside blocks, in the order they were set aside.
  IndexNode probe;
  probe.policy_hook.order = {.rank = kBlockedRank, .seq = 0};
  for (auto it = segment.lower_bound(&probe); it != segment.end(); ++it) {
    if (evictable(**it)) return *it;
  }
  return nullptr;
}

void LruKPolicy::Retain(const IndexNode& node) {
  if (options_.retained_history == 0) return;
  const IndexNode::PolicyHook& hook = node.policy_hook;
  const RetainedKey key{node.index, node.key};
  Retained entry{.key = key, .last_ms = hook.last_ms, .history_age_ms = {}};
  std::copy(std::begin(hook.history_age_ms), std::end(hook.history_age_ms), entry.history_age_ms);
  Shared& shared = *shared_;
  MutexLock lock(&shared.mu);
  auto [it, inserted] = shared.by_key.try_emplace(key);
  if (!inserted) shared.retained.erase(it->second);  // another block with this key left before
  shared.retained.push_front(entry);
  it->second = shared.retained.begin();
  if (shared.retained.size() > options_.retained_history) {
    shared.by_key.erase(shared.retained.back().key);
    shared.retained.pop_back();
  }
}

int LruKPolicy::References(const IndexNode& node) const {
  return CountReferences(node.policy_hook.history_age_ms);
}

bool LruKPolicy::SeenAtLeast(const IndexNode& node, int n) const {
  return n <= 0 || References(node) >= n;
}

bool LruKPolicy::SeenAtLeast(const PrefixIndex* index, uint64_t key, int n) const {
  if (n <= 0) return true;
  MutexLock lock(&shared_->mu);
  auto it = shared_->by_key.find(RetainedKey{index, key});
  return it != shared_->by_key.end() && CountReferences(it->second->history_age_ms) >= n;
}

size_t LruKPolicy::retained_size() const {
  MutexLock lock(&shared_->mu);
  return shared_->retained.size();
}

}  // namespace kvcache
