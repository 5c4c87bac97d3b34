// Fuzz target: kvcache-eval's safetensors reader (tests/eval/safetensors.h),
// which loads KV dumps written by other programs.
//
// Input: the file's bytes. Properties: ParseSafetensors and
// DatasetFromSafetensors never read outside the file (ASan) and fail only
// with the documented codes; every tensor they accept lies inside the data
// buffer; a dataset they accept is valid and writes out as a KV dump that
// reads back to the same values (fp32, exact).
#include <string>

#include "tests/eval/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

bool FormatError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kDataLoss;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace eval = kvcache::eval;
  absl::StatusOr<eval::SafetensorsFile> file =
      eval::ParseSafetensors(std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) {
    FUZZ_CHECK(FormatError(file.status()));
    return 0;
  }
  FUZZ_CHECK(file->data_start <= file->bytes.size());
  const uint64_t data_bytes = file->bytes.size() - file->data_start;
  for (const eval::TensorEntry& t : file->tensors) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= data_bytes);
    FUZZ_CHECK(file->Find(t.name) != nullptr);
    FUZZ_CHECK(file->Data(t).size() == t.end - t.begin);
  }
  absl::StatusOr<eval::KvDataset> dataset = eval::DatasetFromSafetensors(*file);
  if (!dataset.ok()) {
    FUZZ_CHECK(FormatError(dataset.status()));
    return 0;
  }
  FUZZ_CHECK(dataset->Validate().ok());
  absl::StatusOr<std::string> dump =
      eval::EncodeKvDump(*dataset, kvcache::kernels::DType::kFloat32);
  FUZZ_CHECK(dump.ok());
  absl::StatusOr<eval::SafetensorsFile> file2 = eval::ParseSafetensors(*dump);
  FUZZ_CHECK(file2.ok());
  absl::StatusOr<eval::KvDataset> again = eval::DatasetFromSafetensors(*file2);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->q.size() == dataset->q.size());
  for (size_t l = 0; l < dataset->q.size(); ++l) {
    // Bitwise, so that NaN payloads count too.
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    FUZZ_CHECK(same(again->q[l], dataset->q[l]));
    FUZZ_CHECK(same(again->k[l], dataset->k[l]));
    FUZZ_CHECK(same(again->v[l], dataset->v[l]));
  }
  return 0;
}
