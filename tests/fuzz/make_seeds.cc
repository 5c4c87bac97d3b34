// fuzz_make_seeds: writes the seed corpus of every fuzz target (small valid
// and near-valid inputs made with kvcached's own encoders) under the folder
// given, one subfolder per target: fuzz_make_seeds tests/fuzz/corpus.
// Deterministic; file names say what each seed is. libFuzzer's merges then
// add what it finds beside them.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "kvcache/v1/config.pb.h"
#include "kvcache/v1/kvcache.pb.h"
#include "server/checkpoint/checkpoint_reader.h"
#include "server/checkpoint/checkpoint_writer.h"
#include "server/checkpoint/manifest.h"
#include "server/checkpoint/records.h"
#include "server/config/config.h"
#include "server/importance/block_codec.h"
#include "server/tier/ssd_layout.h"
#include "tests/eval/safetensors.h"

namespace kvcache {
namespace {

std::filesystem::path root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::filesystem::path dir = root / target;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

std::string Str(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

void AppendSeeds() {
  v1::AppendRequest header;
  v1::AppendHeader* h = header.mutable_header();
  h->set_namespace_("tenant");
  h->set_model_id("model");
  for (uint32_t t = 0; t < 32; ++t) h->add_tokens(1000 + t);
  h->set_start_token(16);
  h->add_block_checksums(0x1234567890abcdefULL);
  v1::AppendRequest chunk;
  chunk.set_kv_chunk(std::string(96, '\x5a'));
  const std::string hb = header.SerializeAsString();
  const std::string cb = chunk.SerializeAsString();
  // Byte 0: slices - 1; then the cuts; then the consumer's limit (255: none).
  Write("append_decoder", "header_one_slice", std::string("\x00\xff", 2) + hb);
  Write("append_decoder", "chunk_three_slices", std::string("\x02\x40\xa0\xff", 4) + cb);
  Write("append_decoder", "header_and_chunk_five_slices",
        std::string("\x04\x10\x30\x80\xc0\xff", 6) + hb + cb);
  Write("append_decoder", "chunk_refused_by_consumer", std::string("\x01\x80\x02", 3) + cb);
  Write("append_decoder", "truncated_chunk", std::string("\x01\x80\xff", 3) + cb.substr(0, 40));
  Write("append_decoder", "unknown_fields",
        std::string("\x00\xff", 2) +
            std::string("\x18\x05\x21"
                        "12345678"
                        "\x2d"
                        "abcd",
                        15) +
            cb);
}

std::vector<std::byte> RawBlock(const importance::BlockShape& shape, uint32_t seed) {
  std::vector<std::byte> raw(shape.raw_bytes());
  std::mt19937 rng(seed);
  const uint32_t element = shape.dtype == 3 ? 4 : 2;
  for (size_t i = 0; i < raw.size(); i += element) {
    if (element == 4) {
      const float v = std::uniform_real_distribution<float>(-4, 4)(rng);
      std::memcpy(&raw[i], &v, 4);
    } else {
      // fp16 / bf16 values of moderate magnitude: sign, exponent 13..16.
      const uint16_t v = static_cast<uint16_t>(
          shape.dtype == 1 ? ((rng() & 0x8000) | ((13 + rng() % 4) << 10) | (rng() & 0x3ff))
                           : ((rng() & 0x8000) | ((125 + rng() % 4) << 7) | (rng() & 0x7f)));
      std::memcpy(&raw[i], &v, 2);
    }
  }
  return raw;
}

void BlockCodecSeeds() {
  using importance::TokenPrecision;
  for (uint32_t dtype : {1u, 2u, 3u}) {
    const importance::BlockShape shape{
        .num_layers = 2, .num_kv_heads = 2, .head_dim = 4, .block_tokens = 5, .dtype = dtype};
    const std::vector<std::byte> raw = RawBlock(shape, dtype);
    std::vector<TokenPrecision> p1 = {TokenPrecision::kFull, TokenPrecision::kInt8,
                                      TokenPrecision::kPruned, TokenPrecision::kInt8,
                                      TokenPrecision::kFull};
    std::vector<std::byte> v1(*importance::CompressedSize(shape, p1));
    if (!importance::EncodeBlock(shape, raw, p1, v1).ok()) std::exit(1);
    std::vector<TokenPrecision> p2(shape.entries());
    for (size_t i = 0; i < p2.size(); ++i) p2[i] = static_cast<TokenPrecision>(i % 4);
    std::vector<std::byte> v2(*importance::CompressedSizeV2(shape, p2));
    if (!importance::EncodeBlockV2(shape, raw, p2, v2).ok()) std::exit(1);
    const std::string d = std::to_string(dtype);
    // Byte 0: flags (1: the fuzzer sets payload_bytes to the size).
    Write("block_codec", "v1_dtype" + d, "\x00" + Str(v1));
    Write("block_codec", "v2_dtype" + d, std::string(1, '\0') + Str(v2));
    Write("block_codec", "v1_dtype" + d + "_truncated_size_fixed",
          "\x01" + Str(std::span(v1).first(v1.size() - 4)));
    Write("block_codec", "v2_dtype" + d + "_extended_size_fixed", "\x01" + Str(v2) + "abcd");
  }
  // All pruned but one token, and all full.
  const importance::BlockShape shape{
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_tokens = 4, .dtype = 1};
  const std::vector<std::byte> raw = RawBlock(shape, 9);
  for (auto [name, p] : {std::pair{"v1_mostly_pruned", TokenPrecision::kPruned},
                         std::pair{"v1_all_full", TokenPrecision::kFull}}) {
    std::vector<TokenPrecision> prec(4, p);
    prec[0] = TokenPrecision::kFull;
    std::vector<std::byte> out(*importance::CompressedSize(shape, prec));
    if (!importance::EncodeBlock(shape, raw, prec, out).ok()) std::exit(1);
    Write("block_codec", name, std::string(1, '\0') + Str(out));
  }
}

void ConfigSeeds() {
  Write("config", "default", ConfigToJson(DefaultConfig()));
  Write("config", "empty_object", "{}");
  Write("config", "some_fields",
        R"({"listen": {"tcp_address": "127.0.0.1:50051"}, "cache": {"eviction_policy": "lru"}})");
  Write("config", "unknown_field", R"({"no_such_field": 1})");
  Write("config", "wrong_type", R"({"listen": {"tcp_address": 5}})");
  Write("config", "truncated", ConfigToJson(DefaultConfig()).substr(0, 200));
}

void CalibrationSeeds() {
  v1::CalibratedWeights w;
  auto* m = w.add_models();
  m->set_namespace_("tenant");
  m->set_model_id("model");
  m->set_alpha(0.5f);
  m->set_beta(0.25f);
  m->set_gamma(0.25f);
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  if (!google::protobuf::util::MessageToJsonString(w, &json, options).ok()) std::exit(1);
  Write("calibration", "one_model", json);
  Write("calibration", "empty", "{}");
  Write("calibration", "weight_out_of_range",
        R"({"models": [{"namespace": "a", "model_id": "b", "alpha": 1.5}]})");
  Write("calibration", "weight_nan", R"({"models": [{"model_id": "b", "beta": "NaN"}]})");
  Write("calibration", "truncated", json.substr(0, json.size() / 2));
}

void SafetensorsSeeds() {
  eval::KvDataset d;
  d.shape = {.layers = 2, .q_heads = 2, .kv_heads = 1, .head_dim = 4, .tokens = 3};
  std::mt19937 rng(3);
  auto fill = [&](int heads) {
    std::vector<float> v(static_cast<size_t>(heads * d.shape.tokens * d.shape.head_dim));
    for (float& x : v) x = std::uniform_real_distribution<float>(-2, 2)(rng);
    return v;
  };
  for (int l = 0; l < d.shape.layers; ++l) {
    d.q.push_back(fill(2));
    d.k.push_back(fill(1));
    d.v.push_back(fill(1));
  }
  for (auto [name, dtype] : {std::pair{"kv_dump_f32", kernels::DType::kFloat32},
                             std::pair{"kv_dump_f16", kernels::DType::kFloat16},
                             std::pair{"kv_dump_bf16", kernels::DType::kBFloat16}}) {
    absl::StatusOr<std::string> dump = eval::EncodeKvDump(d, dtype);
    if (!dump.ok()) std::exit(1);
    Write("safetensors", name, *dump);
    if (dtype == kernels::DType::kFloat16) {
      Write("safetensors", "kv_dump_f16_truncated", dump->substr(0, dump->size() - 10));
    }
  }
  Write("safetensors", "header_only",
        eval::FrameSafetensors(R"({"__metadata__": {"format": "x"}, "t": {"dtype": "F32",)"
                               R"( "shape": [2], "data_offsets": [0, 8]}})",
                               std::string(8, '\0')));
  Write("safetensors", "offsets_past_end",
        eval::FrameSafetensors(R"({"t": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}})",
                               std::string(4, '\0')));
}

void CheckpointSeeds() {
  using namespace checkpoint;
  // A real checkpoint: the writer's files, then the fuzzer's view of them.
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kvcached-fuzz-seeds." + std::to_string(getpid())))
          .string();
  FileSystem* fs = DefaultFileSystem();
  WriterOptions options;
  options.now_unix_ms = [] { return int64_t{1'700'000'000'000}; };  // the same seeds every time
  auto writer = CheckpointWriter::Create(fs, dir, 7, options);
  if (!writer.ok()) std::exit(1);
  std::vector<std::byte> small(40, std::byte{0x11});
  std::vector<std::byte> compressible(3000, std::byte{0x22});
  std::vector<std::byte> empty;
  if (!(*writer)->Append(1, small, false).ok() || !(*writer)->Append(2, compressible, true).ok() ||
      !(*writer)->Append(3, empty, false).ok()) {
    std::exit(1);
  }
  if (!(*writer)->Commit({{"records", 3}}, {}).ok()) std::exit(1);
  std::ifstream data_in(JoinPath(dir, DataFileName(7)), std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(data_in)),
                         std::istreambuf_iterator<char>());
  std::ifstream manifest_in(JoinPath(dir, ManifestFileName(7)), std::ios::binary);
  const std::string manifest((std::istreambuf_iterator<char>(manifest_in)),
                             std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  const std::string frames = data.substr(kDataHeaderBytes);
  // Mode 0: a manifest as is; 1: its body (the fuzzer appends the checksum).
  Write("checkpoint", "manifest", "\x00" + manifest);
  const size_t suffix = manifest.rfind(",\n  \"manifest_hmac\"");
  Write("checkpoint", "manifest_body", "\x01" + manifest.substr(0, suffix));
  Write("checkpoint", "manifest_body_older_version",
        "\x01" + manifest.substr(0, suffix).replace(manifest.find("\"format_version\": 2"), 19,
                                                    "\"format_version\": 1"));
  Write("checkpoint", "manifest_body_newer_version",
        "\x01" + manifest.substr(0, suffix).replace(manifest.find("\"format_version\": 2"), 19,
                                                    "\"format_version\": 9"));
  // Mode 2: headers and names.
  Write("checkpoint", "data_header", "\x02" + data.substr(0, kDataHeaderBytes));
  Write("checkpoint", "frame_header", "\x02" + frames.substr(0, kFrameHeaderBytes));
  Write("checkpoint", "file_name", "\x02" + DataFileName(123));
  Write("checkpoint", "hex", "\x02" + HexU64(0xfeedface));
  // Mode 3: the frames; flags 0 (as written), 3 (checksums and indices fixed up).
  Write("checkpoint", "frames", std::string("\x03\x00\x10", 3) + frames);
  Write("checkpoint", "frames_small_buffer", std::string("\x03\x03\x00", 3) + frames);
  Write("checkpoint", "frames_truncated",
        std::string("\x03\x03\x40", 3) + frames.substr(0, frames.size() - 30));

  // Records.
  ModelImage model;
  model.key = {"tenant", "model"};
  model.layout = {.num_layers = 2,
                  .num_kv_heads = 2,
                  .head_dim = 64,
                  .dtype = DType::kFp16,
                  .block_tokens = 16};
  Write("checkpoint_records", "model",
        std::string("\x00\x0f", 2) + EncodeModel(model, 3).SerializeAsString());
  BlockImage block;
  block.lookup_hash = 42;
  block.key = 43;
  block.depth = 1;
  block.tokens.assign(16, 7);
  block.seal = {.size = 8192, .checksum = 1, .raw_checksum = 2};
  block.history_age_ms = {1, 2, 3, 4};
  block.token_state.novelty.assign(16, 0.5f);
  block.token_state.num_int8 = 3;
  v1::CheckpointBlock b = EncodeBlock(block, StoredLocation{.offset = 4096, .footprint = 8192});
  b.set_has_host_copy(true);
  // Byte 1 + 1 = block_tokens: 16 fits the block, 32 does not.
  Write("checkpoint_records", "block", std::string("\x01\x0f", 2) + b.SerializeAsString());
  Write("checkpoint_records", "block_wrong_tokens",
        std::string("\x01\x1f", 2) + b.SerializeAsString());
}

// The HTTP query parser (http_query_fuzzer.cc): byte 0 even, a raw query;
// odd, NUL-separated names and values that the target encodes.
void HttpQuerySeeds() {
  using namespace std::string_literals;
  Write("http_query", "attention", "\x00ns=acme&model=llama-3&key=00000000deadbeef"s);
  Write("http_query", "attention_model_slash", "\x00model=acme%2Fllama%2F3&key=0x1234"s);
  Write("http_query", "escapes", "\x00"s + "a=%41%4g%&b=+x+&=v&&c&%zz=1&key=%");
  Write("http_query", "duplicates", "\x00k=1&k=2&K=3&k%3D=4"s);
  Write("http_query", "pairs", "\x01ns\x00"s + "a&b=c" + "\x00model\x00m+%\x00\x00empty name"s);
  Write("http_query", "pairs_every_byte", "\x03key\x00\xff\x00\x01\x00k\x00second"s);
}

// Input of the shm_frame target: byte 0 sets the frame limit (2^(low 4
// bits)); then pieces of [length][descriptor count][bytes], one sendmsg each.
std::string ShmPiece(const std::string& bytes, int fds) {
  return std::string(1, static_cast<char>(bytes.size())) + static_cast<char>(fds) + bytes;
}

std::string ShmFrame(const std::string& body, uint32_t claimed) {
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((claimed >> (8 * i)) & 0xff);
  return frame + body;
}

void ShmFrameSeeds() {
  const std::string body = "\x0a\x02\x08\x01";  // an ShmRequest with a hello
  const std::string frame = ShmFrame(body, static_cast<uint32_t>(body.size()));
  const std::string limit_1k(1, '\x0a');
  Write("shm_frame", "hello_one_piece", limit_1k + ShmPiece(frame, 0));
  Write("shm_frame", "frame_with_one_fd",
        limit_1k + ShmPiece(frame.substr(0, 1), 1) + ShmPiece(frame.substr(1), 0));
  std::string two = limit_1k;
  for (int i = 0; i < 2; ++i) two += ShmPiece(frame, i);
  Write("shm_frame", "two_frames", two);
  std::string trickle = limit_1k;
  for (char c : frame) trickle += ShmPiece(std::string(1, c), 2);  // 2 fds a byte: past the limit
  Write("shm_frame", "fds_on_every_byte", trickle);
  Write("shm_frame", "seven_fds_at_once", limit_1k + ShmPiece(frame, 7));
  Write("shm_frame", "longer_than_limit",
        std::string(1, '\x04') + ShmPiece(ShmFrame(std::string(20, 'x'), 20), 0));
  Write("shm_frame", "claims_4_gib", limit_1k + ShmPiece(ShmFrame("abc", 0xffffffffu), 1));
  Write("shm_frame", "broken_off", limit_1k + ShmPiece(ShmFrame("abc", 100), 3));
  Write("shm_frame", "empty_frame", limit_1k + ShmPiece(ShmFrame("", 0), 4));
}

// The restore target changes a folder of two checkpoints it writes itself
// (checkpoint_restore_fuzzer.cc): files in name order are 0 ckpt-1.data,
// 1 ckpt-1.manifest, 2 ckpt-2.data, 3 ckpt-2.manifest.
// The SSD extent header (ssd_extent_fuzzer.cc): byte 0 even, a header as read
// from the file; odd, six 8-byte fields to encode, then (offset, xor) damage.
void SsdExtentSeeds() {
  using ssd_internal::EncodeHeader;
  using ssd_internal::ExtentHeader;
  const ExtentHeader h{.key = 0x1122334455667788,
                       .payload_bytes = 8192,
                       .sequence = 7,
                       .epoch = 3,
                       .payload_checksum = 0xfeedfacecafebeef,
                       .footprint = 12288};
  std::string header(ssd_internal::kHeaderBytes, '\0');
  EncodeHeader(h, std::as_writable_bytes(std::span(header.data(), header.size())));
  Write("ssd_extent", "valid", std::string(1, '\0') + header);
  Write("ssd_extent", "valid_with_payload", std::string(1, '\0') + header + std::string(64, 'p'));
  Write("ssd_extent", "truncated", std::string(1, '\0') + header.substr(0, 40));
  std::string flipped = header;
  flipped[20] ^= 0x01;  // a payload_bytes bit
  Write("ssd_extent", "flipped_field", std::string(1, '\0') + flipped);
  std::string fields(48, '\0');
  for (size_t i = 0; i < fields.size(); ++i) fields[i] = static_cast<char>(i * 7 + 1);
  Write("ssd_extent", "encode_undamaged", "\x01" + fields);
  Write("ssd_extent", "encode_one_flip", "\x01" + fields + std::string("\x10\x80", 2));
  Write("ssd_extent", "encode_checksum_flip", "\x01" + fields + std::string("\x38\xff", 2));
  Write("ssd_extent", "encode_cut", "\x83" + fields);
}

void CheckpointRestoreSeeds() {
  auto edit = [](uint8_t file, uint16_t offset, uint8_t value) {
    return std::string{static_cast<char>(file), static_cast<char>(offset & 0xff),
                       static_cast<char>(offset >> 8), static_cast<char>(value)};
  };
  Write("checkpoint_restore", "intact", std::string(1, '\x00'));
  Write("checkpoint_restore", "intact_resealed", "\x80");
  Write("checkpoint_restore", "flip_manifest", std::string(1, '\0') + edit(3, 0x40, 0x01));
  Write("checkpoint_restore", "flip_data_header", std::string(1, '\0') + edit(2, 30, 0x10));
  Write("checkpoint_restore", "flip_record_resealed", "\x80" + edit(2, 0x90, 0x04));
  Write("checkpoint_restore", "flip_older_record_resealed", "\x80" + edit(0, 0x120, 0x40));
  Write("checkpoint_restore", "truncate_data", std::string(1, '\0') + edit(2, 0x100, 0));
  Write("checkpoint_restore", "truncate_older_resealed", "\x80" + edit(0, 0x200, 0));
  Write("checkpoint_restore", "summary_bad_types",
        "\x02" + std::string(R"({"lower_index": "x", "model_keys": [[1, 2]], "full": 3})"));
  Write("checkpoint_restore", "summary_lower_index",
        "\x02" + std::string(R"({"lower_index": [64, 99999], "model_keys": [["a", "b"]]})"));
  Write("checkpoint_restore", "summary_not_object", "\x02[1, 2]");
  Write("checkpoint_restore", "planted_manifest",
        std::string("\x01\x04", 2) + "{\"format_version\": 2}");
  Write("checkpoint_restore", "planted_data", std::string("\x01\x05", 2) + "KVCK");
  Write("checkpoint_restore", "replaced_manifest_resealed",
        std::string("\x81\x03", 2) + R"({"format_version": 9, "sequence": 2})");
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds CORPUS_FOLDER\n");
    return 2;
  }
  kvcache::root = argv[1];
  kvcache::AppendSeeds();
  kvcache::BlockCodecSeeds();
  kvcache::ConfigSeeds();
  kvcache::CalibrationSeeds();
  kvcache::SafetensorsSeeds();
  kvcache::CheckpointSeeds();
  kvcache::HttpQuerySeeds();
  kvcache::ShmFrameSeeds();
  kvcache::CheckpointRestoreSeeds();
  kvcache::SsdExtentSeeds();
  std::printf("seeds written under %s\n", argv[1]);
  return 0;
}
