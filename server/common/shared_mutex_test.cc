// SharedMutex: readers share it, a writer excludes everyone, and a writer
// that waits holds off readers that come after it (what keeps a stream of
// lookups from starving an append).
#include "server/common/shared_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace kvcache {
namespace {

TEST(SharedMutexTest, ReadersShareIt) {
  SharedMutex mu;
  ReaderMutexLock first(&mu);
  std::thread other([&] {
    ASSERT_TRUE(mu.TryReaderLock());
    mu.ReaderUnlock();
  });
  other.join();
}

TEST(SharedMutexTest, AWriterExcludesReaders) {
  SharedMutex mu;
  WriterMutexLock writer(&mu);
  mu.AssertHeld();
  std::thread other([&] {
    if (mu.TryReaderLock()) {
      mu.ReaderUnlock();
      ADD_FAILURE() << "a reader got in beside the writer";
    }
  });
  other.join();
}

TEST(SharedMutexTest, AWaitingWriterHoldsOffNewReaders) {
  SharedMutex mu;
  std::atomic<bool> written{false};
  mu.ReaderLock();
  std::thread writer([&] {
    WriterMutexLock lock(&mu);
    written = true;
  });
  // While the writer only waits, a new reader still gets in: wait for the
  // moment it no longer does (the writer is queued), then let go.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool held_off = false;
  while (!held_off && std::chrono::steady_clock::now() < deadline) {
    if (mu.TryReaderLock()) {
      mu.ReaderUnlock();
      std::this_thread::yield();
    } else {
      held_off = true;
    }
  }
  EXPECT_TRUE(held_off) << "readers kept getting in ahead of a waiting writer";
  EXPECT_FALSE(written);
  mu.ReaderUnlock();
  writer.join();
  EXPECT_TRUE(written);
}

#ifndef NDEBUG
TEST(SharedMutexDeathTest, AssertHeldAbortsForAReader) {
  SharedMutex mu;
  ReaderMutexLock lock(&mu);
  EXPECT_DEATH(mu.AssertHeld(), "does not hold it");
}
#endif

}  // namespace
}  // namespace kvcache
