// AdminService: the checkpoint calls (docs/checkpoints.md).
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/frontdoor/call_log.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/grpc_call.h"
#include "server/rpc/status_convert.h"

namespace kvcache {
namespace {

using checkpoint::CheckpointInfo;
using checkpoint::CheckpointRun;
using checkpoint::CheckpointServiceStatus;

// A count from a manifest summary; 0 when missing or not a count (the
// summary is the checkpoint's, never a reason to throw in an RPC).
uint64_t SummaryCount(const nlohmann::json& summary, const char* key) {
  const auto it = summary.find(key);
  return it != summary.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

void ToProto(const CheckpointInfo& info, v1::CheckpointInfo* out) {
  out->set_sequence(info.sequence);
  out->set_created_unix_ms(info.created_unix_ms);
  out->set_duration_ms(static_cast<uint64_t>(std::max<int64_t>(info.write_duration_ms, 0)));
  out->set_data_bytes(info.data_bytes);
  out->set_records(info.record_count);
  out->set_status(std::string(checkpoint::CheckpointStateName(info.state)));
  out->set_error(info.reason);
  const nlohmann::json& s = info.summary;
  const auto full = s.find("full");
  out->set_full(full != s.end() && full->is_boolean() && full->get<bool>());
  out->set_blocks(SummaryCount(s, "blocks"));
  out->set_host_payloads(SummaryCount(s, "host_payloads"));
  out->set_referenced_payloads(SummaryCount(s, "referenced_payloads"));
  for (uint64_t r : info.references) out->add_references(r);
}

void ToProto(const CheckpointRun& run, absl::Time when, v1::CheckpointInfo* out) {
  out->set_sequence(run.sequence);
  out->set_created_unix_ms(absl::ToUnixMillis(when));
  out->set_duration_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(run.duration)));
  out->set_data_bytes(run.data_bytes);
  out->set_records(run.records);
  out->set_status("complete");
  out->set_full(run.full);
  out->set_blocks(run.blocks);
  out->set_host_payloads(run.host_payloads);
  out->set_referenced_payloads(run.referenced_payloads);
  for (uint64_t r : run.references) out->add_references(r);
}

}  // namespace

void FillCheckpointStatus(const checkpoint::CheckpointService& service, v1::CheckpointStatus* out) {
  const CheckpointServiceStatus s = service.Status();
  out->set_enabled(true);
  out->set_dir(s.dir);
  out->set_restore_state(std::string(checkpoint::RestoreStateName(s.restore.state)));
  out->set_restore_sequence(s.restore.sequence);
  out->set_restore_records_done(s.restore.records_done);
  out->set_restore_records_total(s.restore.records_total);
  out->set_restored_blocks(s.restore.restored_blocks);
  out->set_restore_skipped_blocks(s.restore.present_blocks + s.restore.orphan_blocks +
                                  s.restore.lost_blocks + s.restore.skipped_blocks);
  out->set_restore_error(s.restore.error);
  out->set_restore_duration_ms(
      static_cast<uint64_t>(absl::ToInt64Milliseconds(s.restore.duration)));
  if (s.last.has_value()) ToProto(*s.last, s.last_time, out->mutable_last());
  out->set_checkpoints_ok(s.ok);
  out->set_checkpoints_failed(s.failed);
  out->set_last_error(s.last_error);
  out->set_in_progress(s.in_progress);
  out->set_interval_seconds(static_cast<uint32_t>(absl::ToInt64Seconds(s.interval)));
  out->set_reattached_copies(s.restore.reattached_copies);
  out->set_reattach_failures(s.restore.reattach_failures);
}

grpc::ServerUnaryReactor* AdminService::Checkpoint(grpc::CallbackServerContext* ctx,
                                                   const v1::CheckpointRequest*,
                                                   v1::CheckpointResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "Checkpoint");
  if (!caller.ok()) return FinishWith(ctx, "Checkpoint", start, caller.status());
  if (checkpoints_ == nullptr) {
    return FinishWith(ctx, "Checkpoint", start,
                      absl::FailedPreconditionError(
                          "checkpoints are off: set checkpoint.dir (or --checkpoint-dir)"));
  }
  // A checkpoint takes seconds to minutes: not on a gRPC callback thread.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::thread([this, ctx, reactor, response, start] {
    absl::StatusOr<CheckpointRun> run = checkpoints_->CheckpointNow();
    if (run.ok()) ToProto(*run, absl::Now(), response->mutable_checkpoint());
    const absl::Status status = run.ok() ? absl::OkStatus() : run.status();
    FinishUnaryCall(ctx, reactor, observer_, "Checkpoint", start, status);
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::ListCheckpoints(grpc::CallbackServerContext* ctx,
                                                        const v1::ListCheckpointsRequest*,
                                                        v1::ListCheckpointsResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "ListCheckpoints");
  if (!caller.ok()) return FinishWith(ctx, "ListCheckpoints", start, caller.status());
  if (checkpoints_ == nullptr) {
    response->mutable_status()->set_enabled(false);
    return Finish(ctx, "ListCheckpoints", start);
  }
  absl::StatusOr<std::vector<CheckpointInfo>> listed = checkpoints_->List();
  if (!listed.ok()) return FinishWith(ctx, "ListCheckpoints", start, listed.status());
  for (const CheckpointInfo& info : *listed) ToProto(info, response->add_checkpoints());
  FillCheckpointStatus(*checkpoints_, response->mutable_status());
  return Finish(ctx, "ListCheckpoints", start);
}

grpc::ServerUnaryReactor* AdminService::VerifyCheckpoint(grpc::CallbackServerContext* ctx,
                                                         const v1::VerifyCheckpointRequest* request,
                                                         v1::VerifyCheckpointResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = AdmitCall(access_, *ctx, "VerifyCheckpoint");
  if (!caller.ok()) return FinishWith(ctx, "VerifyCheckpoint", start, caller.status());
  if (checkpoints_ == nullptr) {
    return FinishWith(ctx, "VerifyCheckpoint", start,
                      absl::FailedPreconditionError(
                          "checkpoints are off: set checkpoint.dir (or --checkpoint-dir)"));
  }
  const uint64_t sequence = request->sequence();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::thread([this, ctx, reactor, response, start, sequence] {
    absl::StatusOr<checkpoint::VerifyOutcome> verified = checkpoints_->Verify(sequence);
    absl::Status status = verified.status();
    if (verified.ok()) {
      ToProto(verified->info, response->mutable_checkpoint());
      response->set_records_verified(verified->records);
      response->set_bytes_verified(verified->bytes);
      if (verified->info.state != checkpoint::CheckpointState::kComplete) {
        status = absl::DataLossError(absl::StrCat("checkpoint ", verified->info.sequence, " is ",
                                                  response->checkpoint().status(), ": ",
                                                  verified->info.reason));
      }
    }
    FinishUnaryCall(ctx, reactor, observer_, "VerifyCheckpoint", start, status);
  }).detach();
  return reactor;
}

}  // namespace kvcache
