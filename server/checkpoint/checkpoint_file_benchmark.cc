// checkpoint_file_benchmark: checkpoint write and read throughput.
//
// Writes --mib MiB of random (incompressible) records of --record_kib KiB as
// one checkpoint into --dir and commits it (end record, fdatasync, manifest,
// directory fsync), then reads it back with CheckpointReader::Next (every
// frame checksummed, the whole file hashed). Once with zstd level 1 asked for
// every record (zstd runs and gives up: the records are stored raw) and once
// with compression off. MB = 10^6 bytes of record payload per second;
// "append" is Create + Append of every record (buffered writes into the page
// cache), "write" adds Commit (end record, fdatasync, manifest). Reads
// right after the write mostly hit the page cache. Deletes each checkpoint
// after reading it unless --keep.
//
//   checkpoint_file_benchmark --dir /var/lib/kvcached/bench --mib 512
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "server/checkpoint/checkpoint_directory.h"
#include "server/checkpoint/checkpoint_format.h"
#include "server/checkpoint/checkpoint_reader.h"
#include "server/checkpoint/checkpoint_writer.h"

namespace kvcache::checkpoint {
namespace {

struct Config {
  std::string dir;
  uint64_t mib = 512;
  uint64_t record_kib = 256;
  uint32_t repeat = 1;
  bool keep = false;
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// 64 distinct random records, reused in turn (each record is compressed on
// its own, so reuse gives zstd nothing to match).
std::vector<std::vector<std::byte>> RandomRecords(size_t bytes) {
  std::vector<std::vector<std::byte>> records(64, std::vector<std::byte>(bytes));
  std::mt19937_64 rng(42);
  for (auto& r : records) {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(r.data() + i, &v, 8);
    }
  }
  return records;
}

int Run(const Config& config) {
  FileSystem* fs = DefaultFileSystem();
  CheckpointDirectory directory(fs, config.dir, CheckpointKey{});
  const auto records = RandomRecords(config.record_kib << 10);
  const uint64_t count = (config.mib << 20) / (config.record_kib << 10);
  const double payload_mb = double(count * (config.record_kib << 10)) / 1e6;
  std::printf("%llu records of %llu KiB (%.0f MB) per checkpoint in %s\n",
              static_cast<unsigned long long>(count),
              static_cast<unsigned long long>(config.record_kib), payload_mb, config.dir.c_str());
  std::printf("%-10s %8s %12s %12s %12s %12s\n", "mode", "run", "append MB/s", "commit ms",
              "write MB/s", "read MB/s");
  for (uint32_t run = 0; run < config.repeat; ++run) {
    for (const int level : {1, 0}) {
      absl::StatusOr<uint64_t> sequence = directory.NextSequence();
      if (!sequence.ok()) {
        std::fprintf(stderr, "%s\n", sequence.status().ToString().c_str());
        return 1;
      }
      WriterOptions options;
      options.zstd_level = level;
      const auto start = std::chrono::steady_clock::now();
      auto writer = CheckpointWriter::Create(fs, config.dir, *sequence, options);
      if (!writer.ok()) {
        std::fprintf(stderr, "%s\n", writer.status().ToString().c_str());
        return 1;
      }
      for (uint64_t i = 0; i < count; ++i) {
        auto location = (*writer)->Append(1, records[i % records.size()], /*compress=*/true);
        if (!location.ok()) {
          std::fprintf(stderr, "%s\n", location.status().ToString().c_str());
          return 1;
        }
      }
      const auto commit_start = std::chrono::steady_clock::now();
      auto info = (*writer)->Commit({{"records", count}}, {});
      const double commit_s = Seconds(commit_start);
      const double write_s = Seconds(start);
      if (!info.ok()) {
        std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
        return 1;
      }
      const auto read_start = std::chrono::steady_clock::now();
      auto reader = CheckpointReader::Open(fs, config.dir, *sequence);
      if (!reader.ok()) {
        std::fprintf(stderr, "%s\n", reader.status().ToString().c_str());
        return 1;
      }
      Record record;
      uint64_t read = 0;
      for (;;) {
        absl::StatusOr<bool> more = (*reader)->Next(&record);
        if (!more.ok()) {
          std::fprintf(stderr, "%s\n", more.status().ToString().c_str());
          return 1;
        }
        if (!*more) break;
        ++read;
      }
      const double read_s = Seconds(read_start);
      if (read != count) {
        std::fprintf(stderr, "read %llu records of %llu\n", static_cast<unsigned long long>(read),
                     static_cast<unsigned long long>(count));
        return 1;
      }
      const double append_mbps = payload_mb / (write_s - commit_s);
      std::printf("%-10s %8u %12.0f %12.1f %12.0f %12.0f\n", level == 0 ? "raw" : "zstd-1", run,
                  append_mbps, commit_s * 1e3, payload_mb / write_s, payload_mb / read_s);
      std::printf(
          "RESULT mode=%s run=%u append_MBps=%.0f commit_ms=%.1f write_MBps=%.0f read_MBps=%.0f\n",
          level == 0 ? "raw" : "zstd-1", run, append_mbps, commit_s * 1e3, payload_mb / write_s,
          payload_mb / read_s);
      if (!config.keep) {
        (void)fs->Delete(config.dir + "/" + ManifestFileName(*sequence));
        (void)fs->Delete(config.dir + "/" + DataFileName(*sequence));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvcache::checkpoint

int main(int argc, char** argv) {
  kvcache::checkpoint::Config config;
  CLI::App app{"checkpoint write/read throughput"};
  app.add_option("--dir", config.dir, "directory for the checkpoints (created)")->required();
  app.add_option("--mib", config.mib, "MiB of records per checkpoint");
  app.add_option("--record_kib", config.record_kib, "KiB per record")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--repeat", config.repeat, "runs of each mode");
  app.add_flag("--keep", config.keep, "keep the checkpoints");
  CLI11_PARSE(app, argc, argv);
  return kvcache::checkpoint::Run(config);
}
