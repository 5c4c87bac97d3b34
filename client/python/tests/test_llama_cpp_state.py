"""kvcache.llama_cpp._state: llama.cpp's state format to kvcached blocks and back.

The states here are written by `write_state`, a transcription of llama.cpp's writer
(llama_context::state_write_data, llama_kv_cache::state_write) independent of the module
under test; tests/engines/llama_cpp_e2e.py checks the module against the real engine.
"""

import struct

import numpy as np
import pytest

from kvcache.llama_cpp import _state

L, H, D = 3, 2, 4  # layers, KV heads, head_dim


def write_state(k, v, positions, *, v_trans, arch="llama", n_stream=1, k_type=1, seqs=None,
                extra=b""):
    """k, v: [layers][cells, H*D] float16 per cell; positions: per cell."""
    cells = len(positions)
    out = [struct.pack("<I", len(arch)), arch.encode(), struct.pack("<I", n_stream),
           struct.pack("<I", cells)]
    for i, pos in enumerate(positions):
        s = [0] if seqs is None else seqs[i]
        out.append(struct.pack("<iI", pos, len(s)) + b"".join(struct.pack("<i", x) for x in s))
    out.append(struct.pack("<II", int(v_trans), len(k)))
    esz = np.dtype(_state.GGML_TYPES.get(k_type, ("", np.dtype("<f2")))[1]).itemsize
    for kl in k:
        out.append(struct.pack("<iQ", k_type, kl.shape[1] * esz) + kl.tobytes())
    for vl in v:
        if v_trans:
            out.append(struct.pack("<iII", k_type, esz, vl.shape[1]) + vl.T.copy().tobytes())
        else:
            out.append(struct.pack("<iQ", k_type, vl.shape[1] * esz) + vl.tobytes())
    out.append(struct.pack("<I", 0) * (n_stream - 1))
    return b"".join(out) + extra


def random_kv(cells, seed=1):
    rng = np.random.default_rng(seed)
    k = [rng.standard_normal((cells, H * D)).astype(np.float16) for _ in range(L)]
    v = [rng.standard_normal((cells, H * D)).astype(np.float16) for _ in range(L)]
    return k, v


def expected_blocks(k, v, positions, T, first, count):
    """The canonical layout, element by element: [block][layer][K,V][head][token][dim]."""
    cell_of = {p: i for i, p in enumerate(positions)}
    out = np.zeros((count, L, 2, H, T, D), dtype=np.float16)
    for b in range(count):
        for t in range(T):
            c = cell_of[(first + b) * T + t]
            for layer in range(L):
                out[b, layer, 0, :, t, :] = k[layer][c].reshape(H, D)
                out[b, layer, 1, :, t, :] = v[layer][c].reshape(H, D)
    return out.reshape(-1).view(np.uint8)


@pytest.mark.parametrize("v_trans", [False, True])
def test_parse_then_blocks_match_the_canonical_layout(v_trans):
    positions = list(range(21))
    k, v = random_kv(21)
    st = _state.parse_state(write_state(k, v, positions, v_trans=v_trans))
    assert st.layout == _state.StateLayout("llama", 1, v_trans, L, 1, 1, H * D, H * D)
    got = _state.to_blocks(st, H, 4)  # 5 whole blocks of 4; token 20 is left out
    np.testing.assert_array_equal(got, expected_blocks(k, v, positions, 4, 0, 5))
    tail = _state.to_blocks(st, H, 4, first_block=3)
    np.testing.assert_array_equal(tail, expected_blocks(k, v, positions, 4, 3, 2))


def test_cells_out_of_position_order_are_gathered_by_position():
    positions = [5, 0, 3, 1, 2, 4, 7, 6]
    k, v = random_kv(8, seed=2)
    st = _state.parse_state(write_state(k, v, positions, v_trans=True))
    np.testing.assert_array_equal(_state.to_blocks(st, H, 4),
                                  expected_blocks(k, v, positions, 4, 0, 2))


def test_a_gap_in_positions_ends_the_prefix():
    positions = [0, 1, 2, 3, 4, 6, 7, 8, 9]  # 5 is missing: only 0..4 is a prefix
    k, v = random_kv(9, seed=3)
    st = _state.parse_state(write_state(k, v, positions, v_trans=False))
    assert len(st.prefix_cells()) == 5
    assert _state.to_blocks(st, H, 4).size == _state.block_bytes(st.layout, H, 4)
    with pytest.raises(ValueError):
        _state.to_blocks(st, H, 4, first_block=0, num_blocks=2)


@pytest.mark.parametrize("v_trans", [False, True])
def test_from_blocks_writes_a_state_that_parses_back_to_the_same_kv(v_trans):
    positions = list(range(12))
    k, v = random_kv(12, seed=4)
    layout = _state.StateLayout("llama", 1, v_trans, L, 1, 1, H * D, H * D)
    blocks = expected_blocks(k, v, positions, 4, 0, 3)
    blob = _state.from_blocks(layout, blocks, H, 4)
    # Byte for byte what llama.cpp itself writes for those cells.
    assert blob.tobytes() == write_state(k, v, positions, v_trans=v_trans)
    back = _state.parse_state(blob)
    np.testing.assert_array_equal(_state.to_blocks(back, H, 4), blocks)


def test_from_blocks_across_v_trans_shares_kv():
    """KV saved from a context without flash attention loads into one with it."""
    k, v = random_kv(8, seed=5)
    saved = _state.parse_state(write_state(k, v, list(range(8)), v_trans=True))
    blocks = _state.to_blocks(saved, H, 4)
    other = _state.StateLayout("llama", 1, False, L, 1, 1, H * D, H * D)
    assert _state.from_blocks(other, blocks, H, 4).tobytes() == write_state(k, v, list(range(8)), v_trans=False)


def test_several_streams_only_the_first_in_use():
    k, v = random_kv(4, seed=6)
    blob = write_state(k, v, list(range(4)), v_trans=True, n_stream=3)
    st = _state.parse_state(blob)
    assert st.layout.n_stream == 3
    assert _state.from_blocks(st.layout, _state.to_blocks(st, H, 4), H, 4).tobytes() == blob


@pytest.mark.parametrize("case, fragment", [
    ("truncated", "truncated"),
    ("trailing", "after the KV cache"),
    ("quantized", "is not F32/F16/BF16"),
    ("shared_cell", "several sequences"),
    ("empty", "empty"),
])
def test_unsupported_states_are_refused_not_misread(case, fragment):
    k, v = random_kv(4, seed=7)
    pos = list(range(4))
    if case == "truncated":
        blob = write_state(k, v, pos, v_trans=True)[:-3]
    elif case == "trailing":  # what an SWA model's second cache or a recurrent state adds
        blob = write_state(k, v, pos, v_trans=True, extra=struct.pack("<I", 0))
    elif case == "quantized":
        blob = write_state(k, v, pos, v_trans=False, k_type=8)  # GGML_TYPE_Q8_0
    elif case == "shared_cell":
        blob = write_state(k, v, pos, v_trans=True, seqs=[[0], [0, 1], [0], [0]])
    else:
        blob = struct.pack("<I", 5) + b"llama" + struct.pack("<II", 1, 0)
    with pytest.raises(_state.UnsupportedState, match=fragment):
        _state.parse_state(blob)


def test_per_cell_extensions_are_refused():
    """M-RoPE writes 12 more bytes per cell; the lengths then cannot add up."""
    k, v = random_kv(4, seed=8)
    plain = write_state(k, v, list(range(4)), v_trans=True)
    head = 4 + 5 + 4 + 4
    cells = [plain[head + 12 * i: head + 12 * i + 8] + b"\0" * 12 + plain[head + 12 * i + 8: head + 12 * (i + 1)]
             for i in range(4)]
    blob = plain[:head] + b"".join(cells) + plain[head + 48:]
    with pytest.raises(_state.UnsupportedState):
        _state.parse_state(blob)


def test_a_heads_split_that_does_not_divide_is_refused():
    k, v = random_kv(4, seed=9)
    st = _state.parse_state(write_state(k, v, list(range(4)), v_trans=True))
    with pytest.raises(_state.UnsupportedState):
        _state.to_blocks(st, 3, 4)
