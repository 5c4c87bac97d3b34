// The daemon's background work, each on a thread of its own that runs until
// `stopping`: the maintenance loop (lease expiry, importance compaction, pool
// compaction, weight calibration) and the tier migrator (demotion past the
// host's high watermark, GPU copies past the device's), with the migration
// log the migrator writes. Each iteration calls one Cache entry point and
// logs what it did; the decisions are the cache's.
#ifndef KVCACHE_SERVER_DAEMON_MAINTENANCE_H_
#define KVCACHE_SERVER_DAEMON_MAINTENANCE_H_

#include <spdlog/spdlog.h>

#include <atomic>
#include <memory>
#include <vector>

#include "kvcache/v1/config.pb.h"
#include "server/core/cache.h"
#include "server/status/event_log.h"

namespace kvcache {

// The weights calibration learned before (importance.calibration_file), or
// none when there is no file. A file that does not load is logged and
// ignored: it never keeps the daemon down, and the next save replaces it.
v1::CalibratedWeights LoadCalibratedWeights(const v1::ImportanceConfig& config);

// Saves the weights calibration applied into `saved` and, when the config
// names a calibration file, writes it.
void PersistCalibration(const std::vector<CalibrationOutcome>& outcomes,
                        const v1::ImportanceConfig& config, v1::CalibratedWeights* saved);

// Runs the periodic work until `stopping`: lease expiry every second,
// compaction, pool compaction and calibration at their configured intervals.
void RunMaintenance(Cache& cache, const v1::ImportanceConfig& config,
                    const v1::HostTierConfig& host, v1::CalibratedWeights calibrated,
                    const std::atomic<bool>& stopping);

// The migration log's logger (a rotating file), or null when it is off.
std::shared_ptr<spdlog::logger> OpenMigrationLog(const v1::LoggingConfig& c);

// Writes the moves since the last call to the migration log and the status
// page's event log (either may be null).
void WriteMoves(Cache& cache, spdlog::logger* log, EventLog* events);

// Demotes cold host blocks to the lower tier whenever the host is past its
// high watermark, drops GPU tier copies past its own, and writes the moves to
// the migration log, until `stopping`.
void RunMigrator(Cache& cache, spdlog::logger* migration_log, EventLog* events,
                 const std::atomic<bool>& stopping);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_DAEMON_MAINTENANCE_H_
