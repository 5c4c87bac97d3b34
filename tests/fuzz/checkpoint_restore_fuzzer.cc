// Fuzz target: the whole restore of a checkpoint folder at start-up
// (server/checkpoint/restorer.h): listing, manifests, MACs, data headers,
// frames, references between checkpoints, records and the manifest summary,
// through Restorer::Prepare and Run into a fresh Cache, as the daemon does.
//
// The folder starts as two real checkpoints that a Checkpointer wrote from a
// small cache (a full one, then an incremental one that refers into the
// first), under the all-zero test key, held in memory. The input changes it:
//   byte 0  mode (bits 0..6, mod 3) and, in bit 7, "reseal": after the change, every
//           data file's header checksum and frame tags are set right and
//           every manifest that is still a JSON object gets the data file's
//           size and XXH3 and a correct MAC, so that the checks behind the
//           MACs are reached;
//   mode 0  edits: 4 bytes each, (file, offset low, offset high, value): XOR
//           the byte at offset (mod size) with value, or, for value 0,
//           truncate the file there;
//   mode 1  byte 1 picks a file (or, past the last, a new checkpoint 3's
//           manifest or data file); the rest of the input is its new content;
//   mode 2  the rest of the input, parsed as JSON (any value), replaces the
//           newest manifest's summary.
// Properties: Prepare() answers OK, or FAILED_PRECONDITION for a manifest
// that names a newer version; Run() ends in done, failed or off; nothing
// crashes or throws; what is restored is in the cache; the directory's List,
// Verify and Prune answer statuses.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "server/checkpoint/checkpoint_directory.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpointer.h"
#include "server/checkpoint/restorer.h"
#include "server/core/cache.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/memory_file_system.h"
#include "xxhash.h"

namespace kvcache::checkpoint {
namespace {

constexpr char kDir[] = "ckpt";
constexpr uint64_t kSlab = uint64_t{64} << 10;
constexpr uint32_t kBlockTokens = 16;

std::unique_ptr<Cache> NewCache(Clock* clock) {
  auto pool =
      SlabPool::Create({.capacity_bytes = 16 * kSlab, .slab_bytes = kSlab, .min_class_bytes = 64});
  if (!pool.ok()) std::abort();
  return std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruKPolicy({}, clock), clock);
}

void AppendSequence(Cache& cache, const ModelKey& model, uint32_t s, uint64_t block_bytes) {
  std::vector<Token> tokens;
  for (uint32_t b = 0; b < 3; ++b) {
    for (uint32_t t = 0; t < kBlockTokens; ++t) tokens.push_back((s / 2 + b * s) * 1024 + t);
  }
  auto session = cache.BeginAppend(model, tokens, 0, {}, {});
  if (!session.ok()) std::abort();
  std::vector<std::byte> kv(3 * block_bytes);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::byte(static_cast<uint8_t>(i * 31 + s));
  if (!(*session)->Write(kv).ok() || !(*session)->Commit().ok()) std::abort();
}

// The folder the inputs change: two checkpoints of a small cache, written
// once through the real file system and read into memory.
const std::map<std::string, std::string>& Folder() {
  static const std::map<std::string, std::string>* const folder = [] {
    ManualClock clock;
    std::unique_ptr<Cache> cache = NewCache(&clock);
    const ModelKey model{"tenant", "model"};
    const ModelLayout layout{1, 1, 16, DType::kFp16, kBlockTokens};
    if (!cache->RegisterModel(model, layout).ok()) std::abort();
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("kvcached-restore-fuzz." + std::to_string(::getpid())))
                                .string();
    std::filesystem::remove_all(dir);
    Checkpointer checkpointer(cache.get(), DefaultFileSystem(),
                              {.dir = dir, .keep = 3, .full_every = 8}, 1);
    for (uint32_t s = 0; s < 4; ++s) AppendSequence(*cache, model, s, layout.BlockBytes());
    if (!checkpointer.Run().ok()) std::abort();
    for (uint32_t s = 4; s < 6; ++s) AppendSequence(*cache, model, s, layout.BlockBytes());
    if (!checkpointer.Run().ok()) std::abort();
    auto* files = new std::map<std::string, std::string>();
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      (*files)[JoinPath(kDir, entry.path().filename().string())] =
          std::string(std::istreambuf_iterator<char>(in), {});
    }
    std::filesystem::remove_all(dir);
    return files;
  }();
  return *folder;
}

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Sets a data file's header checksum and every whole frame's tag right.
void ResealData(std::string& data) {
  if (data.size() < kDataHeaderBytes) return;
  std::byte* b = reinterpret_cast<std::byte*>(data.data());
  PutU64(b + 56, XXH3_64bits(b, 56));
  CheckpointId id;
  std::memcpy(id.data(), b + 24, id.size());
  const FrameMac mac(CheckpointKey{}, id, GetU64(b + 8));
  uint64_t offset = kDataHeaderBytes;
  while (data.size() - offset >= kFrameHeaderBytes) {
    std::byte* h = b + offset;
    const FrameHeader fields{.stored_bytes = GetU32(h),
                             .uncompressed_bytes = GetU32(h + 4),
                             .type = static_cast<uint8_t>(h[8]),
                             .flags = static_cast<uint8_t>(h[9]),
                             .index = GetU32(h + 12)};
    if (fields.stored_bytes > data.size() - offset - kFrameHeaderBytes) break;
    PutU64(h + 16, mac.Tag(fields, offset,
                           Bytes(data).subspan(offset + kFrameHeaderBytes, fields.stored_bytes)));
    offset += kFrameHeaderBytes + fields.stored_bytes;
  }
}

// A manifest's text for `j`, with its MAC under the test key
// (EncodeManifest's framing, whatever the fields hold).
std::string Seal(const nlohmann::json& j) {
  std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  text.resize(text.size() - 2);  // "\n}"
  return text + ",\n  \"manifest_hmac\": \"" + ManifestMacHex(CheckpointKey{}, text) + "\"\n}\n";
}

// A manifest's JSON without its MAC field (discarded when it does not parse).
nlohmann::json Unseal(const std::string& text) {
  const size_t suffix = text.rfind(",\n  \"manifest_hmac\"");
  const std::string body = suffix == std::string::npos ? text : text.substr(0, suffix) + "\n}";
  return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
}

// Gives a manifest that still parses as an object its data file's size and
// XXH3 and a MAC under the test key.
void ResealManifest(std::string& text, const std::string* data) {
  nlohmann::json j = Unseal(text);
  if (!j.is_object()) return;
  if (data != nullptr) {
    j["data_bytes"] = data->size();
    j["data_xxh3"] = HexU64(XXH3_64bits(data->data(), data->size()));
  }
  text = Seal(j);
}

void Reseal(MemoryFileSystem& fs) {
  for (auto& [path, bytes] : fs.files) {
    const std::optional<ParsedName> name = ParseFileName(path.substr(path.rfind('/') + 1));
    if (name && name->kind == ParsedName::Kind::kData) ResealData(bytes);
  }
  for (auto& [path, bytes] : fs.files) {
    const std::optional<ParsedName> name = ParseFileName(path.substr(path.rfind('/') + 1));
    if (!name || name->kind != ParsedName::Kind::kManifest) continue;
    auto data = fs.files.find(JoinPath(kDir, DataFileName(name->sequence)));
    ResealManifest(bytes, data == fs.files.end() ? nullptr : &data->second);
  }
}

void Change(MemoryFileSystem& fs, uint8_t mode, fuzz::InputReader& in) {
  std::vector<std::string> paths;
  for (const auto& [path, bytes] : fs.files) paths.push_back(path);
  if (paths.empty()) return;
  if (mode == 0) {
    while (in.rest_size() >= 4) {
      std::string& file = fs.files[paths[in.Byte() % paths.size()]];
      const uint32_t offset = in.Byte() | uint32_t{in.Byte()} << 8;
      const uint8_t value = in.Byte();
      if (value == 0) {
        file.resize(offset % (file.size() + 1));
      } else if (!file.empty()) {
        file[offset % file.size()] = static_cast<char>(file[offset % file.size()] ^ value);
      }
    }
  } else if (mode == 1) {
    const size_t pick = in.Byte() % (paths.size() + 2);
    const std::string path = pick < paths.size()    ? paths[pick]
                             : pick == paths.size() ? JoinPath(kDir, ManifestFileName(3))
                                                    : JoinPath(kDir, DataFileName(3));
    fs.files[path] = std::string(reinterpret_cast<const char*>(in.rest()), in.rest_size());
  } else {
    nlohmann::json summary = nlohmann::json::parse(in.rest(), in.rest() + in.rest_size(), nullptr,
                                                   /*allow_exceptions=*/false);
    if (summary.is_discarded()) return;
    std::string& text = fs.files[JoinPath(kDir, ManifestFileName(2))];
    nlohmann::json j = Unseal(text);
    if (!j.is_object()) return;
    j["summary"] = std::move(summary);
    text = Seal(j);
  }
}

void Restore(MemoryFileSystem& fs) {
  ManualClock clock;
  std::unique_ptr<Cache> cache = NewCache(&clock);
  Restorer restorer(cache.get(), &fs, kDir, CheckpointKey{});
  const absl::Status prepared = restorer.Prepare();
  FUZZ_CHECK(prepared.ok() || prepared.code() == absl::StatusCode::kFailedPrecondition);
  if (prepared.ok()) {
    std::atomic<bool> stop{false};
    restorer.Run(stop);
    const RestoreProgress p = restorer.progress();
    FUZZ_CHECK(p.state == RestoreState::kDone || p.state == RestoreState::kFailed ||
               p.state == RestoreState::kOff);
    FUZZ_CHECK(restorer.finished());
    FUZZ_CHECK(cache->GetStats().blocks >= p.restored_blocks);
  }
  CheckpointDirectory directory(&fs, kDir, CheckpointKey{});
  absl::StatusOr<std::vector<CheckpointInfo>> listed = directory.List();
  FUZZ_CHECK(listed.ok());
  for (const CheckpointInfo& info : *listed) {
    FUZZ_CHECK(directory.Verify(info.sequence).ok());
  }
  FUZZ_CHECK(directory.Prune(1).ok());
}

}  // namespace
}  // namespace kvcache::checkpoint

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvcache::checkpoint;
  kvcache::fuzz::InputReader in(data, size);
  const uint8_t first = in.Byte();
  MemoryFileSystem fs;
  fs.files = Folder();
  Change(fs, (first & 0x7f) % 3, in);
  if ((first & 0x80) != 0) Reseal(fs);
  Restore(fs);
  return 0;
}
