// The daemon's read-only status pages, served next to /metrics on
// listen.metrics_address (docs/status_page.md):
//
//   /status            version and uptime, the configuration, the tiers and
//                      their usage, the models and their policies, the top
//                      prefixes by uses and by bytes, recent warnings and
//                      errors, recent tier moves, and the attention map of
//                      the most used prefix
//   /status/attention  the attention map of one cached sequence:
//                      ?ns=NS&model=ID&key=FIRST_BLOCK_KEY (hex), or
//                      ?model=NS/ID&key=... (the namespace ends at the
//                      first '/')
//
// Server-rendered HTML with inline CSS and SVG, no scripts (the pages send a
// Content-Security-Policy that forbids them). Every string from the cache or
// the config is HTML-escaped. Token ids appear only with
// StatusPageOptions::show_tokens; otherwise the pages show keys, counts and
// scores. Elements carry stable ids (#version, #config, #tiers, #models,
// #top-prefixes, #recent-errors, #recent-migrations, #attention) for tests
// and for operators' scrapers.
//
// Per-tenant detail: the models table, the top prefixes (their first-block
// keys), the attention maps (/status and /status/attention), recent tier
// moves (block keys) and recent warnings and errors (which name namespaces
// and models). StatusPageOptions::may_see_detail decides per request who sees
// it; the daemon lets only admins of every namespace (a bearer token) see it
// when authentication is on (docs/security.md). Others get the rest of
// /status with a note in #tenant-detail, and 401 from /status/attention
// whatever the query names (so the answer reveals nothing of what is cached).
//
// The pages read everything through a StatusSource (plain values), so they
// are rendered and tested without a cache; CacheStatusSource
// (cache_status_source.h) is the daemon's. Rendering is thread-safe when the
// source is.
#ifndef KVCACHE_SERVER_STATUS_STATUS_PAGE_H_
#define KVCACHE_SERVER_STATUS_STATUS_PAGE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvcache/v1/admin.pb.h"
#include "server/core/cache_inspection.h"
#include "server/core/cache_stats.h"
#include "server/core/layout.h"
#include "server/core/memory_breakdown.h"
#include "server/http/http_server.h"
#include "server/status/event_log.h"

namespace kvcache {

// Who is serving: shown in #version.
struct StatusIdentity {
  std::string version;
  std::string git_revision;
  absl::Time start_time;
  std::vector<std::string> listen_addresses;
  bool cuda_built = false;
};

// What the pages show, as plain values. Implementations must be thread-safe:
// requests are served on several threads.
class StatusSource {
 public:
  virtual ~StatusSource() = default;
  virtual StatusIdentity Identity() const = 0;
  // The configuration in effect, as JSON text.
  virtual std::string ConfigJson() const = 0;
  virtual CacheStats Stats() const = 0;
  // The daemon's memory, part by part (the "Memory" section); nullopt: none.
  virtual std::optional<MemoryBreakdown> Memory() const { return std::nullopt; }
  // The tier shared with other daemons (the "Remote tier" section);
  // nullopt: it is off.
  virtual std::optional<v1::RemoteTierStatus> RemoteTier() const { return std::nullopt; }
  // The `limit` prefixes used most (ties: more bytes first).
  virtual std::vector<PrefixSummary> TopPrefixes(size_t limit) const = 0;
  // Newest first.
  virtual std::vector<LoggedMessage> RecentErrors() const = 0;
  virtual std::vector<LoggedMove> RecentMoves() const = 0;
  // The most used cached sequence that begins with the block of chain key
  // `first_block_key`, with per-head maps when the model has them.
  virtual absl::StatusOr<SequenceInspection> InspectPrefix(const ModelKey& model,
                                                           uint64_t first_block_key) const = 0;
};

struct StatusPageOptions {
  bool show_tokens = false;  // status_page.show_tokens
  // Rows of each top-prefix table, and how many prefixes are asked for to
  // rank by bytes among them.
  size_t top_prefixes = 20;
  size_t ranked_prefixes = 1024;
  // The attention map draws at most this many tokens of a sequence.
  size_t max_map_tokens = 8192;
  // Render the per-tenant detail (RenderStatusPage).
  bool tenant_detail = true;
  // Whether a request may see the per-tenant detail (ServeStatusPages);
  // unset: every request may.
  std::function<bool(const HttpRequest&)> may_see_detail;
};

// The /status page. `now` dates the uptime and ages.
std::string RenderStatusPage(const StatusSource& source, const StatusPageOptions& options,
                             absl::Time now);

// The /status/attention page of `model`'s sequence at `first_block_key`
// (`sequence`, as StatusSource::InspectPrefix returned it): its attention
// map and blocks, or what went wrong (a sequence no longer cached).
std::string RenderAttentionPage(const StatusPageOptions& options, const ModelKey& model,
                                uint64_t first_block_key,
                                const absl::StatusOr<SequenceInspection>& sequence);

// Serves /status and /status/attention on `server`: 200 with the page; for
// the attention page 401 (before the query is read) for a request that may
// not see per-tenant detail, 400 for a malformed query and 404 for a model or
// sequence not cached. REQUIRES: `source` stays callable while `server`
// serves (it is shared with the handlers).
void ServeStatusPages(HttpServer& server, std::shared_ptr<const StatusSource> source,
                      StatusPageOptions options);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_STATUS_STATUS_PAGE_H_
