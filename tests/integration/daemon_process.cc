#include "tests/integration/daemon_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvcache::testing {

std::string KvcachedPath() { return KVCACHED_BINARY; }

int PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const DaemonOptions& options) {
  std::unique_ptr<DaemonProcess> d(new DaemonProcess());
  char dir_template[] = "/tmp/kvcached-test-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  d->dir_ = dir_template;
  d->socket_path_ = options.unix_socket.empty() ? d->dir_ + "/kvcached.sock" : options.unix_socket;
  d->log_path_ = d->dir_ + "/kvcached.log";
  d->token_ = options.token;
  d->network_namespace_ = options.network_namespace;

  std::vector<std::string> args = {KvcachedPath(), "--unix-socket", d->socket_path_,
                                   "--capacity-bytes", std::to_string(options.capacity_bytes)};
  if (options.slab_bytes != 0) {
    args.insert(args.end(), {"--slab-bytes", std::to_string(options.slab_bytes)});
  }
  if (options.tcp) {
    d->tcp_port_ = PickFreePort();
    args.insert(args.end(), {"--listen", absl::StrCat(options.tcp_host, ":", d->tcp_port_)});
  } else {
    args.insert(args.end(), {"--listen", "none"});
  }
  if (options.metrics) {
    d->metrics_port_ = PickFreePort();
    args.insert(args.end(), {"--metrics-address", absl::StrCat("127.0.0.1:", d->metrics_port_)});
  } else {
    args.insert(args.end(), {"--metrics-address", "none"});
  }
  if (options.ssd_bytes != 0) {
    args.insert(args.end(), {"--ssd-path", d->ssd_path(), "--ssd-capacity-bytes",
                             absl::StrCat(options.ssd_bytes)});
  }
  args.insert(args.end(), options.extra_flags.begin(), options.extra_flags.end());

  d->pid_ = ::fork();
  if (d->pid_ < 0) return absl::InternalError("fork failed");
  if (d->pid_ == 0) {
    // The daemon dies with the test, also when the test crashes before its
    // TearDown (the forking thread is the test's main thread).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() == 1) ::_exit(127);  // the test died before prctl
    std::FILE* log = std::fopen(d->log_path_.c_str(), "w");
    if (log != nullptr) {
      ::dup2(::fileno(log), STDOUT_FILENO);
      ::dup2(::fileno(log), STDERR_FILENO);
    }
    if (!options.network_namespace.empty()) {
      const int ns = ::open(("/var/run/netns/" + options.network_namespace).c_str(), O_RDONLY);
      if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) {
        std::perror("entering the daemon's network namespace");
        ::_exit(126);
      }
      ::close(ns);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  // Connect only once the socket exists: a channel that fails its first
  // connect backs off for a second or more.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline && !std::filesystem::exists(d->socket_path_) && d->Running()) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  auto client = d->NewClient();
  while (absl::Now() < deadline) {
    if (!d->Running()) {
      return absl::InternalError(absl::StrCat("kvcached exited early; log: ", d->log_path_));
    }
    if (client->GetServerInfo().ok()) return d;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("kvcached did not come up; log: ", d->log_path_));
}

bool DaemonProcess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int DaemonProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

DataPath TestDataPath() {
  const char* path = std::getenv("KVCACHE_TEST_DATA_PATH");
  if (path == nullptr) return DataPath::kAuto;
  const std::string p(path);
  if (p == "grpc") return DataPath::kGrpc;
  if (p == "shm") return DataPath::kSharedMemory;
  return DataPath::kAuto;
}

std::unique_ptr<Client> DaemonProcess::NewClient(const std::string& ns) const {
  return NewClient(ns, TestDataPath());
}

std::unique_ptr<Client> DaemonProcess::NewClient(const std::string& ns, DataPath path) const {
  return NewClient(ns, path, token_);
}

std::unique_ptr<Client> DaemonProcess::NewClient(const std::string& ns, DataPath path,
                                                 const std::string& token) const {
  ClientOptions options;
  options.token = token;
  options.target = unix_target();
  options.ns = ns;
  options.timeout = absl::Seconds(30);
  options.data_path = path;
  auto client = Client::Connect(options);
  return client.ok() ? *std::move(client) : nullptr;
}

std::pair<int, std::string> RunShell(const std::string& command) {
  std::string output;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

CommandResult RunCommand(const std::string& command, const std::string& stdin_text) {
  auto [code, output] = RunShell(
      stdin_text.empty() ? command : absl::StrCat("printf '%s' '", stdin_text, "' | ", command));
  return {code, std::move(output)};
}

bool DaemonProcess::CorruptSsdFile() const {
  const int fd = ::open(ssd_path().c_str(), O_RDWR);
  if (fd < 0) return false;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  bool ok = size > 0;
  for (off_t page = 0; ok && page < size; page += 4096) {
    unsigned char byte;
    ok = ::pread(fd, &byte, 1, page + 2048) == 1;
    byte ^= 0xa5;
    ok = ok && ::pwrite(fd, &byte, 1, page + 2048) == 1;
  }
  ::close(fd);
  return ok;
}

}  // namespace kvcache::testing
