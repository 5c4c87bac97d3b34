#include "ctl_commands.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "progress.h"
#include "table.h"

namespace kvcache::ctl {

std::string ToJson(const google::protobuf::Message& msg) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(msg, &json, opts).ok()) return "null";
  return json;
}

int FailCall(const Context& ctx, std::string_view cmd, const absl::Status& s) {
  *ctx.err << "kvcachectl: " << cmd << ": " << absl::StatusCodeToString(s.code()) << ": "
           << s.message();
  if (s.code() == absl::StatusCode::kUnavailable) {
    *ctx.err << " (is kvcached running and listening at " << ctx.target << "?)";
  } else if (s.code() == absl::StatusCode::kDeadlineExceeded) {
    *ctx.err << " (no answer within " << absl::FormatDuration(ctx.timeout) << "; see --timeout)";
  }
  *ctx.err << '\n';
  return kExitError;
}

namespace {

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

int Fail(const Context& ctx, std::string_view cmd, const absl::Status& s) {
  return FailCall(ctx, cmd, s);
}

std::string DTypeName(v1::DType d) {
  switch (d) {
    case v1::DTYPE_FP16:
      return "fp16";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_FP32:
      return "fp32";
    default:
      return absl::StrCat("dtype(", static_cast<int>(d), ")");
  }
}

// grpc.health.v1.Health/Check for the whole server (service ""). The request
// is the empty message; the response is field 1, a varint enum. A generic call
// keeps the health proto out of the client library.
struct Health {
  absl::Status rpc;
  std::string state;  // SERVING, NOT_SERVING, ...
};

Health CheckHealth(const Context& ctx) {
  grpc::ChannelArguments args;
  auto channel = grpc::CreateCustomChannel(ctx.target, grpc::InsecureChannelCredentials(), args);
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(channel);
  grpc::ClientContext call;
  call.set_deadline(absl::ToChronoTime(absl::Now() + ctx.timeout));
  grpc::ByteBuffer request;  // an empty HealthCheckRequest
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&call, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  Health h;
  if (!status.ok()) {
    h.rpc =
        absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    h.state = status.error_code() == grpc::StatusCode::UNIMPLEMENTED ? "UNKNOWN" : "UNREACHABLE";
    return h;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  int value = 0;  // proto3: an absent field is 0, UNKNOWN
  if (bytes.size() >= 2 && bytes[0] == 0x08) value = static_cast<unsigned char>(bytes[1]);
  static constexpr const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  h.state = value < 4 ? kNames[value] : absl::StrCat("STATE_", value);
  return h;
}

std::string FormatUnixMs(int64_t ms) {
  if (ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", absl::FromUnixMillis(ms), absl::LocalTimeZone());
}

std::string ModeName(v1::CompressionMode mode) {
  switch (mode) {
    case v1::COMPRESSION_MODE_OFF:
      return "off";
    case v1::COMPRESSION_MODE_QUANTIZE:
      return "quantize";
    case v1::COMPRESSION_MODE_PRUNE:
      return "prune";
    case v1::COMPRESSION_MODE_BUDGET:
      return "budget";
    default:
      return "unspecified";
  }
}

void PrintPolicy(std::ostream& out, const v1::ModelPolicy& p) {
  out << "mode:          " << ModeName(p.mode()) << '\n'
      << absl::StrFormat("weights:       alpha %.3f  beta %.3f  gamma %.3f\n", p.weights().alpha(),
                         p.weights().beta(), p.weights().gamma())
      << "target mass:   " << p.target_mass() << '\n'
      << "target bytes:  " << p.target_bytes() << '\n'
      << "sink tokens:   " << p.sink_tokens() << '\n'
      << "recent window: " << p.recent_window() << '\n';
}

}  // namespace

int RunStatus(const Context& ctx) {
  absl::StatusOr<v1::GetServerInfoResponse> info = ctx.client->GetServerInfo();
  if (!info.ok()) return Fail(ctx, "status", info.status());
  const Health health = CheckHealth(ctx);
  const int code = health.state == "NOT_SERVING" ? kExitNotServing : kExitOk;
  if (ctx.json) {
    *ctx.out << "{\"target\":" << JsonString(ctx.target)
             << ",\"health\":" << JsonString(health.state) << ",\"server_info\":" << ToJson(*info)
             << "}\n";
    return code;
  }
  std::ostream& out = *ctx.out;
  out << "target:       " << ctx.target << '\n' << "health:       " << health.state;
  if (!health.rpc.ok()) out << " (" << absl::StatusCodeToString(health.rpc.code()) << ")";
  out << '\n'
      << "version:      " << info->version() << '\n'
      << "git revision: " << (info->git_revision().empty() ? "-" : info->git_revision()) << '\n'
      << "started:      " << FormatUnixMs(info->start_time_unix_ms()) << '\n'
      << "uptime:       " << absl::FormatDuration(absl::Seconds(info->uptime_seconds())) << '\n'
      << "cuda built:   " << (info->cuda_built() ? "yes" : "no") << '\n'
      << "listening:    ";
  if (info->listen_addresses().empty()) out << "-";
  for (int i = 0; i < info->listen_addresses_size(); ++i) {
    out << (i ? ", " : "") << info->listen_addresses(i);
  }
  out << '\n'
      << "shm socket:   " << (info->shm_socket().empty() ? "-" : info->shm_socket()) << '\n';
  PrintCheckpointStatus(info->checkpoint(), out);
  PrintRemoteTierStatus(info->remote_tier(), out);
  return code;
}

void PrintRemoteTierStatus(const v1::RemoteTierStatus& r, std::ostream& out) {
  if (!r.enabled()) {
    out << "remote tier:  off (remote_tier.seeds is not set)\n";
    return;
  }
  const uint64_t misses =
      r.read_misses_absent() + r.read_misses_unreadable() + r.read_misses_unavailable();
  out << "remote tier:  " << absl::StrJoin(r.seeds(), ", ") << "; breaker "
      << (r.breaker_open() ? "OPEN (the cluster is skipped for now)" : "closed") << '\n'
      << "  writes:     " << r.blocks_written() << " blocks written, " << r.write_queue_blocks()
      << " queued, " << r.writes_dropped() << " dropped, " << r.writes_failed() << " failed\n"
      << "  reads:      " << r.read_hits() << " hits of " << r.blocks_read() << " blocks asked; "
      << misses << " misses (" << r.read_misses_absent() << " absent, "
      << r.read_misses_unreadable() << " unreadable, " << r.read_misses_unavailable()
      << " unavailable)\n"
      << "  searches:   " << r.searches() << " (" << r.searches_dropped() << " dropped), "
      << r.blocks_adopted() << " blocks adopted\n";
}

namespace {

// Each tier's capacity, use and utilization (payload / used): the table
// `stats` and `tiers` both print.
void PrintTierTable(const v1::GetStatsResponse& stats, std::ostream& out) {
  Table tiers({{"TIER"},
               {"CAPACITY", true},
               {"USED", true},
               {"USED%", true},
               {"PAYLOAD", true},
               {"UTIL%", true},
               {"BLOCKS", true}});
  for (const v1::TierStats& t : stats.tiers()) {
    tiers.AddRow({t.name(), HumanBytes(t.capacity_bytes()), HumanBytes(t.used_bytes()),
                  Percent(t.used_bytes(), t.capacity_bytes()), HumanBytes(t.payload_bytes()),
                  Percent(t.payload_bytes(), t.used_bytes()), absl::StrCat(t.blocks())});
  }
  tiers.Print(out);
}

}  // namespace

int RunTiers(const Context& ctx) {
  absl::StatusOr<v1::GetStatsResponse> stats = ctx.client->GetStats();
  if (!stats.ok()) return Fail(ctx, "tiers", stats.status());
  if (ctx.json) {
    v1::GetStatsResponse tiers_only;
    *tiers_only.mutable_tiers() = stats->tiers();
    *ctx.out << ToJson(tiers_only) << '\n';
    return kExitOk;
  }
  std::ostream& out = *ctx.out;
  PrintTierTable(*stats, out);
  Table moves({{"TIER"},
               {"DEMOTED", true},
               {"WRITTEN", true},
               {"CLEAN_DROPS", true},
               {"PROMOTED", true},
               {"READS", true},
               {"READ", true},
               {"EVICTED", true},
               {"REFUSED", true},
               {"WRITE_FAIL", true},
               {"CHECKSUM_FAIL", true}});
  bool any = false;
  for (const v1::TierStats& t : stats->tiers()) {
    if (t.name() == "host") continue;
    any = true;
    moves.AddRow({t.name(), absl::StrCat(t.demotions()), HumanBytes(t.write_bytes()),
                  absl::StrCat(t.clean_drops()), absl::StrCat(t.promotions()),
                  absl::StrCat(t.reads()), HumanBytes(t.read_bytes()), absl::StrCat(t.evictions()),
                  absl::StrCat(t.admissions_refused()), absl::StrCat(t.write_failures()),
                  absl::StrCat(t.checksum_failures())});
  }
  if (any) {
    out << "\nMoves\n";
    moves.Print(out);
  } else {
    out << "\nNo tier but host memory (set ssd_tier.path or gpu_tier.kind to add one).\n";
  }
  return kExitOk;
}

int RunStats(const Context& ctx) {
  absl::StatusOr<v1::GetStatsResponse> stats = ctx.client->GetStats();
  if (!stats.ok()) return Fail(ctx, "stats", stats.status());
  if (ctx.json) {
    *ctx.out << ToJson(*stats) << '\n';
    return kExitOk;
  }
  std::ostream& out = *ctx.out;
  out << "Tiers\n";
  PrintTierTable(*stats, out);

  Table models({{"NAMESPACE"},
                {"MODEL"},
                {"BLOCKS", true},
                {"TOKENS", true},
                {"BYTES", true},
                {"HIT_TOKENS", true},
                {"MISS_TOKENS", true},
                {"HIT%", true},
                {"APPENDED", true},
                {"DEDUP", true},
                {"EVICTED", true}});
  for (const v1::ModelStats& m : stats->models()) {
    models.AddRow({m.namespace_(), m.model_id(), absl::StrCat(m.blocks()), absl::StrCat(m.tokens()),
                   HumanBytes(m.bytes()), absl::StrCat(m.hit_tokens()),
                   absl::StrCat(m.miss_tokens()),
                   Percent(m.hit_tokens(), m.hit_tokens() + m.miss_tokens()),
                   absl::StrCat(m.appended_blocks()), absl::StrCat(m.deduplicated_blocks()),
                   absl::StrCat(m.evicted_blocks())});
  }
  out << "\nModels\n";
  if (models.empty()) {
    out << "(no models registered)\n";
  } else {
    models.Print(out);
  }
  if (!stats->models().empty()) {
    Table importance({{"NAMESPACE"},
                      {"MODEL"},
                      {"MODE"},
                      {"ALPHA/BETA/GAMMA"},
                      {"FULL_TOKENS", true},
                      {"INT8_TOKENS", true},
                      {"PRUNED_TOKENS", true},
                      {"COMPRESSED", true},
                      {"SAVED", true},
                      {"REPORTS", true},
                      {"CALIBRATIONS", true}});
    for (const v1::ModelStats& m : stats->models()) {
      const v1::ImportanceWeights& w = m.policy().weights();
      importance.AddRow({m.namespace_(), m.model_id(), ModeName(m.policy().mode()),
                         absl::StrFormat("%.3f/%.3f/%.3f", w.alpha(), w.beta(), w.gamma()),
                         absl::StrCat(m.full_tokens()), absl::StrCat(m.int8_tokens()),
                         absl::StrCat(m.pruned_tokens()), absl::StrCat(m.compressed_blocks()),
                         HumanBytes(m.bytes_saved()), absl::StrCat(m.attention_reports()),
                         absl::StrCat(m.calibrations())});
    }
    out << "\nImportance\n";
    importance.Print(out);
  }
  uint64_t conflicting = 0, restored = 0, corrupt = 0;
  for (const v1::ModelStats& m : stats->models()) {
    conflicting += m.conflicting_blocks();
    restored += m.restored_blocks();
    corrupt += m.corrupt_blocks();
  }
  out << "\nactive leases:      " << stats->active_leases() << " (" << stats->lease_tokens()
      << " tokens)\n"
      << "capacity evictions: " << stats->capacity_evictions() << " blocks\n"
      << "rejected appends:   " << stats->rejected_appends() << '\n'
      << "appends in flight:  " << HumanBytes(stats->staged_bytes()) << " staged\n"
      << "metadata:           " << HumanBytes(stats->metadata_bytes()) << " ("
      << stats->metadata_evictions() << " blocks evicted for its budget)\n"
      << "integrity:          " << conflicting << " conflicting blocks in "
      << stats->conflicting_appends() << " appends, " << restored << " lossy blocks restored, "
      << corrupt << " corrupt blocks dropped\n";
  if (stats->has_memory()) {
    const v1::MemoryStats& m = stats->memory();
    out << "\nMemory: own " << HumanBytes(m.own_bytes()) << " of a bound of "
        << HumanBytes(m.bound_bytes()) << (m.own_bytes() > m.bound_bytes() ? " (OVER)" : "")
        << " (rss " << HumanBytes(m.rss_bytes()) << " minus " << HumanBytes(m.shared_bytes())
        << " of workers' shared memory); " << m.threads() << " threads, " << m.shm_connections()
        << " shared-memory connections, " << m.malloc_trims() << " allocator trims\n";
    Table parts({{"PART"}, {"BYTES", true}, {"SHARE%", true}});
    for (const v1::MemoryStats::Part& p : m.parts()) {
      parts.AddRow({p.name(), HumanBytes(p.bytes()), Percent(p.bytes(), m.own_bytes())});
    }
    parts.Print(out);
  }
  return kExitOk;
}

int RunModels(const Context& ctx) {
  absl::StatusOr<v1::ListModelsResponse> models = ctx.client->ListModels(ctx.ns);
  if (!models.ok()) return Fail(ctx, "models", models.status());
  if (ctx.json) {
    *ctx.out << ToJson(*models) << '\n';
    return kExitOk;
  }
  if (models->models().empty()) {
    *ctx.out << "(no models registered"
             << (ctx.ns.empty() ? "" : absl::StrCat(" in namespace '", ctx.ns, "'")) << ")\n";
    return kExitOk;
  }
  Table t({{"NAMESPACE"},
           {"MODEL"},
           {"LAYERS", true},
           {"KV_HEADS", true},
           {"HEAD_DIM", true},
           {"DTYPE"},
           {"BLOCK_TOKENS", true},
           {"BLOCK_BYTES", true}});
  for (const v1::ModelInfo& m : models->models()) {
    const v1::ModelLayout& l = m.layout();
    t.AddRow({m.namespace_(), m.model_id(), absl::StrCat(l.num_layers()),
              absl::StrCat(l.num_kv_heads()), absl::StrCat(l.head_dim()), DTypeName(l.dtype()),
              absl::StrCat(l.block_tokens()),
              absl::StrCat(m.block_bytes(), " (", HumanBytes(m.block_bytes()), ")")});
  }
  t.Print(*ctx.out);
  return kExitOk;
}

int RunPolicy(const Context& ctx, std::string_view model, const PolicyChangeArgs& change) {
  const bool changing = !change.mode.empty() || !change.weights.empty() ||
                        change.target_mass != 0 || change.target_bytes != 0;
  if (!changing) {
    absl::StatusOr<v1::ListModelsResponse> models = ctx.client->ListModels(ctx.ns);
    if (!models.ok()) return Fail(ctx, "policy", models.status());
    const std::string ns = ctx.ns.empty() ? "default" : ctx.ns;
    for (const v1::ModelInfo& m : models->models()) {
      if (m.model_id() != model || m.namespace_() != ns) continue;
      if (ctx.json) {
        *ctx.out << ToJson(m.policy()) << '\n';
      } else {
        *ctx.out << "model:         " << ns << '/' << model << '\n';
        PrintPolicy(*ctx.out, m.policy());
      }
      return kExitOk;
    }
    return Fail(
        ctx, "policy",
        absl::NotFoundError(absl::StrCat("model \"", std::string(model),
                                         "\" is not registered in namespace \"", ns, "\"")));
  }
  v1::UpdateModelPolicyRequest req;
  req.set_namespace_(ctx.ns);
  req.set_model_id(std::string(model));
  if (change.mode == "off") {
    req.set_mode(v1::COMPRESSION_MODE_OFF);
  } else if (change.mode == "quantize") {
    req.set_mode(v1::COMPRESSION_MODE_QUANTIZE);
  } else if (change.mode == "prune") {
    req.set_mode(v1::COMPRESSION_MODE_PRUNE);
  } else if (change.mode == "budget") {
    req.set_mode(v1::COMPRESSION_MODE_BUDGET);
  } else if (!change.mode.empty()) {
    return Fail(ctx, "policy",
                absl::InvalidArgumentError(absl::StrCat(
                    "--mode is \"", change.mode, "\"; it must be off, quantize, prune or budget")));
  }
  if (!change.weights.empty()) {
    if (change.weights.size() != 3) {
      return Fail(ctx, "policy",
                  absl::InvalidArgumentError("--weights takes three values: alpha beta gamma"));
    }
    req.mutable_weights()->set_alpha(change.weights[0]);
    req.mutable_weights()->set_beta(change.weights[1]);
    req.mutable_weights()->set_gamma(change.weights[2]);
  }
  req.set_target_mass(change.target_mass);
  req.set_target_bytes(change.target_bytes);
  absl::StatusOr<v1::UpdateModelPolicyResponse> resp = ctx.client->UpdateModelPolicy(req);
  if (!resp.ok()) return Fail(ctx, "policy", resp.status());
  if (ctx.json) {
    *ctx.out << ToJson(*resp) << '\n';
    return kExitOk;
  }
  *ctx.out << "previous mode: " << ModeName(resp->previous_mode()) << '\n';
  PrintPolicy(*ctx.out, resp->policy());
  if (resp->dropped_blocks() > 0) {
    *ctx.out << "removed " << resp->dropped_blocks()
             << " compressed blocks (and the blocks below them): the model now serves only "
                "lossless KV\n";
  }
  return kExitOk;
}

int RunLookup(const Context& ctx, std::string_view model, const std::vector<uint32_t>& tokens) {
  absl::StatusOr<LookupResult> r = ctx.client->Lookup(model, tokens);
  if (!r.ok()) return Fail(ctx, "lookup", r.status());
  if (ctx.json) {
    v1::LookupResponse resp;
    resp.set_matched_tokens(r->matched_tokens);
    resp.set_withheld_tokens(r->withheld_tokens);
    resp.mutable_blocks()->Add(r->blocks.begin(), r->blocks.end());
    *ctx.out << ToJson(resp) << '\n';
    return kExitOk;
  }
  uint64_t bytes = 0;
  for (const auto& b : r->blocks) bytes += b.bytes();
  *ctx.out << "matched " << r->matched_tokens << " of " << tokens.size() << " tokens ("
           << Percent(r->matched_tokens, tokens.size()) << "): " << r->blocks.size() << " blocks, "
           << HumanBytes(bytes) << '\n';
  if (r->withheld_tokens != 0) {
    *ctx.out << r->withheld_tokens
             << " more cached tokens are stored lossy (INT8 or pruned) and were not matched: "
                "workers get them only with accept_lossy\n";
  }
  if (r->blocks.empty()) return kExitOk;
  Table t({{"INDEX", true}, {"KEY"}, {"CHECKSUM"}, {"BYTES", true}});
  for (const v1::BlockDescriptor& b : r->blocks) {
    t.AddRow({absl::StrCat(b.index()), absl::StrFormat("%016x", b.key()),
              absl::StrFormat("%016x", b.checksum()), absl::StrCat(b.bytes())});
  }
  t.Print(*ctx.out);
  return kExitOk;
}

int RunEvict(const Context& ctx, std::string_view model, const std::vector<uint32_t>& tokens,
             bool all) {
  // Evicting a large model takes a while: a spinner on a terminal meanwhile.
  absl::StatusOr<EvictResult> r = absl::UnknownError("not called");
  RunWithSpinner("evict", [&] {
    r = all ? ctx.client->EvictModel(model) : ctx.client->EvictPrefix(model, tokens);
  });
  if (!r.ok()) return Fail(ctx, "evict", r.status());
  if (ctx.json) {
    v1::EvictResponse resp;
    resp.set_evicted_blocks(r->evicted_blocks);
    resp.set_evicted_bytes(r->evicted_bytes);
    *ctx.out << ToJson(resp) << '\n';
    return kExitOk;
  }
  *ctx.out << "evicted " << r->evicted_blocks << " blocks (" << HumanBytes(r->evicted_bytes)
           << ") of model '" << model << "'\n";
  return kExitOk;
}

int RunUnregister(const Context& ctx, std::string_view model) {
  absl::StatusOr<v1::UnregisterModelResponse> r = absl::UnknownError("not called");
  RunWithSpinner("unregister", [&] { r = ctx.client->UnregisterModel(model); });
  if (!r.ok()) return Fail(ctx, "unregister", r.status());
  if (ctx.json) {
    *ctx.out << ToJson(*r) << '\n';
    return kExitOk;
  }
  *ctx.out << "unregistered model '" << model << "': evicted " << r->evicted_blocks() << " blocks ("
           << HumanBytes(r->evicted_bytes()) << "), released " << r->released_leases()
           << " leases\n";
  return kExitOk;
}

absl::StatusOr<std::vector<uint32_t>> ParseTokens(std::string_view text) {
  std::vector<uint32_t> tokens;
  int item = 0;
  for (absl::string_view piece : absl::StrSplit(absl::string_view(text.data(), text.size()),
                                                absl::ByAnyChar(", \t\r\n"), absl::SkipEmpty())) {
    ++item;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("token item ", item, " '", piece, "': ", why));
    };
    const size_t dash = piece.find('-', 1);
    uint32_t lo = 0, hi = 0;
    if (dash == absl::string_view::npos) {
      if (!absl::SimpleAtoi(piece, &lo) || piece[0] == '-' || piece[0] == '+') {
        return bad("not a token id in 0..4294967295");
      }
      tokens.push_back(lo);
      continue;
    }
    absl::string_view a = piece.substr(0, dash), b = piece.substr(dash + 1);
    if (!absl::SimpleAtoi(a, &lo) || !absl::SimpleAtoi(b, &hi) || b.empty() || b[0] == '-' ||
        b[0] == '+' || a[0] == '+') {
      return bad("not a range A-B of token ids");
    }
    if (hi < lo) return bad("range end is below its start");
    if (hi - lo >= (uint32_t{1} << 26)) return bad("range longer than 2^26 tokens");
    for (uint64_t t = lo; t <= hi; ++t) tokens.push_back(static_cast<uint32_t>(t));
  }
  return tokens;
}

absl::StatusOr<std::vector<uint32_t>> ReadTokensFile(const std::string& path) {
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokens file '", path, "'"));
    text << in.rdbuf();
  }
  absl::StatusOr<std::vector<uint32_t>> tokens = ParseTokens(text.str());
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", tokens.status().message()));
  }
  return tokens;
}

}  // namespace kvcache::ctl
