"""llama.cpp's context state, read and written in kvcached's canonical block layout.

Nothing here imports llama_cpp, so the format rules are unit-tested without an engine
(client/python/tests/test_llama_cpp_state.py).

The state ``llama_state_get_data`` writes (llama.cpp as vendored by llama-cpp-python 0.3.36,
``llama_context::state_write_data`` and ``llama_kv_cache::state_write``), all little-endian::

    u32 len, bytes arch                       the model architecture's name
    u32 n_stream                              1 for a single-sequence context
    per stream:
      u32 cell_count                          cells in use (0: nothing else for this stream)
      cell_count x (i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id)
      u32 v_trans, u32 n_layer
      per layer: i32 k_type, u64 k_row_bytes, cell_count rows of K ([kv_head][head_dim])
      v_trans == 0: per layer i32 v_type, u64 v_row_bytes, cell_count rows of V
      v_trans == 1: per layer i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
                    then n_embd_v rows of cell_count elements (V transposed)

Only what a plain KV cache writes is accepted: one stream in use, float K/V types (F32, F16,
BF16), no per-cell extensions (M-RoPE, per-token embeddings), no second cache (SWA models write
two), no recurrent state. :func:`parse_state` checks every length against the bytes it was
given and raises :class:`UnsupportedState` for anything else, so a format it does not know is
never misread: the cache then stays out of the way (every lookup a miss).

The canonical layout is kvcached's block layout (docs/api.md, "Models and the block byte
layout"): blocks of ``block_tokens`` tokens, each ``[layer][K, V][kv_head][token][head_dim]``.
It does not depend on ``v_trans``, so contexts with and without flash attention share KV.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Optional

import numpy as np

#: ggml type ids (ggml.h) of the K/V element types this module can lay out, and their
#: kvcached dtype names.
GGML_TYPES = {0: ("fp32", np.dtype("<f4")), 1: ("fp16", np.dtype("<f2")),
              30: ("bf16", np.dtype("<u2"))}  # numpy has no bfloat16: moved as raw 16-bit


class UnsupportedState(ValueError):
    """The state is not a layout this module can read (or the bytes are truncated)."""


@dataclass(frozen=True)
class StateLayout:
    """What a context's KV looks like: everything needed to write a state it will accept."""
    arch: str
    n_stream: int
    v_trans: bool
    n_layer: int
    k_type: int
    v_type: int
    n_embd_k: int  #: K elements per token and layer (kv_heads * head_dim)
    n_embd_v: int

    @property
    def dtype_name(self) -> str:
        return GGML_TYPES[self.k_type][0]

    @property
    def elem(self) -> np.dtype:
        return GGML_TYPES[self.k_type][1]

    def describe(self) -> str:
        """The layout facts that change the meaning of the stored bytes (not v_trans)."""
        return (f"{self.arch}/L{self.n_layer}/k{self.n_embd_k}:{self.k_type}"
                f"/v{self.n_embd_v}:{self.v_type}")


@dataclass
class ParsedState:
    """A parsed state: the layout, and each layer's K and V as views into the bytes."""
    layout: StateLayout
    positions: np.ndarray  #: int32 [cells], the position each cell holds
    k: list  #: per layer: [cells, n_embd_k]
    v: list  #: per layer: [cells, n_embd_v], or [n_embd_v, cells] when v_trans

    def prefix_cells(self) -> np.ndarray:
        """Cell indices holding positions 0, 1, 2, ... in order, as far as that run goes."""
        order = np.argsort(self.positions, kind="stable")
        want = np.arange(len(order), dtype=self.positions.dtype)
        bad = np.nonzero(self.positions[order] != want)[0]
        return order[: bad[0]] if len(bad) else order


class _Reader:
    def __init__(self, buf) -> None:
        self.mv = memoryview(buf).cast("B")
        self.off = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.off + n > len(self.mv):
            raise UnsupportedState(
                f"llama.cpp state truncated: {n} bytes wanted at offset {self.off} of {len(self.mv)}")
        out = self.mv[self.off:self.off + n]
        self.off += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))


def parse_state(buf) -> ParsedState:
    """Reads a whole-context state (see the module's docstring). Views, no copies."""
    r = _Reader(buf)
    (arch_len,) = r.unpack("<I")
    if arch_len > 256:
        raise UnsupportedState(f"llama.cpp state: architecture name of {arch_len} bytes")
    arch = bytes(r.take(arch_len)).decode("utf-8", "replace")
    (n_stream,) = r.unpack("<I")
    if not 1 <= n_stream <= 64:
        raise UnsupportedState(f"llama.cpp state: {n_stream} streams")
    parsed: Optional[ParsedState] = None
    for _ in range(n_stream):
        (cells,) = r.unpack("<I")
        if cells == 0:
            continue
        if parsed is not None:
            raise UnsupportedState("llama.cpp state: more than one stream in use")
        parsed = _parse_stream(r, arch, n_stream, cells)
    if r.off != len(r.mv):
        raise UnsupportedState(
            f"llama.cpp state: {len(r.mv) - r.off} bytes after the KV cache (a second cache, "
            "recurrent state or per-cell extensions: not a plain KV cache)")
    if parsed is None:
        raise UnsupportedState("llama.cpp state: the KV cache is empty")
    return parsed


def _parse_stream(r: _Reader, arch: str, n_stream: int, cells: int) -> ParsedState:
    meta_dtype = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])
    meta = np.frombuffer(r.take(cells * meta_dtype.itemsize), dtype=meta_dtype)
    if np.any(meta["n_seq"] != 1):
        raise UnsupportedState("llama.cpp state: a cell shared by several sequences")
    v_trans, n_layer = r.unpack("<II")
    if v_trans > 1 or not 1 <= n_layer <= 4096:
        raise UnsupportedState(f"llama.cpp state: v_trans={v_trans}, n_layer={n_layer}")
    k, v = [], []
    k_type = n_embd_k = None
    for _ in range(n_layer):
        t, row = r.unpack("<iQ")
        elem = _elem(t, "K")
        if row % elem.itemsize or (k_type is not None and (t, row) != (k_type, n_embd_k * elem.itemsize)):
            raise UnsupportedState("llama.cpp state: K rows differ between layers")
        k_type, n_embd_k = t, row // elem.itemsize
        k.append(np.frombuffer(r.take(cells * row), dtype=elem).reshape(cells, n_embd_k))
    v_type = n_embd_v = None
    for _ in range(n_layer):
        if v_trans:
            t, el, n = r.unpack("<iII")
            elem = _elem(t, "V")
            if el != elem.itemsize:
                raise UnsupportedState(f"llama.cpp state: V element of {el} bytes for type {t}")
        else:
            t, row = r.unpack("<iQ")
            elem = _elem(t, "V")
            if row % elem.itemsize:
                raise UnsupportedState(f"llama.cpp state: V row of {row} bytes")
            n = row // elem.itemsize
        if v_type is not None and (t, n) != (v_type, n_embd_v):
            raise UnsupportedState("llama.cpp state: V rows differ between layers")
        v_type, n_embd_v = t, n
        data = np.frombuffer(r.take(cells * n * elem.itemsize), dtype=elem)
        v.append(data.reshape(n, cells) if v_trans else data.reshape(cells, n))
    if k_type != v_type:
        raise UnsupportedState(f"llama.cpp state: K type {k_type} and V type {v_type} differ")
    layout = StateLayout(arch, n_stream, bool(v_trans), n_layer, k_type, v_type, n_embd_k, n_embd_v)
    return ParsedState(layout, meta["pos"], k, v)


def _elem(ggml_type: int, what: str) -> np.dtype:
    if ggml_type not in GGML_TYPES:
        raise UnsupportedState(
            f"llama.cpp state: {what} type {ggml_type} (a quantized KV cache?) is not F32/F16/BF16")
    return GGML_TYPES[ggml_type][1]


def to_blocks(state: ParsedState, kv_heads: int, block_tokens: int,
              first_block: int = 0, num_blocks: Optional[int] = None) -> np.ndarray:
    """The whole blocks of the state's prefix in kvcached's layout.

    Returns uint8 ``[num_blocks * block_bytes]`` for blocks ``first_block`` on, of the run of
    positions 0, 1, 2, ... (:meth:`ParsedState.prefix_cells`); ``num_blocks`` defaults to all
    whole blocks of that run.
    """
    lay = state.layout
    if lay.n_embd_k != lay.n_embd_v or lay.n_embd_k % kv_heads:
        raise UnsupportedState(f"llama.cpp state: K/V widths {lay.n_embd_k}/{lay.n_embd_v} "
                               f"do not split into {kv_heads} heads")
    d = lay.n_embd_k // kv_heads
    cells = state.prefix_cells()
    whole = len(cells) // block_tokens
    if num_blocks is None:
        num_blocks = max(0, whole - first_block)
    if first_block + num_blocks > whole:
        raise ValueError(f"to_blocks: blocks {first_block}..{first_block + num_blocks} of {whole}")
    sel = cells[first_block * block_tokens:(first_block + num_blocks) * block_tokens]
    out = np.empty((num_blocks, lay.n_layer, 2, kv_heads, block_tokens, d), dtype=lay.elem)
    if num_blocks == 0:
        return out.reshape(-1).view(np.uint8)
    contiguous = bool(np.all(np.diff(sel) == 1))  # the usual case: slices, not gathers
    for layer in range(lay.n_layer):
        kl = state.k[layer][sel[0]:sel[-1] + 1] if contiguous else state.k[layer][sel]
        out[:, layer, 0] = kl.reshape(num_blocks, block_tokens, kv_heads, d).transpose(0, 2, 1, 3)
        if lay.v_trans:  # [n_embd_v, cells] -> [head][dim][block][token]
            vl = state.v[layer][:, sel[0]:sel[-1] + 1] if contiguous else state.v[layer][:, sel]
            out[:, layer, 1] = vl.reshape(kv_heads, d, num_blocks, block_tokens).transpose(2, 0, 3, 1)
        else:
            vl = state.v[layer][sel[0]:sel[-1] + 1] if contiguous else state.v[layer][sel]
            out[:, layer, 1] = vl.reshape(num_blocks, block_tokens, kv_heads, d).transpose(0, 2, 1, 3)
    return out.reshape(-1).view(np.uint8)


def from_blocks(layout: StateLayout, blocks, kv_heads: int, block_tokens: int,
                out: Optional[np.ndarray] = None) -> np.ndarray:
    """A whole-context state holding the blocks' tokens at positions 0.. in sequence 0.

    ``blocks`` is uint8 in kvcached's layout (as :func:`to_blocks` returns or a fetch fills);
    the state is written in ``layout`` (the live context's, v_trans included), so
    ``llama_state_set_data`` on that context accepts it. Returns the state as a uint8 array,
    written with one copy of the KV: a prefix of ``out`` when given and large enough (a
    buffer kept between calls is not page-faulted in again), else a new array.
    """
    d = layout.n_embd_k // kv_heads
    canon = np.frombuffer(blocks, dtype=layout.elem)
    per_block = layout.n_layer * 2 * kv_heads * block_tokens * d
    if canon.size % per_block:
        raise ValueError(f"from_blocks: {canon.size} elements is not whole blocks of {per_block}")
    nb = canon.size // per_block
    n = nb * block_tokens
    canon = canon.reshape(nb, layout.n_layer, 2, kv_heads, block_tokens, d)
    esz = layout.elem.itemsize
    arch = layout.arch.encode()
    meta = np.zeros(n, dtype=[("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])
    meta["pos"] = np.arange(n)
    meta["n_seq"] = 1
    head = b"".join([struct.pack("<I", len(arch)), arch, struct.pack("<I", layout.n_stream),
                     struct.pack("<I", n), meta.tobytes(),
                     struct.pack("<II", int(layout.v_trans), layout.n_layer)])
    k_head = struct.pack("<iQ", layout.k_type, layout.n_embd_k * esz)
    v_head = (struct.pack("<iII", layout.v_type, esz, layout.n_embd_v) if layout.v_trans
              else struct.pack("<iQ", layout.v_type, layout.n_embd_v * esz))
    rows = n * layout.n_embd_k * esz
    # Streams other than the first are written empty (a single-sequence context uses stream 0).
    tail = struct.pack("<I", 0) * (layout.n_stream - 1)
    total = len(head) + layout.n_layer * (len(k_head) + len(v_head) + 2 * rows) + len(tail)
    out = out[:total] if out is not None and out.size >= total else np.empty(total, dtype=np.uint8)
    off = 0

    def put(raw: bytes) -> None:
        nonlocal off
        out[off:off + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        off += len(raw)

    def body() -> np.ndarray:
        nonlocal off
        view = out[off:off + rows].view(layout.elem)
        off += rows
        return view

    put(head)
    for layer in range(layout.n_layer):  # K rows: [token][head][dim]
        put(k_head)
        np.copyto(body().reshape(nb, block_tokens, kv_heads, d), canon[:, layer, 0].transpose(0, 2, 1, 3))
    for layer in range(layout.n_layer):
        put(v_head)
        if layout.v_trans:  # [head][dim][token]
            np.copyto(body().reshape(kv_heads, d, nb, block_tokens), canon[:, layer, 1].transpose(1, 3, 0, 2))
        else:
            np.copyto(body().reshape(nb, block_tokens, kv_heads, d), canon[:, layer, 1].transpose(0, 2, 1, 3))
    put(tail)
    assert off == out.size
    return out


def block_bytes(layout: StateLayout, kv_heads: int, block_tokens: int) -> int:
    d = layout.n_embd_k // kv_heads
    return layout.n_layer * 2 * kv_heads * block_tokens * d * layout.elem.itemsize
