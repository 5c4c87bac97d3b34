// kvcachectl: the operators' command-line tool for a running kvcached.
//
//   kvcachectl [--target HOST:PORT|unix:///PATH] [--namespace NS] [--timeout S] [--json] CMD ...
//
// Reads nothing from the environment: everything it uses is on its command line.
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "completion.h"
#include "ctl_commands.h"
#include "kvcache/client.h"

namespace {

using kvcache::ctl::kExitError;
using kvcache::ctl::kExitUsage;

constexpr const char* kDescription =
    "kvcachectl: inspect and administer a running kvcached (the KV cache daemon).\n"
    "\n"
    "Exit codes (docs/kvcachectl.md):\n"
    "  0  success (also --help, completion, and top quit with q or Ctrl-C)\n"
    "  1  a call failed, a daemon that cannot be reached included; standard error says\n"
    "     \"kvcachectl: CMD: CODE: message\" with the gRPC code\n"
    "  2  bad command line: unknown command or option, a missing or invalid value, bad tokens\n"
    "  3  `status` found the daemon NOT_SERVING\n"
    "  4  `verify` found bad blocks\n"
    "With --json, standard output holds JSON only and errors go to standard error.";

constexpr const char* kTokensHelp =
    "token ids separated by commas or spaces; A-B is the inclusive range A..B "
    "(e.g. 1,2,3 or 0-1023)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(kDescription, "kvcachectl");
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand too

  std::string target = "localhost:50051";
  std::string ns;
  double timeout_s = 10;
  bool json = false;
  app.add_option("-t,--target", target, "daemon address: HOST:PORT or unix:///path/to.sock")
      ->capture_default_str();
  app.add_option("-n,--namespace", ns,
                 "namespace to act in; empty means \"default\" (for `models`: every namespace)");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file holding the bearer token for a daemon with authentication on (default: "
                 "the KVCACHE_TOKEN environment variable)")
      ->check(CLI::ExistingFile);
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  app.add_option("--tls-ca", tls_ca, "PEM CA of the daemon's certificate: speak TLS to --target")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", tls_cert, "PEM client certificate for mutual TLS")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", tls_key, "PEM key of --tls-cert")->check(CLI::ExistingFile);
  app.add_option("--tls-server-name", tls_server_name,
                 "name the daemon's certificate must carry (default: --target's host)");
  std::string data_path = "auto";
  app.add_option("--data-path", data_path,
                 "how lookups reach the daemon: auto (shared memory for unix:// targets), grpc "
                 "or shm")
      ->check(CLI::IsMember({"auto", "grpc", "shm"}))
      ->capture_default_str();
  CLI::Option* timeout_option =
      app.add_option("--timeout", timeout_s,
                     "deadline of each call, in seconds (checkpoint now and checkpoint verify: "
                     "600, verify: 3600 unless given)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  app.add_flag("--json", json,
               "print one line of JSON (proto3 JSON, proto field names) instead of tables; top: "
               "one object per frame");

  CLI::App* status = app.add_subcommand(
      "status",
      "server version, uptime, addresses, CUDA support, grpc.health.v1 status, checkpoints "
      "and the remote tier (docs/scale-out.md)");
  CLI::App* stats = app.add_subcommand(
      "stats", "per-tier capacity/usage and per-model blocks, bytes, hits, appends, evictions");
  CLI::App* tiers = app.add_subcommand(
      "tiers",
      "each tier's capacity, use, utilization and blocks, and the moves between tiers "
      "(demotions, promotions, evictions, refused admissions, checksum failures)");
  CLI::App* models =
      app.add_subcommand("models", "registered models and their KV layouts and block sizes");

  CLI::App* lookup = app.add_subcommand(
      "lookup", "longest cached prefix of a token sequence: matched tokens and blocks (no lease)");
  std::string lookup_model, lookup_tokens_text, lookup_tokens_file;
  lookup->add_option("-m,--model", lookup_model, "model id")->required();
  auto* lt = lookup->add_option("--tokens", lookup_tokens_text, kTokensHelp);
  auto* lf = lookup->add_option("--tokens-file", lookup_tokens_file,
                                "file of token ids (same syntax as --tokens; - for stdin)");
  lt->excludes(lf);

  CLI::App* evict = app.add_subcommand(
      "evict",
      "remove a cached prefix (its last block and every block below it) or a whole "
      "model's cache; the registration stays");
  std::string evict_model, evict_tokens_text, evict_tokens_file;
  bool evict_all = false;
  evict->add_option("-m,--model", evict_model, "model id")->required();
  auto* ep = evict->add_option("--prefix-tokens", evict_tokens_text,
                               std::string("the block-aligned prefix to evict: ") + kTokensHelp);
  auto* epf = evict->add_option("--prefix-tokens-file", evict_tokens_file,
                                "file of the prefix's token ids (- for stdin)");
  auto* ea = evict->add_flag("--all", evict_all, "evict everything cached for the model");
  ep->excludes(epf)->excludes(ea);
  epf->excludes(ea);

  CLI::App* unregister = app.add_subcommand(
      "unregister",
      "remove a model: its cached blocks, its leases and its registration, so the id can be "
      "registered again (e.g. with the right layout)");
  std::string unregister_model;
  unregister->add_option("-m,--model", unregister_model, "model id")->required();

  CLI::App* policy = app.add_subcommand(
      "policy",
      "show a model's importance policy, or change it at runtime: compression mode (off, "
      "quantize, prune, budget), weights, target mass. Switching to off removes compressed blocks, "
      "so "
      "the model serves only lossless KV (the first check when outputs look wrong)");
  std::string policy_model;
  kvcache::ctl::PolicyChangeArgs policy_change;
  policy->add_option("-m,--model", policy_model, "model id")->required();
  policy->add_option("--mode", policy_change.mode, "off, quantize, prune or budget")
      ->check(CLI::IsMember({"off", "quantize", "prune", "budget"}));
  policy->add_option("--weights", policy_change.weights, "alpha beta gamma (each in [0, 1])")
      ->expected(3);
  policy
      ->add_option("--target-mass", policy_change.target_mass,
                   "share of a block's importance mass prune mode keeps, in (0, 1]")
      ->check(CLI::Range(0.0, 1.0));
  policy
      ->add_option("--target-bytes", policy_change.target_bytes,
                   "share of a raw block's bytes budget mode may keep, in (0, 1]")
      ->check(CLI::Range(0.0, 1.0));

  CLI::App* checkpoint = app.add_subcommand(
      "checkpoint",
      "checkpoints of the cache: `list` (on disk, with age, size, duration and status; the "
      "restore at start-up), `verify [SEQ]` (read one back and check every record; default the "
      "newest) or `now` (take one and wait until it is committed)");
  std::string checkpoint_action;
  uint64_t checkpoint_sequence = 0;
  checkpoint->add_option("action", checkpoint_action, "list, verify or now")
      ->required()
      ->check(CLI::IsMember({"list", "verify", "now"}));
  checkpoint->add_option("sequence", checkpoint_sequence,
                         "verify: the checkpoint's sequence (default: the newest complete one)");

  CLI::App* verify = app.add_subcommand(
      "verify",
      "read stored blocks back in the daemon and check each against its checksum and its "
      "compressed format (throttled, so serving goes on); report bad blocks and, with --drop, "
      "remove them. The first thing to run when generations repeat themselves");
  kvcache::ctl::VerifyArgs verify_args;
  std::string verify_tokens_text;
  verify->add_option("-m,--model", verify_args.model, "only this model (default: every model)");
  verify->add_option("--prefix-tokens", verify_tokens_text,
                     std::string("only this cached prefix (needs --model): ") + kTokensHelp);
  verify->add_flag("--drop", verify_args.drop_bad,
                   "remove bad blocks (and the blocks cached below them)");
  verify->add_flag("--ssd", verify_args.include_ssd, "also read back the SSD tier's copies");
  verify
      ->add_option("--rate", verify_args.rate_mib_per_second,
                   "MiB read back per second at most (default: the daemon's, 256)")
      ->check(CLI::PositiveNumber);

  CLI::App* dump = app.add_subcommand(
      "dump",
      "a memory snapshot: per tier, model and size class (blocks, bytes, precision, slab "
      "occupancy, fragmentation) and who holds references (leases, calls in flight) with their "
      "ages; written as JSON to a file and summarised as tables");
  kvcache::ctl::DumpArgs dump_args;
  dump->add_option("-o,--out", dump_args.out,
                   "JSON file to write (default: kvcached-memory-<UTC time>.json here)");
  dump->add_flag("--no-file", dump_args.no_file, "print the tables only");

  CLI::App* attention = app.add_subcommand(
      "attention",
      "why the daemon kept what it kept: per-token importance, attention reports (per layer "
      "when the model reports per head), protected tokens and stored precision of a cached "
      "sequence, as an SVG (or PNG) heatmap and a text summary of the most and least important "
      "spans");
  kvcache::ctl::AttentionArgs attention_args;
  std::string attention_tokens_text, attention_tokens_file;
  attention->add_option("-m,--model", attention_args.model, "model id")->required();
  auto* at = attention->add_option("--tokens", attention_tokens_text, kTokensHelp);
  auto* af = attention->add_option("--tokens-file", attention_tokens_file,
                                   "file of token ids (- for stdin)");
  std::string attention_key;
  auto* ak = attention->add_option(
      "--key", attention_key,
      "instead of tokens: the most used sequence that begins with the block of this chain key, "
      "in hex as kvcachectl lookup and the status page print keys (0x optional)");
  at->excludes(af)->excludes(ak);
  af->excludes(ak);
  attention->add_option("--svg", attention_args.svg, "write the heatmap to this SVG file");
  attention->add_option("--png", attention_args.png,
                        "write the heatmap to this PNG file (cells only, no text)");
  attention->add_option("--span", attention_args.span_tokens, "tokens per span in the summary")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  attention->add_option("--top", attention_args.top_spans, "spans listed at each end")
      ->capture_default_str();

  CLI::App* top = app.add_subcommand(
      "top",
      "a live view refreshed every --interval: calls/s, errors/s and mean latency per method, hit "
      "ratio, KV bytes in/out, tier use, migrations and compression (q or Ctrl-C quits; not on a "
      "terminal, or with --json, it prints frames one after another)");
  kvcache::ctl::TopOptions top_options;
  top->add_option("--interval", top_options.interval_s, "seconds between polls")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  top->add_option("--iterations", top_options.iterations,
                  "frames to show before exiting (0: until q or Ctrl-C)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  CLI::App* completion = app.add_subcommand(
      "completion", "print a shell completion script: source <(kvcachectl completion bash)");
  std::string completion_shell;
  completion->add_option("shell", completion_shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));

  CLI::App* whoami = app.add_subcommand(
      "whoami", "who the daemon takes this caller to be: principal, tenant and role");

  CLI::App* log_level = app.add_subcommand(
      "log-level",
      "show the daemon's log level, or set it at runtime (every daemon log but the migration "
      "log; not kept across a restart)");
  std::string log_level_value;
  log_level
      ->add_option("level", log_level_value,
                   "trace, debug, info, warn, error, critical or off; omitted: only show it")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  if (completion->parsed()) {
    std::cout << (completion_shell == "zsh" ? kvcache::ctl::ZshCompletion(app)
                                            : kvcache::ctl::BashCompletion(app));
    return 0;
  }

  kvcache::ClientOptions options;
  options.target = target;
  options.ns = ns;
  // Writing or reading back a checkpoint of a large cache takes minutes.
  if (((checkpoint->parsed() && checkpoint_action != "list") || verify->parsed()) &&
      timeout_option->count() == 0) {
    timeout_s = verify->parsed() ? 3600 : 600;
  }
  options.timeout = absl::Seconds(timeout_s);
  absl::StatusOr<std::string> token = kvcache::ctl::ReadToken(token_file);
  if (!token.ok()) {
    std::cerr << "kvcachectl: " << token.status().message() << '\n';
    return kExitUsage;
  }
  options.token = *std::move(token);
  options.tls_ca_file = tls_ca;
  options.tls_cert_file = tls_cert;
  options.tls_key_file = tls_key;
  options.tls_server_name = tls_server_name;
  if (data_path == "grpc") options.data_path = kvcache::DataPath::kGrpc;
  if (data_path == "shm") options.data_path = kvcache::DataPath::kSharedMemory;
  absl::StatusOr<std::unique_ptr<kvcache::Client>> client = kvcache::Client::Connect(options);
  if (!client.ok()) {
    std::cerr << "kvcachectl: " << client.status().message() << '\n';
    return kExitUsage;
  }
  kvcache::ctl::Context ctx;
  ctx.client = client->get();
  ctx.target = target;
  ctx.ns = ns;
  ctx.timeout = options.timeout;
  ctx.json = json;
  ctx.out = &std::cout;
  ctx.err = &std::cerr;

  auto tokens_of = [](const std::string& text,
                      const std::string& file) -> absl::StatusOr<std::vector<uint32_t>> {
    return file.empty() ? kvcache::ctl::ParseTokens(text) : kvcache::ctl::ReadTokensFile(file);
  };

  if (status->parsed()) return kvcache::ctl::RunStatus(ctx);
  if (log_level->parsed()) return kvcache::ctl::RunLogLevel(ctx, log_level_value);
  if (whoami->parsed()) return kvcache::ctl::RunWhoAmI(ctx);
  if (verify->parsed()) {
    if (!verify_tokens_text.empty()) {
      absl::StatusOr<std::vector<uint32_t>> prefix = kvcache::ctl::ParseTokens(verify_tokens_text);
      if (!prefix.ok() || verify_args.model.empty()) {
        std::cerr << "kvcachectl: verify: "
                  << (prefix.ok() ? "--prefix-tokens needs --model" : prefix.status().message())
                  << '\n';
        return kExitUsage;
      }
      verify_args.prefix = *std::move(prefix);
    }
    return kvcache::ctl::RunVerify(ctx, verify_args);
  }
  if (dump->parsed()) return kvcache::ctl::RunDump(ctx, dump_args);
  if (attention->parsed()) {
    if (at->count() + af->count() + ak->count() == 0) {
      std::cerr << "kvcachectl: attention: give the sequence with --tokens, --tokens-file or "
                   "--key\n";
      return kExitUsage;
    }
    if (ak->count() != 0) {
      absl::string_view hex = attention_key;  // Debian's Abseil has its own string_view
      if (absl::StartsWith(hex, "0x") || absl::StartsWith(hex, "0X")) hex.remove_prefix(2);
      if (hex.empty() || hex.size() > 16 ||
          !absl::SimpleHexAtoi(hex, &attention_args.first_block_key) ||
          attention_args.first_block_key == 0) {
        std::cerr << "kvcachectl: attention: --key " << attention_key
                  << " is not a block key (1 to 16 hex digits, not 0)\n";
        return kExitUsage;
      }
    } else {
      absl::StatusOr<std::vector<uint32_t>> tokens =
          tokens_of(attention_tokens_text, attention_tokens_file);
      if (!tokens.ok()) {
        std::cerr << "kvcachectl: attention: " << tokens.status().message() << '\n';
        return kExitUsage;
      }
      attention_args.tokens = *std::move(tokens);
    }
    return kvcache::ctl::RunAttention(ctx, attention_args);
  }
  if (top->parsed()) return kvcache::ctl::RunTop(ctx, top_options);
  if (checkpoint->parsed()) {
    return kvcache::ctl::RunCheckpoint(ctx, checkpoint_action, checkpoint_sequence);
  }
  if (stats->parsed()) return kvcache::ctl::RunStats(ctx);
  if (tiers->parsed()) return kvcache::ctl::RunTiers(ctx);
  if (models->parsed()) return kvcache::ctl::RunModels(ctx);
  if (policy->parsed()) return kvcache::ctl::RunPolicy(ctx, policy_model, policy_change);
  if (unregister->parsed()) return kvcache::ctl::RunUnregister(ctx, unregister_model);
  if (lookup->parsed()) {
    if (lt->count() + lf->count() == 0) {
      std::cerr << "kvcachectl: lookup: give the sequence with --tokens or --tokens-file\n";
      return kExitUsage;
    }
    absl::StatusOr<std::vector<uint32_t>> tokens =
        tokens_of(lookup_tokens_text, lookup_tokens_file);
    if (!tokens.ok()) {
      std::cerr << "kvcachectl: lookup: " << tokens.status().message() << '\n';
      return kExitUsage;
    }
    return kvcache::ctl::RunLookup(ctx, lookup_model, *tokens);
  }
  if (evict->parsed()) {
    if (ep->count() + epf->count() + ea->count() == 0) {
      std::cerr << "kvcachectl: evict: give --prefix-tokens, --prefix-tokens-file or --all\n";
      return kExitUsage;
    }
    std::vector<uint32_t> tokens;
    if (!evict_all) {
      absl::StatusOr<std::vector<uint32_t>> parsed =
          tokens_of(evict_tokens_text, evict_tokens_file);
      if (!parsed.ok()) {
        std::cerr << "kvcachectl: evict: " << parsed.status().message() << '\n';
        return kExitUsage;
      }
      if (parsed->empty()) {
        std::cerr << "kvcachectl: evict: the prefix is empty; use --all to evict the whole "
                     "model\n";
        return kExitUsage;
      }
      tokens = *std::move(parsed);
    }
    return kvcache::ctl::RunEvict(ctx, evict_model, tokens, evict_all);
  }
  return kExitError;
}
