#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "table.h"

namespace kvcache::ctl {

std::string ShortDuration(absl::Duration d) {
  int64_t s = absl::ToInt64Seconds(d);
  if (s < 0) s = 0;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string FormatProgress(const ProgressState& state, int width) {
  static constexpr char kSpinner[] = {'|', '/', '-', '\\'};
  const double seconds = absl::ToDoubleSeconds(state.elapsed);
  std::vector<std::string> before;  // label (and spinner): left of the bar
  std::vector<std::string> after;   // counts, bytes, rate, time: right of it
  if (!state.label.empty()) before.push_back(state.label);
  if (state.total == 0) before.push_back(std::string(1, kSpinner[state.spinner_frame & 3]));
  if (!state.unit.empty() && (state.done > 0 || state.total > 0)) {
    after.push_back(state.total > 0 ? absl::StrCat(state.done, "/", state.total, " ", state.unit)
                                    : absl::StrCat(state.done, " ", state.unit));
  }
  if (state.bytes > 0) after.push_back(HumanBytes(state.bytes));
  if (seconds >= 0.05) {
    if (state.bytes > 0) {
      after.push_back(absl::StrCat(HumanBytes(static_cast<uint64_t>(state.bytes / seconds)), "/s"));
    } else if (!state.unit.empty() && state.done > 0) {
      after.push_back(absl::StrFormat("%.1f %s/s", state.done / seconds, state.unit));
    }
  }
  if (state.total > 0 && state.done > 0 && state.done < state.total && seconds >= 0.05) {
    const double rate = state.done / seconds;
    after.push_back(
        absl::StrCat("ETA ", ShortDuration(absl::Seconds((state.total - state.done) / rate))));
  } else {
    after.push_back(state.total == 0 ? absl::StrFormat("elapsed %.1fs", seconds)
                                     : absl::StrCat("elapsed ", ShortDuration(state.elapsed)));
  }
  const std::string left = absl::StrJoin(before, "  ");
  const std::string right = absl::StrJoin(after, "  ");
  if (state.total == 0) return left.empty() ? right : absl::StrCat(left, "  ", right);

  // [####....] between them, up to 30 columns, shrunk to fit `width`.
  int bar = 30;
  if (width > 0) {
    const int fixed = static_cast<int>(left.size() + right.size()) + 4 + 2 + 5;
    bar = std::min(bar, width - fixed);
  }
  std::string pct = absl::StrFormat(
      "%3d%%", static_cast<int>(100 * std::min(state.done, state.total) / state.total));
  if (bar < 5) return absl::StrCat(left, left.empty() ? "" : "  ", pct, "  ", right);
  const int filled = static_cast<int>(static_cast<uint64_t>(bar) *
                                      std::min(state.done, state.total) / state.total);
  return absl::StrCat(left, left.empty() ? "" : "  ", "[", std::string(filled, '#'),
                      std::string(bar - filled, '.'), "] ", pct, "  ", right);
}

namespace {

int TerminalWidth() {
  struct winsize ws {};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

}  // namespace

ProgressBar::ProgressBar(ProgressOptions options)
    : options_(std::move(options)),
      terminal_(options_.terminal.has_value() ? *options_.terminal : ::isatty(STDERR_FILENO) == 1),
      width_(options_.width > 0 ? options_.width : (terminal_ ? TerminalWidth() : 80)),
      start_(options_.now ? options_.now() : absl::Now()) {
  absl::MutexLock lock(&mu_);
  state_.label = options_.label;
  state_.unit = options_.unit;
  state_.total = options_.total;
}

ProgressBar::~ProgressBar() { Finish(); }

ProgressState ProgressBar::StateLocked() {
  ProgressState s = state_;
  s.elapsed = (options_.now ? options_.now() : absl::Now()) - start_;
  return s;
}

void ProgressBar::DrawLocked(bool force) {
  if (!terminal_ || finished_) return;
  const absl::Time now = options_.now ? options_.now() : absl::Now();
  if (!force && now - last_draw_ < options_.min_redraw) return;
  last_draw_ = now;
  std::string line = FormatProgress(StateLocked(), width_ - 1);
  if (static_cast<int>(line.size()) >= width_) line.resize(width_ - 1);
  // Pad over what the previous, longer line left behind.
  const size_t columns = line.size();
  if (line.size() < drawn_columns_) line.append(drawn_columns_ - line.size(), ' ');
  drawn_columns_ = columns;
  std::ostream& out = options_.out != nullptr ? *options_.out : std::cerr;
  out << '\r' << line << std::flush;
}

void ProgressBar::Update(uint64_t done, uint64_t bytes, uint64_t total) {
  absl::MutexLock lock(&mu_);
  state_.done = done;
  state_.bytes = bytes;
  if (total != 0) state_.total = total;
  DrawLocked(/*force=*/false);
}

void ProgressBar::Tick() {
  absl::MutexLock lock(&mu_);
  ++state_.spinner_frame;
  DrawLocked(/*force=*/false);
}

void ProgressBar::Finish() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  if (terminal_ && drawn_columns_ > 0) {
    std::ostream& out = options_.out != nullptr ? *options_.out : std::cerr;
    out << '\r' << std::string(drawn_columns_, ' ') << '\r' << std::flush;
  }
  finished_ = true;
}

std::string ProgressBar::Line() {
  absl::MutexLock lock(&mu_);
  return FormatProgress(StateLocked(), width_ - 1);
}

void RunWithSpinner(const std::string& label, const std::function<void()>& call,
                    ProgressOptions options) {
  options.label = label;
  options.total = 0;
  ProgressBar bar(std::move(options));
  if (!bar.enabled()) {
    call();
    return;
  }
  absl::Notification done;
  std::thread worker([&] {
    call();
    done.Notify();
  });
  // The first draw waits a moment: a call that answers at once draws nothing.
  while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(250))) bar.Tick();
  worker.join();
  bar.Finish();
}

}  // namespace kvcache::ctl
