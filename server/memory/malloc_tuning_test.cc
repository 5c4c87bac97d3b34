#include "server/memory/malloc_tuning.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/memory/process_memory.h"

namespace kvcache {
namespace {

TEST(MallocTuningOptionsTest, DefaultsAreValid) {
  EXPECT_TRUE(MallocTuningOptions{}.Validate().ok());
  EXPECT_TRUE((MallocTuningOptions{.mmap_threshold_bytes = 0, .arena_max = 0}).Validate().ok());
}

TEST(MallocTuningOptionsTest, NamesTheFieldOutOfRange) {
  absl::Status s = MallocTuningOptions{.mmap_threshold_bytes = 100}.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), testing::HasSubstr("memory.mmap_threshold_bytes"));
  s = MallocTuningOptions{.mmap_threshold_bytes = uint64_t{64} << 20}.Validate();
  EXPECT_THAT(s.message(), testing::HasSubstr("memory.mmap_threshold_bytes"));
  s = MallocTuningOptions{.arena_max = 5000}.Validate();
  EXPECT_THAT(s.message(), testing::HasSubstr("memory.malloc_arena_max"));
}

// A sanitizer's allocator replaces glibc's: mallopt() then refuses, and the
// daemon warns and runs with the sanitizer's allocator (server/main.cc).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVCACHE_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVCACHE_SANITIZER_ALLOCATOR 1
#endif
#endif

#if defined(__GLIBC__) && defined(KVCACHE_SANITIZER_ALLOCATOR)
TEST(MallocTuningTest, UnderASanitizersAllocatorTuningIsRefusedWithAnError) {
  absl::Status s = ApplyMallocTuning({.mmap_threshold_bytes = uint64_t{64} << 10, .arena_max = 4});
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_THAT(s.message(), testing::HasSubstr("mallopt"));
}
#endif

#if defined(__GLIBC__) && !defined(KVCACHE_SANITIZER_ALLOCATOR)
TEST(MallocTuningTest, LargeAllocationsGoBackToTheOsWhenFreed) {
  ASSERT_TRUE(ApplyMallocTuning({.mmap_threshold_bytes = uint64_t{64} << 10, .arena_max = 4}).ok());
  // 256 buffers of 128 KiB, each above the threshold: each its own mapping.
  constexpr size_t kBuffer = size_t{128} << 10;
  std::vector<char*> buffers;
  for (int i = 0; i < 256; ++i) {
    buffers.push_back(static_cast<char*>(std::malloc(kBuffer)));
    std::memset(buffers.back(), 1, kBuffer);
  }
  const MallocStats held = ReadMallocStats();
  EXPECT_GE(held.mapped_bytes, 256 * kBuffer);
  absl::StatusOr<ProcessMemory> during = ReadProcessMemory();
  ASSERT_TRUE(during.ok());
  for (char* b : buffers) std::free(b);
  absl::StatusOr<ProcessMemory> after = ReadProcessMemory();
  ASSERT_TRUE(after.ok());
  // The 32 MiB left with the frees (allow a few MiB of other noise).
  EXPECT_LE(after->rss_anon_bytes + 24 * (size_t{1} << 20), during->rss_anon_bytes);
  EXPECT_LT(ReadMallocStats().mapped_bytes, held.mapped_bytes);
}

#endif

#if defined(__GLIBC__)
TEST(MallocTrimmerTest, TrimsWhenAskedAndCountsIt) {
  MallocTrimmer trimmer(absl::ZeroDuration());
  EXPECT_EQ(trimmer.trims(), 0u);
  trimmer.TrimNow();
  EXPECT_EQ(trimmer.trims(), 1u);
  trimmer.RequestTrim();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (trimmer.trims() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(trimmer.trims(), 2u);
}

TEST(MallocTrimmerTest, TrimsPeriodically) {
  MallocTrimmer trimmer(absl::Milliseconds(5));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (trimmer.trims() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_GE(trimmer.trims(), 3u);
}

#endif

// What glibc gives back; a sanitizer's allocator keeps its own.
#if defined(__GLIBC__) && !defined(KVCACHE_SANITIZER_ALLOCATOR)
TEST(MallocTrimmerTest, GivesBackFreeArenaMemory) {
  // 32 MiB of small chunks (below any mmap threshold), then every one freed
  // but one in 64: the free runs between the survivors stay in the heap
  // (free() only shrinks its top) until malloc_trim gives their pages back.
  std::vector<char*> small;
  for (int i = 0; i < 16384; ++i) {
    small.push_back(static_cast<char*>(std::malloc(2000)));
    std::memset(small.back(), 1, 2000);
  }
  for (size_t i = 0; i < small.size(); ++i) {
    if (i % 64 != 0) std::free(small[i]);
  }
  absl::StatusOr<ProcessMemory> before = ReadProcessMemory();
  ASSERT_TRUE(before.ok());
  MallocTrimmer trimmer(absl::ZeroDuration());
  trimmer.TrimNow();
  absl::StatusOr<ProcessMemory> after = ReadProcessMemory();
  ASSERT_TRUE(after.ok());
  EXPECT_LE(after->rss_anon_bytes + 16 * (size_t{1} << 20), before->rss_anon_bytes);
  for (size_t i = 0; i < small.size(); i += 64) std::free(small[i]);
}
#endif

}  // namespace
}  // namespace kvcache
