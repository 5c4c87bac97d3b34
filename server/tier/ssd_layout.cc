#include "server/tier/ssd_layout.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace kvcache::ssd_internal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the extent header is little-endian and written in host order");

// Field offsets of the header (docs/ssd_format.md).
constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 4;
constexpr size_t kHeaderSizeAt = 6;
constexpr size_t kKeyAt = 8;
constexpr size_t kPayloadBytesAt = 16;
constexpr size_t kSequenceAt = 24;
constexpr size_t kEpochAt = 32;
constexpr size_t kPayloadChecksumAt = 40;
constexpr size_t kFootprintAt = 48;
constexpr size_t kHeaderChecksumAt = 56;

template <typename T>
void Put(std::span<std::byte> out, size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));
}

template <typename T>
T Get(std::span<const std::byte> in, size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(T));
  return value;
}

uint64_t HeaderChecksum(std::span<const std::byte> header) {
  return XXH3_64bits(header.data(), kHeaderChecksumAt);
}

}  // namespace

void EncodeHeader(const ExtentHeader& header, std::span<std::byte> out) {
  Put<uint32_t>(out, kMagicAt, kMagic);
  Put<uint16_t>(out, kVersionAt, kFormatVersion);
  Put<uint16_t>(out, kHeaderSizeAt, static_cast<uint16_t>(kHeaderBytes));
  Put<uint64_t>(out, kKeyAt, header.key);
  Put<uint64_t>(out, kPayloadBytesAt, header.payload_bytes);
  Put<uint64_t>(out, kSequenceAt, header.sequence);
  Put<uint64_t>(out, kEpochAt, header.epoch);
  Put<uint64_t>(out, kPayloadChecksumAt, header.payload_checksum);
  Put<uint64_t>(out, kFootprintAt, header.footprint);
  Put<uint64_t>(out, kHeaderChecksumAt, HeaderChecksum(out));
}

absl::Status DecodeHeader(std::span<const std::byte> in, absl::string_view where,
                          ExtentHeader* header) {
  if (in.size() < kHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("SSD ", where, ": header truncated to ", in.size(), " bytes"));
  }
  if (const auto magic = Get<uint32_t>(in, kMagicAt); magic != kMagic) {
    return absl::DataLossError(
        absl::StrFormat("SSD %s: bad header magic 0x%08x (expected 0x%08x)", where, magic, kMagic));
  }
  if (const auto version = Get<uint16_t>(in, kVersionAt); version != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("SSD ", where, ": header format version ", version,
                                            " (this build reads ", kFormatVersion, ")"));
  }
  if (const auto size = Get<uint16_t>(in, kHeaderSizeAt); size != kHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("SSD ", where, ": header size ", size, " (expected ", kHeaderBytes, ")"));
  }
  const uint64_t stored = Get<uint64_t>(in, kHeaderChecksumAt);
  if (const uint64_t actual = HeaderChecksum(in); stored != actual) {
    return absl::DataLossError(absl::StrFormat(
        "SSD %s: header checksum mismatch (stored %016x, computed %016x)", where, stored, actual));
  }
  header->key = Get<uint64_t>(in, kKeyAt);
  header->payload_bytes = Get<uint64_t>(in, kPayloadBytesAt);
  header->sequence = Get<uint64_t>(in, kSequenceAt);
  header->epoch = Get<uint64_t>(in, kEpochAt);
  header->payload_checksum = Get<uint64_t>(in, kPayloadChecksumAt);
  header->footprint = Get<uint64_t>(in, kFootprintAt);
  return absl::OkStatus();
}

std::vector<uint64_t> MakeSizeClasses(uint64_t region_bytes) {
  std::vector<uint64_t> classes = {kPageBytes, region_bytes};
  for (uint64_t p = kPageBytes; p < region_bytes; p *= 2) {
    for (uint64_t quarters : {4, 5, 6, 7}) {
      const uint64_t step = p * quarters / 4;
      if (step % kPageBytes != 0) continue;
      if (step + kPageBytes <= region_bytes) classes.push_back(step + kPageBytes);
    }
  }
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  return classes;
}

SsdSlots::SsdSlots(uint64_t region_bytes, uint64_t regions)
    : region_bytes_(region_bytes),
      classes_(MakeSizeClasses(region_bytes)),
      regions_(regions),
      partial_(classes_.size()) {
  for (uint32_t r = 0; r < regions; ++r) free_regions_.insert(r);
}

std::optional<int> ClassFor(std::span<const uint64_t> classes, uint64_t extent_bytes) {
  auto it = std::lower_bound(classes.begin(), classes.end(), RoundUpToPage(extent_bytes));
  if (it == classes.end()) return std::nullopt;
  return static_cast<int>(it - classes.begin());
}

std::optional<uint64_t> SsdSlots::Allocate(int class_index) {
  auto& partial = partial_[class_index];
  uint32_t r;
  if (!partial.empty()) {
    r = *partial.begin();
  } else {
    if (free_regions_.empty()) return std::nullopt;
    r = *free_regions_.begin();
    free_regions_.erase(free_regions_.begin());
    Region& region = regions_[r];
    region.class_index = class_index;
    region.slots = static_cast<uint32_t>(region_bytes_ / classes_[class_index]);
    region.live = 0;
    region.first_free_word = 0;
    region.used.assign((region.slots + 63) / 64, 0);
    partial.insert(r);
    ++reserved_regions_;
  }
  Region& region = regions_[r];
  uint32_t w = region.first_free_word;
  while (region.used[w] == ~uint64_t{0}) ++w;  // a free slot exists: live < slots
  const uint32_t slot = w * 64 + std::countr_one(region.used[w]);
  region.used[w] |= uint64_t{1} << (slot % 64);
  region.first_free_word = w;
  if (++region.live == region.slots) partial.erase(r);
  return r * region_bytes_ + slot * classes_[class_index];
}

SsdSlots::ClaimResult SsdSlots::Claim(uint64_t offset, int class_index) {
  const uint64_t r = offset / region_bytes_;
  const uint64_t class_bytes = classes_[class_index];
  const uint64_t within = offset % region_bytes_;
  if (r >= regions_.size() || within % class_bytes != 0 ||
      within / class_bytes >= region_bytes_ / class_bytes) {
    return ClaimResult::kNotASlot;
  }
  Region& region = regions_[r];
  if (region.class_index >= 0 && region.class_index != class_index) {
    return ClaimResult::kOtherClass;
  }
  const uint32_t slot = static_cast<uint32_t>(within / class_bytes);
  const uint64_t bit = uint64_t{1} << (slot % 64);
  if (region.class_index < 0) {
    free_regions_.erase(static_cast<uint32_t>(r));
    region.class_index = class_index;
    region.slots = static_cast<uint32_t>(region_bytes_ / class_bytes);
    region.live = 0;
    region.first_free_word = 0;
    region.used.assign((region.slots + 63) / 64, 0);
    partial_[class_index].insert(static_cast<uint32_t>(r));
    ++reserved_regions_;
  } else if ((region.used[slot / 64] & bit) != 0) {
    return ClaimResult::kTaken;
  }
  region.used[slot / 64] |= bit;
  if (++region.live == region.slots) partial_[class_index].erase(static_cast<uint32_t>(r));
  return ClaimResult::kClaimed;
}

bool SsdSlots::Free(uint64_t offset) {
  const uint64_t r = offset / region_bytes_;
  if (r >= regions_.size()) return false;
  Region& region = regions_[r];
  if (region.class_index < 0) return false;
  const uint64_t class_bytes = classes_[region.class_index];
  const uint64_t within = offset % region_bytes_;
  if (within % class_bytes != 0 || within / class_bytes >= region.slots) return false;
  const uint32_t slot = static_cast<uint32_t>(within / class_bytes);
  const uint64_t bit = uint64_t{1} << (slot % 64);
  if ((region.used[slot / 64] & bit) == 0) return false;
  region.used[slot / 64] &= ~bit;
  region.first_free_word = std::min(region.first_free_word, slot / 64);
  auto& partial = partial_[region.class_index];
  if (region.live-- == region.slots) partial.insert(static_cast<uint32_t>(r));
  if (region.live == 0) {
    partial.erase(static_cast<uint32_t>(r));
    region.class_index = -1;
    region.used.clear();
    free_regions_.insert(static_cast<uint32_t>(r));
    --reserved_regions_;
  }
  return true;
}

}  // namespace kvcache::ssd_internal
