"""A numpy replica of what kvcached does to one sequence's KV under its importance policy (v1).

Contract. Given a model layout, the prefix KV a worker appends (a smollm_reference.KvCache,
stored as FP16 blocks of `block_tokens` tokens), the attention report(s) the worker sends with
ReportAttention, and the model's policy, `plan()` computes per block what the daemon's
compaction (server/core/importance_compaction.cc, Compactor::Compact) decides and stores, and what a
fetch with `accept_lossy` then serves:

* the precision map (0 full, 1 INT8, 2 pruned) and whether the block is compressed at all;
* the stored bytes: the exact KVQ1 v1 encoding (server/importance/block_codec.h), byte for
  byte, or the raw block when the daemon leaves it raw;
* the served KV: the decoding of those bytes (full tokens bit-exact, INT8 as fp16(q * scale),
  pruned tokens zero), and a KvCache of it with the pruned positions removed.

The arithmetic follows the C++ step by step, in float32 where it uses float and float64 where it
uses double, so the decisions and bytes match bit for bit: ReportAttention sums the rows in
float32 (ObserveAttention scales by the largest mass of a token that is not structurally
protected in the report's own length), DecayActivity (double), KeyNoveltyCpu (8-lane float32
dot products, 1 - cos in double, per head then per novelty layer in float32),
kernels::PositionFactor (glibc's expf via ctypes) with T = the end of the last cached block,
ScoreTokens, SelectByMass (ties: the later token first), KeepNonFiniteTokensFull, blocks wholly
protected left alone, blocks whose compressed copy would not take a smaller pool chunk left raw
(SlabPool::RoundedSize), and QuantizeInt8Cpu / DequantizeInt8Cpu (keys per channel over the
block's INT8 tokens, values per token, f32 scales, round half to even).

Only whole blocks are stored; tokens after the last whole block are served as the cache holds
them (a worker recomputes them). `target_mass_for_budget()` finds the target mass whose stored
bytes come closest to a budget without exceeding it. daemon_path.py checks this replica against
the real daemon (daemon_path_test).
"""

import ctypes
import ctypes.util
import struct
from dataclasses import dataclass, field

import numpy as np

import smollm_reference as sr

FULL, INT8, PRUNED = 0, 1, 2
MAGIC = 0x3151564B  # "KVQ1"
HEADER_BYTES = 48
DTYPE_FP16 = 1  # kvcache.v1.DType


@dataclass
class Layout:
    """kvcache.v1.ModelLayout (FP16 only)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_tokens: int = 16

    @property
    def block_bytes(self):
        return self.num_layers * 2 * self.num_kv_heads * self.block_tokens * self.head_dim * 2


@dataclass
class Policy:
    """A model's ImportancePolicy plus the cache-wide ImportanceOptions the decision reads."""
    mode: str = "prune"  # "quantize" or "prune" ("off" stores everything raw); "budget":
    #                      daemon_budget_rule.budget_plan
    alpha: float = 0.6
    beta: float = 0.3
    gamma: float = 0.1
    target_mass: float = 0.95
    target_bytes: float = 0.37  # budget mode: share of a raw block's bytes a compressed one may take
    sink_tokens: int = 4
    recent_window: int = 64
    decay_tau: float = 256.0
    novelty_layers: tuple = ()  # empty: the daemon's default, up to 4 evenly spaced layers
    activity_weight: float = 0.5
    activity_half_life_seconds: float = 600.0


@dataclass
class Pool:
    """The host tier's slab pool shape (host_tier.slab_bytes, host_tier.min_class_bytes)."""
    slab_bytes: int = 4 << 20
    min_class_bytes: int = 64


@dataclass
class Plan:
    """What the daemon stores and serves for one sequence; lists have one entry per block."""
    precision: list          # np.uint8 (block_tokens,): the stored precision (raw: all FULL)
    compressed: list         # bool: stored as KVQ1
    stored_bytes: list       # int: KVQ1 size, or the raw block size
    encoded: list            # bytes of the KVQ1 encoding, or None for a raw block
    decoded: list            # np.float16 (L, 2, H, bt, D): what a fetch with accept_lossy serves
    scores: list             # np.float32 (bt,) or None for a block compaction never scores
    served: sr.KvCache       # the served KV, pruned positions removed, then the uncached tail
    fp16_bytes: int = 0      # raw bytes of the whole blocks
    stored_total: int = 0
    footprint_total: int = 0  # pool memory (size classes) of what is stored

    @property
    def tokens(self):
        p = np.concatenate(self.precision) if self.precision else np.zeros(0, np.uint8)
        return {"full": int(np.sum(p == FULL)), "int8": int(np.sum(p == INT8)),
                "pruned": int(np.sum(p == PRUNED))}


# --- attention reports ------------------------------------------------------------------------

def attention_report_hook(queries=64):
    """(hook, rows) for SmolLM.forward(attention_hook=hook): rows[layer] becomes the report row a
    worker sends, the attention mass each position received from the last `queries` queries of
    the pass, averaged over those queries and all heads (float32)."""
    rows = {}

    def hook(layer, p):  # p: (heads, queries of the pass, positions)
        rows[layer] = p[:, -queries:, :].astype(np.float64).mean(axis=(0, 1)).astype(np.float32)

    return hook, rows


def prefix_with_report(model, tokens, queries=64):
    """Runs the prefix through the reference model; returns (logits, cache, report) with report
    a float32 array (num_layers, len(tokens)) as ReportAttention carries it."""
    hook, rows = attention_report_hook(queries)
    logits, cache, _ = model.forward(tokens, attention_hook=hook)
    return logits, cache, np.stack([rows[i] for i in range(len(rows))])


def _structurally_protected(t, seq, p):
    return (t < p.sink_tokens) | (t >= seq - p.recent_window)


def observe_attention(report, policy):
    """ReportAttention + importance::ObserveAttention: the rows summed in float32, scaled by the
    largest mass of a token not structurally protected in a sequence of the report's length,
    clamped to 1 (all-protected mass: scaled by the overall maximum)."""
    report = np.asarray(report, dtype=np.float32)
    if report.ndim == 1:
        report = report[None, :]
    if not np.all(np.isfinite(report)) or np.any(report < 0):
        raise ValueError("the daemon refuses a report with a negative or non-finite value")
    mass = np.zeros(report.shape[1], dtype=np.float32)
    for row in report:
        mass += row
    n = mass.size
    t = np.arange(n)
    unprotected = mass[~_structurally_protected(t, n, policy)]
    top = np.float32(unprotected.max()) if unprotected.size else np.float32(0)
    if not top > 0:
        top = np.float32(mass.max()) if n else np.float32(0)
        return mass / top if top > 0 else mass
    return np.minimum(np.float32(1), mass / top)


def decay_activity(previous, elapsed, half_life, observed, weight):
    """importance::DecayActivity, elementwise (double arithmetic, float result)."""
    a = np.clip(np.nan_to_num(np.asarray(previous, np.float32).astype(np.float64), nan=0.0,
                              posinf=0.0, neginf=0.0), 0.0, 1.0)
    if half_life > 0 and elapsed > 0:
        a = a * np.exp2(-elapsed / half_life)
    o = np.clip(np.asarray(observed, np.float32).astype(np.float64), 0.0, 1.0)
    w = min(max(float(np.float32(weight)), 0.0), 1.0)
    return np.clip(a + w * (o - a), 0.0, 1.0).astype(np.float32)


# --- scoring ----------------------------------------------------------------------------------

def _load_expf():
    name = ctypes.util.find_library("m")
    if name:
        try:
            fn = ctypes.CDLL(name).expf
            fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
            return lambda x: np.float32(fn(float(x)))
        except (OSError, AttributeError):
            pass
    return lambda x: np.float32(np.exp(np.float64(x)))  # correctly rounded; glibc agrees


_expf = _load_expf()


def position_factor(t, seq, policy):
    """kernels::PositionFactor (exponential decay) in float32."""
    if t < 0 or t >= seq:
        return np.float32(0)
    window_start = seq - policy.recent_window
    if t < policy.sink_tokens or t >= window_start:
        return np.float32(1)
    d = np.float32(window_start - t)
    return _expf(np.float32(-d) / np.float32(policy.decay_tau))


def novelty_layers(policy, num_layers):
    """NoveltyLayers: the configured layers that exist, else up to 4 evenly spaced ones."""
    layers = [l for l in policy.novelty_layers if l < num_layers]
    if layers:
        return layers
    if num_layers <= 4:
        return list(range(num_layers))
    return [(2 * i + 1) * num_layers // 8 for i in range(4)]


def _dot8(a, b):
    """internal::Dot over the last axis: 8 float32 lanes, combined pairwise."""
    prod = (a * b).astype(np.float32)
    n = prod.shape[-1]
    acc = np.zeros(prod.shape[:-1] + (8,), dtype=np.float32)
    full = n // 8 * 8
    for i in range(0, full, 8):
        acc += prod[..., i:i + 8]
    for j, i in enumerate(range(full, n)):
        acc[..., j] += prod[..., i]
    return ((acc[..., 0] + acc[..., 4]) + (acc[..., 1] + acc[..., 5])) + \
        ((acc[..., 2] + acc[..., 6]) + (acc[..., 3] + acc[..., 7]))


def key_novelty(keys):
    """kernels::KeyNoveltyCpu of one layer's keys (heads, tokens, head_dim) fp16."""
    k = keys.astype(np.float32)
    heads, tokens, _ = k.shape
    out = np.zeros(tokens, dtype=np.float32)
    norm2 = _dot8(k, k)                      # (heads, tokens)
    dots = _dot8(k[:, :-1, :], k[:, 1:, :])  # (heads, tokens - 1)
    for h in range(heads):
        na, nb, d = norm2[h, :-1], norm2[h, 1:], dots[h]
        ok = (na > 0) & (nb > 0)
        c = d.astype(np.float64) / np.sqrt(na.astype(np.float64) * nb.astype(np.float64),
                                           where=ok, out=np.ones_like(d, dtype=np.float64))
        c = np.clip(c, -1.0, 1.0)
        one_minus = np.where(ok, np.float32(1) - c.astype(np.float32), np.float32(1))
        out[1:] += one_minus.astype(np.float32)
    out[0] = 1
    out[1:] /= np.float32(heads)
    return out


def block_novelty(block, layers):
    """BlockKeyNovelty: KeyNoveltyCpu per layer (block (L, 2, H, bt, D)), averaged in float32."""
    total = np.zeros(block.shape[3], dtype=np.float32)
    for layer in layers:
        total += key_novelty(block[layer, 0])
    return total / np.float32(len(layers))


def score_tokens(policy, first, seq, activity, novelty):
    """importance::ScoreTokens in float32: fl(fl(fl(a*A) + fl(b*P)) + fl(g*N))."""
    def sanitise(x):
        x = np.asarray(x, dtype=np.float32)
        return np.where(np.isfinite(x) & (x > 0), x, np.float32(0)).astype(np.float32)

    n = len(novelty)
    act = np.zeros(n, np.float32) if activity is None else np.minimum(sanitise(activity), 1)
    nov = np.minimum(sanitise(novelty), np.float32(1))
    pos = np.array([position_factor(first + i, seq, policy) for i in range(n)], dtype=np.float32)
    a, b, g = np.float32(policy.alpha), np.float32(policy.beta), np.float32(policy.gamma)
    return ((a * act).astype(np.float32) + (b * pos).astype(np.float32)).astype(np.float32) + \
        (g * nov).astype(np.float32)


def select_by_mass(scores, target_mass, protect):
    """importance::SelectByMass: protected first, then by decreasing score, ties the later token
    first, until the kept mass (double) reaches target_mass of the total. Returns keep (bool)."""
    s = [float(v) if np.isfinite(v) and v > 0 else 0.0 for v in np.asarray(scores, np.float32)]
    keep = [bool(p) for p in protect]
    total = kept = 0.0
    for t, v in enumerate(s):
        total += v
        if keep[t]:
            kept += v
    order = sorted((t for t, v in enumerate(s) if not keep[t] and v > 0),
                   key=lambda t: (-s[t], -t))
    goal = target_mass * total
    for t in order:
        if kept >= goal:
            break
        keep[t] = True
        kept += s[t]
    return np.array(keep, dtype=bool)


# --- the KVQ1 block codec ---------------------------------------------------------------------

def _pad4(n):
    return (n + 3) & ~3


def compressed_size(layout, precision):
    """importance::CompressedSize of an FP16 block with this precision map."""
    nf = int(np.sum(precision == FULL))
    n8 = int(np.sum(precision == INT8))
    h, d = layout.num_kv_heads, layout.head_dim
    per_layer = 2 * _pad4(h * nf * d * 2) + 2 * _pad4(h * n8 * d)
    per_layer += (h * d * 4 if n8 else 0) + h * n8 * 4
    return HEADER_BYTES + _pad4(layout.block_tokens) + layout.num_layers * per_layer


def rounded_size(nbytes, pool):
    """SlabPool::RoundedSize: the pool memory an allocation of `nbytes` takes."""
    if nbytes == 0:
        return 0
    if nbytes <= pool.slab_bytes:
        b = max(pool.min_class_bytes, nbytes)
        p = 1 << (b.bit_length() - 1)
        if b == p:
            return p
        if p < 256:
            return 2 * p
        step = p // 4
        return p + (b - p + step - 1) // step * step
    return -(-nbytes // pool.slab_bytes) * pool.slab_bytes


def _quantize(x, axis):
    """QuantizeInt8Cpu of fp16 rows x (float32 view), groups reduced over `axis`."""
    amax = np.abs(x).max(axis=axis, keepdims=True).astype(np.float32)
    scale = (amax / np.float32(127)).astype(np.float32)
    inv = np.zeros_like(amax)
    np.divide(np.float32(127), amax, out=inv, where=amax > 0)
    q = np.rint(np.clip((x * inv).astype(np.float32), -127, 127)).astype(np.int8)
    return q, scale.squeeze(axis)


def encode_block(block, precision, layout):
    """EncodeBlock: the KVQ1 v1 bytes of an fp16 block (L, 2, H, bt, D) with this precision."""
    precision = np.asarray(precision, dtype=np.uint8)
    full = np.flatnonzero(precision == FULL)
    int8 = np.flatnonzero(precision == INT8)
    size = compressed_size(layout, precision)
    bt = layout.block_tokens
    out = [struct.pack("<IHH10I", MAGIC, 1, HEADER_BYTES, layout.num_layers, layout.num_kv_heads,
                       layout.head_dim, bt, DTYPE_FP16, len(full), len(int8),
                       bt - len(full) - len(int8), size, 0),
           precision.tobytes() + bytes(_pad4(bt) - bt)]

    def padded(b):
        return b + bytes(_pad4(len(b)) - len(b))

    for layer in range(layout.num_layers):
        for kv in range(2):
            rows = block[layer, kv]  # (H, bt, D) fp16
            if len(full):
                out.append(padded(np.ascontiguousarray(rows[:, full, :]).tobytes()))
            if len(int8):
                q, scale = _quantize(rows[:, int8, :].astype(np.float32), 1 if kv == 0 else 2)
                out.append(padded(q.tobytes()))
                out.append(scale.astype("<f4").tobytes())
    data = b"".join(out)
    assert len(data) == size, (len(data), size)
    return data


def decode_block(data, layout):
    """ParseCompressedBlock + DecodeBlock: an fp16 block (L, 2, H, bt, D) and the precision map.
    Raises ValueError on anything the daemon's parser would refuse."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"KVQ1: {len(data)} bytes, shorter than the header")
    (magic, version, header_bytes, layers, heads, dim, bt, dtype, nf, n8, npruned, payload,
     reserved) = struct.unpack_from("<IHH10I", data)
    shape = (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_tokens)
    if (magic, version, header_bytes, reserved, dtype) != (MAGIC, 1, HEADER_BYTES, 0, DTYPE_FP16):
        raise ValueError("KVQ1: bad magic, version, header size, reserved field or dtype")
    if (layers, heads, dim, bt) != shape or nf + n8 + npruned != bt:
        raise ValueError(f"KVQ1: shape {(layers, heads, dim, bt)}, counts {(nf, n8, npruned)}")
    precision = np.frombuffer(data, np.uint8, bt, HEADER_BYTES).copy()
    if [int(np.sum(precision == v)) for v in (FULL, INT8, PRUNED)] != [nf, n8, npruned]:
        raise ValueError("KVQ1: the precision map disagrees with the header's counts")
    if payload != len(data) or payload != compressed_size(layout, precision):
        raise ValueError(f"KVQ1: payload_bytes {payload}, buffer {len(data)}")
    full = np.flatnonzero(precision == FULL)
    int8 = np.flatnonzero(precision == INT8)
    block = np.zeros((layers, 2, heads, bt, dim), dtype=np.float16)
    off = HEADER_BYTES + _pad4(bt)
    for layer in range(layers):
        for kv in range(2):
            if nf:
                block[layer, kv][:, full, :] = np.frombuffer(
                    data, np.float16, heads * nf * dim, off).reshape(heads, nf, dim)
                off += _pad4(heads * nf * dim * 2)
            if n8:
                q = np.frombuffer(data, np.int8, heads * n8 * dim, off).reshape(heads, n8, dim)
                off += _pad4(heads * n8 * dim)
                count = heads * dim if kv == 0 else heads * n8
                scale = np.frombuffer(data, "<f4", count, off).astype(np.float32)
                off += 4 * count
                scale = scale.reshape(heads, 1, dim) if kv == 0 else scale.reshape(heads, n8, 1)
                block[layer, kv][:, int8, :] = (q.astype(np.float32) * scale).astype(np.float16)
    return block, precision


# --- the sequence -----------------------------------------------------------------------------

def blocks_of(cache, layout):
    """The whole blocks a worker appends: fp16 arrays (L, 2, H, bt, D), in sequence order."""
    bt = layout.block_tokens
    n = cache.k[0].shape[1] // bt
    k = np.stack(cache.k).astype(np.float16)  # (L, H, positions, D)
    v = np.stack(cache.v).astype(np.float16)
    kv = np.stack([k, v], axis=1)             # (L, 2, H, positions, D)
    return [np.ascontiguousarray(kv[:, :, :, b * bt:(b + 1) * bt, :]) for b in range(n)]


def served_cache(blocks, precision, cache, layout):
    """A KvCache of fetched fp16 blocks without their pruned positions, followed by the tokens of
    `cache` after the last whole block (kept as the worker holds them)."""
    bt = layout.block_tokens
    if blocks:
        kv = np.concatenate(blocks, axis=3).astype(np.float32)  # (L, 2, H, positions, D)
        keep = np.flatnonzero(np.concatenate(precision) != PRUNED)
    else:
        kv = np.zeros((layout.num_layers, 2, layout.num_kv_heads, 0, layout.head_dim), np.float32)
        keep = np.zeros(0, dtype=np.int64)
    tail = len(blocks) * bt
    out = sr.KvCache(positions=np.concatenate([np.asarray(cache.positions)[keep],
                                               np.asarray(cache.positions)[tail:]]))
    for layer in range(layout.num_layers):
        out.k.append(np.concatenate([kv[layer, 0][:, keep, :], cache.k[layer][:, tail:, :]], 1))
        out.v.append(np.concatenate([kv[layer, 1][:, keep, :], cache.v[layer][:, tail:, :]], 1))
    return out


class Decider:
    """The target-independent part of a plan: per block the scores, protection and candidacy
    (computed once, so a bisection over target_mass only reruns SelectByMass)."""

    def __init__(self, cache, reports, policy, layout, pool=None, seconds_to_compaction=0.0):
        """reports: one report (num_layers, tokens) or a list of (report, seconds since the
        previous report); the daemon folds them in order. Blocks the reports do not cover keep
        no activity (score 0 for that term)."""
        if layout.num_layers != len(cache.k):
            raise ValueError("the layout's num_layers differs from the cache's")
        self.policy, self.layout, self.pool = policy, layout, pool or Pool()
        self.blocks = blocks_of(cache, layout)
        bt = layout.block_tokens
        seq = len(self.blocks) * bt  # the end of the deepest cached block
        if isinstance(reports, np.ndarray):
            reports = [(reports, 0.0)]
        activity = [None] * len(self.blocks)
        for report, elapsed in reports:
            observed = observe_attention(report, policy)
            for b in range(min(len(self.blocks), observed.size // bt)):
                prev = activity[b] if activity[b] is not None else np.zeros(bt, np.float32)
                activity[b] = decay_activity(prev, elapsed if activity[b] is not None else 0.0,
                                             policy.activity_half_life_seconds,
                                             observed[b * bt:(b + 1) * bt], policy.activity_weight)
        layers = novelty_layers(policy, layout.num_layers)
        self.scores, self.protect, self.candidate = [], [], []
        for b, block in enumerate(self.blocks):
            t = np.arange(b * bt, (b + 1) * bt)
            protect = _structurally_protected(t, seq, policy)
            self.protect.append(protect)
            self.candidate.append(policy.mode != "off" and not bool(protect.all()))
            if not self.candidate[-1]:
                self.scores.append(None)
                continue
            act = activity[b]
            if act is not None and seconds_to_compaction > 0:
                act = decay_activity(act, seconds_to_compaction, policy.activity_half_life_seconds,
                                     0, 0)
            self.scores.append(score_tokens(policy, b * bt, seq, act,
                                            block_novelty(block, layers)))
        self.non_finite = [~np.isfinite(bl.astype(np.float32)).reshape(-1, bt, layout.head_dim)
                           .any(axis=(0, 2)) for bl in self.blocks]

    def precision(self, target_mass):
        """Per block (precision map, compressed?) under `target_mass`."""
        out = []
        raw_footprint = rounded_size(self.layout.block_bytes, self.pool)
        for b in range(len(self.blocks)):
            bt = self.layout.block_tokens
            if not self.candidate[b]:
                out.append((np.zeros(bt, np.uint8), False))
                continue
            p = np.full(bt, INT8, dtype=np.uint8)
            p[self.protect[b]] = FULL
            if self.policy.mode == "prune":
                keep = select_by_mass(self.scores[b], target_mass, self.protect[b])
                p[~keep & ~self.protect[b]] = PRUNED
            p[self.non_finite[b]] = FULL  # KeepNonFiniteTokensFull
            if not np.any(p != FULL):
                out.append((np.zeros(bt, np.uint8), False))
                continue
            if rounded_size(compressed_size(self.layout, p), self.pool) >= raw_footprint:
                out.append((np.zeros(bt, np.uint8), False))  # no saving: stays raw
                continue
            out.append((p, True))
        return out

    def stored_bytes(self, target_mass):
        return sum(compressed_size(self.layout, p) if c else self.layout.block_bytes
                   for p, c in self.precision(target_mass))


def plan(cache, reports, policy, layout, pool=None, seconds_to_compaction=0.0, decider=None):
    """What the daemon stores and serves for this prefix (see the module's contract)."""
    d = decider or Decider(cache, reports, policy, layout, pool, seconds_to_compaction)
    result = Plan([], [], [], [], [], d.scores, None)
    for block, (p, compressed) in zip(d.blocks, d.precision(policy.target_mass)):
        if compressed:
            data = encode_block(block, p, layout)
            decoded, _ = decode_block(data, layout)
            result.encoded.append(data)
            result.stored_bytes.append(len(data))
        else:
            decoded = block
            result.encoded.append(None)
            result.stored_bytes.append(layout.block_bytes)
        result.precision.append(p)
        result.compressed.append(compressed)
        result.decoded.append(decoded)
    result.served = served_cache(result.decoded, result.precision, cache, layout)
    result.fp16_bytes = len(d.blocks) * layout.block_bytes
    result.stored_total = sum(result.stored_bytes)
    result.footprint_total = sum(rounded_size(s, d.pool) for s in result.stored_bytes)
    return result


@dataclass
class BudgetFit:
    target_mass: float = None  # None when the budget is unreachable
    stored_bytes: int = 0      # at target_mass (or the floor when unreachable)
    budget_bytes: int = 0
    floor_bytes: int = 0       # the least the policy's mode can store
    reachable: bool = False
    message: str = ""
    plan: Plan = field(default=None, repr=False)


def target_mass_for_budget(cache, reports, policy, layout, budget_fraction, pool=None,
                           iterations=40, with_plan=True):
    """The largest target_mass in (0, 1] whose stored bytes (KVQ1 sizes, raw blocks whole) do not
    exceed budget_fraction of the FP16 bytes of the whole blocks, by bisection (stored bytes grow
    with the target). Quantize mode ignores the target: its bytes are the INT8 floor; prune goes
    lower, down to every unprotected token dropped. Unreachable budgets come back with
    reachable=False, target_mass None and the floor."""
    d = Decider(cache, reports, policy, layout, pool)
    budget = int(budget_fraction * len(d.blocks) * layout.block_bytes)
    tiny = 1e-12
    lo_bytes = d.stored_bytes(tiny if policy.mode == "prune" else 1.0)
    fit = BudgetFit(budget_bytes=budget, floor_bytes=lo_bytes)
    if lo_bytes > budget:
        fit.stored_bytes = lo_bytes
        fit.message = (f"budget {budget_fraction:.4f} ({budget} bytes) is below what {policy.mode}"
                       f" mode can store ({lo_bytes} bytes, {lo_bytes / max(1, budget):.3f}x)")
        return fit
    if policy.mode != "prune" or d.stored_bytes(1.0) <= budget:
        t = 1.0 if policy.mode == "prune" else policy.target_mass
    else:
        lo, hi = tiny, 1.0  # bytes(lo) <= budget < bytes(hi)
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            if d.stored_bytes(mid) <= budget:
                lo = mid
            else:
                hi = mid
        t = lo
    fit.target_mass, fit.reachable = t, True
    fit.stored_bytes = d.stored_bytes(t)
    fit.message = f"target_mass {t:.6f}: {fit.stored_bytes} of {budget} bytes"
    if with_plan:
        p = Policy(**{**policy.__dict__, "target_mass": t})
        fit.plan = plan(cache, reports, p, layout, decider=d)
    return fit
