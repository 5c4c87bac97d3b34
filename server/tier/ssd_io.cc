// The SSD store's I/O engines and file set-up (see ssd_io.h).
//
// io_uring engine: every thread that calls Run() gets its own ring (a
// thread_local, torn down when the thread exits), so callers never share a
// submission queue or a lock. A batch keeps up to min(queue_depth, ring size)
// ops in flight and reaps completions as they come; a partial transfer or
// -EAGAIN/-EINTR is resubmitted for the rest. Buffers are not registered
// (they come from a pool and vary in size); a fixed-buffer table is a later
// optimisation.
//
// Thread-pool engine: a queue of ops served by `threads` workers issuing
// pread/pwrite; the caller waits on a std::latch for its batch.
#include "server/tier/ssd_io.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <latch>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvcache::ssd_internal {
namespace {

// IoOp::result of an op the io_uring engine has not finished.
constexpr int64_t kUnfinished = INT64_MIN;

// pread/pwrite until `op` is done, at end of file, or failed.
void RunSync(int fd, IoOp& op) {
  uint64_t done = 0;
  while (done < op.len) {
    const ssize_t n = op.write ? pwrite(fd, op.buf + done, op.len - done, op.offset + done)
                               : pread(fd, op.buf + done, op.len - done, op.offset + done);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      op.result = -errno;
      return;
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  op.result = static_cast<int64_t>(done);
}

int OpenFile(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }

int ProbeIoUring(unsigned entries) {
  io_uring ring;
  const int rc = io_uring_queue_init(entries, &ring, 0);
  if (rc == 0) io_uring_queue_exit(&ring);
  return rc;
}

class ThreadPoolEngine final : public IoEngine {
 public:
  ThreadPoolEngine(int fd, uint32_t threads) : fd_(fd) {
    for (uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }

  ~ThreadPoolEngine() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void Run(std::span<IoOp> ops) override {
    if (ops.empty()) return;
    std::latch done(static_cast<std::ptrdiff_t>(ops.size()));
    {
      MutexLock lock(&mu_);
      for (IoOp& op : ops) queue_.emplace_back(&op, &done);
    }
    if (ops.size() == 1) {
      cv_.notify_one();
    } else {
      cv_.notify_all();
    }
    done.wait();
  }

 private:
  void Work() {
    for (;;) {
      std::pair<IoOp*, std::latch*> job;
      {
        std::unique_lock<Mutex> lock(mu_);
        mu_.AssertHeld();
        cv_.wait(lock, [this] {
          mu_.AssertHeld();
          return stopping_ || !queue_.empty();
        });
        if (queue_.empty()) return;  // stopping, and nothing left to do
        job = queue_.front();
        queue_.pop_front();
      }
      RunSync(fd_, *job.first);
      job.second->count_down();
    }
  }

  const int fd_;
  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::pair<IoOp*, std::latch*>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// The calling thread's ring. `error` is 0 once set up, else the errno that
// io_uring_queue_init (or a failed submit) gave; -1 before the first try.
struct ThreadRing {
  io_uring ring;
  int error = -1;
  ~ThreadRing() {
    if (error == 0) io_uring_queue_exit(&ring);
  }
};
thread_local ThreadRing t_ring;

class IoUringEngine final : public IoEngine {
 public:
  IoUringEngine(int fd, uint32_t queue_depth) : fd_(fd), queue_depth_(queue_depth) {}

  void Run(std::span<IoOp> ops) override {
    ThreadRing& tr = t_ring;
    if (tr.error < 0) tr.error = -io_uring_queue_init(queue_depth_, &tr.ring, 0);
    if (tr.error != 0) {
      for (IoOp& op : ops) RunSync(fd_, op);
      return;
    }
    const unsigned depth = std::min<unsigned>(queue_depth_, tr.ring.sq.ring_entries);
    Batch batch{ops, std::vector<uint64_t>(ops.size(), 0), {}, 0};
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].result = kUnfinished;
      batch.pending.push_back(i);
    }
    while (!batch.pending.empty() || batch.in_flight > 0) {
      unsigned queued = 0;
      while (!batch.pending.empty() && batch.in_flight + queued < depth) {
        io_uring_sqe* sqe = io_uring_get_sqe(&tr.ring);
        if (sqe == nullptr) break;
        const size_t i = batch.pending.front();
        batch.pending.pop_front();
        IoOp& op = ops[i];
        const uint64_t done = batch.done[i];
        if (op.write) {
          io_uring_prep_write(sqe, fd_, op.buf + done, op.len - done, op.offset + done);
        } else {
          io_uring_prep_read(sqe, fd_, op.buf + done, op.len - done, op.offset + done);
        }
        io_uring_sqe_set_data64(sqe, i);
        ++queued;
      }
      const int rc = io_uring_submit_and_wait(&tr.ring, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // The ring is unusable and took nothing of this round: finish the
        // batch with pread/pwrite and stop using the ring on this thread.
        Abandon(tr, batch, -rc);
        return;
      }
      // (After a transient error the queued entries go with the next submit.)
      batch.in_flight += queued;
      unsigned head;
      unsigned seen = 0;
      io_uring_cqe* cqe;
      io_uring_for_each_cqe(&tr.ring, head, cqe) {
        ++seen;
        Complete(batch, cqe);
      }
      io_uring_cq_advance(&tr.ring, seen);
    }
  }

 private:
  struct Batch {
    std::span<IoOp> ops;
    std::vector<uint64_t> done;  // bytes transferred so far, per op
    std::deque<size_t> pending;  // ops to (re)submit
    unsigned in_flight;
  };

  static void Complete(Batch& batch, const io_uring_cqe* cqe) {
    --batch.in_flight;
    const size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
    IoOp& op = batch.ops[i];
    const int res = cqe->res;
    if (res == -EINTR || res == -EAGAIN) {
      batch.pending.push_back(i);
    } else if (res < 0) {
      op.result = res;
    } else if (res == 0) {
      op.result = static_cast<int64_t>(batch.done[i]);  // end of file
    } else if ((batch.done[i] += static_cast<uint64_t>(res)) < op.len) {
      batch.pending.push_back(i);
    } else {
      op.result = static_cast<int64_t>(batch.done[i]);
    }
  }

  // After a hard submit error: reaps what is in flight, tears the ring down
  // (this thread uses pread/pwrite from now on) and finishes the pending ops.
  void Abandon(ThreadRing& tr, Batch& batch, int error) {
    while (batch.in_flight > 0) {
      io_uring_cqe* cqe;
      if (io_uring_wait_cqe(&tr.ring, &cqe) != 0) continue;
      Complete(batch, cqe);
      io_uring_cqe_seen(&tr.ring, cqe);
    }
    io_uring_queue_exit(&tr.ring);
    tr.error = error;
    // Ops prepared in the failed round were popped from `pending` but never
    // ran: every op without a final result is redone from where it stopped.
    for (size_t i = 0; i < batch.ops.size(); ++i) {
      if (!Finished(batch, i)) batch.pending.push_back(i);
    }
    std::sort(batch.pending.begin(), batch.pending.end());
    batch.pending.erase(std::unique(batch.pending.begin(), batch.pending.end()),
                        batch.pending.end());
    for (size_t i : batch.pending) {
      IoOp& op = batch.ops[i];
      IoOp rest = op;
      rest.buf += batch.done[i];
      rest.offset += batch.done[i];
      rest.len -= batch.done[i];
      RunSync(fd_, rest);
      op.result = rest.result < 0 ? rest.result : static_cast<int64_t>(batch.done[i]) + rest.result;
    }
  }

  static bool Finished(const Batch& batch, size_t i) { return batch.ops[i].result != kUnfinished; }

  const int fd_;
  const uint32_t queue_depth_;
};

}  // namespace

std::string ErrnoText(int error) {
  char buf[256];
  return strerror_r(error, buf, sizeof(buf));  // GNU: returns the text
}

SsdSyscalls RealSyscalls() { return SsdSyscalls{&OpenFile, &ProbeIoUring}; }

absl::StatusOr<SsdFile> OpenSsdFile(const std::string& path, uint64_t capacity_bytes,
                                    bool direct_io, const SsdSyscalls& syscalls) {
  constexpr int kFlags = O_RDWR | O_CREAT | O_CLOEXEC;
  SsdFile file;
  file.direct_io = direct_io;
  file.fd = syscalls.open(path.c_str(), kFlags | (direct_io ? O_DIRECT : 0), 0600);
  if (file.fd < 0 && direct_io && errno == EINVAL) {
    file.direct_io = false;
    file.note = "O_DIRECT refused by the file system (open: EINVAL); using buffered I/O";
    file.fd = syscalls.open(path.c_str(), kFlags, 0600);
  }
  if (file.fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("ssd.path: open(", path, ") failed: ", ErrnoText(errno)));
  }
  auto fail = [&](absl::Status status) {
    close(file.fd);
    return status;
  };
  struct stat st;
  if (fstat(file.fd, &st) != 0) {
    return fail(
        absl::UnavailableError(absl::StrCat("fstat(", path, ") failed: ", ErrnoText(errno))));
  }
  if (S_ISBLK(st.st_mode)) {
    uint64_t device_bytes = 0;
    if (ioctl(file.fd, BLKGETSIZE64, &device_bytes) != 0) {
      return fail(absl::UnavailableError(
          absl::StrCat("ioctl(", path, ", BLKGETSIZE64) failed: ", ErrnoText(errno))));
    }
    if (device_bytes < capacity_bytes) {
      return fail(absl::InvalidArgumentError(absl::StrCat("ssd.capacity_bytes is ", capacity_bytes,
                                                          " but block device ", path,
                                                          " holds only ", device_bytes, " bytes")));
    }
  } else if (S_ISREG(st.st_mode)) {
    // The file holds every tenant's KV: its owner alone may read or write it,
    // whatever the umask or an earlier mode (fails when another user owns it).
    if ((st.st_mode & 07777) != 0600 && fchmod(file.fd, 0600) != 0) {
      const int error = errno;
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return fail(absl::FailedPreconditionError(
          absl::StrCat("ssd.path ", path, " has mode ", mode, " and cannot be made 0600 (",
                       ErrnoText(error), "): the file must belong to the user kvcached runs as")));
    }
    if (static_cast<uint64_t>(st.st_size) < capacity_bytes &&
        fallocate(file.fd, 0, 0, static_cast<off_t>(capacity_bytes)) != 0) {
      const int error = errno;
      if (error != EOPNOTSUPP || ftruncate(file.fd, static_cast<off_t>(capacity_bytes)) != 0) {
        return fail(absl::UnavailableError(
            absl::StrCat("ssd.path: preallocating ", capacity_bytes, " bytes of ", path,
                         " failed: ", ErrnoText(error == EOPNOTSUPP ? errno : error))));
      }
    }
  } else {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("ssd.path ", path, " is neither a regular file nor a block device")));
  }
  if (file.direct_io) {
    // Some file systems accept O_DIRECT at open and refuse the I/O.
    void* probe = std::aligned_alloc(4096, 4096);
    if (probe == nullptr) return fail(absl::ResourceExhaustedError("out of memory"));
    const ssize_t n = pread(file.fd, probe, 4096, 0);
    const int error = errno;
    std::free(probe);
    if (n < 0 && error == EINVAL) {
      close(file.fd);
      file.direct_io = false;
      file.note = "O_DIRECT refused by the file system (read: EINVAL); using buffered I/O";
      file.fd = syscalls.open(path.c_str(), kFlags, 0600);
      if (file.fd < 0) {
        return absl::UnavailableError(
            absl::StrCat("ssd.path: open(", path, ") failed: ", ErrnoText(errno)));
      }
    }
  }
  return file;
}

std::unique_ptr<IoEngine> MakeThreadPoolEngine(int fd, uint32_t threads) {
  return std::make_unique<ThreadPoolEngine>(fd, threads);
}

std::unique_ptr<IoEngine> MakeIoUringEngine(int fd, uint32_t queue_depth) {
  return std::make_unique<IoUringEngine>(fd, queue_depth);
}

BufferPool::~BufferPool() {
  MutexLock lock(&mu_);
  for (auto& [bytes, list] : free_) {
    for (std::byte* data : list) std::free(data);
  }
}

BufferPool::Buffer BufferPool::Take(uint64_t bytes) {
  {
    MutexLock lock(&mu_);
    in_use_bytes_ += bytes;
    if (auto it = free_.find(bytes); it != free_.end() && !it->second.empty()) {
      std::byte* data = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= bytes;
      return Buffer(data, Deleter{this, bytes});
    }
  }
  auto* data = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
  if (data == nullptr) {
    MutexLock lock(&mu_);
    in_use_bytes_ -= bytes;
  }
  return Buffer(data, Deleter{this, bytes});
}

void BufferPool::Return(std::byte* data, uint64_t bytes) {
  {
    MutexLock lock(&mu_);
    in_use_bytes_ -= bytes;
    if (cached_bytes_ + bytes <= cache_limit_bytes_) {
      free_[bytes].push_back(data);
      cached_bytes_ += bytes;
      return;
    }
  }
  std::free(data);
}

uint64_t BufferPool::cached_bytes() const {
  MutexLock lock(&mu_);
  return cached_bytes_;
}

uint64_t BufferPool::in_use_bytes() const {
  MutexLock lock(&mu_);
  return in_use_bytes_;
}

}  // namespace kvcache::ssd_internal
