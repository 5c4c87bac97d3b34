// Fuzz target: the calibration file (server/config/calibration_file.h), which
// a restarting daemon reads from disk and must never trust.
//
// Input: the file's bytes, written to a file of this process's own in the
// temporary folder and loaded with LoadCalibrationFile. Properties: it never
// crashes; it fails only with INVALID_ARGUMENT (the file exists and is
// readable); every weight it accepts is finite and within [0, 1].
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "server/config/calibration_file.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// Globals of one file are destroyed in reverse order: the path outlives the remover.
const std::string input_path = (std::filesystem::temp_directory_path() /
                                ("kvcached-calibration-fuzz." + std::to_string(getpid()) + ".json"))
                                   .string();

// Removes the input file when the process exits normally.
struct RemoveAtExit {
  ~RemoveAtExit() { std::remove(input_path.c_str()); }
} remove_at_exit;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(input_path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr);
  FUZZ_CHECK(std::fwrite(data, 1, size, f) == size);
  FUZZ_CHECK(std::fclose(f) == 0);
  absl::StatusOr<kvcache::v1::CalibratedWeights> weights = kvcache::LoadCalibrationFile(input_path);
  if (!weights.ok()) {
    FUZZ_CHECK(weights.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  for (const auto& m : weights->models()) {
    for (float w : {m.alpha(), m.beta(), m.gamma()}) {
      FUZZ_CHECK(std::isfinite(w) && w >= 0 && w <= 1);
    }
  }
  return 0;
}
