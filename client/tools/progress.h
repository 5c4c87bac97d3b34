// ProgressBar: kvcachectl's progress line for commands that take more than a
// second (verify, dump, checkpoint now/verify).
//
// It draws on one line of standard error (carriage return, no newline) and
// only when that stream is a terminal, so standard output (tables, --json)
// stays clean for scripts and nothing is written into logs: when it is not a
// terminal the bar is silent. The line shows what is known:
//
//   verify  [########............]  1200/3000 blocks  75.0 MiB  12.5 MiB/s  ETA 2m24s
//   checkpoint now  |  elapsed 3.2s                      (a spinner: total unknown)
//
// With a total the bar, done/total and the ETA appear; with bytes, the bytes
// and their rate (else the rate is in units per second). Redraws are limited
// to one per `min_redraw` (Finish always draws). The terminal check and the
// clock are injectable for tests. Thread-safe: Update, Tick and Finish may be
// called from any thread (a worker's progress callback and the main thread).
#ifndef KVCACHE_CLIENT_TOOLS_PROGRESS_H_
#define KVCACHE_CLIENT_TOOLS_PROGRESS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvcache::ctl {

// The numbers one line is drawn from.
struct ProgressState {
  std::string label;   // e.g. "verify"
  std::string unit;    // what `done` counts, e.g. "blocks"; empty: no count shown
  uint64_t done = 0;   // units finished
  uint64_t total = 0;  // units in all; 0: unknown (a spinner, no bar or ETA)
  uint64_t bytes = 0;  // bytes moved so far; 0: none shown
  absl::Duration elapsed;
  int spinner_frame = 0;  // which of | / - \ a spinner shows
};

// The line for `state`, at most `width` columns (the bar shrinks to fit; 0: no
// limit). Pure, for tests.
std::string FormatProgress(const ProgressState& state, int width = 80);
// "7s", "2m24s", "1h05m": a duration to the second, short.
std::string ShortDuration(absl::Duration d);

struct ProgressOptions {
  std::string label;
  std::string unit;
  uint64_t total = 0;
  std::ostream* out = nullptr;      // nullptr: std::cerr
  std::optional<bool> terminal;     // unset: whether standard error is a terminal
  std::function<absl::Time()> now;  // unset: absl::Now
  absl::Duration min_redraw = absl::Milliseconds(100);
  int width = 0;  // 0: the terminal's width, or 80 when unknown
};

class ProgressBar {
 public:
  explicit ProgressBar(ProgressOptions options);
  ~ProgressBar();  // Finish() when not finished yet
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Whether anything is drawn (standard error is a terminal).
  bool enabled() const { return terminal_; }

  // Absolute progress: `done` units (and `bytes`) so far. A nonzero `total`
  // replaces the total given at construction.
  void Update(uint64_t done, uint64_t bytes = 0, uint64_t total = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // Redraws with the time advanced (and a spinner turned): for waits with no
  // progress to report.
  void Tick() ABSL_LOCKS_EXCLUDED(mu_);
  // Erases the line, so that what follows starts on a clean line. Idempotent.
  void Finish() ABSL_LOCKS_EXCLUDED(mu_);

  // The line as it would be drawn now (also when not enabled), for tests.
  std::string Line() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void DrawLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ProgressState StateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ProgressOptions options_;
  const bool terminal_;
  const int width_;
  const absl::Time start_;
  absl::Mutex mu_;
  ProgressState state_ ABSL_GUARDED_BY(mu_);
  absl::Time last_draw_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  size_t drawn_columns_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs `call` on a thread while a spinner labelled `label` (with the elapsed
// time) turns on standard error; returns when `call` has returned. When
// standard error is not a terminal, just runs `call` here. For unary calls
// that may take long (checkpoint now, checkpoint verify).
void RunWithSpinner(const std::string& label, const std::function<void()>& call,
                    ProgressOptions options = {});

}  // namespace kvcache::ctl

#endif  // KVCACHE_CLIENT_TOOLS_PROGRESS_H_
