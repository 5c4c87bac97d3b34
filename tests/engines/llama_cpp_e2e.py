"""One llama-cpp-python process of the kvcache.llama_cpp end-to-end run (llama_cpp_e2e.sh).

Serves prompts that share a long prefix, one at a time, greedy, with a fresh context for each
timed prompt (``Llama.reset()``: nothing carried over in-process unless --mode local), and
writes a JSON of per-prompt TTFT, outputs and cache counters. Modes:
  none     no cache: every prompt computed from scratch
  local    the Llama's own context reuse, the upper bound: the prefix is computed once
           (untimed), then each prompt reuses it in-process
  disk     llama-cpp-python's LlamaDiskCache in --cache-dir
  kvcache  kvcache.llama_cpp.KvcacheLlamaCache on --target
--role A serves the "A" questions (and stores), --role B the "B" questions (same prefix,
other questions, so B's hits are the shared prefix only); --role all serves both.
"""

import argparse
import json
import os
import statistics
import sys
import time

QUESTIONS_A = ["Summarize the story in one sentence:", "Who is the main character?",
               "What grew in the garden?", "Name one danger on the island:"]
QUESTIONS_B = ["Write a title for this story:", "What never arrived?",
               "Describe the winters:", "What is the island known for?"]


def build_prompts(llm, prefix_tokens, questions):
    base = ("The history of the lighthouse keeper's island is long and full of storms, "
            "shipwrecks, letters that never arrived, and a small garden of potatoes and onions "
            "that survived every winter. ")
    text, i = "", 0
    while len(llm.tokenize(text.encode())) < prefix_tokens + 50:
        text += f"Chapter {i}. " + base
        i += 1
    prefix = llm.tokenize(text.encode())[:prefix_tokens]
    return [prefix + llm.tokenize((" " + q).encode(), add_bos=False) for q in questions]


def complete(llm, prompt, max_tokens):
    """(seconds to the first token, the completion's text)."""
    t0 = time.perf_counter()
    ttft, parts = None, []
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0,
                                       top_k=1, seed=0, stream=True):
        if ttft is None:
            ttft = time.perf_counter() - t0
        parts.append(chunk["choices"][0]["text"])
    return ttft, "".join(parts), time.perf_counter() - t0


def run(args):
    t0 = time.time()
    from llama_cpp import Llama
    llm = Llama(model_path=args.model, n_ctx=args.n_ctx, n_threads=args.threads,
                n_threads_batch=args.threads, seed=0, verbose=False)
    cache = None
    if args.mode == "disk":
        from llama_cpp import LlamaDiskCache
        cache = LlamaDiskCache(cache_dir=args.cache_dir)
    elif args.mode == "kvcache":
        import logging
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
        from kvcache.llama_cpp import KvcacheLlamaCache
        cache = KvcacheLlamaCache(llm, args.target, block_tokens=args.block_tokens,
                                  timeout=args.timeout)
    if cache is not None:
        llm.set_cache(cache)
    load_s = time.time() - t0
    n = args.prompts
    questions = {"A": QUESTIONS_A[:n], "B": QUESTIONS_B[:n],
                 "all": QUESTIONS_A[:n] + QUESTIONS_B[:n]}[args.role]
    prompts = build_prompts(llm, args.prefix_tokens, questions)
    if args.mode == "local":  # compute the shared prefix once, untimed
        complete(llm, prompts[0][:args.prefix_tokens], 1)
    rows = []
    for q, p in zip(questions, prompts):
        if args.mode != "local":
            llm.reset()  # a fresh context: what this process computed before is not reused
        ttft, text, total = complete(llm, p, args.max_tokens)
        row = {"question": q, "prompt_tokens": len(p), "ttft_s": ttft, "total_s": total,
               "text": text}
        if args.mode == "kvcache":
            c = cache.counters
            row.update(load_s=c.last_load_s, save_s=c.last_save_s)
        rows.append(row)
        print(f"{args.tag}: {len(p)} tokens, TTFT {ttft * 1e3:.1f} ms, {text!r}", flush=True)
    result = {"tag": args.tag, "mode": args.mode, "role": args.role, "model_load_s": load_s,
              "rows": rows, "ttft_median_s": statistics.median(r["ttft_s"] for r in rows)}
    if args.mode == "kvcache":
        result["counters"] = vars(cache.counters)
        result["model_id"] = cache.model_id
        result["disabled_reason"] = cache.disabled_reason
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def summarize(paths):
    runs = {}
    for p in paths:
        r = json.load(open(p))
        runs[r["tag"]] = r
    ref = {row["question"]: row["text"] for row in runs["recompute"]["rows"]}
    base = runs["recompute"]["ttft_median_s"]
    print(f"{'run':<14} {'prompts':>7} {'TTFT median':>12} {'vs recompute':>13} "
          f"{'outputs = recompute':>20}")
    ok = True
    for tag, r in runs.items():
        same = all(row["text"] == ref.get(row["question"]) for row in r["rows"])
        ok = ok and same
        print(f"{tag:<14} {len(r['rows']):>7} {r['ttft_median_s'] * 1e3:>9.1f} ms "
              f"{base / r['ttft_median_s']:>12.2f}x {str(same):>20}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["none", "local", "disk", "kvcache"])
    ap.add_argument("--role", choices=["A", "B", "all"], default="all")
    ap.add_argument("--tag")
    ap.add_argument("--out")
    ap.add_argument("--model")
    ap.add_argument("--target", default="unix:///tmp/kvcached.sock")
    ap.add_argument("--cache-dir", default="llama-disk-cache")
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=4, help="questions per role (at most 4)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--summarize", nargs="+", metavar="JSON")
    args = ap.parse_args()
    if args.summarize:
        sys.exit(0 if summarize(args.summarize) else 1)
    run(args)


if __name__ == "__main__":
    main()
