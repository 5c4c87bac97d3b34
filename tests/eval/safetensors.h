// kvcache-eval: reading and writing KV dumps in the safetensors format.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON header, then the data buffer. The header maps tensor names to
// {"dtype", "shape", "data_offsets": [begin, end)} with offsets relative to
// the start of the data buffer, plus an optional "__metadata__" object of
// string values. docs/importance.md ("The KV dump schema") fixes which
// tensors a KV dump holds:
//   layer{L}.q  [q_heads, tokens, head_dim]   F16, BF16 or F32
//   layer{L}.k  [kv_heads, tokens, head_dim]  F16, BF16 or F32
//   layer{L}.v  [kv_heads, tokens, head_dim]  F16, BF16 or F32
//   positions   [tokens]                      I32 or I64, exactly 0..tokens-1
// for L = 0..layers-1; queries and keys after rotary embedding. Tensors with
// other names are ignored (counted in the dataset's description).
//
// Every check names the tensor and the field at fault: a file shorter than
// its header claims, malformed JSON, an unknown dtype, a shape whose byte
// size disagrees with its offsets, offsets beyond the data buffer or
// overlapping another tensor, then the schema (missing tensors, dtype not
// allowed for the name, inconsistent shapes, positions not 0..tokens-1).
// Errors are INVALID_ARGUMENT (format), NOT_FOUND (the file) or DATA_LOSS
// (a truncated file). Nothing is read outside the file's bytes.
//
// Thread-safety: pure functions.
#ifndef KVCACHE_TESTS_EVAL_SAFETENSORS_H_
#define KVCACHE_TESTS_EVAL_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvcache/kernels/types.h"
#include "tests/eval/dataset.h"

namespace kvcache::eval {

// Largest header accepted (the format's reference implementation uses the same cap).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorEntry {
  std::string name;
  std::string dtype;  // as written, e.g. "F16"
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data buffer, [begin, end)
  uint64_t end = 0;
};

struct SafetensorsFile {
  std::vector<TensorEntry> tensors;                           // header order
  std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__"
  std::string bytes;                                          // the whole file
  uint64_t data_start = 0;  // offset of the data buffer in `bytes`

  const TensorEntry* Find(std::string_view name) const;
  // The tensor's bytes (validated to lie inside the data buffer).
  std::string_view Data(const TensorEntry& t) const;
};

// Bytes of one element of a safetensors dtype name; 0 when unknown.
uint64_t SafetensorsDTypeSize(std::string_view dtype);

// Validates the framing and the header (not the KV schema) of `bytes`.
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string bytes);

// Validates the KV dump schema and converts every tensor to fp32.
absl::StatusOr<KvDataset> DatasetFromSafetensors(const SafetensorsFile& file);

// Reads and validates the KV dump at `path`.
absl::StatusOr<KvDataset> LoadKvDump(const std::string& path);

// The bytes of a KV dump of `data` (see WriteKvDump).
absl::StatusOr<std::string> EncodeKvDump(const KvDataset& data, kernels::DType dtype);

// Writes `data` as a KV dump with q/k/v in `dtype` (kFloat16, kBFloat16 or
// kFloat32) and positions as I64; metadata format = "kvcache-eval/1".
absl::Status WriteKvDump(const std::string& path, const KvDataset& data, kernels::DType dtype);

// An 8-byte length, `header` and `data`: the raw framing, for tests that
// need to write malformed files.
std::string FrameSafetensors(std::string_view header, std::string_view data);

}  // namespace kvcache::eval

#endif  // KVCACHE_TESTS_EVAL_SAFETENSORS_H_
