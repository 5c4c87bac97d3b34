#include "kvcache/gpu/arena_mappings.h"

#include <string>

namespace kvcache::gpu {

ArenaMappings::~ArenaMappings() { (void)CloseAll(); }

GpuStatus ArenaMappings::Map(const ExportedArena& arena) {
  MutexLock lock(&mu_);
  if (mappings_.count(arena.arena) != 0) return GpuStatus::Ok();
  ArenaMapping mapping;
  if (GpuStatus s = device_->OpenArena(arena.handle, &mapping); !s.ok()) {
    s.message = "mapping arena " + std::to_string(arena.arena) + ": " + s.message;
    return s;
  }
  mappings_[arena.arena] = mapping;
  return GpuStatus::Ok();
}

GpuStatus ArenaMappings::Resolve(ArenaId arena, uint64_t offset, uint64_t bytes,
                                 std::byte** out) const {
  MutexLock lock(&mu_);
  auto it = mappings_.find(arena);
  if (it == mappings_.end()) {
    return GpuStatus::Error(GpuCode::kNotFound, "arena " + std::to_string(arena) + " not mapped");
  }
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) {
    return GpuStatus::Error(GpuCode::kInvalidArgument, std::to_string(bytes) + " bytes at offset " +
                                                           std::to_string(offset) +
                                                           " leave arena " + std::to_string(arena));
  }
  *out = it->second.base + offset;
  return GpuStatus::Ok();
}

GpuStatus ArenaMappings::CloseAll() {
  MutexLock lock(&mu_);
  GpuStatus first;
  for (const auto& [id, mapping] : mappings_) {
    GpuStatus s = device_->CloseArena(mapping.id);
    if (!s.ok() && first.ok()) first = s;
  }
  mappings_.clear();
  return first;
}

size_t ArenaMappings::size() const {
  MutexLock lock(&mu_);
  return mappings_.size();
}

}  // namespace kvcache::gpu
