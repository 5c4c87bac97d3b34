// kvcache::Client over gRPC: one channel, deadlines on every call, retries
// with backoff for idempotent calls, checksummed Append and verified Fetch,
// models registered again after a daemon restart, a request id on every call.
#include "kvcache/client.h"

#include <grpcpp/grpcpp.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "append_encoder.h"
#include "fetch_assembler.h"
#include "fetch_decoder.h"
#include "kvcache/request_id.h"
#include "kvcache/v1/admin.grpc.pb.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "shm_transport.h"

namespace kvcache {
namespace {

// The prefetch fields of a LookupRequest from `options`.
void SetPrefetch(const LookupOptions& options, v1::LookupRequest* req) {
  if (options.prefetch == v1::PREFETCH_NONE) return;
  req->set_prefetch(options.prefetch);
  req->set_prefetch_timeout_ms(static_cast<uint32_t>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(options.prefetch_timeout), 0, UINT32_MAX)));
}

constexpr absl::Duration kInitialBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
// Under DataPath::kAuto, how long a daemon found without a usable shared-memory
// socket is served over gRPC before the client probes again.
constexpr absl::Duration kShmProbeInterval = absl::Seconds(5);
// How long that probe (one GetServerInfo) may take.
constexpr absl::Duration kShmProbeTimeout = absl::Seconds(2);
// Room in a message for everything but the payload bytes: a fetch chunk of a
// pruned block carries up to ~5.2 KB of kept_tokens (docs/api.md).
constexpr uint64_t kMessageOverhead = 8192;
constexpr std::string_view kDefaultNamespace = "default";
constexpr char kFetchMethod[] = "/kvcache.v1.Cache/Fetch";
constexpr char kAppendMethod[] = "/kvcache.v1.Cache/Append";
// The HTTP/2 flow-control window a stream starts with.
constexpr int kStreamWindowBytes = 8 << 20;
// How long an Append waits, after its call ended, for gRPC to let go of the
// caller's bytes (see AppendOnce).
constexpr absl::Duration kBorrowGrace = absl::Seconds(10);

// Abseil 20220623 as Debian builds it has its own string_view type.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Tags `ctx`'s call with `request_id`, and with the caller's bearer token.
void TagCall(grpc::ClientContext* ctx, const std::string& request_id, const std::string& token) {
  ctx->AddMetadata(kRequestIdHeader, request_id);
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
}

// The bytes of a PEM file named by ClientOptions.`field`.
absl::StatusOr<std::string> ReadPem(const std::string& path, std::string_view field) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) in.setstate(std::ios::failbit);
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions.", std::string(field), " ", path,
                                                   " cannot be read or is empty"));
  }
  return text;
}

// Plaintext, or TLS (mutual with a client certificate) when a CA is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsOf(
    const ClientOptions& options) {
  if (options.tls_ca_file.empty()) {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "ClientOptions.tls_cert_file/tls_key_file need tls_ca_file (the daemon's CA)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions.tls_cert_file and tls_key_file go together: set both or neither");
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadPem(options.tls_ca_file, "tls_ca_file");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *std::move(ca);
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(options.tls_cert_file, "tls_cert_file");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(options.tls_key_file, "tls_key_file");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

// A failed call's status names its request id, so an error the caller logs
// leads to the daemon's line about it: "... (request id 5f3a9c0d12e4b678)".
absl::Status ToAbslStatus(const grpc::Status& s, std::string_view request_id) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(s.error_message(), " (request id ", AsAbsl(request_id), ")"));
}

AppendResult ToAppendResult(const v1::AppendResponse& resp);

// What the client needs of a model's layout.
struct LayoutInfo {
  uint64_t block_bytes = 0;
  uint32_t block_tokens = 0;
  v1::ModelLayout layout;  // bounds what a compressed block may take
};

class ClientImpl final : public Client {
 public:
  ClientImpl(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel)
      : options_(options),
        ns_(options.ns),
        channel_(std::move(channel)),
        cache_(v1::Cache::NewStub(channel_)),
        admin_(v1::Admin::NewStub(channel_)),
        fetch_method_(kFetchMethod, grpc::internal::RpcMethod::SERVER_STREAMING, channel_),
        append_method_(kAppendMethod, grpc::internal::RpcMethod::CLIENT_STREAMING, channel_),
        rng_(std::random_device{}()) {}

  absl::Status WaitForReady(absl::Duration timeout) override {
    const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
    channel_->GetState(/*try_to_connect=*/true);
    if (channel_->WaitForConnected(deadline)) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("kvcached at ", options_.target,
                                               " is not reachable after ",
                                               absl::FormatDuration(timeout)));
  }

  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(std::string_view model_id,
                                                          const v1::ModelLayout& layout) override {
    v1::RegisterModelRequest req;
    req.set_namespace_(ns_);
    req.set_model_id(std::string(model_id));
    *req.mutable_layout() = layout;
    v1::RegisterModelResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return cache_->RegisterModel(ctx, req, &resp); });
    if (!s.ok()) return s;
    absl::MutexLock lock(&mu_);
    registered_[std::string(model_id)] = layout;
    if (resp.block_bytes() > 0 && resp.layout().block_tokens() > 0) {
      layouts_[std::string(model_id)] =
          LayoutInfo{resp.block_bytes(), resp.layout().block_tokens(), resp.layout()};
    }
    return resp;
  }

  absl::StatusOr<LookupResult> Lookup(std::string_view model_id, std::span<const uint32_t> tokens,
                                      const LookupOptions& options) override {
    // Safe to repeat even with a lease: an unregistered model leased nothing.
    return WithReregistration(model_id, [&] { return LookupOnce(model_id, tokens, options); });
  }

  absl::StatusOr<LookupResult> LookupOnce(std::string_view model_id,
                                          std::span<const uint32_t> tokens,
                                          const LookupOptions& options) {
    v1::LookupRequest req;
    req.set_namespace_(ns_);
    req.set_model_id(std::string(model_id));
    req.mutable_tokens()->Add(tokens.begin(), tokens.end());
    req.set_acquire_lease(options.acquire_lease);
    req.set_accept_lossy(options.accept_lossy);
    SetPrefetch(options, &req);
    if (options.acquire_lease && options.lease_ttl > absl::ZeroDuration()) {
      req.set_lease_ttl_ms(static_cast<uint32_t>(
          std::min<int64_t>(absl::ToInt64Milliseconds(options.lease_ttl), UINT32_MAX)));
    }
    v1::LookupResponse resp;
    // A leasing Lookup pins blocks; repeating it could leak a lease.
    const bool idempotent = !options.acquire_lease;
    auto shm = Shm();
    if (!shm.ok()) return shm.status();
    if (*shm != nullptr) {
      absl::StatusOr<v1::LookupResponse> r =
          ShmCall(idempotent, [&] { return (*shm)->Lookup(req); });
      if (!r.ok()) return r.status();
      return ToLookupResult(*r);
    }
    auto call = [&](grpc::ClientContext* ctx) { return cache_->Lookup(ctx, req, &resp); };
    absl::Status s = idempotent ? CallWithRetry(call) : CallOnce(call);
    if (!s.ok()) return s;
    return ToLookupResult(resp);
  }

  static LookupResult ToLookupResult(const v1::LookupResponse& resp) {
    LookupResult result;
    result.matched_tokens = resp.matched_tokens();
    result.withheld_tokens = resp.withheld_tokens();
    result.blocks.assign(resp.blocks().begin(), resp.blocks().end());
    result.lease_id = resp.lease_id();
    if (resp.lease_id() != 0)
      result.lease_expires = absl::FromUnixMillis(resp.lease_expires_unix_ms());
    return result;
  }

  absl::StatusOr<std::vector<absl::StatusOr<LookupResult>>> BatchLookup(
      std::string_view model_id, std::span<const std::span<const uint32_t>> sequences,
      const LookupOptions& options) override {
    return WithReregistration(model_id,
                              [&] { return BatchLookupOnce(model_id, sequences, options); });
  }

  absl::StatusOr<std::vector<absl::StatusOr<LookupResult>>> BatchLookupOnce(
      std::string_view model_id, std::span<const std::span<const uint32_t>> sequences,
      const LookupOptions& options) {
    v1::BatchLookupRequest req;
    for (std::span<const uint32_t> tokens : sequences) {
      v1::LookupRequest* one = req.add_lookups();
      one->set_namespace_(ns_);
      one->set_model_id(std::string(model_id));
      one->mutable_tokens()->Add(tokens.begin(), tokens.end());
      one->set_acquire_lease(options.acquire_lease);
      one->set_accept_lossy(options.accept_lossy);
      SetPrefetch(options, one);
      if (options.acquire_lease && options.lease_ttl > absl::ZeroDuration()) {
        one->set_lease_ttl_ms(static_cast<uint32_t>(
            std::min<int64_t>(absl::ToInt64Milliseconds(options.lease_ttl), UINT32_MAX)));
      }
    }
    const bool idempotent = !options.acquire_lease;
    v1::BatchLookupResponse resp;
    auto shm = Shm();
    if (!shm.ok()) return shm.status();
    if (*shm != nullptr) {
      absl::StatusOr<v1::BatchLookupResponse> r =
          ShmCall(idempotent, [&] { return (*shm)->BatchLookup(req); });
      if (!r.ok()) return r.status();
      resp = *std::move(r);
    } else {
      auto call = [&](grpc::ClientContext* ctx) { return cache_->BatchLookup(ctx, req, &resp); };
      absl::Status s = idempotent ? CallWithRetry(call) : CallOnce(call);
      if (!s.ok()) return s;
    }
    if (resp.outcomes_size() != req.lookups_size()) {
      return absl::DataLossError(absl::StrCat("BatchLookup: ", req.lookups_size(), " lookups got ",
                                              resp.outcomes_size(), " answers"));
    }
    std::vector<absl::StatusOr<LookupResult>> results;
    results.reserve(resp.outcomes_size());
    bool all_unregistered = resp.outcomes_size() > 0;
    for (const v1::LookupOutcome& o : resp.outcomes()) {
      if (o.code() == 0) {
        results.push_back(ToLookupResult(o.response()));
        all_unregistered = false;
      } else {
        absl::Status error(static_cast<absl::StatusCode>(o.code()), o.message());
        all_unregistered &= IsModelNotRegistered(error);
        results.push_back(std::move(error));
      }
    }
    // Every lookup names the same model: if it is not registered, say so for
    // the whole batch, so WithReregistration can register it and retry.
    if (all_unregistered) return results.front().status();
    return results;
  }

  absl::StatusOr<std::shared_ptr<SharedRegion>> CreateSharedRegion(uint64_t bytes) override {
    auto shm = Shm();
    if (!shm.ok()) return shm.status();
    if (*shm == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the shared-memory data path is not in use for ", options_.target,
          " (it needs a unix:// target or DataPath::kSharedMemory, and a daemon that offers it)"));
    }
    return (*shm)->CreateRegion(bytes);
  }

  bool UsesSharedMemory() override {
    auto shm = Shm();
    return shm.ok() && *shm != nullptr;
  }

  DataPathStats GetDataPathStats() override {
    absl::MutexLock lock(&shm_mu_);
    return shm_stats_;
  }

  absl::StatusOr<bool> ReleaseLease(uint64_t lease_id) override {
    v1::ReleaseLeaseRequest req;
    req.set_lease_id(lease_id);
    v1::ReleaseLeaseResponse resp;
    auto shm = Shm();
    if (!shm.ok()) return shm.status();
    if (*shm != nullptr) {
      return ShmCall(/*idempotent=*/true, [&] { return (*shm)->ReleaseLease(lease_id); });
    }
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return cache_->ReleaseLease(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp.released();
  }

  absl::StatusOr<AppendResult> Append(std::string_view model_id, std::span<const uint32_t> tokens,
                                      std::span<const std::byte> kv,
                                      const AppendOptions& options) override {
    return WithReregistration(model_id, [&] { return AppendOnce(model_id, tokens, kv, options); });
  }

  absl::StatusOr<FetchResult> Fetch(std::string_view model_id, std::span<const uint32_t> tokens,
                                    std::span<std::byte> out,
                                    const FetchOptions& options) override {
    v1::FetchRequest req;
    req.set_namespace_(ns_);
    req.set_model_id(std::string(model_id));
    req.mutable_tokens()->Add(tokens.begin(), tokens.end());
    req.set_accept_lossy(options.accept_lossy);
    return WithReregistration(model_id, [&]() -> absl::StatusOr<FetchResult> {
      auto shm = Shm();
      if (!shm.ok()) return shm.status();
      if (*shm != nullptr) return ShmFetch(**shm, req, out);
      return DoFetch(model_id, req, out);
    });
  }

  absl::StatusOr<FetchResult> FetchLease(std::string_view model_id, uint64_t lease_id,
                                         std::span<std::byte> out,
                                         const FetchOptions& options) override {
    v1::FetchRequest req;
    req.set_namespace_(ns_);
    req.set_model_id(std::string(model_id));
    req.set_lease_id(lease_id);
    req.set_accept_lossy(options.accept_lossy);
    auto shm = Shm();
    if (!shm.ok()) return shm.status();
    if (*shm != nullptr) return ShmFetch(**shm, req, out);
    return DoFetch(model_id, req, out);
  }

  absl::StatusOr<std::vector<FetchedBlock>> FetchBlocks(std::string_view model_id,
                                                        std::span<const uint32_t> tokens,
                                                        bool lossy_as_stored,
                                                        const FetchOptions& options) override {
    return WithReregistration(
        model_id, [&] { return FetchBlocksOnce(model_id, tokens, lossy_as_stored, options); });
  }

  absl::StatusOr<EvictResult> EvictPrefix(std::string_view model_id,
                                          std::span<const uint32_t> tokens) override {
    v1::EvictRequest req;
    req.set_namespace_(ns_);
    req.set_model_id(std::string(model_id));
    req.mutable_prefix()->mutable_tokens()->Add(tokens.begin(), tokens.end());
    return DoEvict(req);
  }

  absl::StatusOr<EvictResult> EvictModel(std::string_view model_id) override {
    v1::EvictRequest req;
    req.set_namespace_(ns_);
    req.set_model_id(std::string(model_id));
    req.set_whole_model(true);
    return DoEvict(req);
  }

  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo() override {
    v1::GetServerInfoRequest req;
    v1::GetServerInfoResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return admin_->GetServerInfo(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::CheckpointResponse> Checkpoint() override {
    v1::CheckpointRequest req;
    v1::CheckpointResponse resp;
    absl::Status s =
        CallOnce([&](grpc::ClientContext* ctx) { return admin_->Checkpoint(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::GetDeviceArenasResponse> GetDeviceArenas() override {
    v1::GetDeviceArenasRequest req;
    v1::GetDeviceArenasResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return cache_->GetDeviceArenas(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::PlaceOnDeviceResponse> PlaceOnDevice(std::string_view model_id,
                                                          std::span<const uint32_t> tokens,
                                                          absl::Duration lease_ttl) override {
    return WithReregistration(model_id, [&]() -> absl::StatusOr<v1::PlaceOnDeviceResponse> {
      v1::PlaceOnDeviceRequest req;
      req.set_namespace_(ns_);
      req.set_model_id(std::string(model_id));
      req.mutable_tokens()->Assign(tokens.begin(), tokens.end());
      req.set_lease_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(lease_ttl)));
      v1::PlaceOnDeviceResponse resp;
      absl::Status s = CallOnce(
          [&](grpc::ClientContext* ctx) { return cache_->PlaceOnDevice(ctx, req, &resp); });
      if (!s.ok()) return s;
      return resp;
    });
  }

  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints() override {
    v1::ListCheckpointsRequest req;
    v1::ListCheckpointsResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return admin_->ListCheckpoints(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::VerifyCheckpointResponse> VerifyCheckpoint(uint64_t sequence) override {
    v1::VerifyCheckpointRequest req;
    req.set_sequence(sequence);
    v1::VerifyCheckpointResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return admin_->VerifyCheckpoint(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::ListModelsResponse> ListModels(std::string_view ns) override {
    v1::ListModelsRequest req;
    req.set_namespace_(std::string(ns));
    v1::ListModelsResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return admin_->ListModels(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::ReportAttentionResponse> ReportAttention(std::string_view model_id,
                                                              std::span<const uint32_t> tokens,
                                                              std::span<const float> attention,
                                                              uint32_t num_layers) override {
    v1::ReportAttentionRequest req;
    req.set_namespace_(options_.ns);
    req.set_model_id(std::string(model_id));
    req.mutable_tokens()->Add(tokens.begin(), tokens.end());
    req.mutable_attention()->Add(attention.begin(), attention.end());
    req.set_num_layers(num_layers);
    v1::ReportAttentionResponse resp;
    absl::Status s = CallOnce(
        [&](grpc::ClientContext* ctx) { return cache_->ReportAttention(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::UpdateModelPolicyResponse> UpdateModelPolicy(
      v1::UpdateModelPolicyRequest req) override {
    if (req.namespace_().empty()) req.set_namespace_(options_.ns);
    v1::UpdateModelPolicyResponse resp;
    absl::Status s = CallOnce(
        [&](grpc::ClientContext* ctx) { return admin_->UpdateModelPolicy(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::UnregisterModelResponse> UnregisterModel(std::string_view model_id) override {
    v1::UnregisterModelRequest req;
    req.set_namespace_(ns_);
    req.set_model_id(std::string(model_id));
    v1::UnregisterModelResponse resp;
    absl::Status s = CallOnce(
        [&](grpc::ClientContext* ctx) { return admin_->UnregisterModel(ctx, req, &resp); });
    if (s.ok() || s.code() == absl::StatusCode::kNotFound) {
      absl::MutexLock lock(&mu_);
      registered_.erase(AsAbsl(model_id));
      layouts_.erase(AsAbsl(model_id));
    }
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::VerifyBlocksProgress> VerifyBlocks(
      const v1::VerifyBlocksRequest& req,
      std::function<bool(const v1::VerifyBlocksProgress&)> on_progress) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
    const std::string request_id = NewRequestId();
    TagCall(&ctx, request_id, options_.token);
    std::unique_ptr<grpc::ClientReader<v1::VerifyBlocksProgress>> reader =
        admin_->VerifyBlocks(&ctx, req);
    v1::VerifyBlocksProgress last;
    v1::VerifyBlocksProgress msg;
    while (reader->Read(&msg)) {
      if (on_progress && !on_progress(msg)) {
        ctx.TryCancel();
        break;
      }
      last = std::move(msg);
    }
    absl::Status s = ToAbslStatus(reader->Finish(), request_id);
    if (!s.ok()) return s;
    return last;
  }

  absl::StatusOr<v1::DumpMemoryResponse> DumpMemory() override {
    v1::DumpMemoryRequest req;
    v1::DumpMemoryResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return admin_->DumpMemory(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::InspectSequenceResponse> InspectSequence(
      v1::InspectSequenceRequest req) override {
    if (req.namespace_().empty()) req.set_namespace_(ns_);
    v1::InspectSequenceResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return admin_->InspectSequence(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::SetLogLevelResponse> SetLogLevel(std::string_view level) override {
    v1::SetLogLevelRequest req;
    req.set_level(std::string(level));
    v1::SetLogLevelResponse resp;
    absl::Status s = CallWithRetry(
        [&](grpc::ClientContext* ctx) { return admin_->SetLogLevel(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::WhoAmIResponse> WhoAmI() override {
    v1::WhoAmIRequest req;
    v1::WhoAmIResponse resp;
    absl::Status s =
        CallWithRetry([&](grpc::ClientContext* ctx) { return admin_->WhoAmI(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

  absl::StatusOr<v1::GetStatsResponse> GetStats() override {
    v1::GetStatsRequest req;
    v1::GetStatsResponse resp;
    absl::Status s =
        CallWithRetry([&](grpc::ClientContext* ctx) { return admin_->GetStats(ctx, req, &resp); });
    if (!s.ok()) return s;
    return resp;
  }

 private:
  // The daemon's answer naming its shared-memory socket: ClientOptions'
  // shm_socket, or one short GetServerInfo (a daemon that does not answer now
  // is served, and retried, by the gRPC path, which would otherwise wait twice).
  absl::StatusOr<v1::GetServerInfoResponse> ProbeShmSocket() {
    v1::GetServerInfoResponse info;
    if (!options_.shm_socket.empty()) {
      info.set_shm_socket(options_.shm_socket);
      return info;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + std::min(options_.timeout, kShmProbeTimeout)));
    const std::string request_id = NewRequestId();
    TagCall(&ctx, request_id, options_.token);
    const absl::Status probed =
        ToAbslStatus(admin_->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info), request_id);
    if (!probed.ok()) return probed;
    return info;
  }

  // The shared-memory transport data calls use, or nullptr for gRPC. Opened
  // on first use (one GetServerInfo names the socket). Under kAuto a daemon
  // that does not offer it (or cannot be reached) means gRPC, probed again
  // after kShmProbeInterval; under kSharedMemory it is an error. The probe's
  // I/O runs outside shm_mu_: while one thread probes, kAuto callers go over
  // gRPC and kSharedMemory callers wait for its outcome.
  absl::StatusOr<internal::ShmTransport*> Shm() {
    if (options_.data_path == DataPath::kGrpc) return nullptr;
    const bool required = options_.data_path == DataPath::kSharedMemory;
    if (!required && !absl::StartsWith(options_.target, "unix:")) return nullptr;
    {
      absl::MutexLock lock(&shm_mu_);
      for (;;) {
        if (shm_ != nullptr) return shm_.get();  // set once, never reset
        if (!required && (shm_probing_ || absl::Now() < shm_next_probe_)) {
          ++shm_stats_.grpc_fallbacks;
          return nullptr;
        }
        if (!shm_probing_) break;
        shm_mu_.Await(absl::Condition(
            +[](bool* probing) { return !*probing; }, &shm_probing_));
      }
      shm_probing_ = true;
      ++shm_stats_.shm_probes;
    }
    absl::Status why;
    bool offered = false;  // the daemon named a socket we could not use
    std::shared_ptr<internal::ShmTransport> opened;
    absl::StatusOr<v1::GetServerInfoResponse> info = ProbeShmSocket();
    if (!info.ok()) {
      why = info.status();
    } else if (info->shm_socket().empty()) {
      why = absl::FailedPreconditionError(
          absl::StrCat("kvcached at ", options_.target,
                       " offers no shared-memory data plane (listen.shm_socket is \"none\")"));
    } else {
      offered = true;
      auto open = internal::ShmTransport::Open({.socket_path = info->shm_socket(),
                                                .max_connections = options_.max_shm_connections,
                                                .staging_bytes = options_.shm_staging_bytes,
                                                .timeout = options_.timeout,
                                                .token = options_.token});
      if (open.ok()) {
        opened = *std::move(open);
      } else {
        why = open.status();
      }
    }
    bool warn = false;
    {
      absl::MutexLock lock(&shm_mu_);
      shm_probing_ = false;
      if (opened != nullptr) {
        shm_ = std::move(opened);
        shm_stats_.shared_memory = true;
        shm_stats_.fallback_reason.clear();
        return shm_.get();
      }
      shm_stats_.fallback_reason = why.ToString();
      if (required) return why;
      shm_next_probe_ = absl::Now() + kShmProbeInterval;
      ++shm_stats_.grpc_fallbacks;
      warn = offered && !shm_warned_;
      shm_warned_ |= warn;
    }
    if (warn) {
      // Once per client: the daemon offers shared memory and this worker
      // cannot use it (permissions, a token it refuses), which costs every
      // data call a copy through gRPC. Later fallbacks are counted in
      // GetDataPathStats(), not written.
      std::fprintf(stderr,
                   "kvcache client: the shared-memory data plane %s is offered but not usable "
                   "(%s); data calls use gRPC (GetDataPathStats() counts them)\n",
                   info->shm_socket().c_str(), why.ToString().c_str());
    }
    return nullptr;
  }

  // Runs a shared-memory call; an idempotent one is repeated on UNAVAILABLE
  // (a broken connection is replaced by a fresh one) as CallWithRetry does.
  template <typename F>
  auto ShmCall(bool idempotent, F&& call) -> decltype(call()) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    absl::Duration backoff = kInitialBackoff;
    for (int i = 1;; ++i) {
      auto result = call();
      if (result.ok() || !absl::IsUnavailable(result.status()) || !idempotent ||
          i >= options_.max_attempts) {
        return result;
      }
      const absl::Duration sleep = Jitter(backoff);
      if (absl::Now() + sleep >= deadline) return result;
      absl::SleepFor(sleep);
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  absl::StatusOr<FetchResult> ShmFetch(internal::ShmTransport& shm, const v1::FetchRequest& req,
                                       std::span<std::byte> out) {
    v1::FetchIntoRequest into;
    into.set_namespace_(req.namespace_());
    into.set_model_id(req.model_id());
    *into.mutable_tokens() = req.tokens();
    into.set_lease_id(req.lease_id());
    into.set_accept_lossy(req.accept_lossy());
    return ShmCall(/*idempotent=*/true, [&] { return shm.Fetch(into, out); });
  }

  // Runs `attempt` once under the call deadline, with a new request id.
  template <typename F>
  absl::Status CallOnce(F&& attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
    const std::string request_id = NewRequestId();
    TagCall(&ctx, request_id, options_.token);
    return ToAbslStatus(attempt(&ctx), request_id);
  }

  // Runs `attempt` until it returns anything but UNAVAILABLE, max_attempts
  // times at most, all within one deadline, with jittered exponential backoff.
  // Every attempt carries the same request id, so the daemon's lines about
  // them share it.
  template <typename F>
  absl::Status CallWithRetry(F&& attempt) {
    const absl::Time deadline = absl::Now() + options_.timeout;
    const std::string request_id = NewRequestId();
    absl::Duration backoff = kInitialBackoff;
    for (int i = 1;; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      TagCall(&ctx, request_id, options_.token);
      grpc::Status s = attempt(&ctx);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE || i >= options_.max_attempts) {
        return ToAbslStatus(s, request_id);
      }
      const absl::Duration sleep = Jitter(backoff);
      if (absl::Now() + sleep >= deadline) return ToAbslStatus(s, request_id);
      absl::SleepFor(sleep);
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  absl::Duration Jitter(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    std::uniform_real_distribution<double> dist(0.8, 1.2);
    return d * dist(rng_);
  }

  absl::StatusOr<EvictResult> DoEvict(const v1::EvictRequest& req) {
    v1::EvictResponse resp;
    absl::Status s =
        CallWithRetry([&](grpc::ClientContext* ctx) { return cache_->Evict(ctx, req, &resp); });
    if (!s.ok()) return s;
    return EvictResult{resp.evicted_blocks(), resp.evicted_bytes()};
  }

  // `call` (returning an absl::StatusOr); when it fails because the model is
  // not registered (the daemon restarted) and this client registered the
  // model, registers it again with the remembered layout and calls once more.
  template <typename F>
  auto WithReregistration(std::string_view model_id, F&& call) -> decltype(call()) {
    auto result = call();
    if (result.ok() || !IsModelNotRegistered(result.status())) return result;
    std::optional<v1::ModelLayout> layout;
    {
      absl::MutexLock lock(&mu_);
      auto it = registered_.find(AsAbsl(model_id));
      if (it != registered_.end()) layout = it->second;
    }
    if (!layout.has_value() || !RegisterModel(model_id, *layout).ok()) return result;
    return call();
  }

  static bool IsModelNotRegistered(const absl::Status& s) {
    return s.code() == absl::StatusCode::kNotFound &&
           absl::StrContains(s.message(), "is not registered");
  }

  absl::StatusOr<AppendResult> AppendOnce(std::string_view model_id,
                                          std::span<const uint32_t> tokens,
                                          std::span<const std::byte> kv,
                                          const AppendOptions& options);
  absl::StatusOr<std::vector<FetchedBlock>> FetchBlocksOnce(std::string_view model_id,
                                                            std::span<const uint32_t> tokens,
                                                            bool lossy_as_stored,
                                                            const FetchOptions& options);
  // One Append call: the header, then `kv` in chunks that borrow its bytes.
  grpc::Status StreamAppend(const v1::AppendRequest& header_msg, std::span<const std::byte> kv,
                            const std::string& request_id, internal::AppendEncoder* encoder,
                            v1::AppendResponse* resp);
  absl::StatusOr<FetchResult> DoFetch(std::string_view model_id, v1::FetchRequest& req,
                                      std::span<std::byte> out);
  grpc::Status FetchOnce(grpc::ClientContext* ctx, const v1::FetchRequest& req,
                         std::span<std::byte> out, const LayoutInfo& layout,
                         std::optional<FetchResult>* result, bool* layout_mismatch);

  // The layout of `model_id` in this client's namespace: cached, or asked of
  // the server (ListModels) on first use or when `refresh`.
  absl::StatusOr<LayoutInfo> GetLayout(std::string_view model_id, bool refresh);
  // The namespace calls act in: ClientOptions::ns, or with none the caller's
  // tenant on a daemon with authentication on (WhoAmI, asked once), else
  // "default".
  absl::StatusOr<std::string> EffectiveNamespace();
  void ForgetLayout(std::string_view model_id) {
    absl::MutexLock lock(&mu_);
    layouts_.erase(AsAbsl(model_id));
  }

  const ClientOptions options_;
  const std::string ns_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Cache::Stub> cache_;
  const std::unique_ptr<v1::Admin::Stub> admin_;
  // Fetch and Append are called raw (grpc::ByteBuffer), the way the
  // generated stub calls them but without protobuf copies of the payload.
  const grpc::internal::RpcMethod fetch_method_;
  const grpc::internal::RpcMethod append_method_;

  absl::Mutex shm_mu_;
  std::shared_ptr<internal::ShmTransport> shm_ ABSL_GUARDED_BY(shm_mu_);
  absl::Time shm_next_probe_ ABSL_GUARDED_BY(shm_mu_) = absl::InfinitePast();
  bool shm_probing_ ABSL_GUARDED_BY(shm_mu_) = false;  // a thread probes, without the lock
  bool shm_warned_ ABSL_GUARDED_BY(shm_mu_) = false;   // the fallback was written once
  DataPathStats shm_stats_ ABSL_GUARDED_BY(shm_mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, LayoutInfo> layouts_ ABSL_GUARDED_BY(mu_);
  std::string default_ns_ ABSL_GUARDED_BY(mu_);  // EffectiveNamespace() with ns_ empty
  // The layouts this client registered, to register again after a restart.
  absl::flat_hash_map<std::string, v1::ModelLayout> registered_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::string> ClientImpl::EffectiveNamespace() {
  if (!ns_.empty()) return ns_;
  {
    absl::MutexLock lock(&mu_);
    if (!default_ns_.empty()) return default_ns_;
  }
  // A daemon with authentication on gives a worker its tenant's namespace.
  absl::StatusOr<v1::WhoAmIResponse> who = WhoAmI();
  std::string ns;
  if (who.ok()) {
    ns = who->tenant() == "*" ? std::string(kDefaultNamespace) : who->tenant();
  } else if (who.status().code() == absl::StatusCode::kUnimplemented) {
    ns = std::string(kDefaultNamespace);  // a daemon older than WhoAmI
  } else {
    return who.status();
  }
  absl::MutexLock lock(&mu_);
  default_ns_ = ns;
  return ns;
}

absl::StatusOr<LayoutInfo> ClientImpl::GetLayout(std::string_view model_id, bool refresh) {
  if (!refresh) {
    absl::MutexLock lock(&mu_);
    auto it = layouts_.find(AsAbsl(model_id));
    if (it != layouts_.end()) return it->second;
  }
  absl::StatusOr<std::string> effective = EffectiveNamespace();
  if (!effective.ok()) return effective.status();
  const std::string_view ns = *effective;
  absl::StatusOr<v1::ListModelsResponse> models = ListModels(ns);
  if (!models.ok()) return models.status();
  for (const v1::ModelInfo& m : models->models()) {
    const std::string_view m_ns = m.namespace_().empty() ? kDefaultNamespace : m.namespace_();
    if (m.model_id() != model_id || m_ns != ns) continue;
    if (m.block_bytes() == 0 || m.layout().block_tokens() == 0) {
      return absl::InternalError(absl::StrCat("ListModels reports model '", AsAbsl(model_id),
                                              "' with block_bytes=", m.block_bytes(),
                                              " block_tokens=", m.layout().block_tokens()));
    }
    LayoutInfo info{m.block_bytes(), m.layout().block_tokens(), m.layout()};
    absl::MutexLock lock(&mu_);
    layouts_[std::string(model_id)] = info;
    return info;
  }
  return absl::NotFoundError(absl::StrCat("model '", AsAbsl(model_id),
                                          "' is not registered in namespace '", AsAbsl(ns), "'"));
}

absl::StatusOr<AppendResult> ClientImpl::AppendOnce(std::string_view model_id,
                                                    std::span<const uint32_t> tokens,
                                                    std::span<const std::byte> kv,
                                                    const AppendOptions& options) {
  v1::AppendRequest header_msg;
  v1::AppendHeader& header = *header_msg.mutable_header();
  header.set_namespace_(ns_);
  header.set_model_id(std::string(model_id));
  header.mutable_tokens()->Add(tokens.begin(), tokens.end());
  header.set_start_token(options.start_token);
  *header.mutable_hints() = options.hints;

  if (options.send_checksums) {
    absl::StatusOr<LayoutInfo> layout = GetLayout(model_id, /*refresh=*/false);
    if (!layout.ok()) return layout.status();
    const uint64_t rest =
        tokens.size() > options.start_token ? tokens.size() - options.start_token : 0;
    const uint64_t blocks = rest / layout->block_tokens;
    if (kv.size() != blocks * layout->block_bytes) {
      // The cached layout may be stale (the model was registered anew).
      layout = GetLayout(model_id, /*refresh=*/true);
      if (!layout.ok()) return layout.status();
    }
    const uint64_t want = rest / layout->block_tokens * layout->block_bytes;
    if (kv.size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("Append: kv holds ", kv.size(), " bytes but tokens[", options.start_token,
                       ":] (", rest, " tokens) has ", rest / layout->block_tokens,
                       " whole blocks of ", layout->block_bytes, " bytes = ", want, " bytes"));
    }
    header.mutable_block_checksums()->Reserve(static_cast<int>(rest / layout->block_tokens));
    for (uint64_t off = 0; off < kv.size(); off += layout->block_bytes) {
      header.add_block_checksums(BlockChecksum(kv.subspan(off, layout->block_bytes)));
    }
  }

  auto forget_stale_layout = [&](const absl::Status& s) {
    if (s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kInvalidArgument ||
        s.code() == absl::StatusCode::kDataLoss) {
      ForgetLayout(model_id);  // in case the layout we split by is stale
    }
  };
  auto shm = Shm();
  if (!shm.ok()) return shm.status();
  if (*shm != nullptr) {
    absl::StatusOr<v1::AppendResponse> resp = (*shm)->Append(header, kv);
    if (!resp.ok()) {
      forget_stale_layout(resp.status());
      return resp.status();
    }
    return ToAppendResult(*resp);
  }

  v1::AppendResponse resp;
  internal::AppendEncoder encoder;
  const std::string request_id = NewRequestId();
  absl::Status s =
      ToAbslStatus(StreamAppend(header_msg, kv, request_id, &encoder, &resp), request_id);
  // gRPC lets go of the chunks (slices over `kv`) as the call ends, or, when
  // a socket write was in flight as it failed, once that write completes.
  // Wait for it, so the caller may reuse `kv` when Append returns; a socket
  // that stays stuck longer than kBorrowGrace can at worst still send some
  // of these bytes on a stream that has ended.
  encoder.WaitUntilReleased(kBorrowGrace);
  if (!s.ok()) {
    forget_stale_layout(s);
    return s;
  }
  return ToAppendResult(resp);
}

AppendResult ToAppendResult(const v1::AppendResponse& resp) {
  return AppendResult{.stored_blocks = resp.stored_blocks(),
                      .deduplicated_blocks = resp.deduplicated_blocks(),
                      .stored_bytes = resp.stored_bytes(),
                      .cached_tokens = resp.cached_tokens(),
                      .conflicting_blocks = resp.conflicting_blocks(),
                      .first_conflicting_block = resp.first_conflicting_block(),
                      .restored_blocks = resp.restored_blocks(),
                      .pending_blocks = resp.pending_blocks()};
}

grpc::Status ClientImpl::StreamAppend(const v1::AppendRequest& header_msg,
                                      std::span<const std::byte> kv, const std::string& request_id,
                                      internal::AppendEncoder* encoder, v1::AppendResponse* resp) {
  grpc::ByteBuffer header_bytes;
  bool own_buffer;
  grpc::Status s = grpc::SerializationTraits<v1::AppendRequest>::Serialize(
      header_msg, &header_bytes, &own_buffer);
  if (!s.ok()) return s;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  TagCall(&ctx, request_id, options_.token);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel_.get(), append_method_,
                                                                    &ctx, resp));
  // The last message half-closes the stream in the same write.
  const grpc::WriteOptions more;
  const grpc::WriteOptions last = grpc::WriteOptions().set_last_message();
  bool ok = writer->Write(header_bytes, kv.empty() ? last : more);
  const uint64_t chunk =
      std::min(options_.append_chunk_bytes, options_.max_message_bytes - kMessageOverhead);
  for (uint64_t off = 0; ok && off < kv.size(); off += chunk) {
    const uint64_t n = std::min<uint64_t>(chunk, kv.size() - off);
    ok = writer->Write(encoder->KvChunk(kv.subspan(off, n)), off + n == kv.size() ? last : more);
  }
  // A failed Write means the stream is broken; Finish() says why.
  return writer->Finish();
}

grpc::Status ClientImpl::FetchOnce(grpc::ClientContext* ctx, const v1::FetchRequest& req,
                                   std::span<std::byte> out, const LayoutInfo& layout,
                                   std::optional<FetchResult>* result, bool* layout_mismatch) {
  internal::FetchAssembler assembler(out, layout.block_bytes, layout.block_tokens);
  // Read raw: the payload goes from gRPC's slices into `out`, with no
  // protobuf string in between.
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), fetch_method_,
                                                                    ctx, req));
  grpc::ByteBuffer msg;
  std::vector<grpc::Slice> slices;
  internal::FetchChunk chunk;
  absl::Status local;
  uint64_t withheld = 0;
  while (reader->Read(&msg)) {
    slices.clear();
    if (!msg.Dump(&slices).ok()) {
      local = absl::InternalError("Fetch: cannot read a response's bytes");
      break;
    }
    local = internal::DecodeFetchResponse(slices, &chunk);
    if (!local.ok()) break;
    withheld = chunk.withheld_tokens;
    local = assembler.Add(chunk);
    if (!local.ok()) break;
  }
  if (!local.ok()) {
    ctx->TryCancel();
    reader->Finish().IgnoreError();
    *layout_mismatch = assembler.layout_mismatch();
    return grpc::Status(static_cast<grpc::StatusCode>(local.code()), std::string(local.message()));
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return s;
  local = assembler.Finish();
  if (!local.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(local.code()), std::string(local.message()));
  }
  *result = assembler.result();
  // Lossy blocks the request did not accept: said on every message, and in
  // the trailers for a stream that carried none.
  (*result)->withheld_tokens = withheld;
  const auto& trailers = ctx->GetServerTrailingMetadata();
  if (auto it = trailers.find("kvcache-withheld-tokens"); it != trailers.end()) {
    uint64_t withheld_trailer = 0;
    const char* end = it->second.data() + it->second.size();
    if (std::from_chars(it->second.data(), end, withheld_trailer).ptr == end) {
      (*result)->withheld_tokens = withheld_trailer;
    }
  }
  return grpc::Status::OK;
}

// A FetchBlocks block's first chunk: its encoding must be one the fetch
// asked for, and its declared size one the layout allows.
absl::Status CheckFetchedBlock(const v1::FetchResponse& msg, const LayoutInfo& layout,
                               bool lossy_as_stored) {
  const bool asked = msg.encoding() == v1::BLOCK_ENCODING_RAW ||
                     msg.encoding() == v1::BLOCK_ENCODING_DEQUANTIZED ||
                     (lossy_as_stored && msg.encoding() == v1::BLOCK_ENCODING_COMPRESSED);
  if (!asked) {
    return absl::DataLossError(absl::StrCat("Fetch: block ", msg.block_index(),
                                            " arrived in encoding ", msg.encoding(),
                                            ", which this fetch did not ask for"));
  }
  if (msg.encoding() != v1::BLOCK_ENCODING_COMPRESSED && msg.block_bytes() != layout.block_bytes) {
    // A raw or decoded block has exactly the layout's size; another size
    // means the layout this client knows is stale.
    return absl::FailedPreconditionError(
        absl::StrCat("Fetch: server sends blocks of ", msg.block_bytes(),
                     " bytes but the model's layout has ", layout.block_bytes));
  }
  const uint64_t most =
      internal::MaxFetchedBlockBytes(layout.layout, layout.block_bytes, msg.encoding());
  if (msg.block_bytes() == 0 || msg.block_bytes() > most) {
    return absl::DataLossError(absl::StrCat("Fetch: block ", msg.block_index(), " declares ",
                                            msg.block_bytes(),
                                            " bytes; a compressed block of this layout takes "
                                            "1 to ",
                                            most));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FetchedBlock>> ClientImpl::FetchBlocksOnce(
    std::string_view model_id, std::span<const uint32_t> tokens, bool lossy_as_stored,
    const FetchOptions& options) {
  if (lossy_as_stored && !options.accept_lossy) {
    return absl::InvalidArgumentError(
        "FetchBlocks: lossy_as_stored needs FetchOptions::accept_lossy (the lossy opt-in)");
  }
  v1::FetchRequest req;
  req.set_namespace_(ns_);
  req.set_model_id(std::string(model_id));
  req.mutable_tokens()->Add(tokens.begin(), tokens.end());
  req.set_accept_lossy(options.accept_lossy);
  req.set_lossy_as_stored(lossy_as_stored);
  // The layout bounds what a block may declare, before anything is reserved.
  absl::StatusOr<LayoutInfo> layout = GetLayout(model_id, /*refresh=*/false);
  if (!layout.ok()) return layout.status();
  std::vector<FetchedBlock> blocks;
  uint64_t checksum = 0, block_bytes = 0;
  absl::Status data = absl::OkStatus();
  absl::Status rpc = CallOnce([&](grpc::ClientContext* ctx) {
    std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader = cache_->Fetch(ctx, req);
    v1::FetchResponse msg;
    while (data.ok() && reader->Read(&msg)) {
      const bool first = msg.offset() == 0;
      if (first) {
        if (!blocks.empty() && blocks.back().bytes.size() != block_bytes) {
          data = absl::DataLossError("Fetch: a block ended early");
          break;
        }
        if (msg.block_index() != blocks.size()) {
          data = absl::DataLossError(absl::StrCat("Fetch: expected block ", blocks.size(),
                                                  ", got block ", msg.block_index()));
          break;
        }
        if (absl::Status s = CheckFetchedBlock(msg, *layout, lossy_as_stored); !s.ok()) {
          data = s;
          if (s.code() == absl::StatusCode::kFailedPrecondition) ForgetLayout(model_id);
          break;
        }
        blocks.push_back({.index = msg.block_index(),
                          .encoding = msg.encoding(),
                          .kept_tokens = {msg.kept_tokens().begin(), msg.kept_tokens().end()}});
        blocks.back().bytes.reserve(msg.block_bytes());
        checksum = msg.block_checksum();
        block_bytes = msg.block_bytes();
      } else if (blocks.empty() || msg.block_index() != blocks.back().index ||
                 msg.offset() != blocks.back().bytes.size() || msg.block_bytes() != block_bytes) {
        data = absl::DataLossError("Fetch: a chunk out of order");
        break;
      }
      FetchedBlock& b = blocks.back();
      if (msg.data().size() > block_bytes - b.bytes.size()) {
        data = absl::DataLossError("Fetch: a chunk overruns its block");
        break;
      }
      b.bytes += msg.data();
      if (b.bytes.size() == block_bytes &&
          BlockChecksum(std::as_bytes(std::span(b.bytes.data(), b.bytes.size()))) != checksum) {
        data = absl::DataLossError(
            absl::StrCat("Fetch: block ", b.index, " does not match its checksum"));
      }
    }
    if (!data.ok()) ctx->TryCancel();
    return reader->Finish();
  });
  if (!data.ok()) return data;
  if (!rpc.ok()) return rpc;
  if (!blocks.empty() && blocks.back().bytes.size() != block_bytes) {
    return absl::DataLossError("Fetch: the stream ended inside a block");
  }
  return blocks;
}

absl::StatusOr<FetchResult> ClientImpl::DoFetch(std::string_view model_id, v1::FetchRequest& req,
                                                std::span<std::byte> out) {
  const uint64_t max_chunk = options_.max_message_bytes - kMessageOverhead;
  req.set_max_chunk_bytes(static_cast<uint32_t>(std::min<uint64_t>(max_chunk, UINT32_MAX)));
  for (int layout_try = 0;; ++layout_try) {
    absl::StatusOr<LayoutInfo> layout = GetLayout(model_id, /*refresh=*/layout_try > 0);
    if (!layout.ok()) return layout.status();
    std::optional<FetchResult> result;
    bool layout_mismatch = false;
    absl::Status s = CallWithRetry([&](grpc::ClientContext* ctx) {
      return FetchOnce(ctx, req, out, *layout, &result, &layout_mismatch);
    });
    if (layout_mismatch && layout_try == 0) continue;  // layout changed: refresh once
    if (!s.ok()) return s;
    return *result;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("ClientOptions.target is empty");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions.timeout must be positive, is ",
                                                   absl::FormatDuration(options.timeout)));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.max_attempts must be >= 1, is ", options.max_attempts));
  }
  if (options.max_message_bytes < 2 * kMessageOverhead || options.max_message_bytes > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions.max_message_bytes must be in [",
                                                   2 * kMessageOverhead, ", ", INT_MAX, "], is ",
                                                   options.max_message_bytes));
  }
  if (options.append_chunk_bytes == 0) {
    return absl::InvalidArgumentError("ClientOptions.append_chunk_bytes must be positive");
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  // Each Client gets its own connection, so several clients in one process
  // (threads of a worker, the benchmark) do not share one TCP stream.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A fetch stream may receive a whole large value before it waits for a
  // window update (HTTP/2's default is 64 KiB; the daemon uses the same).
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentialsOf(options);
  if (!credentials.ok()) return credentials.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.target, *credentials, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create a channel to '", options.target, "'"));
  }
  return std::make_unique<ClientImpl>(options, std::move(channel));
}

uint64_t BlockChecksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace kvcache
