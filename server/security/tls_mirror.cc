#include "server/security/tls_mirror.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace kvcache {

namespace {

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  if (::chmod(path.c_str(), 0600) != 0) {
    return absl::InternalError(absl::StrCat("cannot chmod ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsMirror>> TlsMirror::Start(const TlsFiles& files,
                                                            const std::string& runtime_dir) {
  absl::StatusOr<TlsMaterial> material = ReadTlsMaterial(files);
  if (!material.ok()) return material.status();
  std::string dir_template = runtime_dir + "/kvcached-tls-XXXXXX";
  if (::mkdtemp(dir_template.data()) == nullptr) {  // mode 0700
    return absl::InternalError(absl::StrCat("cannot create a directory in ", runtime_dir,
                                            " for the TLS files: ", std::strerror(errno)));
  }
  std::unique_ptr<TlsMirror> mirror(new TlsMirror(files, dir_template));
  KVCACHE_RETURN_IF_ERROR(mirror->Install(*material));
  mirror->thread_ = std::thread([m = mirror.get()] { m->Loop(); });
  return mirror;
}

TlsMirror::TlsMirror(TlsFiles files, std::string dir)
    : files_(std::move(files)), dir_(std::move(dir)) {
  mirrored_ = files_;
  mirrored_.cert_file = dir_ + "/current/cert.pem";
  mirrored_.key_file = dir_ + "/current/key.pem";
  if (files_.mutual()) mirrored_.client_ca_file = dir_ + "/current/ca.pem";
}

TlsMirror::~TlsMirror() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

uint64_t TlsMirror::installed() const {
  MutexLock lock(&mu_);
  return generation_;
}

absl::Status TlsMirror::Install(const TlsMaterial& material) {
  MutexLock lock(&mu_);
  if (generation_ != 0 && material == current_) return absl::OkStatus();
  const uint64_t next = generation_ + 1;
  const std::string gen_dir = absl::StrCat(dir_, "/gen-", next);
  std::error_code ec;
  std::filesystem::create_directory(gen_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", gen_dir, ": ", ec.message()));
  for (const auto& [name, bytes] :
       {std::pair<const char*, const std::string*>{"cert.pem", &material.cert_chain},
        {"key.pem", &material.private_key},
        {"ca.pem", &material.client_ca}}) {
    KVCACHE_RETURN_IF_ERROR(WriteFile(absl::StrCat(gen_dir, "/", name), *bytes));
  }
  // The swap: a new link renamed over `current`, so gRPC sees either set whole.
  const std::string link = dir_ + "/current";
  const std::string staged = absl::StrCat(dir_, "/current-", next);
  if (::symlink(absl::StrCat("gen-", next).c_str(), staged.c_str()) != 0 ||
      ::rename(staged.c_str(), link.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot switch ", link, ": ", std::strerror(errno)));
  }
  // The set before the last stays until now: gRPC may have been reading it.
  if (next > 2) std::filesystem::remove_all(absl::StrCat(dir_, "/gen-", next - 2), ec);
  current_ = material;
  generation_ = next;
  last_error_.clear();
  return absl::OkStatus();
}

bool TlsMirror::Refresh() {
  absl::StatusOr<TlsMaterial> material = ReadTlsMaterial(files_);
  absl::Status status = material.ok() ? Install(*material) : material.status();
  MutexLock lock(&mu_);
  if (status.ok()) return true;
  // Logged once per distinct problem: a renewal in progress shows it once.
  if (last_error_ != status.message()) {
    last_error_ = std::string(status.message());
    spdlog::warn("TLS files not reloaded, the last good ones stay in use: {}", last_error_);
  }
  return false;
}

void TlsMirror::Loop() {
  mu_.Lock();  // wake_ waits on the Mutex itself, which the analysis follows
  auto stopping = [this] {
    mu_.AssertHeld();
    return stopping_;
  };
  while (!wake_.wait_for(mu_, absl::ToChronoSeconds(files_.reload_interval), stopping)) {
    mu_.Unlock();
    const uint64_t before = installed();
    if (Refresh() && installed() != before) {
      spdlog::info("TLS files reloaded (set {})", installed());
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace kvcache
