#include "server/status/status_page.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/core/importance_policy.h"
#include "server/status/attention_map.h"
#include "server/status/html.h"

namespace kvcache {
namespace {

// No scripts, no remote anything: styles inline, images inline.
constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'";

constexpr char kStyle[] = R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.5em; margin: 0 0 .2em; } h2 { font-size: 1.15em; margin: 1.4em 0 .4em;
  border-bottom: 2px solid #3b528b; } h3 { font-size: 1em; margin: .8em 0 .3em; }
nav a { margin-right: 1em; } table { border-collapse: collapse; margin: .3em 0; }
th, td { border: 1px solid #ccc; padding: 2px 7px; text-align: left; vertical-align: top; }
th { background: #eef1f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bar { width: 320px; height: 16px; background: #e6e6e6; border: 1px solid #999;
  position: relative; } .bar .used { position: absolute; left: 0; top: 0; bottom: 0;
  background: #9ecae1; } .bar .payload { position: absolute; left: 0; top: 4px; bottom: 4px;
  background: #08519c; } dl { display: grid; grid-template-columns: max-content auto;
  gap: 2px 1.2em; margin: 0; } dt { font-weight: 600; } dd { margin: 0; }
pre { background: #f6f6f6; border: 1px solid #ddd; padding: .6em; overflow: auto;
  max-height: 40em; } .empty, .note { color: #666; } .level-error, .level-critical { color: #b00; }
.level-warning { color: #a60; } code { font-size: 13px; }
)css";

std::string Head(std::string_view title) {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", HtmlEscape(title),
      "</title><style>", kStyle, "</style></head><body><header><h1>", HtmlEscape(title),
      "</h1><nav><a href=\"/status\">status</a><a href=\"/metrics\">metrics</a></nav></header>\n");
}

std::string AttentionLink(const ModelKey& model, uint64_t key) {
  return HtmlEscape(absl::StrCat("/status/attention?ns=", UrlEncode(model.ns),
                                 "&model=", UrlEncode(model.model_id), "&key=", KeyText(key)));
}

std::string Num(uint64_t v) { return absl::StrCat("<td class=\"num\">", v, "</td>"); }
std::string Cell(std::string_view text) { return absl::StrCat("<td>", HtmlEscape(text), "</td>"); }

void AppendVersion(const StatusIdentity& id, absl::Time now, std::string* out) {
  absl::StrAppend(out, "<section id=\"version\"><h2>Version</h2><dl>", "<dt>version</dt><dd>",
                  HtmlEscape(id.version), "</dd><dt>git revision</dt><dd>",
                  HtmlEscape(id.git_revision), "</dd><dt>started</dt><dd>", TimeText(id.start_time),
                  "</dd><dt>uptime</dt><dd>", DurationText(now - id.start_time),
                  "</dd><dt>listening on</dt><dd>",
                  HtmlEscape(absl::StrJoin(id.listen_addresses, ", ")),
                  "</dd><dt>CUDA built</dt><dd>", id.cuda_built ? "yes" : "no",
                  "</dd><dt>page rendered</dt><dd>", TimeText(now), "</dd></dl></section>\n");
}

// A tier's row: its usage bar (used of capacity, payload inside it) and numbers.
void AppendTierRow(std::string_view name, uint64_t capacity, uint64_t used, uint64_t payload,
                   uint64_t blocks, std::string* out) {
  const double cap = capacity > 0 ? static_cast<double>(capacity) : 1;
  absl::StrAppend(out, "<tr class=\"tier\" data-tier=\"", HtmlEscape(name), "\">", Cell(name),
                  "<td><div class=\"bar\" title=\"", Percent(used / cap), " used\">",
                  "<div class=\"used\" style=\"width: ", Percent(used / cap), "\"></div>",
                  "<div class=\"payload\" style=\"width: ", Percent(payload / cap),
                  "\"></div></div></td><td class=\"num\">", BytesText(used), " / ",
                  BytesText(capacity), " (", Percent(used / cap), ")</td><td class=\"num\">",
                  BytesText(payload), "</td>", Num(blocks), "</tr>");
}

void AppendTiers(const CacheStats& s, std::string* out) {
  out->append(
      "<section id=\"tiers\"><h2>Tiers</h2><table><tr><th>tier</th><th>usage</th><th>used / "
      "capacity</th><th>payload</th><th>blocks</th></tr>");
  AppendTierRow("host", s.host_pool.capacity_bytes, s.host_pool.reserved_bytes, s.payload_bytes,
                s.blocks, out);
  for (size_t level = 0; level < s.lower_stores.size(); ++level) {
    const TierStats& store = s.lower_stores[level];
    AppendTierRow(store.kind.empty() ? "lower" : store.kind, store.capacity_bytes,
                  store.allocated_bytes, store.payload_bytes, s.tiers.lower[level].blocks, out);
  }
  uint64_t demotions = 0, promotions = 0;
  for (const LowerLevelCounters& level : s.tiers.lower) {
    demotions += level.demotions;
    promotions += level.promotions;
  }
  if (s.has_device) {
    AppendTierRow("gpu", s.device_store.capacity_bytes, s.device_store.allocated_bytes,
                  s.device_store.payload_bytes, s.tiers.device_blocks, out);
  }
  absl::StrAppend(
      out, "</table><p>Dark: payload bytes of cached blocks; light: memory reserved. ",
      s.active_leases, " active leases holding ", s.lease_tokens, " tokens; ",
      BytesText(s.metadata_bytes), " of index metadata; ", BytesText(s.staged_bytes),
      " staged by appends in flight; ", s.capacity_evictions, " capacity evictions, ",
      s.rejected_appends, " rejected appends",
      s.has_lower() ? absl::StrCat("; ", demotions, " demotions, ", promotions, " promotions") : "",
      ".</p></section>\n");
}

void AppendModels(const CacheStats& s, std::string* out) {
  out->append("<section id=\"models\"><h2>Models</h2>");
  if (s.models.empty()) {
    out->append("<p class=\"empty\">No model is registered.</p></section>\n");
    return;
  }
  out->append(
      "<table><tr><th>namespace</th><th>model</th><th>layout</th><th>blocks</th><th>tokens</"
      "th><th>bytes</th><th>hit / miss tokens</th><th>compression</th><th>weights &#945; "
      "&#946; &#947;</th><th>target mass</th><th>compressed blocks</th><th>bytes "
      "saved</th><th>attention reports</th></tr>");
  for (const ModelStats& m : s.models) {
    const auto& p = m.policy;
    absl::StrAppend(
        out, "<tr class=\"model\">", Cell(m.model.ns), Cell(m.model.model_id),
        Cell(m.layout.ToString()), Num(m.blocks), Num(m.tokens), "<td class=\"num\">",
        BytesText(m.bytes), "</td><td class=\"num\">", m.hit_tokens, " / ", m.miss_tokens, "</td>",
        Cell(std::string(CompressionModeName(p.mode).data(), CompressionModeName(p.mode).size())),
        "<td class=\"num\">",
        absl::StrFormat("%.2f %.2f %.2f", p.params.alpha, p.params.beta, p.params.gamma),
        "</td><td class=\"num\">", absl::StrFormat("%.3f", p.target_mass), "</td>",
        Num(m.compressed_blocks), "<td class=\"num\">", BytesText(m.bytes_saved), "</td>",
        Num(m.attention_reports), "</tr>");
  }
  out->append("</table></section>\n");
}

void AppendPrefixTable(const char* id, const char* caption,
                       const std::vector<PrefixSummary>& prefixes, size_t rows, bool show_tokens,
                       absl::Time now, std::string* out) {
  absl::StrAppend(out, "<h3>", caption, "</h3><table id=\"", id,
                  "\"><tr><th>namespace</th><th>model</th><th>first block</th><th>uses</"
                  "th><th>bytes</th><th>blocks</th><th>depth</th><th>last used</th>",
                  show_tokens ? "<th>first tokens</th>" : "", "</tr>");
  for (size_t i = 0; i < std::min(rows, prefixes.size()); ++i) {
    const PrefixSummary& p = prefixes[i];
    absl::StrAppend(out, "<tr class=\"prefix\">", Cell(p.model.ns), Cell(p.model.model_id),
                    "<td><a class=\"attention-link\" href=\"", AttentionLink(p.model, p.key),
                    "\"><code>", KeyText(p.key), "</code></a></td>", Num(p.references),
                    "<td class=\"num\">", BytesText(p.bytes), "</td>", Num(p.blocks), Num(p.depth),
                    "<td>",
                    p.last_access == absl::InfinitePast()
                        ? std::string("-")
                        : absl::StrCat(DurationText(now - p.last_access), " ago"),
                    "</td>");
    if (show_tokens) {
      absl::StrAppend(out, "<td class=\"tokens\"><code>", HtmlEscape(TokensText(p.first_tokens)),
                      "</code></td>");
    }
    out->append("</tr>");
  }
  out->append("</table>");
}

void AppendTopPrefixes(const std::vector<PrefixSummary>& by_uses, const StatusPageOptions& options,
                       absl::Time now, std::string* out) {
  out->append("<section id=\"top-prefixes\"><h2>Top prefixes</h2>");
  if (by_uses.empty()) {
    out->append("<p class=\"empty\">Nothing is cached.</p></section>\n");
    return;
  }
  std::vector<PrefixSummary> by_bytes = by_uses;
  std::stable_sort(
      by_bytes.begin(), by_bytes.end(),
      [](const PrefixSummary& a, const PrefixSummary& b) { return a.bytes > b.bytes; });
  absl::StrAppend(out,
                  "<p>Cached sequences grouped by their first block; uses count the lookups, "
                  "fetches and appends of the blocks below it. Ranked by bytes among the ",
                  by_uses.size(), " most used.</p>");
  AppendPrefixTable("top-prefixes-by-uses", "By uses", by_uses, options.top_prefixes,
                    options.show_tokens, now, out);
  AppendPrefixTable("top-prefixes-by-bytes", "By bytes", by_bytes, options.top_prefixes,
                    options.show_tokens, now, out);
  out->append("</section>\n");
}

std::string PolicySummary(const SequenceInspection& s) {
  const auto mode = CompressionModeName(s.policy.mode);
  return absl::StrFormat(
      "%d tokens cached in %d blocks (%s); %d attention reports; compression %s, weights "
      "%.2f/%.2f/%.2f",
      s.matched_tokens, s.blocks.size(), s.layout.ToString(), s.attention_reports,
      std::string(mode.data(), mode.size()), s.policy.params.alpha, s.policy.params.beta,
      s.policy.params.gamma);
}

void AppendAttention(const StatusSource& source, const std::vector<PrefixSummary>& top,
                     const StatusPageOptions& options, std::string* out) {
  out->append("<section id=\"attention\"><h2>Attention map</h2>");
  out->append(
      "<form method=\"get\" action=\"/status/attention\">Sequence of namespace <input "
      "name=\"ns\" size=\"12\"> model <input name=\"model\" size=\"16\"> first block key <input "
      "name=\"key\" size=\"18\" placeholder=\"hex\"> <button>show</button></form>");
  if (top.empty()) {
    out->append("<p class=\"empty\">Nothing is cached.</p></section>\n");
    return;
  }
  const PrefixSummary& hottest = top.front();
  absl::StatusOr<SequenceInspection> s = source.InspectPrefix(hottest.model, hottest.key);
  absl::StrAppend(out, "<p>The most used prefix: ", HtmlEscape(hottest.model.ToString()),
                  " at <a href=\"", AttentionLink(hottest.model, hottest.key), "\"><code>",
                  KeyText(hottest.key), "</code></a>");
  if (!s.ok()) {
    absl::StrAppend(out, ": ", HtmlEscape(s.status().ToString()), "</p></section>\n");
    return;
  }
  absl::StrAppend(out, ", ", HtmlEscape(PolicySummary(*s)), ".</p>",
                  RenderAttentionMap(*s, {.show_tokens = options.show_tokens,
                                          .max_tokens = options.max_map_tokens}),
                  "</section>\n");
}

void AppendRecentErrors(const std::vector<LoggedMessage>& messages, std::string* out) {
  out->append("<section id=\"recent-errors\"><h2>Recent warnings and errors</h2>");
  if (messages.empty()) {
    out->append("<p class=\"empty\">None since the daemon started.</p></section>\n");
    return;
  }
  out->append("<table><tr><th>time</th><th>level</th><th>message</th></tr>");
  for (const LoggedMessage& m : messages) {
    absl::StrAppend(out, "<tr class=\"event level-", HtmlEscape(m.level), "\">",
                    Cell(TimeText(m.when)), Cell(m.level), Cell(m.text), "</tr>");
  }
  out->append("</table></section>\n");
}

void AppendRecentMoves(const std::vector<LoggedMove>& moves, std::string* out) {
  out->append("<section id=\"recent-migrations\"><h2>Recent tier moves</h2>");
  if (moves.empty()) {
    out->append("<p class=\"empty\">No block has moved between tiers.</p></section>\n");
    return;
  }
  out->append(
      "<table><tr><th>time</th><th>block key</th><th>from</th><th>to</th><th>reason</"
      "th><th>bytes</th><th>took</th></tr>");
  for (const LoggedMove& m : moves) {
    absl::StrAppend(out, "<tr class=\"move\">", Cell(TimeText(m.when)), "<td><code>",
                    KeyText(m.key), "</code></td>", Cell(m.from), Cell(m.to), Cell(m.reason),
                    Num(m.bytes), Cell(DurationText(m.took)), "</tr>");
  }
  out->append("</table></section>\n");
}

void AppendConfig(const std::string& json, std::string* out) {
  absl::StrAppend(out,
                  "<section id=\"config\"><h2>Configuration</h2><details><summary>The "
                  "configuration in effect (JSON)</summary><pre>",
                  HtmlEscape(json), "</pre></details></section>\n");
}

void AppendBlocks(const SequenceInspection& s, std::string* out) {
  out->append(
      "<h3>Blocks</h3><table id=\"blocks\"><tr><th>index</th><th>key</th><th>host</th><th>lower "
      "tier</th><th>stored</th><th>stored bytes</th><th>raw bytes</th><th>importance</th></tr>");
  for (const InspectedBlock& b : s.blocks) {
    absl::StrAppend(out, "<tr class=\"block\">", Num(b.index), "<td><code>", KeyText(b.key),
                    "</code></td>", Cell(b.in_host ? "yes" : "no"), Cell(b.in_lower ? "yes" : "no"),
                    Cell(b.format_version == 0 ? std::string("raw")
                                               : absl::StrCat("compressed v", b.format_version,
                                                              b.lossy ? " (lossy)" : "")),
                    Num(b.stored_bytes), Num(b.raw_bytes), "<td class=\"num\">",
                    absl::StrFormat("%.3f", b.importance), "</td></tr>");
  }
  out->append("</table>");
}

// The key of ?key=: up to 16 hex digits, with or without 0x.
std::optional<uint64_t> ParseKey(std::string text) {
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) text.erase(0, 2);
  if (text.empty() || text.size() > 16) return std::nullopt;
  uint64_t key = 0;
  for (char c : text) {
    const int digit = absl::ascii_isdigit(c) ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return std::nullopt;
    key = key * 16 + static_cast<uint64_t>(digit);
  }
  return key;
}

HttpResponse Html(int status, std::string body) {
  HttpResponse r{
      .status = status, .content_type = "text/html; charset=utf-8", .body = std::move(body)};
  r.headers.emplace_back("Content-Security-Policy", kContentSecurityPolicy);
  r.headers.emplace_back("X-Frame-Options", "DENY");
  r.headers.emplace_back("Referrer-Policy", "no-referrer");
  return r;
}

HttpResponse BadQuery(std::string_view why) {
  return Html(400, absl::StrCat(Head("kvcached: bad request"), "<p id=\"error\">", HtmlEscape(why),
                                "</p></body></html>\n"));
}

// Where per-tenant detail would be, for a viewer who may not see it.
constexpr std::string_view kDetailHidden =
    "<section id=\"tenant-detail\"><h2>Tenants</h2><p>Models, top prefixes, attention maps, "
    "tier moves and recent errors are shown to admins of every namespace only: send "
    "<code>Authorization: Bearer &lt;token&gt;</code> (docs/security.md).</p></section>\n";

bool MaySeeDetail(const StatusPageOptions& options, const HttpRequest& request) {
  return !options.may_see_detail || options.may_see_detail(request);
}

HttpResponse Unauthorized() {
  HttpResponse r = Html(401, absl::StrCat(Head("kvcached: authentication required"),
                                          "<p id=\"error\">Attention maps are shown to admins of "
                                          "every namespace only: send Authorization: Bearer "
                                          "&lt;token&gt;.</p></body></html>\n"));
  r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"kvcached\"");
  return r;
}

HttpResponse ServeAttention(const StatusSource& source, const StatusPageOptions& options,
                            const HttpRequest& request) {
  // Before the query is even read: the answer must not depend on it.
  if (!MaySeeDetail(options, request)) return Unauthorized();
  std::optional<std::string> ns = request.Param("ns");
  std::optional<std::string> model = request.Param("model");
  std::optional<std::string> key_text = request.Param("key");
  if (!model.has_value() || model->empty() || !key_text.has_value()) {
    return BadQuery("Name a sequence: ?ns=NAMESPACE&model=MODEL&key=FIRST_BLOCK_KEY (hex).");
  }
  ModelKey key_of{.ns = ns.value_or(""), .model_id = *model};
  if (!ns.has_value()) {  // model=NS/ID
    const size_t slash = model->find('/');
    if (slash == std::string::npos) {
      return BadQuery("model is not NAMESPACE/MODEL; or give ns= and model= apart.");
    }
    key_of = {.ns = model->substr(0, slash), .model_id = model->substr(slash + 1)};
  }
  std::optional<uint64_t> key = ParseKey(*key_text);
  if (!key.has_value()) return BadQuery("key is not a block key (up to 16 hex digits).");
  absl::StatusOr<SequenceInspection> s = source.InspectPrefix(key_of, *key);
  // A key no cached sequence begins with inspects as an empty sequence.
  const int status = !s.ok()                  ? (absl::IsNotFound(s.status()) ? 404 : 500)
                     : s->matched_tokens == 0 ? 404
                                              : 200;
  return Html(status, RenderAttentionPage(options, key_of, *key, s));
}

}  // namespace

// The daemon's own memory against its bound, and each part of it.
void AppendMemory(const MemoryBreakdown& m, std::string* out) {
  const double own = m.own_bytes > 0 ? static_cast<double>(m.own_bytes) : 1;
  absl::StrAppend(out, "<section id=\"memory\"><h2>Memory</h2><p>Own memory ",
                  BytesText(m.own_bytes), " of a bound of ", BytesText(m.bound_bytes),
                  m.over_bound() ? " <strong>(over the bound)</strong>" : "", " (VmRSS ",
                  BytesText(m.process.vm_rss_bytes), " minus ",
                  BytesText(m.process.rss_shmem_bytes), " of workers' shared memory); ",
                  m.process.threads, " threads, ", m.shm_connections,
                  " shared-memory connections, ", m.malloc_trims,
                  " allocator trims.</p><table><tr><th>part</th><th>bytes</th><th>share</th></tr>");
  for (size_t i = 0; i < kMemoryParts; ++i) {
    const std::string name(MemoryPartName(static_cast<MemoryPart>(i)));
    absl::StrAppend(out, "<tr class=\"memory-part\" data-part=\"", name, "\">", Cell(name),
                    "<td class=\"num\">", BytesText(m.parts[i]), "</td><td class=\"num\">",
                    Percent(static_cast<double>(m.parts[i]) / own), "</td></tr>");
  }
  out->append("</table></section>\n");
}

// The tier shared with other daemons: where it is, whether it is usable, and
// how its blocks went.
void AppendRemoteTier(const v1::RemoteTierStatus& r, std::string* out) {
  const uint64_t misses =
      r.read_misses_absent() + r.read_misses_unreadable() + r.read_misses_unavailable();
  absl::StrAppend(
      out, "<section id=\"remote-tier\"><h2>Remote tier</h2><dl><dt>cluster</dt><dd>",
      HtmlEscape(absl::StrJoin(r.seeds(), ", ")), "</dd><dt>breaker</dt><dd>",
      r.breaker_open() ? "<strong>open</strong> (the cluster is skipped for now)" : "closed",
      "</dd><dt>writes</dt><dd>", r.blocks_written(), " blocks written, ", r.write_queue_blocks(),
      " queued, ", r.writes_dropped(), " dropped, ", r.writes_failed(),
      " failed</dd><dt>reads</dt><dd>", r.read_hits(), " hits of ", r.blocks_read(),
      " blocks asked (",
      Percent(r.blocks_read() > 0 ? static_cast<double>(r.read_hits()) / r.blocks_read() : 0),
      "); misses: ", misses, " (", r.read_misses_absent(), " absent, ", r.read_misses_unreadable(),
      " unreadable, ", r.read_misses_unavailable(), " unavailable)</dd><dt>searches</dt><dd>",
      r.searches(), " searches, ", r.searches_dropped(), " dropped; ", r.blocks_adopted(),
      " blocks adopted</dd></dl></section>\n");
}

std::string RenderStatusPage(const StatusSource& source, const StatusPageOptions& options,
                             absl::Time now) {
  const CacheStats stats = source.Stats();
  const std::vector<PrefixSummary> top =
      options.tenant_detail
          ? source.TopPrefixes(std::max(options.ranked_prefixes, options.top_prefixes))
          : std::vector<PrefixSummary>{};
  const std::optional<v1::RemoteTierStatus> remote = source.RemoteTier();
  std::string out = Head("kvcached status");
  absl::StrAppend(
      &out,
      "<nav id=\"sections\"><a href=\"#version\">version</a><a href=\"#tiers\">tiers</a><a "
      "href=\"#memory\">memory</a>",
      remote.has_value() ? "<a href=\"#remote-tier\">remote tier</a>" : "",
      "<a href=\"#models\">models</a><a href=\"#top-prefixes\">top prefixes</a><a "
      "href=\"#attention\">attention</a><a href=\"#recent-errors\">errors</a><a "
      "href=\"#recent-migrations\">tier moves</a><a href=\"#config\">config</a></nav>\n");
  AppendVersion(source.Identity(), now, &out);
  AppendTiers(stats, &out);
  if (const std::optional<MemoryBreakdown> memory = source.Memory(); memory.has_value()) {
    AppendMemory(*memory, &out);
  }
  if (remote.has_value()) AppendRemoteTier(*remote, &out);
  if (options.tenant_detail) {
    AppendModels(stats, &out);
    AppendTopPrefixes(top, options, now, &out);
    AppendAttention(source, top, options, &out);
    AppendRecentErrors(source.RecentErrors(), &out);
    AppendRecentMoves(source.RecentMoves(), &out);
  } else {
    out.append(kDetailHidden);
  }
  AppendConfig(source.ConfigJson(), &out);
  out.append("</body></html>\n");
  return out;
}

std::string RenderAttentionPage(const StatusPageOptions& options, const ModelKey& model,
                                uint64_t first_block_key,
                                const absl::StatusOr<SequenceInspection>& sequence) {
  std::string out = Head("kvcached attention map");
  absl::StrAppend(&out, "<section id=\"attention\"><h2>", HtmlEscape(model.ToString()),
                  " at <code>", KeyText(first_block_key), "</code></h2>");
  if (!sequence.ok()) {
    absl::StrAppend(&out, "<p id=\"error\">", HtmlEscape(sequence.status().ToString()),
                    "</p></section></body></html>\n");
    return out;
  }
  absl::StrAppend(&out, "<p>The most used cached sequence that begins with this block: ",
                  HtmlEscape(PolicySummary(*sequence)), ".</p>",
                  RenderAttentionMap(*sequence, {.show_tokens = options.show_tokens,
                                                 .max_tokens = options.max_map_tokens}));
  AppendBlocks(*sequence, &out);
  out.append("</section></body></html>\n");
  return out;
}

void ServeStatusPages(HttpServer& server, std::shared_ptr<const StatusSource> source,
                      StatusPageOptions options) {
  server.Handle("/status", [source, options](const HttpRequest& request) {
    StatusPageOptions shown = options;
    shown.tenant_detail = options.tenant_detail && MaySeeDetail(options, request);
    return Html(200, RenderStatusPage(*source, shown, absl::Now()));
  });
  server.Handle("/status/attention", [source, options](const HttpRequest& request) {
    return ServeAttention(*source, options, request);
  });
}

}  // namespace kvcache
