// The calibration file: importance weights that online calibration settled
// on, saved so a restarted daemon starts from them (config field
// importance.calibration_file). JSON in the proto3 mapping of
// kvcache.v1.CalibratedWeights.
//
// Thread-safety: plain functions; the daemon calls them from one thread.
#ifndef KVCACHE_SERVER_CONFIG_CALIBRATION_FILE_H_
#define KVCACHE_SERVER_CONFIG_CALIBRATION_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvcache/v1/config.pb.h"

namespace kvcache {

// NOT_FOUND when the file does not exist (a first start); INVALID_ARGUMENT
// naming the path when it does not parse or holds a weight outside [0, 1].
absl::StatusOr<v1::CalibratedWeights> LoadCalibrationFile(const std::string& path);

// Writes `weights` to a temporary file beside `path` and renames it over
// `path`, so a crash never leaves a half-written file. INTERNAL with the
// reason when it cannot.
absl::Status SaveCalibrationFile(const std::string& path, const v1::CalibratedWeights& weights);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CONFIG_CALIBRATION_FILE_H_
