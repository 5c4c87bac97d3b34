#include "server/daemon/maintenance.h"

#include <spdlog/sinks/rotating_file_sink.h>

#include <string>

#include "server/config/calibration_file.h"
#include "server/core/cache_access.h"
#include "server/core/compactor.h"
#include "server/logging/logging.h"

namespace kvcache {

v1::CalibratedWeights LoadCalibratedWeights(const v1::ImportanceConfig& config) {
  v1::CalibratedWeights calibrated;
  const std::string& path = config.calibration_file();
  if (path.empty()) return calibrated;
  absl::StatusOr<v1::CalibratedWeights> loaded = LoadCalibrationFile(path);
  if (loaded.ok()) {
    calibrated = *std::move(loaded);
    spdlog::info("calibration: starting from the weights of {} models in {}",
                 calibrated.models_size(), path);
  } else if (!absl::IsNotFound(loaded.status())) {
    spdlog::error(
        "calibration: ignoring the calibration file {}: {}; every model starts from the "
        "configured weights (importance.alpha/beta/gamma), and the file is replaced when "
        "calibration next saves",
        path, std::string(loaded.status().message()));
  }
  return calibrated;
}

void PersistCalibration(const std::vector<CalibrationOutcome>& outcomes,
                        const v1::ImportanceConfig& config, v1::CalibratedWeights* saved) {
  bool changed = false;
  for (const CalibrationOutcome& c : outcomes) {
    if (!c.applied) continue;
    v1::CalibratedWeights::Model* entry = nullptr;
    for (auto& m : *saved->mutable_models()) {
      if (m.namespace_() == c.model.ns && m.model_id() == c.model.model_id) entry = &m;
    }
    if (entry == nullptr) {
      entry = saved->add_models();
      entry->set_namespace_(c.model.ns);
      entry->set_model_id(c.model.model_id);
    }
    entry->set_alpha(c.after.alpha);
    entry->set_beta(c.after.beta);
    entry->set_gamma(c.after.gamma);
    changed = true;
  }
  if (!changed || config.calibration_file().empty()) return;
  if (absl::Status s = SaveCalibrationFile(config.calibration_file(), *saved); !s.ok()) {
    spdlog::warn("calibration: {}", s.ToString());
  }
}

void RunMaintenance(Cache& cache, const v1::ImportanceConfig& config,
                    const v1::HostTierConfig& host, v1::CalibratedWeights calibrated,
                    const std::atomic<bool>& stopping) {
  const absl::Duration compaction_every = absl::Milliseconds(config.compaction_interval_ms());
  const absl::Duration pool_compaction_every = absl::Milliseconds(host.compaction_interval_ms());
  const PoolCompactionOptions pool_compaction{
      .plan = {.max_span_occupancy = host.compaction_max_span_occupancy(),
               .max_bytes = host.compaction_max_bytes_per_pass()}};
  absl::Time next_pool_compaction = absl::Now() + pool_compaction_every;
  const absl::Duration calibration_every = absl::Seconds(config.calibration_interval_seconds());
  absl::Time next_expiry = absl::Now();
  absl::Time next_compaction = absl::Now() + compaction_every;
  absl::Time next_calibration = absl::Now() + calibration_every;
  while (!stopping.load()) {
    const absl::Time now = absl::Now();
    if (now >= next_expiry) {
      CacheAccess::Locked(CacheAccess(&cache)).ExpireLeases();
      next_expiry = now + absl::Seconds(1);
    }
    if (now >= next_compaction) {
      const CompactionResult r = Compactor(&cache).Compact();
      if (r.corrupt_blocks > 0) {
        spdlog::error(
            "compaction: {} blocks did not match their checksums (memory corruption) and were "
            "dropped",
            r.corrupt_blocks);
      }
      if (r.compressed_blocks > 0) {
        spdlog::info(
            "compaction: {} blocks compressed ({} INT8 and {} pruned tokens), {} bytes "
            "saved{}",
            r.compressed_blocks, r.int8_tokens, r.pruned_tokens, r.bytes_saved,
            r.under_pressure ? ", under memory pressure" : "");
      }
      next_compaction = absl::Now() + compaction_every;
    }
    if (pool_compaction_every > absl::ZeroDuration() && now >= next_pool_compaction) {
      const PoolCompactionResult r = Compactor(&cache).CompactPool(pool_compaction);
      if (r.mismatched_blocks > 0) {
        spdlog::error(
            "pool compaction: {} blocks did not match their checksums (memory corruption) and "
            "were dropped",
            r.mismatched_blocks);
      }
      if (r.moved_blocks > 0) {
        spdlog::debug("pool compaction: {} blocks ({} bytes) moved out of {} sparse spans",
                      r.moved_blocks, r.moved_bytes, r.draining_spans);
      }
      next_pool_compaction = absl::Now() + pool_compaction_every;
    }
    if (calibration_every > absl::ZeroDuration() && now >= next_calibration) {
      const std::vector<CalibrationOutcome> outcomes = Compactor(&cache).Calibrate();
      for (const CalibrationOutcome& c : outcomes) {
        spdlog::info(
            "calibration of {}: {} samples, weights {:.3f}/{:.3f}/{:.3f} -> {:.3f}/{:.3f}/{:.3f} "
            "(fit {:.3f}/{:.3f}/{:.3f}), score-attention correlation {:.3f} -> {:.3f}{}",
            c.model.ToString(), c.samples, c.before.alpha, c.before.beta, c.before.gamma,
            c.after.alpha, c.after.beta, c.after.gamma, c.fitted.alpha, c.fitted.beta,
            c.fitted.gamma, c.correlation_before, c.correlation_after,
            c.applied ? "" : " (not applied: too few samples or no fit)");
      }
      PersistCalibration(outcomes, config, &calibrated);
      next_calibration = absl::Now() + calibration_every;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

std::shared_ptr<spdlog::logger> OpenMigrationLog(const v1::LoggingConfig& c) {
  if (c.migration_log().empty()) return nullptr;
  try {
    auto log = spdlog::rotating_logger_mt(kMigrationLoggerName, c.migration_log(),
                                          c.migration_log_max_bytes(), /*max_files=*/3);
    log->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %v", spdlog::pattern_time_type::utc);
    log->flush_on(spdlog::level::info);
    return log;
  } catch (const spdlog::spdlog_ex& e) {
    spdlog::error("migration log {}: {}; moves are not logged", c.migration_log(), e.what());
    return nullptr;
  }
}

void WriteMoves(Cache& cache, spdlog::logger* log, EventLog* events) {
  for (const MoveRecord& m : cache.tiers().DrainMoves()) {
    if (events != nullptr) events->AddMove(m);
    if (log == nullptr) continue;
    log->info("key={:016x} from={} to={} reason={} bytes={} us={}", m.key, m.from, m.to, m.reason,
              m.bytes, absl::ToInt64Microseconds(m.took));
  }
}

void RunMigrator(Cache& cache, spdlog::logger* migration_log, EventLog* events,
                 const std::atomic<bool>& stopping) {
  while (!stopping.load()) {
    WriteMoves(cache, migration_log, events);
    if (!cache.tiers().NeedsMigration()) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    const absl::Time start = absl::Now();
    const MigrationResult r = cache.tiers().Migrate();
    spdlog::debug(
        "migration: {} blocks ({} bytes) demoted to ssd, {} clean host copies dropped, {} "
        "evicted ({} not admitted), {} gpu copies dropped in {:.1f} ms",
        r.demoted_blocks, r.demoted_bytes, r.clean_drops, r.evicted_blocks, r.refused_blocks,
        r.device_drops, absl::ToDoubleMilliseconds(absl::Now() - start));
    if (r.demoted_blocks + r.clean_drops + r.evicted_blocks + r.device_drops == 0) {
      absl::SleepFor(absl::Milliseconds(20));  // nothing movable now (all leased or in use)
    }
  }
  WriteMoves(cache, migration_log, events);
}

}  // namespace kvcache
