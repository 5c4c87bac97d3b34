#include "shm_transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kvcache/shm_frame.h"

namespace kvcache::internal {
namespace {

std::atomic<uint64_t> next_region_serial{1};

absl::Status StatusOf(const v1::ShmResponse& response) {
  if (response.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
}

uint64_t PageRounded(uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

class ShmTransport::Region final : public SharedRegion {
 public:
  Region(std::weak_ptr<ShmTransport> transport, int fd, std::byte* data, uint64_t size,
         bool registered)
      : transport_(std::move(transport)),
        fd_(fd),
        data_(data),
        size_(size),
        serial_(next_region_serial.fetch_add(1)),
        registered_(registered) {}
  ~Region() override {
    if (registered_) {
      if (std::shared_ptr<ShmTransport> t = transport_.lock()) t->Forget(serial_);
    }
    ::munmap(data_, size_);
    ::close(fd_);
  }
  std::span<std::byte> bytes() const override { return {data_, size_}; }
  int fd() const { return fd_; }
  uint64_t serial() const { return serial_; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

  // A sealed memfd of `bytes` (page-rounded), mapped.
  static absl::StatusOr<std::shared_ptr<Region>> Create(std::weak_ptr<ShmTransport> transport,
                                                        uint64_t bytes, bool registered) {
    if (bytes == 0) return absl::InvalidArgumentError("a shared region needs at least one byte");
    const uint64_t size = PageRounded(bytes);
    const int fd = ::memfd_create("kvcache-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
    }
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0 ||
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot size a shared region of ", size, " bytes: ", std::strerror(err)));
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot map a shared region of ", size, " bytes: ", std::strerror(err)));
    }
    return std::make_shared<Region>(std::move(transport), fd, static_cast<std::byte*>(p), size,
                                    registered);
  }

 private:
  const std::weak_ptr<ShmTransport> transport_;
  const int fd_;
  std::byte* const data_;
  const uint64_t size_;
  const uint64_t serial_;
  const bool registered_;  // a caller's region (not a connection's staging)
};

struct ShmTransport::Connection {
  explicit Connection(int f) : fd(f) {}
  ~Connection() { ::close(fd); }
  const int fd;
  uint64_t max_frame_bytes = uint64_t{64} << 20;
  absl::flat_hash_map<uint64_t, uint64_t> attached;  // region serial -> id on this connection
  std::vector<uint64_t> pending_detach;  // serials to detach; guarded by the transport's mu_
  std::shared_ptr<Region> staging;
  uint64_t staging_id = 0;
  bool broken = false;
  std::string frame;  // the last answer read
};

struct ShmTransport::Lent {
  Lent(ShmTransport* t, std::unique_ptr<Connection> c) : transport(t), connection(std::move(c)) {}
  Lent(Lent&&) = default;
  ~Lent() {
    if (connection != nullptr) transport->GiveBack(std::move(connection));
  }
  Connection& operator*() { return *connection; }
  ShmTransport* transport;
  std::unique_ptr<Connection> connection;
};

absl::StatusOr<std::shared_ptr<ShmTransport>> ShmTransport::Open(
    const ShmTransportOptions& options) {
  std::shared_ptr<ShmTransport> transport(new ShmTransport(options));
  auto first = transport->Connect();
  if (!first.ok()) return first.status();
  absl::MutexLock lock(&transport->mu_);
  transport->idle_.push_back(*std::move(first));
  transport->open_ = 1;
  return transport;
}

ShmTransport::ShmTransport(const ShmTransportOptions& options) : options_(options) {}

ShmTransport::~ShmTransport() = default;

absl::StatusOr<std::unique_ptr<ShmTransport::Connection>> ShmTransport::Connect() {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options_.socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory socket path too long: ", options_.socket_path));
  }
  std::memcpy(addr.sun_path, options_.socket_path.data(), options_.socket_path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  auto connection = std::make_unique<Connection>(fd);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to kvcached's shared-memory socket ",
                                               options_.socket_path, ": ", std::strerror(errno)));
  }
  const timeval tv = absl::ToTimeval(options_.timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  v1::ShmRequest hello;
  hello.mutable_hello()->set_version(v1::SHM_VERSION_1);
  if (!options_.token.empty()) hello.mutable_hello()->set_token(options_.token);
  auto answer = Call(*connection, hello);
  if (!answer.ok()) return answer.status();
  if (answer->hello().version() != v1::SHM_VERSION_1) {
    return absl::FailedPreconditionError(
        absl::StrCat("kvcached's shared-memory socket speaks version ", answer->hello().version(),
                     "; this client speaks ", v1::SHM_VERSION_1));
  }
  connection->max_frame_bytes = answer->hello().max_frame_bytes();
  return connection;
}

absl::StatusOr<ShmTransport::Lent> ShmTransport::Take() {
  {
    absl::MutexLock lock(&mu_);
    auto can_go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !idle_.empty() || open_ < options_.max_connections;
    };
    mu_.Await(absl::Condition(&can_go));
    if (!idle_.empty()) {
      std::unique_ptr<Connection> c = std::move(idle_.back());
      idle_.pop_back();
      busy_.push_back(c.get());
      return Lent(this, std::move(c));
    }
    ++open_;
  }
  auto c = Connect();
  absl::MutexLock lock(&mu_);
  if (!c.ok()) {
    --open_;
    return c.status();
  }
  busy_.push_back(c->get());
  return Lent(this, *std::move(c));
}

void ShmTransport::GiveBack(std::unique_ptr<Connection> c) {
  for (;;) {
    std::vector<uint64_t> detach;
    {
      absl::MutexLock lock(&mu_);
      if (c->broken || c->pending_detach.empty()) {
        busy_.erase(std::find(busy_.begin(), busy_.end(), c.get()));
        if (c->broken) {
          --open_;
        } else {
          idle_.push_back(std::move(c));
        }
        return;
      }
      detach.swap(c->pending_detach);
    }
    for (uint64_t serial : detach) {
      auto it = c->attached.find(serial);
      if (it == c->attached.end()) continue;
      v1::ShmRequest request;
      request.mutable_detach_region()->set_region_id(it->second);
      c->attached.erase(it);
      (void)Call(*c, request);
    }
  }
}

absl::StatusOr<v1::ShmResponse> ShmTransport::Call(Connection& c, const v1::ShmRequest& request,
                                                   int fd) {
  if (c.broken) return absl::UnavailableError("the shared-memory connection is closed");
  absl::Status s = shm::WriteFrame(c.fd, request, fd);
  std::vector<int> fds;
  if (s.ok()) s = shm::ReadFrame(c.fd, c.max_frame_bytes + 1024, &c.frame, &fds);
  for (int extra : fds) ::close(extra);  // the daemon sends none
  if (!s.ok()) {
    c.broken = true;
    return absl::UnavailableError(
        absl::StrCat("kvcached's shared-memory connection failed: ", s.message()));
  }
  v1::ShmResponse response;
  if (!response.ParseFromString(c.frame)) {
    c.broken = true;
    return absl::DataLossError("kvcached sent a frame that is not a kvcache.v1.ShmResponse");
  }
  if (absl::Status status = StatusOf(response); !status.ok()) return status;
  return response;
}

absl::StatusOr<uint64_t> ShmTransport::AttachedId(Connection& c, Region& region) {
  if (auto it = c.attached.find(region.serial()); it != c.attached.end()) return it->second;
  v1::ShmRequest request;
  request.mutable_attach_region()->set_bytes(region.size());
  auto answer = Call(c, request, region.fd());
  if (!answer.ok()) return answer.status();
  const uint64_t id = answer->attach_region().region_id();
  c.attached[region.serial()] = id;
  return id;
}

absl::StatusOr<std::pair<std::span<std::byte>, uint64_t>> ShmTransport::Staging(Connection& c,
                                                                                uint64_t bytes) {
  if (c.staging == nullptr || c.staging->size() < bytes) {
    if (c.staging != nullptr) {
      v1::ShmRequest detach;
      detach.mutable_detach_region()->set_region_id(c.staging_id);
      c.staging.reset();
      if (auto s = Call(c, detach); !s.ok()) return s.status();
    }
    auto region = Region::Create({}, std::max(bytes, options_.staging_bytes), false);
    if (!region.ok()) return region.status();
    v1::ShmRequest attach;
    attach.mutable_attach_region()->set_bytes((*region)->size());
    auto answer = Call(c, attach, (*region)->fd());
    if (!answer.ok()) return answer.status();
    c.staging = *std::move(region);
    c.staging_id = answer->attach_region().region_id();
  }
  return std::make_pair(std::span<std::byte>(c.staging->data(), bytes), c.staging_id);
}

ShmTransport::Region* ShmTransport::FindRegion(const std::byte* data, size_t size) {
  absl::MutexLock lock(&mu_);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  auto it = regions_.upper_bound(begin);
  if (it == regions_.begin()) return nullptr;
  --it;
  Region* r = it->second;
  const uintptr_t base = reinterpret_cast<uintptr_t>(r->data());
  if (begin - base > r->size() || size > r->size() - (begin - base)) return nullptr;
  return r;
}

void ShmTransport::Forget(uint64_t serial) {
  // Idle connections that attached the region are taken out of the pool
  // under mu_ and given back after it, so the detach requests (socket I/O,
  // up to the call timeout each) run without the lock every call takes.
  std::vector<std::unique_ptr<Connection>> detaching;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = regions_.begin(); it != regions_.end(); ++it) {
      if (it->second->serial() == serial) {
        regions_.erase(it);
        break;
      }
    }
    for (Connection* c : busy_) c->pending_detach.push_back(serial);
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (!(*it)->attached.contains(serial)) {
        ++it;
        continue;
      }
      (*it)->pending_detach.push_back(serial);
      busy_.push_back(it->get());
      detaching.push_back(std::move(*it));
      it = idle_.erase(it);
    }
  }
  // GiveBack sends the pending detaches, then returns each to the pool (a
  // broken one is dropped).
  for (std::unique_ptr<Connection>& c : detaching) GiveBack(std::move(c));
}

absl::StatusOr<std::shared_ptr<SharedRegion>> ShmTransport::CreateRegion(uint64_t bytes) {
  auto region = Region::Create(weak_from_this(), bytes, true);
  if (!region.ok()) return region.status();
  absl::MutexLock lock(&mu_);
  regions_[reinterpret_cast<uintptr_t>((*region)->data())] = region->get();
  return std::shared_ptr<SharedRegion>(*std::move(region));
}

absl::StatusOr<v1::LookupResponse> ShmTransport::Lookup(const v1::LookupRequest& request) {
  auto lent = Take();
  if (!lent.ok()) return lent.status();
  v1::ShmRequest r;
  *r.mutable_lookup() = request;
  auto answer = Call(**lent, r);
  if (!answer.ok()) return answer.status();
  return std::move(*answer->mutable_lookup());
}

absl::StatusOr<v1::BatchLookupResponse> ShmTransport::BatchLookup(
    const v1::BatchLookupRequest& request) {
  auto lent = Take();
  if (!lent.ok()) return lent.status();
  v1::ShmRequest r;
  *r.mutable_batch_lookup() = request;
  auto answer = Call(**lent, r);
  if (!answer.ok()) return answer.status();
  return std::move(*answer->mutable_batch_lookup());
}

absl::StatusOr<bool> ShmTransport::ReleaseLease(uint64_t lease_id) {
  auto lent = Take();
  if (!lent.ok()) return lent.status();
  v1::ShmRequest r;
  r.mutable_release_lease()->set_lease_id(lease_id);
  auto answer = Call(**lent, r);
  if (!answer.ok()) return answer.status();
  return answer->release_lease().released();
}

absl::StatusOr<FetchResult> ShmTransport::Fetch(v1::FetchIntoRequest request,
                                                std::span<std::byte> out) {
  auto lent = Take();
  if (!lent.ok()) return lent.status();
  Connection& c = **lent;
  std::byte* landing = out.data();
  v1::RegionRange* destination = request.mutable_destination();
  destination->set_length(out.size());
  if (Region* region = FindRegion(out.data(), out.size()); region != nullptr) {
    auto id = AttachedId(c, *region);
    if (!id.ok()) return id.status();
    destination->set_region_id(*id);
    destination->set_offset(static_cast<uint64_t>(out.data() - region->data()));
  } else {
    auto staging = Staging(c, out.size());
    if (!staging.ok()) return staging.status();
    destination->set_region_id(staging->second);
    destination->set_offset(0);
    landing = staging->first.data();
  }
  v1::ShmRequest r;
  *r.mutable_fetch_into() = std::move(request);
  auto answer = Call(c, r);
  if (!answer.ok()) return answer.status();
  const v1::FetchIntoResponse& f = answer->fetch_into();
  const uint64_t block_bytes = f.block_bytes();
  const uint64_t blocks = static_cast<uint64_t>(f.blocks_size());
  if (blocks > 0 && (block_bytes == 0 || blocks > out.size() / block_bytes)) {
    return absl::DataLossError(absl::StrCat("Fetch: the daemon reports ", blocks, " blocks of ",
                                            block_bytes, " bytes for a buffer of ", out.size()));
  }
  FetchResult result;
  result.matched_tokens = f.matched_tokens();
  result.withheld_tokens = f.withheld_tokens();
  result.blocks = static_cast<uint32_t>(blocks);
  result.bytes = blocks * block_bytes;
  bool pruned = false;
  for (uint64_t b = 0; b < blocks; ++b) {
    const v1::FetchedBlock& block = f.blocks(static_cast<int>(b));
    if (block.index() != b) {
      return absl::DataLossError(
          absl::StrCat("Fetch: expected block ", b, ", the daemon reports ", block.index()));
    }
    std::byte* at = out.data() + b * block_bytes;
    if (landing != out.data()) std::memcpy(at, landing + b * block_bytes, block_bytes);
    if (XXH3_64bits(at, block_bytes) != block.checksum()) {
      return absl::DataLossError(absl::StrCat("Fetch: block ", b, " does not match its checksum"));
    }
    if (block.encoding() == v1::BLOCK_ENCODING_DEQUANTIZED) ++result.dequantized_blocks;
    pruned |= block.kept_tokens_size() > 0;
  }
  if (pruned) {
    for (const v1::FetchedBlock& block : f.blocks()) {
      result.kept_tokens.emplace_back(block.kept_tokens().begin(), block.kept_tokens().end());
    }
  }
  return result;
}

absl::StatusOr<v1::AppendResponse> ShmTransport::Append(const v1::AppendHeader& header,
                                                        std::span<const std::byte> kv) {
  auto lent = Take();
  if (!lent.ok()) return lent.status();
  Connection& c = **lent;
  v1::ShmRequest r;
  v1::AppendFromRequest* a = r.mutable_append_from();
  *a->mutable_header() = header;
  v1::RegionRange* source = a->mutable_source();
  source->set_length(kv.size());
  if (Region* region = FindRegion(kv.data(), kv.size()); region != nullptr) {
    auto id = AttachedId(c, *region);
    if (!id.ok()) return id.status();
    source->set_region_id(*id);
    source->set_offset(static_cast<uint64_t>(kv.data() - region->data()));
  } else {
    auto staging = Staging(c, std::max<uint64_t>(kv.size(), 1));
    if (!staging.ok()) return staging.status();
    std::memcpy(staging->first.data(), kv.data(), kv.size());
    source->set_region_id(staging->second);
    source->set_offset(0);
  }
  auto answer = Call(c, r);
  if (!answer.ok()) return answer.status();
  return std::move(*answer->mutable_append_from());
}

}  // namespace kvcache::internal
