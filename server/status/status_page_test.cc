#include "server/status/status_page.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/status/attention_map.h"
#include "server/status/html.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kHostile[] = "<script>alert('x')</script>";
constexpr Token kFirstToken = 987654;  // digits that appear nowhere else on the pages

size_t Count(std::string_view text, std::string_view needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string_view::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// A sequence of `n` tokens with every kind of mark somewhere.
SequenceInspection Sequence(size_t n, bool heads) {
  SequenceInspection s;
  s.layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_tokens = 16};
  s.matched_tokens = n;
  for (size_t b = 0; b * 16 < n; ++b) {
    s.blocks.push_back({.index = static_cast<uint32_t>(b), .key = 0xabc0 + b, .in_host = true});
  }
  for (size_t i = 0; i < n; ++i) {
    s.importance.push_back(static_cast<float>(i) / static_cast<float>(n));
    s.activity.push_back(0.5f);
    s.novelty.push_back(1.0f);
    s.position.push_back(0.25f);
    s.pinned.push_back(i == 1 || i == 2 ? 1 : 0);
    s.is_protected.push_back(i < 4 ? 1 : 0);
    s.precision.push_back(i >= 10 && i < 13   ? StoredPrecision::kInt8
                          : i >= 13 && i < 15 ? StoredPrecision::kInt4
                          : i == 15           ? StoredPrecision::kPruned
                          : i == 16           ? StoredPrecision::kMixed
                                              : StoredPrecision::kFull);
    s.tokens.push_back(kFirstToken + static_cast<Token>(i));
  }
  if (heads) s.head_activity.assign(2 * 2 * n, 0.75f);
  s.attention_reports = 3;
  return s;
}

class FakeSource final : public StatusSource {
 public:
  StatusIdentity Identity() const override {
    return {.version = "1.2.3",
            .git_revision = "abc1234",
            .start_time = absl::FromUnixSeconds(1'700'000'000),
            .listen_addresses = {"127.0.0.1:50051", "unix:/run/kvcached/kvcached.sock"}};
  }
  std::string ConfigJson() const override {
    return absl::StrCat("{\"listen\": {\"tcp_address\": \"", kHostile, "\"}}");
  }
  std::optional<MemoryBreakdown> Memory() const override {
    return BreakDownMemory({.process = {.vm_rss_bytes = memory_rss,
                                        .rss_file_bytes = 20 << 20,
                                        .rss_shmem_bytes = 64 << 20,
                                        .threads = 40},
                            .malloc = {.in_use_bytes = 30 << 20},
                            .capacity_bytes = 1 << 30,
                            .pool_reserved_bytes = 1 << 29,
                            .metadata_bytes = 5 << 20,
                            .shm_connections = 3});
  }
  uint64_t memory_rss = uint64_t{700} << 20;
  CacheStats Stats() const override {
    CacheStats s;
    s.host_pool.capacity_bytes = 1 << 30;
    s.host_pool.reserved_bytes = 1 << 29;
    s.payload_bytes = 1 << 28;
    s.blocks = 42;
    s.lower_stores = {{.kind = "ssd", .capacity_bytes = 4 << 20, .allocated_bytes = 1 << 20}};
    ModelStats m;
    m.model = {.ns = "team", .model_id = kHostile};
    m.layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_tokens = 16};
    m.blocks = 42;
    s.models.push_back(m);
    return s;
  }
  std::vector<PrefixSummary> TopPrefixes(size_t limit) const override {
    std::vector<PrefixSummary> out;
    out.push_back({.model = {.ns = "team", .model_id = kHostile},
                   .key = 0x1234,
                   .blocks = 2,
                   .bytes = 100,
                   .references = 9,
                   .depth = 2,
                   .first_tokens = {kFirstToken, kFirstToken + 1}});
    out.push_back({.model = {.ns = "team", .model_id = "small"},
                   .key = 0x5678,
                   .blocks = 8,
                   .bytes = 5000,
                   .references = 1,
                   .depth = 8});
    if (out.size() > limit) out.resize(limit);
    return out;
  }
  std::vector<LoggedMessage> RecentErrors() const override {
    return {{.when = absl::FromUnixSeconds(1'700'000'100),
             .level = "error",
             .text = absl::StrCat("append failed: ", kHostile)}};
  }
  std::vector<LoggedMove> RecentMoves() const override {
    return {{.when = absl::FromUnixSeconds(1'700'000'200),
             .key = 0xfeed,
             .from = "host",
             .to = "ssd",
             .reason = "pressure",
             .bytes = 4096}};
  }
  absl::StatusOr<SequenceInspection> InspectPrefix(const ModelKey& model,
                                                   uint64_t key) const override {
    if (key == 0x9999) return SequenceInspection{};  // nothing cached below it
    if (key != 0x1234) return absl::NotFoundError("no cached sequence begins with that block");
    last_model = model;
    return Sequence(20, /*heads=*/true);
  }
  mutable ModelKey last_model;
};

TEST(StatusPageTest, HasEverySection) {
  FakeSource source;
  const std::string page =
      RenderStatusPage(source, {}, absl::FromUnixSeconds(1'700'000'000 + 3 * 3600));
  for (const char* id : {"version", "config", "tiers", "memory", "models", "top-prefixes",
                         "recent-errors", "recent-migrations", "attention"}) {
    EXPECT_THAT(page, HasSubstr(absl::StrCat("<section id=\"", id, "\">"))) << id;
  }
  EXPECT_THAT(page, HasSubstr("1.2.3"));
  EXPECT_THAT(page, HasSubstr("abc1234"));
  EXPECT_THAT(page, HasSubstr("3h 0m 0s"));  // uptime
  EXPECT_THAT(page, HasSubstr("pressure"));  // the move
  EXPECT_THAT(page, HasSubstr("000000000000feed"));
  EXPECT_THAT(page, HasSubstr("id=\"top-prefixes-by-uses\""));
  EXPECT_THAT(page, HasSubstr("id=\"top-prefixes-by-bytes\""));
  EXPECT_THAT(page, HasSubstr("/status/attention?ns=team&amp;model=%3Cscript%3E"));
  EXPECT_TRUE(absl::StartsWith(page, "<!DOCTYPE html>"));
}

TEST(StatusPageTest, ShowsTheDaemonsMemoryPartByPartAgainstItsBound) {
  FakeSource source;
  std::string page = RenderStatusPage(source, {}, absl::FromUnixSeconds(1'700'000'000));
  for (size_t i = 0; i < kMemoryParts; ++i) {
    const std::string name(MemoryPartName(static_cast<MemoryPart>(i)));
    EXPECT_THAT(page, HasSubstr(absl::StrCat("data-part=\"", name, "\"")));
  }
  EXPECT_THAT(page, HasSubstr("Own memory 636.00 MiB of a bound of 1.16 GiB"));
  EXPECT_THAT(page, HasSubstr("40 threads, 3 shared-memory connections"));
  EXPECT_THAT(page, Not(HasSubstr("over the bound")));
  source.memory_rss = uint64_t{1400} << 20;  // own 1336 MiB
  page = RenderStatusPage(source, {}, absl::FromUnixSeconds(1'700'000'000));
  EXPECT_THAT(page, HasSubstr("over the bound"));
}

TEST(StatusPageTest, DrawsTierBarsAtTheirUsage) {
  FakeSource source;
  const std::string page = RenderStatusPage(source, {}, absl::Now());
  EXPECT_THAT(page, HasSubstr("data-tier=\"host\""));
  EXPECT_THAT(page, HasSubstr("<div class=\"used\" style=\"width: 50.0%\">"));
  EXPECT_THAT(page, HasSubstr("<div class=\"payload\" style=\"width: 25.0%\">"));
  EXPECT_THAT(page, HasSubstr("data-tier=\"ssd\""));
  EXPECT_THAT(page, HasSubstr("<div class=\"used\" style=\"width: 25.0%\">"));
  EXPECT_THAT(page, Not(HasSubstr("data-tier=\"gpu\"")));
}

TEST(StatusPageTest, EscapesEveryStringFromTheCacheAndTheConfig) {
  FakeSource source;
  const std::string page = RenderStatusPage(source, {.show_tokens = true}, absl::Now());
  EXPECT_THAT(page, Not(HasSubstr("<script")));
  EXPECT_THAT(page, Not(HasSubstr("alert('x')")));
  EXPECT_THAT(page, HasSubstr("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
  // model, two prefix tables, the attention paragraph, the config, the error
  EXPECT_GE(Count(page, "&lt;script&gt;"), 6u);
  const std::string attention = RenderAttentionPage({}, {.ns = "a\"b", .model_id = kHostile}, 1,
                                                    absl::NotFoundError(kHostile));
  EXPECT_THAT(attention, Not(HasSubstr("<script")));
  EXPECT_THAT(attention, HasSubstr("a&quot;b/&lt;script&gt;"));
}

TEST(StatusPageTest, ShowsTokenIdsOnlyWhenAsked) {
  FakeSource source;
  const std::string hidden = RenderStatusPage(source, {}, absl::Now());
  EXPECT_THAT(hidden, Not(HasSubstr(absl::StrCat(kFirstToken))));
  EXPECT_THAT(hidden, Not(HasSubstr("first tokens")));
  const std::string hidden_map = RenderAttentionPage({}, {"team", "m"}, 0x1234, Sequence(20, true));
  EXPECT_THAT(hidden_map, Not(HasSubstr(absl::StrCat(kFirstToken))));

  const std::string shown = RenderStatusPage(source, {.show_tokens = true}, absl::Now());
  EXPECT_THAT(shown, HasSubstr(absl::StrCat(kFirstToken, " ", kFirstToken + 1)));
  const std::string shown_map =
      RenderAttentionPage({.show_tokens = true}, {"team", "m"}, 0x1234, Sequence(20, true));
  EXPECT_THAT(shown_map, HasSubstr(absl::StrCat("token ", kFirstToken + 19)));
}

TEST(AttentionMapTest, DrawsOneCellPerTokenAndItsMarks) {
  const std::string svg = RenderAttentionMap(Sequence(20, /*heads=*/false), {});
  EXPECT_EQ(Count(svg, "<rect class=\"cell\""), 20u);
  EXPECT_EQ(Count(svg, "class=\"mark-protected\""), 4u);
  EXPECT_EQ(Count(svg, "class=\"mark-pinned\""), 2u);
  EXPECT_EQ(Count(svg, "class=\"mark-int8\""), 3u);
  EXPECT_EQ(Count(svg, "class=\"mark-int4\""), 2u);
  EXPECT_EQ(Count(svg, "class=\"mark-pruned\""), 1u);
  EXPECT_EQ(Count(svg, "class=\"mark-mixed\""), 1u);
  EXPECT_EQ(Count(svg, "class=\"layer-cell\""), 0u);
  // Colour by importance: the first token scores 0, the last 0.95.
  EXPECT_THAT(svg, HasSubstr(absl::StrCat("fill=\"", ImportanceColour(0), "\"")));
  EXPECT_THAT(svg, HasSubstr(absl::StrCat("fill=\"", ImportanceColour(0.95f), "\"")));
  EXPECT_THAT(svg, HasSubstr("data-tokens=\"20\""));
}

TEST(AttentionMapTest, AddsARowPerLayerWithHeadActivity) {
  const std::string svg = RenderAttentionMap(Sequence(20, /*heads=*/true), {});
  EXPECT_EQ(Count(svg, "class=\"layer-cell\""), 2u * 20u);
  EXPECT_THAT(svg, HasSubstr(">L1</text>"));
}

TEST(AttentionMapTest, DrawsAtMostMaxTokens) {
  const std::string svg = RenderAttentionMap(Sequence(100, true), {.max_tokens = 50});
  EXPECT_EQ(Count(svg, "<rect class=\"cell\""), 50u);
  EXPECT_THAT(svg, HasSubstr("The first 50 of 100 tokens"));
  EXPECT_THAT(RenderAttentionMap(SequenceInspection{}, {}), HasSubstr("Nothing"));
}

TEST(AttentionMapTest, ColoursRunDarkToBright) {
  EXPECT_EQ(ImportanceColour(0), "#440154");
  EXPECT_EQ(ImportanceColour(1), "#fde725");
  EXPECT_EQ(ImportanceColour(-1), "#440154");
  EXPECT_EQ(ImportanceColour(7), "#fde725");
  EXPECT_EQ(ImportanceColour(std::numeric_limits<float>::quiet_NaN()), "#440154");
}

TEST(HtmlTest, Formats) {
  EXPECT_EQ(HtmlEscape("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
  EXPECT_EQ(UrlEncode("a/b c&d"), "a%2Fb%20c%26d");
  EXPECT_EQ(BytesText(512), "512 B");
  EXPECT_EQ(BytesText(3 << 19), "1.50 MiB");
  EXPECT_EQ(KeyText(0xfeed), "000000000000feed");
  EXPECT_EQ(DurationText(absl::Hours(50)), "2d 2h 0m");
  EXPECT_EQ(TimeText(absl::InfinitePast()), "-");
  EXPECT_EQ(Percent(2), "100.0%");
}

// --- Served -------------------------------------------------------------------

struct Reply {
  int status = 0;
  std::string head;
  std::string body;
};

Reply Get(int port, const std::string& target, const std::string& headers = "") {
  Reply reply;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return reply;
  }
  const std::string request = absl::StrCat(
      "GET ", target, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n", headers, "\r\n");
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string all;
  char buffer[8192];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) all.append(buffer, n);
  ::close(fd);
  const size_t split = all.find("\r\n\r\n");
  reply.head = all.substr(0, split);
  if (split != std::string::npos) reply.body = all.substr(split + 4);
  if (all.size() > 12) reply.status = std::atoi(all.substr(9, 3).c_str());
  return reply;
}

TEST(StatusPagesServedTest, ServeBothPagesWithTheirStatus) {
  auto server = HttpServer::Start({.address = "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto source = std::make_shared<FakeSource>();
  ServeStatusPages(**server, source, {});
  const int port = (*server)->port();

  Reply status = Get(port, "/status");
  EXPECT_EQ(status.status, 200);
  EXPECT_THAT(status.head, HasSubstr("Content-Type: text/html; charset=utf-8"));
  EXPECT_THAT(status.head, HasSubstr("Content-Security-Policy: default-src 'none'"));
  EXPECT_THAT(status.body, HasSubstr("<section id=\"attention\">"));

  Reply map = Get(port, absl::StrCat("/status/attention?ns=team&model=", UrlEncode(kHostile),
                                     "&key=0000000000001234"));
  EXPECT_EQ(map.status, 200) << map.body;
  EXPECT_EQ(Count(map.body, "<rect class=\"cell\""), 20u);
  EXPECT_EQ(source->last_model.model_id, kHostile);
  EXPECT_THAT(map.body, HasSubstr("id=\"blocks\""));

  // model=NS/ID: the namespace ends at the first '/'.
  EXPECT_EQ(Get(port, "/status/attention?model=team/a/b&key=0x1234").status, 200);
  EXPECT_EQ(source->last_model, (ModelKey{"team", "a/b"}));

  EXPECT_EQ(Get(port, "/status/attention?ns=team&model=m&key=99").status, 404);
  Reply empty = Get(port, "/status/attention?ns=team&model=m&key=9999");
  EXPECT_EQ(empty.status, 404);
  EXPECT_THAT(empty.body, HasSubstr("Nothing of this sequence is cached"));
  EXPECT_EQ(Get(port, "/status/attention?ns=team&model=m").status, 400);
  EXPECT_EQ(Get(port, "/status/attention?ns=team&model=m&key=xyz").status, 400);
  EXPECT_EQ(Get(port, "/status/attention?ns=team&model=m&key=12345678901234567").status, 400);
  EXPECT_EQ(Get(port, "/status/attention?model=noslash&key=1").status, 400);
}

TEST(StatusPagesServedTest, TenantDetailOnlyForWhomMaySeeIt) {
  auto server = HttpServer::Start({.address = "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto source = std::make_shared<FakeSource>();
  StatusPageOptions options;
  options.may_see_detail = [](const HttpRequest& request) {
    return request.authorization == std::vector<std::string>{"Bearer admin"};
  };
  ServeStatusPages(**server, source, options);
  const int port = (*server)->port();
  const std::string cached = "/status/attention?ns=team&model=m&key=0000000000001234";
  const std::string absent = "/status/attention?ns=team&model=m&key=9999";

  // Without the right header: 401 before the query is looked at, cached or not.
  for (const std::string headers :
       {"", "Authorization: Bearer worker\r\n", "Authorization: Basic YWRtaW4=\r\n",
        "Authorization: Bearer admin\r\nAuthorization: Bearer admin\r\n"}) {
    source->last_model = {};
    Reply map = Get(port, cached, headers);
    EXPECT_EQ(map.status, 401) << headers;
    EXPECT_THAT(map.head, HasSubstr("WWW-Authenticate: Bearer"));
    EXPECT_EQ(Get(port, absent, headers).status, 401) << headers;
    EXPECT_EQ(Get(port, "/status/attention?bad", headers).status, 401) << headers;
    EXPECT_EQ(source->last_model, ModelKey{}) << "the source was asked";
    Reply page = Get(port, "/status", headers);
    EXPECT_EQ(page.status, 200);
    EXPECT_THAT(page.body, HasSubstr("<section id=\"tenant-detail\">"));
    EXPECT_THAT(page.body, HasSubstr("<section id=\"tiers\">"));
    for (const char* hidden : {"id=\"models\"", "id=\"top-prefixes\"", "id=\"attention\"",
                               "id=\"recent-errors\"", "id=\"recent-migrations\""}) {
      EXPECT_THAT(page.body, ::testing::Not(HasSubstr(hidden))) << hidden;
    }
  }
  const std::string admin = "Authorization: Bearer admin\r\n";
  EXPECT_EQ(Get(port, cached, admin).status, 200);
  EXPECT_EQ(Get(port, absent, admin).status, 404);
  Reply page = Get(port, "/status", admin);
  EXPECT_THAT(page.body, HasSubstr("<section id=\"top-prefixes\">"));
  EXPECT_THAT(page.body, ::testing::Not(HasSubstr("id=\"tenant-detail\"")));
}

}  // namespace
}  // namespace kvcache
