#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>  // std::call_once
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/common/mutex.h"

namespace kvcache {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// civetweb's listener wakes every 2 s to see whether it should stop; a
// connection wakes it at once. Connects to 127.0.0.1:port (or `host`:port
// when it is another IPv4 address) every 20 ms until `done`.
void WakeListenerUntil(const std::string& host, int port, const std::atomic<bool>& done) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0" ||
      ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  while (!done.load()) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

HttpResponse PlainResponse(int status, std::string body) {
  return HttpResponse{.status = status, .body = std::move(body)};
}

}  // namespace

std::string UrlDecode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%' && i + 2 < text.size()) {
      const int hi = HexValue(text[i + 1]);
      const int lo = HexValue(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(plus_is_space && c == '+' ? ' ' : c);
  }
  return out;
}

std::optional<std::string> HttpRequest::Param(std::string_view name) const {
  // Debian's Abseil has its own string_view.
  for (absl::string_view piece : absl::StrSplit(query, '&')) {
    const std::string_view pair(piece.data(), piece.size());
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string key = UrlDecode(pair.substr(0, eq), /*plus_is_space=*/true);
    if (key != name) continue;
    if (eq == std::string_view::npos) return std::string();
    return UrlDecode(pair.substr(eq + 1), /*plus_is_space=*/true);
  }
  return std::nullopt;
}

struct HttpServer::Impl {
  std::string host;  // of the address
  int port = 0;
  // Serializes Stop(); guards the civetweb context, null once stopped.
  Mutex stop_mu;
  mg_context* context ABSL_GUARDED_BY(stop_mu) = nullptr;
  Mutex mu;
  absl::flat_hash_map<std::string, std::shared_ptr<const HttpHandler>> handlers ABSL_GUARDED_BY(mu);

  std::shared_ptr<const HttpHandler> Find(const std::string& path) {
    MutexLock lock(&mu);
    auto it = handlers.find(path);
    return it == handlers.end() ? nullptr : it->second;
  }

  HttpResponse Dispatch(const HttpRequest& request) {
    if (request.method != "GET" && request.method != "HEAD") {
      HttpResponse r = PlainResponse(405, absl::StrCat(request.method, " is not served here: ",
                                                       "this endpoint is read-only (GET, HEAD)\n"));
      r.headers.emplace_back("Allow", "GET, HEAD");
      return r;
    }
    std::shared_ptr<const HttpHandler> handler = Find(request.path);
    if (handler == nullptr) return PlainResponse(404, absl::StrCat(request.path, " not found\n"));
    return (*handler)(request);
  }

  // civetweb's request handler, registered for "/" (every path).
  static int OnRequest(mg_connection* conn, void* data) {
    auto* impl = static_cast<Impl*>(data);
    const mg_request_info* info = mg_get_request_info(conn);
    HttpRequest request{.method = info->request_method != nullptr ? info->request_method : "",
                        .path = info->local_uri != nullptr ? info->local_uri : "",
                        .query = info->query_string != nullptr ? info->query_string : ""};
    for (int i = 0; i < info->num_headers; ++i) {
      const mg_header& h = info->http_headers[i];
      if (h.name != nullptr && h.value != nullptr && ::strcasecmp(h.name, "Authorization") == 0) {
        request.authorization.emplace_back(h.value);
      }
    }
    const HttpResponse response = impl->Dispatch(request);
    mg_response_header_start(conn, response.status);
    mg_response_header_add(conn, "Content-Type", response.content_type.c_str(), -1);
    const std::string length = absl::StrCat(response.body.size());
    mg_response_header_add(conn, "Content-Length", length.c_str(), -1);
    mg_response_header_add(conn, "Cache-Control", "no-store", -1);
    mg_response_header_add(conn, "X-Content-Type-Options", "nosniff", -1);
    for (const auto& [name, value] : response.headers) {
      mg_response_header_add(conn, name.c_str(), value.c_str(), -1);
    }
    mg_response_header_send(conn);
    if (request.method != "HEAD" && !response.body.empty()) {
      mg_write(conn, response.body.data(), response.body.size());
    }
    return response.status;
  }

  // Keeps civetweb's own messages (connection errors) off stderr.
  static int OnLogMessage(const mg_connection*, const char*) { return 1; }
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("http server threads is ", options.threads, "; it must be at least 1"));
  }
  static std::once_flag init_once;
  std::call_once(init_once, [] { mg_init_library(0); });

  auto impl = std::make_unique<Impl>();
  const std::string threads = absl::StrCat(options.threads);
  const std::string max_request = absl::StrCat(options.max_request_bytes);
  const std::string timeout = absl::StrCat(absl::ToInt64Milliseconds(options.request_timeout));
  const char* config[] = {"listening_ports",
                          options.address.c_str(),
                          "num_threads",
                          threads.c_str(),
                          "max_request_size",
                          max_request.c_str(),
                          "request_timeout_ms",
                          timeout.c_str(),
                          "enable_directory_listing",
                          "no",
                          nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = &Impl::OnLogMessage;
  mg_init_data init{.callbacks = &callbacks, .user_data = nullptr, .configuration_options = config};
  char error_text[256] = "";
  unsigned error_code = 0;
  mg_error_data error{
      .code = &error_code, .text = error_text, .text_buffer_size = sizeof(error_text)};
  // civetweb reads a bare port as every interface and a comma as a list of
  // addresses: only one host:port is accepted.
  if (options.address.empty() || options.address.front() == ':' ||
      options.address.rfind(':') == std::string::npos ||
      options.address.find(',') != std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("http server cannot listen on \"", options.address, "\": expected host:port"));
  }
  MutexLock lock(&impl->stop_mu);  // not shared yet: for the analysis
  impl->context = mg_start2(&init, &error);
  if (impl->context == nullptr) {
    return absl::UnavailableError(absl::StrCat("http server cannot listen on ", options.address,
                                               ": ", error_text[0] != '\0' ? error_text : "failed",
                                               " (address malformed, not local, or in use)"));
  }
  mg_server_port ports[4];
  const int n = mg_get_server_ports(impl->context, 4, ports);
  impl->port = n > 0 ? ports[0].port : 0;
  impl->host = options.address.substr(0, options.address.rfind(':'));
  mg_set_request_handler(impl->context, "/", &Impl::OnRequest, impl.get());
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(std::string path, HttpHandler handler) {
  auto shared = std::make_shared<const HttpHandler>(std::move(handler));
  MutexLock lock(&impl_->mu);
  impl_->handlers.insert_or_assign(std::move(path), std::move(shared));
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::Stop() {
  MutexLock lock(&impl_->stop_mu);
  if (impl_->context == nullptr) return;
  std::atomic<bool> stopped{false};
  std::thread waker;
  if (impl_->port > 0) {
    waker = std::thread([&] { WakeListenerUntil(impl_->host, impl_->port, stopped); });
  }
  mg_stop(impl_->context);  // waits for the listener and the requests in progress
  stopped = true;
  if (waker.joinable()) waker.join();
  impl_->context = nullptr;
}

}  // namespace kvcache
