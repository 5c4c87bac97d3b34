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
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
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
  bool Refresh();
  uint64_t installed() const;  // sets installed so far (the first included)

 private:
  TlsMirror(TlsFiles files, std::string dir);
  absl::Status Install(const TlsMaterial& material);
  void Loop();

  const TlsFiles files_;
  const std::string dir_;
  TlsFiles mirrored_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  TlsMaterial current_;
  uint64_t generation_ = 0;
  std::string last_error_;
  std::thread thread_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_TLS_MIRROR_H_
