// ShmTransport: the client's side of the shared-memory data plane
// (kvcache/v1/shm.proto), used for workers on the daemon's host.
//
// It keeps a pool of connections to the daemon's shm socket (one request at
// a time each; a thread takes a connection for a call and gives it back) and
// the SharedRegions the caller created. A region is attached lazily on each
// connection that uses it (region ids are per connection) and detached from
// all of them when the caller drops it. Each connection also has a staging
// region of its own for buffers that lie outside every SharedRegion: the
// daemon copies into staging and the client copies on to the caller's
// buffer (one extra memcpy; buffers inside a SharedRegion need none).
//
// Fetch verifies every block's XXH3-64 where it landed in the caller's
// buffer; a mismatch is DATA_LOSS. A connection that fails (daemon gone,
// deadline) is closed and replaced on the next call: the calls here are not
// retried; the caller decides.
//
// Thread-safe.
#ifndef KVCACHE_CLIENT_SRC_SHM_TRANSPORT_H_
#define KVCACHE_CLIENT_SRC_SHM_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvcache/client.h"
#include "kvcache/v1/shm.pb.h"

namespace kvcache::internal {

struct ShmTransportOptions {
  std::string socket_path;
  int max_connections = 16;
  uint64_t staging_bytes = uint64_t{64} << 20;
  absl::Duration timeout = absl::Seconds(30);  // per call, on the socket
  std::string token;  // sent in each connection's hello; empty: the daemon goes by our uid
};

class ShmTransport : public std::enable_shared_from_this<ShmTransport> {
 public:
  // Connects once (and says hello) to check the daemon serves the socket.
  // UNAVAILABLE when it cannot connect; FAILED_PRECONDITION for a daemon
  // that speaks another protocol version or refuses this process.
  static absl::StatusOr<std::shared_ptr<ShmTransport>> Open(const ShmTransportOptions& options);
  ~ShmTransport();

  // A sealed memfd of `bytes` bytes (rounded up to a page), mapped here.
  absl::StatusOr<std::shared_ptr<SharedRegion>> CreateRegion(uint64_t bytes);

  // The calls: answers of the daemon, or its error as a status.
  absl::StatusOr<v1::LookupResponse> Lookup(const v1::LookupRequest& request);
  absl::StatusOr<v1::BatchLookupResponse> BatchLookup(const v1::BatchLookupRequest& request);
  absl::StatusOr<bool> ReleaseLease(uint64_t lease_id);
  // Fetches into `out` (the destination of `request` is filled in here).
  // INVALID_ARGUMENT when `out` cannot hold the cached prefix.
  absl::StatusOr<FetchResult> Fetch(v1::FetchIntoRequest request, std::span<std::byte> out);
  // Appends `kv` with `header` (whose block_checksums the caller filled, or not).
  absl::StatusOr<v1::AppendResponse> Append(const v1::AppendHeader& header,
                                            std::span<const std::byte> kv);

 private:
  class Region;
  struct Connection;
  struct Lent;  // a connection taken from the pool for one call

  explicit ShmTransport(const ShmTransportOptions& options);

  absl::StatusOr<std::unique_ptr<Connection>> Connect();
  absl::StatusOr<Lent> Take();
  void GiveBack(std::unique_ptr<Connection> connection);
  // One request and its answer on `c`; an I/O failure marks it broken.
  absl::StatusOr<v1::ShmResponse> Call(Connection& c, const v1::ShmRequest& request, int fd = -1);
  // The id of `region` on `c`, attaching it first if needed.
  absl::StatusOr<uint64_t> AttachedId(Connection& c, Region& region);
  // `bytes` of `c`'s staging region (grown as needed) and its id on `c`.
  absl::StatusOr<std::pair<std::span<std::byte>, uint64_t>> Staging(Connection& c, uint64_t bytes);
  // The region holding all of `span`, or nullptr.
  Region* FindRegion(const std::byte* data, size_t size);
  // Called as a Region dies: detaches it from every connection (idle ones at
  // once, busy ones when given back), with no lock held during the I/O.
  void Forget(uint64_t serial);

  const ShmTransportOptions options_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_ ABSL_GUARDED_BY(mu_);
  std::vector<Connection*> busy_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;  // idle + busy + being opened
  // Live regions by base address.
  absl::btree_map<uintptr_t, Region*> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache::internal

#endif  // KVCACHE_CLIENT_SRC_SHM_TRANSPORT_H_
