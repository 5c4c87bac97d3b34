"""Quantizers and byte counts of the KV formats the fidelity evaluation compares.

Every quantizer returns the values a reader decodes, rounded to FP16 (the dtype the model's
KV is appended in), as float32. Rounding is half to even (np.rint), as the kernels'.

* INT8, symmetric: A = the group's largest magnitude, q = rint(clip(x * 127 / A, -127, 127)),
  decoded q * (A / 127); a group of zeros decodes to zeros (kvcache/kernels/quantize.h).
* INT4, asymmetric: m, M = the group's minimum and maximum, s = (M - m) / 15,
  q = rint(clip((x - m) / s, 0, 15)), decoded m + q * s; a constant group decodes to m.
Keys are grouped per channel over a block's tokens of one precision (one scale per (layer, KV
head, channel)), values per token (KIVI's grouping).

Byte counts (what a block stores, every section 4-byte aligned; D = head_dim):
* `v1_block_bytes`: the daemon's compressed format version 1 (server/importance/block_codec.h):
  one precision per token, shared by every layer and head.
* `v2_block_bytes`: version 2, one precision per (layer, KV head, token) and INT4: a 48-byte
  header, a 2-bit precision map over [layer][kv_head][token], then per (layer, KV head), K then
  V: full rows (D elements each), INT8 codes (D bytes each), INT8 ranges (the group's largest
  magnitude A, one element: K one per channel, D; V one per token), INT4 codes (D/2 bytes each),
  INT4 ranges (the group's minimum and maximum, two elements: K 2D; V 2 per token). Ranges are
  stored in the block's dtype: they are values of the group, so they are exact, and the scale
  a reader derives from them is the one the writer used.
The KV is appended as FP16, so the quantizers see FP16 values (`quantize` rounds first).
"""

import numpy as np

FULL, INT8, PRUNED, INT4 = 0, 1, 2, 3
HEADER_BYTES = 48


def fp16(x):
    return x.astype(np.float16).astype(np.float32)


def int8_sym(x, axis):
    x = fp16(x)
    a = np.abs(x).max(axis=axis, keepdims=True)
    safe = np.where(a > 0, a, np.float32(1))
    q = np.rint(np.clip(x * (np.float32(127) / safe), -127, 127))
    return fp16(np.where(a > 0, q * (safe / np.float32(127)), 0).astype(np.float32))


def int4_asym(x, axis):
    x = fp16(x)
    lo = x.min(axis=axis, keepdims=True)
    hi = x.max(axis=axis, keepdims=True)
    step = (hi - lo) / np.float32(15)
    safe = np.where(step > 0, step, np.float32(1))
    q = np.rint(np.clip((x - lo) / safe, 0, 15))
    return fp16(np.where(step > 0, lo + q * safe, lo).astype(np.float32))


def _pad4(n):
    return (n + 3) // 4 * 4


def v1_block_bytes(token_precision, layers, kv_heads, head_dim):
    """Bytes of one version-1 block; token_precision: (block_tokens,) of FULL/INT8/PRUNED."""
    t = len(token_precision)
    nf = int(np.sum(token_precision == FULL))
    n8 = int(np.sum(token_precision == INT8))
    per_kv = (_pad4(kv_heads * nf * head_dim * 2) + _pad4(kv_heads * n8 * head_dim))
    scales = (kv_heads * head_dim * 4 + kv_heads * n8 * 4) if n8 else 0
    return HEADER_BYTES + _pad4(t) + layers * (2 * per_kv + scales)


def v2_block_bytes(precision, head_dim, element_bytes=2):
    """Bytes of one version-2 block; precision: (layers, kv_heads, block_tokens)."""
    layers, kv_heads, t = precision.shape
    nf = np.sum(precision == FULL, axis=2)
    n8 = np.sum(precision == INT8, axis=2)
    n4 = np.sum(precision == INT4, axis=2)
    pad = lambda a: (a + 3) // 4 * 4  # noqa: E731
    e = element_bytes
    rows = pad(nf * head_dim * e) + pad(n8 * head_dim) + pad((n4 * head_dim + 1) // 2)
    ranges_k = pad(np.where(n8 > 0, head_dim * e, 0)) + pad(np.where(n4 > 0, 2 * head_dim * e, 0))
    ranges_v = pad(n8 * e) + pad(n4 * 2 * e)
    per_group = 2 * rows + ranges_k + ranges_v
    return HEADER_BYTES + _pad4((layers * kv_heads * t * 2 + 7) // 8) + int(per_group.sum())


def apply_precision(k, v, precision, block_tokens):
    """The KV a reader decodes from one layer's K, V (kv_heads, positions, D) stored with
    `precision` (kv_heads, positions) of FULL/INT8/INT4/PRUNED, blocks of block_tokens
    positions. Returns (k, v, kept): pruned entries keep their values and kept is False."""
    ko, vo = fp16(k), fp16(v)
    v8, v4 = int8_sym(v, axis=2), int4_asym(v, axis=2)
    vo = np.where((precision == INT8)[..., None], v8, vo)
    vo = np.where((precision == INT4)[..., None], v4, vo)
    heads, n, _ = k.shape
    for start in range(0, n, block_tokens):
        end = min(n, start + block_tokens)
        for h in range(heads):
            p = precision[h, start:end]
            for code, quant in ((INT8, int8_sym), (INT4, int4_asym)):
                idx = np.nonzero(p == code)[0]
                if idx.size:
                    ko[h, start + idx] = quant(k[h, start + idx], axis=0)
    return ko, vo, precision != PRUNED
