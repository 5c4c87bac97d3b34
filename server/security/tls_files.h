// TlsFiles: the TCP listener's certificate, key and client CA (security.tls),
// and the check that they load before the daemon starts serving.
//
// gRPC re-reads the files every reload_interval (FileWatcherCertificateProvider),
// so a renewed certificate needs no restart and drops no connection; a file
// that stops loading keeps the last good one in use. CheckTlsFiles() makes a
// wrong path or a key that does not match its certificate a clear start-up
// error rather than a handshake failure on every connection.
#ifndef KVCACHE_SERVER_SECURITY_TLS_FILES_H_
#define KVCACHE_SERVER_SECURITY_TLS_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvcache {

struct TlsFiles {
  std::string cert_file;       // PEM chain; empty: no TLS
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM CA bundle; set: mutual TLS
  absl::Duration reload_interval = absl::Seconds(10);

  bool enabled() const { return !cert_file.empty(); }
  bool mutual() const { return !client_ca_file.empty(); }
};

// The bytes of one certificate set.
struct TlsMaterial {
  std::string cert_chain;
  std::string private_key;
  std::string client_ca;  // empty: no mutual TLS

  friend bool operator==(const TlsMaterial&, const TlsMaterial&) = default;
};

// Reads `files` and checks them (CheckTlsMaterial). Errors name the file.
absl::StatusOr<TlsMaterial> ReadTlsMaterial(const TlsFiles& files);
// OK when the chain and key parse and match, and the CA bundle (if any)
// holds a certificate.
absl::Status CheckTlsMaterial(const TlsMaterial& material);

// OK when the certificate chain and key load and match, and the CA bundle (if
// any) holds at least one certificate; otherwise INVALID_ARGUMENT (or
// NOT_FOUND for a missing file) naming the file and what is wrong.
absl::Status CheckTlsFiles(const TlsFiles& files);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SECURITY_TLS_FILES_H_
