// kvcache::Client: the C++ client library inference workers use to talk to kvcached.
//
// One Client holds one gRPC channel to one daemon (TCP "host:port" or
// "unix:///path/to.sock") and acts in one namespace. It is thread-safe: any
// number of threads may call any method at once. Every call has a deadline
// (ClientOptions::timeout unless the call says otherwise). Only idempotent
// calls are retried on UNAVAILABLE (RegisterModel, Lookup without a lease,
// Fetch, ReleaseLease, Evict, the read-only admin calls). A leasing Lookup is
// never retried on UNAVAILABLE (a retry could leave an orphan lease), nor is
// Append (a retry resends the whole payload; dedup makes it safe, so the
// caller may choose to).
//
// Every byte a Fetch hands back has been verified against the XXH3-64 checksum
// the server recorded when the block was appended (and which Append computed
// and sent from the caller's bytes), so a returned OK means the bytes are
// exactly those some worker appended. A mismatch is DATA_LOSS. Blocks the
// importance policy stored lossy (INT8 or pruned tokens) are returned only to
// a caller that opts in (accept_lossy); otherwise a lookup or fetch ends
// before the first of them and withheld_tokens says how many cached tokens
// that left out.
//
// The daemon keeps everything in memory: after it restarts, its models and
// cached blocks are gone. The client remembers the layout of every model it
// registered; when Lookup, Fetch, FetchBlocks or Append is answered NOT_FOUND
// because the model "is not registered", it registers the model again with
// that layout and retries the call once (the first attempt changed nothing on
// the server, so repeating it is safe). The cache starts empty, so the
// retried call usually finds nothing cached. Other calls (FetchLease: its
// lease died with the daemon; ReportAttention; Evict; the admin calls) return
// the NOT_FOUND. UnregisterModel forgets the remembered layout.
//
// Data path. A worker on the daemon's host moves KV through shared memory
// instead of gRPC (docs/api.md, "Same-host shared memory"): the client hands
// the daemon a memfd of its own (CreateSharedRegion, or a staging region per
// connection), and the daemon copies blocks straight into it (Fetch,
// FetchLease) or out of it (Append); Lookup, BatchLookup and ReleaseLease go
// over the same socket. With DataPath::kAuto (the default) a client whose
// target is "unix://..." uses it whenever the daemon offers it (its
// GetServerInfo names the socket) and gRPC otherwise; kSharedMemory insists
// on it (FAILED_PRECONDITION when the daemon offers none), kGrpc never uses
// it. Buffers inside a SharedRegion cost no copy on the client; others one
// memcpy through the staging region. Verification is the same on both paths.
// A kAuto client that falls back to gRPC although the daemon offers shared
// memory (it cannot connect, or is refused) writes one line to stderr, once;
// GetDataPathStats() counts every fallback and says why the last probe failed.
//
// Errors are absl::Status values carrying the server's gRPC code and message.
#ifndef KVCACHE_CLIENT_CLIENT_H_
#define KVCACHE_CLIENT_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvcache/v1/admin.pb.h"
#include "kvcache/v1/kvcache.pb.h"

namespace kvcache {

// How Lookup, Fetch, FetchLease, Append, BatchLookup and ReleaseLease reach
// the daemon (see above).
enum class DataPath { kAuto, kGrpc, kSharedMemory };

struct ClientOptions {
  std::string target = "localhost:50051";  // or "unix:///tmp/kvcached.sock"
  std::string ns;                          // namespace; empty means "default"
  absl::Duration timeout = absl::Seconds(30);
  int max_attempts = 3;                             // for idempotent calls
  uint64_t max_message_bytes = uint64_t{64} << 20;  // must match the server's limit
  uint64_t append_chunk_bytes = uint64_t{1} << 20;  // size of kv_chunk messages
  DataPath data_path = DataPath::kAuto;
  // Shared-memory path: connections at most (one call at a time each), and
  // the staging region each connection keeps for buffers outside every
  // SharedRegion (it grows to fit a larger call).
  int max_shm_connections = 16;
  uint64_t shm_staging_bytes = uint64_t{64} << 20;
  // The shared-memory socket's path; empty: asked of the daemon (one
  // GetServerInfo). A worker that authenticates by its uid on that socket
  // alone, with no token for gRPC, names it here.
  std::string shm_socket;
  // A bearer token sent with every call ("authorization: Bearer <token>", and
  // in the shared-memory hello) to a daemon with authentication on
  // (docs/security.md); empty: none.
  std::string token;
  // TLS to a TCP target. tls_ca_file: the PEM CA bundle the daemon's
  // certificate must chain to; set, the channel speaks TLS. tls_cert_file and
  // tls_key_file: this client's certificate and key for mutual TLS.
  // tls_server_name: the name the daemon's certificate must carry, when it is
  // not the target's host.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
};

// Which path this client's data calls take (see "Data path" above).
struct DataPathStats {
  bool shared_memory = false;   // data calls go over shared memory now
  uint64_t shm_probes = 0;      // attempts to open the shared-memory path
  uint64_t grpc_fallbacks = 0;  // kAuto data calls (and checks) that went to gRPC instead
  std::string fallback_reason;  // why the last attempt failed; empty once one succeeded
};

// Memory this client shares with a daemon on the same host (a sealed memfd,
// mapped in both). Fetch into it and Append from it move KV with one copy, by
// the daemon. A worker may register it with its GPU runtime (e.g.
// cudaHostRegister(bytes().data(), ...)) so the GPU DMAs from it. It stays
// valid while the caller holds it, even after the Client is gone; it must
// outlive every call using it.
class SharedRegion {
 public:
  virtual ~SharedRegion() = default;
  virtual std::span<std::byte> bytes() const = 0;
};

struct LookupOptions {
  bool acquire_lease = false;
  absl::Duration lease_ttl = absl::ZeroDuration();  // zero: server default
  bool accept_lossy = false;  // match blocks stored lossy too (docs/importance.md)
  // Blocks only the SSD tier holds: leave them to Fetch (NONE), start reading
  // them back (BEST_EFFORT), or read them back before answering (WAIT, for at
  // most prefetch_timeout; zero: as long as it takes). docs/tiers.md.
  v1::PrefetchMode prefetch = v1::PREFETCH_NONE;
  absl::Duration prefetch_timeout = absl::ZeroDuration();
};

struct LookupResult {
  uint64_t matched_tokens = 0;
  uint64_t withheld_tokens = 0;  // cached past matched_tokens, left out: lossy
  std::vector<v1::BlockDescriptor> blocks;
  uint64_t lease_id = 0;  // 0: no lease
  absl::Time lease_expires = absl::InfinitePast();
};

struct AppendOptions {
  uint64_t start_token = 0;  // block-aligned, not beyond the cached prefix
  v1::AppendHints hints;
  // Send each block's XXH3-64 (BlockChecksum) so the server verifies every
  // block. A daemon with its default configuration
  // (security.require_block_checksums) refuses an append without them with
  // INVALID_ARGUMENT; false is only for daemons configured to accept them.
  bool send_checksums = true;
};

struct AppendResult {
  uint32_t stored_blocks = 0;
  uint32_t deduplicated_blocks = 0;
  uint64_t stored_bytes = 0;
  uint64_t cached_tokens = 0;
  // Blocks that were cached with other bytes than this append carried (the
  // cached copy is kept; docs/api.md), and the first of them (-1: none).
  uint32_t conflicting_blocks = 0;
  int64_t first_conflicting_block = -1;
  uint32_t restored_blocks = 0;  // lossy blocks made exact again by these bytes
  uint32_t pending_blocks = 0;   // being stored by another append in flight
};

struct FetchOptions {
  // Also fetch blocks stored lossy, decoded to the model's layout (INT8
  // dequantized, pruned tokens zero). Without it the fetch ends before the
  // first lossy block.
  bool accept_lossy = false;
};

struct FetchResult {
  uint64_t matched_tokens = 0;
  uint32_t blocks = 0;
  uint64_t bytes = 0;  // bytes written to the output
  // Blocks the server decoded from its compressed format (INT8 tokens
  // dequantized; docs/importance.md): lossy, as the model's policy allows.
  uint32_t dequantized_blocks = 0;
  // Cached tokens past matched_tokens not fetched because they are stored
  // lossy and FetchOptions::accept_lossy was false.
  uint64_t withheld_tokens = 0;
  // Empty when no block lost tokens to pruning. Otherwise one entry per
  // block: the block-local positions of the tokens it holds (the pruned
  // ones read as zeros in `out`), or an empty entry for a whole block.
  std::vector<std::vector<uint32_t>> kept_tokens;
};

// One block of a FetchBlocks stream, as the server sent it.
struct FetchedBlock {
  uint32_t index = 0;
  v1::BlockEncoding encoding = v1::BLOCK_ENCODING_RAW;
  std::string bytes;                  // verified against the block's checksum
  std::vector<uint32_t> kept_tokens;  // set when the block lost tokens to pruning
};

struct EvictResult {
  uint64_t evicted_blocks = 0;
  uint64_t evicted_bytes = 0;
};

class Client {
 public:
  // Creates the channel; does not wait for the server to be up.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  virtual ~Client() = default;

  // Waits until the channel is connected or `timeout` passes (UNAVAILABLE).
  virtual absl::Status WaitForReady(absl::Duration timeout) = 0;

  // Registers the model and remembers `layout` for re-registering it after a
  // daemon restart (see above).
  virtual absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      std::string_view model_id, const v1::ModelLayout& layout) = 0;

  virtual absl::StatusOr<LookupResult> Lookup(std::string_view model_id,
                                              std::span<const uint32_t> tokens,
                                              const LookupOptions& options = {}) = 0;

  // Looks up each sequence as Lookup would, in one call; each entry is that
  // sequence's result or error. INVALID_ARGUMENT past 4096 sequences.
  virtual absl::StatusOr<std::vector<absl::StatusOr<LookupResult>>> BatchLookup(
      std::string_view model_id, std::span<const std::span<const uint32_t>> sequences,
      const LookupOptions& options = {}) = 0;

  // A region of at least `bytes` bytes shared with the daemon (see
  // SharedRegion). FAILED_PRECONDITION when the shared-memory path is not in
  // use (DataPath::kGrpc, a TCP target under kAuto, a daemon without it).
  virtual absl::StatusOr<std::shared_ptr<SharedRegion>> CreateSharedRegion(uint64_t bytes) = 0;
  // Whether data calls go over shared memory now (probing the daemon once).
  virtual bool UsesSharedMemory() = 0;
  // How data calls have travelled so far; answers from memory, no call.
  virtual DataPathStats GetDataPathStats() = 0;

  // OK with *released=false when the lease had already expired.
  virtual absl::StatusOr<bool> ReleaseLease(uint64_t lease_id) = 0;

  // Appends the KV of the whole blocks of tokens[options.start_token:].
  // REQUIRES: kv.size() == whole_blocks * block_bytes (the server checks it).
  virtual absl::StatusOr<AppendResult> Append(std::string_view model_id,
                                              std::span<const uint32_t> tokens,
                                              std::span<const std::byte> kv,
                                              const AppendOptions& options = {}) = 0;

  // Fetches the KV of the longest cached prefix of `tokens` into `out`, block
  // after block. INVALID_ARGUMENT (and nothing useful in `out`) when `out` is
  // smaller than the prefix; DATA_LOSS when a checksum does not match.
  virtual absl::StatusOr<FetchResult> Fetch(std::string_view model_id,
                                            std::span<const uint32_t> tokens,
                                            std::span<std::byte> out,
                                            const FetchOptions& options = {}) = 0;
  // As Fetch, for exactly the blocks a Lookup leased.
  virtual absl::StatusOr<FetchResult> FetchLease(std::string_view model_id, uint64_t lease_id,
                                                 std::span<std::byte> out,
                                                 const FetchOptions& options = {}) = 0;

  // Fetches the cached prefix of `tokens` block by block, each as sent. Blocks
  // the importance policy compressed come only with options.accept_lossy (the
  // one lossy opt-in): decoded to the model's layout, or, with
  // `lossy_as_stored` too, in the compressed block format (docs/api.md, about
  // half the bytes). Without accept_lossy the stream ends before the first of
  // them, and `lossy_as_stored` is INVALID_ARGUMENT. Needs the model's
  // layout (cached, or one ListModels call). DATA_LOSS for a block whose
  // bytes do not match its checksum, a stream out of order, a block in an
  // encoding the call did not ask for, or a compressed block declaring more
  // bytes than the format allows for the layout; FAILED_PRECONDITION (and the
  // cached layout forgotten) for a raw block of another size than the
  // layout's. Every refusal comes before memory is reserved for the block.
  // Not retried.
  virtual absl::StatusOr<std::vector<FetchedBlock>> FetchBlocks(
      std::string_view model_id, std::span<const uint32_t> tokens, bool lossy_as_stored,
      const FetchOptions& options = {}) = 0;

  virtual absl::StatusOr<EvictResult> EvictPrefix(std::string_view model_id,
                                                  std::span<const uint32_t> tokens) = 0;
  virtual absl::StatusOr<EvictResult> EvictModel(std::string_view model_id) = 0;

  virtual absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo() = 0;
  virtual absl::StatusOr<v1::ListModelsResponse> ListModels(std::string_view ns = "") = 0;
  virtual absl::StatusOr<v1::GetStatsResponse> GetStats() = 0;
  // Who the daemon takes this client to be (principal, tenant, role).
  virtual absl::StatusOr<v1::WhoAmIResponse> WhoAmI() = 0;

  // Reports the attention mass each token of `tokens` received (num_layers
  // rows of tokens.size() values, or one row when num_layers is 0). Not
  // retried: a report applied twice would count twice.
  virtual absl::StatusOr<v1::ReportAttentionResponse> ReportAttention(
      std::string_view model_id, std::span<const uint32_t> tokens, std::span<const float> attention,
      uint32_t num_layers = 0) = 0;
  // Changes a model's compression mode / weights / target mass (namespace
  // and model_id of `request` are used as given; an empty namespace means
  // the client's).
  virtual absl::StatusOr<v1::UpdateModelPolicyResponse> UpdateModelPolicy(
      v1::UpdateModelPolicyRequest request) = 0;
  // Removes a model in this client's namespace: its cached blocks, leases and
  // registration (so it can be registered again with another layout), and
  // forgets its layout here. NOT_FOUND for an unknown model. Not retried.
  virtual absl::StatusOr<v1::UnregisterModelResponse> UnregisterModel(
      std::string_view model_id) = 0;

  // Checkpoints (docs/checkpoints.md). Checkpoint takes one now and answers
  // once it is committed (give the client a timeout that allows for it); not
  // retried. VerifyCheckpoint reads one back (sequence 0: the newest).
  virtual absl::StatusOr<v1::CheckpointResponse> Checkpoint() = 0;
  virtual absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints() = 0;
  virtual absl::StatusOr<v1::VerifyCheckpointResponse> VerifyCheckpoint(uint64_t sequence) = 0;

  // The operator's view (docs/operations.md). VerifyBlocks streams the
  // daemon's progress to `on_progress` (return false to stop; the call then
  // ends CANCELLED) and returns the last message (done set when the walk
  // finished); its deadline is the client's timeout. Not retried.
  // InspectSequence uses the request's namespace, or the client's when empty.
  // SetLogLevel with an empty level only reads it.
  virtual absl::StatusOr<v1::VerifyBlocksProgress> VerifyBlocks(
      const v1::VerifyBlocksRequest& request,
      std::function<bool(const v1::VerifyBlocksProgress&)> on_progress = nullptr) = 0;
  virtual absl::StatusOr<v1::DumpMemoryResponse> DumpMemory() = 0;
  virtual absl::StatusOr<v1::InspectSequenceResponse> InspectSequence(
      v1::InspectSequenceRequest request) = 0;
  virtual absl::StatusOr<v1::SetLogLevelResponse> SetLogLevel(std::string_view level) = 0;

  // The GPU tier (docs/tiers.md, "The GPU tier"): the daemon's device arenas
  // (an empty device_kind when it has none), and placing the exact cached
  // prefix of `tokens` in them, leased (release it with ReleaseLease).
  // DeviceSession (device_session.h) maps the arenas and does the
  // device-to-device copies. PlaceOnDevice is not retried (a retry could
  // leave an orphan lease); FAILED_PRECONDITION without a GPU tier.
  virtual absl::StatusOr<v1::GetDeviceArenasResponse> GetDeviceArenas() = 0;
  virtual absl::StatusOr<v1::PlaceOnDeviceResponse> PlaceOnDevice(
      std::string_view model_id, std::span<const uint32_t> tokens,
      absl::Duration lease_ttl = absl::ZeroDuration()) = 0;
};

// XXH3-64 of `bytes`: the checksum kvcached records for a block.
uint64_t BlockChecksum(std::span<const std::byte> bytes);

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_CLIENT_H_
