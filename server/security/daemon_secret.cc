#include "server/security/daemon_secret.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "server/common/status_macros.h"

namespace kvcache {
namespace {

absl::Status ErrnoStatus(int err, std::string_view what, const std::string& path) {
  const std::string message = absl::StrCat(absl::string_view(what.data(), what.size()), " ", path,
                                           ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

absl::Status WriteNewSecret(const std::string& path, const SecretKey& bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, "cannot create the daemon secret", tmp);
  // The umask cannot widen 0600, but a pre-existing file could be wider.
  ::fchmod(fd, 0600);
  const std::string text =
      absl::StrCat(absl::BytesToHexString(absl::string_view(
                       reinterpret_cast<const char*>(bytes.data()), bytes.size())),
                   "\n");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus(err, "cannot write the daemon secret", tmp);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot sync the daemon secret", tmp);
  }
  // link() rather than rename(): two daemons starting at once both keep the
  // first secret written.
  if (::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot create the daemon secret", path);
  }
  ::unlink(tmp.c_str());
  return absl::OkStatus();
}

}  // namespace

DaemonSecret DaemonSecret::Random() {
  SecretKey bytes;
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    // OpenSSL's CSPRNG does not fail once seeded; a process that cannot seed
    // it cannot keep anything secret.
    std::abort();
  }
  return DaemonSecret(bytes);
}

absl::StatusOr<DaemonSecret> DaemonSecret::LoadOrCreate(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("security.secret_file is empty");
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) {
    KVCACHE_RETURN_IF_ERROR(WriteNewSecret(path, Random().bytes_));
  }
  return Load(path, "the daemon secret");
}

absl::StatusOr<DaemonSecret> DaemonSecret::Load(const std::string& path, std::string_view what) {
  const std::string name(what);
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("no file named for ", name));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", name), path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat ", name), path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(name, " ", path, " is not a regular file"));
  }
  if ((st.st_mode & 0077) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("%s %s has mode %04o: others than its owner may read or write it "
                        "(chmod 600 it, and create a new secret if it may have been read)",
                        name, path, st.st_mode & 07777));
  }
  char text[80];
  ssize_t n;
  do {
    n = ::read(fd, text, sizeof(text));
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoStatus(err, absl::StrCat("cannot read ", name), path);
  absl::string_view hex(text, static_cast<size_t>(n));
  absl::ConsumeSuffix(&hex, "\n");
  if (hex.size() != 2 * kBytes || !absl::c_all_of(hex, absl::ascii_isxdigit)) {
    return absl::DataLossError(
        absl::StrCat(name, " ", path, " does not hold 64 hexadecimal digits"));
  }
  const std::string raw = absl::HexStringToBytes(hex);
  SecretKey bytes;
  std::memcpy(bytes.data(), raw.data(), bytes.size());
  return DaemonSecret(bytes);
}

SecretKey DaemonSecret::Derive(std::string_view purpose) const {
  return HmacSha256(bytes_, purpose);
}

uint64_t DaemonSecret::DeriveSeed(std::string_view purpose) const {
  const SecretKey key = Derive(purpose);
  uint64_t seed;
  std::memcpy(&seed, key.data(), sizeof(seed));
  return seed;
}

SecretKey HmacSha256(const SecretKey& key, std::span<const uint8_t> data) {
  HmacStream mac(key);
  mac.Update(data);
  return mac.Finish();
}

SecretKey HmacSha256(const SecretKey& key, std::string_view data) {
  return HmacSha256(
      key, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
}

bool MacEquals(const SecretKey& a, const SecretKey& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

struct HmacStream::State {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* ctx = nullptr;
};

HmacStream::HmacStream(const SecretKey& key) : state_(new State) {
  state_->mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  state_->ctx = state_->mac != nullptr ? EVP_MAC_CTX_new(state_->mac) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                         OSSL_PARAM_construct_end()};
  if (state_->ctx == nullptr || EVP_MAC_init(state_->ctx, key.data(), key.size(), params) != 1) {
    std::abort();  // HMAC-SHA256 is in every OpenSSL build kvcached supports
  }
}

HmacStream::~HmacStream() {
  EVP_MAC_CTX_free(state_->ctx);
  EVP_MAC_free(state_->mac);
  delete state_;
}

void HmacStream::Update(std::span<const uint8_t> data) {
  if (!data.empty()) EVP_MAC_update(state_->ctx, data.data(), data.size());
}

void HmacStream::Update(std::string_view data) {
  Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
}

SecretKey HmacStream::Finish() {
  SecretKey out{};
  size_t len = 0;
  EVP_MAC_final(state_->ctx, out.data(), &len, out.size());
  return out;
}

}  // namespace kvcache
