#include "server/core/slab_stripes.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>
#include <utility>

namespace kvcache {
namespace {

constexpr size_t kCacheLine = 64;

size_t RoundUpToLine(size_t bytes) { return (bytes + kCacheLine - 1) / kCacheLine * kCacheLine; }

size_t BinsBytes(const std::vector<CachedClass>& classes) {
  return RoundUpToLine(classes.size() * 2 * sizeof(uint32_t));
}

size_t SlotCount(const std::vector<CachedClass>& classes) {
  size_t slots = 0;
  for (const CachedClass& c : classes) slots += c.bin_chunks;
  return slots;
}

std::byte* AllocateStorage(const std::vector<CachedClass>& classes) {
  const size_t bytes = BinsBytes(classes) + RoundUpToLine(SlotCount(classes) * sizeof(void*));
  return static_cast<std::byte*>(::operator new (bytes, std::align_val_t{kCacheLine}));
}

}  // namespace

void ChunkStripe::AlignedDelete::operator()(void* p) const {
  ::operator delete (p, std::align_val_t{kCacheLine});
}

ChunkStripe::ChunkStripe(const std::vector<CachedClass>* classes, uint64_t stripe_bytes)
    : classes_(*classes),
      stripe_bytes_(stripe_bytes),
      storage_(AllocateStorage(*classes)),
      bins_(reinterpret_cast<Bin*>(storage_.get())),
      slots_(reinterpret_cast<std::byte**>(storage_.get() + BinsBytes(*classes))) {
  uint32_t first = 0;
  for (size_t i = 0; i < classes_.size(); ++i) {
    new (&bins_[i]) Bin{.first = first, .count = 0};
    first += classes_[i].bin_chunks;
  }
}

std::byte* ChunkStripe::Pop(int class_index) {
  Bin& bin = bins_[class_index];
  if (bin.count == 0) return nullptr;
  std::byte* chunk = slots_[bin.first + --bin.count];
  bytes_ -= classes_[class_index].chunk_bytes;
  SetChunks(cached_chunks() - 1);
  return chunk;
}

uint64_t ChunkStripe::Room(int class_index) const {
  const CachedClass& c = classes_[class_index];
  const uint64_t in_bin = c.bin_chunks - bins_[class_index].count;
  return std::min(in_bin, (stripe_bytes_ - bytes_) / c.chunk_bytes);
}

bool ChunkStripe::HasRoom(int class_index) const {
  const CachedClass& c = classes_[class_index];
  return bins_[class_index].count < c.bin_chunks && bytes_ + c.chunk_bytes <= stripe_bytes_;
}

void ChunkStripe::Push(int class_index, std::byte* chunk) {
  Bin& bin = bins_[class_index];
  slots_[bin.first + bin.count++] = chunk;
  bytes_ += classes_[class_index].chunk_bytes;
  SetChunks(cached_chunks() + 1);
}

void ChunkStripe::TakeOldest(int class_index, uint32_t n, std::vector<std::byte*>* out) {
  Bin& bin = bins_[class_index];
  const uint32_t taken = std::min(n, bin.count);
  std::byte** const slots = slots_ + bin.first;
  out->insert(out->end(), slots, slots + taken);
  std::memmove(slots, slots + taken, (bin.count - taken) * sizeof(std::byte*));
  bin.count -= taken;
  bytes_ -= taken * classes_[class_index].chunk_bytes;
  SetChunks(cached_chunks() - taken);
}

void ChunkStripe::TakeAll(std::vector<std::pair<int, std::byte*>>* out) {
  if (cached_chunks() == 0) return;
  for (size_t i = 0; i < classes_.size(); ++i) {
    Bin& bin = bins_[i];
    for (uint32_t j = 0; j < bin.count; ++j) {
      out->emplace_back(static_cast<int>(i), slots_[bin.first + j]);
    }
    bin.count = 0;
  }
  bytes_ = 0;
  SetChunks(0);
}

ChunkStripes::ChunkStripes(std::vector<CachedClass> classes, uint64_t stripe_bytes)
    : classes_(std::move(classes)) {
  const size_t count = std::max<size_t>(kMinStripes, std::thread::hardware_concurrency());
  stripes_.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    stripes_.push_back(std::make_unique<ChunkStripe>(&classes_, stripe_bytes));
  }
}

ChunkStripe& ChunkStripes::Mine() {
  const int cpu = sched_getcpu();  // glibc reads it from rseq: no system call
  return *stripes_[static_cast<size_t>(cpu < 0 ? 0 : cpu) % stripes_.size()];
}

AllStripesLock::AllStripesLock(const ChunkStripes& stripes) : stripes_(stripes) {
  for (size_t i = 0; i < stripes_.count(); ++i) stripes_.Stripe(i).mu.Lock();
}

AllStripesLock::~AllStripesLock() {
  for (size_t i = stripes_.count(); i-- > 0;) stripes_.Stripe(i).mu.Unlock();
}

}  // namespace kvcache
