// The SSD store's on-file layout: the extent header codec (docs/ssd_format.md),
// the size classes, and the slot allocator that carves the file into regions.
// No I/O. Internal to server/tier.
//
// SsdSlots is not thread-safe; SsdStore calls it under its lock.
#ifndef KVCACHE_SERVER_TIER_SSD_LAYOUT_H_
#define KVCACHE_SERVER_TIER_SSD_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvcache::ssd_internal {

inline constexpr uint64_t kPageBytes = 4096;  // O_DIRECT alignment and the smallest class
inline constexpr uint64_t kHeaderBytes = 64;
inline constexpr uint32_t kMagic = 0x5853564b;  // "KVSX" in file byte order
inline constexpr uint16_t kFormatVersion = 1;

inline constexpr uint64_t RoundUpToPage(uint64_t bytes) {
  return (bytes + kPageBytes - 1) & ~(kPageBytes - 1);
}

// The header's fields, as written at the start of every extent.
struct ExtentHeader {
  uint64_t key = 0;
  uint64_t payload_bytes = 0;
  uint64_t sequence = 0;
  uint64_t epoch = 0;
  uint64_t payload_checksum = 0;  // XXH3-64 of the payload
  uint64_t footprint = 0;         // bytes of file the extent occupies (its class)
};

// Writes the 64-byte header (with magic, version and header checksum) to `out`.
// REQUIRES: out.size() >= kHeaderBytes.
void EncodeHeader(const ExtentHeader& header, std::span<std::byte> out);

// Parses and checks magic, version and header checksum: DATA_LOSS naming what
// is wrong (and `where`, e.g. "extent at offset 8192"), else the fields.
absl::Status DecodeHeader(std::span<const std::byte> in, absl::string_view where,
                          ExtentHeader* header);

// Size classes for one region size: 4 KiB, then a 4 KiB header page plus each
// multiple of 4 KiB among the powers of two from 4 KiB and their 1.25, 1.5 and
// 1.75 steps, then region_bytes; all at most region_bytes, ascending.
std::vector<uint64_t> MakeSizeClasses(uint64_t region_bytes);

// The index in `classes` (ascending) of the smallest class that holds an
// extent of header + payload `extent_bytes`; nullopt when none does.
std::optional<int> ClassFor(std::span<const uint64_t> classes, uint64_t extent_bytes);

// The allocator of extent slots: regions of region_bytes, each serving one
// class at a time (see ssd_store.h).
class SsdSlots {
 public:
  // REQUIRES: region_bytes is a power of two >= 64 KiB; regions >= 1.
  SsdSlots(uint64_t region_bytes, uint64_t regions);

  // The classes, as MakeSizeClasses(region_bytes) makes them.
  const std::vector<uint64_t>& classes() const { return classes_; }

  // The file offset of a free slot of the class (lowest slot of the lowest
  // partly used region of the class, else of the lowest free region), or
  // nullopt when there is none.
  std::optional<uint64_t> Allocate(int class_index);

  // Frees the slot at `offset`. False (and nothing changes) when no slot is
  // allocated there.
  bool Free(uint64_t offset);

  enum class ClaimResult { kClaimed, kNotASlot, kTaken, kOtherClass };
  // Allocates the given slot (re-attaching an extent): kClaimed, or, with
  // nothing changed, kNotASlot (past the last region, or `offset` is not a
  // slot boundary of the class), kTaken (allocated already) or kOtherClass
  // (the region serves another class). A free region takes the class.
  ClaimResult Claim(uint64_t offset, int class_index);

  uint64_t reserved_regions() const { return reserved_regions_; }

 private:
  struct Region {
    int class_index = -1;  // -1 while free
    uint32_t slots = 0;
    uint32_t live = 0;
    uint32_t first_free_word = 0;  // no free slot in used[0, first_free_word)
    std::vector<uint64_t> used;    // bit per slot
  };

  const uint64_t region_bytes_;
  const std::vector<uint64_t> classes_;
  std::vector<Region> regions_;
  absl::btree_set<uint32_t> free_regions_;
  std::vector<absl::btree_set<uint32_t>> partial_;  // per class: regions with 0 < live < slots
  uint64_t reserved_regions_ = 0;
};

}  // namespace kvcache::ssd_internal

#endif  // KVCACHE_SERVER_TIER_SSD_LAYOUT_H_
