// kvcachectl top: a live view of kvcached from GetStats polls (top_view.h
// draws the frames). On a terminal it redraws in place and quits on q or
// Ctrl-C; otherwise it prints frames one after another (--iterations N: N of
// them), or JSON lines with --json.
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <csignal>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "ctl_commands.h"
#include "top_view.h"

namespace kvcache::ctl {
namespace {

volatile std::sig_atomic_t g_stop = 0;

extern "C" void OnStopSignal(int) { g_stop = 1; }

// The terminal while top draws on it: keys without Enter and without echo,
// the cursor hidden, Ctrl-C / SIGTERM / SIGHUP turned into "stop". The
// destructor puts everything back.
class TerminalSession {
 public:
  TerminalSession(std::ostream& out, bool keys) : out_(out) {
    g_stop = 0;
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a wait in poll() ends at once
    for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &old_actions_[i]);
    if (keys && ::tcgetattr(STDIN_FILENO, &saved_) == 0) {
      struct termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      restore_termios_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    out_ << "\x1b[?25l\x1b[2J" << std::flush;  // hide the cursor, clear the screen
  }
  ~TerminalSession() {
    out_ << "\x1b[?25h" << std::flush;  // show the cursor again
    if (restore_termios_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
    for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &old_actions_[i], nullptr);
  }
  TerminalSession(const TerminalSession&) = delete;
  TerminalSession& operator=(const TerminalSession&) = delete;

  // Draws `text` over the previous frame: home, each line cleared to its
  // end, then the rest of the screen cleared (no flicker of a full clear).
  void Draw(const std::string& text) {
    out_ << "\x1b[H" << absl::StrReplaceAll(text, {{"\n", "\x1b[K\n"}}) << "\x1b[J" << std::flush;
  }

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  std::ostream& out_;
  struct sigaction old_actions_[3]{};
  struct termios saved_ {};
  bool restore_termios_ = false;
};

// Waits until `deadline`; false when the user asked to quit (q, Ctrl-C) meanwhile.
bool WaitUntil(absl::Time deadline, bool read_keys) {
  while (g_stop == 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    // Short slices: a signal may be delivered to another (gRPC) thread.
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 100));
    if (!read_keys) {
      ::poll(nullptr, 0, ms);
      continue;
    }
    struct pollfd pfd {
      STDIN_FILENO, POLLIN, 0
    };
    if (::poll(&pfd, 1, ms) > 0 && (pfd.revents & POLLIN) != 0) {
      char c = 0;
      if (::read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q')) return false;
    }
  }
  return false;
}

}  // namespace

int RunTop(const Context& ctx, const TopOptions& options) {
  std::ostream& out = *ctx.out;
  const bool interactive = !ctx.json && options.terminal.value_or(::isatty(STDOUT_FILENO) == 1);
  absl::StatusOr<v1::GetServerInfoResponse> info = ctx.client->GetServerInfo();
  if (!info.ok()) return FailCall(ctx, "top", info.status());

  TopHeader header;
  header.target = ctx.target;
  header.info = *std::move(info);
  header.interval = absl::Seconds(options.interval_s);
  header.interactive = interactive;

  std::optional<TerminalSession> terminal;
  if (interactive) terminal.emplace(out, ::isatty(STDIN_FILENO) == 1);
  std::optional<TopSample> prev;
  const absl::Time start = absl::Now();
  for (int64_t i = 0; options.iterations == 0 || i < options.iterations; ++i) {
    if (i > 0 && !WaitUntil(start + i * header.interval, interactive && ::isatty(STDIN_FILENO))) {
      break;
    }
    absl::StatusOr<v1::GetStatsResponse> stats = ctx.client->GetStats();
    if (!stats.ok()) {
      if (!interactive) return FailCall(ctx, "top", stats.status());
      // On the terminal, keep the last frame and say what failed: the daemon
      // may be restarting, and the view should come back with it.
      terminal->Draw(absl::StrCat("kvcachectl top: ", ctx.target, ": ",
                                  absl::StatusCodeToString(stats.status().code()), ": ",
                                  stats.status().message(), "\n(retrying every ",
                                  absl::FormatDuration(header.interval), "; q quits)\n"));
      prev.reset();
      continue;
    }
    TopSample cur{absl::Now(), *std::move(stats)};
    const TopFrame frame = BuildTopFrame(prev ? &*prev : nullptr, cur);
    if (ctx.json) {
      out << RenderTopJson(header, frame) << '\n' << std::flush;
    } else if (interactive) {
      terminal->Draw(RenderTopText(header, frame));
    } else {
      if (i > 0) out << '\n';
      out << RenderTopText(header, frame) << std::flush;
    }
    prev = std::move(cur);
  }
  return kExitOk;
}

}  // namespace kvcache::ctl
