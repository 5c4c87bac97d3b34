// What the ShmSession tests share: a worker's region (a real memfd) and a
// request's answer waited for.
#ifndef KVCACHE_SERVER_SHM_SHM_SESSION_TEST_UTIL_H_
#define KVCACHE_SERVER_SHM_SHM_SESSION_TEST_UTIL_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "server/shm/shm_session.h"

namespace kvcache {

inline constexpr char kRegionName[] = "kvcache-shm-session-test";

// A worker's region: a memfd mapped here too.
class WorkerRegion {
 public:
  explicit WorkerRegion(uint64_t bytes, bool seal = true) : bytes_(bytes) {
    fd_ = ::memfd_create(kRegionName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(::ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    if (seal) {
      EXPECT_EQ(::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = static_cast<std::byte*>(p);
  }
  ~WorkerRegion() {
    ::munmap(data_, bytes_);
    ::close(fd_);
  }
  std::byte* data() { return data_; }
  int fd() const { return fd_; }
  // A duplicate descriptor, as SCM_RIGHTS would deliver it.
  std::vector<UniqueFd> Passed() const {
    std::vector<UniqueFd> fds;
    fds.emplace_back(::dup(fd_));
    return fds;
  }

 private:
  uint64_t bytes_;
  int fd_ = -1;
  std::byte* data_ = nullptr;
};

// The answer to `request`, waited for (the session may answer on another
// thread).
inline v1::ShmResponse Answer(ShmSession& session, v1::ShmRequest request,
                              std::vector<UniqueFd> fds) {
  absl::Notification answered;
  v1::ShmResponse answer;
  session.Handle(std::move(request), std::move(fds), [&](v1::ShmResponse response) {
    answer = std::move(response);
    answered.Notify();
  });
  answered.WaitForNotification();
  return answer;
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_SHM_SHM_SESSION_TEST_UTIL_H_
