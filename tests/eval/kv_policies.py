"""KV retention policies of the fidelity evaluation, each given the same byte budget.

A policy sees what a worker has after running a prefix of N tokens: its KV (a KvCache of
float32 K after RoPE and V, as the model produced them) and the attention the prefix's queries
paid (`Signals`), and returns what a reader would decode (`Served`: K/V rounded to FP16 or
dequantized, a keep mask per (layer, KV head, position), and the bytes stored). Budgets are
fractions of the prefix's FP16 KV bytes, counting every byte a policy stores: codes, scales,
precision maps, headers and the positions of a sparse selection (4 bytes per kept entry when
the kept positions differ between heads).

Baselines (FP16 entries):
* StreamingLLM: the first `sinks` positions and the most recent ones (contiguous: no positions).
* H2O: per (layer, KV head), half the entries by attention accumulated over every prefix query
  (the heavy hitters), half the most recent.
* SnapKV: per (layer, KV head), the last `window` positions, then the positions whose attention
  from the window's queries, max-pooled over 7 neighbours, is largest.
Ours (the importance score of docs/importance.md, precision per (layer, KV head) and INT4):
* score = alpha * activity + beta * position + gamma * novelty per (layer, KV head, position):
  activity is the attention from the last `report_queries` prefix queries, divided by the
  largest such attention of an unprotected position of that head and clamped to 1
  (importance::ObserveAttention), position kernels::PositionFactor, novelty the key's cosine
  distance to its predecessor's (clamped to 1). The sinks stay FP16; the recent window ranks
  above every other entry (the daemon's budget mode; recent_fp16=True keeps it FP16 as the
  quantize and prune modes do).
* quantize first: every unprotected entry starts at INT8; while over budget the lowest-scored
  are demoted to INT4, and only when everything is INT4 are the lowest-scored pruned; budget
  left over promotes the highest-scored INT8 entries to FP16.
"""

from dataclasses import dataclass

import numpy as np

import kv_quant as kq
import smollm_reference as sr


@dataclass
class Layout:
    layers: int
    kv_heads: int
    head_dim: int
    block_tokens: int

    def fp16_bytes(self, positions):
        return positions * self.layers * self.kv_heads * 4 * self.head_dim


@dataclass
class Signals:
    accumulated: list  # per layer (kv_heads, N): attention from every prefix query (H2O)
    window: list       # per layer (kv_heads, N): attention from the last `window` queries
    window_queries: int
    report: np.ndarray = None  # (layers, N): what a worker reports to the daemon (daemon_rule)


@dataclass
class Served:
    cache: sr.KvCache
    bytes: int
    detail: str = ""  # what the policy chose, for the report


@dataclass
class Protection:
    sinks: int = 4
    recent: int = 64
    decay_tau: float = 256.0


def signal_collector(layout, heads, window_queries):
    """(hook for SmolLM.forward's attention_hook over the prefix, Signals it fills)."""
    signals = Signals([None] * layout.layers, [None] * layout.layers, window_queries)
    group = heads // layout.kv_heads

    def hook(layer, p):
        g = p.reshape(layout.kv_heads, group, p.shape[1], p.shape[2])
        signals.accumulated[layer] = g.sum(axis=(1, 2))
        signals.window[layer] = g[:, :, -window_queries:, :].sum(axis=(1, 2))

    return hook, signals


def _masked(cache, keep):
    """cache with FP16-rounded K/V and the keep masks (per layer (kv_heads, N))."""
    return sr.KvCache(k=[kq.fp16(k) for k in cache.k], v=[kq.fp16(v) for v in cache.v],
                      positions=cache.positions, mask=keep)


def full_fp16(cache, layout):
    n = cache.positions.size
    return Served(_masked(cache, None), layout.fp16_bytes(n))


def streaming_llm(cache, layout, budget, sinks=4):
    n = cache.positions.size
    keep_tokens = int(min(n, budget * n))
    keep = np.zeros(n, dtype=bool)
    keep[:min(sinks, keep_tokens)] = True
    keep[n - max(0, keep_tokens - sinks):] = True
    masks = [np.broadcast_to(keep, (layout.kv_heads, n)).copy() for _ in range(layout.layers)]
    return Served(_masked(cache, masks), layout.fp16_bytes(int(keep.sum())),
                  f"{int(keep.sum())} positions")


def _per_head_budget(layout, n, budget):
    entry = 4 * layout.head_dim + 4  # FP16 K and V, and the position
    return int(min(n, budget * layout.fp16_bytes(n) // (layout.layers * layout.kv_heads * entry)))


def _sparse_bytes(layout, masks):
    return int(sum(m.sum() for m in masks)) * (4 * layout.head_dim + 4)


def h2o(cache, layout, budget, signals):
    n = cache.positions.size
    k = _per_head_budget(layout, n, budget)
    recent = k // 2
    masks = []
    for acc in signals.accumulated:
        keep = np.zeros((layout.kv_heads, n), dtype=bool)
        keep[:, n - recent:] = True
        for h in range(layout.kv_heads):
            order = np.argsort(-acc[h, :n - recent], kind="stable")[:k - recent]
            keep[h, order] = True
        masks.append(keep)
    return Served(_masked(cache, masks), _sparse_bytes(layout, masks), f"{k} entries per head")


def snapkv(cache, layout, budget, signals, pool=7):
    n = cache.positions.size
    k = _per_head_budget(layout, n, budget)
    window = min(signals.window_queries, k)
    masks = []
    for win in signals.window:
        keep = np.zeros((layout.kv_heads, n), dtype=bool)
        keep[:, n - window:] = True
        padded = np.pad(win[:, :n - window], ((0, 0), (pool // 2, pool // 2)), mode="edge")
        pooled = np.lib.stride_tricks.sliding_window_view(padded, pool, axis=1).max(axis=2)
        for h in range(layout.kv_heads):
            keep[h, np.argsort(-pooled[h], kind="stable")[:k - window]] = True
        masks.append(keep)
    return Served(_masked(cache, masks), _sparse_bytes(layout, masks), f"{k} entries per head")


def position_factor(n, protection):
    """kernels::PositionFactor (exponential) of positions 0..n-1 in a sequence of n."""
    t = np.arange(n)
    d = (n - protection.recent) - t
    factor = np.exp(-np.maximum(d, 0) / protection.decay_tau)
    factor[(t < protection.sinks) | (t >= n - protection.recent)] = 1.0
    return factor.astype(np.float32)


def protected_positions(n, protection):
    t = np.arange(n)
    return (t < protection.sinks) | (t >= n - protection.recent)


def key_novelty(k):
    """1 - cos(k[t], k[t-1]) per KV head, clamped to [0, 1]; the first position gets 1."""
    norm = np.linalg.norm(k, axis=2)
    dots = np.sum(k[:, 1:] * k[:, :-1], axis=2)
    cos = dots / np.maximum(norm[:, 1:] * norm[:, :-1], 1e-12)
    return np.clip(np.concatenate([np.ones((k.shape[0], 1)), 1 - cos], axis=1), 0, 1)


def importance_scores(cache, signals, protection, weights, per_head=True):
    """Scores (layers, kv_heads, N); per_head=False gives every head of a position the mean."""
    alpha, beta, gamma = weights
    n = cache.positions.size
    unprotected = ~protected_positions(n, protection)
    pos = position_factor(n, protection)
    scores = []
    for layer, win in enumerate(signals.window):
        scale = win[:, unprotected].max(axis=1, keepdims=True) if unprotected.any() else 1.0
        activity = np.clip(win / np.maximum(scale, 1e-30), 0, 1)
        scores.append(alpha * activity + beta * pos[None, :] +
                      gamma * key_novelty(cache.k[layer]))
    scores = np.stack(scores)
    if not per_head:
        scores = np.broadcast_to(scores.mean(axis=(0, 1), keepdims=True), scores.shape).copy()
    return scores


def _bytes(layout, precision):
    n = precision.shape[2]
    t = layout.block_tokens
    return sum(kq.v2_block_bytes(precision[:, :, s:s + t], layout.head_dim) for s in range(0, n, t))


def allocate(layout, scores, protected, budget_bytes, int4=True):
    """Quantize first: the precision map (layers, kv_heads, N) that fits budget_bytes, and a
    description. Protected positions stay FP16 whatever the budget."""
    base = np.where(protected[None, None, :], kq.FULL, kq.INT8).astype(np.uint8)
    base = np.broadcast_to(base, scores.shape).copy()
    free = np.flatnonzero(~np.broadcast_to(protected[None, None, :], scores.shape))
    order = free[np.argsort(scores.ravel()[free], kind="stable")]  # least important first

    def first(m, code, start, entries=order):
        p = start.copy()
        p.ravel()[entries[:m]] = code
        return p

    def fits(p):
        return _bytes(layout, p) <= budget_bytes

    def smallest(predicate):  # the smallest m in [0, len(order)] with predicate(m), else None
        lo, hi = 0, len(order) + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if mid <= len(order) and predicate(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo if lo <= len(order) else None

    if fits(base):  # budget left over: the most important INT8 entries become FP16
        best = order[::-1]
        m = smallest(lambda m: not fits(first(m, kq.FULL, base, best)))
        m = len(order) if m is None else m - 1
        return first(m, kq.FULL, base, best), f"{m} promoted to fp16"
    lower = kq.INT4 if int4 else kq.PRUNED
    m = smallest(lambda m: fits(first(m, lower, base)))
    if m is not None:
        return first(m, lower, base), f"{m} {'int4' if int4 else 'pruned'}"
    base = first(len(order), lower, base)
    m = smallest(lambda m: fits(first(m, kq.PRUNED, base)))
    m = len(order) if m is None else m  # over budget even with everything pruned
    return first(m, kq.PRUNED, base), f"all int4, {m} pruned"


def ours(cache, layout, budget, signals, protection=Protection(), weights=(0.6, 0.3, 0.1),
         per_head=True, int4=True, recent_fp16=False, per_block=False):
    """recent_fp16=False keeps only the sinks at FP16 whatever the budget: the recent window
    ranks above every other entry instead (the last demoted, the first promoted). per_block
    fits every block to the budget on its own, as the daemon's compaction does; otherwise the
    budget holds for the whole prefix and important blocks take more of it."""
    n = cache.positions.size
    scores = importance_scores(cache, signals, protection, weights, per_head)
    protected = protected_positions(n, protection)
    if not recent_fp16:
        scores[:, :, protected] = scores.max() + 1
        protected = np.arange(n) < protection.sinks
    if per_block:
        t = layout.block_tokens
        parts = [allocate(layout, scores[:, :, s:s + t], protected[s:s + t],
                          budget * layout.fp16_bytes(min(t, n - s)), int4) for s in range(0, n, t)]
        precision = np.concatenate([p for p, _ in parts], axis=2)
        detail = "per block"
    else:
        precision, detail = allocate(layout, scores, protected, budget * layout.fp16_bytes(n),
                                     int4)
    ks, vs, masks = [], [], []
    for layer in range(layout.layers):
        k, v, keep = kq.apply_precision(cache.k[layer], cache.v[layer], precision[layer],
                                        layout.block_tokens)
        ks.append(k)
        vs.append(v)
        masks.append(keep)
    served = sr.KvCache(k=ks, v=vs, positions=cache.positions, mask=masks)
    counts = {name: float(np.mean(precision == code)) for name, code in
              (("fp16", kq.FULL), ("int8", kq.INT8), ("int4", kq.INT4), ("pruned", kq.PRUNED))}
    detail += " (" + " ".join(f"{k} {v:.1%}" for k, v in counts.items() if v) + ")"
    return Served(served, _bytes(layout, precision), detail)
