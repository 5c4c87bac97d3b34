#include "server/rpc/admin_service.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "server/core/cache_inspector.h"
#include "server/frontdoor/call_log.h"
#include "server/frontdoor/call_scope.h"
#include "server/frontdoor/proto_convert.h"
#include "server/rpc/grpc_call.h"
#include "server/rpc/status_convert.h"

namespace kvcache {

void FillMemoryStats(const MemoryBreakdown& memory, v1::MemoryStats* out) {
  out->set_rss_bytes(memory.process.vm_rss_bytes);
  out->set_anonymous_bytes(memory.process.rss_anon_bytes);
  out->set_file_bytes(memory.process.rss_file_bytes);
  out->set_shared_bytes(memory.process.rss_shmem_bytes);
  out->set_own_bytes(memory.own_bytes);
  out->set_bound_bytes(memory.bound_bytes);
  out->set_threads(memory.process.threads);
  for (size_t i = 0; i < kMemoryParts; ++i) {
    v1::MemoryStats::Part* part = out->add_parts();
    part->set_name(std::string(MemoryPartName(static_cast<MemoryPart>(i))));
    part->set_bytes(memory.parts[i]);
  }
  out->set_heap_in_use_bytes(memory.malloc.in_use_bytes);
  out->set_heap_free_bytes(memory.malloc.free_bytes);
  out->set_malloc_trims(memory.malloc_trims);
  out->set_shm_connections(memory.shm_connections);
}

void FillStats(const CacheStats& stats, v1::GetStatsResponse* response) {
  for (const ModelStats& m : stats.models) {
    v1::ModelStats* out = response->add_models();
    out->set_namespace_(m.model.ns);
    out->set_model_id(m.model.model_id);
    out->set_blocks(m.blocks);
    out->set_tokens(m.tokens);
    out->set_bytes(m.bytes);
    out->set_hit_tokens(m.hit_tokens);
    out->set_miss_tokens(m.miss_tokens);
    out->set_appended_blocks(m.appended_blocks);
    out->set_deduplicated_blocks(m.deduplicated_blocks);
    out->set_evicted_blocks(m.evicted_blocks);
    *out->mutable_policy() = ToProto(m.policy);
    out->set_compressed_blocks(m.compressed_blocks);
    out->set_full_tokens(m.full_tokens);
    out->set_int8_tokens(m.int8_tokens);
    out->set_pruned_tokens(m.pruned_tokens);
    out->set_int8_entries(m.int8_entries);
    out->set_int4_entries(m.int4_entries);
    out->set_pruned_entries(m.pruned_entries);
    out->set_budget_overruns(m.budget_overruns);
    out->set_bytes_saved(m.bytes_saved);
    out->set_attention_reports(m.attention_reports);
    out->set_calibrations(m.calibrations);
    out->set_conflicting_blocks(m.conflicting_blocks);
    out->set_restored_blocks(m.restored_blocks);
    out->set_corrupt_blocks(m.corrupt_blocks);
  }
  if (stats.has_device) {
    const TierCounters& t = stats.tiers;
    v1::TierStats* gpu = response->add_tiers();
    gpu->set_name("gpu");
    gpu->set_capacity_bytes(stats.device_store.capacity_bytes);
    gpu->set_used_bytes(stats.device_store.allocated_bytes);
    gpu->set_payload_bytes(t.device_payload_bytes);
    gpu->set_blocks(t.device_blocks);
    gpu->set_promotions(t.device_placements);
    gpu->set_placement_hits(t.device_hits);
    gpu->set_clean_drops(t.device_drops_room + t.device_drops_pressure +
                         t.device_drops_invalidated);
    gpu->set_write_bytes(t.device_placed_bytes);
    gpu->set_write_failures(t.device_write_failures);
    gpu->set_checksum_failures(stats.device_store.checksum_failures);
  }
  v1::TierStats* host = response->add_tiers();
  host->set_name("host");
  host->set_capacity_bytes(stats.host_pool.capacity_bytes);
  host->set_used_bytes(stats.host_pool.reserved_bytes);
  host->set_payload_bytes(stats.payload_bytes);
  host->set_slab_bytes(stats.host_pool.slab_bytes);
  host->set_blocks(stats.blocks - stats.tiers.lower_only_blocks());
  host->set_pinned_bytes(stats.host_pool.pinned_bytes);
  host->set_pin_failures(stats.host_pool.pin_failures);
  // The levels below host memory, in their order (level 0 first).
  for (size_t level = 0; level < stats.lower_stores.size(); ++level) {
    const TierStats& store = stats.lower_stores[level];
    const LowerLevelCounters& t = stats.tiers.lower[level];
    v1::TierStats* lower = response->add_tiers();
    lower->set_name(store.kind);
    lower->set_capacity_bytes(store.capacity_bytes);
    lower->set_used_bytes(store.allocated_bytes);
    lower->set_payload_bytes(t.payload_bytes);
    lower->set_blocks(t.blocks);
    lower->set_demotions(t.demotions);
    lower->set_promotions(t.promotions);
    lower->set_clean_drops(t.clean_drops);
    lower->set_evictions(t.evictions);
    lower->set_admissions_refused(t.admissions_refused);
    lower->set_checksum_failures(t.checksum_failures);
    lower->set_reads(t.reads);
    lower->set_read_bytes(t.read_bytes);
    lower->set_write_bytes(t.demoted_bytes);
    lower->set_write_failures(t.write_failures);
    if (level == 0) {  // prefetches read from every level; they count once
      lower->set_prefetches_issued(stats.prefetch.issued);
      lower->set_prefetches_completed(stats.prefetch.completed);
      lower->set_prefetches_dropped(stats.prefetch.dropped);
      lower->set_prefetches_late(stats.prefetch.late);
    }
  }
  response->set_active_leases(stats.active_leases);
  response->set_capacity_evictions(stats.capacity_evictions);
  response->set_rejected_appends(stats.rejected_appends);
  response->set_conflicting_appends(stats.conflicting_appends);
  response->set_metadata_evictions(stats.metadata_evictions);
  response->set_metadata_bytes(stats.metadata_bytes);
  response->set_staged_bytes(stats.staged_bytes);
  response->set_lease_tokens(stats.lease_tokens);
}

grpc::ServerUnaryReactor* AdminService::Finish(grpc::CallbackServerContext* ctx,
                                               std::string_view method, absl::Time start) {
  return FinishWith(ctx, method, start, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::FinishWith(grpc::CallbackServerContext* ctx,
                                                   std::string_view method, absl::Time start,
                                                   const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  FinishUnaryCall(ctx, reactor, observer_, method, start, status);
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::WhoAmI(grpc::CallbackServerContext* ctx,
                                               const v1::WhoAmIRequest*,
                                               v1::WhoAmIResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "WhoAmI");
  if (!caller.ok()) return FinishWith(ctx, "WhoAmI", start, caller.status());
  const Principal& p = caller->principal();
  response->set_principal(p.name);
  response->set_tenant(p.tenant);
  response->set_role(std::string(RoleName(p.role)));
  response->set_authenticated_by(std::string(AuthMethodName(p.authenticated_by)));
  for (const std::string& ns : caller->shared_namespaces()) response->add_shared_namespaces(ns);
  return Finish(ctx, "WhoAmI", start);
}

grpc::ServerUnaryReactor* AdminService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                      const v1::GetServerInfoRequest*,
                                                      v1::GetServerInfoResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "GetServerInfo");
  if (!caller.ok()) return FinishWith(ctx, "GetServerInfo", start, caller.status());
  response->set_version(identity_.version);
  response->set_git_revision(identity_.git_revision);
  response->set_start_time_unix_ms(absl::ToUnixMillis(identity_.start_time));
  response->set_uptime_seconds(absl::ToInt64Seconds(start - identity_.start_time));
  for (const std::string& a : identity_.listen_addresses) response->add_listen_addresses(a);
  response->set_cuda_built(identity_.cuda_built);
  response->set_shm_socket(identity_.shm_socket);
  if (checkpoints_ != nullptr) FillCheckpointStatus(*checkpoints_, response->mutable_checkpoint());
  if (remote_tier_) *response->mutable_remote_tier() = remote_tier_();
  return Finish(ctx, "GetServerInfo", start);
}

grpc::ServerUnaryReactor* AdminService::ListModels(grpc::CallbackServerContext* ctx,
                                                   const v1::ListModelsRequest* request,
                                                   v1::ListModelsResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "ListModels");
  if (!caller.ok()) return FinishWith(ctx, "ListModels", start, caller.status());
  if (!request->namespace_().empty()) {
    // Naming a namespace the caller may not use is refused, as in data calls.
    if (absl::StatusOr<std::string> ns = caller->NamespaceOf(request->namespace_()); !ns.ok()) {
      return FinishWith(ctx, "ListModels", start, ns.status());
    }
  }
  for (const auto& [key, layout] : CacheInspector(cache_).ListModels()) {
    if (!request->namespace_().empty() && request->namespace_() != key.ns) continue;
    if (!caller->MaySee(key.ns)) continue;
    v1::ModelInfo* info = response->add_models();
    info->set_namespace_(key.ns);
    info->set_model_id(key.model_id);
    *info->mutable_layout() = ToProto(layout);
    info->set_block_bytes(layout.BlockBytes());
    if (auto policy = cache_->GetPolicy(key); policy.ok()) {
      *info->mutable_policy() = ToProto(*policy);
    }
  }
  return Finish(ctx, "ListModels", start);
}

grpc::ServerUnaryReactor* AdminService::GetStats(grpc::CallbackServerContext* ctx,
                                                 const v1::GetStatsRequest*,
                                                 v1::GetStatsResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "GetStats");
  if (!caller.ok()) return FinishWith(ctx, "GetStats", start, caller.status());
  FillStats(cache_->GetStats(), response);
  // A tenant sees its own and the shared namespaces' models; the totals
  // (tiers, counters) describe the daemon, not any one tenant's KV.
  auto* models = response->mutable_models();
  models->erase(
      std::remove_if(models->begin(), models->end(),
                     [&](const v1::ModelStats& m) { return !caller->MaySee(m.namespace_()); }),
      models->end());
  if (memory_) FillMemoryStats(memory_(), response->mutable_memory());
  if (rpc_tally_ != nullptr) {
    for (const RpcCount& c : rpc_tally_->Counts()) {
      v1::RpcCounters* out = response->add_rpcs();
      out->set_method(c.method);
      out->set_calls(c.calls);
      out->set_errors(c.errors);
      out->set_payload_bytes(c.payload_bytes);
      out->set_latency_us_sum(c.latency_us_sum);
    }
  }
  return Finish(ctx, "GetStats", start);
}

grpc::ServerUnaryReactor* AdminService::UpdateModelPolicy(
    grpc::CallbackServerContext* ctx, const v1::UpdateModelPolicyRequest* request,
    v1::UpdateModelPolicyResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "UpdateModelPolicy");
  if (!caller.ok()) return FinishWith(ctx, "UpdateModelPolicy", start, caller.status());
  absl::Status status = [&]() -> absl::Status {
    auto key = ScopedModelKey(*caller, request->namespace_(), request->model_id());
    if (!key.ok()) return key.status();
    PolicyUpdate update;
    auto mode = FromProto(request->mode());
    if (!mode.ok()) return mode.status();
    update.mode = *mode;
    if (request->has_weights()) {
      update.weights = importance::Weights{.alpha = request->weights().alpha(),
                                           .beta = request->weights().beta(),
                                           .gamma = request->weights().gamma()};
    }
    if (request->target_mass() != 0) update.target_mass = request->target_mass();
    if (request->target_bytes() != 0) update.target_bytes = request->target_bytes();
    absl::StatusOr<PolicyChange> change = cache_->UpdatePolicy(*key, update);
    if (!change.ok()) return change.status();
    *response->mutable_policy() = ToProto(change->policy);
    response->set_previous_mode(ToProto(change->previous_mode));
    response->set_dropped_blocks(change->dropped_blocks);
    return absl::OkStatus();
  }();
  return FinishWith(ctx, "UpdateModelPolicy", start, status);
}

grpc::ServerUnaryReactor* AdminService::UnregisterModel(grpc::CallbackServerContext* ctx,
                                                        const v1::UnregisterModelRequest* request,
                                                        v1::UnregisterModelResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "UnregisterModel");
  if (!caller.ok()) return FinishWith(ctx, "UnregisterModel", start, caller.status());
  absl::Status status = [&]() -> absl::Status {
    auto key = ScopedModelKey(*caller, request->namespace_(), request->model_id());
    if (!key.ok()) return key.status();
    absl::StatusOr<UnregisterResult> r = cache_->UnregisterModel(*key);
    if (!r.ok()) return r.status();
    response->set_evicted_blocks(r->evicted_blocks);
    response->set_evicted_bytes(r->evicted_bytes);
    response->set_released_leases(r->released_leases);
    return absl::OkStatus();
  }();
  return FinishWith(ctx, "UnregisterModel", start, status);
}

}  // namespace kvcache
