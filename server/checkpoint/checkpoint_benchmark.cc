// checkpoint_benchmark: a full checkpoint of a live Cache and its restore,
// against dd on the same disk, and the fetch latency while it runs
// (issue 10; results in docs/benchmarks.md).
//
// Fills a Cache of --cache-mib host memory to ~85% with sequences of
// --seq-blocks blocks of one model (default layout 32 layers x 8 KV heads x
// 128 dim x fp16 x 16 tokens = 2 MiB a block, Llama-3-8B's). Block bytes are
// --data kvlike (fp16 drawn from N(0, 0.5): the exponent bits repeat, so zstd
// saves a little) or random (incompressible). Then, --runs times:
//   dd        dd if=/dev/zero of=DIR/dd.bin bs=4M oflag=direct, then read
//             back with iflag=direct, the size of the cached payload
//   ckpt-*    Checkpointer::Run (commit included: fdatasync, manifest,
//             directory fsync), then the data file dropped from the page
//             cache and Restorer::Prepare + Run into a fresh Cache, for each
//             compression mode: `default` (the daemon's: zstd level 1 while
//             a probe of the first 64 MiB of payloads saves at least 10%,
//             raw after), `zstd-1` (every payload) and `raw` (none)
//   latency   --readers threads each looping on what a fetch does in-process
//             (Lookup + PrepareFetch of a random cached sequence, memcpy of
//             its blocks into a buffer, then --reader-gap-us asleep) for
//             --idle-seconds alone, then while a checkpoint of each mode runs
//             (on a thread of lowered priority, as in the daemon)
// and prints the medians over the runs with their spread (min..max).
// MB = 10^6 bytes. "payload MB/s" counts block bytes before compression,
// "file MB/s" the bytes of the data file; the ratios to dd are of payload
// MB/s (dd's time to move the cache's bytes over the checkpoint's or the
// restore's). The readers pause --reader-gap-us (default 2 ms) between
// fetches so that on a small machine they leave the checkpoint a core; with
// 0 they and the checkpoint contend for the CPUs, which is what p99 then
// measures. The page cache is dropped with
// posix_fadvise(POSIX_FADV_DONTNEED) on the checkpoint's files (synced
// already), or with --drop-caches through /proc/sys/vm/drop_caches (root;
// every file on the machine); the share of the data file still resident
// before the restore is printed either way. Deletes its files at the end.
//
//   checkpoint_benchmark --dir /var/lib/kvcached/bench
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "server/checkpoint/checkpoint_service.h"
#include "server/checkpoint/checkpointer.h"
#include "server/checkpoint/file_system.h"
#include "server/checkpoint/restorer.h"
#include "server/common/clock.h"
#include "server/common/splitmix64.h"
#include "server/core/cache.h"
#include "server/core/eviction_policy.h"
#include "server/core/slab_pool.h"
#include "spdlog/spdlog.h"

namespace kvcache::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::string dir;
  uint64_t cache_mib = 1024;
  std::string data = "kvlike";
  uint32_t layers = 32;
  uint32_t kv_heads = 8;
  uint32_t head_dim = 128;
  uint32_t block_tokens = 16;
  uint32_t seq_blocks = 4;
  double fill = 0.85;
  uint32_t runs = 3;
  uint32_t readers = 2;
  uint32_t reader_gap_us = 2000;
  double idle_seconds = 3;
  bool drop_caches = false;
};

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

// What the benchmark writes under --dir, removed at the end and on error.
std::string bench_dir;

void CleanUp() {
  if (bench_dir.empty()) return;
  std::error_code ignored;
  for (const char* name : {"dd.bin", "ckpt-default", "ckpt-zstd-1", "ckpt-raw", "ckpt-busy"}) {
    std::filesystem::remove_all(bench_dir + "/" + name, ignored);
  }
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "checkpoint_benchmark: %s\n", what.c_str());
  CleanUp();
  std::exit(1);
}

// IEEE binary16 of `f` (mantissa truncated; no overflow at these magnitudes).
uint16_t ToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const int exponent = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffff;
  if (exponent >= 31) return sign | 0x7c00;
  if (exponent <= 0) {
    if (exponent < -10) return sign;
    mantissa |= 0x800000;
    return sign | static_cast<uint16_t>(mantissa >> (14 - exponent));
  }
  return sign | static_cast<uint16_t>(exponent << 10) | static_cast<uint16_t>(mantissa >> 13);
}

// Fills blocks with KV-like bytes: fp16 values of N(0, 0.5), picked through a
// table of 65536 samples by 16 random bits each (fast, and the same
// distribution), or with random bytes.
class KvGenerator {
 public:
  explicit KvGenerator(bool kvlike) : kvlike_(kvlike), table_(65536) {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (uint16_t& h : table_) h = ToHalf(normal(rng));
  }
  void Fill(std::span<std::byte> out, uint64_t seed) const {
    uint64_t state = seed * 0x2545f4914f6cdd1d + 1;
    for (size_t i = 0; i + 8 <= out.size(); i += 8) {
      uint64_t word = SplitMix64Next(state);
      if (kvlike_) {
        uint64_t halves = 0;
        for (int k = 0; k < 4; ++k)
          halves |= uint64_t{table_[(word >> (16 * k)) & 0xffff]} << (16 * k);
        word = halves;
      }
      std::memcpy(out.data() + i, &word, 8);
    }
  }

 private:
  const bool kvlike_;
  std::vector<uint16_t> table_;
};

const ModelKey kModel{"bench", "llm"};

std::unique_ptr<Cache> MakeCache(const Config& config) {
  auto pool = SlabPool::Create({.capacity_bytes = config.cache_mib << 20,
                                .slab_bytes = uint64_t{4} << 20,
                                .min_class_bytes = 64});
  if (!pool.ok()) Die(pool.status().ToString());
  return std::make_unique<Cache>(CacheOptions{}, *std::move(pool), NewLruPolicy(),
                                 SystemClock::Get());
}

std::vector<Token> SequenceTokens(const Config& config, uint32_t s) {
  std::vector<Token> tokens(size_t{config.seq_blocks} * config.block_tokens);
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = s * 100'000 + static_cast<Token>(t);
  return tokens;
}

// ---- page cache ----------------------------------------------------------

// Fraction of `path`'s pages in the page cache (mincore), -1 when unknown.
double Resident(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  struct stat st;
  double share = -1;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    void* map = mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      const long page = sysconf(_SC_PAGESIZE);
      std::vector<unsigned char> in((st.st_size + page - 1) / page);
      if (mincore(map, st.st_size, in.data()) == 0) {
        share = double(std::count_if(in.begin(), in.end(), [](unsigned char c) { return c & 1; })) /
                double(in.size());
      }
      munmap(map, st.st_size);
    }
  }
  close(fd);
  return share;
}

// Drops `dir`'s files from the page cache; returns how.
std::string DropPageCache(const std::string& dir, bool global) {
  if (global) {
    sync();
    std::ofstream drop("/proc/sys/vm/drop_caches");
    if (drop << "1" << std::flush) return "drop_caches";
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const int fd = open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  return "fadvise";
}

std::string DataFile(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".data") return entry.path().string();
  }
  return "";
}

// ---- dd --------------------------------------------------------------------

// Runs dd and returns MB/s from the bytes and seconds it prints.
double Dd(const std::string& args) {
  const std::string command = "LC_ALL=C dd " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) Die("cannot run " + command);
  char line[512];
  double mbps = -1;
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    unsigned long long bytes = 0;
    const char* copied = std::strstr(line, "copied, ");
    double seconds = 0;
    if (std::sscanf(line, "%llu bytes", &bytes) == 1 && copied != nullptr &&
        std::sscanf(copied, "copied, %lf s", &seconds) == 1 && seconds > 0) {
      mbps = double(bytes) / seconds / 1e6;
    }
  }
  if (pclose(pipe) != 0 || mbps < 0) Die("failed: " + command);
  return mbps;
}

// ---- readers -----------------------------------------------------------------

struct Latencies {
  std::vector<double> us;  // per operation
  uint64_t misses = 0;     // operations that did not find the whole sequence
};

class Readers {
 public:
  Readers(Cache* cache, const Config& config, uint32_t sequences, uint64_t seq_bytes)
      : cache_(cache), config_(config), sequences_(sequences), seq_bytes_(seq_bytes) {}

  void Start() {
    stop_ = false;
    record_ = false;
    results_.assign(config_.readers, {});
    for (uint32_t i = 0; i < config_.readers; ++i) threads_.emplace_back([this, i] { Loop(i); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // warm-up, not recorded
    record_ = true;
  }
  Latencies Stop() {
    record_ = false;
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    Latencies all;
    for (Latencies& r : results_) {
      all.us.insert(all.us.end(), r.us.begin(), r.us.end());
      all.misses += r.misses;
    }
    return all;
  }

 private:
  void Loop(uint32_t index) {
    std::vector<std::byte> buffer(seq_bytes_);
    std::mt19937 rng(index + 1);
    std::uniform_int_distribution<uint32_t> pick(0, sequences_ - 1);
    Latencies& out = results_[index];
    while (!stop_.load(std::memory_order_relaxed)) {
      const std::vector<Token> tokens = SequenceTokens(config_, pick(rng));
      const auto start = Clock::now();
      bool whole = false;
      auto found = cache_->Lookup(kModel, tokens);
      if (found.ok() && found->matched_tokens == tokens.size()) {
        auto plan = cache_->PrepareFetch(kModel, {.tokens = tokens});
        if (plan.ok() && plan->matched_tokens == tokens.size()) {
          size_t offset = 0;
          for (const PinnedBlock& block : plan->blocks) {
            std::span<const std::byte> bytes = block->data();
            std::memcpy(buffer.data() + offset, bytes.data(), bytes.size());
            offset += bytes.size();
          }
          whole = true;
        }
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (record_.load(std::memory_order_relaxed)) {
        out.us.push_back(us);
        if (!whole) ++out.misses;
      }
      if (config_.reader_gap_us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(config_.reader_gap_us));
      }
    }
  }

  Cache* const cache_;
  const Config& config_;
  const uint32_t sequences_;
  const uint64_t seq_bytes_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> record_{false};
  std::vector<Latencies> results_;
  std::vector<std::thread> threads_;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// ---- the measurements ------------------------------------------------------

struct CheckpointFigures {
  double seconds = 0;
  double payload_mbps = 0;
  double file_mbps = 0;
  double ratio = 0;  // data file bytes / payload bytes
  uint64_t data_bytes = 0;
};

// How a checkpoint compresses: the daemon's default (zstd level 1 while a
// probe of the first 64 MiB saves at least 10%, raw after), zstd level 1 for
// every payload, or none.
struct Mode {
  std::string name;
  int level;
  double min_saving;
};
const Mode kModes[] = {{"default", 1, 0.10}, {"zstd-1", 1, 0.0}, {"raw", 0, 0.0}};

CheckpointFigures Checkpoint(Cache* cache, const std::string& dir, const Mode& mode) {
  std::filesystem::remove_all(dir);
  Checkpointer checkpointer(cache, DefaultFileSystem(),
                            {.dir = dir,
                             .keep = 1,
                             .full_every = 1,
                             .zstd_level = mode.level,
                             .min_compression_saving = mode.min_saving},
                            1);
  const auto start = Clock::now();
  absl::StatusOr<CheckpointRun> run = checkpointer.Run();
  const double seconds = Seconds(start);
  if (!run.ok()) Die("checkpoint: " + run.status().ToString());
  if (run->gone_blocks != 0) Die("blocks were evicted during the checkpoint");
  return {.seconds = seconds,
          .payload_mbps = double(run->payload_bytes) / seconds / 1e6,
          .file_mbps = double(run->data_bytes) / seconds / 1e6,
          .ratio = double(run->data_bytes) / double(run->payload_bytes),
          .data_bytes = run->data_bytes};
}

struct RestoreFigures {
  double seconds = 0;
  double payload_mbps = 0;
  double file_mbps = 0;
  double resident = 0;  // share of the data file in the page cache before
};

RestoreFigures Restore(const Config& config, const std::string& dir, uint64_t data_bytes,
                       uint64_t expected_blocks, std::string* drop_method) {
  *drop_method = DropPageCache(dir, config.drop_caches);
  RestoreFigures f;
  f.resident = Resident(DataFile(dir));
  std::unique_ptr<Cache> target = MakeCache(config);
  Restorer restorer(target.get(), DefaultFileSystem(), dir, CheckpointKey{});
  std::atomic<bool> stop{false};
  const auto start = Clock::now();
  if (absl::Status s = restorer.Prepare(); !s.ok()) Die("restore: " + s.ToString());
  restorer.Run(stop);
  f.seconds = Seconds(start);
  const RestoreProgress p = restorer.progress();
  if (p.state != RestoreState::kDone || p.restored_blocks != expected_blocks) {
    Die("restore put back " + std::to_string(p.restored_blocks) + " blocks of " +
        std::to_string(expected_blocks) + " (" + p.error + ")");
  }
  f.payload_mbps = double(p.restored_bytes) / f.seconds / 1e6;
  f.file_mbps = double(data_bytes) / f.seconds / 1e6;
  return f;
}

// One run's figures, by name, in print order.
using Figures = std::vector<std::pair<std::string, double>>;

Figures OneRun(const Config& config, uint32_t run, Cache* cache, uint32_t sequences,
               uint64_t payload_bytes, uint64_t blocks, std::string* drop_method) {
  Figures f;
  const std::string dd_file = config.dir + "/dd.bin";
  const uint64_t dd_count = (payload_bytes + (uint64_t{4} << 20) - 1) >> 22;
  const double dd_write = Dd("if=/dev/zero of=" + dd_file +
                             " bs=4M count=" + std::to_string(dd_count) + " oflag=direct");
  const double dd_read = Dd("if=" + dd_file + " of=/dev/null bs=4M iflag=direct");
  std::filesystem::remove(dd_file);
  f.emplace_back("dd write MB/s", dd_write);
  f.emplace_back("dd read MB/s", dd_read);

  // Each run starts with another mode, so that none always follows dd's
  // writes (the disk below may still be flushing them) or always goes last.
  std::vector<Mode> modes(std::begin(kModes), std::end(kModes));
  std::rotate(modes.begin(), modes.begin() + run % modes.size(), modes.end());
  std::map<std::string, Figures> by_mode;  // printed in kModes' order
  for (const Mode& mode : modes) {
    const std::string& name = mode.name;
    const std::string dir = config.dir + "/ckpt-" + name;
    const CheckpointFigures c = Checkpoint(cache, dir, mode);
    const RestoreFigures r = Restore(config, dir, c.data_bytes, blocks, drop_method);
    std::filesystem::remove_all(dir);
    Figures& m = by_mode[name];
    m.emplace_back(name + " checkpoint s", c.seconds);
    m.emplace_back(name + " checkpoint payload MB/s", c.payload_mbps);
    m.emplace_back(name + " checkpoint file MB/s", c.file_mbps);
    m.emplace_back(name + " file/payload", c.ratio);
    m.emplace_back(name + " checkpoint / dd write", c.payload_mbps / dd_write);
    m.emplace_back(name + " restore s", r.seconds);
    m.emplace_back(name + " restore payload MB/s", r.payload_mbps);
    m.emplace_back(name + " restore file MB/s", r.file_mbps);
    m.emplace_back(name + " restore / dd read", r.payload_mbps / dd_read);
    m.emplace_back(name + " resident before restore", r.resident);
  }
  for (const Mode& mode : kModes) {
    for (auto& figure : by_mode[mode.name]) f.push_back(std::move(figure));
  }

  const uint64_t seq_bytes = payload_bytes / sequences;
  Readers readers(cache, config, sequences, seq_bytes);
  readers.Start();
  std::this_thread::sleep_for(std::chrono::duration<double>(config.idle_seconds));
  const Latencies idle = readers.Stop();
  if (idle.misses > 0) Die("a reader missed a cached sequence");
  f.emplace_back("fetch ops idle", double(idle.us.size()));
  f.emplace_back("fetch p50 idle us", Percentile(idle.us, 0.50));
  f.emplace_back("fetch p99 idle us", Percentile(idle.us, 0.99));
  f.emplace_back("fetch p999 idle us", Percentile(idle.us, 0.999));
  const std::string dir = config.dir + "/ckpt-busy";
  for (const Mode& mode : kModes) {
    const std::string& name = mode.name;
    readers.Start();
    // As in the daemon, the checkpoint runs on a thread of lower priority.
    CheckpointFigures busy;
    std::thread checkpoint([&] {
      LowerCurrentThreadPriority();
      busy = Checkpoint(cache, dir, mode);
    });
    checkpoint.join();
    const Latencies during = readers.Stop();
    std::filesystem::remove_all(dir);
    if (during.misses > 0) Die("a reader missed a cached sequence");
    f.emplace_back("fetch ops during " + name, double(during.us.size()));
    f.emplace_back("fetch p50 during " + name + " us", Percentile(during.us, 0.50));
    f.emplace_back("fetch p99 during " + name + " us", Percentile(during.us, 0.99));
    f.emplace_back("fetch p999 during " + name + " us", Percentile(during.us, 0.999));
    f.emplace_back("fetch p99 during " + name + " / idle",
                   Percentile(during.us, 0.99) / Percentile(idle.us, 0.99));
    f.emplace_back(name + " checkpoint under reads payload MB/s", busy.payload_mbps);
  }
  return f;
}

int Run(const Config& config) {
  spdlog::set_level(spdlog::level::warn);
  std::printf("load average at start: %s (%u CPUs)\n", LoadAverage().c_str(),
              std::thread::hardware_concurrency());
  const ModelLayout layout{config.layers, config.kv_heads, config.head_dim, DType::kFp16,
                           config.block_tokens};
  if (absl::Status s = layout.Validate(); !s.ok()) Die(s.ToString());
  std::filesystem::create_directories(config.dir);
  bench_dir = config.dir;

  std::unique_ptr<Cache> cache = MakeCache(config);
  if (auto r = cache->RegisterModel(kModel, layout); !r.ok()) Die(r.status().ToString());
  const uint64_t seq_bytes = layout.BlockBytes() * config.seq_blocks;
  const auto sequences =
      static_cast<uint32_t>(double(config.cache_mib << 20) * config.fill / double(seq_bytes));
  if (sequences == 0) Die("--cache-mib holds no sequence");
  const KvGenerator generator(config.data == "kvlike");
  std::vector<std::byte> kv(seq_bytes);
  const auto fill_start = Clock::now();
  for (uint32_t s = 0; s < sequences; ++s) {
    generator.Fill(kv, s);
    auto session = cache->BeginAppend(kModel, SequenceTokens(config, s), 0, {}, {});
    if (!session.ok()) Die(session.status().ToString());
    if (absl::Status st = (*session)->Write(kv); !st.ok()) Die(st.ToString());
    if (auto r = (*session)->Commit(); !r.ok()) Die(r.status().ToString());
  }
  const CacheStats stats = cache->GetStats();
  if (stats.capacity_evictions != 0) Die("the fill evicted blocks: lower --fill");
  const uint64_t payload_bytes = stats.payload_bytes;
  std::printf(
      "cache %llu MiB, %s data, block %llu KiB (%u layers x %u KV heads x %u dim x fp16 x %u "
      "tokens), %u sequences of %u blocks: %llu blocks, %.0f MB (%.0f%% of the pool), filled "
      "in %.1f s\n",
      static_cast<unsigned long long>(config.cache_mib), config.data.c_str(),
      static_cast<unsigned long long>(layout.BlockBytes() >> 10), config.layers, config.kv_heads,
      config.head_dim, config.block_tokens, sequences, config.seq_blocks,
      static_cast<unsigned long long>(stats.blocks), double(payload_bytes) / 1e6,
      100.0 * double(stats.host_pool.allocated_bytes) / double(config.cache_mib << 20),
      Seconds(fill_start));
  std::printf("readers: %u, gap %u us; dir %s\n", config.readers, config.reader_gap_us,
              config.dir.c_str());

  std::vector<Figures> runs;
  std::string drop_method;
  for (uint32_t run = 0; run < config.runs; ++run) {
    runs.push_back(
        OneRun(config, run, cache.get(), sequences, payload_bytes, stats.blocks, &drop_method));
    std::printf("run %u:", run);
    for (const auto& [name, value] : runs.back()) {
      std::printf(" %s=%.3g;", name.c_str(), value);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("\npage cache dropped before each restore with: %s\n", drop_method.c_str());
  std::printf("%-44s %10s %10s %10s\n", "figure", "median", "min", "max");
  for (size_t i = 0; i < runs.front().size(); ++i) {
    std::vector<double> values;
    for (const Figures& f : runs) values.push_back(f[i].second);
    std::sort(values.begin(), values.end());
    const double median = values.size() % 2 == 1
                              ? values[values.size() / 2]
                              : (values[values.size() / 2 - 1] + values[values.size() / 2]) / 2;
    std::printf("%-44s %10.3g %10.3g %10.3g\n", runs.front()[i].first.c_str(), median,
                values.front(), values.back());
  }
  std::printf("load average at end: %s\n", LoadAverage().c_str());
  CleanUp();
  return 0;
}

}  // namespace
}  // namespace kvcache::checkpoint

int main(int argc, char** argv) {
  kvcache::checkpoint::Config config;
  CLI::App app{"checkpoint and restore of a live cache, against dd, and fetch latency meanwhile"};
  app.add_option("--dir", config.dir, "directory on the disk to measure (created)")->required();
  app.add_option("--cache-mib", config.cache_mib, "host memory of the cache")
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--data", config.data, "block bytes")->check(CLI::IsMember({"kvlike", "random"}));
  app.add_option("--layers", config.layers, "layout: layers");
  app.add_option("--kv-heads", config.kv_heads, "layout: KV heads");
  app.add_option("--head-dim", config.head_dim, "layout: head dimension");
  app.add_option("--block-tokens", config.block_tokens, "layout: tokens a block");
  app.add_option("--seq-blocks", config.seq_blocks, "blocks a sequence (one fetch)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--fill", config.fill, "share of the cache filled")->check(CLI::Range(0.01, 0.95));
  app.add_option("--runs", config.runs, "repetitions")->check(CLI::Range(1, 100));
  app.add_option("--readers", config.readers, "fetching threads")->check(CLI::Range(1, 256));
  app.add_option("--reader-gap-us", config.reader_gap_us, "sleep between a reader's fetches");
  app.add_option("--idle-seconds", config.idle_seconds, "latency measured without a checkpoint")
      ->check(CLI::Range(0.5, 600.0));
  app.add_flag("--drop-caches", config.drop_caches,
               "drop the whole page cache (/proc/sys/vm/drop_caches) before a restore");
  CLI11_PARSE(app, argc, argv);
  return kvcache::checkpoint::Run(config);
}
