// HttpServer: the daemon's small read-only HTTP endpoint (listen.metrics_address),
// a thin wrapper over civetweb. It serves /metrics (server/metrics) and the
// status pages (server/status); nothing else in kvcached speaks HTTP.
//
// Handlers are registered by exact path ("/metrics", "/status"); a request's
// query string is handed to the handler, which returns the whole response
// (status, content type, body). Only GET and HEAD are served: any other method
// is answered 405 with "Allow: GET, HEAD", an unknown path 404. Requests are
// bounded: the request line and headers may take at most max_request_bytes, a
// request body is never read, and a connection is served by one of `threads`
// worker threads (more wait in civetweb's queue).
//
// Every response carries "Cache-Control: no-store" and
// "X-Content-Type-Options: nosniff"; handlers add their own headers.
//
// Thread-safe: Handle() may be called at any time, also while requests are
// served; a handler runs on a worker thread, several at once. Destruction
// (or Stop()) closes the listener and waits for the requests in progress, so
// whatever handlers reference must outlive the server.
#ifndef KVCACHE_SERVER_HTTP_HTTP_SERVER_H_
#define KVCACHE_SERVER_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvcache {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD"
  std::string path;    // decoded, without the query
  std::string query;   // raw, without the '?'; empty when none
  // The value of every Authorization header, in order (most requests: none).
  std::vector<std::string> authorization;

  // The first value of query parameter `name`, percent- and '+'-decoded;
  // nullopt when it is absent.
  std::optional<std::string> Param(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // added to the standard ones
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  // "host:port" (an IPv4 address; port 0 picks a free one, see port()).
  std::string address;
  int threads = 4;
  size_t max_request_bytes = 16 << 10;  // request line and headers
  absl::Duration request_timeout = absl::Seconds(10);
};

class HttpServer {
 public:
  // Listens on options.address. UNAVAILABLE naming the address when it cannot
  // bind (malformed, not local, in use); INVALID_ARGUMENT for threads < 1.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves `path` (exact match, starting with '/') with `handler`, replacing
  // a handler registered for it before.
  void Handle(std::string path, HttpHandler handler);
  // The port bound (the one picked when the address asked for port 0).
  int port() const;
  // Closes the listener and waits for requests in progress. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Decodes %XX escapes and, when `plus_is_space`, '+' (query strings). Bad
// escapes are kept as they are.
std::string UrlDecode(std::string_view text, bool plus_is_space);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_HTTP_HTTP_SERVER_H_
