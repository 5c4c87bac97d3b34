// The Redis Cluster hash slot of a key (the cluster specification's
// "Keys distribution model"): CRC16 (XMODEM) of the key, or of its hash tag,
// modulo 16384. A hash tag is what lies between the first '{' and the first
// '}' after it, when that is not empty: keys sharing a tag share a slot.
#ifndef KVCACHE_SERVER_REMOTE_KEY_SLOT_H_
#define KVCACHE_SERVER_REMOTE_KEY_SLOT_H_

#include <cstdint>
#include <string_view>

namespace kvcache {

inline constexpr int kClusterSlots = 16384;

// CRC16-CCITT as the cluster uses it: polynomial 0x1021, initial 0, no
// reflection ("123456789" -> 0x31C3).
uint16_t Crc16Xmodem(std::string_view bytes);

// The part of `key` that is hashed: its hash tag, or the whole key.
std::string_view HashTagOf(std::string_view key);

// 0 .. kClusterSlots - 1.
uint16_t KeySlot(std::string_view key);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_REMOTE_KEY_SLOT_H_
