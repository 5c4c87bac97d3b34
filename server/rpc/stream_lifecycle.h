// StreamLifecycle: what CacheService's Append and Fetch reactors
// (cache_service_append.cc, cache_service_fetch.cc) share about their stream:
// admission (caller, tenant stream slot, max_concurrent_streams and
// max_streams_per_client), the idle watch, and data-path steps through the
// FairScheduler. Internal to kvcache_rpc; include it only from those files.
//
// One per reactor, owned by it. Begin, Progress, RunStep, ReleaseSlot and End
// run on the reactor's reactions; the watchdog runs the idle cancellation on
// its own thread, until End() returns.
#ifndef KVCACHE_SERVER_RPC_STREAM_LIFECYCLE_H_
#define KVCACHE_SERVER_RPC_STREAM_LIFECYCLE_H_

#include <grpc/grpc.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/frontdoor/fair_scheduler.h"
#include "server/rpc/cache_service.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/stream_watchdog.h"
#include "server/security/access_control.h"

namespace kvcache {

// What an Append or Fetch reactor shares: its stream slot and its watch for
// idleness. The watchdog cancels an idle call from its own thread, with a
// status naming the setting; the reactor then sees its read or write fail
// and finishes as usual, reporting DEADLINE_EXCEEDED.
class StreamLifecycle {
 public:
  StreamLifecycle(CacheService* service, grpc::CallbackServerContext* ctx, std::string_view method,
                  std::string_view stalled)
      : service_(service), ctx_(ctx), method_(method), stalled_(stalled) {}

  // Takes a stream slot and starts the idle timer; RESOURCE_EXHAUSTED when
  // a stream limit is reached. `release`, when set, runs on the watchdog
  // thread as an idle stream is cancelled, to free what the reactor holds.
  absl::Status Begin(std::function<void()> release = nullptr) {
    release_ = std::move(release);
    peer_ = ctx_->peer();
    absl::StatusOr<Caller> caller = AdmitCall(service_->options_.access, *ctx_, method_);
    if (!caller.ok()) return caller.status();
    caller_ = *std::move(caller);
    if (service_->options_.access != nullptr) {
      absl::StatusOr<TenantStreamSlot> slot = service_->options_.access->OpenStream(caller_);
      if (!slot.ok()) {
        service_->observer_->OnLimitReached(method_, "tenant max_concurrent_streams");
        return slot.status();
      }
      tenant_slot_ = *std::move(slot);
    }
    std::string_view limit;
    if (absl::Status s = service_->streams_.Acquire(peer_, &limit); !s.ok()) {
      service_->observer_->OnLimitReached(method_, limit);
      return s;
    }
    holds_slot_ = true;
    watch_ = service_->watchdog_.Watch([this] { OnIdle(); });
    return absl::OkStatus();
  }
  // The stream moved: restart the idle timer.
  void Progress() {
    if (watch_ != 0) service_->watchdog_.Touch(watch_);
  }
  bool timed_out() const { return timed_out_.load(); }
  // The peer, once Begin() ran.
  const std::string& peer() const { return peer_; }
  // Who is calling, once Begin() succeeded.
  const Caller& caller() const { return caller_; }
  // What a failed read or write means: the idle timeout, or `otherwise`.
  absl::Status BrokeOff(absl::Status otherwise) const {
    return timed_out() ? TimeoutError() : otherwise;
  }
  // Gives the slot back; called as the reactor finishes, so a client that
  // has seen the status finds the slot free. Idempotent.
  void ReleaseSlot() {
    tenant_slot_ = TenantStreamSlot();
    if (!holds_slot_) return;
    holds_slot_ = false;
    service_->streams_.Release(peer_);
  }
  // Runs `step` as one data-path step of this stream's connection: now, on
  // this thread, when the FairScheduler has a slot free (or there is none),
  // else on a kv-fair thread once admitted, with UNAVAILABLE at shutdown.
  // Never blocks. The slot is given back as `step` returns.
  // Every step after the stream's first continues its operation
  // (FairScheduler::Submit): it waits only for a free slot, not for a turn.
  void RunStep(absl::AnyInvocable<void(absl::Status) &&> step) {
    FairScheduler* fair = service_->options_.fair;
    if (fair == nullptr) return std::move(step)(absl::OkStatus());
    if (flow_ == nullptr) {
      flow_ = fair->Join(caller_.principal().tenant, peer_, DataPathKind::kGrpc);
    }
    // Set before Submit: once the step starts a read or write, the next
    // reaction (even OnDone, deleting this) may run on another thread.
    const bool continues = std::exchange(ran_step_, true);
    fair->Submit(
        flow_,
        [step = std::move(step)](absl::StatusOr<FairScheduler::Slot> slot) mutable {
          std::move(step)(slot.status());
        },
        continues);
  }
  // From OnDone: stops the timer (waiting out a running OnIdle) and gives
  // the slot back if Finish did not.
  void End() {
    if (ran_step_) service_->options_.fair->EndOperation(flow_);
    if (watch_ != 0) service_->watchdog_.Unwatch(watch_);
    ReleaseSlot();
  }

 private:
  absl::Status TimeoutError() const {
    return absl::DeadlineExceededError(
        absl::StrCat(std::string(method_), " stream cancelled: ", std::string(stalled_),
                     " for stream_idle_timeout_ms (",
                     absl::ToInt64Milliseconds(service_->watchdog_.idle_timeout()), " ms)"));
  }
  // On the watchdog thread; the reactor is alive until End() returns.
  void OnIdle() {
    timed_out_.store(true);
    service_->observer_->OnStreamTimeout(method_);
    if (release_) release_();
    const std::string message(TimeoutError().message());
    // ServerContext::TryCancel() would tell the client only "Cancelled";
    // this sends the reason (as trailers, even past a full flow-control
    // window) and fails the pending read or write.
    grpc_call_cancel_with_status(ctx_->c_call(), GRPC_STATUS_DEADLINE_EXCEEDED, message.c_str(),
                                 nullptr);
  }

  CacheService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const std::string_view method_;
  const std::string_view stalled_;  // what "no progress" means for this stream
  std::string peer_;
  Caller caller_ = Caller::Anonymous();
  TenantStreamSlot tenant_slot_;
  std::shared_ptr<FairScheduler::Flow> flow_;  // once a step ran
  bool ran_step_ = false;
  std::function<void()> release_;
  bool holds_slot_ = false;
  StreamWatchdog::Id watch_ = 0;
  std::atomic<bool> timed_out_{false};
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_STREAM_LIFECYCLE_H_
