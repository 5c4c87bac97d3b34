// kvcachectl checkpoint list|verify|now, and the checkpoint lines of `status`.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ctl_commands.h"
#include "progress.h"
#include "table.h"

namespace kvcache::ctl {
namespace {

int Failed(const Context& ctx, std::string_view cmd, const absl::Status& s) {
  return FailCall(ctx, absl::StrCat("checkpoint ", std::string(cmd)), s);
}

std::string Age(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  const absl::Duration age = absl::Now() - absl::FromUnixMillis(unix_ms);
  return absl::FormatDuration(absl::Seconds(absl::ToInt64Seconds(age)));
}

std::string Kind(const v1::CheckpointInfo& c) {
  if (c.status() != "complete") return "-";
  if (c.full()) return "full";
  std::string refs;
  for (uint64_t r : c.references()) absl::StrAppend(&refs, refs.empty() ? "" : ",", r);
  return refs.empty() ? "incremental" : absl::StrCat("incremental (refs ", refs, ")");
}

void PrintCheckpoints(const v1::ListCheckpointsResponse& resp, std::ostream& out) {
  Table table({{"SEQ", true},
               {"STATUS"},
               {"AGE", true},
               {"SIZE", true},
               {"DURATION", true},
               {"BLOCKS", true},
               {"PAYLOADS", true},
               {"KIND"}});
  for (const v1::CheckpointInfo& c : resp.checkpoints()) {
    table.AddRow({absl::StrCat(c.sequence()),
                  c.status() == "complete" ? c.status() : absl::StrCat(c.status(), ": ", c.error()),
                  Age(c.created_unix_ms()), HumanBytes(c.data_bytes()),
                  absl::StrFormat("%.2fs", static_cast<double>(c.duration_ms()) / 1000),
                  absl::StrCat(c.blocks()),
                  absl::StrCat(c.host_payloads(), "+", c.referenced_payloads(), " ref"), Kind(c)});
  }
  table.Print(out);
}

}  // namespace

void PrintCheckpointStatus(const v1::CheckpointStatus& s, std::ostream& out) {
  if (!s.enabled()) {
    out << "checkpoints:  off (checkpoint.dir is not set)\n";
    return;
  }
  out << "checkpoints:  " << s.dir() << ", every "
      << (s.interval_seconds() == 0 ? std::string("- (on demand only)")
                                    : absl::StrCat(s.interval_seconds(), " s"))
      << "; " << s.checkpoints_ok() << " taken, " << s.checkpoints_failed() << " failed"
      << (s.in_progress() ? ", one in progress" : "") << '\n';
  if (s.has_last()) {
    out << "last:         " << s.last().sequence() << ", " << Age(s.last().created_unix_ms())
        << " ago, " << HumanBytes(s.last().data_bytes()) << " in "
        << absl::StrFormat("%.2fs", static_cast<double>(s.last().duration_ms()) / 1000) << '\n';
  }
  if (!s.last_error().empty()) out << "last error:   " << s.last_error() << '\n';
  out << "restore:      " << s.restore_state();
  if (s.restore_state() != "off") {
    out << " (checkpoint " << s.restore_sequence() << ": " << s.restore_records_done() << " of "
        << s.restore_records_total() << " records, " << s.restored_blocks() << " blocks restored, "
        << s.restore_skipped_blocks() << " skipped, "
        << absl::StrFormat("%.1fs", static_cast<double>(s.restore_duration_ms()) / 1000) << ")";
  }
  out << '\n';
  if (!s.restore_error().empty()) out << "restore error: " << s.restore_error() << '\n';
}

int RunCheckpoint(const Context& ctx, std::string_view action, uint64_t sequence) {
  std::ostream& out = *ctx.out;
  if (action == "list") {
    absl::StatusOr<v1::ListCheckpointsResponse> resp = ctx.client->ListCheckpoints();
    if (!resp.ok()) return Failed(ctx, action, resp.status());
    if (ctx.json) {
      out << ToJson(*resp) << '\n';
      return kExitOk;
    }
    PrintCheckpointStatus(resp->status(), out);
    if (resp->status().enabled()) PrintCheckpoints(*resp, out);
    return kExitOk;
  }
  if (action == "verify") {
    // Reading a large checkpoint back takes a while: a spinner on a terminal.
    absl::StatusOr<v1::VerifyCheckpointResponse> resp = absl::UnknownError("not called");
    RunWithSpinner("checkpoint verify", [&] { resp = ctx.client->VerifyCheckpoint(sequence); });
    if (!resp.ok()) return Failed(ctx, action, resp.status());
    if (ctx.json) {
      out << ToJson(*resp) << '\n';
      return kExitOk;
    }
    out << "checkpoint " << resp->checkpoint().sequence() << ": " << resp->checkpoint().status()
        << ", " << resp->records_verified() << " records (" << HumanBytes(resp->bytes_verified())
        << ") verified\n";
    return kExitOk;
  }
  if (action == "now") {
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::CheckpointResponse> resp = absl::UnknownError("not called");
    RunWithSpinner("checkpoint now", [&] { resp = ctx.client->Checkpoint(); });
    if (!resp.ok()) return Failed(ctx, action, resp.status());
    if (ctx.json) {
      out << ToJson(*resp) << '\n';
      return kExitOk;
    }
    const v1::CheckpointInfo& c = resp->checkpoint();
    out << "checkpoint " << c.sequence() << " committed (" << Kind(c) << "): " << c.blocks()
        << " blocks, " << c.host_payloads() << " payloads written, " << c.referenced_payloads()
        << " referenced, " << HumanBytes(c.data_bytes()) << " in "
        << absl::StrFormat("%.2fs", absl::ToDoubleSeconds(absl::Now() - start)) << '\n';
    return kExitOk;
  }
  *ctx.err << "kvcachectl: checkpoint: unknown action " << action << " (list, verify or now)\n";
  return kExitUsage;
}

}  // namespace kvcache::ctl
