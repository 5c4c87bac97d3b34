#include "append_encoder.h"

namespace kvcache::internal {

size_t KvChunkPrefix(uint64_t size, uint8_t out[kMaxKvChunkPrefixBytes]) {
  uint8_t* p = out;
  *p++ = 0x12;  // kv_chunk = 2, length-delimited
  while (size >= 0x80) {
    *p++ = static_cast<uint8_t>(size) | 0x80;
    size >>= 7;
  }
  *p++ = static_cast<uint8_t>(size);
  return static_cast<size_t>(p - out);
}

AppendEncoder::AppendEncoder() : count_(std::make_shared<Count>()) {}

grpc::ByteBuffer AppendEncoder::KvChunk(std::span<const std::byte> data) {
  uint8_t prefix[kMaxKvChunkPrefixBytes];
  const size_t prefix_bytes = KvChunkPrefix(data.size(), prefix);
  if (data.empty()) {
    grpc::Slice only(prefix, prefix_bytes);
    return grpc::ByteBuffer(&only, 1);
  }
  {
    absl::MutexLock lock(&count_->mu);
    ++count_->borrowed;
  }
  grpc::Slice slices[2] = {
      grpc::Slice(prefix, prefix_bytes),  // copied (inlined: it is small)
      grpc::Slice(const_cast<std::byte*>(data.data()), data.size(), &AppendEncoder::Release,
                  new std::shared_ptr<Count>(count_))};
  return grpc::ByteBuffer(slices, 2);
}

void AppendEncoder::Release(void* count) {
  auto* ref = static_cast<std::shared_ptr<Count>*>(count);
  {
    absl::MutexLock lock(&(*ref)->mu);
    --(*ref)->borrowed;
  }
  delete ref;
}

bool AppendEncoder::WaitUntilReleased(absl::Duration timeout) {
  absl::MutexLock lock(&count_->mu);
  return count_->mu.AwaitWithTimeout(
      absl::Condition(
          +[](int64_t* borrowed) { return *borrowed == 0; }, &count_->borrowed),
      timeout);
}

int64_t AppendEncoder::borrowed() const {
  absl::MutexLock lock(&count_->mu);
  return count_->borrowed;
}

}  // namespace kvcache::internal
