#!/usr/bin/env python3
"""The fidelity evaluation: KV retention policies on a real model, judged by its own next tokens.

For each prompt (workloads.py) the reference model (smollm_reference.py) runs the prefix with
full-precision KV, recording the attention the policies may use (kv_policies.Signals); each
policy then stores that KV within a byte budget (a fraction of its FP16 bytes), and the
continuation is teacher-forced on what the policy serves. Against the same continuation on the
full-precision KV it reports:
* top-1 agreement: the share of continuation positions whose most likely next token is the same;
* perplexity ratio: exp(mean NLL with the policy's KV - mean NLL with full KV) of the true next
  tokens (for generated continuations: the model's own greedy tokens);
* attention-output error per layer: ||o - o_full|| / ||o_full|| of each layer's attention output
  over the continuation (the layer's input already carries earlier layers' errors).
Results go to a JSON file (every prompt, policy and budget) and a summary of medians with their
spread (min..max over prompts) per workload; --svg draws agreement against bytes.

Usage (tests/eval/eval_env.sh prepares the Python; fetch_model.sh prints the model):
  fidelity.py MODEL.gguf --out results.json [--svg plot.svg] [--per-workload 4]
      [--workloads chat,code,summarization] [--policies ...] [--budgets 0.5,0.37,0.25,0.15]
"""

import argparse
import json
import os
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_budget_rule  # noqa: E402
import daemon_rule  # noqa: E402
import fidelity_report  # noqa: E402
import kv_policies as kp  # noqa: E402
import kv_quant as kq  # noqa: E402
import smollm_reference as sr  # noqa: E402
import smollm_tokenizer  # noqa: E402
import workloads as wl  # noqa: E402

SUPPRESSED = (0, 1, 2)  # <|endoftext|>, <|im_start|>, <|im_end|>: generations never end early


def int8_quantize_mode(cache, layout, protection):
    """The daemon's quantize mode: every unprotected position INT8 in all heads (format v1)."""
    n = cache.positions.size
    protected = kp.protected_positions(n, protection)
    token_precision = np.where(protected, kq.FULL, kq.INT8)
    precision = np.broadcast_to(token_precision, (layout.kv_heads, n))
    ks, vs = [], []
    for layer in range(layout.layers):
        k, v, _ = kq.apply_precision(cache.k[layer], cache.v[layer], precision, layout.block_tokens)
        ks.append(k)
        vs.append(v)
    t = layout.block_tokens
    stored = sum(kq.v1_block_bytes(token_precision[s:s + t], layout.layers, layout.kv_heads,
                                   layout.head_dim) for s in range(0, n, t))
    return kp.Served(sr.KvCache(k=ks, v=vs, positions=cache.positions), stored)


def daemon_prune(cache, layout, budget, signals):
    """The daemon's prune mode (format v1, one precision per token, daemon_rule.py: its exact
    replica) at the target_mass whose stored bytes come closest to the budget; None when the
    budget is below what the mode can store."""
    dl = daemon_rule.Layout(layout.layers, layout.kv_heads, layout.head_dim, layout.block_tokens)
    fit = daemon_rule.target_mass_for_budget(cache, signals.report, daemon_rule.Policy(
        mode="prune"), dl, _whole_block_budget(cache, layout, budget))
    if not fit.reachable:
        return None
    plan = fit.plan
    return kp.Served(plan.served, plan.stored_total + _tail_bytes(cache, layout),
                     f"target_mass {fit.target_mass:.4f} "
                     "(" + " ".join(f"{k} {v}" for k, v in plan.tokens.items()) + " tokens)")


def _tail_bytes(cache, layout):
    """FP16 bytes of the positions after the prefix's last whole block: the daemon stores whole
    blocks only, so the worker keeps these as they are (and they count)."""
    return layout.fp16_bytes(cache.positions.size % layout.block_tokens)


def _whole_block_budget(cache, layout, budget):
    """The budget of the whole blocks once the tail's FP16 bytes are paid for."""
    n = cache.positions.size
    whole = layout.fp16_bytes(n - n % layout.block_tokens)
    return (budget * layout.fp16_bytes(n) - _tail_bytes(cache, layout)) / whole


def daemon_budget(cache, layout, budget, signals):
    """The daemon's budget mode at target_bytes = budget (format v2, per block), computed by
    daemon_budget_rule.py, its exact replica, from a per-head report of the attention of the
    prefix's last `window_queries` queries (what `ours` reads)."""
    dl = daemon_rule.Layout(layout.layers, layout.kv_heads, layout.head_dim, layout.block_tokens)
    rows = np.concatenate(signals.window).astype(np.float32)  # row = layer * kv_heads + head
    plan = daemon_budget_rule.budget_plan(cache, rows, daemon_rule.Policy(
        mode="budget", target_bytes=_whole_block_budget(cache, layout, budget)), dl)
    entries = plan.entries
    return kp.Served(plan.served, plan.stored_total + _tail_bytes(cache, layout),
                     " ".join(f"{k} {v}" for k, v in entries.items()) + " entries")


def policies(protection):
    """name -> (budgets it runs at: None for its own size, fn(cache, layout, budget, signals))."""
    ours = kp.ours
    return {
        "fp16": (None, lambda c, l, b, s: kp.full_fp16(c, l)),
        "int8": (None, lambda c, l, b, s: int8_quantize_mode(c, l, protection)),
        "streaming_llm": ("all", lambda c, l, b, s: kp.streaming_llm(c, l, b, protection.sinks)),
        "h2o": ("all", lambda c, l, b, s: kp.h2o(c, l, b, s)),
        "snapkv": ("all", lambda c, l, b, s: kp.snapkv(c, l, b, s)),
        "daemon_prune": ("all", daemon_prune),
        "daemon_budget": ("all", daemon_budget),
        "ours": ("all", lambda c, l, b, s: ours(c, l, b, s, protection)),
        "ours_no_int4": ("ablation", lambda c, l, b, s: ours(c, l, b, s, protection, int4=False)),
        "ours_per_token": ("ablation",
                           lambda c, l, b, s: ours(c, l, b, s, protection, per_head=False)),
        "ours_attention_only": ("ablation", lambda c, l, b, s: ours(c, l, b, s, protection,
                                                                   weights=(1.0, 0.0, 0.0))),
        "ours_position_only": ("ablation", lambda c, l, b, s: ours(c, l, b, s, protection,
                                                                  weights=(0.0, 1.0, 0.0))),
        "ours_per_block": ("all", lambda c, l, b, s: ours(c, l, b, s, protection,
                                                         per_block=True)),
        "ours_recent_fp16": ("ablation", lambda c, l, b, s: ours(c, l, b, s, protection,
                                                                recent_fp16=True)),
    }


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def generate(model, cache, last_logits, count):
    """Greedy continuation of `count` tokens from `cache` (the prefix's), end tokens suppressed."""
    tokens = []
    logits = last_logits.copy()
    for _ in range(count):
        logits[list(SUPPRESSED)] = -np.inf
        token = int(np.argmax(logits))
        tokens.append(token)
        out, cache, _ = model.forward([token], cache=cache)
        logits = out[-1]
    return tokens


def outputs_hook(store):
    def hook(layer, o):
        store[layer] = o.copy()
    return hook


def reference_pass(model, layout, prompt, window_queries, log):
    """The prefix's KV and signals, the continuation, and what full-precision KV gives on it."""
    hook, signals = kp.signal_collector(layout, model.config.heads, window_queries)
    report_hook, report = daemon_rule.attention_report_hook(64)  # what a worker reports

    def both(layer, p):
        hook(layer, p)
        report_hook(layer, p)

    started = time.time()
    prefix_logits, cache, _ = model.forward(prompt.prefix, attention_hook=both)
    signals.report = np.stack([report[i] for i in range(layout.layers)])
    if prompt.generate:
        prompt.continuation = generate(model, cache, prefix_logits[-1], prompt.continuation_tokens)
    full_out = {}
    full, _, _ = model.forward(prompt.continuation, cache=cache, output_hook=outputs_hook(full_out))
    targets = np.asarray(prompt.continuation[1:])
    log(f"  prefix {len(prompt.prefix)} + continuation {len(prompt.continuation)} tokens "
        f"({time.time() - started:.0f} s)")
    return {"k": np.stack(cache.k), "v": np.stack(cache.v), "positions": cache.positions,
            "accumulated": np.stack(signals.accumulated), "window": np.stack(signals.window),
            "report": signals.report, "continuation": np.asarray(prompt.continuation),
            "full_top": full.argmax(-1),
            "full_nll": -log_softmax(full[:-1])[np.arange(len(targets)), targets],
            "full_out": np.stack([full_out[i] for i in range(layout.layers)])}


def cached_reference_pass(model, layout, prompt, window_queries, log, cache_dir):
    """reference_pass, kept in cache_dir (an .npz per prompt) when given: later runs of other
    policies on the same prompts skip the prefix, the generation and the full-KV pass."""
    if not cache_dir:
        return reference_pass(model, layout, prompt, window_queries, log)
    key = (f"{prompt.workload}-{prompt.name}-{len(prompt.prefix)}-{prompt.continuation_tokens}"
           f"-{window_queries}-{zlib.crc32(np.asarray(prompt.prefix, np.int32).tobytes()):08x}"
           ".npz")
    path = os.path.join(cache_dir, key)
    if os.path.exists(path):
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    ref = reference_pass(model, layout, prompt, window_queries, log)
    os.makedirs(cache_dir, exist_ok=True)
    np.savez(path + ".tmp.npz", **ref)
    os.replace(path + ".tmp.npz", path)
    return ref


def run_prompt(model, layout, prompt, policy_table, budgets, ablation_budgets, protection,
               window_queries, log, cache_dir=None):
    ref = cached_reference_pass(model, layout, prompt, window_queries, log, cache_dir)
    prompt.continuation = [int(t) for t in ref["continuation"]]
    cache = sr.KvCache(k=list(ref["k"]), v=list(ref["v"]), positions=ref["positions"])
    signals = kp.Signals(list(ref["accumulated"]), list(ref["window"]), window_queries,
                         ref["report"])
    full_out, full_top, full_nll = ref["full_out"], ref["full_top"], ref["full_nll"]
    targets = np.asarray(prompt.continuation[1:])
    fp16_bytes = layout.fp16_bytes(len(prompt.prefix))
    records = []
    for name, (kind, fn) in policy_table.items():
        runs = {None: [None], "all": budgets, "ablation": ablation_budgets}[kind]
        for budget in runs:
            t0 = time.time()
            served = fn(cache, layout, budget, signals)
            if served is None:
                log(f"  {name:20s} budget {budget}: below what the policy can store; skipped")
                continue
            out = {}
            logits, _, _ = model.forward(prompt.continuation, cache=served.cache,
                                         output_hook=outputs_hook(out))
            nll = -log_softmax(logits[:-1])[np.arange(len(targets)), targets]
            errors = [float(np.linalg.norm(out[i] - full_out[i]) / np.linalg.norm(full_out[i]))
                      for i in range(layout.layers)]
            record = {
                "workload": prompt.workload, "prompt": prompt.name, "source": prompt.source,
                "policy": name, "budget": budget, "bytes": int(served.bytes),
                "bytes_fraction": served.bytes / fp16_bytes,
                "agreement": float(np.mean(logits.argmax(-1) == full_top)),
                "ppl_ratio": float(np.exp(np.mean(nll) - np.mean(full_nll))),
                "attention_error": errors, "detail": served.detail,
            }
            records.append(record)
            log(f"  {name:20s} budget {budget if budget else '-':>5} bytes "
                f"{record['bytes_fraction']:6.1%} top-1 {record['agreement']:7.2%} "
                f"ppl x{record['ppl_ratio']:.4f} attn err {np.mean(errors):.4f} "
                f"{served.detail} ({time.time() - t0:.1f} s)")
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--out", required=True, help="results JSON")
    parser.add_argument("--svg", help="plot of agreement against bytes per workload")
    parser.add_argument("--workloads", default=",".join(wl.WORKLOADS))
    parser.add_argument("--prompt-set", default="main", choices=sorted(wl.PROMPT_SETS),
                        help="main: the evaluation's own prompts; heldout: a disjoint set, "
                        "fixed before tuning (workloads.py)")
    parser.add_argument("--per-workload", type=int, default=4)
    parser.add_argument("--from-prompt", type=int, default=0,
                        help="skip each workload's first prompts (to add prompts to a run)")
    parser.add_argument("--prefix", type=int, default=1024, help="prefix tokens (code, "
                        "summarization; chat prompts are as long as their text)")
    parser.add_argument("--continuation", type=int, default=256)
    parser.add_argument("--budgets", default="0.5,0.37,0.25,0.15")
    parser.add_argument("--ablation-budgets", default="0.37")
    parser.add_argument("--policies", help="comma-separated subset (default: all)")
    parser.add_argument("--block-tokens", type=int, default=32)
    parser.add_argument("--reference-cache", help="folder keeping each prompt's full-KV pass "
                        "(large: ~120 MB per 1K-token prompt), reused by later runs")
    parser.add_argument("--window-queries", type=int, default=32,
                        help="the prefix's last queries whose attention SnapKV and ours read")
    args = parser.parse_args()

    model = sr.SmolLM(args.model)
    c = model.config
    layout = kp.Layout(c.layers, c.kv_heads, c.head_dim, args.block_tokens)
    protection = kp.Protection()
    table = policies(protection)
    if args.policies:
        wanted = args.policies.split(",")
        unknown = [p for p in wanted if p not in table]
        if unknown:
            sys.exit(f"unknown policies {unknown}; known: {', '.join(table)}")
        table = {k: v for k, v in table.items() if k in wanted}
    tokenizer = smollm_tokenizer.load(args.model)
    prompts = wl.build(lambda t: smollm_tokenizer.encode(tokenizer, t),
                       args.workloads.split(","), args.per_workload, args.prefix,
                       args.continuation, args.prompt_set)
    seen = {}
    kept = []
    for p in prompts:
        seen[p.workload] = seen.get(p.workload, -1) + 1
        if seen[p.workload] >= args.from_prompt:
            kept.append(p)
    prompts = kept
    budgets = [float(b) for b in args.budgets.split(",")]
    ablations = [float(b) for b in args.ablation_budgets.split(",")]
    records = []
    for i, prompt in enumerate(prompts):
        prompt.continuation_tokens = args.continuation
        print(f"[{i + 1}/{len(prompts)}] {prompt.workload} {prompt.name}", flush=True)
        records += run_prompt(model, layout, prompt, table, budgets, ablations, protection,
                              args.window_queries, lambda s: print(s, flush=True),
                              args.reference_cache)
        with open(args.out, "w") as f:  # after every prompt: a long run can be read midway
            json.dump({"config": vars(args), "records": records}, f, indent=1)
    print(fidelity_report.summary_markdown(records))
    if args.svg:
        fidelity_report.write_svg(records, args.svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
