// A real Redis Cluster for tests: N masters (and, when asked, replicas of
// each) of Debian's redis-server on loopback, in a temporary folder, created with
// `redis-cli --cluster create` and torn down with the fixture.
#ifndef KVCACHE_SERVER_REMOTE_REDIS_CLUSTER_FIXTURE_H_
#define KVCACHE_SERVER_REMOTE_REDIS_CLUSTER_FIXTURE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/common/status_macros.h"
#include "server/remote/redis_node.h"

namespace kvcache {

class RedisClusterFixture {
 public:
  // Whether redis-server and redis-cli are installed (deploy/setup-debian.sh).
  static bool Available() {
    return std::system("command -v redis-server >/dev/null && command -v redis-cli >/dev/null") ==
           0;
  }

  // Starts `masters` nodes on free ports of loopback, and joins them into
  // one cluster serving every slot; with `password` (letters and digits) the
  // nodes require it (requirepass); with `replicas`, each master gets that
  // many replicas. Node i < masters is a master at the start (redis-cli
  // makes the first nodes masters), the others are replicas. The nodes
  // listen on `host` (an address of this host other network namespaces may
  // reach, for tests of daemons on separate hosts) and announce it.
  absl::Status Start(int masters, const std::string& password = "", int replicas = 0,
                     const std::string& host = "127.0.0.1") {
    password_ = password;
    host_ = host;
    const std::string auth =
        password.empty() ? ""
                         : absl::StrCat(" --requirepass ", password, " --masterauth ", password);
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kvcache-redis-cluster-", ::getpid(), "-", ++started_);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::vector<std::string> endpoints;
    std::vector<int> chosen;
    for (int i = 0; i < masters * (1 + replicas); ++i) {
      // Ports the kernel says are free, for clients and for the cluster bus
      // (which would otherwise be port + 10000, perhaps taken).
      const int port = FreePort(&chosen), bus = FreePort(&chosen);
      if (port == 0 || bus == 0) return absl::InternalError("no free port on loopback");
      ports_.push_back(port);
      endpoints.push_back(absl::StrCat(host_, ":", port));
      const std::string command = absl::StrCat(
          "redis-server --port ", port, " --cluster-port ", bus, " --bind ", host_,
          " --protected-mode no --cluster-enabled yes --cluster-config-file nodes-", port,
          ".conf --cluster-node-timeout 2000 --cluster-replica-validity-factor 0",
          " --save '' --appendonly no --daemonize yes --dir ", dir_.string(), " --pidfile ",
          PidFile(port), " --logfile ", LogFile(port), auth);
      commands_.push_back(command);
      if (std::system(command.c_str()) != 0) {
        return absl::InternalError(absl::StrCat("could not start: ", command));
      }
    }
    for (int port : ports_) {
      if (!WaitFor(port, [](RedisNode& n) { return n.Run({"PING"}).ok(); })) {
        return absl::DeadlineExceededError(
            absl::StrCat("redis on ", port, " did not answer; its log: ", LogOf(port)));
      }
    }
    const std::string create =
        absl::StrCat("redis-cli --cluster create ", absl::StrJoin(endpoints, " "),
                     " --cluster-replicas ", replicas, " --cluster-yes",
                     password.empty() ? "" : absl::StrCat(" -a ", password, " --no-auth-warning"),
                     " > ", (dir_ / "create.log").string(), " 2>&1");
    if (std::system(create.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("redis-cli --cluster create failed; see ", (dir_ / "create.log").string()));
    }
    KVCACHE_RETURN_IF_ERROR(WaitUntilOk());
    // Replicas that have synced with their masters (a replica that never did
    // cannot take over).
    for (size_t i = masters; i < ports_.size(); ++i) {
      if (!WaitFor(ports_[i], [](RedisNode& n) {
            absl::StatusOr<RespValue> info = n.Run({"INFO", "replication"});
            return info.ok() && info->str.find("master_link_status:up") != std::string::npos;
          })) {
        return absl::DeadlineExceededError(
            absl::StrCat("the replica on ", ports_[i], " did not sync with its master"));
      }
    }
    return absl::OkStatus();
  }

  // Starts node i again after KillNode(i), on its ports and with its cluster
  // state (its nodes file); its data is gone (nothing is saved).
  absl::Status RestartNode(int i) {
    if (std::system(commands_[i].c_str()) != 0) {
      return absl::InternalError(absl::StrCat("could not start: ", commands_[i]));
    }
    if (!WaitFor(ports_[i], [](RedisNode& n) { return n.Run({"PING"}).ok(); })) {
      return absl::DeadlineExceededError(absl::StrCat("redis on ", ports_[i], " did not answer"));
    }
    return absl::OkStatus();
  }

  // Waits until every node (but node `down`, when >= 0) says
  // cluster_state:ok.
  absl::Status WaitUntilOk(int down = -1) {
    for (int port : ports_) {
      if (down >= 0 && port == ports_[down]) continue;
      if (!WaitFor(port, [](RedisNode& n) {
            absl::StatusOr<RespValue> info = n.Run({"CLUSTER", "INFO"});
            return info.ok() && info->str.find("cluster_state:ok") != std::string::npos;
          })) {
        return absl::DeadlineExceededError(absl::StrCat("the cluster on ", port, " is not ok"));
      }
    }
    return absl::OkStatus();
  }

  // Waits until master `i` (killed or paused) has failed over: every other
  // node marks it failed and serves the whole slot space again. Until the
  // others agree it failed (cluster-node-timeout and then a vote) they still
  // say cluster_state:ok, so WaitUntilOk(i) alone may return before the
  // failover starts.
  absl::Status WaitForFailover(int i) {
    const std::string address = absl::StrCat(host_, ":", ports_[i]);
    for (int port : ports_) {
      if (port == ports_[i]) continue;
      if (!WaitFor(port, [&](RedisNode& n) {
            absl::StatusOr<RespValue> nodes = n.Run({"CLUSTER", "NODES"});
            if (!nodes.ok()) return false;
            std::istringstream lines(nodes->str);
            for (std::string line; std::getline(lines, line);) {
              // "<id> <host:port@bus> <flags,...> ...": failed, not merely suspected.
              if (line.find(" " + address + "@") == std::string::npos) continue;
              return line.find(",fail ") != std::string::npos ||
                     line.find(" fail ") != std::string::npos ||
                     line.find(",fail,") != std::string::npos;
            }
            return false;
          })) {
        return absl::DeadlineExceededError(
            absl::StrCat("the node on ", port, " did not mark ", address, " failed"));
      }
    }
    return WaitUntilOk(i);
  }

  ~RedisClusterFixture() {
    for (int port : ports_) KillPort(port);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  const std::vector<int>& ports() const { return ports_; }
  NodeAddress Address(int i) const { return {.host = host_, .port = Port(i)}; }
  uint16_t Port(int i) const { return static_cast<uint16_t>(ports_[i]); }

  // A plain connection to node i (for the test's own commands).
  std::unique_ptr<RedisNode> Node(int i) const {
    absl::StatusOr<std::unique_ptr<RedisNode>> n =
        RedisNode::Connect(Address(i), {.io_timeout = absl::Seconds(5), .password = password_});
    return n.ok() ? *std::move(n) : nullptr;
  }

  // SIGKILLs node i.
  void KillNode(int i) { KillPort(ports_[i]); }
  // Stops node i without closing anything (SIGSTOP: its connections stay
  // open and go silent, as a hung or cut-off host's do), or lets it go on.
  void PauseNode(int i, bool paused) { SignalPort(ports_[i], paused ? SIGSTOP : SIGCONT); }

 private:
  // A port nothing listens on now and not in `*chosen` (added to it); 0 when
  // none could be found.
  static int FreePort(std::vector<int>* chosen) {
    for (int attempt = 0; attempt < 16; ++attempt) {
      const int port = AnyFreePort();
      if (port == 0) return 0;
      if (std::find(chosen->begin(), chosen->end(), port) == chosen->end()) {
        chosen->push_back(port);
        return port;
      }
    }
    return 0;
  }
  static int AnyFreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
      port = ntohs(addr.sin_port);
    }
    ::close(fd);
    return port;
  }
  std::string LogFile(int port) const {
    return (dir_ / absl::StrCat("redis-", port, ".log")).string();
  }
  std::string LogOf(int port) const {
    std::ifstream in(LogFile(port));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string PidFile(int port) const {
    return (dir_ / absl::StrCat("redis-", port, ".pid")).string();
  }
  void KillPort(int port) {
    SignalPort(port, SIGCONT);  // a paused node dies too
    SignalPort(port, SIGKILL);
    std::filesystem::remove(PidFile(port));
  }
  void SignalPort(int port, int signal) {
    std::ifstream in(PidFile(port));
    pid_t pid = 0;
    if (in >> pid && pid > 0) ::kill(pid, signal);
  }

  template <typename Ready>
  bool WaitFor(int port, Ready ready) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    while (absl::Now() < deadline) {
      absl::StatusOr<std::unique_ptr<RedisNode>> n = RedisNode::Connect(
          {.host = host_, .port = static_cast<uint16_t>(port)}, {.password = password_});
      if (n.ok() && ready(**n)) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  std::filesystem::path dir_;
  std::vector<int> ports_;
  std::vector<std::string> commands_;  // what started each node
  std::string password_;               // the nodes require it when set
  std::string host_ = "127.0.0.1";     // the nodes listen there
  static inline int started_ = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_REDIS_CLUSTER_FIXTURE_H_
