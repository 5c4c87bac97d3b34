#include "server/security/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <iterator>
#include <memory>

#include "absl/strings/str_cat.h"

namespace kvcache {

namespace {

std::string OpensslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, std::string_view setting) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(std::string(setting), " ", path, " cannot be read"));
  }
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
Bio MemoryBio(const std::string& bytes) {
  return Bio(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())), BIO_free);
}

}  // namespace

absl::Status CheckTlsMaterial(const TlsMaterial& m) {
  ERR_clear_error();
  Bio cert_bio = MemoryBio(m.cert_chain);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the certificate file holds no PEM certificate: ", OpensslError()));
  }
  Bio key_bio = MemoryBio(m.private_key);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the key file holds no PEM private key: ", OpensslError()));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the key is not the key of the certificate");
  }
  if (!m.client_ca.empty()) {
    Bio ca_bio = MemoryBio(m.client_ca);
    std::unique_ptr<X509, decltype(&X509_free)> ca(
        PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr), X509_free);
    if (ca == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the client CA file holds no PEM certificate: ", OpensslError()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TlsMaterial> ReadTlsMaterial(const TlsFiles& files) {
  TlsMaterial m;
  absl::StatusOr<std::string> cert = ReadFile(files.cert_file, "security.tls.cert_file");
  if (!cert.ok()) return cert.status();
  m.cert_chain = *std::move(cert);
  absl::StatusOr<std::string> key = ReadFile(files.key_file, "security.tls.key_file");
  if (!key.ok()) return key.status();
  m.private_key = *std::move(key);
  if (files.mutual()) {
    absl::StatusOr<std::string> ca = ReadFile(files.client_ca_file, "security.tls.client_ca_file");
    if (!ca.ok()) return ca.status();
    m.client_ca = *std::move(ca);
    if (m.client_ca.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("security.tls.client_ca_file ", files.client_ca_file, " is empty"));
    }
  }
  if (absl::Status s = CheckTlsMaterial(m); !s.ok()) {
    std::string message(s.message());
    if (message == "the key is not the key of the certificate") {
      message = absl::StrCat("security.tls.key_file ", files.key_file,
                             " is not the key of the certificate in ", files.cert_file);
    } else {
      message = absl::StrCat("security.tls (", files.cert_file, ", ", files.key_file,
                             files.mutual() ? ", " + files.client_ca_file : "", "): ", message);
    }
    return absl::InvalidArgumentError(message);
  }
  return m;
}

absl::Status CheckTlsFiles(const TlsFiles& files) {
  if (!files.enabled()) return absl::OkStatus();
  return ReadTlsMaterial(files).status();
}

}  // namespace kvcache
