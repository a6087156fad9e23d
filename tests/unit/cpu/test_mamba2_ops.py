"""The CPU Mamba-2 ops (sglang_radixflow.cpu.mamba2) against plain per-token references written here.

Float32 throughout with tight tolerances; random varlen batches, initial states present / absent, non-trivial
slot mappings (cache indices into a larger pool, pad slots), chunk boundaries that do not line up with
sequence boundaries. The last test checks that the post-import patch binds the ops inside SGLang's mamba.py.
"""
from __future__ import annotations

from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from sglang_radixflow.cpu.mamba2 import conv, decode, ssd, track
from tests.unit.cpu.fresh import failure_text, run_in_cpu_engine

ATOL = 2e-5
RTOL = 2e-5
PAD = -1


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float = ATOL, rtol: float = RTOL) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------------------------------------------
# References (one token at a time)


def ref_conv_seq(
    x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], hist: torch.Tensor, silu: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (dim, n), hist (dim, width-1) oldest first -> (y (dim, n), new history (dim, width-1))."""
    width = w.shape[1]
    window = [hist[:, i] for i in range(width - 1)]
    ys = []
    for t in range(x.shape[1]):
        window.append(x[:, t])
        window = window[-width:]
        acc = sum(window[k] * w[:, k] for k in range(width))
        if b is not None:
            acc = acc + b
        ys.append(F.silu(acc) if silu else acc)
    new_hist = torch.stack(window[-(width - 1) :], dim=1)
    return torch.stack(ys, dim=1), new_hist


def ref_ssm_seq(
    x: torch.Tensor,  # (n, H, P)
    dt: torch.Tensor,  # (n, H) raw
    A: torch.Tensor,
    B: torch.Tensor,  # (n, G, N)
    C: torch.Tensor,
    D: Optional[torch.Tensor],
    z: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    init: torch.Tensor,  # (H, P, N)
    softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Returns y (n, H, P) and the state after every token."""
    H = x.shape[1]
    R = H // B.shape[1]
    state = init.clone()
    ys, states = [], []
    for t in range(x.shape[0]):
        d = dt[t] + (dt_bias if dt_bias is not None else 0.0)
        if softplus:
            d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
        d = d.clamp(dt_limit[0], dt_limit[1])
        Bh = B[t].repeat_interleave(R, 0)  # (H, N)
        Ch = C[t].repeat_interleave(R, 0)
        state = state * torch.exp(d * A)[:, None, None] + (d[:, None] * x[t])[:, :, None] * Bh[:, None, :]
        y = (state * Ch[:, None, :]).sum(-1)
        if D is not None:
            y = y + x[t] * (D[:, None] if D.dim() == 1 else D)
        if z is not None:
            y = y * F.silu(z[t])
        ys.append(y)
        states.append(state.clone())
    return torch.stack(ys), states


# ----------------------------------------------------------------------------------------------------------------
# causal_conv1d_fn (prefill)


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("activation", ["silu", None])
def test_conv_fn_varlen_matches_reference(width: int, with_bias: bool, activation: Optional[str]) -> None:
    g = torch.Generator().manual_seed(width * 10 + with_bias)
    dim, slots = 24, 11
    lens = [1, 2, 9, 1, 33, 3]  # some shorter than width-1
    has_init = torch.tensor([True, False, True, True, False, True])
    cache_indices = torch.tensor([7, 2, 9, 0, 5, 3], dtype=torch.int32)
    x = torch.randn(sum(lens), dim, generator=g).t()  # (dim, T) non-contiguous, as mamba.py passes it
    w = torch.randn(dim, width, generator=g)
    b = torch.randn(dim, generator=g) if with_bias else None
    pool = torch.randn(slots, dim, width - 1, generator=g)
    before = pool.clone()
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)

    y = conv.causal_conv1d_fn(
        x, w, b, activation=activation, conv_states=pool, has_initial_state=has_init,
        cache_indices=cache_indices, query_start_loc=qsl, seq_lens_cpu=lens,
    )
    assert y.shape == x.shape
    expected_pool = before.clone()
    for i, n in enumerate(lens):
        s = int(qsl[i])
        slot = int(cache_indices[i])
        hist = before[slot] if has_init[i] else torch.zeros(dim, width - 1)
        ys, new_hist = ref_conv_seq(x[:, s : s + n], w, b, hist, activation == "silu")
        close(y[:, s : s + n], ys)
        expected_pool[slot] = new_hist
    close(pool, expected_pool)  # used slots rolled, the others untouched


def test_conv_fn_pad_slot_and_no_state() -> None:
    g = torch.Generator().manual_seed(1)
    dim, width = 8, 4
    lens = [5, 4, 6]
    x = torch.randn(dim, sum(lens), generator=g)
    w = torch.randn(dim, width, generator=g)
    pool = torch.randn(4, dim, width - 1, generator=g)
    before = pool.clone()
    qsl = torch.tensor([0, 5, 9, 15], dtype=torch.int32)
    cache_indices = torch.tensor([2, PAD, 0], dtype=torch.int32)
    y = conv.causal_conv1d_fn(
        x, w, None, query_start_loc=qsl, cache_indices=cache_indices,
        has_initial_state=torch.tensor([True, True, False]), conv_states=pool, activation="silu",
    )
    # the pad-slot sequence neither reads nor writes state; the others do
    close(pool[[1, 3]], before[[1, 3]])
    close(y[:, 5:9], ref_conv_seq(x[:, 5:9], w, None, torch.zeros(dim, 3), True)[0])
    ys0, h0 = ref_conv_seq(x[:, :5], w, None, before[2], True)
    close(y[:, :5], ys0)
    close(pool[2], h0)
    # no conv_states at all: zero history
    y2 = conv.causal_conv1d_fn(x, w, None, query_start_loc=qsl, activation="silu")
    for s, n in [(0, 5), (5, 4), (9, 6)]:
        close(y2[:, s : s + n], ref_conv_seq(x[:, s : s + n], w, None, torch.zeros(dim, 3), True)[0])


def test_conv_fn_batched_input_and_triton_order() -> None:
    g = torch.Generator().manual_seed(2)
    nb, dim, n, width = 3, 6, 7, 4
    x = torch.randn(nb, dim, n, generator=g)
    w = torch.randn(dim, width, generator=g)
    b = torch.randn(dim, generator=g)
    pool = torch.randn(nb, dim, width - 1, generator=g)
    before = pool.clone()
    y = conv.causal_conv1d_fn(x, w, b, conv_states=pool, has_initial_state=torch.tensor([True, False, True]))
    for i in range(nb):
        hist = before[i] if i != 1 else torch.zeros(dim, width - 1)
        ys, nh = ref_conv_seq(x[i], w, b, hist, True)
        close(y[i], ys)
        close(pool[i], nh)
    # the Triton-order entry point is the same op
    flat = x.permute(1, 0, 2).reshape(dim, nb * n)
    pool2 = before.clone()
    qsl = torch.arange(0, nb * n + 1, n, dtype=torch.int32)
    y3 = conv.causal_conv1d_fn_triton_order(
        flat, w, b, pool2, qsl, [n] * nb, cache_indices=torch.arange(nb), has_initial_state=torch.tensor([1, 0, 1]).bool()
    )
    close(y3, y.permute(1, 0, 2).reshape(dim, -1))
    close(pool2, pool)


# ----------------------------------------------------------------------------------------------------------------
# causal_conv1d_update (decode / verify)


def test_conv_update_single_token_slots_and_pad() -> None:
    g = torch.Generator().manual_seed(3)
    dim, width, slots = 16, 4, 9
    batch = 5
    x = torch.randn(batch, dim, generator=g)
    w = torch.randn(dim, width, generator=g)
    b = torch.randn(dim, generator=g)
    pool = torch.randn(slots, dim, width - 1, generator=g)
    before = pool.clone()
    idx = torch.tensor([4, 0, PAD, 8, 2], dtype=torch.int32)
    y = conv.causal_conv1d_update(x, pool, w, b, "silu", conv_state_indices=idx)
    assert y.shape == x.shape
    expected = before.clone()
    for r in range(batch):
        if idx[r] == PAD:
            continue
        ys, nh = ref_conv_seq(x[r, :, None], w, b, before[int(idx[r])], True)
        close(y[r], ys[:, 0])
        expected[int(idx[r])] = nh
    close(pool, expected)


def test_conv_update_multi_token_equals_sequential_and_intermediate_windows() -> None:
    g = torch.Generator().manual_seed(4)
    dim, width, T, batch = 10, 4, 5, 3
    x = torch.randn(batch, dim, T, generator=g)
    w = torch.randn(dim, width, generator=g)
    pool = torch.randn(6, dim, width - 1, generator=g)
    idx = torch.tensor([5, 1, 3])
    inter_idx = torch.tensor([2, 0, 1])
    inter = torch.zeros(3, T, dim, width - 1)
    seq_pool = pool.clone()
    y = conv.causal_conv1d_update(
        x, pool, w, None, "silu", conv_state_indices=idx,
        intermediate_conv_window=inter, intermediate_state_indices=inter_idx,
    )
    for t in range(T):
        yt = conv.causal_conv1d_update(x[:, :, t], seq_pool, w, None, "silu", conv_state_indices=idx)
        close(y[:, :, t], yt)
        for r in range(batch):
            close(inter[int(inter_idx[r]), t], seq_pool[int(idx[r])])  # window after token t
    close(pool, seq_pool)


def test_conv_update_speculative_accept_offset() -> None:
    g = torch.Generator().manual_seed(5)
    dim, width, T, batch = 6, 4, 3, 2
    K = width - 1
    x = torch.randn(batch, dim, T, generator=g)
    w = torch.randn(dim, width, generator=g)
    b = torch.randn(dim, generator=g)
    pool = torch.randn(4, dim, K + T - 1, generator=g)  # verify buffers keep K + T - 1 inputs
    before = pool.clone()
    idx = torch.tensor([3, 0])
    accepted = torch.tensor([2, 1], dtype=torch.int32)
    y = conv.causal_conv1d_update(x, pool, w, b, "silu", conv_state_indices=idx, num_accept_tokens=accepted)
    for r in range(batch):
        slot, off = int(idx[r]), int(accepted[r]) - 1
        ys, _ = ref_conv_seq(x[r], w, b, before[slot, :, off : off + K], True)
        close(y[r], ys)
        # rolled by one from the accepted offset, then the T new inputs
        close(pool[slot], torch.cat([before[slot, :, off + 1 : off + K], x[r]], dim=1))


def _links(parents: list[int]) -> tuple[list[int], list[int]]:
    """first-child / next-sibling links of a tree given by parent ids (children in increasing order)."""
    n = len(parents)
    nxt, sib = [-1] * n, [-1] * n
    for node in range(n):
        kids = [c for c in range(1, n) if parents[c] == node]
        if kids:
            nxt[node] = kids[0]
            for a, bb in zip(kids, kids[1:]):
                sib[a] = bb
    return nxt, sib


def test_conv_update_eagle_tree() -> None:
    g = torch.Generator().manual_seed(6)
    dim, width = 5, 4
    K = width - 1
    trees = [[0, 0, 0, 1, 3, 2], [0, 0, 1, 2, 3, 4]]  # a branching tree and a chain
    T = len(trees[0])
    batch = len(trees)
    x = torch.randn(batch, dim, T, generator=g)
    w = torch.randn(dim, width, generator=g)
    pool = torch.randn(2, dim, K, generator=g)
    before = pool.clone()
    links = [_links(p) for p in trees]
    nxt = torch.tensor([l[0] for l in links])
    sib = torch.tensor([l[1] for l in links])
    parent_out = torch.full((batch, T), -7, dtype=torch.int64)
    inter = torch.zeros(batch, T, dim, K)
    idx = torch.tensor([1, 0])
    y = conv.causal_conv1d_update(
        x, pool, w, None, "silu", conv_state_indices=idx, intermediate_conv_window=inter,
        intermediate_state_indices=torch.arange(batch), retrieve_next_token=nxt, retrieve_next_sibling=sib,
        retrieve_parent_token=parent_out,
    )
    for r, parents in enumerate(trees):
        assert parent_out[r].tolist() == parents
        hist = before[int(idx[r])]
        for t in range(T):
            path = [t]
            while path[-1] != 0:
                path.append(parents[path[-1]])
            inputs = [x[r, :, p] for p in reversed(path)]  # oldest first along the path
            ys, window = ref_conv_seq(torch.stack(inputs, 1), w, None, hist, True)
            close(y[r, :, t], ys[:, -1])
            close(inter[r, t], window)
        # the state is rolled linearly, as the kernel does
        close(pool[int(idx[r])], x[r, :, T - K :])


# ----------------------------------------------------------------------------------------------------------------
# mamba_chunk_scan_combined (prefill)


def _ssd_inputs(lens: list[int], H: int, P: int, G: int, N: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    return dict(
        x=torch.randn(1, T, H, P, generator=g),
        dt=torch.randn(1, T, H, generator=g) - 1.0,
        A=-torch.rand(H, generator=g) * 2 - 0.1,
        B=torch.randn(1, T, G, N, generator=g) * 0.5,
        C=torch.randn(1, T, G, N, generator=g) * 0.5,
        D=torch.randn(H, generator=g),
        dt_bias=torch.randn(H, generator=g) * 0.5,
        z=torch.randn(1, T, H, P, generator=g),
        init=torch.randn(len(lens), H, P, N, generator=g),
    )


VARLEN_CASES = {
    "ragged": [1, 13, 16, 37, 5, 2, 24],  # sequence boundaries fall inside chunks and on them
    "aligned": [16, 32, 16, 48, 16, 32, 9],  # every boundary on the chunk grid (the no-gather layout)
}


@pytest.mark.parametrize("chunk", [8, 16])
@pytest.mark.parametrize("init_mode", ["mixed", "none"])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("case", sorted(VARLEN_CASES))
def test_chunk_scan_varlen_matches_per_token(chunk: int, init_mode: str, gated: bool, case: str) -> None:
    H, P, G, N = 4, 3, 2, 5
    lens = VARLEN_CASES[case]
    inp = _ssd_inputs(lens, H, P, G, N, seed=chunk + len(init_mode) + gated)
    T = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), torch.tensor(lens))[None]
    has_init = torch.tensor([True, False, True, True, False, True, True])
    init = None
    if init_mode == "mixed":
        init = torch.where(has_init[:, None, None, None], inp["init"], 0)  # as mamba.py builds it
    # track a few mid-sequence positions (absolute end locations, exclusive)
    track_seq = torch.tensor([3, 1, 6, 3])
    track_end = torch.tensor([int(cu[3]) + 20, int(cu[1]) + 1, int(cu[6]) + lens[6], int(cu[3]) + lens[3]])
    out = torch.full((1, T, H, P), float("nan"))
    h, varlen, track = ssd.mamba_chunk_scan_combined(
        inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], chunk_size=chunk, D=inp["D"],
        z=inp["z"] if gated else None, dt_bias=inp["dt_bias"], seq_idx=seq_idx, cu_seqlens=cu,
        initial_states=init, return_varlen_states=True, return_final_states=False, return_track_states=True,
        track_seq_idx=track_seq, track_end_locs=track_end, dt_softplus=True, out=out, state_dtype=torch.float32,
    )
    states_after: list[torch.Tensor] = []  # flat position -> state of its sequence after that token
    for i, n in enumerate(lens):
        s = int(cu[i])
        st0 = init[i] if init is not None else torch.zeros(H, P, N)
        y, sts = ref_ssm_seq(
            inp["x"][0, s : s + n], inp["dt"][0, s : s + n], inp["A"], inp["B"][0, s : s + n],
            inp["C"][0, s : s + n], inp["D"], inp["z"][0, s : s + n] if gated else None, inp["dt_bias"], st0,
        )
        close(out[0, s : s + n], y)
        close(varlen[i], sts[-1])
        states_after.extend(sts)
    nchunks = -(-T // chunk)
    assert h.shape == (1, nchunks, H, P, N)
    close(h[0, 0], init[0] if init is not None else torch.zeros(H, P, N))
    for c in range(1, nchunks):
        close(h[0, c], states_after[c * chunk - 1])  # Triton's layout, used by SGLang's prefix-cache tracking
    assert track is not None and track.shape == (1, 4, H, P, N)
    for i, e in enumerate(track_end.tolist()):
        close(track[0, i], states_after[e - 1])


def test_chunk_scan_return_modes_batched_and_dt_limit() -> None:
    H, P, G, N, chunk = 2, 4, 1, 3, 8
    g = torch.Generator().manual_seed(9)
    nb, n = 3, 21
    x = torch.randn(nb, n, H, P, generator=g)
    dt = torch.randn(nb, n, H, generator=g)
    A = -torch.rand(H, generator=g) - 0.5
    B = torch.randn(nb, n, G, N, generator=g)
    C = torch.randn(nb, n, G, N, generator=g)
    D = torch.randn(H, P, generator=g)
    init = torch.randn(nb, H, P, N, generator=g)
    limit = (0.05, 0.9)
    out = torch.empty_like(x)
    final = ssd.mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk, D=D, initial_states=init, dt_softplus=True, dt_limit=limit, out=out,
        return_final_states=True,
    )
    for r in range(nb):
        y, sts = ref_ssm_seq(x[r], dt[r], A, B[r], C[r], D, None, None, init[r], dt_limit=limit)
        close(out[r], y)
        close(final[r], sts[-1])
    # no return flags: only `out`; intermediate states without varlen
    out2 = torch.empty_like(x)
    assert ssd.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, D=D, initial_states=init, dt_softplus=True,
                                         dt_limit=limit, out=out2) is None
    close(out2, out)
    h = ssd.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, D=D, initial_states=init, dt_softplus=True,
                                      dt_limit=limit, out=out2, return_intermediate_states=True)
    assert h.shape == (nb, -(-n // chunk), H, P, N)
    close(h[:, 0], init)


def test_chunk_scan_split_prefill_equals_one_shot() -> None:
    """Chunked prefill: the second part started from the first part's varlen state gives the same outputs."""
    H, P, G, N, chunk = 4, 8, 2, 16, 16
    lens = [70]
    inp = _ssd_inputs(lens, H, P, G, N, seed=11)
    cut = 29
    kw = dict(chunk_size=chunk, D=inp["D"], dt_bias=inp["dt_bias"], dt_softplus=True, return_varlen_states=True)
    full_out = torch.empty_like(inp["x"])
    full_state = ssd.mamba_chunk_scan_combined(
        inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], cu_seqlens=torch.tensor([0, 70]), out=full_out, **kw
    )
    parts = []
    state = None
    for s, e in [(0, cut), (cut, 70)]:
        o = torch.empty(1, e - s, H, P)
        state = ssd.mamba_chunk_scan_combined(
            inp["x"][:, s:e], inp["dt"][:, s:e], inp["A"], inp["B"][:, s:e], inp["C"][:, s:e],
            cu_seqlens=torch.tensor([0, e - s]), initial_states=state, out=o, **kw
        )
        parts.append(o)
    close(torch.cat(parts, 1), full_out, atol=5e-5, rtol=5e-5)
    close(state, full_state, atol=5e-5, rtol=5e-5)


# ----------------------------------------------------------------------------------------------------------------
# selective_state_update (decode)


def _decode_inputs(batch: int, T: int, H: int, P: int, G: int, N: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    Ah = -torch.rand(H, generator=g) - 0.2
    dt_h = torch.randn(batch, T, H, generator=g)
    bias_h = torch.randn(H, generator=g) * 0.3
    D_h = torch.randn(H, generator=g)
    # mamba.py passes A, dt, dt_bias, D expanded over head_dim (stride 0)
    return dict(
        A_h=Ah, dt_h=dt_h, bias_h=bias_h, D_h=D_h,
        A=Ah[:, None, None].expand(H, P, N), dt=dt_h[..., None].expand(batch, T, H, P),
        dt_bias=bias_h[:, None].expand(H, P), D=D_h[:, None].expand(H, P),
        x=torch.randn(batch, T, H, P, generator=g), B=torch.randn(batch, T, G, N, generator=g),
        C=torch.randn(batch, T, G, N, generator=g), z=torch.randn(batch, T, H, P, generator=g),
    )


@pytest.mark.parametrize("gated", [False, True])
def test_selective_state_update_single_token(gated: bool) -> None:
    batch, H, P, G, N, slots = 5, 4, 6, 2, 8, 12
    inp = _decode_inputs(batch, 1, H, P, G, N, seed=20 + gated)
    g = torch.Generator().manual_seed(21)
    pool = torch.randn(slots, H, P, N, generator=g)
    before = pool.clone()
    idx = torch.tensor([9, 2, PAD, 0, 11], dtype=torch.int32)
    out = torch.full((batch, H, P), float("nan"))
    decode.selective_state_update(
        pool, inp["x"][:, 0], inp["dt"][:, 0], inp["A"], inp["B"][:, 0], inp["C"][:, 0], inp["D"],
        z=inp["z"][:, 0] if gated else None, dt_bias=inp["dt_bias"], dt_softplus=True,
        state_batch_indices=idx, out=out,
    )
    expected = before.clone()
    for r in range(batch):
        slot = int(idx[r])
        st0 = before[slot] if slot != PAD else torch.zeros(H, P, N)
        y, sts = ref_ssm_seq(
            inp["x"][r], inp["dt_h"][r], inp["A_h"], inp["B"][r], inp["C"][r], inp["D_h"],
            inp["z"][r] if gated else None, inp["bias_h"], st0,
        )
        close(out[r], y[0])
        if slot != PAD:
            expected[slot] = sts[-1]
    close(pool, expected)  # pad row wrote nothing, unused slots untouched


def test_selective_state_update_verify_buffers_and_tree() -> None:
    batch, T, H, P, G, N, slots = 2, 4, 2, 3, 1, 4, 5
    inp = _decode_inputs(batch, T, H, P, G, N, seed=30)
    g = torch.Generator().manual_seed(31)
    pool = torch.randn(slots, H, P, N, generator=g)
    before = pool.clone()
    idx = torch.tensor([3, 1])
    inter_idx = torch.tensor([1, 0])
    buf = torch.zeros(batch, T, H, P, N)
    out = torch.empty(batch, T, H, P)
    common = dict(D=inp["D"], dt_bias=inp["dt_bias"], dt_softplus=True, state_batch_indices=idx, out=out)
    # linear verify: state kept as is, every step cached
    decode.selective_state_update(
        pool, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], disable_state_update=True,
        intermediate_states_buffer=buf, cache_steps=T, intermediate_state_indices=inter_idx, **common
    )
    close(pool, before)
    for r in range(batch):
        y, sts = ref_ssm_seq(inp["x"][r], inp["dt_h"][r], inp["A_h"], inp["B"][r], inp["C"][r], inp["D_h"], None,
                             inp["bias_h"], before[int(idx[r])])
        close(out[r], y)
        for t in range(T):
            close(buf[int(inter_idx[r]), t], sts[t])
    # tree verify: token t continues from its parent's cached state
    parents = torch.tensor([[0, 0, 0, 2], [0, 0, 1, 1]])
    buf.zero_()
    decode.selective_state_update(
        pool, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], disable_state_update=True,
        intermediate_states_buffer=buf, cache_steps=T, intermediate_state_indices=inter_idx,
        retrieve_parent_token=parents, **common
    )
    for r in range(batch):
        for t in range(T):
            path = [t]
            while path[-1] != 0:
                path.append(int(parents[r, path[-1]]))
            path.reverse()
            y, sts = ref_ssm_seq(inp["x"][r, path], inp["dt_h"][r, path], inp["A_h"], inp["B"][r, path],
                                 inp["C"][r, path], inp["D_h"], None, inp["bias_h"], before[int(idx[r])])
            close(out[r, t], y[-1])
            close(buf[int(inter_idx[r]), t], sts[-1])
    # multi-token with state update equals T single-token steps
    seq_pool = before.clone()
    pool2 = before.clone()
    out2 = torch.empty(batch, T, H, P)
    decode.selective_state_update(pool2, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], D=inp["D"],
                               dt_bias=inp["dt_bias"], dt_softplus=True, state_batch_indices=idx, out=out2)
    for t in range(T):
        o = torch.empty(batch, H, P)
        decode.selective_state_update(seq_pool, inp["x"][:, t], inp["dt"][:, t], inp["A"], inp["B"][:, t],
                                   inp["C"][:, t], D=inp["D"], dt_bias=inp["dt_bias"], dt_softplus=True,
                                   state_batch_indices=idx, out=o)
        close(out2[:, t], o)
    close(pool2, seq_pool)


# ----------------------------------------------------------------------------------------------------------------
# The ops together, as MambaMixer2.forward uses them: prefill in pieces + decode == one long prefill


def test_mixer_ops_prefill_pieces_then_decode_equal_one_prefill() -> None:
    g = torch.Generator().manual_seed(40)
    H, P, G, N, width, chunk = 4, 8, 2, 16, 4, 16
    conv_dim = H * P + 2 * G * N
    total = 53
    xBC = torch.randn(total, conv_dim, generator=g)
    dt = torch.randn(total, H, generator=g)
    A = -torch.rand(H, generator=g) - 0.1
    D = torch.randn(H, generator=g)
    dt_bias = torch.randn(H, generator=g) * 0.2
    w = torch.randn(conv_dim, width, generator=g) * 0.5
    wb = torch.randn(conv_dim, generator=g)

    def prefill(rows: slice, conv_pool: torch.Tensor, ssm_pool: torch.Tensor, slot: int, has: bool) -> torch.Tensor:
        n = rows.stop - rows.start
        xc = conv.causal_conv1d_fn(
            xBC[rows].t(), w, wb, activation="silu", conv_states=conv_pool, has_initial_state=torch.tensor([has]),
            cache_indices=torch.tensor([slot], dtype=torch.int32), query_start_loc=torch.tensor([0, n]),
            seq_lens_cpu=[n],
        ).t()
        xs, Bm, Cm = torch.split(xc, [H * P, G * N, G * N], dim=-1)
        out = torch.empty(1, n, H, P)
        init = torch.where(torch.tensor([has])[:, None, None, None], ssm_pool[[slot]], 0) if has else None
        _, varlen, _ = ssd.mamba_chunk_scan_combined(
            xs.reshape(1, n, H, P), dt[rows][None], A, Bm.reshape(1, n, G, N), Cm.reshape(1, n, G, N), chunk,
            D=D, dt_bias=dt_bias, cu_seqlens=torch.tensor([0, n]), initial_states=init, dt_softplus=True,
            return_varlen_states=True, return_track_states=True, out=out,
            seq_idx=torch.zeros(1, n, dtype=torch.int32),
        )
        ssm_pool[slot] = varlen[0]
        return out[0]

    conv_a, ssm_a = torch.zeros(3, conv_dim, width - 1), torch.zeros(3, H, P, N)
    one = prefill(slice(0, total), conv_a, ssm_a, 2, False)

    conv_b, ssm_b = torch.zeros(3, conv_dim, width - 1), torch.zeros(3, H, P, N)
    outs = [prefill(slice(0, 19), conv_b, ssm_b, 1, False), prefill(slice(19, 40), conv_b, ssm_b, 1, True)]
    for t in range(40, total):  # decode the rest one token at a time
        xc = conv.causal_conv1d_update(xBC[t : t + 1], conv_b, w, wb, "silu", conv_state_indices=torch.tensor([1]))
        xs, Bm, Cm = torch.split(xc, [H * P, G * N, G * N], dim=-1)
        o = torch.empty(1, H, P)
        decode.selective_state_update(
            ssm_b, xs.view(1, H, P), dt[t : t + 1, :, None].expand(1, H, P), A[:, None, None].expand(H, P, N),
            Bm.view(1, G, N), Cm.view(1, G, N), D[:, None].expand(H, P), dt_bias=dt_bias[:, None].expand(H, P),
            dt_softplus=True, state_batch_indices=torch.tensor([1]), out=o,
        )
        outs.append(o)
    close(torch.cat(outs), one, atol=5e-5, rtol=5e-5)
    close(conv_b[1], conv_a[2])
    close(ssm_b[1], ssm_a[2], atol=5e-5, rtol=5e-5)


# ----------------------------------------------------------------------------------------------------------------
# Binding inside SGLang


def test_patch_binds_ops_into_sglang_mamba_module() -> None:
    code = (
        "import sglang.srt.layers.attention.mamba.mamba as m\n"
        "from sglang_radixflow.cpu import boot\n"
        "from sglang_radixflow.cpu.mamba2 import conv, decode, ssd\n"
        "assert boot.status()['standin_active'], boot.status()\n"
        "assert m.causal_conv1d_fn is conv.causal_conv1d_fn\n"
        "assert m.causal_conv1d_update is conv.causal_conv1d_update\n"
        "assert m.causal_conv1d_fn_triton is conv.causal_conv1d_fn_triton_order\n"
        "assert m.causal_conv1d_update_triton is conv.causal_conv1d_update\n"
        "assert m.mamba_chunk_scan_combined is ssd.mamba_chunk_scan_combined\n"
        "assert m.selective_state_update is decode.selective_state_update\n"
        "assert any('patch_mamba_mixer2' in p for p in boot.status()['patched'])\n"
        "print('BOUND')\n"
    )
    proc = run_in_cpu_engine(code)
    assert proc.returncode == 0 and "BOUND" in proc.stdout, failure_text(proc)


@pytest.mark.parametrize("check_freed_slots", [False, True])
def test_decode_tracking_copies_only_tracked_rows_to_their_track_slots(check_freed_slots: bool) -> None:
    """extra_buffer decode snapshots (the Triton kernel's contract): row i with its mask set copies its conv and SSM
    state from slot cache_indices[i] to slot mamba_track_indices[i]; nothing else changes; with check_freed_slots a
    row whose slot is -1 (freed) is skipped; rows past batch_size are ignored."""
    g = torch.Generator().manual_seed(0)
    conv_states = torch.randn(10, 6, 3, generator=g)
    ssm_states = torch.randn(10, 4, 8, 16, generator=g)
    before_conv, before_ssm = conv_states.clone(), ssm_states.clone()
    cache_indices = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    mask = torch.tensor([True, False, True, True, True])
    track_indices = torch.tensor([5, 6, 7, -1 if check_freed_slots else 8, 9], dtype=torch.int64)
    track.track_mamba_states_if_needed(conv_states, ssm_states, cache_indices, mask, track_indices, batch_size=4,
                                       check_freed_slots=check_freed_slots)
    copied = {0: 5, 2: 7} if check_freed_slots else {0: 5, 2: 7, 3: 8}
    for slot in range(10):
        src = next((s for s, d in copied.items() if d == slot), slot)
        assert torch.equal(conv_states[slot], before_conv[src]), slot
        assert torch.equal(ssm_states[slot], before_ssm[src]), slot


@pytest.mark.parametrize("check_freed_slots", [False, True])
def test_all_layers_decode_tracking_equals_per_layer_tracking(check_freed_slots: bool) -> None:
    """The gated-delta-net backend tracks every layer's pools ([layers, slots, ...]) in one call: the result equals
    the per-layer copy applied to each layer."""
    g = torch.Generator().manual_seed(1)
    conv_pool = torch.randn(3, 10, 6, 3, generator=g)
    ssm_pool = torch.randn(3, 10, 4, 8, 16, generator=g)
    expected_conv, expected_ssm = conv_pool.clone(), ssm_pool.clone()
    cache_indices = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    mask = torch.tensor([True, False, True, True, True])
    track_indices = torch.tensor([5, 6, 7, -1 if check_freed_slots else 8, 9], dtype=torch.int64)
    for layer in range(3):
        track.track_mamba_states_if_needed(expected_conv[layer], expected_ssm[layer], cache_indices, mask,
                                           track_indices, batch_size=4, check_freed_slots=check_freed_slots)
    track.track_mamba_states_all_layers(conv_pool, ssm_pool, cache_indices, mask, track_indices, batch_size=4,
                                        check_freed_slots=check_freed_slots)
    assert torch.equal(conv_pool, expected_conv) and torch.equal(ssm_pool, expected_ssm)
    assert not torch.equal(conv_pool[:, 5], conv_pool[:, 6])  # something was copied (slot 5 <- slot 0)
    assert torch.equal(ssm_pool[:, 7], ssm_pool[:, 2])


def test_extra_buffer_is_allowed_on_cpu_for_hybrids_whose_kernels_track_states() -> None:
    """SGLang refuses `--mamba-radix-cache-strategy extra_buffer` off CUDA / ROCm / MUSA / NPU / XPU; the CPU runtime
    allows it for NemotronH (its SSD scan returns track states), Qwen3-Next and Qwen3.5 (the gated-delta-net chunk op
    returns per-chunk states), with decode tracking bound, and still refuses any other hybrid by name."""
    code = (
        "from types import SimpleNamespace as N\n"
        "import sglang.srt.arg_groups.mamba_hook as h\n"
        "import sglang.srt.layers.attention.hybrid_linear_attn_backend as b\n"
        "from sglang_radixflow.cpu.mamba2 import track\n"
        "assert h._platform_supports_mamba_cache_extra_buffer()\n"
        "assert b.track_mamba_states_if_needed is track.track_mamba_states_if_needed\n"
        "assert b.track_mamba_states_all_layers is track.track_mamba_states_all_layers\n"
        "view = N(mamba_radix_cache_strategy='extra_buffer', speculative_num_draft_tokens=None, page_size=None)\n"
        "h.supports_mamba_cache_extra_buffer = lambda view, cfg: True\n"
        "for arch in ('NemotronHForCausalLM', 'Qwen3NextForCausalLM', 'Qwen3_5ForCausalLM'):\n"
        "    h.validate_mamba_extra_buffer(view, N(architectures=[arch]), mamba_cache_chunk_size_of=lambda: 64)\n"
        "try:\n"
        "    h.validate_mamba_extra_buffer(view, N(architectures=['FalconH1ForCausalLM']), "
        "mamba_cache_chunk_size_of=lambda: 64)\n"
        "except AssertionError as e:\n"
        "    print('REFUSED', e)\n"
    )
    proc = run_in_cpu_engine(code)
    assert proc.returncode == 0, failure_text(proc)
    assert "REFUSED extra_buffer on the CPU runtime supports NemotronHForCausalLM, Qwen3NextForCausalLM, " \
           "Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration only, not FalconH1ForCausalLM; " \
           "use --mamba-radix-cache-strategy no_buffer" in proc.stdout, failure_text(proc)
