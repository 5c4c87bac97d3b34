#include "server/config/calibration_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace kvcache {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// The directory holding `path` ("." for a bare file name).
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes all of `data` to `fd`, retrying short writes and EINTR.
bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::CalibratedWeights> LoadCalibrationFile(const std::string& path) {
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (in == nullptr) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("calibration file ", path, " does not exist"));
    }
    return absl::UnavailableError(
        absl::StrCat("calibration file ", path, " cannot be read: ", ErrnoText(err)));
  }
  std::string text;
  char buf[8192];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), in)) > 0) text.append(buf, n);
  const bool read_error = std::ferror(in) != 0;
  const int err = errno;
  std::fclose(in);
  if (read_error) {
    return absl::UnavailableError(
        absl::StrCat("calibration file ", path, " cannot be read: ", ErrnoText(err)));
  }
  v1::CalibratedWeights weights;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(text, &weights, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration file ", path, ": ", status.message().as_string()));
  }
  for (const v1::CalibratedWeights::Model& m : weights.models()) {
    for (float w : {m.alpha(), m.beta(), m.gamma()}) {
      if (!std::isfinite(w) || w < 0 || w > 1) {
        return absl::InvalidArgumentError(absl::StrCat("calibration file ", path, ": model ",
                                                       m.model_id(), " has a weight ", w,
                                                       " outside [0, 1]"));
      }
    }
    if (m.alpha() + m.beta() + m.gamma() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration file ", path, ": model ", m.model_id(), " has all weights 0"));
    }
  }
  return weights;
}

absl::Status SaveCalibrationFile(const std::string& path, const v1::CalibratedWeights& weights) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(weights, &json, options).ok()) {
    return absl::InternalError("calibration weights do not serialise");
  }
  // A uniquely named temporary file in the same directory (so the rename
  // cannot cross file systems), made durable before it replaces `path`.
  std::string temp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary file beside ", path, ": ", ErrnoText(errno)));
  }
  auto fail = [&](const std::string& what, int err) {
    ::unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot ", what, ": ", ErrnoText(err)));
  };
  if (!WriteAll(fd, json)) {
    const int err = errno;
    ::close(fd);
    return fail(absl::StrCat("write ", temp), err);
  }
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(absl::StrCat("sync ", temp), err);
  }
  if (::close(fd) != 0) return fail(absl::StrCat("close ", temp), errno);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    return fail(absl::StrCat("rename ", temp, " to ", path), errno);
  }
  // The rename is durable once the directory is.
  const std::string dir = DirectoryOf(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open ", dir, " to sync it: ", ErrnoText(errno)));
  }
  const int synced = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  if (synced != 0) {
    return absl::InternalError(absl::StrCat("cannot sync directory ", dir, ": ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

}  // namespace kvcache
