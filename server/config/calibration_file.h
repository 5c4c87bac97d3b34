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

// NOT_FOUND when the file does not exist (a first start); UNAVAILABLE when
// it cannot be read; INVALID_ARGUMENT naming the path when it does not parse
// or holds a weight outside [0, 1]. The daemon starts from its configured
// weights on any error, logging it (the file is advisory, never a reason
// to stay down).
absl::StatusOr<v1::CalibratedWeights> LoadCalibrationFile(const std::string& path);

// Writes `weights` atomically and durably: to a new temporary file in
// `path`'s directory, fsync()ed, renamed over `path`, then the directory
// fsync()ed. A crash or a failed write leaves either the previous file or
// the new one, never a torn one, and no temporary file remains after an
// error. INTERNAL with the reason when it cannot.
absl::Status SaveCalibrationFile(const std::string& path, const v1::CalibratedWeights& weights);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CONFIG_CALIBRATION_FILE_H_
