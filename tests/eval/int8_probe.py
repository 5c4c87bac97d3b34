#!/usr/bin/env python3
"""A first probe of the daemon's INT8 KV on the real model, before the evaluation mode exists.

For each text file: the first --prefix tokens are run through the reference model
(smollm_reference.py) and their KV is stored as the daemon would store it, once as FP16 (the raw
layout) and once INT8-encoded as server/importance/block_codec.h does (keys per channel over each
block of --block-tokens tokens, values per token, both symmetric, decoded back to FP16). The next
--continuation tokens are then teacher-forced on each cache, and compared with the same
continuation on the full-precision cache: top-1 next-token agreement, and the perplexity of the
true continuation relative to full precision.

One sample per text, not medians over many prompts: the evaluation (docs/testing.md, "The real
model") replaces this probe. Tokenizes with llama-cpp-python's tokenizer (vocabulary only).

Usage: int8_probe.py MODEL.gguf TEXT_FILE... [--prefix 512] [--continuation 256]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smollm_reference as sr  # noqa: E402


def fp16(x):
    return x.astype(np.float16).astype(np.float32)


def symmetric_int8(x, axis):
    """Quantizes x symmetrically with one scale per slice along `axis` and decodes it back."""
    scale = np.abs(x).max(axis=axis, keepdims=True) / 127.0
    scale[scale == 0] = 1
    return np.clip(np.round(x / scale), -127, 127) * scale


def stored(cache, int8, block_tokens):
    """The cache as the daemon serves it: FP16, or INT8 encoded and decoded to FP16."""
    out = sr.KvCache(positions=cache.positions)
    for k, v in zip(cache.k, cache.v):
        k, v = fp16(k), fp16(v)  # (kv_heads, positions, head_dim)
        if int8:
            k = np.concatenate([symmetric_int8(k[:, s:s + block_tokens, :], axis=1)
                                for s in range(0, k.shape[1], block_tokens)], axis=1)
            v = symmetric_int8(v, axis=2)
        out.k.append(fp16(k))
        out.v.append(fp16(v))
    return out


def mean_nll(logits, targets):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -float(np.mean(log_probs[np.arange(len(targets)), targets]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("texts", nargs="+")
    parser.add_argument("--prefix", type=int, default=512)
    parser.add_argument("--continuation", type=int, default=256)
    parser.add_argument("--block-tokens", type=int, default=16)
    args = parser.parse_args()
    try:
        from llama_cpp import Llama
    except ImportError:
        sys.exit("int8_probe.py tokenizes with llama-cpp-python: pip install llama-cpp-python")
    tokenizer = Llama(model_path=args.model, vocab_only=True, verbose=False)
    model = sr.SmolLM(args.model)
    for path in args.texts:
        with open(path, "rb") as f:
            ids = tokenizer.tokenize(f.read(), add_bos=False)
        if len(ids) < args.prefix + args.continuation:
            print(f"{path}: {len(ids)} tokens, fewer than prefix + continuation; skipped")
            continue
        prefix = ids[:args.prefix]
        cont = ids[args.prefix:args.prefix + args.continuation]
        _, cache, _ = model.forward(prefix)
        full, _, _ = model.forward(cont, cache=cache)
        targets = np.asarray(cont[1:])
        for label, int8 in (("fp16", False), ("int8", True)):
            logits, _, _ = model.forward(cont, cache=stored(cache, int8, args.block_tokens))
            agree = float(np.mean(logits.argmax(-1) == full.argmax(-1)))
            ppl = np.exp(mean_nll(logits[:-1], targets) - mean_nll(full[:-1], targets))
            print(f"{os.path.basename(path)} {label}: top-1 agreement {agree * 100:.2f}% over "
                  f"{len(cont)} tokens after a {len(prefix)}-token prefix; perplexity x{ppl:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
