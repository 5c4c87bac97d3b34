// ShmSession against a real Cache and real sealed memfds (no socket: the
// frames' transport is tested end to end in tests/integration/shm_test.cc).
#include "server/shm/shm_session.h"

#include <gmock/gmock.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "server/core/cache_test_util.h"
#include "server/security/access_control.h"
#include "server/shm/shm_session_test_util.h"

namespace kvcache {
namespace {

using namespace cache_test;  // NOLINT: the cache tests' models and patterns

// Mappings of test regions in this process (the daemon's view of "unmapped").
int MappingsOfTestRegions() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(kRegionName) != std::string::npos) ++n;
  }
  return n;
}

class ShmSessionTest : public CacheTest {
 protected:
  void SetUp() override {
    MakeCache(64);
    Register(Mid());
    session_ = NewSession();
  }
  std::unique_ptr<ShmSession> NewSession() {
    return std::make_unique<ShmSession>(ShmLimits{.max_regions = 4, .max_region_bytes = 1 << 24},
                                        cache_.get(), &copier_, &observer_);
  }

  uint64_t Attach(ShmSession& session, WorkerRegion& region, uint64_t bytes) {
    v1::ShmRequest request;
    request.mutable_attach_region()->set_bytes(bytes);
    v1::ShmResponse response = Answer(session, request, region.Passed());
    EXPECT_EQ(response.code(), 0) << response.message();
    return response.attach_region().region_id();
  }

  v1::ShmResponse AppendFrom(ShmSession& session, const std::vector<Token>& tokens, uint64_t region,
                             uint64_t offset, uint64_t length, bool checksums = true) {
    v1::ShmRequest request;
    v1::AppendFromRequest* a = request.mutable_append_from();
    a->mutable_header()->set_model_id(Mid().key.model_id);
    a->mutable_header()->mutable_tokens()->Add(tokens.begin(), tokens.end());
    if (checksums) {
      for (uint64_t c : Checksums(Mid(), tokens, 0)) a->mutable_header()->add_block_checksums(c);
    }
    a->mutable_source()->set_region_id(region);
    a->mutable_source()->set_offset(offset);
    a->mutable_source()->set_length(length);
    return Answer(session, request, {});
  }

  v1::ShmResponse FetchInto(ShmSession& session, const std::vector<Token>& tokens, uint64_t region,
                            uint64_t offset, uint64_t length, uint32_t max_blocks = 0) {
    v1::ShmRequest request;
    v1::FetchIntoRequest* f = request.mutable_fetch_into();
    f->set_model_id(Mid().key.model_id);
    f->mutable_tokens()->Add(tokens.begin(), tokens.end());
    f->mutable_destination()->set_region_id(region);
    f->mutable_destination()->set_offset(offset);
    f->mutable_destination()->set_length(length);
    f->set_max_blocks(max_blocks);
    return Answer(session, request, {});
  }

  // Writes the KV of `tokens`' blocks at `at` in `region`.
  void WriteKv(WorkerRegion& region, uint64_t at, const std::vector<Token>& tokens) {
    const std::vector<std::byte> kv = Kv(Mid(), tokens, 0, tokens.size() / kBt);
    std::memcpy(region.data() + at, kv.data(), kv.size());
  }

  CopyEngine copier_{0, 0};
  NullRpcObserver observer_;
  std::unique_ptr<ShmSession> session_;
};

const uint64_t kBlock = Mid().layout.BlockBytes();

TEST_F(ShmSessionTest, AppendFromAndFetchIntoRoundTripByteExact) {
  WorkerRegion region(1 << 20);
  const uint64_t id = Attach(*session_, region, 1 << 20);
  const std::vector<Token> tokens = Seq({1, 2, 3, 4, 5}, 7);
  WriteKv(region, 4096, tokens);
  v1::ShmResponse appended = AppendFrom(*session_, tokens, id, 4096, 5 * kBlock);
  ASSERT_EQ(appended.code(), 0) << appended.message();
  EXPECT_EQ(appended.append_from().stored_blocks(), 5u);
  EXPECT_TRUE(PlanHolds(*cache_->PrepareFetch(Mid().key, {.tokens = tokens}), Mid(), tokens));

  std::memset(region.data() + 65536, 0, 5 * kBlock);
  v1::ShmResponse fetched = FetchInto(*session_, tokens, id, 65536, 8 * kBlock);
  ASSERT_EQ(fetched.code(), 0) << fetched.message();
  const v1::FetchIntoResponse& f = fetched.fetch_into();
  EXPECT_EQ(f.matched_tokens(), 5 * kBt);
  EXPECT_EQ(f.block_bytes(), kBlock);
  ASSERT_EQ(f.blocks_size(), 5);
  for (int b = 0; b < 5; ++b) {
    const std::vector<std::byte> expected = Pattern(Mid(), tokens, b);
    std::span<const std::byte> got(region.data() + 65536 + b * kBlock, kBlock);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin())) << "block " << b;
    EXPECT_EQ(f.blocks(b).checksum(), Checksum(expected));
    EXPECT_EQ(f.blocks(b).index(), static_cast<uint32_t>(b));
    EXPECT_EQ(f.blocks(b).encoding(), v1::BLOCK_ENCODING_RAW);
  }
}

TEST_F(ShmSessionTest, MaxBlocksFetchesAPrefixOfTheMatch) {
  WorkerRegion region(1 << 20);
  const uint64_t id = Attach(*session_, region, 1 << 20);
  const std::vector<Token> tokens = Seq({1, 2, 3, 4});
  WriteKv(region, 0, tokens);
  ASSERT_EQ(AppendFrom(*session_, tokens, id, 0, 4 * kBlock).code(), 0);
  v1::ShmResponse fetched = FetchInto(*session_, tokens, id, 0, 2 * kBlock, 2);
  ASSERT_EQ(fetched.code(), 0) << fetched.message();
  EXPECT_EQ(fetched.fetch_into().matched_tokens(), 2 * kBt);
  EXPECT_EQ(fetched.fetch_into().blocks_size(), 2);
}

TEST_F(ShmSessionTest, RangeTooSmallForThePrefixWritesNothing) {
  WorkerRegion region(1 << 20);
  const uint64_t id = Attach(*session_, region, 1 << 20);
  const std::vector<Token> tokens = Seq({1, 2, 3});
  WriteKv(region, 0, tokens);
  ASSERT_EQ(AppendFrom(*session_, tokens, id, 0, 3 * kBlock).code(), 0);
  std::memset(region.data() + 500000, 0xab, 3 * kBlock);
  v1::ShmResponse fetched = FetchInto(*session_, tokens, id, 500000, 3 * kBlock - 1);
  EXPECT_EQ(fetched.code(), static_cast<int>(kInvalidArgument));
  EXPECT_THAT(fetched.message(), HasSubstr(absl::StrCat("need ", 3 * kBlock)));
  EXPECT_FALSE(fetched.has_fetch_into());
  for (uint64_t i = 0; i < 3 * kBlock; ++i) {
    ASSERT_EQ(region.data()[500000 + i], std::byte{0xab}) << "byte " << i << " was written";
  }
}

TEST_F(ShmSessionTest, RangesOutsideTheRegionAreRefusedAndChangeNothing) {
  WorkerRegion region(1 << 20);
  const uint64_t id = Attach(*session_, region, 1 << 16);  // maps only the first 64 KiB
  const std::vector<Token> tokens = Seq({1, 2});
  WriteKv(region, 0, tokens);
  for (auto [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {(1 << 16) - kBlock, 2 * kBlock},  // runs past the end
           {1 << 16, 2 * kBlock},             // starts at the end
           {UINT64_MAX - 8, 2 * kBlock},      // offset + length overflows
           {0, UINT64_MAX}}) {
    v1::ShmResponse r = AppendFrom(*session_, tokens, id, offset, length);
    EXPECT_EQ(r.code(), static_cast<int>(kOutOfRange)) << offset << " " << r.message();
    r = FetchInto(*session_, tokens, id, offset, length);
    EXPECT_EQ(r.code(), static_cast<int>(kOutOfRange)) << offset << " " << r.message();
  }
  EXPECT_EQ(Matched(Mid(), tokens), 0u);
  EXPECT_EQ(Allocated(), 0u);
}

TEST_F(ShmSessionTest, UnknownAndForeignRegionsAreNotFound) {
  WorkerRegion region(1 << 20);
  const uint64_t id = Attach(*session_, region, 1 << 20);
  const std::vector<Token> tokens = Seq({1});
  WriteKv(region, 0, tokens);
  std::unique_ptr<ShmSession> other = NewSession();
  v1::ShmResponse r = AppendFrom(*other, tokens, id, 0, kBlock);
  EXPECT_EQ(r.code(), static_cast<int>(kNotFound));
  EXPECT_THAT(r.message(), HasSubstr("not attached on this connection"));
  EXPECT_EQ(FetchInto(*other, tokens, id, 0, kBlock).code(), static_cast<int>(kNotFound));
  EXPECT_EQ(AppendFrom(*session_, tokens, id + 1, 0, kBlock).code(), static_cast<int>(kNotFound));
  EXPECT_EQ(Matched(Mid(), tokens), 0u);
  // The owner still can.
  EXPECT_EQ(AppendFrom(*session_, tokens, id, 0, kBlock).code(), 0);
}

TEST_F(ShmSessionTest, WrongLengthOrChecksumStoresNothing) {
  WorkerRegion region(1 << 20);
  const uint64_t id = Attach(*session_, region, 1 << 20);
  const std::vector<Token> tokens = Seq({1, 2, 3});
  WriteKv(region, 0, tokens);
  v1::ShmResponse r = AppendFrom(*session_, tokens, id, 0, 3 * kBlock + 1);
  EXPECT_EQ(r.code(), static_cast<int>(kInvalidArgument)) << r.message();
  r = AppendFrom(*session_, tokens, id, 0, 2 * kBlock);
  EXPECT_EQ(r.code(), static_cast<int>(kInvalidArgument)) << r.message();
  region.data()[kBlock + 5] ^= std::byte{1};  // block 1 no longer matches its checksum
  r = AppendFrom(*session_, tokens, id, 0, 3 * kBlock);
  EXPECT_EQ(r.code(), static_cast<int>(kDataLoss)) << r.message();
  EXPECT_EQ(Matched(Mid(), tokens), 0u);
  EXPECT_EQ(Allocated(), 0u);
}

TEST_F(ShmSessionTest, AttachChecksTheDescriptor) {
  v1::ShmRequest attach;
  attach.mutable_attach_region()->set_bytes(4096);
  // No descriptor, two descriptors.
  EXPECT_EQ(Answer(*session_, attach, {}).code(), static_cast<int>(kInvalidArgument));
  WorkerRegion a(4096), b(4096);
  std::vector<UniqueFd> two = a.Passed();
  two.emplace_back(::dup(b.fd()));
  EXPECT_EQ(Answer(*session_, attach, std::move(two)).code(), static_cast<int>(kInvalidArgument));
  // Not sealed against shrinking.
  WorkerRegion unsealed(4096, /*seal=*/false);
  v1::ShmResponse r = Answer(*session_, attach, unsealed.Passed());
  EXPECT_EQ(r.code(), static_cast<int>(kFailedPrecondition));
  EXPECT_THAT(r.message(), HasSubstr("F_SEAL_SHRINK"));
  // Not a regular file.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  std::vector<UniqueFd> pipe;
  pipe.emplace_back(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);
  EXPECT_EQ(Answer(*session_, attach, std::move(pipe)).code(),
            static_cast<int>(kFailedPrecondition));
  // Larger than the file, zero, larger than max_region_bytes.
  attach.mutable_attach_region()->set_bytes(8192);
  EXPECT_EQ(Answer(*session_, attach, a.Passed()).code(), static_cast<int>(kInvalidArgument));
  attach.mutable_attach_region()->set_bytes(0);
  EXPECT_EQ(Answer(*session_, attach, a.Passed()).code(), static_cast<int>(kInvalidArgument));
  attach.mutable_attach_region()->set_bytes(uint64_t{1} << 25);
  EXPECT_EQ(Answer(*session_, attach, a.Passed()).code(), static_cast<int>(kInvalidArgument));
  EXPECT_EQ(session_->regions(), 0u);
}

TEST_F(ShmSessionTest, DescriptorsOnOtherRequestsAreRefused) {
  WorkerRegion region(4096);
  v1::ShmRequest hello;
  hello.mutable_hello()->set_version(v1::SHM_VERSION_1);
  v1::ShmResponse r = Answer(*session_, hello, region.Passed());
  EXPECT_EQ(r.code(), static_cast<int>(kInvalidArgument));
  EXPECT_EQ(Answer(*session_, hello, {}).hello().version(), v1::SHM_VERSION_1);
  EXPECT_EQ(Answer(*session_, v1::ShmRequest(), {}).code(), static_cast<int>(kInvalidArgument));
}

TEST_F(ShmSessionTest, RegionLimitDetachAndEndOfSessionUnmap) {
  const int before = MappingsOfTestRegions();
  WorkerRegion r1(4096), r2(4096), r3(4096), r4(4096), r5(4096);
  const int worker_mappings = MappingsOfTestRegions() - before;  // our own five
  std::vector<uint64_t> ids;
  for (WorkerRegion* r : {&r1, &r2, &r3, &r4}) ids.push_back(Attach(*session_, *r, 4096));
  EXPECT_EQ(MappingsOfTestRegions() - before - worker_mappings, 4);
  v1::ShmRequest attach;
  attach.mutable_attach_region()->set_bytes(4096);
  EXPECT_EQ(Answer(*session_, attach, r5.Passed()).code(), static_cast<int>(kResourceExhausted));

  v1::ShmRequest detach;
  detach.mutable_detach_region()->set_region_id(ids[0]);
  EXPECT_EQ(Answer(*session_, detach, {}).code(), 0);
  EXPECT_EQ(Answer(*session_, detach, {}).code(), static_cast<int>(kNotFound));
  EXPECT_EQ(MappingsOfTestRegions() - before - worker_mappings, 3);
  EXPECT_EQ(FetchInto(*session_, Seq({1}), ids[0], 0, 4096).code(), static_cast<int>(kNotFound));

  session_.reset();  // the connection closed
  EXPECT_EQ(MappingsOfTestRegions() - before - worker_mappings, 0);
}

TEST_F(ShmSessionTest, BatchLookupAnswersEachLookup) {
  WorkerRegion region(1 << 20);
  const uint64_t id = Attach(*session_, region, 1 << 20);
  const std::vector<Token> tokens = Seq({1, 2});
  WriteKv(region, 0, tokens);
  ASSERT_EQ(AppendFrom(*session_, tokens, id, 0, 2 * kBlock).code(), 0);
  v1::ShmRequest request;
  v1::LookupRequest* hit = request.mutable_batch_lookup()->add_lookups();
  hit->set_model_id(Mid().key.model_id);
  hit->mutable_tokens()->Add(tokens.begin(), tokens.end());
  v1::LookupRequest* unknown = request.mutable_batch_lookup()->add_lookups();
  unknown->set_model_id("nope");
  v1::ShmResponse r = Answer(*session_, request, {});
  ASSERT_EQ(r.code(), 0) << r.message();
  ASSERT_EQ(r.batch_lookup().outcomes_size(), 2);
  EXPECT_EQ(r.batch_lookup().outcomes(0).code(), 0);
  EXPECT_EQ(r.batch_lookup().outcomes(0).response().matched_tokens(), 2 * kBt);
  EXPECT_EQ(r.batch_lookup().outcomes(1).code(), static_cast<int>(kNotFound));
}

// The daemon-wide and per-owner caps on mapped regions: one worker's uid
// cannot take what another's attaches need, and detaching gives it back.
TEST_F(ShmSessionTest, MappingCapsAreSharedByConnectionsAndChargedPerOwner) {
  MappingBudget budget({.max_mappings = 3,
                        .max_bytes = uint64_t{1} << 40,
                        .max_owner_mappings = 2,
                        .max_owner_bytes = 3 << 20});
  const ShmLimits limits{.max_regions = 64, .max_region_bytes = 1 << 24};
  ShmSession a1(limits, cache_.get(), &copier_, &observer_, {.uid = 1001}, &budget);
  ShmSession a2(limits, cache_.get(), &copier_, &observer_, {.uid = 1001}, &budget);
  ShmSession b(limits, cache_.get(), &copier_, &observer_, {.uid = 1002}, &budget);
  WorkerRegion region(2 << 20);
  auto attach = [&](ShmSession& session, uint64_t bytes) {
    v1::ShmRequest request;
    request.mutable_attach_region()->set_bytes(bytes);
    return Answer(session, request, region.Passed());
  };
  // uid 1001: 2 MiB on one connection, then 2 MiB more on another passes its 3 MiB.
  v1::ShmResponse r = attach(a1, 2 << 20);
  ASSERT_EQ(r.code(), 0) << r.message();
  const uint64_t first = r.attach_region().region_id();
  r = attach(a2, 2 << 20);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(r.message(), ::testing::HasSubstr("shm.max_tenant_mapped_bytes"));
  r = attach(a2, 1 << 20);
  ASSERT_EQ(r.code(), 0) << r.message();
  // Its third mapping passes its count; uid 1002 is not charged for it.
  r = attach(a1, 4096);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(r.message(), ::testing::HasSubstr("shm.max_tenant_mappings"));
  EXPECT_EQ(budget.owner_mappings("uid 1001"), 2u);
  EXPECT_EQ(budget.owner_mapped_bytes("uid 1001"), 3u << 20);
  r = attach(b, 4096);
  ASSERT_EQ(r.code(), 0) << r.message();
  // The daemon-wide count is reached.
  r = attach(b, 4096);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(r.message(), ::testing::HasSubstr("shm.max_mappings"));
  EXPECT_EQ(budget.mappings(), 3u);
  EXPECT_EQ(budget.mapped_bytes(), (3u << 20) + 4096);
  // Detaching gives the share back at once.
  v1::ShmRequest detach;
  detach.mutable_detach_region()->set_region_id(first);
  ASSERT_EQ(Answer(a1, detach, {}).code(), 0);
  EXPECT_EQ(budget.owner_mapped_bytes("uid 1001"), 1u << 20);
  r = attach(b, 4096);
  EXPECT_EQ(r.code(), 0) << r.message();
}

// A session that ends gives back every share it held.
TEST_F(ShmSessionTest, AClosedSessionGivesItsMappingsBack) {
  MappingBudget budget({.max_mappings = 8,
                        .max_bytes = uint64_t{1} << 40,
                        .max_owner_mappings = 8,
                        .max_owner_bytes = uint64_t{1} << 40});
  WorkerRegion region(1 << 20);
  {
    ShmSession session(ShmLimits{.max_regions = 8, .max_region_bytes = 1 << 24}, cache_.get(),
                       &copier_, &observer_, {.uid = 7}, &budget);
    Attach(session, region, 1 << 20);
    Attach(session, region, 4096);
    EXPECT_EQ(budget.mappings(), 2u);
  }
  EXPECT_EQ(budget.mappings(), 0u);
  EXPECT_EQ(budget.mapped_bytes(), 0u);
}

// With authentication on, mappings are charged to the principal's tenant:
// two uids of one tenant share its cap, another tenant has its own.
TEST_F(ShmSessionTest, WithAuthenticationMappingsAreChargedToTheTenant) {
  const std::string path = ::testing::TempDir() + "/shm_session_principals.json";
  std::ofstream(path) << R"({"principals": [
    {"name": "a1", "tenant": "acme", "role": "worker", "unix_uid": 4242},
    {"name": "a2", "tenant": "acme", "role": "worker", "unix_uid": 4243},
    {"name": "g", "tenant": "globex", "role": "worker", "unix_uid": 5000}]})";
  auto access = AccessControl::Create({.principals_file = path});
  ASSERT_TRUE(access.ok()) << access.status();
  MappingBudget budget({.max_mappings = 8,
                        .max_bytes = uint64_t{1} << 40,
                        .max_owner_mappings = 1,
                        .max_owner_bytes = uint64_t{1} << 40});
  const ShmLimits limits{.max_regions = 8, .max_region_bytes = 1 << 24};
  auto session = [&](uid_t uid) {
    return std::make_unique<ShmSession>(limits, cache_.get(), &copier_, &observer_,
                                        ShmPeer{.uid = uid, .access = access->get()}, &budget);
  };
  auto a1 = session(4242), a2 = session(4243), g = session(5000);
  WorkerRegion region(1 << 20);
  v1::ShmRequest attach;
  attach.mutable_attach_region()->set_bytes(4096);
  v1::ShmResponse r = Answer(*a1, attach, region.Passed());
  ASSERT_EQ(r.code(), 0) << r.message();
  r = Answer(*a2, attach, region.Passed());
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(r.message(), ::testing::HasSubstr("tenant acme"));
  r = Answer(*g, attach, region.Passed());
  EXPECT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(budget.owner_mappings("tenant acme"), 1u);
  EXPECT_EQ(budget.owner_mappings("tenant globex"), 1u);
}

TEST_F(ShmSessionTest, FetchIntoAndAppendFromHoldOneOfTheTenantsStreamSlots) {
  const std::string path =
      ::testing::TempDir() + "shm-session-principals-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"principals": [{"name": "w", "tenant": "default", "role": "worker",
                             "unix_uid": )"
                      << ::getuid() << "}]}";
  auto access = AccessControl::Create({.principals_file = path, .max_concurrent_streams = 1});
  ASSERT_TRUE(access.ok()) << access.status();
  ShmSession session(ShmLimits{.max_regions = 4, .max_region_bytes = 1 << 24}, cache_.get(),
                     &copier_, &observer_,
                     {.peer = "test", .uid = ::getuid(), .access = access->get()});
  WorkerRegion region(1 << 20);
  const uint64_t id = Attach(session, region, 1 << 20);
  const std::vector<Token> tokens = Seq({1, 2});
  WriteKv(region, 0, tokens);
  absl::StatusOr<Caller> worker = (*access)->Admit({.unix_uid = ::getuid()}, "Fetch");
  ASSERT_TRUE(worker.ok()) << worker.status();
  {
    // Another stream of the tenant (a gRPC Fetch, say) holds its one slot.
    absl::StatusOr<TenantStreamSlot> held = (*access)->OpenStream(*worker);
    ASSERT_TRUE(held.ok()) << held.status();
    for (const v1::ShmResponse& refused : {AppendFrom(session, tokens, id, 0, 2 * kBlock),
                                           FetchInto(session, tokens, id, 65536, 2 * kBlock)}) {
      EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
      EXPECT_NE(refused.message().find("security.tenant_limits.max_concurrent_streams"),
                std::string::npos)
          << refused.message();
    }
    EXPECT_EQ(Matched(Mid(), tokens), 0u);  // the refused append stored nothing
  }
  // With the slot given back each runs, and gives its own back when done.
  v1::ShmResponse appended = AppendFrom(session, tokens, id, 0, 2 * kBlock);
  ASSERT_EQ(appended.code(), 0) << appended.message();
  for (int i = 0; i < 2; ++i) {
    v1::ShmResponse fetched = FetchInto(session, tokens, id, 65536, 2 * kBlock);
    ASSERT_EQ(fetched.code(), 0) << fetched.message();
    EXPECT_EQ(fetched.fetch_into().matched_tokens(), 2 * kBt);
  }
  EXPECT_TRUE((*access)->OpenStream(*worker).ok());
  std::filesystem::remove(path);
}

TEST_F(ShmSessionTest, ATenantPastItsShareOfConnectionsIsRefusedAtItsFirstRequest) {
  const std::string path =
      ::testing::TempDir() + "shm-connection-principals-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"principals": [{"name": "w", "tenant": "default", "role": "worker",
                             "unix_uid": )"
                      << ::getuid() << "}]}";
  // shm.max_connections 2 x max_share 0.5: one connection per tenant.
  auto access = AccessControl::Create(
      {.principals_file = path, .max_share = 0.5, .daemon_max_shm_connections = 2});
  ASSERT_TRUE(access.ok()) << access.status();
  auto session = [&]() {
    return std::make_unique<ShmSession>(
        ShmLimits{.max_regions = 4, .max_region_bytes = 1 << 24}, cache_.get(), &copier_,
        &observer_, ShmPeer{.peer = "test", .uid = ::getuid(), .access = access->get()});
  };
  v1::ShmRequest hello;
  hello.mutable_hello();
  auto first = session();
  ASSERT_EQ(Answer(*first, hello, {}).code(), 0);
  ASSERT_EQ(Answer(*first, hello, {}).code(), 0);  // its slot is taken once
  EXPECT_FALSE(first->refused());
  auto second = session();
  v1::ShmResponse refused = Answer(*second, hello, {});
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused.message(),
              HasSubstr("tenant \"default\" has 1 shared-memory connections, its share 1 "
                        "(shm.max_connections 2 x security.tenant_limits.max_share 0.5)"));
  EXPECT_TRUE(second->refused());
  second.reset();
  first.reset();  // its slot goes back with it
  auto third = session();
  EXPECT_EQ(Answer(*third, hello, {}).code(), 0);
  EXPECT_FALSE(third->refused());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvcache
