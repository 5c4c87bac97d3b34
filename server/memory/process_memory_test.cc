#include "server/memory/process_memory.h"

#include <cstring>
#include <memory>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvcache {
namespace {

constexpr std::string_view kStatus =
    "Name:\tkvcached\n"
    "VmPeak:\t 2000000 kB\n"
    "VmRSS:\t  407000 kB\n"
    "RssAnon:\t  300000 kB\n"
    "RssFile:\t   12000 kB\n"
    "RssShmem:\t   95000 kB\n"
    "VmData:\t 1000000 kB\n"
    "Threads:\t83\n";

TEST(ParseProcStatusTest, ReadsTheSizesInBytesAndTheThreads) {
  absl::StatusOr<ProcessMemory> m = ParseProcStatus(kStatus);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->vm_rss_bytes, uint64_t{407000} << 10);
  EXPECT_EQ(m->rss_anon_bytes, uint64_t{300000} << 10);
  EXPECT_EQ(m->rss_file_bytes, uint64_t{12000} << 10);
  EXPECT_EQ(m->rss_shmem_bytes, uint64_t{95000} << 10);
  EXPECT_EQ(m->threads, 83u);
  EXPECT_EQ(m->OwnBytes(), uint64_t{312000} << 10);
}

TEST(ParseProcStatusTest, NamesAMissingField) {
  absl::StatusOr<ProcessMemory> m = ParseProcStatus("VmRSS:\t 1 kB\nRssAnon:\t 1 kB\n");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(m.status()));
  EXPECT_THAT(m.status().message(), testing::HasSubstr("RssFile"));
}

TEST(ParseProcStatusTest, RefusesAValueThatIsNotANumber) {
  absl::StatusOr<ProcessMemory> m = ParseProcStatus(
      "VmRSS:\t x kB\nRssAnon:\t 1 kB\nRssFile:\t 1 kB\nRssShmem:\t 0 kB\nThreads:\t1\n");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), testing::HasSubstr("VmRSS"));
}

TEST(ParseProcStatusTest, DoesNotTakeAFieldForAnotherWithTheSamePrefix) {
  // "VmRSSX" is not "VmRSS".
  absl::StatusOr<ProcessMemory> m = ParseProcStatus(
      "VmRSSX:\t 9 kB\nVmRSS:\t 2 kB\nRssAnon:\t 1 kB\nRssFile:\t 1 kB\nRssShmem:\t 0 kB\n"
      "Threads:\t1\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->vm_rss_bytes, 2048u);
}

TEST(ReadProcessMemoryTest, SeesMemoryThisProcessTouchesAndItsThreads) {
  absl::StatusOr<ProcessMemory> before = ReadProcessMemory();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->vm_rss_bytes, 0u);
  EXPECT_GE(before->threads, 1u);
  constexpr size_t kBytes = size_t{64} << 20;
  auto touched = std::make_unique<char[]>(kBytes);
  std::memset(touched.get(), 1, kBytes);
  std::thread other([] {
    absl::StatusOr<ProcessMemory> during = ReadProcessMemory();
    ASSERT_TRUE(during.ok());
    EXPECT_GE(during->threads, 2u);
  });
  other.join();
  absl::StatusOr<ProcessMemory> after = ReadProcessMemory();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(after->rss_anon_bytes, before->rss_anon_bytes + kBytes / 2);
  EXPECT_EQ(touched[kBytes - 1], 1);
}

}  // namespace
}  // namespace kvcache
