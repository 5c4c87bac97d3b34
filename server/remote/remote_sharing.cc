#include "server/remote/remote_sharing.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "server/core/append_session.h"
#include "server/remote/remote_key.h"

namespace kvcache {

RemoteSharing::RemoteSharing(Cache* cache, RemoteStore* store, const DaemonSecret& shared,
                             const RemoteSharingOptions& options)
    : cache_(cache), store_(store), shared_(shared), options_(options) {
  MutexLock lock(&mu_);
  sharer_.thread = std::thread([this] { Loop(&sharer_, &RemoteSharing::ShareNow); });
  discoverer_.thread = std::thread([this] { Loop(&discoverer_, &RemoteSharing::DiscoverNow); });
}

RemoteSharing::~RemoteSharing() {
  std::thread sharer, discoverer;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    sharer = std::move(sharer_.thread);
    discoverer = std::move(discoverer_.thread);
  }
  changed_.notify_all();
  sharer.join();
  discoverer.join();
}

bool RemoteSharing::Queue(Worker* worker, Job job, uint32_t limit, uint64_t Stats::*queued,
                          uint64_t Stats::*dropped) {
  {
    MutexLock lock(&mu_);
    if (stopping_ || worker->queue.size() >= limit) {
      ++(stats_.*dropped);
      return false;
    }
    if (queued != nullptr) ++(stats_.*queued);
    worker->queue.push_back(std::move(job));
  }
  changed_.notify_all();
  return true;
}

bool RemoteSharing::Share(const ModelKey& model, std::vector<Token> tokens, uint64_t first_token) {
  return Queue(&sharer_, {.model = model, .tokens = std::move(tokens), .first_token = first_token},
               options_.share_queue, &Stats::shares_queued, &Stats::shares_dropped);
}

std::shared_ptr<WorkTicket> RemoteSharing::DiscoverLater(const ModelKey& model,
                                                         std::vector<Token> tokens) {
  auto ticket = std::make_shared<WorkTicket>();
  if (!Queue(&discoverer_, {.model = model, .tokens = std::move(tokens), .ticket = ticket},
             options_.discover_queue, nullptr, &Stats::discoveries_dropped)) {
    return nullptr;
  }
  return ticket;
}

void RemoteSharing::Stored(const ModelKey& model, std::span<const Token> tokens,
                           uint64_t start_token) {
  Share(model, std::vector<Token>(tokens.begin(), tokens.end()), start_token);
}

std::shared_ptr<WorkTicket> RemoteSharing::Missed(const ModelKey& model,
                                                  std::span<const Token> tokens,
                                                  uint64_t matched_tokens) {
  if (matched_tokens != kUnknownMatch) {
    MutexLock lock(&mu_);
    auto it = block_tokens_.find(model);
    if (it != block_tokens_.end() && matched_tokens >= tokens.size() / it->second * it->second) {
      return nullptr;  // the match covers every whole block
    }
  }
  return DiscoverLater(model, std::vector<Token>(tokens.begin(), tokens.end()));
}

void RemoteSharing::NoteLayout(const ModelKey& model, const ModelLayout& layout) {
  MutexLock lock(&mu_);
  block_tokens_[model] = layout.block_tokens;
}

void RemoteSharing::Flush() {
  mu_.Lock();
  changed_.wait(mu_, [this] {
    mu_.AssertHeld();
    return (sharer_.queue.empty() && !sharer_.busy && discoverer_.queue.empty() &&
            !discoverer_.busy) ||
           stopping_;
  });
  mu_.Unlock();
  store_->Flush();
}

void RemoteSharing::Loop(Worker* worker, void (RemoteSharing::*run)(const Job&)) {
  for (;;) {
    Job job;
    {
      mu_.Lock();
      changed_.wait(mu_, [this, worker] {
        mu_.AssertHeld();
        return !worker->queue.empty() || stopping_;
      });
      if (stopping_) {
        std::deque<Job> dropped = std::move(worker->queue);
        worker->queue.clear();
        mu_.Unlock();
        changed_.notify_all();
        for (Job& j : dropped) {
          if (j.ticket != nullptr) j.ticket->Notify();
        }
        return;
      }
      job = std::move(worker->queue.front());
      worker->queue.pop_front();
      worker->busy = true;
      mu_.Unlock();
    }
    (this->*run)(job);
    if (job.ticket != nullptr) job.ticket->Notify();
    {
      MutexLock lock(&mu_);
      worker->busy = false;
    }
    changed_.notify_all();
  }
}

void RemoteSharing::DiscoverNow(const Job& job) { (void)Discover(job.model, job.tokens); }

void RemoteSharing::ShareNow(const Job& job) {
  // The cached prefix of the prompt, pinned while its blocks are copied out.
  absl::StatusOr<FetchPlan> plan = cache_->PrepareFetch(job.model, {.tokens = job.tokens});
  if (!plan.ok()) return;
  NoteLayout(job.model, plan->layout);
  const uint64_t blocks = job.tokens.size() / plan->layout.block_tokens;
  const std::vector<std::string> keys =
      RemoteKeyChain(shared_, job.model, plan->layout)
          .KeysOf(std::span<const Token>(job.tokens)
                      .first(std::min<uint64_t>(blocks, plan->blocks.size()) *
                             plan->layout.block_tokens));
  uint64_t put = 0, skipped = 0;
  for (uint64_t b = job.first_token / plan->layout.block_tokens; b < blocks; ++b) {
    if (b >= plan->blocks.size() || plan->blocks[b]->compressed()) {
      ++skipped;  // evicted meanwhile, or lossy: not shared
      continue;
    }
    const BlockPayload& block = *plan->blocks[b];
    const std::span<const std::byte> bytes = block.data();
    if (store_->Put(job.model.ns, keys[b], block.checksum(),
                    std::vector<std::byte>(bytes.begin(), bytes.end()))) {
      ++put;
    } else {
      ++skipped;
    }
  }
  MutexLock lock(&mu_);
  stats_.blocks_put += put;
  stats_.blocks_skipped += skipped;
}

absl::StatusOr<uint64_t> RemoteSharing::Discover(const ModelKey& model,
                                                 std::span<const Token> tokens) {
  const absl::Time start = absl::Now();
  bool searched = false;
  absl::StatusOr<uint64_t> adopted = Search(model, tokens, &searched);
  if (searched) {
    MutexLock lock(&mu_);
    ++stats_.discoveries;
    stats_.discover_time += absl::Now() - start;
  }
  return adopted;
}

absl::StatusOr<uint64_t> RemoteSharing::Search(const ModelKey& model, std::span<const Token> tokens,
                                               bool* searched) {
  // What is cached here already, and the model's layout.
  ModelLayout layout;
  uint64_t local = 0;
  {
    absl::StatusOr<FetchPlan> plan = cache_->PrepareFetch(model, {.tokens = tokens});
    if (!plan.ok()) return plan.status();
    layout = plan->layout;
    NoteLayout(model, layout);
    local = plan->blocks.size();
  }
  const uint64_t bt = layout.block_tokens;
  const uint64_t whole = tokens.size() / bt;
  if (local >= whole) return 0;
  const uint64_t asked = std::min<uint64_t>(whole - local, options_.max_discover_blocks);
  std::vector<std::string> keys =
      RemoteKeyChain(shared_, model, layout).KeysOf(tokens.first((local + asked) * bt));
  keys.erase(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(local));
  *searched = true;
  const RemoteStore::SealedBlocks sealed = store_->ReadSealed(model.ns, keys);
  // The run of values found from the first on, of the model's block size,
  // with the checksums their headers claim (the append checks each block
  // against its own, as a worker's).
  std::vector<uint64_t> checksums;
  while (checksums.size() < sealed.size() && sealed.Holds(checksums.size(), layout.BlockBytes())) {
    const std::optional<uint64_t> claimed = store_->PeekChecksum(sealed, checksums.size());
    if (!claimed.has_value()) break;
    checksums.push_back(*claimed);
  }
  uint64_t run = checksums.size();
  // Adopted by an append, each block opened (and so authenticated) into one
  // buffer, reused (no fresh memory per block), just before the append
  // copies it. A block that does not open, or not to the checksum it
  // claimed, ends the run there: the append is begun again for the blocks
  // before it (nothing of the first one was committed).
  std::vector<std::byte> buffer;
  buffer.reserve(layout.BlockBytes());
  bool first_pass = true;
  while (run > 0) {
    absl::StatusOr<std::unique_ptr<AppendSession>> session = cache_->BeginAppend(
        model, std::vector<Token>(tokens.begin(), tokens.begin() + (local + run) * bt), local * bt,
        AppendHints{}, std::vector<uint64_t>(checksums.begin(), checksums.begin() + run));
    absl::Status status = session.status();
    uint64_t opened = 0;
    for (; status.ok() && opened < run; ++opened) {
      const std::optional<uint64_t> checksum =
          store_->Open(sealed, opened, &buffer, /*count=*/first_pass);
      if (checksum != checksums[opened]) break;
      status = (*session)->Write(buffer);
    }
    if (status.ok() && opened < run) {  // block `opened` did not open
      run = opened;
      first_pass = false;
      continue;
    }
    absl::StatusOr<AppendResult> committed =
        status.ok() ? (*session)->Commit() : absl::StatusOr<AppendResult>(status);
    MutexLock lock(&mu_);
    if (!committed.ok()) {
      ++stats_.adoptions_failed;
      spdlog::warn("remote tier: blocks found for {} were not adopted: {}", model.ToString(),
                   committed.status().ToString());
      return committed.status();
    }
    stats_.blocks_adopted += run;
    return run * bt;
  }
  return 0;
}

RemoteSharing::Stats RemoteSharing::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void RemoteSharing::VisitCounters(CounterVisitor& visitor) const {
  VisitCounters(stats(), store_->stats(), visitor);
}

void RemoteSharing::VisitCounters(const Stats& s, const RemoteStore::Stats& st,
                                  CounterVisitor& visitor) {
  auto count = [](uint64_t n) { return static_cast<double>(n); };
  static constexpr CounterFamily kShares{
      "kvcached_remote_shares_total",
      "Appends that stored blocks, handed to the remote tier to share (dropped: its queue was "
      "full)"};
  visitor.Visit(kShares, {{"outcome", "queued"}}, count(s.shares_queued));
  visitor.Visit(kShares, {{"outcome", "dropped"}}, count(s.shares_dropped));
  static constexpr CounterFamily kShared{
      "kvcached_remote_shared_blocks_total",
      "Blocks of shared appends: put (handed to the store), skipped (lossy, evicted first, or "
      "dropped by the store)"};
  visitor.Visit(kShared, {{"outcome", "put"}}, count(s.blocks_put));
  visitor.Visit(kShared, {{"outcome", "skipped"}}, count(s.blocks_skipped));
  static constexpr CounterFamily kDiscoveries{
      "kvcached_remote_discoveries_total",
      "Short lookups that searched the remote tier for the rest of their prefix (dropped: its "
      "queue was full)"};
  visitor.Visit(kDiscoveries, {{"outcome", "searched"}}, count(s.discoveries));
  visitor.Visit(kDiscoveries, {{"outcome", "dropped"}}, count(s.discoveries_dropped));
  visitor.Visit({"kvcached_remote_discover_seconds_total",
                 "Seconds spent searching the remote tier and adopting what it held, summed"},
                {}, absl::ToDoubleSeconds(s.discover_time));
  static constexpr CounterFamily kAdopted{
      "kvcached_remote_adopted_blocks_total",
      "Blocks found in the remote tier and cached here (failed: the append refused them)"};
  visitor.Visit(kAdopted, {{"outcome", "adopted"}}, count(s.blocks_adopted));
  visitor.Visit(kAdopted, {{"outcome", "failed"}}, count(s.adoptions_failed));
  static constexpr CounterFamily kWrites{
      "kvcached_remote_writes_total",
      "Block writes to the cluster by outcome: done (acknowledged), dropped_full (queue full), "
      "dropped_open (breaker open), failed (refused or unreachable)"};
  visitor.Visit(kWrites, {{"outcome", "done"}}, count(st.writes_done));
  visitor.Visit(kWrites, {{"outcome", "dropped_full"}}, count(st.writes_dropped_full));
  visitor.Visit(kWrites, {{"outcome", "dropped_open"}}, count(st.writes_dropped_open));
  visitor.Visit(kWrites, {{"outcome", "failed"}}, count(st.writes_failed));
  visitor.Visit({"kvcached_remote_written_bytes_total", "Bytes of sealed values written"}, {},
                count(st.written_bytes));
  static constexpr CounterFamily kReads{
      "kvcached_remote_reads_total",
      "Blocks read from the cluster by outcome: hit, or a miss: absent, unreadable (did not "
      "open: altered, or sealed with another key), checksum, unavailable (unreachable or breaker "
      "open)"};
  visitor.Visit(kReads, {{"outcome", "hit"}}, count(st.hits));
  visitor.Visit(kReads, {{"outcome", "absent"}}, count(st.misses_absent));
  visitor.Visit(kReads, {{"outcome", "unreadable"}}, count(st.misses_unreadable));
  visitor.Visit(kReads, {{"outcome", "checksum"}}, count(st.misses_checksum));
  visitor.Visit(kReads, {{"outcome", "unavailable"}}, count(st.misses_unavailable));
  visitor.Visit({"kvcached_remote_read_bytes_total", "Bytes of blocks read back (hits)"}, {},
                count(st.read_bytes));
  visitor.Visit({"kvcached_remote_breaker_opens_total",
                 "Times the circuit breaker opened (batches in a row reached no node)"},
                {}, count(st.breaker_opens));
  visitor.Visit(
      {"kvcached_remote_breaker_open",
       "1 while the breaker is open (the cluster is skipped), else 0", CounterType::kGauge},
      {}, st.breaker_open ? 1 : 0);
  visitor.Visit({"kvcached_remote_write_queue_blocks", "Blocks waiting to be written now",
                 CounterType::kGauge},
                {}, count(st.write_queue));
}

}  // namespace kvcache
