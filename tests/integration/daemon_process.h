// DaemonProcess: runs the real kvcached binary for an integration test.
//
// Each instance gets its own Unix socket (and, when asked, a free TCP port
// and metrics port), starts `kvcached` with the given extra flags, and waits
// until a client can call it. Stop() sends SIGTERM and returns the exit code,
// so tests can insist on a clean drain. Not thread-safe.
#ifndef KVCACHE_TESTS_INTEGRATION_DAEMON_PROCESS_H_
#define KVCACHE_TESTS_INTEGRATION_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kvcache/client.h"

namespace kvcache::testing {

struct DaemonOptions {
  uint64_t capacity_bytes = uint64_t{256} << 20;
  uint64_t slab_bytes = 0;             // 0: the daemon's default
  bool tcp = false;                    // also listen on a free TCP port
  std::string tcp_host = "127.0.0.1";  // of that TCP listener
  bool metrics = false;                // serve metrics on a free port
  std::string unix_socket;             // empty: kvcached.sock in the daemon's own directory
  // An SSD tier of this many bytes in the daemon's directory (ssd_path()); 0: none.
  uint64_t ssd_bytes = 0;
  std::vector<std::string> extra_flags;
  // The network namespace (a name under /var/run/netns, as `ip netns add`
  // makes) the daemon runs in, a separate host of its own for tests of
  // several daemons; empty: the test's own. Its Unix sockets stay reachable
  // (they live in the file system).
  std::string network_namespace;
  // The bearer token the start-up probe and NewClient() send (for a daemon
  // started with --principals-file); empty: none.
  std::string token;
};

class DaemonProcess {
 public:
  // Starts the daemon and waits (up to 20 s) until it answers GetServerInfo.
  // The daemon is killed when the calling thread exits (PR_SET_PDEATHSIG, so
  // a crashed test leaves none behind): start it from a thread that outlives
  // it, such as the test's own.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const DaemonOptions& options = {});
  ~DaemonProcess();  // SIGKILLs a daemon that is still running

  // SIGTERM, then waits; the daemon's exit code (or 128+signal).
  int Stop();
  // True while the process runs.
  bool Running();

  std::string unix_target() const { return "unix://" + socket_path_; }
  const std::string& socket_path() const { return socket_path_; }
  std::string tcp_target() const { return "127.0.0.1:" + std::to_string(tcp_port_); }
  int metrics_port() const { return metrics_port_; }
  const std::string& log_path() const { return log_path_; }
  // The daemon's own temporary directory (removed with it).
  const std::string& dir() const { return dir_; }
  // The SSD tier's file when DaemonOptions::ssd_bytes is set.
  std::string ssd_path() const { return dir_ + "/ssd.bin"; }
  // Flips a byte in the middle of every 4 KiB page of the SSD tier's file:
  // every header and payload on it is damaged. False when the file cannot be
  // read or written.
  bool CorruptSsdFile() const;

  // A client in `ns` (empty: default) over the Unix socket, on the data path
  // TestDataPath() names, sending DaemonOptions::token (or `token`).
  std::unique_ptr<Client> NewClient(const std::string& ns = "") const;
  std::unique_ptr<Client> NewClient(const std::string& ns, DataPath path) const;
  std::unique_ptr<Client> NewClient(const std::string& ns, DataPath path,
                                    const std::string& token) const;
  pid_t pid() const { return pid_; }
  // DaemonOptions::network_namespace.
  const std::string& network_namespace() const { return network_namespace_; }

 private:
  DaemonProcess() = default;
  pid_t pid_ = -1;
  std::string dir_;
  std::string socket_path_;
  std::string log_path_;
  std::string network_namespace_;
  int tcp_port_ = 0;
  int metrics_port_ = 0;
  std::string token_;
};

// The data path test clients use: $KVCACHE_TEST_DATA_PATH ("grpc", "shm";
// unset or anything else: auto, i.e. shared memory over the Unix socket).
// CMake runs the main integration suites once per path.
DataPath TestDataPath();

// Runs `command` through the shell to its exit: {exit code (-1 when it did
// not exit normally), stdout and stderr together}.
std::pair<int, std::string> RunShell(const std::string& command);

// RunShell's answer with names, and with `stdin_text` (no single quotes) fed
// to the command's standard input when given.
struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};
CommandResult RunCommand(const std::string& command, const std::string& stdin_text = "");

// A free TCP port on 127.0.0.1 (bound once and released).
int PickFreePort();

// Path of the kvcached binary under test (from the build).
std::string KvcachedPath();

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_DAEMON_PROCESS_H_
