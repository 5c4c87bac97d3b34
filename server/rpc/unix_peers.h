// UnixPeers: the credentials of the gRPC Unix socket's connections, read when
// they were accepted and bound to the descriptor gRPC got.
//
// gRPC names a connection handed to it by descriptor ("fd:N"), and a handler
// learns nothing else about its peer. Reading SO_PEERCRED of descriptor N
// when the handler runs is a race: gRPC may close N while calls of that
// connection are still pending (newer gRPC does), and the next connection
// accepted may get N again, so a late handler would read the newcomer's uid.
// So the credentials are read once, at accept (Adopt), and kept with the
// socket's identity (device and inode). UidOf(N) answers only while N is still
// that socket. A descriptor number that a connection handed to gRPC before
// has used is never handed to gRPC again right away. Adopt moves the new
// connection to another number and holds the old one with a placeholder
// (/dev/null) for `quarantine`. A call of a closed connection whose handler
// runs that late reads the placeholder and gets no uid, never another
// peer's. At most `max_quarantined` numbers are held; past that the oldest
// hold is released early (and logged).
//
// Thread-safe: Adopt runs on the acceptor's thread, UidOf on handlers'.
#ifndef KVCACHE_SERVER_RPC_UNIX_PEERS_H_
#define KVCACHE_SERVER_RPC_UNIX_PEERS_H_

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/common/clock.h"
#include "server/common/mutex.h"

namespace kvcache {

struct UnixPeersOptions {
  absl::Duration quarantine = absl::Minutes(1);
  size_t max_quarantined = 256;
  Clock* clock = SystemClock::Get();
};

class UnixPeers {
 public:
  explicit UnixPeers(UnixPeersOptions options = {});
  ~UnixPeers();  // releases the placeholders
  UnixPeers(const UnixPeers&) = delete;
  UnixPeers& operator=(const UnixPeers&) = delete;

  // The process's table, which UnixAcceptor fills and PeerUidOf reads
  // (descriptor numbers are the process's, so one table serves every
  // acceptor).
  static UnixPeers& Process();

  // Takes `fd`, a connected Unix socket, reads its peer's credentials, and
  // returns the descriptor to hand gRPC: `fd`, or a duplicate at a number
  // no connection adopted before holds (`fd` is then closed). INTERNAL when
  // the credentials cannot be read or no descriptor is left (`fd` closed).
  absl::StatusOr<int> Adopt(int fd);

  // The uid of the peer of the connection adopted at descriptor `fd`, while
  // `fd` is still that connection's socket; nullopt otherwise.
  std::optional<uid_t> UidOf(int fd) const;

  // Descriptor numbers held now (for tests).
  size_t quarantined() const;

 private:
  struct Peer {
    uid_t uid;
    dev_t dev;
    ino_t ino;
  };
  // Closes the placeholders held longer than the quarantine, or past the cap.
  void ReleaseLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const UnixPeersOptions options_;
  const int placeholder_;  // /dev/null, dup'ed over numbers that are held
  mutable Mutex mu_;
  absl::flat_hash_map<int, Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<int, absl::Time>> held_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_UNIX_PEERS_H_
