// The subcommands of kvcachectl, apart from their command-line wiring so each
// is a plain function of a Client, its inputs and the output streams.
//
// Every command prints a human-readable report (aligned tables) to `out`, or
// with `json` one line of JSON (proto3 JSON mapping, proto field names: 64-bit
// counters are strings). Errors go to `err` as "kvcachectl: CMD: CODE: message".
// Each returns the process exit code (kExit*).
#ifndef KVCACHE_CLIENT_TOOLS_CTL_COMMANDS_H_
#define KVCACHE_CLIENT_TOOLS_CTL_COMMANDS_H_

#include <google/protobuf/message.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvcache/client.h"

namespace kvcache::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;       // a call failed (or no daemon answered)
inline constexpr int kExitUsage = 2;       // bad command line (options, values, tokens)
inline constexpr int kExitNotServing = 3;  // status: the health service says NOT_SERVING
inline constexpr int kExitBadBlocks = 4;   // verify: found blocks that fail their checks

struct Context {
  Client* client = nullptr;
  std::string target;
  std::string ns;
  absl::Duration timeout;
  bool json = false;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
};

// Server version, uptime, addresses, and grpc.health.v1 status.
int RunStatus(const Context& ctx);
// Per-model and per-tier tables and global counters.
int RunStats(const Context& ctx);
// kvcachectl tiers: the tiers and the moves between them.
int RunTiers(const Context& ctx);
// Registered models and their layouts; `ctx.ns` empty lists every namespace.
int RunModels(const Context& ctx);
// The longest cached prefix of `tokens` (no lease is taken).
int RunLookup(const Context& ctx, std::string_view model, const std::vector<uint32_t>& tokens);
// Evicts the prefix `tokens` (and every block below it), or, with `all`,
// everything cached for the model.
int RunEvict(const Context& ctx, std::string_view model, const std::vector<uint32_t>& tokens,
             bool all);
// Unregisters a model in `ctx.ns`: its blocks, leases and registration.
int RunUnregister(const Context& ctx, std::string_view model);

// A model's importance policy: with no change given, shows it (mode, weights,
// target mass, sinks, window); otherwise applies the change and shows the
// result (and how many compressed blocks switching to off removed).
struct PolicyChangeArgs {
  std::string mode;            // "", "off", "quantize", "prune", "budget"
  std::vector<float> weights;  // empty, or alpha, beta, gamma
  double target_mass = 0;      // 0: unchanged
  double target_bytes = 0;     // 0: unchanged
};
int RunPolicy(const Context& ctx, std::string_view model, const PolicyChangeArgs& change);

// kvcachectl top: a live view refreshed every `interval_s` (top_view.h says
// what a frame shows). With standard output a terminal (unless --json) it
// redraws in place and returns on q or Ctrl-C; otherwise it prints frames
// one after another, separated by a blank line, or one JSON object per line
// with --json. Returns after `iterations` frames (0: until stopped). Rates
// need two polls: the first frame shows totals only (JSON: rates null).
// Exit 1 when a poll fails, except on a terminal, where the view says so and
// keeps polling.
struct TopOptions {
  double interval_s = 1;
  int64_t iterations = 0;
  std::optional<bool> terminal;  // unset: whether standard output is a terminal
};
int RunTop(const Context& ctx, const TopOptions& options);

// Prints "kvcachectl: CMD: CODE: message" (with a hint for UNAVAILABLE and
// DEADLINE_EXCEEDED) to ctx.err and returns kExitError.
int FailCall(const Context& ctx, std::string_view cmd, const absl::Status& s);

// One JSON line of a proto message (proto3 JSON, proto field names), as --json prints.
std::string ToJson(const google::protobuf::Message& msg);

// kvcachectl checkpoint: `list` (the checkpoints on disk, the restore at
// start-up and the last run), `verify` (read checkpoint `sequence`, 0: the
// newest, back and check every record) or `now` (take one and wait for it).
int RunCheckpoint(const Context& ctx, std::string_view action, uint64_t sequence);
// The checkpoint lines `status` and `checkpoint list` print.
void PrintCheckpointStatus(const v1::CheckpointStatus& status, std::ostream& out);
// The remote tier's lines of `status`.
void PrintRemoteTierStatus(const v1::RemoteTierStatus& status, std::ostream& out);

// kvcachectl verify (ctl_inspect.cc): reads stored blocks back in the daemon
// and checks them; a progress line on a terminal; bad blocks as a table.
// Exits kExitBadBlocks when any block failed.
struct VerifyArgs {
  std::string model;             // empty: every model (of ctx.ns when set)
  std::vector<uint32_t> prefix;  // non-empty: only this prefix's blocks
  bool drop_bad = false;
  bool include_ssd = false;
  double rate_mib_per_second = 0;  // 0: the daemon's default
};
int RunVerify(const Context& ctx, const VerifyArgs& args);

// kvcachectl dump: a memory snapshot, written to a JSON file and summarised
// as tables (tiers, pool and size classes, models, leases, calls in flight).
struct DumpArgs {
  std::string out;       // empty: kvcached-memory-<UTC time>.json (not with --json)
  bool no_file = false;  // only the tables
  int max_rows = 20;     // of the leases and calls tables
};
int RunDump(const Context& ctx, const DumpArgs& args);

// kvcachectl attention: per-token importance of a cached sequence as an SVG
// heatmap and a text summary (the most and least important spans).
struct AttentionArgs {
  std::string model;
  std::vector<uint32_t> tokens;  // the sequence, or empty with first_block_key
  uint64_t first_block_key = 0;  // the most used sequence below this first block
  std::string svg;               // empty: no file
  std::string png;               // empty: no file
  uint32_t tokens_per_row = 64;
  uint32_t span_tokens = 16;
  size_t top_spans = 5;
};
int RunAttention(const Context& ctx, const AttentionArgs& args);

// kvcachectl log-level (ctl_logging.cc): the daemon's log level; with
// `level` set (trace, debug, info, warn, error, critical, off), sets it first
// and shows the one it replaced. Not kept across a restart.
int RunLogLevel(const Context& ctx, std::string_view level);

// The bearer token in `path` (surrounding whitespace dropped), or, with no
// path, in the KVCACHE_TOKEN environment variable; empty when neither is set.
// INVALID_ARGUMENT for an unreadable or empty file.
absl::StatusOr<std::string> ReadToken(const std::string& path);

// Who the daemon takes the caller to be: principal, tenant, role, and how it
// was authenticated.
int RunWhoAmI(const Context& ctx);

// Parses token ids separated by commas and/or whitespace; "a-b" is the
// inclusive range a..b. INVALID_ARGUMENT names the first bad item.
absl::StatusOr<std::vector<uint32_t>> ParseTokens(std::string_view text);
// ParseTokens of a file's contents ("-" reads standard input).
absl::StatusOr<std::vector<uint32_t>> ReadTokensFile(const std::string& path);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CLIENT_TOOLS_CTL_COMMANDS_H_
