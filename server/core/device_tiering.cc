// The Cache's side of the GPU tier: its copies dropped (for room, past the
// watermark, or because a block's bytes changed). Placing them is the
// TierManager's (device_placement.cc). See cache.h ("The GPU tier"),
// device_tier.h and docs/tiers.md.
#include "server/core/cache.h"

namespace kvcache {

void Cache::DropDeviceCopyLocked(IndexNode* node, DeviceDrop why) {
  const StoredRef* copy = device_copies_.Find(node);
  if (copy == nullptr) return;
  const char* reason = "";
  switch (why) {
    case DeviceDrop::kRoom:
      ++tier_.device_drops_room;
      reason = "room";
      break;
    case DeviceDrop::kPressure:
      ++tier_.device_drops_pressure;
      reason = "pressure";
      break;
    case DeviceDrop::kRecompressed:
      ++tier_.device_drops_invalidated;
      reason = "recompressed";
      break;
    case DeviceDrop::kRestored:
      ++tier_.device_drops_invalidated;
      reason = "restored";
      break;
  }
  const uint64_t size = (*copy)->seal().size;
  --tier_.device_blocks;
  tier_.device_payload_bytes -= size;
  tiers_->LogMove(*node, "gpu", "none", reason, size);
  // The slot is freed here unless a lease still holds the copy (then when
  // the lease ends).
  device_copies_.Take(node);
}

bool Cache::DropDeviceVictimLocked(DeviceDrop why) {
  // Only the tier's own map holds it: no lease, no placement in flight.
  IndexNode* victim =
      device_copies_.PickVictim([](const StoredRef& copy) { return !copy->pins().pinned(); });
  if (victim == nullptr) return false;
  DropDeviceCopyLocked(victim, why);
  return true;
}

}  // namespace kvcache
