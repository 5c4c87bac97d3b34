// Test helper for the decoders that read gRPC slices with SliceCursor
// (server/rpc/append_decoder_test.cc, client/src/fetch_decoder_test.cc).
#ifndef KVCACHE_PROTO_SLICE_CURSOR_TEST_UTIL_H_
#define KVCACHE_PROTO_SLICE_CURSOR_TEST_UTIL_H_

#include <grpcpp/support/slice.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace kvcache::wire {

// Splits `wire` into slices at random points (including empty slices).
inline std::vector<grpc::Slice> RandomSlices(const std::string& wire, std::mt19937& rng) {
  std::vector<grpc::Slice> slices;
  size_t pos = 0;
  while (pos < wire.size()) {
    const size_t n = std::min<size_t>(wire.size() - pos, rng() % 7 == 0 ? 0 : 1 + rng() % 40);
    slices.emplace_back(wire.data() + pos, n);
    pos += n;
  }
  return slices;
}

}  // namespace kvcache::wire

#endif  // KVCACHE_PROTO_SLICE_CURSOR_TEST_UTIL_H_
