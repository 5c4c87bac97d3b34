// ShmSession: what one shared-memory connection may do, and its regions.
//
// The daemon's ShmServer gives every worker connection a session and feeds it
// each request frame it reads (with the descriptors that came along); the
// session answers it. It holds the regions the worker attached on this
// connection, under ids valid only here: an id from another connection, or
// one detached, is NOT_FOUND. Every (region, offset, length) is checked
// against the region before anything is looked up, stored or copied, so a bad
// range changes nothing.
//
//   hello          the daemon's protocol version and limits
//   attach_region  maps the memfd that came with the frame (MappedRegion),
//                  within the daemon's MappingBudget (by the principal's
//                  tenant with authentication on, else by the peer's uid)
//   detach_region  unmaps it (once requests using it are done)
//   lookup, batch_lookup, release_lease   as the gRPC calls
//   fetch_into     lookup + copy of the prefix's blocks into a region, with
//                  each block's checksum in the answer (the worker verifies)
//   append_from    an append whose KV lies in a region: copied into the pool
//                  once, hashed from the pool's copy, verified against the
//                  header's checksums
//
// Destroying the session drops its regions (they unmap when no request uses
// them). Not thread-safe: the server hands a connection's requests to one
// thread at a time, and the next one only once the last was answered (an
// answer may come from a kv-fair or fetch-read thread: Handle).
#ifndef KVCACHE_SERVER_SHM_SHM_SESSION_H_
#define KVCACHE_SERVER_SHM_SHM_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "kvcache/v1/shm.pb.h"
#include "server/core/cache.h"
#include "server/frontdoor/fair_scheduler.h"
#include "server/frontdoor/inflight_calls.h"
#include "server/frontdoor/rpc_observer.h"
#include "server/frontdoor/shared_tier.h"
#include "server/frontdoor/unix_socket.h"
#include "server/security/access_control.h"
#include "server/shm/copy_engine.h"
#include "server/shm/mapped_region.h"
#include "server/shm/mapping_budget.h"

namespace kvcache {

struct ShmLimits {
  uint32_t max_regions = 64;
  uint64_t max_region_bytes = uint64_t{64} << 30;
  uint64_t max_frame_bytes = uint64_t{64} << 20;
};

// Who a session serves, for its calls' log lines and the calls in flight.
struct ShmPeer {
  std::string peer;                   // e.g. "shm:pid=123,uid=1000"
  InflightCalls* inflight = nullptr;  // fetch_into and append_from register here
  uid_t uid = 0;                      // the peer's uid (SO_PEERCRED): who it is
  // Admits each request as the principal `uid` names; null: everyone,
  // everywhere. Outlives the session.
  AccessControl* access = nullptr;
  // Admits each fetch_into and append_from as a data-path step
  // (limits.data_path_concurrency), shared with the gRPC Fetch and Append;
  // a step that must wait for a slot runs on a kv-fair thread once granted.
  // Null: no admission. Outlives the session.
  FairScheduler* fair = nullptr;
  // The tier shared with other daemons, told of appends and short lookups;
  // null: none. Outlives the session.
  SharedTier* shared = nullptr;
};

class ShmSession {
 public:
  // Appends are fed to the cache in pieces of this size: the pool's copy is
  // hashed while it is still in cache.
  static constexpr uint64_t kAppendPieceBytes = uint64_t{256} << 10;

  // `cache`, `copier`, `observer`, `who.inflight` and `budget` outlive the
  // session. `budget`: the daemon-wide caps on mapped regions; null: none
  // besides `limits`.
  ShmSession(const ShmLimits& limits, Cache* cache, CopyEngine* copier, RpcObserver* observer,
             ShmPeer who = {}, MappingBudget* budget = nullptr);
  ~ShmSession();
  ShmSession(const ShmSession&) = delete;
  ShmSession& operator=(const ShmSession&) = delete;

  // Receives the answer to one request.
  using Respond = absl::AnyInvocable<void(v1::ShmResponse) &&>;

  // Answers one request: `respond` runs once with the answer, on this thread
  // before Handle returns, or later on another thread when the request has
  // to wait, so that this thread never does: a fetch_into or append_from
  // waiting for a data-path slot runs on a kv-fair thread once granted
  // (FairScheduler::Submit), and a fetch_into whose blocks are read back
  // from a level below host memory copies and answers on the cache's
  // fetch-read threads (Cache::PrepareFetchAsync). Until `respond` has run
  // the session must get no other request and must not be destroyed.
  // `fds` are the descriptors that came with the request (the session closes
  // them). Never fails as a whole: errors are in the answer. The plane
  // carries no metadata, so each request gets a request id here: its log
  // line names it, and an error's message ends with "(request id ID)".
  void Handle(v1::ShmRequest request, std::vector<UniqueFd> fds, Respond respond);

  size_t regions() const { return regions_.size(); }
  uint64_t mapped_bytes() const { return mapped_bytes_; }
  // Whether the session's tenant was past its share of shm.max_connections
  // (security.tenant_limits.max_share) at its first request: the answer said
  // so, and the server closes the connection.
  bool refused() const { return refused_; }

 private:
  absl::StatusOr<v1::AttachRegionResponse> Attach(const Caller& caller,
                                                  const v1::AttachRegionRequest& request,
                                                  std::vector<UniqueFd>& fds);
  absl::Status Detach(const v1::DetachRegionRequest& request);
  // The bytes `range` names; NOT_FOUND for a region not attached here,
  // OUT_OF_RANGE for bytes outside it. `region` keeps the mapping alive.
  absl::StatusOr<std::span<std::byte>> Resolve(const v1::RegionRange& range,
                                               std::shared_ptr<MappedRegion>* region) const;
  struct Call;
  static bool MovesKv(const v1::ShmRequest& request);
  // Who may make `call` (its caller set), and its slots besides the
  // data-path one; nothing is changed on error.
  absl::Status Admit(Call& call);
  // Serves an admitted call; a fetch_into goes on in StartFetchInto.
  void Run(std::unique_ptr<Call> call);
  // Logs and counts the call and hands its answer (or `status`) over.
  void Finish(std::unique_ptr<Call> call, const absl::Status& status);
  // Matches the fetch and copies (or decodes) its blocks into the
  // destination once they are readable, then finishes the call.
  void StartFetchInto(std::unique_ptr<Call> call);
  absl::StatusOr<v1::FetchIntoResponse> CopyFetched(FetchPlan plan, uint32_t max_blocks,
                                                    std::span<std::byte> destination,
                                                    uint64_t* bytes);
  absl::StatusOr<v1::AppendResponse> AppendFrom(const Caller& caller,
                                                const v1::AppendFromRequest& request,
                                                uint64_t* bytes);
  // Holds one of `caller`'s tenant's shared-memory connection slots for the
  // session (taken at its first request, again when a hello names another
  // tenant); RESOURCE_EXHAUSTED, and refused() set, past the tenant's share.
  absl::Status HoldConnectionSlot(const Caller& caller);

  const ShmLimits limits_;
  Cache* const cache_;
  CopyEngine* const copier_;
  RpcObserver* const observer_;
  const ShmPeer who_;
  std::string token_;           // the hello's bearer token; empty: the uid's principal
  SessionPrincipal principal_;  // who token_ (or the uid) names, until a reload
  MappingBudget* const budget_;
  struct Attached {
    std::shared_ptr<MappedRegion> region;
    MappingBudget::Grant grant;  // the region's share of budget_
  };
  absl::flat_hash_map<uint64_t, Attached> regions_;
  std::optional<std::string> connection_tenant_;  // whose connection slot is held
  // This connection's place in who_.fair's queue, as a flow of `flow_tenant_`.
  std::shared_ptr<FairScheduler::Flow> flow_;
  std::string flow_tenant_;
  TenantStreamSlot connection_slot_;
  bool refused_ = false;
  uint64_t mapped_bytes_ = 0;
  absl::BitGen ids_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SHM_SHM_SESSION_H_
