// kvcachectl verify, dump and attention: the operator's view of what the
// daemon holds (docs/operations.md).
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "attention_map.h"
#include "ctl_commands.h"
#include "progress.h"
#include "table.h"

namespace kvcache::ctl {
namespace {

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

std::string Ms(uint64_t ms) {
  return absl::FormatDuration(absl::Milliseconds(static_cast<int64_t>(ms)));
}

// "lease:2 fetch:1" (reasons in a fixed order), or "-" when nothing is pinned.
std::string PinnedBy(const v1::ModelMemory& m) {
  std::vector<std::string> parts;
  for (const char* reason : {"lease", "fetch", "append", "move", "checkpoint", "inspect"}) {
    auto it = m.pinned_blocks().find(reason);
    if (it != m.pinned_blocks().end() && it->second != 0) {
      parts.push_back(absl::StrCat(reason, ":", it->second));
    }
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, " ");
}

}  // namespace

int RunVerify(const Context& ctx, const VerifyArgs& args) {
  v1::VerifyBlocksRequest req;
  req.set_namespace_(ctx.ns);
  req.set_model_id(args.model);
  req.mutable_prefix_tokens()->Add(args.prefix.begin(), args.prefix.end());
  req.set_drop_bad(args.drop_bad);
  req.set_include_lower(args.include_ssd);
  req.set_max_bytes_per_second(static_cast<uint64_t>(args.rate_mib_per_second * (1 << 20)));
  v1::VerifyBlocksProgress all;  // the totals, with every bad block
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::VerifyBlocksProgress> last;
  {
    ProgressBar bar({.label = "verify", .unit = "blocks"});
    last = ctx.client->VerifyBlocks(req, [&](const v1::VerifyBlocksProgress& p) {
      for (const v1::BadBlock& b : p.bad_blocks()) *all.add_bad_blocks() = b;
      bar.Update(p.blocks_checked(), p.bytes_checked(), p.blocks_total());
      return true;
    });
  }
  if (!last.ok()) return FailCall(ctx, "verify", last.status());
  all.set_blocks_total(last->blocks_total());
  all.set_blocks_checked(last->blocks_checked());
  all.set_bytes_total(last->bytes_total());
  all.set_bytes_checked(last->bytes_checked());
  all.set_skipped_blocks(last->skipped_blocks());
  all.set_dropped_blocks(last->dropped_blocks());
  all.set_done(last->done());
  const int code = all.bad_blocks_size() > 0 ? kExitBadBlocks : kExitOk;
  if (ctx.json) {
    *ctx.out << ToJson(all) << '\n';
    return code;
  }
  std::ostream& out = *ctx.out;
  out << absl::StrFormat(
      "checked %d blocks (%s) in %s; %d skipped (changed meanwhile)\n", all.blocks_checked(),
      HumanBytes(all.bytes_checked()),
      absl::FormatDuration(absl::Milliseconds(absl::ToInt64Milliseconds(absl::Now() - start))),
      all.skipped_blocks());
  if (all.bad_blocks_size() == 0) {
    out << "no bad blocks\n";
    return code;
  }
  Table table(
      {{"NAMESPACE"}, {"MODEL"}, {"BLOCK", true}, {"KEY"}, {"TIER"}, {"PROBLEM"}, {"DROPPED"}});
  for (const v1::BadBlock& b : all.bad_blocks()) {
    table.AddRow({b.namespace_(), b.model_id(), absl::StrCat(b.index()), Hex(b.key()), b.tier(),
                  b.problem(), b.dropped() ? "yes" : "no"});
  }
  table.Print(out);
  out << all.bad_blocks_size() << " bad block(s)";
  if (args.drop_bad) {
    out << "; " << all.dropped_blocks() << " block(s) removed (the bad ones and those below them)";
  } else {
    out << "; run again with --drop to remove them (and the blocks cached below them)";
  }
  out << '\n';
  return code;
}

int RunDump(const Context& ctx, const DumpArgs& args) {
  absl::StatusOr<v1::DumpMemoryResponse> dump = absl::UnknownError("not called");
  RunWithSpinner("dump", [&] { dump = ctx.client->DumpMemory(); });
  if (!dump.ok()) return FailCall(ctx, "dump", dump.status());
  std::string path = args.out;
  if (path.empty() && !args.no_file && !ctx.json) {
    path =
        absl::StrCat("kvcached-memory-",
                     absl::FormatTime("%Y%m%d-%H%M%S", absl::FromUnixMillis(dump->taken_unix_ms()),
                                      absl::UTCTimeZone()),
                     ".json");
  }
  if (!path.empty()) {
    std::ofstream file(path);
    file << ToJson(*dump) << '\n';
    if (!file.good()) {
      *ctx.err << "kvcachectl: dump: cannot write " << path << '\n';
      return kExitError;
    }
  }
  if (ctx.json) {
    *ctx.out << ToJson(*dump) << '\n';
    return kExitOk;
  }
  std::ostream& out = *ctx.out;
  out << "memory snapshot at "
      << absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", absl::FromUnixMillis(dump->taken_unix_ms()),
                          absl::LocalTimeZone())
      << "; daemon RSS " << HumanBytes(dump->process_rss_bytes()) << "\n\n";

  Table tiers({{"TIER"},
               {"CAPACITY", true},
               {"USED", true},
               {"USE", true},
               {"PAYLOAD", true},
               {"BLOCKS", true}});
  for (const v1::TierStats& t : dump->stats().tiers()) {
    tiers.AddRow({t.name(), HumanBytes(t.capacity_bytes()), HumanBytes(t.used_bytes()),
                  Percent(t.used_bytes(), t.capacity_bytes()), HumanBytes(t.payload_bytes()),
                  absl::StrCat(t.blocks())});
  }
  tiers.Print(out);
  out << absl::StrFormat(
      "\nhost pool: %s reserved of %s, %s in live chunks, fragmentation %.1f%%; staged by "
      "appends %s; index metadata %s\n\n",
      HumanBytes(dump->pool_reserved_bytes()), HumanBytes(dump->pool_capacity_bytes()),
      HumanBytes(dump->pool_allocated_bytes()), 100 * dump->pool_fragmentation(),
      HumanBytes(dump->stats().staged_bytes()), HumanBytes(dump->stats().metadata_bytes()));

  Table classes(
      {{"CHUNK", true}, {"SPANS", true}, {"LIVE", true}, {"FREE", true}, {"OCCUPANCY", true}});
  for (const v1::SlabClassSnapshot& c : dump->slab_classes()) {
    if (c.spans() == 0) continue;
    classes.AddRow({HumanBytes(c.chunk_bytes()), absl::StrCat(c.spans()),
                    absl::StrCat(c.live_chunks()), absl::StrCat(c.free_chunks()),
                    absl::StrFormat("%.1f%%", 100 * c.occupancy())});
  }
  if (!classes.empty()) {
    classes.Print(out);
    out << '\n';
  }

  Table models({{"NAMESPACE"},
                {"MODEL"},
                {"HOST", true},
                {"HOST BYTES", true},
                {"SSD", true},
                {"SSD BYTES", true},
                {"GPU", true},
                {"RAW", true},
                {"INT8", true},
                {"BUDGET", true},
                {"LEASED", true},
                {"REFERENCED", true},
                {"PINNED BY"},
                {"PINNED TOK", true},
                {"METADATA", true}});
  for (const v1::ModelMemory& m : dump->models()) {
    models.AddRow({m.namespace_(), m.model_id(), absl::StrCat(m.host_blocks()),
                   HumanBytes(m.host_bytes()), absl::StrCat(m.lower_blocks()),
                   HumanBytes(m.lower_bytes()), absl::StrCat(m.device_blocks()),
                   absl::StrCat(m.raw_blocks()), absl::StrCat(m.int8_blocks()),
                   absl::StrCat(m.budget_blocks()), absl::StrCat(m.leased_blocks()),
                   absl::StrCat(m.referenced_blocks()), PinnedBy(m),
                   absl::StrCat(m.pinned_tokens()), HumanBytes(m.metadata_bytes())});
  }
  if (models.empty()) {
    out << "no models\n";
  } else {
    models.Print(out);
  }

  out << "\nleases: " << dump->leases_total() << " live";
  if (dump->leases_size() > 0) {
    out << " (oldest first)\n";
    Table leases({{"LEASE"},
                  {"NAMESPACE"},
                  {"MODEL"},
                  {"TOKENS", true},
                  {"BLOCKS", true},
                  {"BYTES", true},
                  {"AGE", true},
                  {"EXPIRES IN", true}});
    for (int i = 0; i < std::min(dump->leases_size(), args.max_rows); ++i) {
      const v1::LeaseSnapshot& l = dump->leases(i);
      leases.AddRow({Hex(l.lease_id()), l.namespace_(), l.model_id(), absl::StrCat(l.tokens()),
                     absl::StrCat(l.blocks()), HumanBytes(l.bytes()), Ms(l.age_ms()),
                     Ms(l.expires_in_ms())});
    }
    leases.Print(out);
  } else {
    out << '\n';
  }
  out << "\ncalls in flight: " << dump->calls_size() << '\n';
  if (dump->calls_size() > 0) {
    Table calls({{"METHOD"}, {"REQUEST ID"}, {"PEER"}, {"AGE", true}, {"BYTES", true}});
    for (int i = 0; i < std::min(dump->calls_size(), args.max_rows); ++i) {
      const v1::InflightCall& c = dump->calls(i);
      calls.AddRow({c.method(), c.request_id().empty() ? "-" : c.request_id(), c.peer(),
                    Ms(c.age_ms()), HumanBytes(c.bytes())});
    }
    calls.Print(out);
  }
  if (!path.empty()) out << "\nwritten to " << path << '\n';
  return kExitOk;
}

int RunAttention(const Context& ctx, const AttentionArgs& args) {
  v1::InspectSequenceRequest req;
  req.set_namespace_(ctx.ns);
  req.set_model_id(args.model);
  req.mutable_tokens()->Add(args.tokens.begin(), args.tokens.end());
  req.set_first_block_key(args.first_block_key);
  req.set_include_heads(true);
  absl::StatusOr<v1::InspectSequenceResponse> r = ctx.client->InspectSequence(req);
  if (!r.ok()) return FailCall(ctx, "attention", r.status());
  if (r->matched_tokens() == 0) {
    *ctx.err << "kvcachectl: attention: nothing of that sequence is cached for " << args.model
             << '\n';
    return kExitError;
  }
  const AttentionSvgOptions map{
      .title = absl::StrCat(ctx.ns.empty() ? "default" : ctx.ns, "/", args.model, ": ",
                            r->matched_tokens(), " cached tokens"),
      .tokens_per_row = args.tokens_per_row,
      .label_tokens = true};
  auto write = [&](const std::string& path, const std::string& bytes) {
    if (path.empty()) return true;
    std::ofstream file(path, std::ios::binary);
    file << bytes;
    if (file.good()) return true;
    *ctx.err << "kvcachectl: attention: cannot write " << path << '\n';
    return false;
  };
  if (!write(args.svg, args.svg.empty() ? "" : AttentionSvg(*r, map)) ||
      !write(args.png, args.png.empty() ? "" : AttentionPng(*r, map))) {
    return kExitError;
  }
  if (ctx.json) {
    *ctx.out << ToJson(*r) << '\n';
    return kExitOk;
  }
  std::ostream& out = *ctx.out;
  uint64_t by_precision[5] = {};
  uint64_t protected_tokens = 0;
  uint64_t pinned = 0;
  for (int t = 0; t < r->precision_size(); ++t) {
    const int p = r->precision(t);
    if (p >= 0 && p < 5) ++by_precision[p];
  }
  for (bool p : r->is_protected()) protected_tokens += p ? 1 : 0;
  for (bool p : r->pinned()) pinned += p ? 1 : 0;
  out << absl::StrFormat(
      "%d cached tokens in %d blocks; %d attention reports to the model\n"
      "stored: %d full, %d int8, %d int4, %d pruned, %d mixed (per-head precision differs)\n"
      "protected (kept exact): %d, of them pinned by a worker: %d\n\n",
      r->matched_tokens(), r->blocks_size(), r->attention_reports(), by_precision[0],
      by_precision[1], by_precision[2], by_precision[3], by_precision[4], protected_tokens, pinned);
  Table blocks({{"BLOCK", true},
                {"KEY"},
                {"TIER"},
                {"FORMAT"},
                {"STORED", true},
                {"OF RAW", true},
                {"VALUE", true}});
  for (const v1::InspectedBlock& b : r->blocks()) {
    blocks.AddRow({absl::StrCat(b.index()), Hex(b.key()), b.tier(),
                   b.format_version() == 0 ? "raw" : absl::StrCat("v", b.format_version()),
                   HumanBytes(b.stored_bytes()), Percent(b.stored_bytes(), b.raw_bytes()),
                   absl::StrFormat("%.3f", b.importance())});
  }
  blocks.Print(out);
  const SpanRanking spans = ImportantSpans(*r, args.span_tokens, args.top_spans);
  auto print_spans = [&](const char* title, const std::vector<TokenSpan>& list) {
    out << '\n' << title << '\n';
    Table table({{"POSITIONS"},
                 {"IMPORTANCE", true},
                 {"ACTIVITY", true},
                 {"PROTECTED", true},
                 {"REDUCED", true},
                 {"TOKENS"}});
    for (const TokenSpan& s : list) {
      std::vector<uint32_t> ids;
      for (uint64_t t = s.begin; t < s.end && static_cast<int>(t) < r->tokens_size(); ++t) {
        ids.push_back(r->tokens(static_cast<int>(t)));
      }
      table.AddRow({absl::StrCat(s.begin, "-", s.end - 1),
                    absl::StrFormat("%.4f", s.mean_importance),
                    absl::StrFormat("%.4f", s.mean_activity), absl::StrCat(s.protected_tokens),
                    absl::StrCat(s.reduced_tokens), absl::StrJoin(ids, " ")});
    }
    table.Print(out);
  };
  print_spans("most important spans:", spans.most);
  print_spans("least important spans:", spans.least);
  if (!args.svg.empty()) out << "\nattention map written to " << args.svg << '\n';
  if (!args.png.empty()) out << "attention map (PNG) written to " << args.png << '\n';
  return kExitOk;
}

}  // namespace kvcache::ctl
