// Fuzz target: the SSD tier's extent header codec (server/tier/ssd_layout.h,
// docs/ssd_format.md), which reads headers back from a file anyone with the
// file's mode could have written, on every read-back and at every re-attach.
//
// Input: byte 0 picks the mode; the rest drives it.
//   even: the rest is a header as read from the file. Properties: decoding
//     is OK or DATA_LOSS, never anything else; a header that decodes encodes
//     back to one that decodes to the same fields.
//   odd: six 8-byte fields make a header, which is encoded; then pairs of
//     (offset, xor mask) bytes damage it. Property: damaged bytes are either
//     refused (DATA_LOSS) or, if the header still decodes, it decodes to the
//     fields that were written: damage never passes as other fields.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "server/tier/ssd_layout.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using kvcache::ssd_internal::DecodeHeader;
using kvcache::ssd_internal::EncodeHeader;
using kvcache::ssd_internal::ExtentHeader;
using kvcache::ssd_internal::kHeaderBytes;

bool SameFields(const ExtentHeader& a, const ExtentHeader& b) {
  return a.key == b.key && a.payload_bytes == b.payload_bytes && a.sequence == b.sequence &&
         a.epoch == b.epoch && a.payload_checksum == b.payload_checksum &&
         a.footprint == b.footprint;
}

uint64_t Field(kvcache::fuzz::InputReader& in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{in.Byte()} << (8 * i);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvcache::fuzz::InputReader in(data, size);
  const uint8_t mode = in.Byte();
  if (mode % 2 == 0) {
    const auto* bytes = reinterpret_cast<const std::byte*>(in.rest());
    ExtentHeader header;
    const absl::Status s = DecodeHeader({bytes, in.rest_size()}, "fuzz", &header);
    FUZZ_CHECK(s.ok() || absl::IsDataLoss(s));
    if (s.ok()) {
      std::array<std::byte, kHeaderBytes> again{};
      EncodeHeader(header, again);
      ExtentHeader decoded;
      FUZZ_CHECK(DecodeHeader(again, "fuzz", &decoded).ok());
      FUZZ_CHECK(SameFields(header, decoded));
    }
    return 0;
  }
  ExtentHeader written;
  written.key = Field(in);
  written.payload_bytes = Field(in);
  written.sequence = Field(in);
  written.epoch = Field(in);
  written.payload_checksum = Field(in);
  written.footprint = Field(in);
  std::array<std::byte, kHeaderBytes> header{};
  EncodeHeader(written, header);
  ExtentHeader decoded;
  FUZZ_CHECK(DecodeHeader(header, "fuzz", &decoded).ok());
  FUZZ_CHECK(SameFields(written, decoded));
  while (in.rest_size() >= 2) {
    const uint8_t at = in.Byte() % kHeaderBytes;
    const uint8_t mask = in.Byte();
    header[at] ^= std::byte{mask};
  }
  // A shorter read than a header (the tail cut off) is refused too.
  const size_t cut = mode & 0x80 ? kHeaderBytes - 1 - (mode >> 1) % 8 : kHeaderBytes;
  const absl::Status s = DecodeHeader({header.data(), cut}, "fuzz", &decoded);
  FUZZ_CHECK(s.ok() || absl::IsDataLoss(s));
  if (cut < kHeaderBytes) FUZZ_CHECK(!s.ok());
  if (s.ok()) FUZZ_CHECK(SameFields(written, decoded));
  return 0;
}
