// TlsMirror: what gRPC reads the TCP listener's certificate, key and client
// CA from.
//
// gRPC (1.51) re-reads its certificate files every interval and uses whatever
// it reads, so an operator who renews the key before the certificate (two
// files cannot be replaced at once) would have every handshake fail until
// both are new. The mirror stands between: it re-reads the configured files
// itself and installs a set only once its key matches its certificate, into
// a private directory whose `current` link it swaps atomically. gRPC watches
// the files under that link. A set that does not load or does not match is
// logged once and the last good one stays in use.
#ifndef KVCACHE_SERVER_SECURITY_TLS_MIRROR_H_
#define KVCACHE_SERVER_SECURITY_TLS_MIRROR_H_

#include <condition_variable>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "server/common/mutex.h"
#include "server/security/tls_files.h"

namespace kvcache {

class TlsMirror {
 public:
  // Reads `files` (an error stops the start), installs them under a private
  // directory (mode 0700) in `runtime_dir`, and re-reads them every
  // files.reload_interval on a thread of its own.
  static absl::StatusOr<std::unique_ptr<TlsMirror>> Start(const TlsFiles& files,
                                                          const std::string& runtime_dir);
  ~TlsMirror();  // stops the thread and removes the private directory

  // The files gRPC should watch: the mirror's, with the same reload interval.
  const TlsFiles& mirrored() const { return mirrored_; }
  // Re-reads the configured files now; false when they did not install.
  bool Refresh() ABSL_LOCKS_EXCLUDED(mu_);
  // Sets installed so far (the first included).
  uint64_t installed() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  TlsMirror(TlsFiles files, std::string dir);
  absl::Status Install(const TlsMaterial& material) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const TlsFiles files_;
  const std::string dir_;
  TlsFiles mirrored_;
  mutable Mutex mu_;
  std::condition_variable_any wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  TlsMaterial current_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // set by Start(), joined by the destructor
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_TLS_MIRROR_H_
