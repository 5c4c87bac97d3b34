// Fuzz target: the checkpoint's record contents (server/checkpoint/records.h):
// the model and block records a restore decodes after their frame checksums
// passed, which it still does not trust.
//
// Input: byte 0 picks the record (even: CheckpointModel, odd:
// CheckpointBlock), byte 1 the model's block_tokens (1..256) for a block, the
// rest is the serialized message. Properties: decoding never crashes and
// fails only with DATA_LOSS; what decodes encodes to a record that decodes
// again to the same record.
#include <string>

#include "server/checkpoint/records.h"
#include "tests/fuzz/fuzz_check.h"

namespace kvcache::checkpoint {
namespace {

void Model(const std::string& bytes) {
  v1::CheckpointModel record;
  if (!record.ParseFromString(bytes)) return;
  absl::StatusOr<ModelImage> image = DecodeModel(record);
  if (!image.ok()) {
    FUZZ_CHECK(image.status().code() == absl::StatusCode::kDataLoss);
    return;
  }
  const v1::CheckpointModel encoded = EncodeModel(*image, record.blocks());
  absl::StatusOr<ModelImage> again = DecodeModel(encoded);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(EncodeModel(*again, record.blocks()).SerializeAsString() ==
             encoded.SerializeAsString());
}

void Block(const std::string& bytes, uint32_t block_tokens) {
  v1::CheckpointBlock record;
  if (!record.ParseFromString(bytes)) return;
  absl::StatusOr<BlockImage> image = DecodeBlock(record, block_tokens);
  if (!image.ok()) {
    FUZZ_CHECK(image.status().code() == absl::StatusCode::kDataLoss);
    return;
  }
  std::optional<StoredLocation> lower;
  if (record.has_lower()) {
    lower = StoredLocation{.offset = record.lower().offset(),
                           .footprint = record.lower().footprint(),
                           .sequence = record.lower().sequence(),
                           .epoch = record.lower().epoch()};
  }
  // DecodeBlock leaves the copies null: the host copy's flag is the record's.
  v1::CheckpointBlock encoded = EncodeBlock(*image, lower);
  encoded.set_has_host_copy(record.has_host_copy());
  absl::StatusOr<BlockImage> again = DecodeBlock(encoded, block_tokens);
  FUZZ_CHECK(again.ok());
  v1::CheckpointBlock encoded_again = EncodeBlock(*again, lower);
  encoded_again.set_has_host_copy(record.has_host_copy());
  FUZZ_CHECK(encoded_again.SerializeAsString() == encoded.SerializeAsString());
}

}  // namespace
}  // namespace kvcache::checkpoint

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvcache::fuzz::InputReader in(data, size);
  const uint8_t kind = in.Byte();
  const uint32_t block_tokens = 1 + in.Byte();
  const std::string rest(reinterpret_cast<const char*>(in.rest()), in.rest_size());
  if (kind % 2 == 0) {
    kvcache::checkpoint::Model(rest);
  } else {
    kvcache::checkpoint::Block(rest, block_tokens);
  }
  return 0;
}
