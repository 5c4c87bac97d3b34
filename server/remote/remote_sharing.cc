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

bool RemoteSharing::Share(const ModelKey& model, std::vector<Token> tokens, uint64_t first_block) {
  return Queue(&sharer_, {.model = model, .tokens = std::move(tokens), .first_block = first_block},
               options_.share_queue, &Stats::shares_queued, &Stats::shares_dropped);
}

bool RemoteSharing::DiscoverLater(const ModelKey& model, std::vector<Token> tokens) {
  return Queue(&discoverer_, {.model = model, .tokens = std::move(tokens)}, options_.discover_queue,
               nullptr, &Stats::discoveries_dropped);
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
        worker->queue.clear();
        mu_.Unlock();
        changed_.notify_all();
        return;
      }
      job = std::move(worker->queue.front());
      worker->queue.pop_front();
      worker->busy = true;
      mu_.Unlock();
    }
    (this->*run)(job);
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
  const uint64_t blocks = job.tokens.size() / plan->layout.block_tokens;
  const std::vector<std::string> keys =
      RemoteKeyChain(shared_, job.model, plan->layout)
          .KeysOf(std::span<const Token>(job.tokens)
                      .first(std::min<uint64_t>(blocks, plan->blocks.size()) *
                             plan->layout.block_tokens));
  uint64_t put = 0, skipped = 0;
  for (uint64_t b = job.first_block; b < blocks; ++b) {
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
  {
    MutexLock lock(&mu_);
    ++stats_.discoveries;
  }
  // What is cached here already, and the model's layout.
  ModelLayout layout;
  uint64_t local = 0;
  {
    absl::StatusOr<FetchPlan> plan = cache_->PrepareFetch(model, {.tokens = tokens});
    if (!plan.ok()) return plan.status();
    layout = plan->layout;
    local = plan->blocks.size();
  }
  const uint64_t bt = layout.block_tokens;
  const uint64_t whole = tokens.size() / bt;
  if (local >= whole) return 0;
  const uint64_t asked = std::min<uint64_t>(whole - local, options_.max_discover_blocks);
  std::vector<std::string> keys =
      RemoteKeyChain(shared_, model, layout).KeysOf(tokens.first((local + asked) * bt));
  keys.erase(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(local));
  std::vector<std::optional<RemoteBlock>> found = store_->Get(model.ns, keys);
  // The run of blocks found from the first on, of the model's block size.
  uint64_t run = 0;
  while (run < found.size() && found[run].has_value() &&
         found[run]->bytes.size() == layout.BlockBytes()) {
    ++run;
  }
  if (run == 0) return 0;
  std::vector<uint64_t> checksums;
  for (uint64_t i = 0; i < run; ++i) checksums.push_back(found[i]->checksum);
  absl::StatusOr<std::unique_ptr<AppendSession>> session = cache_->BeginAppend(
      model, std::vector<Token>(tokens.begin(), tokens.begin() + (local + run) * bt), local * bt,
      AppendHints{}, std::move(checksums));
  absl::Status status = session.status();
  for (uint64_t i = 0; status.ok() && i < run; ++i) status = (*session)->Write(found[i]->bytes);
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

RemoteSharing::Stats RemoteSharing::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvcache
