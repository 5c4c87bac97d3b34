// AdminService: the kvcache.v1.Admin gRPC service (server info, models, stats,
// model policies, unregistering models, checkpoints, and the operator's view:
// verifying blocks, memory snapshots, sequence inspection). Thread-safe. The
// Cache, the RpcObserver and the optional sources must outlive it.
#ifndef KVCACHE_SERVER_RPC_ADMIN_SERVICE_H_
#define KVCACHE_SERVER_RPC_ADMIN_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "kvcache/v1/admin.grpc.pb.h"
#include "server/checkpoint/checkpoint_service.h"
#include "server/core/cache.h"
#include "server/core/memory_breakdown.h"
#include "server/frontdoor/inflight_calls.h"
#include "server/frontdoor/rpc_observer.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/rpc_tally.h"

namespace kvcache {

struct ServerIdentity {
  std::string version;
  std::string git_revision;
  absl::Time start_time;
  std::vector<std::string> listen_addresses;
  bool cuda_built = false;
  std::string shm_socket;  // empty: no shared-memory data plane
};

// The checkpoint service's state as the Admin calls report it.
void FillCheckpointStatus(const checkpoint::CheckpointService& service, v1::CheckpointStatus* out);

// A stats snapshot as GetStats answers it (without the per-method counts).
void FillStats(const CacheStats& stats, v1::GetStatsResponse* out);

// GetStatsResponse.memory from a breakdown.
void FillMemoryStats(const MemoryBreakdown& memory, v1::MemoryStats* out);

// The daemon's memory breakdown now (read at each GetStats).
using MemorySource = std::function<MemoryBreakdown()>;

// What the Admin service reads besides the cache; each may be null.
struct AdminSources {
  checkpoint::CheckpointService* checkpoints = nullptr;  // null: checkpoints off
  const RpcTally* rpc_tally = nullptr;                   // GetStats' per-method counts
  const InflightCalls* inflight = nullptr;               // DumpMemory's calls (FillInflightCalls)
  AccessControl* access = nullptr;  // who may call what; null: everyone, everywhere
  MemorySource memory;              // GetStats' memory; empty: not reported
  // GetServerInfo's remote_tier; empty: the remote tier is off.
  std::function<v1::RemoteTierStatus()> remote_tier;
};

class AdminService final : public v1::Admin::CallbackService {
 public:
  AdminService(ServerIdentity identity, Cache* cache, RpcObserver* observer,
               AdminSources sources = {})
      : identity_(std::move(identity)),
        cache_(cache),
        observer_(observer),
        checkpoints_(sources.checkpoints),
        rpc_tally_(sources.rpc_tally),
        inflight_(sources.inflight),
        access_(sources.access),
        memory_(std::move(sources.memory)),
        remote_tier_(std::move(sources.remote_tier)) {}

  grpc::ServerUnaryReactor* WhoAmI(grpc::CallbackServerContext* ctx,
                                   const v1::WhoAmIRequest* request,
                                   v1::WhoAmIResponse* response) override;

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;
  grpc::ServerUnaryReactor* UpdateModelPolicy(grpc::CallbackServerContext* ctx,
                                              const v1::UpdateModelPolicyRequest* request,
                                              v1::UpdateModelPolicyResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterModel(grpc::CallbackServerContext* ctx,
                                            const v1::UnregisterModelRequest* request,
                                            v1::UnregisterModelResponse* response) override;
  // admin_checkpoints.cc
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const v1::CheckpointRequest* request,
                                       v1::CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* VerifyCheckpoint(grpc::CallbackServerContext* ctx,
                                             const v1::VerifyCheckpointRequest* request,
                                             v1::VerifyCheckpointResponse* response) override;
  // admin_inspection.cc
  grpc::ServerWriteReactor<v1::VerifyBlocksProgress>* VerifyBlocks(
      grpc::CallbackServerContext* ctx, const v1::VerifyBlocksRequest* request) override;
  grpc::ServerUnaryReactor* DumpMemory(grpc::CallbackServerContext* ctx,
                                       const v1::DumpMemoryRequest* request,
                                       v1::DumpMemoryResponse* response) override;
  grpc::ServerUnaryReactor* InspectSequence(grpc::CallbackServerContext* ctx,
                                            const v1::InspectSequenceRequest* request,
                                            v1::InspectSequenceResponse* response) override;
  // admin_logging.cc
  grpc::ServerUnaryReactor* SetLogLevel(grpc::CallbackServerContext* ctx,
                                        const v1::SetLogLevelRequest* request,
                                        v1::SetLogLevelResponse* response) override;

 private:
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, std::string_view method,
                                   absl::Time start);
  // Reports `status` to the observer and finishes the call with it.
  grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* ctx, std::string_view method,
                                       absl::Time start, const absl::Status& status);

  const ServerIdentity identity_;
  Cache* const cache_;
  RpcObserver* const observer_;
  checkpoint::CheckpointService* const checkpoints_;
  const RpcTally* const rpc_tally_;
  const InflightCalls* const inflight_;
  AccessControl* const access_;
  const MemorySource memory_;
  const std::function<v1::RemoteTierStatus()> remote_tier_;
  // Block verifications running now (each on a thread of its own).
  std::atomic<int> verifications_{0};
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_ADMIN_SERVICE_H_
