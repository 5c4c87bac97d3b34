#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Reply {
  int status = 0;  // 0: no answer
  std::string head;
  std::string body;
};

// Sends `request` verbatim to 127.0.0.1:port and reads until the server
// closes the connection.
Reply Exchange(int port, const std::string& request) {
  Reply reply;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return reply;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return reply;
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string all;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    all.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t split = all.find("\r\n\r\n");
  reply.head = all.substr(0, split);
  if (split != std::string::npos) reply.body = all.substr(split + 4);
  if (absl::StartsWith(all, "HTTP/1.1 ") && all.size() >= 12) {
    (void)absl::SimpleAtoi(all.substr(9, 3), &reply.status);
  }
  return reply;
}

Reply Request(int port, const std::string& method, const std::string& target) {
  return Exchange(port, absl::StrCat(method, " ", target,
                                     " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"));
}

std::unique_ptr<HttpServer> StartLocal(int threads = 4) {
  auto server = HttpServer::Start({.address = "127.0.0.1:0", .threads = threads});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(HttpServerTest, ServesARegisteredPathOnAPickedPort) {
  auto server = StartLocal();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  server->Handle("/metrics", [](const HttpRequest&) {
    return HttpResponse{.content_type = "text/plain; version=0.0.4", .body = "up 1\n"};
  });
  Reply r = Request(server->port(), "GET", "/metrics");
  EXPECT_EQ(r.status, 200) << r.head;
  EXPECT_THAT(r.head, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(r.head, HasSubstr("Content-Length: 5"));
  EXPECT_THAT(r.head, HasSubstr("Cache-Control: no-store"));
  EXPECT_THAT(r.head, HasSubstr("X-Content-Type-Options: nosniff"));
  EXPECT_EQ(r.body, "up 1\n");
}

TEST(HttpServerTest, AnswersUnknownPaths404AndOtherMethods405) {
  auto server = StartLocal();
  ASSERT_NE(server, nullptr);
  server->Handle("/status", [](const HttpRequest&) { return HttpResponse{.body = "ok"}; });
  EXPECT_EQ(Request(server->port(), "GET", "/nothing").status, 404);
  EXPECT_EQ(Request(server->port(), "GET", "/status/").status, 404);  // exact paths only
  EXPECT_EQ(Request(server->port(), "GET", "/").status, 404);
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH"}) {
    Reply r = Exchange(server->port(),
                       absl::StrCat(method,
                                    " /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                    "Content-Length: 3\r\n\r\nabc"));
    EXPECT_EQ(r.status, 405) << method << ": " << r.head;
    EXPECT_THAT(r.head, HasSubstr("Allow: GET, HEAD")) << method;
  }
}

TEST(HttpServerTest, HeadSendsTheHeadersOnly) {
  auto server = StartLocal();
  ASSERT_NE(server, nullptr);
  server->Handle("/status", [](const HttpRequest&) { return HttpResponse{.body = "0123456789"}; });
  Reply r = Request(server->port(), "HEAD", "/status");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.head, HasSubstr("Content-Length: 10"));
  EXPECT_EQ(r.body, "");
}

TEST(HttpServerTest, HandsTheQueryToTheHandlerAndReplacesHandlers) {
  auto server = StartLocal();
  ASSERT_NE(server, nullptr);
  server->Handle("/q",
                 [](const HttpRequest&) { return HttpResponse{.status = 400, .body = "old"}; });
  server->Handle("/q", [](const HttpRequest& r) {
    return HttpResponse{.body = absl::StrCat(r.path, "|", r.Param("model").value_or("-"), "|",
                                             r.Param("key").value_or("-"), "|",
                                             r.Param("absent").value_or("-"))};
  });
  Reply r = Request(server->port(), "GET", "/q?model=team%2Fa+b&key=00ff&model=second");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "/q|team/a b|00ff|-");
}

TEST(HttpServerTest, ServesConcurrentRequests) {
  auto server = StartLocal(/*threads=*/4);
  ASSERT_NE(server, nullptr);
  std::atomic<int> in_handler{0};
  std::atomic<int> most_at_once{0};
  server->Handle("/slow", [&](const HttpRequest& r) {
    const int now = ++in_handler;
    int seen = most_at_once.load();
    while (now > seen && !most_at_once.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    --in_handler;
    return HttpResponse{.body = r.Param("i").value_or("")};
  });
  constexpr int kClients = 8;
  constexpr int kEach = 10;
  std::atomic<int> good{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kEach; ++i) {
        const std::string id = absl::StrCat(c, "-", i);
        Reply r = Request(server->port(), "GET", absl::StrCat("/slow?i=", id));
        if (r.status == 200 && r.body == id) ++good;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(good.load(), kClients * kEach);
  EXPECT_GE(most_at_once.load(), 2);  // worker threads serve in parallel
  EXPECT_LE(most_at_once.load(), 4);
}

TEST(HttpServerTest, RefusesOversizedRequestHeaders) {
  auto server = HttpServer::Start({.address = "127.0.0.1:0", .max_request_bytes = 4096});
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Handle("/status", [](const HttpRequest&) { return HttpResponse{.body = "ok"}; });
  Reply r = Exchange((*server)->port(),
                     absl::StrCat("GET /status HTTP/1.1\r\nHost: x\r\nX-Big: ",
                                  std::string(64 << 10, 'a'), "\r\nConnection: close\r\n\r\n"));
  EXPECT_NE(r.status, 200) << r.head;
  EXPECT_THAT(r.body, Not(HasSubstr("ok")));
  // And it keeps serving.
  EXPECT_EQ(Request((*server)->port(), "GET", "/status").status, 200);
}

TEST(HttpServerTest, RefusesAddressesItCannotBind) {
  for (const char* address : {"256.0.0.1:1", "", "9464", ":9464", "127.0.0.1:1,127.0.0.1:2"}) {
    auto server = HttpServer::Start({.address = address});
    ASSERT_FALSE(server.ok()) << address;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable) << address;
    EXPECT_THAT(std::string(server.status().message()), HasSubstr("cannot listen")) << address;
  }
  auto first = StartLocal();
  ASSERT_NE(first, nullptr);
  auto second = HttpServer::Start({.address = absl::StrCat("127.0.0.1:", first->port())});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(HttpServer::Start({.address = "127.0.0.1:0", .threads = 0}).ok());
}

TEST(HttpServerTest, StopClosesTheListenerAndIsIdempotent) {
  auto server = StartLocal();
  ASSERT_NE(server, nullptr);
  server->Handle("/status", [](const HttpRequest&) { return HttpResponse{.body = "ok"}; });
  const int port = server->port();
  EXPECT_EQ(Request(port, "GET", "/status").status, 200);
  server->Stop();
  server->Stop();
  EXPECT_EQ(Request(port, "GET", "/status").status, 0);
}

TEST(UrlDecodeTest, DecodesEscapesAndKeepsBadOnes) {
  EXPECT_EQ(UrlDecode("a%2Fb%3c", false), "a/b<");
  EXPECT_EQ(UrlDecode("a+b", true), "a b");
  EXPECT_EQ(UrlDecode("a+b", false), "a+b");
  EXPECT_EQ(UrlDecode("%zz%4", true), "%zz%4");
  EXPECT_EQ(UrlDecode("%", true), "%");
}

}  // namespace
}  // namespace kvcache
