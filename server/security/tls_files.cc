#include "server/security/tls_files.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdio>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvcache {

namespace {

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

absl::StatusOr<File> Open(const std::string& path, std::string_view what) {
  File f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(std::string(what), " ", path, " cannot be read"));
  }
  return f;
}

std::string OpensslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& files) {
  if (!files.enabled()) return absl::OkStatus();
  ERR_clear_error();
  absl::StatusOr<File> cert_file = Open(files.cert_file, "security.tls.cert_file");
  if (!cert_file.ok()) return cert_file.status();
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_X509(cert_file->get(), nullptr, nullptr, nullptr), X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("security.tls.cert_file ", files.cert_file,
                                                   " holds no PEM certificate: ", OpensslError()));
  }
  absl::StatusOr<File> key_file = Open(files.key_file, "security.tls.key_file");
  if (!key_file.ok()) return key_file.status();
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_PrivateKey(key_file->get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("security.tls.key_file ", files.key_file,
                                                   " holds no PEM private key: ", OpensslError()));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("security.tls.key_file ", files.key_file,
                                                   " is not the key of the certificate in ",
                                                   files.cert_file));
  }
  if (files.mutual()) {
    absl::StatusOr<File> ca_file = Open(files.client_ca_file, "security.tls.client_ca_file");
    if (!ca_file.ok()) return ca_file.status();
    std::unique_ptr<X509, decltype(&X509_free)> ca(
        PEM_read_X509(ca_file->get(), nullptr, nullptr, nullptr), X509_free);
    if (ca == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("security.tls.client_ca_file ", files.client_ca_file,
                       " holds no PEM certificate: ", OpensslError()));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvcache
