#!/usr/bin/env python3
"""A reference forward pass of SmolLM2-135M-Instruct (GGUF, Llama architecture) in numpy.

The fidelity evaluation's model (docs/testing.md, "The real model"): it runs the model from the
GGUF file tests/eval/fetch_model.sh fetches, dequantizing every weight to float32 once, and exposes
what the evaluation needs that an inference engine hides:

* per layer, the K (after RoPE) and V it produces for every position, by KV head;
* per layer, the attention probabilities it computes, by query head;
* decoding from a KV cache that the caller supplies (full, or as the daemon would serve it:
  dequantized INT8, or pruned, with the kept positions).

The forward pass is checked against llama-cpp-python (an independent implementation of the
same model) with `--check`; fidelity.py is the evaluation built on it. Measured: against llama.cpp running the same weights as F32 (`--write-f32`, then
`--oracle-model`), 56/56 top-1 agreement and max |logit difference| 0.021 on three prompts
(chat, code, prose); against llama.cpp on the Q4_1 file itself, whose CPU matmuls quantize the
activations to 8 bits, 54/56 and 1.36.

Usage:
  smollm_reference.py MODEL.gguf --tokens 1,504,3303   logits' top-5 after the last token
  smollm_reference.py MODEL.gguf --write-f32 OUT.gguf  the same weights as F32, for --oracle-model
  smollm_reference.py MODEL.gguf [--oracle-model OUT.gguf] --check "prompt" ...
                                                       compare with llama-cpp-python
  smollm_reference.py MODEL.gguf --verify tests/eval/data/smollm_reference_logits.json
                                                       compare with stored reference logits
Needs numpy and gguf (pip); --check also needs llama-cpp-python.
"""

import argparse
import json
import sys
from dataclasses import dataclass, field

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - a clear message instead of a trace
    sys.exit("smollm_reference.py needs the gguf package: pip install gguf numpy")


@dataclass
class Config:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_base: float
    eps: float


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    wq: np.ndarray  # (heads * head_dim, dim)
    wk: np.ndarray  # (kv_heads * head_dim, dim)
    wv: np.ndarray
    wo: np.ndarray  # (dim, heads * head_dim)
    ffn_norm: np.ndarray
    gate: np.ndarray  # (ffn, dim)
    up: np.ndarray
    down: np.ndarray  # (dim, ffn)


@dataclass
class KvCache:
    """Per layer: K (after RoPE) and V of shape (kv_heads, positions, head_dim), and the absolute
    position of each cached entry (a pruned cache keeps some positions only). `mask`, when set,
    holds per layer a bool array (kv_heads, positions): False hides that entry from that KV
    head's queries, for caches pruned per (layer, head) rather than per position."""

    k: list = field(default_factory=list)
    v: list = field(default_factory=list)
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    mask: list = None


def _field(reader, key):
    f = reader.fields[key]
    value = f.parts[f.data[0]]
    return value.tolist()[0] if len(value) == 1 else value.tolist()


class SmolLM:
    def __init__(self, path):
        reader = gguf.GGUFReader(path)
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch}, not llama")
        heads = _field(reader, "llama.attention.head_count")
        dim = _field(reader, "llama.embedding_length")
        self.config = Config(
            layers=_field(reader, "llama.block_count"),
            dim=dim,
            heads=heads,
            kv_heads=_field(reader, "llama.attention.head_count_kv"),
            head_dim=dim // heads,
            ffn=_field(reader, "llama.feed_forward_length"),
            vocab=_field(reader, "llama.vocab_size"),
            rope_base=float(_field(reader, "llama.rope.freq_base")),
            eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        )
        tensors = {t.name: t for t in reader.tensors}

        def weight(name):
            t = tensors[name]
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            return w.reshape([int(d) for d in reversed(t.shape.tolist())])

        self.embedding = weight("token_embd.weight")  # (vocab, dim)
        self.output = weight("output.weight") if "output.weight" in tensors else self.embedding
        self.output_norm = weight("output_norm.weight")
        self.layers = [
            LayerWeights(
                attn_norm=weight(f"blk.{i}.attn_norm.weight"),
                wq=weight(f"blk.{i}.attn_q.weight"),
                wk=weight(f"blk.{i}.attn_k.weight"),
                wv=weight(f"blk.{i}.attn_v.weight"),
                wo=weight(f"blk.{i}.attn_output.weight"),
                ffn_norm=weight(f"blk.{i}.ffn_norm.weight"),
                gate=weight(f"blk.{i}.ffn_gate.weight"),
                up=weight(f"blk.{i}.ffn_up.weight"),
                down=weight(f"blk.{i}.ffn_down.weight"),
            )
            for i in range(self.config.layers)
        ]
        c = self.config
        self._inv_freq = c.rope_base ** (-np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim)

    def _norm(self, x, w):
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.config.eps)) * w

    def _rope(self, x, positions):
        # x: (heads, n, head_dim). GGUF stores Llama's Q and K permuted so that RoPE rotates
        # adjacent pairs (llama.cpp's "normal" mode).
        angles = positions[:, None].astype(np.float64) * self._inv_freq[None, :]
        cos = np.cos(angles).astype(np.float32)
        sin = np.sin(angles).astype(np.float32)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def forward(self, tokens, cache=None, keep_attention=False, attention_hook=None,
                output_hook=None):
        """Runs `tokens` after what `cache` holds (None: an empty cache) and returns
        (logits of shape (len(tokens), vocab), the cache extended by these tokens, and per layer
        the attention probabilities (heads, len(tokens), cached + len(tokens)) if asked).
        attention_hook(layer, probabilities) and output_hook(layer, attention output of shape
        (heads, len(tokens), head_dim)) are called per layer when given, so a caller can reduce
        what it needs without keeping every layer's attention. The returned cache keeps `cache`'s
        mask, extended to show the new tokens to every head."""
        c = self.config
        cache = cache if cache is not None else KvCache()
        start = int(cache.positions.max()) + 1 if cache.positions.size else 0
        n = len(tokens)
        positions = np.arange(start, start + n)
        all_positions = np.concatenate([cache.positions, positions])
        x = self.embedding[np.asarray(tokens)]
        out_cache = KvCache(positions=all_positions)
        if cache.mask is not None:
            out_cache.mask = [np.concatenate([m, np.ones((c.kv_heads, n), dtype=bool)], axis=1)
                              for m in cache.mask]
        attention = []
        group = c.heads // c.kv_heads
        # A query sees every cached entry and the new tokens up to itself.
        mask = all_positions[None, :] > positions[:, None]
        cached = cache.positions.size
        for i, w in enumerate(self.layers):
            h = self._norm(x, w.attn_norm)
            q = (h @ w.wq.T).reshape(n, c.heads, c.head_dim).transpose(1, 0, 2)
            k = (h @ w.wk.T).reshape(n, c.kv_heads, c.head_dim).transpose(1, 0, 2)
            v = (h @ w.wv.T).reshape(n, c.kv_heads, c.head_dim).transpose(1, 0, 2)
            q = self._rope(q, positions)
            k = self._rope(k, positions)
            if cache.k:
                k = np.concatenate([cache.k[i], k], axis=1)
                v = np.concatenate([cache.v[i], v], axis=1)
            out_cache.k.append(k)
            out_cache.v.append(v)
            # Query heads h*group .. h*group+group-1 share KV head h: one matmul per KV head.
            kt = np.ascontiguousarray(k.transpose(0, 2, 1))  # (kv_heads, head_dim, total)
            scores = (q.reshape(c.kv_heads, group * n, c.head_dim) @ kt).reshape(
                c.heads, n, kt.shape[2])
            scores *= np.float32(1 / np.sqrt(c.head_dim))
            scores[:, mask] = -np.inf
            if cache.mask is not None:  # entries pruned for some KV heads only
                hidden = ~np.repeat(cache.mask[i], group, axis=0)  # (heads, cached)
                scores[:, :, :cached] = np.where(hidden[:, None, :], -np.inf,
                                                 scores[:, :, :cached])
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores, out=scores)
            p /= p.sum(axis=-1, keepdims=True)
            if keep_attention:
                attention.append(p)
            if attention_hook is not None:
                attention_hook(i, p)
            o = (p.reshape(c.kv_heads, group * n, -1) @ v).reshape(c.heads, n, c.head_dim)
            if output_hook is not None:
                output_hook(i, o)
            o = o.transpose(1, 0, 2).reshape(n, c.heads * c.head_dim)
            x = x + o @ w.wo.T
            h = self._norm(x, w.ffn_norm)
            g = h @ w.gate.T
            x = x + ((g / (1 + np.exp(-g))) * (h @ w.up.T)) @ w.down.T
        logits = self._norm(x, self.output_norm) @ self.output.T
        return logits, out_cache, attention


def write_f32_gguf(src, dst):
    """Writes `src` with every tensor dequantized to F32 (metadata kept): the weights this
    reference computes with, for llama.cpp to run as the oracle without quantizing activations."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=bytes(reader.fields["general.architecture"].parts[-1]).decode())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                writer.add_array(name, [bytes(f.parts[i]) for i in f.data])
            else:
                writer.add_array(name, [f.parts[i].tolist()[0] for i in f.data])
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(name, bytes(f.parts[f.data[0]]).decode())
        else:
            value = f.parts[f.data[0]].tolist()[0]
            writer.add_key_value(name, 0 if name == "general.file_type" else value, kind)
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, w.reshape([int(d) for d in reversed(t.shape.tolist())]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _check(model_path, model, prompts, tolerance):
    """Runs `prompts` through llama.cpp on `model_path` and through `model`; 0 when every logit
    is within `tolerance`."""
    try:
        from llama_cpp import Llama
    except ImportError:
        sys.exit("--check needs llama-cpp-python: pip install llama-cpp-python")
    oracle = Llama(model_path=model_path, logits_all=True, n_ctx=2048, verbose=False)
    worst = 0.0
    agree = 0
    total = 0
    for prompt in prompts:
        tokens = oracle.tokenize(prompt.encode(), add_bos=True)
        oracle.reset()
        oracle.eval(tokens)
        theirs = np.array(oracle.scores[: len(tokens)], dtype=np.float32)
        ours, _, _ = model.forward(tokens)
        diff = float(np.max(np.abs(ours - theirs)))
        same = int(np.sum(ours.argmax(-1) == theirs.argmax(-1)))
        worst = max(worst, diff)
        agree += same
        total += len(tokens)
        print(f"{len(tokens):4d} tokens  top-1 agree {same}/{len(tokens)}  max |dlogit| {diff:.3f}"
              f"  {prompt[:40]!r}")
    print(f"top-1 agreement {agree}/{total}, worst max |dlogit| {worst:.3f} (tolerance {tolerance})")
    return 0 if worst <= tolerance else 1


def verify_reference(model, path, tolerance):
    """Runs the prompts of a reference-logit file (tests/eval/data/) and compares: the same top-1
    token at every position, and every stored top-k logit within `tolerance`. 0 when all hold."""
    with open(path) as f:
        ref = json.load(f)
    failures = 0
    worst = 0.0
    positions = 0
    for prompt in ref["prompts"]:
        logits, _, _ = model.forward(prompt["tokens"])
        for i, (ids, values) in enumerate(zip(prompt["top_ids"], prompt["top_logits"])):
            positions += 1
            ours = logits[i][ids]
            diff = float(np.max(np.abs(ours - np.asarray(values, dtype=np.float32))))
            worst = max(worst, diff)
            if int(np.argmax(logits[i])) != ids[0] or diff > tolerance:
                failures += 1
                print(f"{prompt['name']} position {i}: top-1 {int(np.argmax(logits[i]))} "
                      f"(reference {ids[0]}), max |dlogit| over the reference top-{len(ids)} "
                      f"{diff:.4f}")
    print(f"{positions} positions of {len(ref['prompts'])} prompts against {ref['oracle']}: "
          f"{failures} failing, worst max |dlogit| {worst:.4f} (tolerance {tolerance})")
    return 0 if failures == 0 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", help="comma-separated token ids")
    parser.add_argument("--check", nargs="*", help="prompts to compare with llama-cpp-python")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="largest |logit difference| --check accepts")
    parser.add_argument("--oracle-model",
                        help="the GGUF llama.cpp runs for --check (default: MODEL). The same "
                             "weights as F32 take llama.cpp's quantized-activation matmuls out of "
                             "the comparison")
    parser.add_argument("--write-f32", metavar="OUT",
                        help="write MODEL with F32 weights to OUT (an --oracle-model) and exit")
    parser.add_argument("--verify", metavar="REFERENCE_JSON",
                        help="compare with stored reference logits (tests/eval/data/)")
    args = parser.parse_args()
    if args.write_f32:
        write_f32_gguf(args.model, args.write_f32)
        return 0
    model = SmolLM(args.model)
    if args.verify:
        return verify_reference(model, args.verify, args.tolerance)
    if args.check is not None:
        return _check(args.oracle_model or args.model, model,
                      args.check or ["The capital of France is"], args.tolerance)
    tokens = [int(t) for t in (args.tokens or "1").split(",")]
    logits, _, _ = model.forward(tokens)
    top = np.argsort(-logits[-1])[:5]
    print(" ".join(f"{t}:{logits[-1][t]:.3f}" for t in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
