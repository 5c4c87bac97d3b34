// ssd_store_benchmark: SsdStore throughput, db_bench style.
//
// For each engine and thread count, opens a store on --path and runs, --repeat
// times: write N blocks into the empty store (write_seq: the allocator places
// them region-sequentially), read them in offset order (read_seq) and in a
// shuffled order (read_rand), then free a random half and write them again
// into the holes (write_rand). Threads take blocks from a shared counter.
// Prints one RESULT line per measurement (MB = 10^6 bytes, payload bytes per
// second, reads include checksum verification) and a table of medians.
//
//   ssd_store_benchmark --path /mnt/ssd/bench.bin --block_bytes 4194304 --blocks 256
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "server/tier/ssd_store.h"
#include "xxhash.h"

namespace kvcache {
namespace {

struct Config {
  std::string path;
  uint64_t block_bytes = uint64_t{4} << 20;
  uint64_t blocks = 256;
  uint64_t region_bytes = uint64_t{64} << 20;
  std::vector<uint32_t> threads = {1, 4};
  std::vector<std::string> engines = {"io_uring", "thread_pool"};
  uint32_t io_threads = 4;
  uint32_t repeat = 3;
  bool direct_io = true;
  bool keep_file = false;
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs fn(i) for i in [0, n) on `threads` threads; returns the seconds taken.
template <typename Fn>
double Parallel(uint32_t threads, uint64_t n, Fn fn) {
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (uint64_t i; (i = next.fetch_add(1)) < n;) {
        if (!fn(t, i)) failed = true;
      }
    });
  }
  for (auto& th : pool) th.join();
  const double s = Seconds(start);
  if (failed) {
    std::fprintf(stderr, "ssd_store_benchmark: an operation failed\n");
    std::exit(1);
  }
  return s;
}

int Run(const Config& config) {
  const uint64_t capacity_probe = config.region_bytes;
  std::map<std::string, std::vector<double>> samples;  // "engine threads op" -> MB/s
  std::vector<std::string> order;
  for (const std::string& engine_name : config.engines) {
    for (uint32_t threads : config.threads) {
      for (uint32_t rep = 0; rep < config.repeat; ++rep) {
        SsdStoreOptions options;
        options.path = config.path;
        options.region_bytes = config.region_bytes;
        options.capacity_bytes = capacity_probe;
        options.direct_io = config.direct_io;
        options.io_threads = config.io_threads;
        options.engine =
            engine_name == "io_uring" ? SsdIoEngine::kIoUring : SsdIoEngine::kThreadPool;
        uint64_t footprint;
        {
          auto probe = SsdStore::Open(options);
          if (!probe.ok()) {
            std::fprintf(stderr, "%s\n", probe.status().ToString().c_str());
            return 1;
          }
          footprint = (*probe)->RoundedSize(config.block_bytes);
        }
        if (footprint == 0) {
          std::fprintf(stderr, "block_bytes too large for region_bytes\n");
          return 1;
        }
        const uint64_t per_region = config.region_bytes / footprint;
        options.capacity_bytes =
            ((config.blocks + per_region - 1) / per_region) * config.region_bytes;
        auto opened = SsdStore::Open(options);
        if (!opened.ok()) {
          std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
          return 1;
        }
        SsdStore& store = **opened;
        if (rep == 0 && threads == config.threads.front()) {
          const SsdStoreStats st = store.GetStats();
          std::printf("# engine=%s direct_io=%d footprint=%lu capacity=%lu\n", st.engine.c_str(),
                      st.direct_io, static_cast<unsigned long>(footprint),
                      static_cast<unsigned long>(st.capacity_bytes));
        }
        // One payload per thread (random bytes, so nothing compresses).
        std::vector<std::vector<std::byte>> payloads(threads,
                                                     std::vector<std::byte>(config.block_bytes));
        std::vector<std::vector<std::byte>> outs = payloads;
        std::vector<uint64_t> sums(threads);
        std::mt19937_64 rng(rep);
        for (uint32_t t = 0; t < threads; ++t) {
          for (auto& b : payloads[t]) b = std::byte(rng());
          sums[t] = XXH3_64bits(payloads[t].data(), payloads[t].size());
        }
        std::vector<SsdRef> refs(config.blocks);
        auto write = [&](uint32_t t, uint64_t i) {
          auto ref = store.Write(i, payloads[t], sums[t]);
          if (!ref.ok()) std::fprintf(stderr, "%s\n", ref.status().ToString().c_str());
          if (!ref.ok()) return false;
          refs[i] = *std::move(ref);
          return true;
        };
        std::vector<uint64_t> by_offset(config.blocks);
        auto read = [&](uint32_t t, uint64_t i) {
          const absl::Status s = store.Read(*refs[by_offset[i]], outs[t]);
          if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
          return s.ok();
        };
        const double mb = static_cast<double>(config.blocks * config.block_bytes) / 1e6;
        auto record = [&](const std::string& op, double seconds, double megabytes) {
          const std::string key = engine_name + " " + std::to_string(threads) + " " + op;
          if (!samples.contains(key)) order.push_back(key);
          samples[key].push_back(megabytes / seconds);
          std::printf("RESULT engine=%s threads=%u block=%lu op=%s mbps=%.1f\n",
                      engine_name.c_str(), threads, static_cast<unsigned long>(config.block_bytes),
                      op.c_str(), megabytes / seconds);
        };

        record("write_seq", Parallel(threads, config.blocks, write), mb);
        for (uint64_t i = 0; i < config.blocks; ++i) by_offset[i] = i;
        std::sort(by_offset.begin(), by_offset.end(),
                  [&](uint64_t a, uint64_t b) { return refs[a]->offset() < refs[b]->offset(); });
        record("read_seq", Parallel(threads, config.blocks, read), mb);
        std::shuffle(by_offset.begin(), by_offset.end(), rng);
        record("read_rand", Parallel(threads, config.blocks, read), mb);
        // Free a random half, then rewrite those blocks into the scattered holes.
        std::vector<uint64_t> half(by_offset.begin(), by_offset.begin() + config.blocks / 2);
        for (uint64_t i : half) refs[i].reset();
        auto rewrite = [&](uint32_t t, uint64_t k) { return write(t, half[k]); };
        record("write_rand", Parallel(threads, half.size(), rewrite),
               static_cast<double>(half.size() * config.block_bytes) / 1e6);
        refs.clear();
      }
    }
  }
  std::printf("\n%-12s %7s %-10s %10s   (MB/s, median of %u)\n", "engine", "threads", "op",
              "median", config.repeat);
  for (const std::string& key : order) {
    std::vector<double> v = samples[key];
    std::sort(v.begin(), v.end());
    char engine[32], op[32];
    unsigned threads;
    std::sscanf(key.c_str(), "%31s %u %31s", engine, &threads, op);
    std::printf("%-12s %7u %-10s %10.1f\n", engine, threads, op, v[v.size() / 2]);
    std::printf("MEDIAN engine=%s threads=%u block=%lu op=%s mbps=%.1f\n", engine, threads,
                static_cast<unsigned long>(config.block_bytes), op, v[v.size() / 2]);
  }
  if (!config.keep_file) std::filesystem::remove(config.path);
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  kvcache::Config config;
  CLI::App app{"SsdStore throughput: write then read N blocks, per engine and thread count"};
  app.add_option("--path", config.path, "store file (created; removed at the end)")->required();
  app.add_option("--block_bytes", config.block_bytes, "payload bytes per block");
  app.add_option("--blocks", config.blocks, "blocks per pass");
  app.add_option("--region_bytes", config.region_bytes, "SsdStoreOptions::region_bytes");
  app.add_option("--threads", config.threads, "caller thread counts")->delimiter(',');
  app.add_option("--engines", config.engines, "io_uring,thread_pool")->delimiter(',');
  app.add_option("--io_threads", config.io_threads, "thread-pool engine threads");
  app.add_option("--repeat", config.repeat, "runs per configuration (median reported)");
  app.add_option("--direct_io", config.direct_io, "O_DIRECT (1) or buffered (0)");
  app.add_flag("--keep_file", config.keep_file, "leave the store file behind");
  CLI11_PARSE(app, argc, argv);
  return kvcache::Run(config);
}
