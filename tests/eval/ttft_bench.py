#!/usr/bin/env python3
"""Time to first token on the real model: a prefix fetched from kvcached against recomputing it.

Run by hand, not a test: it needs llama-cpp-python (about 20 minutes to build, so not in CI) and
the model tests/eval/fetch_model.sh prints. docs/benchmarks.md, "Time to first token on the real
model", has the method, the command and the figures.

For each prompt length N (tokens of real text: docs/api.md then docs/architecture.md, tokenized
by the model), with S = --suffix uncached tokens and P = N - S cached ones (whole blocks):

  recompute  llama.cpp prefill of all N tokens, then the first token (argmax of the logits)
  fetch      kvcache-ttft-fetch (tests/bench/ttft_fetch.cc) against a kvcached it starts here:
             P tokens of KV in the model's layout (30 layers x 3 KV heads x 64, fp16, --block-tokens
             per block) fetched into the worker's buffer and verified, over shared memory (main's
             fastest host path), over gRPC, and from a quantized copy (decoded by the daemon over
             shared memory, or moved compressed over gRPC and decoded by the client)
  suffix     llama.cpp with the P-token prefix already in its context (evaluated untimed), timed
             over the S-token suffix plus the first token
  load       llama_state_seq_set_data of the P-token prefix (llama.cpp's own serialized KV of
             the same tokens) into an emptied context: what copying fetched KV into llama.cpp's
             tensors costs. After it the suffix is evaluated again and its logits compared with
             the recompute's (same top-1 token, max |diff| reported): the restored prefix is the
             one a recompute would build.

  TTFT cached = fetch + suffix (+ load, reported beside it).

The fetched KV is synthetic (the daemon never reads values; INT8 sizes and codec speed do not
depend on them), so the cached path is timed on the right bytes but not fed to llama.cpp: load
measures llama.cpp taking in real KV of the same size instead. Medians of --runs runs; fetch
runs are interleaved per path. Prints a markdown table and writes every sample to --json.

Usage: ttft_bench.py [--build build] [--model M.gguf] [--sizes 512,1024,2048,4096] [--suffix 32]
                     [--block-tokens 32] [--runs 5] [--threads 2] [--json out.json]
       ttft_bench.py --fetch-only ...   the kvcached side alone (no llama.cpp needed)
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2  # SmolLM2-135M, fp16: 23,040


def start_daemon(kvcached, workdir):
    sock = os.path.join(workdir, "kvcached.sock")
    config = {
        "listen": {"tcp_address": "none", "unix_socket": sock, "metrics_address": "none"},
        "host_tier": {"capacity_bytes": str(2 << 30)},
        "importance": {"cold_after_seconds": 1, "compaction_interval_ms": 100,
                       "max_blocks_per_pass": 4096},
    }
    path = os.path.join(workdir, "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    log = open(os.path.join(workdir, "kvcached.log"), "w")
    proc = subprocess.Popen([kvcached, "--config", path], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(100):
        if os.path.exists(sock) and os.path.exists(sock + ".shm"):
            return proc, sock
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"ttft_bench: kvcached did not create {sock}; see {log.name}")


def run_fetch_side(args, prefixes):
    """Starts kvcached, runs kvcache-ttft-fetch, returns {(prefix, path): result}."""
    kvcached = os.path.join(args.build, "server", "kvcached")
    fetch = os.path.join(args.build, "tests", "bench", "kvcache-ttft-fetch")
    for f in (kvcached, fetch):
        if not os.access(f, os.X_OK):
            sys.exit(f"ttft_bench: {f} is missing (build kvcached and kvcache-ttft-fetch first)")
    with tempfile.TemporaryDirectory(prefix="ttft-") as workdir:
        daemon, sock = start_daemon(kvcached, workdir)
        try:
            out = subprocess.run(
                [fetch, "--target", "unix://" + sock, "--runs", str(args.fetch_runs),
                 "--block-tokens", str(args.block_tokens),
                 "--prefix-tokens", ",".join(map(str, prefixes))],
                capture_output=True, text=True, check=False)
        finally:
            daemon.terminate()
            daemon.wait()
    if out.returncode != 0:
        sys.exit(f"ttft_bench: kvcache-ttft-fetch failed ({out.returncode}):\n{out.stderr}")
    results = {}
    for line in out.stdout.splitlines():
        r = json.loads(line)
        results[(r["prefix_tokens"], r["path"])] = r
    return results


def prompt_tokens(llm, n_max):
    text = ""
    for name in ("docs/api.md", "docs/architecture.md", "docs/tiers.md"):
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            text += f.read()
    tokens = llm.tokenize(text.encode(), add_bos=True)
    if len(tokens) < n_max:
        sys.exit(f"ttft_bench: the prompt text has {len(tokens)} tokens, fewer than {n_max}")
    return tokens[:n_max]


def run_llama_side(args, sizes):
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(args.model, n_ctx=max(sizes) + 64, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=512, verbose=False)
    ctx = llm.ctx
    n_vocab = llm.n_vocab()
    tokens = prompt_tokens(llm, max(sizes))

    def logits():
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).copy()

    def timed_eval(toks):
        t0 = time.perf_counter()
        llm.eval(toks)
        first = int(np.argmax(logits()))
        return (time.perf_counter() - t0) * 1e3, first

    results = {}
    runs = [int(r) for r in str(args.runs).split(",")]
    runs = runs * len(sizes) if len(runs) == 1 else runs
    if len(runs) != len(sizes):
        sys.exit("ttft_bench: --runs needs one number or one per size")
    for n, n_runs in zip(sizes, runs):
        p = n - args.suffix
        rec, suf, load, decode, diffs, same = [], [], [], [], [], True
        for run in range(n_runs):
            llm.reset()
            ms, first_rec = timed_eval(tokens[:n])
            ref = logits()
            rec.append(ms)

            llm.reset()
            llm.eval(tokens[:p])  # the cached prefix, untimed
            size = llama_cpp.llama_state_seq_get_size(ctx, 0)
            state = (ctypes.c_uint8 * size)()
            llama_cpp.llama_state_seq_get_data(ctx, state, size, 0)
            ms, _ = timed_eval(tokens[p:n])
            suf.append(ms)

            llm.reset()
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            t0 = time.perf_counter()
            if llama_cpp.llama_state_seq_set_data(ctx, state, size, 0) != size:
                sys.exit("ttft_bench: llama_state_seq_set_data did not take the prefix")
            load.append((time.perf_counter() - t0) * 1e3)
            llm.n_tokens = p
            llm.input_ids[:p] = tokens[:p]
            _, first_cached = timed_eval(tokens[p:n])
            same = same and first_cached == first_rec
            diffs.append(float(np.max(np.abs(logits() - ref))))
            if run == 0 and args.decode_tokens > 0:
                t0 = time.perf_counter()
                nxt = first_cached
                for _ in range(args.decode_tokens):
                    llm.eval([nxt])
                    nxt = int(np.argmax(logits()))
                decode.append(args.decode_tokens / (time.perf_counter() - t0))
            print(f"N={n} run {run + 1}: recompute {rec[-1]:.1f} ms, suffix {suf[-1]:.1f} ms, "
                  f"load {load[-1]:.2f} ms ({size} B)", file=sys.stderr)
        results[n] = {"recompute_ms": rec, "suffix_ms": suf, "load_ms": load,
                      "load_bytes": size, "restored_same_top1": same,
                      "restored_max_logit_diff": max(diffs), "decode_tokens_per_s": decode}
    return results


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", help="the GGUF file (default: what fetch_model.sh prints)")
    ap.add_argument("--sizes", default="512,1024,2048,4096")
    ap.add_argument("--suffix", type=int, default=32, help="uncached tokens at the end")
    ap.add_argument("--block-tokens", type=int, default=32)
    ap.add_argument("--runs", default="5",
                    help="llama.cpp runs per size: one number, or one per size (5,5,3,1)")
    ap.add_argument("--fetch-runs", type=int, default=11, help="fetches per path and size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=16,
                    help="greedy tokens decoded after the first (one run per size; 0: none)")
    ap.add_argument("--fetch-only", action="store_true", help="the kvcached side alone")
    ap.add_argument("--json", help="write every sample here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.suffix <= 0 or args.suffix % args.block_tokens:
        sys.exit("ttft_bench: --suffix must be a positive multiple of --block-tokens")
    prefixes = [n - args.suffix for n in sizes]
    if min(prefixes) <= 0:
        sys.exit("ttft_bench: every size must be longer than --suffix")
    if not args.fetch_only and not args.model:
        args.model = subprocess.run(["bash", os.path.join(ROOT, "tests/eval/fetch_model.sh")],
                                    capture_output=True, text=True, check=True).stdout.strip()

    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    fetch = run_fetch_side(args, prefixes)
    llama = {} if args.fetch_only else run_llama_side(args, sizes)
    load1 = os.getloadavg()

    print(f"{started}: {os.cpu_count()} CPUs, load "
          f"{' '.join(f'{x:.2f}' for x in load0)} at start, "
          f"{' '.join(f'{x:.2f}' for x in load1)} at end; S = {args.suffix}, "
          f"{args.block_tokens}-token blocks, medians of {args.runs} llama.cpp runs and "
          f"{args.fetch_runs} fetches")
    print()
    print("| N | P cached | bytes | recompute ms | shm fetch ms | suffix ms | cached ms "
          "(fetch + suffix) | speedup | load ms | gRPC fetch ms | INT8 blocks | "
          "lossy shm ms | INT8 gRPC bytes | INT8 gRPC ms (decode) | memcpy ms | "
          "decode tok/s |")
    print("|" + "---:|" * 16)
    for n, p in zip(sizes, prefixes):
        f = {path: fetch[(p, path)] for path in
             ("shm-raw", "grpc-raw", "shm-lossy", "grpc-int8", "memcpy")}
        shm = f["shm-raw"]["median_ms"]
        ll = llama.get(n, {})
        rec, suf = med(ll.get("recompute_ms", [])), med(ll.get("suffix_ms", []))
        cached = shm + suf
        print(f"| {n} | {p} | {p * BYTES_PER_TOKEN / 1e6:.2f} MB | {rec:.1f} | {shm:.2f} | "
              f"{suf:.1f} | {cached:.1f} | {rec / cached:.1f}x | "
              f"{med(ll.get('load_ms', [])):.2f} | {f['grpc-raw']['median_ms']:.2f} | "
              f"{f['grpc-int8']['compressed_blocks']}/{f['grpc-int8']['blocks']} | "
              f"{f['shm-lossy']['median_ms']:.2f} | {f['grpc-int8']['bytes_moved'] / 1e6:.2f} MB "
              f"| {f['grpc-int8']['median_ms']:.2f} ({f['grpc-int8']['decode_median_ms']:.2f}) | "
              f"{f['memcpy']['median_ms']:.2f} | {med(ll.get('decode_tokens_per_s', [])):.0f} |")
    for n in sizes:
        if n in llama:
            print(f"N={n}: restored prefix + suffix gives the recompute's top-1 token: "
                  f"{llama[n]['restored_same_top1']}, max |logit diff| "
                  f"{llama[n]['restored_max_logit_diff']:.4f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"started": started, "load_start": load0, "load_end": load1,
                       "args": vars(args),
                       "fetch": [fetch[k] for k in sorted(fetch)],
                       "llama": {str(k): v for k, v in llama.items()}}, out, indent=1)


if __name__ == "__main__":
    main()
