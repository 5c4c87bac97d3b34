"""A numpy replica of what kvcached's budget mode does to one sequence's KV.

Contract. `budget_plan(cache, reports, policy, layout)` computes per block what the daemon's
compaction (server/core/importance_compaction.cc, PlanBudget and Compactor::Compact) decides and
stores for a model in budget mode (docs/importance.md, "Budget mode"), and what a fetch with
`accept_lossy` serves:

* scores per (layer, KV head, token) entry: ScoreTokens of the (layer, head)'s activity when the
  report had num_layers x num_kv_heads rows (each row scaled by its own largest unprotected mass,
  ObserveAttention), else of the token's activity (the rows summed, then scaled), with the
  token's position factor and the token's novelty (KeyNoveltyCpu averaged over heads and the
  novelty layers, computed per block); activity folded with DecayActivity as in daemon_rule.py;
* the precision of every entry (0 full, 1 INT8, 2 pruned, 3 INT4) from importance::AllocateBudget
  (server/importance/budget_allocation.cc, tests/eval/kv_policies.py allocate() literally): sinks
  and entries whose K or V row holds an Inf or NaN full, the recent window ranked above every
  other entry (in index order), the rest by score (ties: index order), quantize first, the
  reference's binary searches, budget = target_bytes x the raw block's bytes;
* the block stored raw when it holds only sinks, when nothing would be lossy, or when its
  version-2 encoding would not take a smaller pool chunk than the raw block (SlabPool's size
  classes); otherwise the exact version-2 bytes (server/importance/block_codec.h; the sizes are
  kv_quant.v2_block_bytes), decoded as the daemon does (kv_quant.apply_precision's arithmetic:
  INT8 q * (A / 127), INT4 lo + q * (hi - lo) / 15, in float32, rounded to FP16; pruned zero).

The served KV is a KvCache with every position and, per layer, a mask (kv_heads, positions)
that hides the entries pruned for that (layer, head); positions after the last whole block are
kept as the cache holds them (a worker recomputes them). `head_report()` builds the per-head
report a worker sends from the reference model's attention. daemon_path.py checks this replica
against the real daemon (daemon_path_test).

Not modelled: pinned ranges (AppendHints.protected_ranges), reports sent while the model was
in another mode (the daemon then keeps no per-head activity and scores with the token's), and
blocks shared by branches of different lengths (T is the end of the last whole block).
"""

import struct
from dataclasses import dataclass

import numpy as np

import daemon_rule as dr
import kv_quant as kq
import smollm_reference as sr

FULL, INT8, PRUNED, INT4 = 0, 1, 2, 3
VERSION = 2


# --- per-head attention reports ----------------------------------------------------------------

def report_rows_hook(kv_heads, queries=64):
    """(hook, rows) for SmolLM.forward(attention_hook=hook): rows[layer] becomes the float32
    (kv_heads, positions) rows a worker reports for that layer, the attention mass each position
    received from the last `queries` queries of the pass, averaged over those queries and the
    query heads sharing the KV head (query head q reads KV head q // (heads / kv_heads))."""
    rows = {}

    def hook(layer, p):  # p: (heads, queries of the pass, positions)
        heads, _, positions = p.shape
        g = p[:, -queries:, :].reshape(kv_heads, heads // kv_heads, -1, positions)
        rows[layer] = g.astype(np.float64).mean(axis=(1, 2)).astype(np.float32)

    return hook, rows


def head_report(rows):
    """The report of report_rows_hook's rows: float32 (num_layers * kv_heads, positions), row
    layer * kv_heads + head, as ReportAttention carries it (with num_layers = the layer count)."""
    return np.concatenate([rows[i] for i in range(len(rows))]).astype(np.float32)


def prefix_with_head_report(model, tokens, queries=64):
    """Runs the prefix through the reference model; returns (logits, cache, per-head report)."""
    hook, rows = report_rows_hook(model.config.kv_heads, queries)
    logits, cache, _ = model.forward(tokens, attention_hook=hook)
    return logits, cache, head_report(rows)


# --- the version-2 codec ----------------------------------------------------------------------

def _pad(b):
    return b + bytes(-len(b) % 4)


def _int8_ranges(x, axis):
    return np.abs(x).max(axis=axis).astype(np.float32)


def _quant_int8(x, a):
    """QuantInt8: x (float32), a broadcastable ranges; q = rint(clamp(x * (127 / a))), 0 if a=0."""
    ok = a > 0
    inv = np.divide(np.float32(127), a, out=np.ones_like(a), where=ok).astype(np.float32)
    q = np.rint(np.clip((x * inv).astype(np.float32), -127, 127))
    return np.where(ok, q, 0).astype(np.int8)


def _dequant_int8(q, a):
    step = np.divide(a, np.float32(127)).astype(np.float32)
    return np.where(a > 0, (q.astype(np.float32) * step).astype(np.float32), np.float32(0))


def _int4_step(lo, hi):
    return ((hi - lo).astype(np.float32) / np.float32(15)).astype(np.float32)


def _quant_int4(x, lo, hi):
    step = _int4_step(lo, hi)
    ok = step > 0
    safe = np.where(ok, step, np.float32(1)).astype(np.float32)
    q = np.rint(np.clip(((x - lo).astype(np.float32) / safe).astype(np.float32), 0, 15))
    return np.where(ok, q, 0).astype(np.uint8)


def _dequant_int4(q, lo, hi):
    step = _int4_step(lo, hi)
    delta = (q.astype(np.float32) * step).astype(np.float32)
    return np.where(step > 0, (lo + delta).astype(np.float32), lo)


def _pack4(codes):
    c = codes.reshape(-1)
    if c.size % 2:
        c = np.concatenate([c, np.zeros(1, np.uint8)])
    return (c[0::2] | (c[1::2] << 4)).astype(np.uint8).tobytes()


def _unpack4(data, count):
    b = np.frombuffer(data, np.uint8)
    out = np.empty(b.size * 2, np.uint8)
    out[0::2], out[1::2] = b & 0xF, b >> 4
    return out[:count]


def block_size(layout, precision):
    """CompressedSizeV2 of an FP16 block with precision (layers, kv_heads, block_tokens)."""
    return kq.v2_block_bytes(np.asarray(precision).reshape(
        layout.num_layers, layout.num_kv_heads, layout.block_tokens), layout.head_dim)


def encode_block(block, precision, layout):
    """EncodeBlockV2: the version-2 bytes of an fp16 block (L, 2, H, bt, D) whose entry (layer,
    head, token) has precision[layer, head, token]."""
    p = np.asarray(precision, np.uint8).reshape(layout.num_layers, layout.num_kv_heads, -1)
    flat = p.reshape(-1)
    counts = [int(np.sum(flat == c)) for c in (FULL, INT8, PRUNED, INT4)]
    size = block_size(layout, p)
    out = [struct.pack("<IHH10I", dr.MAGIC, VERSION, dr.HEADER_BYTES, layout.num_layers,
                       layout.num_kv_heads, layout.head_dim, layout.block_tokens, dr.DTYPE_FP16,
                       counts[FULL], counts[INT8], counts[PRUNED], size, counts[INT4])]
    quads = np.concatenate([flat, np.zeros(-flat.size % 4, np.uint8)]).reshape(-1, 4)
    packed = quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6
    out.append(_pad(packed.astype(np.uint8).tobytes()))
    for layer in range(layout.num_layers):
        for h in range(layout.num_kv_heads):
            t = p[layer, h]
            full, i8, i4 = (np.flatnonzero(t == c) for c in (FULL, INT8, INT4))
            for kv in range(2):
                rows = block[layer, kv, h]  # (bt, D) fp16
                axis = 0 if kv == 0 else 1  # K per channel, V per token
                codes8 = codes4 = range8 = range4 = b""
                if i8.size:
                    x = rows[i8].astype(np.float32)
                    a = _int8_ranges(x, axis)
                    q = _quant_int8(x, a[None, :] if kv == 0 else a[:, None])
                    codes8, range8 = q.tobytes(), a.astype(np.float16).tobytes()
                if i4.size:
                    x = rows[i4].astype(np.float32)
                    lo, hi = x.min(axis=axis), x.max(axis=axis)
                    shape = (1, -1) if kv == 0 else (-1, 1)
                    codes4 = _pack4(_quant_int4(x, lo.reshape(shape), hi.reshape(shape)))
                    range4 = np.stack([lo, hi], axis=1).astype(np.float16).tobytes()
                out += [_pad(rows[full].tobytes()), _pad(codes8), _pad(codes4), _pad(range8),
                        _pad(range4)]
    data = b"".join(out)
    assert len(data) == size, (len(data), size)
    return data


def decode_block(data, layout):
    """ParseCompressedBlock + DecodeBlock of a version-2 encoding: (fp16 block (L, 2, H, bt, D),
    precision (L, H, bt)). Raises ValueError on what the daemon's parser refuses."""
    L, H, D, bt = layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_tokens
    if len(data) < dr.HEADER_BYTES:
        raise ValueError(f"KVQ1 v2: {len(data)} bytes, shorter than the header")
    (magic, version, header_bytes, layers, heads, dim, tokens, dtype, nf, n8, npr, payload,
     n4) = struct.unpack_from("<IHH10I", data)
    if (magic, version, header_bytes, dtype) != (dr.MAGIC, VERSION, dr.HEADER_BYTES,
                                                 dr.DTYPE_FP16):
        raise ValueError("KVQ1 v2: bad magic, version, header size or dtype")
    entries = L * H * bt
    if (layers, heads, dim, tokens) != (L, H, D, bt) or nf + n8 + npr + n4 != entries:
        raise ValueError(f"KVQ1 v2: shape {(layers, heads, dim, tokens)}, counts "
                         f"{(nf, n8, npr, n4)}")
    map_bytes = (entries + 3) // 4
    packed = np.frombuffer(data, np.uint8, map_bytes, dr.HEADER_BYTES)
    flat = np.stack([(packed >> (2 * j)) & 3 for j in range(4)], axis=1).reshape(-1)
    if np.any(flat[entries:]) or any(data[dr.HEADER_BYTES + map_bytes:
                                          dr.HEADER_BYTES + dr._pad4(map_bytes)]):
        raise ValueError("KVQ1 v2: bits set past the precision map's last entry")
    p = flat[:entries].reshape(L, H, bt).copy()
    if [int(np.sum(p == c)) for c in (FULL, INT8, PRUNED, INT4)] != [nf, n8, npr, n4]:
        raise ValueError("KVQ1 v2: the precision map disagrees with the header's counts")
    if payload != len(data) or payload != block_size(layout, p):
        raise ValueError(f"KVQ1 v2: payload_bytes {payload}, buffer {len(data)}")
    block = np.zeros((L, 2, H, bt, D), dtype=np.float16)
    off = dr.HEADER_BYTES + dr._pad4(map_bytes)

    def take(nbytes):  # the next section's bytes; sections are padded to 4
        nonlocal off
        if off + nbytes > len(data):
            raise ValueError(f"KVQ1 v2: a section runs past the {len(data)} bytes")
        a = np.frombuffer(data, np.uint8, nbytes, off)
        off += dr._pad4(nbytes)
        return a

    for layer in range(L):
        for h in range(H):
            t = p[layer, h]
            full, i8, i4 = (np.flatnonzero(t == c) for c in (FULL, INT8, INT4))
            for kv in range(2):
                rows = block[layer, kv, h]
                rows[full] = take(full.size * D * 2).view(np.float16).reshape(-1, D)
                q8 = take(i8.size * D).view(np.int8).reshape(-1, D)
                q4 = _unpack4(take((i4.size * D + 1) // 2).tobytes(), i4.size * D)
                nr8 = (D if i8.size else 0) if kv == 0 else i8.size
                a = take(2 * nr8).view(np.float16).astype(np.float32)
                nr4 = (D if i4.size else 0) if kv == 0 else i4.size
                r4 = take(4 * nr4).view(np.float16).astype(np.float32).reshape(-1, 2)
                shape = (1, -1) if kv == 0 else (-1, 1)
                if i8.size:
                    rows[i8] = _dequant_int8(q8, a.reshape(shape)).astype(np.float16)
                if i4.size:
                    lo, hi = r4[:, 0].reshape(shape), r4[:, 1].reshape(shape)
                    rows[i4] = _dequant_int4(q4.reshape(-1, D), lo, hi).astype(np.float16)
    if off != len(data):
        raise ValueError(f"KVQ1 v2: sections end at {off} of {len(data)} bytes")
    return block, p


def decode_any(data, layout):
    """Either version: (fp16 block, precision: (bt,) for version 1, (L, H, bt) for version 2)."""
    version = struct.unpack_from("<H", data, 4)[0] if len(data) >= 6 else 0
    return decode_block(data, layout) if version == VERSION else dr.decode_block(data, layout)


# --- the allocation ---------------------------------------------------------------------------

@dataclass
class Allocation:
    precision: np.ndarray  # uint8 (L, H, bt)
    bytes: int
    fits: bool
    promoted: int = 0


def allocate_budget(layout, scores, fixed, first, budget_bytes):
    """importance::AllocateBudget on one block: scores (float32), fixed (full whatever the
    budget) and first (ranked above every other entry), each (L, H, bt)."""
    shape = (layout.num_layers, layout.num_kv_heads, layout.block_tokens)
    s = np.asarray(scores, np.float32).reshape(-1)
    s = np.where(np.isfinite(s), s, np.float32(0))
    fixed = np.asarray(fixed, bool).reshape(-1)
    first = np.asarray(first, bool).reshape(-1)
    base = np.where(fixed, FULL, INT8).astype(np.uint8)
    free = np.flatnonzero(~fixed)
    ranked = free[~first[free]]
    order = np.concatenate([ranked[np.argsort(s[ranked], kind="stable")], free[first[free]]])
    n = order.size

    def with_(start, m, code, reversed_=False):
        p = start.copy()
        p[(order[::-1] if reversed_ else order)[:m]] = code
        return p

    def size(p):
        return block_size(layout, p.reshape(shape))

    def fits(p):
        return float(size(p)) <= budget_bytes

    def smallest(predicate):
        lo, hi = 0, n + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if mid <= n and predicate(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo if lo <= n else None

    promoted = 0
    if fits(base):
        over = smallest(lambda m: not fits(with_(base, m, FULL, True)))
        promoted = over - 1 if over is not None else n
        p = with_(base, promoted, FULL, True)
    else:
        m = smallest(lambda m: fits(with_(base, m, INT4)))
        if m is not None:
            p = with_(base, m, INT4)
        else:
            all4 = with_(base, n, INT4)
            m = smallest(lambda m: fits(with_(all4, m, PRUNED)))
            p = with_(all4, n if m is None else m, PRUNED)
    b = size(p)
    return Allocation(p.reshape(shape), b, float(b) <= budget_bytes, promoted)


# --- the sequence -----------------------------------------------------------------------------

@dataclass
class BudgetPlan:
    """What the daemon stores and serves in budget mode; lists have one entry per block."""
    precision: list      # np.uint8 (L, H, bt): the stored precision (raw: all FULL)
    compressed: list     # bool: stored as version 2
    stored_bytes: list   # int: encoding size, or the raw block size
    encoded: list        # bytes of the encoding, or None for a raw block
    decoded: list        # np.float16 (L, 2, H, bt, D): what a fetch with accept_lossy serves
    scores: list         # np.float32 (L, H, bt), or None for a block compaction never scores
    over_budget: list    # bool: compressed and still above target_bytes (budget_overruns)
    served: sr.KvCache   # every position, pruned entries masked per (layer, head)
    fp16_bytes: int = 0  # raw bytes of the whole blocks
    stored_total: int = 0
    footprint_total: int = 0  # pool memory (size classes) of what is stored
    no_saving_blocks: int = 0  # left raw because the copy would free no pool memory

    @property
    def entries(self):
        p = np.concatenate([x.reshape(-1) for x in self.precision]) if self.precision else \
            np.zeros(0, np.uint8)
        return {name: int(np.sum(p == code)) for name, code in
                (("full", FULL), ("int8", INT8), ("int4", INT4), ("pruned", PRUNED))}


def served_cache(blocks, precision, cache, layout):
    """A KvCache of fetched fp16 blocks (every position; mask False for the entries pruned in
    that (layer, head)), followed by the tokens of `cache` after the last whole block."""
    L, H, D = layout.num_layers, layout.num_kv_heads, layout.head_dim
    tail = len(blocks) * layout.block_tokens
    if blocks:
        kv = np.concatenate(blocks, axis=3).astype(np.float32)  # (L, 2, H, positions, D)
        keep = np.concatenate([np.asarray(p).reshape(L, H, -1) != PRUNED for p in precision], 2)
    else:
        kv = np.zeros((L, 2, H, 0, D), np.float32)
        keep = np.zeros((L, H, 0), bool)
    rest = np.asarray(cache.positions)[tail:].size
    out = sr.KvCache(positions=np.asarray(cache.positions).copy(), mask=[])
    for layer in range(L):
        out.k.append(np.concatenate([kv[layer, 0], cache.k[layer][:, tail:, :]], 1))
        out.v.append(np.concatenate([kv[layer, 1], cache.v[layer][:, tail:, :]], 1))
        out.mask.append(np.concatenate([keep[layer], np.ones((H, rest), bool)], 1))
    return out


def _fold_reports(reports, policy, layout, nblocks):
    """Per block: (token activity (bt,) or None, head activity (L*H, bt) or None)."""
    bt, L, H = layout.block_tokens, layout.num_layers, layout.num_kv_heads
    if isinstance(reports, np.ndarray):
        reports = [(reports, 0.0)]
    token = [None] * nblocks
    head = [None] * nblocks
    hl, w = policy.activity_half_life_seconds, policy.activity_weight
    for report, elapsed in reports:
        report = np.asarray(report, np.float32)
        report = report[None, :] if report.ndim == 1 else report
        per_head = H > 1 and report.shape[0] == L * H
        observed = dr.observe_attention(report, policy)  # the rows' sum, scaled
        rows = np.stack([dr.observe_attention(r, policy) for r in report]) if per_head else None
        for b in range(min(nblocks, observed.size // bt)):
            seen = token[b] is not None
            e = elapsed if seen else 0.0
            prev = token[b] if seen else np.zeros(bt, np.float32)
            token[b] = dr.decay_activity(prev, e, hl, observed[b * bt:(b + 1) * bt], w)
            if per_head:
                prev = head[b] if head[b] is not None else np.zeros((L * H, bt), np.float32)
                head[b] = dr.decay_activity(prev, e, hl, rows[:, b * bt:(b + 1) * bt], w)
    return token, head


def budget_plan(cache, reports, policy, layout, pool=None, seconds_to_compaction=0.0):
    """What the daemon stores and serves for this prefix in budget mode (see the contract).

    cache: smollm_reference.KvCache of the prefix (appended as FP16 blocks of
    layout.block_tokens); reports: one report, float32 (num_layers * num_kv_heads, tokens) per
    head (head_report) or (num_layers, tokens) per layer, or a list of (report, seconds since
    the previous one), folded in order; policy: a daemon_rule.Policy (target_bytes, weights,
    sinks, window, decay, novelty layers, activity options); layout: a daemon_rule.Layout;
    pool: a daemon_rule.Pool; seconds_to_compaction: activity fading from the last report to
    the compaction."""
    pool = pool or dr.Pool()
    if layout.num_layers != len(cache.k):
        raise ValueError("the layout's num_layers differs from the cache's")
    L, H, D, bt = layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_tokens
    blocks = dr.blocks_of(cache, layout)
    seq = len(blocks) * bt
    token_act, head_act = _fold_reports(reports, policy, layout, len(blocks))
    layers = dr.novelty_layers(policy, L)
    raw_footprint = dr.rounded_size(layout.block_bytes, pool)
    result = BudgetPlan([], [], [], [], [], [], [], None)
    budget = float(np.float64(policy.target_bytes) * np.float64(layout.block_bytes))
    hl = policy.activity_half_life_seconds
    for b, block in enumerate(blocks):
        t = np.arange(b * bt, (b + 1) * bt)
        raw = (np.zeros((L, H, bt), np.uint8), False, None)
        if np.all(t < policy.sink_tokens):  # FullyProtected in budget mode
            result.scores.append(None)
            result.over_budget.append(False)
        else:
            def faded(a):
                if a is None or seconds_to_compaction <= 0:
                    return a
                return dr.decay_activity(a, seconds_to_compaction, hl, 0, 0)

            nov = dr.block_novelty(block, layers)
            tact, hact = faded(token_act[b]), faded(head_act[b])
            scores = np.stack([dr.score_tokens(policy, b * bt, seq,
                                               hact[g] if hact is not None else tact, nov)
                               for g in range(L * H)]).reshape(L, H, bt)
            finite = np.isfinite(block.astype(np.float32)).all(axis=(1, 4))  # (L, H, bt)
            fixed = (t < policy.sink_tokens)[None, None, :] | ~finite
            first = np.broadcast_to(dr._structurally_protected(t, seq, policy), (L, H, bt))
            a = allocate_budget(layout, scores, fixed, first, budget)
            result.scores.append(scores)
            result.over_budget.append(not a.fits)
            if np.any(a.precision != FULL):
                if dr.rounded_size(a.bytes, pool) >= raw_footprint:
                    result.no_saving_blocks += 1
                    result.over_budget[-1] = False
                else:
                    raw = (a.precision, True, encode_block(block, a.precision, layout))
            else:
                result.over_budget[-1] = False
        precision, compressed, data = raw
        if compressed:
            decoded, parsed = decode_block(data, layout)
            assert np.array_equal(parsed, precision)
        else:
            result.over_budget[-1] = False
            decoded = block
        result.precision.append(precision)
        result.compressed.append(compressed)
        result.encoded.append(data)
        result.stored_bytes.append(len(data) if compressed else layout.block_bytes)
        result.decoded.append(decoded)
    result.served = served_cache(result.decoded, result.precision, cache, layout)
    result.fp16_bytes = len(blocks) * layout.block_bytes
    result.stored_total = sum(result.stored_bytes)
    result.footprint_total = sum(dr.rounded_size(s, pool) for s in result.stored_bytes)
    return result
