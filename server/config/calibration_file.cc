#include "server/config/calibration_file.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace kvcache {

absl::StatusOr<v1::CalibratedWeights> LoadCalibrationFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("calibration file ", path, " does not exist"));
  std::stringstream text;
  text << in.rdbuf();
  v1::CalibratedWeights weights;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(text.str(), &weights, options);
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
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    out << json;
    out.flush();
    if (!out) {
      return absl::InternalError(absl::StrCat("cannot write ", temp, ": ", std::strerror(errno)));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename ", temp, " to ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace kvcache
