// SsdStore implementation: slot allocation under one lock (ssd_layout.h), I/O
// outside it through an IoEngine with page-aligned bounce buffers
// (ssd_io.h), verification of every read.
//
// Engine choice for kAuto: io_uring. tests/bench/ssd_bench.sh on the
// development VM (ext4 on virtio, 2 vCPUs under load 4-6, O_DIRECT, 1 GiB per
// pass, medians of 3): io_uring led in 14 of 16 cases, e.g. 4 MiB blocks
// write/read 1470/1440 MB/s on one thread vs 863/882 for a 4-thread pool,
// 1883/2214 vs 1419/1468 on four; the pool led only single-thread 256 KiB
// sequential writes (1082 vs 647). It also needs no threads of its own.
#include "server/tier/ssd_store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "server/common/status_macros.h"
#include "server/tier/ssd_io.h"
#include "server/tier/ssd_layout.h"
#include "xxhash.h"

namespace kvcache {
namespace {

using ssd_internal::BufferPool;
using ssd_internal::ExtentHeader;
using ssd_internal::IoEngine;
using ssd_internal::IoOp;
using ssd_internal::kHeaderBytes;
using ssd_internal::kPageBytes;
using ssd_internal::RoundUpToPage;
using ssd_internal::SsdFile;
using ssd_internal::SsdSlots;
using ssd_internal::SsdSyscalls;

constexpr uint64_t kMinRegionBytes = uint64_t{64} << 10;
constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 30;

void Log(absl::string_view what) {
  std::fprintf(stderr, "SsdStore: %.*s\n", static_cast<int>(what.size()), what.data());
}

class SsdStoreImpl final : public SsdStore {
 public:
  SsdStoreImpl(const SsdStoreOptions& options, SsdFile file, std::unique_ptr<IoEngine> engine,
               std::string engine_name)
      : options_(options),
        regions_(options.capacity_bytes / options.region_bytes),
        fd_(file.fd),
        direct_io_(file.direct_io),
        engine_name_(std::move(engine_name)),
        engine_(std::move(engine)),
        buffers_(options.staging_cache_bytes),
        slots_(options.region_bytes, regions_),
        classes_(ssd_internal::MakeSizeClasses(options.region_bytes)) {}

  ~SsdStoreImpl() override {
    engine_.reset();  // joins the pool's threads before the file goes
    close(fd_);
  }

  absl::StatusOr<SsdRef> Write(uint64_t key, std::span<const std::byte> payload,
                               uint64_t checksum) override {
    const std::optional<int> class_index = ClassOf(payload.size());
    if (!class_index) {
      return absl::InvalidArgumentError(
          absl::StrCat("SsdStore::Write: payload of ", payload.size(), " bytes; it must be 1..",
                       options_.region_bytes - kHeaderBytes, " (region_bytes minus the header)"));
    }
    const uint64_t footprint = classes_[*class_index];
    uint64_t offset;
    uint64_t sequence;
    {
      MutexLock lock(&mu_);
      written_ = true;  // no ReattachBatch from now on
      std::optional<uint64_t> slot = slots_.Allocate(*class_index);
      // Past the retention budget the oldest retained slots give way.
      while (!slot && retained_bytes_ > retention_budget_ && !retained_.empty()) {
        ReuseOldestRetainedLocked();
        slot = slots_.Allocate(*class_index);
      }
      if (!slot) {
        ++failed_writes_;
        return absl::ResourceExhaustedError(absl::StrCat(
            "SSD store full: no free ", footprint, "-byte slot for a ", payload.size(),
            "-byte block and all ", regions_, " regions of ", options_.region_bytes,
            " bytes are in use",
            retained_bytes_ == 0
                ? ""
                : absl::StrCat(" (", retained_bytes_, " bytes retained for the checkpoint)")));
      }
      offset = *slot;
      sequence = ++sequence_;
      ++live_extents_;
      allocated_bytes_ += footprint;
      payload_bytes_ += payload.size();
    }
    const uint64_t io_bytes = RoundUpToPage(kHeaderBytes + payload.size());
    BufferPool::Buffer buffer = buffers_.Take(io_bytes);
    if (buffer == nullptr) {
      FreeSlot(offset, footprint, payload.size());
      return absl::ResourceExhaustedError(
          absl::StrCat("SsdStore::Write: no memory for a ", io_bytes, "-byte bounce buffer"));
    }
    ssd_internal::EncodeHeader(ExtentHeader{.key = key,
                                            .payload_bytes = payload.size(),
                                            .sequence = sequence,
                                            .epoch = options_.epoch,
                                            .payload_checksum = checksum,
                                            .footprint = footprint},
                               {buffer.get(), kHeaderBytes});
    std::memcpy(buffer.get() + kHeaderBytes, payload.data(), payload.size());
    std::memset(buffer.get() + kHeaderBytes + payload.size(), 0,
                io_bytes - kHeaderBytes - payload.size());
    IoOp op{.write = true, .buf = buffer.get(), .len = io_bytes, .offset = offset};
    engine_->Run({&op, 1});
    if (op.result < 0 || static_cast<uint64_t>(op.result) != io_bytes) {
      FreeSlot(offset, footprint, payload.size());
      io_errors_.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(
          absl::StrCat("SSD write of ", io_bytes, " bytes at offset ", offset, " of ",
                       options_.path, " failed: ",
                       op.result < 0 ? ssd_internal::ErrnoText(static_cast<int>(-op.result))
                                     : absl::StrCat("short write (", op.result, " bytes)")));
    }
    writes_.fetch_add(1, std::memory_order_relaxed);
    write_bytes_.fetch_add(payload.size(), std::memory_order_relaxed);
    return MakeExtent(key, payload.size(), checksum, offset, footprint, sequence, options_.epoch);
  }

  absl::Status Read(const SsdExtent& extent, std::span<std::byte> out) override {
    absl::Status status;
    const SsdReadRequest request{&extent, out, &status};
    ReadBatch({&request, 1});
    return status;
  }

  void ReadBatch(std::span<const SsdReadRequest> requests) override {
    std::vector<IoOp> ops;
    std::vector<const SsdReadRequest*> issued;
    std::vector<BufferPool::Buffer> buffers;
    for (size_t begin = 0; begin < requests.size(); begin += options_.queue_depth) {
      const size_t end = std::min<size_t>(requests.size(), begin + options_.queue_depth);
      ops.clear();
      issued.clear();
      buffers.clear();
      for (size_t i = begin; i < end; ++i) {
        const SsdReadRequest& request = requests[i];
        if (absl::Status s = Check(request); !s.ok()) {
          *request.status = std::move(s);
          continue;
        }
        const uint64_t io_bytes = RoundUpToPage(kHeaderBytes + request.extent->size());
        BufferPool::Buffer buffer = buffers_.Take(io_bytes);
        if (buffer == nullptr) {
          *request.status = absl::ResourceExhaustedError(
              absl::StrCat("SsdStore::Read: no memory for a ", io_bytes, "-byte bounce buffer"));
          continue;
        }
        ops.push_back(
            IoOp{.buf = buffer.get(), .len = io_bytes, .offset = request.extent->offset()});
        issued.push_back(&request);
        buffers.push_back(std::move(buffer));
      }
      engine_->Run(ops);
      for (size_t k = 0; k < ops.size(); ++k) {
        *issued[k]->status = Finish(*issued[k]->extent, issued[k]->out, ops[k]);
      }
    }
  }

  SsdStoreStats GetStats() const override {
    SsdStoreStats stats;
    stats.capacity_bytes = regions_ * options_.region_bytes;
    stats.region_bytes = options_.region_bytes;
    {
      MutexLock lock(&mu_);
      stats.reserved_bytes = slots_.reserved_regions() * options_.region_bytes;
      stats.allocated_bytes = allocated_bytes_;
      stats.live_extents = live_extents_;
      stats.payload_bytes = payload_bytes_;
      stats.failed_writes = failed_writes_;
      stats.retained_bytes = retained_bytes_;
      stats.retained_extents = retained_.size();
      stats.retained_reused = retained_reused_;
      stats.reattached = reattached_;
      stats.reattach_failures = reattach_failures_;
    }
    stats.writes = writes_.load(std::memory_order_relaxed);
    stats.write_bytes = write_bytes_.load(std::memory_order_relaxed);
    stats.reads = reads_.load(std::memory_order_relaxed);
    stats.read_bytes = read_bytes_.load(std::memory_order_relaxed);
    stats.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
    stats.io_errors = io_errors_.load(std::memory_order_relaxed);
    stats.staging_cached_bytes = buffers_.cached_bytes();
    stats.staging_in_use_bytes = buffers_.in_use_bytes();
    stats.direct_io = direct_io_;
    stats.engine = engine_name_;
    return stats;
  }

  uint64_t RoundedSize(uint64_t payload_bytes) const override {
    const std::optional<int> class_index = ClassOf(payload_bytes);
    return class_index ? classes_[*class_index] : 0;
  }

  void ReattachBatch(std::span<SsdReattachRequest> requests) override {
    bool written;
    {
      MutexLock lock(&mu_);
      written = written_;
    }
    if (written) {
      for (SsdReattachRequest& r : requests) {
        Refuse(r, absl::FailedPreconditionError(
                      "SsdStore::ReattachBatch after the store's first Write"));
      }
      return;
    }
    std::vector<IoOp> ops;
    std::vector<SsdReattachRequest*> issued;
    std::vector<BufferPool::Buffer> buffers;
    for (size_t begin = 0; begin < requests.size(); begin += options_.queue_depth) {
      const size_t end = std::min<size_t>(requests.size(), begin + options_.queue_depth);
      ops.clear();
      issued.clear();
      buffers.clear();
      for (size_t i = begin; i < end; ++i) {
        SsdReattachRequest& request = requests[i];
        request.extent = nullptr;
        if (absl::Status s = CheckLocation(request); !s.ok()) {
          Refuse(request, std::move(s));
          continue;
        }
        BufferPool::Buffer buffer = buffers_.Take(kPageBytes);
        if (buffer == nullptr) {
          Refuse(request, absl::ResourceExhaustedError(
                              "SsdStore::ReattachBatch: no memory for a header buffer"));
          continue;
        }
        ops.push_back(IoOp{.buf = buffer.get(), .len = kPageBytes, .offset = request.offset});
        issued.push_back(&request);
        buffers.push_back(std::move(buffer));
      }
      engine_->Run(ops);
      for (size_t k = 0; k < ops.size(); ++k) {  // in request order
        SsdReattachRequest& request = *issued[k];
        if (absl::Status s = VerifyHeader(request, ops[k]); !s.ok()) {
          Refuse(request, std::move(s));
          continue;
        }
        request.status = Claim(request);
        if (!request.status.ok()) {
          Refuse(request, std::move(request.status));
          continue;
        }
        request.extent = MakeExtent(request.key, request.size, request.checksum, request.offset,
                                    request.footprint, request.sequence, request.epoch);
      }
    }
  }

  absl::Status Sync() override {
    if (fdatasync(fd_) != 0) {
      const int error = errno;
      io_errors_.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(
          absl::StrCat("fdatasync(", options_.path, ") failed: ", ssd_internal::ErrnoText(error)));
    }
    return absl::OkStatus();
  }

  void SetRetention(bool on) override {
    MutexLock lock(&mu_);
    retention_ = on;
  }

  void SetRetentionBudget(uint64_t bytes) override {
    MutexLock lock(&mu_);
    retention_budget_ = bytes;
  }

  uint64_t CheckpointStarted() override {
    MutexLock lock(&mu_);
    checkpoint_running_ = true;
    return frees_;
  }

  void CheckpointCommitted(uint64_t mark) override {
    MutexLock lock(&mu_);
    checkpoint_running_ = false;
    committed_through_ = sequence_;
    while (!retained_.empty() && retained_.front().number <= mark) {
      FreeRetainedLocked(retained_.front());
      retained_.pop_front();
    }
  }

  void CheckpointFailed() override {
    MutexLock lock(&mu_);
    checkpoint_running_ = false;
    std::deque<Retained> kept;
    for (const Retained& r : retained_) {
      if (MayBeListedLocked(r.epoch, r.sequence)) {
        kept.push_back(r);
      } else {
        FreeRetainedLocked(r);
      }
    }
    retained_ = std::move(kept);
  }

 private:
  // A slot kept by retention: its free number (the frees so far when it was
  // freed, itself included).
  struct Retained {
    uint64_t number;
    uint64_t offset;
    uint64_t footprint;
    uint64_t sequence;  // the extent's write
    uint64_t epoch;
  };

  // Whether a checkpoint may list the extent written as (epoch, sequence)
  // once its last reference has dropped: one is being taken (it may have
  // captured the extent), or the extent is an earlier process's (the
  // checkpoint this one restored from lists it), or it was written before
  // the newest commit.
  bool MayBeListedLocked(uint64_t epoch, uint64_t sequence) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return checkpoint_running_ || epoch != options_.epoch || sequence <= committed_through_;
  }

  void FreeRetainedLocked(const Retained& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!slots_.Free(r.offset)) {
      Log(absl::StrCat("releasing retained slot at offset ", r.offset,
                       " that is not allocated (ignored)"));
    }
    retained_bytes_ -= r.footprint;
  }

  void ReuseOldestRetainedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FreeRetainedLocked(retained_.front());
    retained_.pop_front();
    ++retained_reused_;
  }

  void Refuse(SsdReattachRequest& request, absl::Status status) {
    request.extent = nullptr;
    request.status = std::move(status);
    MutexLock lock(&mu_);
    ++reattach_failures_;
  }

  std::string ReattachWhere(const SsdReattachRequest& request) const {
    return absl::StrCat("extent at offset ", request.offset, " of ", options_.path, " (key ",
                        request.key, ", epoch ", request.epoch, ", sequence ", request.sequence,
                        ")");
  }

  // INVALID_ARGUMENT unless the request names a slot of this layout that
  // holds its size.
  absl::Status CheckLocation(const SsdReattachRequest& request) const {
    const uint64_t rounded = RoundedSize(request.size);
    if (rounded == 0 || rounded != request.footprint) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SsdStore::ReattachBatch: ", ReattachWhere(request), ": footprint ", request.footprint,
          " is not the class of a ", request.size, "-byte block in this layout (",
          rounded == 0 ? "no class" : absl::StrCat(rounded, " bytes"), "; region_bytes ",
          options_.region_bytes, ")"));
    }
    const uint64_t within = request.offset % options_.region_bytes;
    if (request.offset / options_.region_bytes >= regions_ || within % request.footprint != 0 ||
        within / request.footprint >= options_.region_bytes / request.footprint) {
      return absl::InvalidArgumentError(
          absl::StrCat("SsdStore::ReattachBatch: ", ReattachWhere(request),
                       ": offset is not a slot of ", request.footprint, " bytes in ", regions_,
                       " regions of ", options_.region_bytes, " bytes"));
    }
    return absl::OkStatus();
  }

  // DATA_LOSS unless the header `op` read says exactly what `request` does.
  absl::Status VerifyHeader(const SsdReattachRequest& request, const IoOp& op) {
    const std::string where = ReattachWhere(request);
    if (op.result < 0) {
      io_errors_.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(
          absl::StrCat("SSD header read of ", where,
                       " failed: ", ssd_internal::ErrnoText(static_cast<int>(-op.result))));
    }
    if (static_cast<uint64_t>(op.result) < kHeaderBytes) {
      return absl::DataLossError(absl::StrCat(
          "SSD header read of ", where, " was short: ", op.result, " of ", kHeaderBytes, " bytes"));
    }
    ExtentHeader header;
    if (absl::Status s = ssd_internal::DecodeHeader({op.buf, kHeaderBytes}, where, &header);
        !s.ok()) {
      return s;
    }
    const std::pair<absl::string_view, std::pair<uint64_t, uint64_t>> fields[] = {
        {"key", {header.key, request.key}},
        {"payload size", {header.payload_bytes, request.size}},
        {"sequence", {header.sequence, request.sequence}},
        {"epoch", {header.epoch, request.epoch}},
        {"payload checksum", {header.payload_checksum, request.checksum}},
        {"footprint", {header.footprint, request.footprint}},
    };
    for (const auto& [field, values] : fields) {
      if (values.first != values.second) {
        return absl::DataLossError(absl::StrCat("SSD ", where, ": header ", field, " is ",
                                                values.first, ", expected ", values.second));
      }
    }
    return absl::OkStatus();
  }

  // Makes the request's slot live: FAILED_PRECONDITION when it conflicts.
  absl::Status Claim(const SsdReattachRequest& request) {
    const int class_index = *ClassOf(request.size);  // CheckLocation passed
    MutexLock lock(&mu_);
    if (written_) {
      return absl::FailedPreconditionError(
          absl::StrCat("SsdStore::ReattachBatch: ", ReattachWhere(request),
                       ": the store has written since the batch began"));
    }
    switch (slots_.Claim(request.offset, class_index)) {
      case SsdSlots::ClaimResult::kClaimed:
        break;
      case SsdSlots::ClaimResult::kTaken:
        return absl::FailedPreconditionError(absl::StrCat(
            "SsdStore::ReattachBatch: ", ReattachWhere(request), ": the slot is live already"));
      case SsdSlots::ClaimResult::kOtherClass:
        return absl::FailedPreconditionError(
            absl::StrCat("SsdStore::ReattachBatch: ", ReattachWhere(request), ": its region (",
                         request.offset / options_.region_bytes,
                         ") serves another size class than ", request.footprint, " bytes"));
      case SsdSlots::ClaimResult::kNotASlot:
        return absl::InvalidArgumentError(absl::StrCat(
            "SsdStore::ReattachBatch: ", ReattachWhere(request), ": not a slot of this layout"));
    }
    sequence_ = std::max(sequence_, request.sequence);
    ++live_extents_;
    ++reattached_;
    allocated_bytes_ += request.footprint;
    payload_bytes_ += request.size;
    return absl::OkStatus();
  }

  std::optional<int> ClassOf(uint64_t payload_bytes) const {
    if (payload_bytes == 0 || payload_bytes > options_.region_bytes - kHeaderBytes) {
      return std::nullopt;
    }
    return ssd_internal::ClassFor(classes_, kHeaderBytes + payload_bytes);
  }

  void ReleaseExtent(const SsdExtent& extent) override {
    {
      MutexLock lock(&mu_);
      const uint64_t number = ++frees_;
      if (retention_ && MayBeListedLocked(extent.epoch(), extent.sequence())) {
        --live_extents_;
        allocated_bytes_ -= extent.footprint();
        payload_bytes_ -= extent.size();
        retained_.push_back(Retained{.number = number,
                                     .offset = extent.offset(),
                                     .footprint = extent.footprint(),
                                     .sequence = extent.sequence(),
                                     .epoch = extent.epoch()});
        retained_bytes_ += extent.footprint();
        return;
      }
    }
    FreeSlot(extent.offset(), extent.footprint(), extent.size());
  }

  void FreeSlot(uint64_t offset, uint64_t footprint, uint64_t payload_bytes) {
    MutexLock lock(&mu_);
    if (!slots_.Free(offset)) {
      Log(absl::StrCat("freeing slot at offset ", offset, " that is not allocated (ignored)"));
      return;
    }
    --live_extents_;
    allocated_bytes_ -= footprint;
    payload_bytes_ -= payload_bytes;
  }

  absl::Status Check(const SsdReadRequest& request) const {
    if (request.extent == nullptr || !Owns(*request.extent)) {
      return absl::InvalidArgumentError("SsdStore::Read: the extent belongs to another store");
    }
    if (request.out.size() != request.extent->size()) {
      return absl::InvalidArgumentError(absl::StrCat("SsdStore::Read: out has ", request.out.size(),
                                                     " bytes; the extent has ",
                                                     request.extent->size()));
    }
    return absl::OkStatus();
  }

  absl::Status DataLoss(std::string message) {
    checksum_failures_.fetch_add(1, std::memory_order_relaxed);
    return absl::DataLossError(std::move(message));
  }

  // Verifies what `op` read for `extent` and copies the payload to `out`.
  absl::Status Finish(const SsdExtent& extent, std::span<std::byte> out, const IoOp& op) {
    const std::string where = absl::StrCat("extent at offset ", extent.offset(), " of ",
                                           options_.path, " (key ", extent.key(), ")");
    if (op.result < 0) {
      io_errors_.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(
          absl::StrCat("SSD read of ", where, " failed: ", ssd_internal::ErrnoText(-op.result)));
    }
    if (static_cast<uint64_t>(op.result) < op.len) {
      return DataLoss(
          absl::StrCat("SSD read of ", where, " was short: ", op.result, " of ", op.len, " bytes"));
    }
    ExtentHeader header;
    if (absl::Status s = ssd_internal::DecodeHeader({op.buf, kHeaderBytes}, where, &header);
        !s.ok()) {
      return DataLoss(std::string(s.message()));
    }
    auto mismatch = [&](absl::string_view field, uint64_t stored, uint64_t expected) {
      return DataLoss(
          absl::StrCat("SSD ", where, ": header ", field, " is ", stored, ", expected ", expected));
    };
    if (header.key != extent.key()) return mismatch("key", header.key, extent.key());
    if (header.payload_bytes != extent.size()) {
      return mismatch("payload size", header.payload_bytes, extent.size());
    }
    if (header.sequence != extent.sequence()) {
      return mismatch("sequence", header.sequence, extent.sequence());
    }
    if (header.epoch != extent.epoch()) return mismatch("epoch", header.epoch, extent.epoch());
    if (header.payload_checksum != extent.checksum()) {
      return mismatch("payload checksum", header.payload_checksum, extent.checksum());
    }
    if (header.footprint != extent.footprint()) {
      return mismatch("footprint", header.footprint, extent.footprint());
    }
    std::memcpy(out.data(), op.buf + kHeaderBytes, out.size());
    if (const uint64_t actual = XXH3_64bits(out.data(), out.size()); actual != extent.checksum()) {
      return DataLoss(
          absl::StrFormat("SSD %s: payload checksum mismatch (expected %016x, read %016x)", where,
                          extent.checksum(), actual));
    }
    reads_.fetch_add(1, std::memory_order_relaxed);
    read_bytes_.fetch_add(out.size(), std::memory_order_relaxed);
    return absl::OkStatus();
  }

  const SsdStoreOptions options_;
  const uint64_t regions_;
  const int fd_;
  const bool direct_io_;
  const std::string engine_name_;
  std::unique_ptr<IoEngine> engine_;
  BufferPool buffers_;

  mutable Mutex mu_;
  SsdSlots slots_ ABSL_GUARDED_BY(mu_);
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t live_extents_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocated_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t payload_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_writes_ ABSL_GUARDED_BY(mu_) = 0;
  bool written_ ABSL_GUARDED_BY(mu_) = false;  // a Write() has allocated a slot
  uint64_t reattached_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reattach_failures_ ABSL_GUARDED_BY(mu_) = 0;
  bool retention_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t retention_budget_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  bool checkpoint_running_ ABSL_GUARDED_BY(mu_) = false;
  // Extents of this epoch up to this sequence may be in the newest commit.
  uint64_t committed_through_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t frees_ ABSL_GUARDED_BY(mu_) = 0;             // extents released so far
  std::deque<Retained> retained_ ABSL_GUARDED_BY(mu_);  // ascending numbers
  uint64_t retained_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t retained_reused_ ABSL_GUARDED_BY(mu_) = 0;
  const std::vector<uint64_t> classes_;

  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> write_bytes_{0};
  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> read_bytes_{0};
  std::atomic<uint64_t> checksum_failures_{0};
  std::atomic<uint64_t> io_errors_{0};
};

absl::Status CheckRange(absl::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("ssd_store.", field, " is ", value, "; it must be in ", lo, "..", hi));
  }
  return absl::OkStatus();
}

}  // namespace

SsdExtent::~SsdExtent() { store_->ReleaseExtent(*this); }

absl::Status SsdStoreOptions::Validate() const {
  if (path.empty()) return absl::InvalidArgumentError("ssd_store.path is empty");
  if (!std::has_single_bit(region_bytes) || region_bytes < kMinRegionBytes ||
      region_bytes > kMaxRegionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ssd_store.region_bytes is ", region_bytes,
                                                   "; it must be a power of two in ",
                                                   kMinRegionBytes, "..", kMaxRegionBytes));
  }
  if (capacity_bytes < region_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ssd_store.capacity_bytes is ", capacity_bytes,
                     "; it must hold at least one region (region_bytes ", region_bytes, ")"));
  }
  KVCACHE_RETURN_IF_ERROR(CheckRange("io_threads", io_threads, 1, 256));
  KVCACHE_RETURN_IF_ERROR(CheckRange("queue_depth", queue_depth, 1, 4096));
  if (staging_cache_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ssd_store.staging_cache_bytes is ", staging_cache_bytes, "; allowed: 0 .. 1073741824"));
  }
  return absl::OkStatus();
}

namespace ssd_internal {

absl::StatusOr<std::unique_ptr<SsdStore>> OpenSsdStore(const SsdStoreOptions& options,
                                                       const SsdSyscalls& syscalls) {
  KVCACHE_RETURN_IF_ERROR(options.Validate());
  absl::StatusOr<SsdFile> file =
      OpenSsdFile(options.path, options.capacity_bytes, options.direct_io, syscalls);
  if (!file.ok()) return file.status();
  if (!file->note.empty()) Log(absl::StrCat(options.path, ": ", file->note));

  std::unique_ptr<IoEngine> engine;
  std::string engine_name;
  if (options.engine != SsdIoEngine::kThreadPool) {  // kAuto is io_uring
    if (const int rc = syscalls.probe_io_uring(options.queue_depth); rc == 0) {
      engine = MakeIoUringEngine(file->fd, options.queue_depth);
      engine_name = "io_uring";
    } else {
      engine_name = absl::StrCat("thread_pool (io_uring unavailable: ", ErrnoText(-rc), ")");
      Log(absl::StrCat(options.path, ": io_uring_queue_init failed (", ErrnoText(-rc),
                       "); using the thread pool"));
    }
  }
  if (engine == nullptr) {
    engine = MakeThreadPoolEngine(file->fd, options.io_threads);
    if (engine_name.empty()) engine_name = "thread_pool";
  }
  return std::unique_ptr<SsdStore>(
      new SsdStoreImpl(options, *std::move(file), std::move(engine), std::move(engine_name)));
}

}  // namespace ssd_internal

absl::StatusOr<std::unique_ptr<SsdStore>> SsdStore::Open(const SsdStoreOptions& options) {
  return ssd_internal::OpenSsdStore(options, ssd_internal::RealSyscalls());
}

}  // namespace kvcache
