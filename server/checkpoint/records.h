// Records: the cache's images (server/core/block_image.h) as checkpoint
// records (proto/kvcache/v1/checkpoint.proto; docs/checkpoint-format.md,
// "Record contents"), and back.
//
// Decoding validates what a damaged or foreign record could get wrong
// (sizes, counts, enum values) and answers DATA_LOSS naming the field; the
// frame checksums of the container make that rare, the restore never trusts it.
#ifndef KVCACHE_SERVER_CHECKPOINT_RECORDS_H_
#define KVCACHE_SERVER_CHECKPOINT_RECORDS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kvcache/v1/checkpoint.pb.h"
#include "server/core/block_image.h"
#include "server/core/tier.h"

namespace kvcache::checkpoint {

// The caller's record types in a checkpoint's data file.
enum class RecordType : uint8_t {
  kModel = 1,       // CheckpointModel
  kBlock = 2,       // CheckpointBlock
  kPayload = 3,     // a block's host payload bytes
  kPayloadRef = 4,  // CheckpointPayloadRef
  kLowerIndex = 5,  // CheckpointLowerIndex
};

// Where a checkpoint wrote a block's host payload, by model and lookup hash:
// what the next incremental checkpoint refers to instead of writing it again.
struct PayloadRecord {
  uint64_t sequence = 0;
  uint64_t offset = 0;
  uint64_t checksum = 0;  // the payload's, to tell an unchanged block
};
using PayloadMap = absl::flat_hash_map<ModelKey, absl::flat_hash_map<uint64_t, PayloadRecord>>;

v1::CheckpointModel EncodeModel(const ModelImage& image, uint64_t blocks);
absl::StatusOr<ModelImage> DecodeModel(const v1::CheckpointModel& record);

// `lower` is where the block's lower copy lives (nullopt: none, or a store
// that cannot re-attach).
v1::CheckpointBlock EncodeBlock(const BlockImage& image,
                                const std::optional<StoredLocation>& lower);
// The image without its copies (host and lower stay null: the restore fills
// them), checked against `block_tokens`.
absl::StatusOr<BlockImage> DecodeBlock(const v1::CheckpointBlock& record, uint32_t block_tokens);

}  // namespace kvcache::checkpoint

#endif  // KVCACHE_SERVER_CHECKPOINT_RECORDS_H_
