// AdminService: the operator's view (docs/operations.md): VerifyBlocks,
// DumpMemory and InspectSequence.
#include <unistd.h>

#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/mutex.h"
#include "server/core/cache_inspector.h"
#include "server/frontdoor/call_log.h"
#include "server/frontdoor/call_scope.h"
#include "server/frontdoor/proto_convert.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/grpc_call.h"
#include "server/rpc/status_convert.h"

namespace kvcache {
namespace {

// Block verifications that may run at once; more are RESOURCE_EXHAUSTED.
constexpr int kMaxVerifications = 2;
constexpr uint64_t kDefaultVerifyBytesPerSecond = uint64_t{256} << 20;

v1::VerifyBlocksProgress ToProto(const VerifyProgress& p) {
  v1::VerifyBlocksProgress out;
  out.set_blocks_total(p.blocks_total);
  out.set_blocks_checked(p.blocks_checked);
  out.set_bytes_total(p.bytes_total);
  out.set_bytes_checked(p.bytes_checked);
  out.set_skipped_blocks(p.skipped_blocks);
  out.set_dropped_blocks(p.dropped_blocks);
  out.set_done(p.done);
  for (const BadBlockReport& b : p.bad_blocks) {
    v1::BadBlock* bad = out.add_bad_blocks();
    bad->set_namespace_(b.model.ns);
    bad->set_model_id(b.model.model_id);
    bad->set_key(b.key);
    bad->set_index(b.index);
    bad->set_tier(b.tier);
    bad->set_problem(b.problem);
    bad->set_dropped(b.dropped);
  }
  return out;
}

// Streams a verification's progress. The walk runs on a thread of its own
// (it takes as long as its rate allows); messages queue until the previous
// write completes. Once the client goes away the walk stops at its next
// progress report.
class VerifyReactor final : public grpc::ServerWriteReactor<v1::VerifyBlocksProgress> {
 public:
  VerifyReactor(grpc::CallbackServerContext* ctx, Cache* cache, RpcObserver* observer,
                std::atomic<int>* running, VerifyOptions options)
      : state_(std::make_shared<State>()) {
    state_->reactor = this;
    const absl::Time start = absl::Now();
    std::string request_id = RequestIdOf(*ctx);
    ctx->AddTrailingMetadata(kRequestIdHeader, request_id);
    std::string model = options.model.has_value() ? options.model->ToString() : "";
    options.on_progress = [state = state_](const VerifyProgress& p) {
      return state->Push(ToProto(p));
    };
    std::thread([state = state_, cache, observer, running, options = std::move(options), start,
                 request_id = std::move(request_id), model = std::move(model), peer = ctx->peer()] {
      absl::StatusOr<VerifyProgress> r = CacheInspector(cache).VerifyBlocks(options);
      absl::Status status = r.status();
      if (r.ok() && !r->done) status = absl::CancelledError("the client went away");
      const absl::Duration latency = absl::Now() - start;
      ReportCallDone(observer, {.method = "VerifyBlocks",
                                .request_id = request_id,
                                .peer = peer,
                                .model = model,
                                .status = status,
                                .latency = latency,
                                .bytes = r.ok() ? r->bytes_checked : 0});
      running->fetch_sub(1);
      state->WorkDone(status);
    }).detach();
  }

  void OnWriteDone(bool ok) override { state_->WriteDone(ok); }
  void OnCancel() override { state_->Cancel(); }
  void OnDone() override { delete this; }

 private:
  struct State {
    // Queues a message; false once the client is gone.
    bool Push(v1::VerifyBlocksProgress msg) {
      const v1::VerifyBlocksProgress* write = nullptr;
      {
        MutexLock lock(&mu);
        if (cancelled || finished) return false;
        queue.push_back(std::move(msg));
        if (!writing) {
          writing = true;
          write = &queue.front();
        }
      }
      if (write != nullptr) reactor->StartWrite(write);
      return true;
    }
    void WriteDone(bool ok) {
      const v1::VerifyBlocksProgress* write = nullptr;
      bool finish = false;
      absl::Status final_status;  // status, read under the lock
      {
        MutexLock lock(&mu);
        queue.pop_front();
        writing = false;
        if (!ok) cancelled = true;
        if (!cancelled && !queue.empty()) {
          writing = true;
          write = &queue.front();
        } else if (work_done && !finished) {
          finished = finish = true;
          final_status = status;
        }
      }
      if (write != nullptr) reactor->StartWrite(write);
      if (finish) reactor->Finish(ToGrpcStatus(final_status));
    }
    void WorkDone(absl::Status s) {
      bool finish = false;
      {
        MutexLock lock(&mu);
        status = s;
        work_done = true;
        if (!writing && !finished) finished = finish = true;
      }
      if (finish) reactor->Finish(ToGrpcStatus(s));
    }
    void Cancel() {
      MutexLock lock(&mu);
      cancelled = true;
    }

    Mutex mu;
    VerifyReactor* reactor = nullptr;  // alive until Finish() has been called and done
    std::deque<v1::VerifyBlocksProgress> queue ABSL_GUARDED_BY(mu);  // front: being written
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    bool work_done ABSL_GUARDED_BY(mu) = false;
    bool finished ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

// Refuses a call at once (logged and reported by the caller).
class RefusedWrite final : public grpc::ServerWriteReactor<v1::VerifyBlocksProgress> {
 public:
  RefusedWrite(grpc::CallbackServerContext* ctx, const std::string& request_id,
               const absl::Status& status) {
    ctx->AddTrailingMetadata(kRequestIdHeader, request_id);
    Finish(ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

uint64_t ProcessRssBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0;
  uint64_t resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

v1::StoredPrecision ToProto(StoredPrecision p) {
  switch (p) {
    case StoredPrecision::kFull:
      return v1::STORED_PRECISION_FULL;
    case StoredPrecision::kInt8:
      return v1::STORED_PRECISION_INT8;
    case StoredPrecision::kInt4:
      return v1::STORED_PRECISION_INT4;
    case StoredPrecision::kPruned:
      return v1::STORED_PRECISION_PRUNED;
    case StoredPrecision::kMixed:
      return v1::STORED_PRECISION_MIXED;
  }
  return v1::STORED_PRECISION_FULL;
}

void ToProto(const SequenceInspection& in, v1::InspectSequenceResponse* out) {
  *out->mutable_layout() = ToProto(in.layout);
  *out->mutable_policy() = ToProto(in.policy);
  out->set_matched_tokens(in.matched_tokens);
  out->set_attention_reports(in.attention_reports);
  for (const InspectedBlock& b : in.blocks) {
    v1::InspectedBlock* ob = out->add_blocks();
    ob->set_index(b.index);
    ob->set_key(b.key);
    ob->set_tier(!b.in_lower ? "host"
                 : b.in_host ? absl::StrCat("host+", b.lower_kind)
                             : b.lower_kind);
    ob->set_lossy(b.lossy);
    ob->set_format_version(b.format_version);
    ob->set_stored_bytes(b.stored_bytes);
    ob->set_raw_bytes(b.raw_bytes);
    ob->set_importance(b.importance);
  }
  out->mutable_importance()->Add(in.importance.begin(), in.importance.end());
  out->mutable_activity()->Add(in.activity.begin(), in.activity.end());
  out->mutable_novelty()->Add(in.novelty.begin(), in.novelty.end());
  out->mutable_position()->Add(in.position.begin(), in.position.end());
  for (uint8_t p : in.pinned) out->add_pinned(p != 0);
  for (uint8_t p : in.is_protected) out->add_is_protected(p != 0);
  for (StoredPrecision p : in.precision) out->add_precision(ToProto(p));
  out->mutable_tokens()->Add(in.tokens.begin(), in.tokens.end());
  if (!in.head_activity.empty()) {
    // Little-endian float32, as the host stores it (kvcached runs on little-endian hosts).
    std::string bytes(in.head_activity.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), in.head_activity.data(), bytes.size());
    out->set_head_activity(std::move(bytes));
  }
  if (!in.head_precision.empty()) {
    std::string bytes(in.head_precision.size(), '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>(ToProto(in.head_precision[i]));
    }
    out->set_head_precision(std::move(bytes));
  }
}

}  // namespace

grpc::ServerWriteReactor<v1::VerifyBlocksProgress>* AdminService::VerifyBlocks(
    grpc::CallbackServerContext* ctx, const v1::VerifyBlocksRequest* request) {
  const absl::Time start = absl::Now();
  auto refuse = [&](const absl::Status& status) {
    const std::string request_id = RequestIdOf(*ctx);
    const absl::Duration latency = absl::Now() - start;
    ReportCallDone(observer_, {.method = "VerifyBlocks",
                               .request_id = request_id,
                               .peer = ctx->peer(),
                               .model = ModelField({request->namespace_(), request->model_id()}),
                               .status = status,
                               .latency = latency});
    return new RefusedWrite(ctx, request_id, status);
  };
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "VerifyBlocks");
  if (!caller.ok()) return refuse(caller.status());
  VerifyOptions options;
  if (!request->model_id().empty()) {
    absl::StatusOr<ModelKey> key =
        ScopedModelKey(*caller, request->namespace_(), request->model_id());
    if (!key.ok()) return refuse(key.status());
    options.model = *std::move(key);
  } else {
    // An admin of one tenant verifies that namespace (its own, when none is named).
    absl::StatusOr<std::string> ns = caller->NamespaceOf(request->namespace_());
    if (!ns.ok()) return refuse(ns.status());
    options.ns = *std::move(ns);
  }
  options.prefix.assign(request->prefix_tokens().begin(), request->prefix_tokens().end());
  if (!options.prefix.empty() && !options.model.has_value()) {
    return refuse(absl::InvalidArgumentError("prefix_tokens needs model_id"));
  }
  options.drop_bad = request->drop_bad();
  options.include_lower = request->include_lower();
  options.max_bytes_per_second = request->max_bytes_per_second() != 0
                                     ? request->max_bytes_per_second()
                                     : kDefaultVerifyBytesPerSecond;
  if (verifications_.fetch_add(1) >= kMaxVerifications) {
    verifications_.fetch_sub(1);
    return refuse(absl::ResourceExhaustedError(
        absl::StrCat(kMaxVerifications, " block verifications are running; retry when one ends")));
  }
  return new VerifyReactor(ctx, cache_, observer_, &verifications_, std::move(options));
}

grpc::ServerUnaryReactor* AdminService::DumpMemory(grpc::CallbackServerContext* ctx,
                                                   const v1::DumpMemoryRequest*,
                                                   v1::DumpMemoryResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "DumpMemory");
  if (!caller.ok()) return FinishWith(ctx, "DumpMemory", start, caller.status());
  const MemorySnapshot s = CacheInspector(cache_).SnapshotMemory();
  response->set_taken_unix_ms(absl::ToUnixMillis(s.taken));
  FillStats(s.stats, response->mutable_stats());
  for (const ModelMemory& m : s.models) {
    v1::ModelMemory* out = response->add_models();
    out->set_namespace_(m.model.ns);
    out->set_model_id(m.model.model_id);
    out->set_host_blocks(m.host_blocks);
    out->set_host_bytes(m.host_bytes);
    out->set_lower_blocks(m.lower_blocks);
    out->set_lower_bytes(m.lower_bytes);
    out->set_device_blocks(m.device_blocks);
    out->set_raw_blocks(m.raw_blocks);
    out->set_int8_blocks(m.int8_blocks);
    out->set_budget_blocks(m.budget_blocks);
    out->set_raw_bytes(m.raw_bytes);
    out->set_leased_blocks(m.leased_blocks);
    out->set_referenced_blocks(m.referenced_blocks);
    out->set_pinned_tokens(m.pinned_tokens);
    out->set_metadata_bytes(m.metadata_bytes);
    for (size_t r = 0; r < kPinReasons; ++r) {
      if (m.pinned_by[r] == 0) continue;
      (*out->mutable_pinned_blocks())[std::string(PinReasonName(static_cast<PinReason>(r)))] =
          m.pinned_by[r];
    }
  }
  for (const SlabClassStats& c : s.slab_classes) {
    v1::SlabClassSnapshot* out = response->add_slab_classes();
    out->set_chunk_bytes(c.chunk_bytes);
    out->set_span_bytes(c.span_bytes);
    out->set_spans(c.spans);
    out->set_live_chunks(c.live_chunks);
    const uint64_t carved = c.spans * c.chunks_per_span;
    out->set_free_chunks(carved - std::min(carved, c.live_chunks));
    out->set_occupancy(
        carved == 0 ? 0.0 : static_cast<double>(c.live_chunks) / static_cast<double>(carved));
  }
  const SlabPoolStats& pool = s.stats.host_pool;
  response->set_pool_capacity_bytes(pool.capacity_bytes);
  response->set_pool_reserved_bytes(pool.reserved_bytes);
  response->set_pool_allocated_bytes(pool.allocated_bytes);
  response->set_pool_fragmentation(pool.reserved_bytes == 0
                                       ? 0.0
                                       : 1.0 - static_cast<double>(pool.allocated_bytes) /
                                                   static_cast<double>(pool.reserved_bytes));
  for (const LeaseSnapshot& l : s.leases) {
    v1::LeaseSnapshot* out = response->add_leases();
    out->set_lease_id(l.id);
    out->set_namespace_(l.model.ns);
    out->set_model_id(l.model.model_id);
    out->set_tokens(l.tokens);
    out->set_blocks(l.blocks);
    out->set_bytes(l.bytes);
    out->set_age_ms(static_cast<uint64_t>(
        std::max<int64_t>(absl::ToInt64Milliseconds(s.taken - l.created), 0)));
    out->set_expires_in_ms(static_cast<uint64_t>(
        std::max<int64_t>(absl::ToInt64Milliseconds(l.expires - s.taken), 0)));
  }
  response->set_leases_total(s.leases_total);
  response->set_process_rss_bytes(ProcessRssBytes());
  if (inflight_ != nullptr) FillInflightCalls(*inflight_, s.taken, response->mutable_calls());
  return Finish(ctx, "DumpMemory", start);
}

grpc::ServerUnaryReactor* AdminService::InspectSequence(grpc::CallbackServerContext* ctx,
                                                        const v1::InspectSequenceRequest* request,
                                                        v1::InspectSequenceResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "InspectSequence");
  if (!caller.ok()) return FinishWith(ctx, "InspectSequence", start, caller.status());
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<ModelKey> key =
        ScopedModelKey(*caller, request->namespace_(), request->model_id());
    if (!key.ok()) return key.status();
    const bool by_tokens = !request->tokens().empty();
    const bool by_key = request->first_block_key() != 0;
    if (by_tokens == by_key) {
      return absl::InvalidArgumentError("give either tokens or first_block_key");
    }
    absl::StatusOr<SequenceInspection> r;
    if (by_tokens) {
      const std::vector<Token> tokens(request->tokens().begin(), request->tokens().end());
      r = CacheInspector(cache_).InspectSequence(*key, tokens, request->include_heads());
    } else {
      r = CacheInspector(cache_).InspectHottestPath(*key, request->first_block_key(),
                                                    request->include_heads());
    }
    if (!r.ok()) return r.status();
    ToProto(*r, response);
    return absl::OkStatus();
  }();
  return FinishWith(ctx, "InspectSequence", start, status);
}

}  // namespace kvcache
