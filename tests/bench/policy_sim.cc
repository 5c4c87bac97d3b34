// kvcache-policy-sim: replays Mooncake JSONL traces offline, in process,
// against the daemon's eviction policies (NewLruPolicy, LruKPolicy) and
// offline oracles (Belady, perfect frequency, one-hit), and prints token hit ratios per cache
// capacity.
//
// The model of the cache (server/core/cache.cc, append_session.cc):
//  - a block is one trace hash id (512 tokens), keyed by its whole prefix
//    (the id chained to its parent's key); blocks form a radix tree of real
//    IndexNodes (parent, num_children, key, depth), and a block is cached
//    only if its whole prefix is;
//  - per request, at the trace timestamp (a ManualClock in ms): the longest
//    cached prefix is the hit (hit tokens = matched blocks * 512, at most
//    input_length); the lookup touches the matched path leaf-first; the
//    append inserts the missing blocks root to leaf, evicting one block per
//    insert once the cache holds `capacity` blocks, then touches the whole
//    path leaf-first. Evictable, as in the Cache: a leaf that is not the
//    tail of the path being appended (the Cache pins it). A request whose
//    blocks cannot all be placed stops where room runs out;
//  - capacity is a percentage of the trace's unique blocks.
// Belady evicts the evictable leaf whose next use (a pre-pass over the
// trace) is farthest away, never-again first, deeper blocks first among
// ties. It obeys the same leaf-only rule, so it is the bound for policies
// that must keep every cached block's prefix; it is not proven optimal
// under that rule (a longest-forward-distance heuristic), but no policy here
// beat it. "gap" is (policy - LRU) / (Belady - LRU). Two more oracles
// (BeladyPolicy's Oracle) bound what kinds of online policy could reach:
// LFU with each block's true count over the whole trace, and LRU that
// knows the blocks that are never used again.
//
// The traces carry no workload, priority or importance: every block is
// WORKLOAD_KIND_UNSPECIFIED with priority 0 and importance 0, so the
// combined rank equals plain LRU-K with default_k: the "combined" column
// (LruKOptions{}, the daemon's defaults) is LRU-K with K = 2 and the
// default settings, whatever the flags set for the K columns. The
// "probation" column is the same with LruKOptions::probation_share set
// (--probation-share, default 0.1).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "server/core/eviction_policy.h"
#include "server/core/lru_k_policy.h"
#include "server/core/prefix_index.h"
#include "trace_file.h"

namespace kvcache::bench {
namespace {

constexpr uint64_t kNever = std::numeric_limits<uint32_t>::max();

// A trace prepared once: each request's chained block keys and, per block,
// the index of the next request that uses it (kNever: none) and how many
// requests of the whole trace use it.
struct Prepared {
  std::string name;
  std::vector<TraceRequest> requests;
  std::vector<std::vector<uint64_t>> keys;
  std::vector<std::vector<uint64_t>> next_use;
  std::vector<std::vector<uint64_t>> total_uses;
  uint64_t unique_blocks = 0;
  uint64_t total_tokens = 0;
  uint64_t ideal_hit_tokens = 0;  // an unbounded cache
};

Prepared Prepare(std::string name, std::vector<TraceRequest> requests) {
  Prepared p{.name = std::move(name), .requests = std::move(requests)};
  p.keys.resize(p.requests.size());
  absl::flat_hash_map<uint64_t, bool> seen;
  for (size_t r = 0; r < p.requests.size(); ++r) {
    const TraceRequest& req = p.requests[r];
    uint64_t key = 0;
    uint64_t cached = 0;
    bool prefix = true;
    for (uint64_t id : req.hash_ids) {
      key = absl::HashOf(key, id);
      p.keys[r].push_back(key);
      const bool had = !seen.try_emplace(key, true).second;
      prefix = prefix && had;
      if (prefix) ++cached;
    }
    p.total_tokens += req.input_length;
    p.ideal_hit_tokens += std::min<uint64_t>(cached * kTraceBlockTokens, req.input_length);
  }
  p.unique_blocks = seen.size();
  p.next_use.resize(p.requests.size());
  absl::flat_hash_map<uint64_t, uint64_t> next;  // key -> next request using it
  for (size_t r = p.requests.size(); r-- > 0;) {
    for (uint64_t key : p.keys[r]) {
      auto it = next.find(key);
      p.next_use[r].push_back(it == next.end() ? kNever : it->second);
    }
    for (uint64_t key : p.keys[r]) next[key] = r;
  }
  absl::flat_hash_map<uint64_t, uint64_t> uses;
  for (const auto& keys : p.keys) {
    for (uint64_t key : keys) ++uses[key];
  }
  p.total_uses.resize(p.requests.size());
  for (size_t r = 0; r < p.requests.size(); ++r) {
    for (uint64_t key : p.keys[r]) p.total_uses[r].push_back(uses[key]);
  }
  return p;
}

// The oracles, as one EvictionPolicy: the simulator sets each block's next
// use and total uses before it inserts or touches it; the order is kept in
// the node's policy hook.
//  - kBelady: farthest next use first, then deepest, then first placed;
//  - kOneHit: LRU that knows which blocks are never used again and evicts
//    them first (least recently used first among them): the most that any
//    filter of one-hit blocks (probation, admission) can add to LRU;
//  - kFrequency: fewest uses in the whole trace first, least recently used
//    first among equals: LFU with perfect counts, the most that ranking by
//    frequency can do when reuse is independent of time.
enum class Oracle { kBelady, kOneHit, kFrequency };

class BeladyPolicy final : public EvictionPolicy {
 public:
  explicit BeladyPolicy(Oracle oracle = Oracle::kBelady)
      : oracle_(oracle), placed_(std::make_shared<uint64_t>(0)) {}
  void set_next_use(uint64_t next, uint64_t total_uses) {
    next_ = next;
    total_uses_ = total_uses;
  }
  void Insert(IndexNode* node) override { Place(node); }
  void Touch(IndexNode* node) override {
    order_.erase(node);
    Place(node);
  }
  void Erase(IndexNode* node) override { order_.erase(node); }
  IndexNode* PickVictim(absl::FunctionRef<bool(const IndexNode&)> evictable) override {
    for (IndexNode* node : order_) {
      if (evictable(*node)) return node;
    }
    return nullptr;
  }
  // Siblings share the placement counter (the simulator is one thread);
  // each is told next uses through its own set_next_use.
  std::unique_ptr<EvictionPolicy> NewSibling() const override {
    auto sibling = std::make_unique<BeladyPolicy>(oracle_);
    sibling->placed_ = placed_;
    return sibling;
  }
  EvictionOrder OrderOf(const IndexNode& node) const override {
    return {.rank = node.policy_hook.order.rank, .seq = node.policy_hook.order.seq};
  }
  size_t size() const override { return order_.size(); }
  std::string_view name() const override { return "belady"; }

 private:
  struct ByNextUse {
    bool operator()(const IndexNode* a, const IndexNode* b) const {
      const auto& x = a->policy_hook.order;
      const auto& y = b->policy_hook.order;
      return x.rank != y.rank ? x.rank < y.rank : x.seq < y.seq;
    }
  };
  void Place(IndexNode* node) {
    if (oracle_ != Oracle::kBelady) {
      const int64_t rank = oracle_ == Oracle::kOneHit ? (next_ == kNever ? 0 : 1)
                                                      : static_cast<int64_t>(total_uses_);
      node->policy_hook.order = {.rank = rank, .seq = ++*placed_};
      order_.insert(node);
      return;
    }
    const uint64_t depth_first = uint64_t{0xFFFFFF - std::min<uint32_t>(node->depth, 0xFFFFFF)};
    node->policy_hook.order = {.rank = -static_cast<int64_t>(next_),
                               .seq = (depth_first << 40) | ++*placed_};
    order_.insert(node);
  }
  const Oracle oracle_;
  uint64_t next_ = kNever;
  uint64_t total_uses_ = 0;
  std::shared_ptr<uint64_t> placed_;
  absl::btree_set<IndexNode*, ByNextUse> order_;
};

struct Result {
  uint64_t hit_tokens = 0;
  uint64_t evictions = 0;
  uint64_t examined = 0;  // predicate calls PickVictim made
  double seconds = 0;
};

// Replays `p` against `policy` with room for `capacity` blocks.
Result Replay(const Prepared& p, uint64_t capacity, EvictionPolicy* policy, BeladyPolicy* belady,
              ManualClock* clock) {
  Result out;
  const absl::Time start = absl::Now();
  const absl::Time t0 = clock->Now();
  absl::flat_hash_map<uint64_t, std::unique_ptr<IndexNode>> cached;
  std::vector<IndexNode*> path;
  for (size_t r = 0; r < p.requests.size(); ++r) {
    const TraceRequest& req = p.requests[r];
    const absl::Time at = t0 + absl::Milliseconds(req.timestamp_ms);
    if (at > clock->Now()) clock->Advance(at - clock->Now());
    const std::vector<uint64_t>& keys = p.keys[r];
    auto use = [&](IndexNode* n, size_t i, bool insert) {
      if (belady != nullptr) belady->set_next_use(p.next_use[r][i], p.total_uses[r][i]);
      insert ? policy->Insert(n) : policy->Touch(n);
    };
    path.clear();
    for (uint64_t key : keys) {
      auto it = cached.find(key);
      if (it == cached.end()) break;
      path.push_back(it->second.get());
    }
    out.hit_tokens += std::min<uint64_t>(path.size() * kTraceBlockTokens, req.input_length);
    for (size_t i = path.size(); i-- > 0;) use(path[i], i, false);  // lookup, leaf-first
    for (size_t i = path.size(); i < keys.size(); ++i) {
      IndexNode* tail = path.empty() ? nullptr : path.back();
      if (cached.size() >= capacity) {
        IndexNode* victim = policy->PickVictim([&](const IndexNode& n) {
          ++out.examined;
          return n.is_leaf() && &n != tail;
        });
        if (victim == nullptr) break;
        ++out.evictions;
        policy->Erase(victim);
        if (victim->parent != nullptr) --victim->parent->num_children;
        cached.erase(victim->key);
      }
      auto node = std::make_unique<IndexNode>();
      node->parent = tail;
      node->key = keys[i];
      node->depth = static_cast<uint32_t>(i);
      if (tail != nullptr) ++tail->num_children;
      IndexNode* n = node.get();
      cached.emplace(keys[i], std::move(node));
      use(n, i, true);
      path.push_back(n);
    }
    for (size_t i = path.size(); i-- > 0;) use(path[i], i, false);  // append, leaf-first
  }
  for (auto& [key, node] : cached) policy->Erase(node.get());
  out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return out;
}

struct Column {
  std::string name;
  std::function<std::unique_ptr<EvictionPolicy>(Clock*)> make;  // null: an oracle
  // Which oracle, when `make` is null.
  Oracle oracle = Oracle::kBelady;
};

struct Options {
  std::vector<std::string> traces;
  std::vector<double> capacity_percent = {1, 5, 10, 25};
  int64_t correlated_ms = 1000;
  int64_t retained = 65536;      // the daemon's default; -1: the capacity
  int64_t penalty_ms = 600000;   // the daemon's default; -1: infinite
  double probation_share = 0.1;  // the probation column's
  bool json = false;
};

LruKOptions KOptions(const Options& o, int k, uint64_t capacity) {
  LruKOptions l;
  l.default_k = k;
  l.correlated_period = absl::Milliseconds(o.correlated_ms);
  l.retained_history = o.retained < 0 ? capacity : static_cast<size_t>(o.retained);
  l.fewer_than_k_penalty =
      o.penalty_ms < 0 ? absl::InfiniteDuration() : absl::Milliseconds(o.penalty_ms);
  return l;
}

int Run(const Options& o) {
  for (const std::string& path : o.traces) {
    absl::StatusOr<std::vector<TraceRequest>> trace = LoadTrace(path, 0);
    if (!trace.ok()) {
      std::fprintf(stderr, "%s\n", trace.status().ToString().c_str());
      return 1;
    }
    std::string name = path.substr(path.find_last_of('/') + 1);
    const Prepared p = Prepare(name, *std::move(trace));
    const double ideal = static_cast<double>(p.ideal_hit_tokens) / p.total_tokens;
    if (!o.json) {
      std::printf(
          "\n%s: %zu requests, %llu unique blocks, unbounded token hit %.3f; LRU-K: correlated "
          "period %lld ms, retained history %s, fewer-than-K penalty %s. No workload, priority "
          "or importance in the trace: combined = LRU-K(2) (the daemon's defaults).\n\n",
          p.name.c_str(), p.requests.size(), static_cast<unsigned long long>(p.unique_blocks),
          ideal, static_cast<long long>(o.correlated_ms),
          o.retained < 0 ? "= capacity" : absl::StrCat(o.retained).c_str(),
          o.penalty_ms < 0 ? "infinite" : absl::StrCat(o.penalty_ms, " ms").c_str());
      std::printf(
          "| capacity | blocks | LRU | LRU-K2 | LRU-K3 | LRU-K4 | combined | probation | freq. "
          "oracle | one-hit oracle | Belady | gap K2 | gap K3 | gap K4 | gap comb | gap prob | gap "
          "freq. | gap one-hit |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          "---:|---:|\n");
    }
    for (double pct : o.capacity_percent) {
      const uint64_t capacity =
          std::max<uint64_t>(1, static_cast<uint64_t>(p.unique_blocks * pct / 100.0));
      std::vector<Column> columns = {
          {"lru", [](Clock*) { return NewLruPolicy(); }},
          {"lru_k2", [&](Clock* c) { return NewLruKPolicy(KOptions(o, 2, capacity), c); }},
          {"lru_k3", [&](Clock* c) { return NewLruKPolicy(KOptions(o, 3, capacity), c); }},
          {"lru_k4", [&](Clock* c) { return NewLruKPolicy(KOptions(o, 4, capacity), c); }},
          {"combined", [](Clock* c) { return NewLruKPolicy(LruKOptions{}, c); }},
          {"probation",
           [&](Clock* c) {
             LruKOptions l;
             l.probation_share = o.probation_share;
             return NewLruKPolicy(l, c);
           }},
          {"frequency_oracle", nullptr, Oracle::kFrequency},
          {"one_hit_oracle", nullptr, Oracle::kOneHit},
          {"belady", nullptr},
      };
      std::vector<double> hit;
      for (const Column& col : columns) {
        ManualClock clock;
        std::unique_ptr<EvictionPolicy> policy;
        BeladyPolicy* belady = nullptr;
        if (col.make) {
          policy = col.make(&clock);
        } else {
          auto b = std::make_unique<BeladyPolicy>(col.oracle);
          belady = b.get();
          policy = std::move(b);
        }
        const Result r = Replay(p, capacity, policy.get(), belady, &clock);
        hit.push_back(static_cast<double>(r.hit_tokens) / p.total_tokens);
        if (o.json) {
          std::printf(
              "{\"trace\": \"%s\", \"capacity_percent\": %g, \"capacity_blocks\": %llu, "
              "\"policy\": \"%s\", \"token_hit\": %.5f, \"evictions\": %llu, "
              "\"examined_per_eviction\": %.3f, \"seconds\": %.3f}\n",
              p.name.c_str(), pct, static_cast<unsigned long long>(capacity), col.name.c_str(),
              hit.back(), static_cast<unsigned long long>(r.evictions),
              r.evictions == 0 ? 0.0 : static_cast<double>(r.examined) / r.evictions, r.seconds);
        }
      }
      if (o.json) continue;
      const double lru = hit[0], opt = hit.back();
      std::string row =
          absl::StrFormat("| %g%% | %llu |", pct, static_cast<unsigned long long>(capacity));
      for (double h : hit) absl::StrAppendFormat(&row, " %.3f |", h);
      for (size_t c = 1; c + 1 < hit.size(); ++c) {
        absl::StrAppend(&row, " ",
                        opt - lru > 1e-9 ? absl::StrFormat("%.2f", (hit[c] - lru) / (opt - lru))
                                         : std::string("n/a"),
                        " |");
      }
      std::printf("%s\n", row.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvcache::bench

int main(int argc, char** argv) {
  kvcache::bench::Options o;
  CLI::App app(
      "Replays Mooncake JSONL traces offline against the daemon's eviction policies (LRU, "
      "LRU-K with K = 2, 3, 4, the combined default, LRU-K with probation), LFU with perfect "
      "counts, an LRU that knows the one-hit blocks, and a leaf-only Belady bound; prints token "
      "hit ratios and the share of the LRU -> Belady gap each policy captures.");
  app.add_option("--trace", o.traces, "Mooncake JSONL trace (repeatable)")->required();
  app.add_option("--capacity-percent", o.capacity_percent,
                 "cache capacities as % of the trace's unique blocks (default 1 5 10 25)")
      ->check(CLI::Range(0.001, 100.0));
  app.add_option("--correlated-ms", o.correlated_ms,
                 "LRU-K correlated period for the K columns, ms (default 1000)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}));
  app.add_option("--retained", o.retained,
                 "LRU-K retained history for the K columns, entries; -1: the capacity "
                 "(default 65536)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 26));
  app.add_option("--penalty-ms", o.penalty_ms,
                 "LRU-K fewer-than-K penalty for the K columns, ms; -1: infinite (default 600000)")
      ->check(CLI::Range(int64_t{-1}, int64_t{315360000000}));
  app.add_option("--probation-share", o.probation_share,
                 "LruKOptions::probation_share of the probation column, which otherwise has the "
                 "daemon's defaults (default 0.1)")
      ->check(CLI::Range(0.0, 0.9));
  app.add_flag("--json", o.json, "one JSON object per (trace, capacity, policy) instead");
  CLI11_PARSE(app, argc, argv);
  return kvcache::bench::Run(o);
}
