"""Gated-delta-net CPU ops (sglang_radixflow.cpu.gdn) against plain per-token references.

References loop over sequences, tokens and heads in float64, straight from the recurrences, so they share no code
with the chunked / vectorised implementations under test.
"""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from sglang_radixflow.cpu.gdn import conv, norm, ops
from tests.unit.cpu.fresh import failure_text, run_in_cpu_engine

F64 = torch.float64


def _rand(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(dtype)


def _cu(lens: list[int]) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


# ----------------------------------------------------------------------------------------------------------------------
# references
# ----------------------------------------------------------------------------------------------------------------------
def ref_gated_delta_rule(q, k, v, g, beta, cu, pool, indices, *, l2norm, scale=None):
    """Per token and head: S <- e^g S; S <- S + beta (v - S k) k^T; o = S (scale q). Pool layout [slots, HV, V, K]."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    scale = K**-0.5 if scale is None else scale
    out = torch.zeros(T, HV, V, dtype=F64)
    new_pool = None if pool is None else pool.to(F64).clone()
    finals = []
    for i in range(len(cu) - 1):
        for h in range(HV):
            kh = h // (HV // H)
            idx = None if indices is None else indices[i]
            if pool is None or idx is None or idx < 0:
                S = torch.zeros(V, K, dtype=F64)
            else:
                S = pool[idx, h].to(F64).clone()
            for t in range(cu[i], cu[i + 1]):
                qt, kt = q[t, kh].to(F64), k[t, kh].to(F64)
                if l2norm:
                    qt = qt / torch.sqrt((qt * qt).sum() + 1e-6)
                    kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
                S = S * torch.exp(g[t, h].to(F64))
                S = S + beta[t, h].to(F64) * torch.outer(v[t, h].to(F64) - S @ kt, kt)
                out[t, h] = S @ (qt * scale)
            if new_pool is not None and idx is not None and idx >= 0:
                new_pool[idx, h] = S
            finals.append(S)
    return out, new_pool, torch.stack(finals).view(len(cu) - 1, HV, V, K)


def ref_causal_conv(x, weight, bias, silu, cu, states, slots, has_init):
    """x [dim, T]; per sequence, per token: out_t = act(b + sum_w weight[:, w] x_{t - (width-1) + w})."""
    dim, T = x.shape
    width = weight.shape[1]
    out = torch.zeros(dim, T, dtype=F64)
    new_states = None if states is None else states.to(F64).clone()
    for i in range(len(cu) - 1):
        hist = torch.zeros(dim, width - 1, dtype=F64)
        if states is not None and has_init[i] and slots[i] >= 0:
            hist = states[slots[i]].to(F64).clone()
        cols = [hist[:, j] for j in range(width - 1)]
        for t in range(cu[i], cu[i + 1]):
            cols.append(x[:, t].to(F64))
            acc = torch.zeros(dim, dtype=F64) if bias is None else bias.to(F64).clone()
            for w in range(width):
                acc = acc + weight[:, w].to(F64) * cols[len(cols) - width + w]
            out[:, t] = F.silu(acc) if silu else acc
        if new_states is not None and slots[i] >= 0:
            new_states[slots[i]] = torch.stack(cols[-(width - 1):], dim=1)
    return out, new_states


# ----------------------------------------------------------------------------------------------------------------------
# gated delta rule: chunked prefill
# ----------------------------------------------------------------------------------------------------------------------
def _gdn_inputs(lens, H=2, HV=4, K=16, V=24, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    T = sum(lens)
    q, k = _rand(T, H, K, dtype=dtype), _rand(T, H, K, dtype=dtype)
    v = _rand(T, HV, V, dtype=dtype)
    g = -F.softplus(_rand(T, HV)) * 0.5  # log decay <= 0, spread over (-3, 0)
    beta = torch.sigmoid(_rand(T, HV))
    return q, k, v, g, beta


# lengths chosen so chunk boundaries (16 / 64) fall inside, at and just past sequence ends
LENS = [1, 15, 16, 17, 63, 64, 65, 130, 3]


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("l2norm", [True, False])
def test_chunk_matches_per_token_reference_with_cache_indices(chunk_size: int, l2norm: bool) -> None:
    q, k, v, g, beta = _gdn_inputs(LENS)
    if not l2norm:  # keep the un-normalised recurrence stable
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1) * 0.9
    cu = _cu(LENS)
    n_slots = 14
    pool = _rand(n_slots, 4, 24, 16, scale=0.5)
    indices = [7, 2, 11, -1, 0, 13, 5, 9, 3]  # non-trivial mapping, one pad slot
    before = pool.clone()
    ref_o, ref_pool, _ = ref_gated_delta_rule(q, k, v, g, beta, cu, before, indices, l2norm=l2norm)

    o, final, _ = ops.chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, initial_state=pool, initial_state_indices=indices,
        use_qk_l2norm=l2norm, chunk_size=chunk_size,
    )
    torch.testing.assert_close(o.to(F64), ref_o, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(pool.to(F64), ref_pool, rtol=1e-4, atol=2e-5)
    untouched = [s for s in range(n_slots) if s not in indices]
    assert torch.equal(pool[untouched], before[untouched])
    assert final.shape == (len(LENS), 4, 24, 16)


def test_chunk_without_initial_state_and_per_sequence_states() -> None:
    lens = [5, 70, 33]
    q, k, v, g, beta = _gdn_inputs(lens, seed=1)
    cu = _cu(lens)
    ref_o, _, ref_final = ref_gated_delta_rule(q, k, v, g, beta, cu, None, None, l2norm=True)
    o, final, _ = ops.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, initial_state=None, use_qk_l2norm=True)
    torch.testing.assert_close(o.to(F64), ref_o, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(final.to(F64), ref_final, rtol=1e-4, atol=2e-5)

    # one state per sequence (no indices): read and overwritten in order
    states = _rand(3, 4, 24, 16, scale=0.3)
    ref_o, ref_states, _ = ref_gated_delta_rule(q, k, v, g, beta, cu, states.clone(), [0, 1, 2], l2norm=True)
    o, _, _ = ops.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, initial_state=states, use_qk_l2norm=True)
    torch.testing.assert_close(o.to(F64), ref_o, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(states.to(F64), ref_states, rtol=1e-4, atol=2e-5)


def test_chunk_strong_decay_and_long_sequence() -> None:
    """Decays near zero and one 300-token sequence: exp of large in-chunk log-decay gaps must not overflow."""
    lens = [300, 2]
    q, k, v, g, beta = _gdn_inputs(lens, seed=2)
    g = g * 12.0  # log decays down to about -40
    cu = _cu(lens)
    pool = _rand(4, 4, 24, 16)
    ref_o, ref_pool, _ = ref_gated_delta_rule(q, k, v, g, beta, cu, pool.clone(), [3, 1], l2norm=True)
    o, _, _ = ops.chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, initial_state=pool, initial_state_indices=[3, 1], use_qk_l2norm=True
    )
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o.to(F64), ref_o, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(pool.to(F64), ref_pool, rtol=1e-4, atol=2e-5)


def test_chunked_prefill_split_equals_whole_prefill() -> None:
    """Prefill in two extends (state carried through the pool) == one extend; split points off chunk boundaries."""
    lens = [100, 37, 64]
    q, k, v, g, beta = _gdn_inputs(lens, seed=3)
    cu = _cu(lens)
    slots = [4, 0, 2]
    pool_a = torch.zeros(5, 4, 24, 16)
    o_whole, _, _ = ops.chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, initial_state=pool_a, initial_state_indices=slots, use_qk_l2norm=True
    )
    cut = [45, 1, 64]  # first part of each sequence
    first = torch.cat([torch.arange(cu[i], cu[i] + cut[i]) for i in range(3)])
    second = torch.cat([torch.arange(cu[i] + cut[i], cu[i + 1]) for i in range(3)])
    pool_b = torch.zeros(5, 4, 24, 16)
    o1, _, _ = ops.chunk_gated_delta_rule(
        q[first], k[first], v[first], g[first], beta[first], cu_seqlens=_cu(cut),
        initial_state=pool_b, initial_state_indices=slots, use_qk_l2norm=True,
    )
    rest = [lens[i] - cut[i] for i in range(3)]
    keep = [i for i in range(3) if rest[i] > 0]
    o2, _, _ = ops.chunk_gated_delta_rule(
        q[second], k[second], v[second], g[second], beta[second], cu_seqlens=_cu([rest[i] for i in keep]),
        initial_state=pool_b, initial_state_indices=[slots[i] for i in keep], use_qk_l2norm=True,
    )
    o_split = torch.empty_like(o_whole)
    o_split[first], o_split[second] = o1, o2
    torch.testing.assert_close(o_split, o_whole, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pool_b, pool_a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_chunk_states_equal_per_token_states_at_chunk_starts(chunk_size: int) -> None:
    """extra_buffer snapshots: h row (sequence offset + c) == the state a per-token recurrence reaches after the
    sequence's first c * chunk_size tokens (c = 0: its initial state), for sequences that start from cached states,
    from zeros (pad slot) and that end on, before and past a chunk boundary."""
    lens = [1, 16, 17, 64, 100]
    q, k, v, g, beta = _gdn_inputs(lens, seed=6)
    cu = _cu(lens)
    pool = _rand(6, 4, 24, 16, scale=0.5)
    indices = [4, 0, -1, 2, 5]
    before = pool.clone()
    _, _, h = ops.chunk_gated_delta_rule(
        q, k, v, g, beta, cu_seqlens=cu, initial_state=pool, initial_state_indices=indices, use_qk_l2norm=True,
        chunk_size=chunk_size,
    )
    row = 0
    for i, n in enumerate(lens):
        for c in range((n + chunk_size - 1) // chunk_size):
            if c == 0:
                expected = torch.zeros(4, 24, 16, dtype=F64) if indices[i] < 0 else before[indices[i]].to(F64)
            else:
                span = slice(cu[i], cu[i] + c * chunk_size)
                _, _, finals = ref_gated_delta_rule(
                    q[span], k[span], v[span], g[span], beta[span], [0, c * chunk_size], before, [indices[i]],
                    l2norm=True,
                )
                expected = finals[0]
            torch.testing.assert_close(h[row].to(F64), expected, rtol=1e-4, atol=2e-5, msg=f"seq {i} chunk {c}")
            row += 1
    assert row == h.shape[0]


def test_chunk_sgl_kernel_signature_bf16() -> None:
    """The sgl_kernel.mamba wrapper, called the way gdn_triton.py calls it, on bf16 activations."""
    lens = [20, 1, 77]
    q, k, v, g, beta = _gdn_inputs(lens, dtype=torch.bfloat16, seed=4)
    cu = torch.tensor(_cu(lens), dtype=torch.int32)
    pool = _rand(6, 4, 24, 16, scale=0.5)
    idx = torch.tensor([5, 0, 3], dtype=torch.int32)
    ref_o, ref_pool, _ = ref_gated_delta_rule(q, k, v, g, beta, cu.tolist(), pool.clone(), idx.tolist(), l2norm=True)
    o, last, h = ops.chunk_gated_delta_rule_cpu(
        q=q[None], k=k[None], v=v[None], g=g[None], beta=beta[None], initial_state=pool, cu_seqlens=cu,
        head_first=False, use_qk_l2norm_in_kernel=True, initial_state_indices=idx,
    )
    assert o.shape == (1, sum(lens), 4, 24) and o.dtype == torch.bfloat16
    assert h.shape == (1, 1 + 1 + 2, 4, 24, 16) and h.dtype == torch.float32  # 64-token chunks: 1 + 1 + 2
    torch.testing.assert_close(o[0].to(F64), ref_o, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(pool.to(F64), ref_pool, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(last.to(F64), ref_pool[idx.long()], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------------------------------
# gated delta rule: decode (fused sigmoid gating + recurrent update)
# ----------------------------------------------------------------------------------------------------------------------
def _gates(A_log, a, b, dt_bias):
    g = -torch.exp(A_log.to(F64)) * F.softplus(a.to(F64) + dt_bias.to(F64))
    return g, torch.sigmoid(b.to(F64))


@pytest.mark.parametrize("with_pad", [True, False])
@pytest.mark.parametrize("lens", [[1, 1, 1, 1, 1], [3, 1, 2]])
def test_decode_update_matches_reference(lens: list[int], with_pad: bool) -> None:
    torch.manual_seed(5)
    T, H, HV, K, V = sum(lens), 2, 4, 16, 24
    q, k, v = _rand(1, T, H, K), _rand(1, T, H, K), _rand(1, T, HV, V)
    a, b = _rand(T, HV), _rand(T, HV)
    A_log, dt_bias = _rand(HV, scale=0.5), _rand(HV, scale=0.5)
    pool = _rand(9, HV, V, K, scale=0.5)
    indices = torch.tensor(([6, 1, -1, 8, 2] if with_pad else [6, 1, 0, 8, 2])[: len(lens)], dtype=torch.int32)
    cu = torch.tensor(_cu(lens), dtype=torch.int32)
    g, beta = _gates(A_log, a, b, dt_bias)
    ref_o, ref_pool, _ = ref_gated_delta_rule(q[0], k[0], v[0], g, beta, cu.tolist(), pool.clone(), indices.tolist(),
                                              l2norm=True)
    before = pool.clone()
    o = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=indices, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0,
    )
    assert o.shape == (1, T, HV, V)
    torch.testing.assert_close(o[0].to(F64), ref_o, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(pool.to(F64), ref_pool, rtol=1e-4, atol=2e-5)
    untouched = [s for s in range(9) if s not in indices.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


def test_prefill_then_decode_equals_prefill_of_everything() -> None:
    """Chunked prefill of n tokens, then single-token decode steps == chunked prefill of n + steps tokens."""
    torch.manual_seed(6)
    lens, steps, H, HV, K, V = [70, 9], 3, 2, 4, 16, 24
    n = [x + steps for x in lens]
    T = sum(n)
    q, k, v = _rand(T, H, K), _rand(T, H, K), _rand(T, HV, V)
    a, b = _rand(T, HV), _rand(T, HV)
    A_log, dt_bias = _rand(HV, scale=0.5), _rand(HV, scale=0.5)
    g, beta = ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    cu_all = _cu(n)
    pool_ref = torch.zeros(4, HV, V, K)
    o_ref, _, _ = ops.chunk_gated_delta_rule(q, k, v, g[0], beta[0], cu_seqlens=cu_all, initial_state=pool_ref,
                                          initial_state_indices=[3, 1], use_qk_l2norm=True)
    pool = torch.zeros(4, HV, V, K)
    pre = torch.cat([torch.arange(cu_all[i], cu_all[i] + lens[i]) for i in range(2)])
    o_pre, _, _ = ops.chunk_gated_delta_rule(q[pre], k[pre], v[pre], g[0][pre], beta[0][pre], cu_seqlens=_cu(lens),
                                          initial_state=pool, initial_state_indices=[3, 1], use_qk_l2norm=True)
    torch.testing.assert_close(o_pre, o_ref[pre], rtol=1e-4, atol=1e-5)
    for s in range(steps):
        tok = torch.tensor([cu_all[i] + lens[i] + s for i in range(2)])
        o = ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log, dt_bias, q[tok][None], k[tok][None], v[tok][None], a[tok], b[tok], pool,
            torch.tensor([3, 1], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32), True,
        )
        torch.testing.assert_close(o[0], o_ref[tok], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pool, pool_ref, rtol=1e-4, atol=1e-5)


def test_fused_gdn_gating() -> None:
    torch.manual_seed(7)
    A_log = _rand(6)
    a, b = _rand(11, 6, dtype=torch.bfloat16, scale=8.0), _rand(11, 6, dtype=torch.bfloat16, scale=3.0)
    dt_bias = _rand(6, dtype=torch.bfloat16)
    g, beta = ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    assert g.shape == beta.shape == (1, 11, 6) and g.dtype == beta.dtype == torch.float32
    x = a.double() + dt_bias.double()
    softplus = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    torch.testing.assert_close(g[0].double(), -torch.exp(A_log.double()) * softplus, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(beta[0].double(), torch.sigmoid(b.double()), rtol=1e-2, atol=0)


# ----------------------------------------------------------------------------------------------------------------------
# causal conv1d
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_causal_conv1d_fn_varlen_matches_reference(silu: bool, with_bias: bool) -> None:
    torch.manual_seed(8)
    lens = [1, 2, 3, 9, 40, 4]  # shorter than, equal to and longer than the width - 1 history
    dim, width, T = 12, 4, sum(lens)
    x_tok = _rand(T, dim)  # SGLang passes mixed_qkv.transpose(0, 1): a non-contiguous [dim, T] view
    x = x_tok.transpose(0, 1)
    weight, bias = _rand(dim, width), (_rand(dim) if with_bias else None)
    states = _rand(10, dim, width - 1)
    slots = torch.tensor([3, 9, 0, -1, 6, 1], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, True, True, False])
    cu = torch.tensor(_cu(lens), dtype=torch.int32)
    before = states.clone()
    ref, ref_states = ref_causal_conv(x, weight, bias, silu, cu.tolist(), before, slots.tolist(), has_init.tolist())
    out = conv.causal_conv1d_fn_cpu(
        x, weight, bias, activation="silu" if silu else None, conv_states=states, has_initial_state=has_init,
        cache_indices=slots, query_start_loc=cu, seq_lens_cpu=lens,
    )
    assert out.shape == (dim, T)
    torch.testing.assert_close(out.to(F64), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states.to(F64), ref_states, rtol=0, atol=0)
    assert torch.equal(states[[2, 4, 5, 7, 8]], before[[2, 4, 5, 7, 8]])


@pytest.mark.parametrize("with_pad", [True, False])
@pytest.mark.parametrize("seqlen", [1, 2])
def test_causal_conv1d_update_matches_reference(seqlen: int, with_pad: bool) -> None:
    torch.manual_seed(9)
    batch, dim, width = 5, 12, 4
    x = _rand(batch, dim, seqlen)
    weight, bias = _rand(dim, width), _rand(dim)
    states = _rand(8, dim, width - 1)
    slots = torch.tensor([7, 0, -1, 4, 2] if with_pad else [7, 0, 1, 4, 2], dtype=torch.int32)
    before = states.clone()
    out = conv.causal_conv1d_update_cpu(
        x[..., 0] if seqlen == 1 else x, states, weight, bias, "silu", conv_state_indices=slots
    )
    for i in range(batch):
        ref, ref_states = ref_causal_conv(
            x[i], weight, bias, True, [0, seqlen], before, [int(slots[i])], [True]
        )
        got = out[i] if seqlen > 1 else out[i][:, None]
        torch.testing.assert_close(got.to(F64), ref, rtol=1e-5, atol=1e-5)
        if slots[i] >= 0:
            torch.testing.assert_close(states[slots[i]].to(F64), ref_states[slots[i]], rtol=0, atol=0)
    assert torch.equal(states[[3, 5, 6]], before[[3, 5, 6]])
    if with_pad:
        assert torch.equal(states[1], before[1])


def test_conv_prefill_then_update_equals_prefill_of_everything() -> None:
    torch.manual_seed(10)
    dim, width, n = 8, 4, 11
    x = _rand(dim, n + 2, dtype=torch.bfloat16)
    weight, bias = _rand(dim, width, dtype=torch.bfloat16), _rand(dim, dtype=torch.bfloat16)
    whole_states = torch.zeros(3, dim, width - 1, dtype=torch.bfloat16)
    idx = torch.tensor([2], dtype=torch.int32)
    whole = conv.causal_conv1d_fn_cpu(x, weight, bias, activation="silu", conv_states=whole_states,
                                     has_initial_state=torch.tensor([False]), cache_indices=idx,
                                     query_start_loc=torch.tensor([0, n + 2], dtype=torch.int32))
    states = torch.zeros(3, dim, width - 1, dtype=torch.bfloat16)
    part = conv.causal_conv1d_fn_cpu(x[:, :n], weight, bias, activation="silu", conv_states=states,
                                    has_initial_state=torch.tensor([False]), cache_indices=idx,
                                    query_start_loc=torch.tensor([0, n], dtype=torch.int32))
    step1 = conv.causal_conv1d_update_cpu(x[:, n][None], states, weight, bias, "silu", conv_state_indices=idx)
    step2 = conv.causal_conv1d_update_cpu(x[:, n + 1][None], states, weight, bias, "silu", conv_state_indices=idx)
    torch.testing.assert_close(torch.cat([part, step1.T, step2.T], dim=1), whole, rtol=0, atol=0)
    assert torch.equal(states, whole_states)


# ----------------------------------------------------------------------------------------------------------------------
# gated RMSNorm and the shared-expert gate
# ----------------------------------------------------------------------------------------------------------------------
def _ref_norm(x, w, z, eps, act, group=None, before=True):
    x, z = x.to(F64), z.to(F64)
    gate = F.silu(z) if act in ("silu", "swish") else torch.sigmoid(z)
    if not before:
        x = x * gate
    n = x.shape[-1]
    gs = group or n
    xg = x.reshape(*x.shape[:-1], n // gs, gs)
    y = (xg / torch.sqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).reshape(x.shape) * w.to(F64)
    return y * gate if before else y


@pytest.mark.parametrize("act", ["silu", "swish", "sigmoid"])
def test_rms_norm_gated(act: str) -> None:
    torch.manual_seed(11)
    x, z, w = _rand(7, 32), _rand(7, 32), _rand(32)
    y = norm.rms_norm_gated(x, z, w, None, activation=act, eps=1e-6)
    torch.testing.assert_close(y.to(F64), _ref_norm(x, w, z, 1e-6, act), rtol=1e-5, atol=1e-6)
    res = _rand(7, 32)
    y, pre = norm.rms_norm_gated(x, z, w, None, activation=act, residual=res, prenorm=True, eps=1e-6)
    torch.testing.assert_close(pre, x + res)
    torch.testing.assert_close(y.to(F64), _ref_norm(x + res, w, z, 1e-6, act), rtol=1e-5, atol=1e-6)
    xb = x.to(torch.bfloat16)
    yb = norm.rms_norm_gated(xb, z.to(torch.bfloat16), w.to(torch.bfloat16), None, activation=act, eps=1e-6)
    assert yb.dtype == torch.bfloat16


@pytest.mark.parametrize("group,before", [(None, True), (8, True), (8, False), (None, False)])
def test_gated_rms_norm_groups_and_gate_order(group, before) -> None:
    torch.manual_seed(12)
    x, z, w = _rand(5, 32), _rand(5, 32), _rand(32)
    y = norm.gated_rms_norm(x, w, None, z, 1e-5, "swish", group_size=group, norm_before_gate=before)
    torch.testing.assert_close(y.to(F64), _ref_norm(x, w, z, 1e-5, "swish", group, before), rtol=1e-5, atol=1e-6)


def test_fused_gate_sigmoid_mul_add() -> None:
    torch.manual_seed(13)
    h, w, s, f = _rand(6, 16), _rand(16), _rand(6, 16), _rand(6, 16)
    expect = f.double() + torch.sigmoid(h.double() @ w.double())[:, None] * s.double()
    out = f.clone()
    norm.fused_gate_sigmoid_mul_add(h, w, s, out)
    torch.testing.assert_close(out.double(), expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.fused_gate_sigmoid_mul(h, w, s).double(), expect - f.double(), rtol=1e-5,
                               atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# binding
# ----------------------------------------------------------------------------------------------------------------------
def test_torch_ops_registered_and_callable_with_sglang_keywords() -> None:
    from sglang_radixflow.cpu.gdn import bind

    bind.register_torch_ops()
    assert bind.register_torch_ops() == []  # idempotent
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")  # must not switch SGLang to AMX paths
    torch.manual_seed(14)
    HV = 4
    A_log, dt_bias = _rand(HV), _rand(HV, dtype=torch.bfloat16)
    a, b = _rand(3, HV, dtype=torch.bfloat16), _rand(3, HV, dtype=torch.bfloat16)
    g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    g2, beta2 = ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    assert torch.equal(g, g2) and torch.equal(beta, beta2)
    pool = torch.zeros(5, HV, 8, 16)
    with torch.inference_mode():
        o = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log, dt_bias=dt_bias, q=_rand(1, 3, 2, 16, dtype=torch.bfloat16),
            k=_rand(1, 3, 2, 16, dtype=torch.bfloat16), v=_rand(1, 3, HV, 8, dtype=torch.bfloat16), a=a, b=b,
            initial_state_source=pool, initial_state_indices=torch.tensor([4, 0, 2], dtype=torch.int32),
            cu_seqlens=torch.tensor([0, 1, 2, 3], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0, softplus_threshold=20.0,
        )
    assert o.shape == (1, 3, HV, 8)
    assert pool[[4, 0, 2]].abs().sum() > 0 and pool[[1, 3]].abs().sum() == 0


def test_sglang_modules_bind_our_ops_on_the_cpu_engine() -> None:
    """In a fresh interpreter with SGLANG_USE_CPU_ENGINE=1 (the .pth hook installs the runtime), SGLang's GDN, norm,
    MoE and Qwen3-Next modules import and resolve to these implementations."""
    code = textwrap.dedent(
        """
        import sys, torch
        from sglang_radixflow.cpu import boot
        from sglang_radixflow.cpu.gdn import conv, norm, ops
        assert boot.status()["installed"], boot.status()
        import sglang.srt.layers.attention.linear.gdn_backend as be
        import sglang.srt.layers.attention.linear.kernels.gdn_triton as tr
        import sglang.kernels.ops.attention.fla.fused_norm_gate as fng
        import sglang.kernels.ops.attention.fla.layernorm_gated as lng
        import sglang.srt.models.qwen2_moe as q2
        import sglang.srt.models.qwen3_next as q3
        assert boot.standin_active(), boot.status()
        assert tr.chunk_gated_delta_rule is ops.chunk_gated_delta_rule_cpu
        assert tr.fused_sigmoid_gating_delta_rule_update.__module__.startswith("sglang_radixflow")
        assert be.causal_conv1d_fn is conv.causal_conv1d_fn_cpu
        assert be.causal_conv1d_update is conv.causal_conv1d_update_cpu
        assert be.fused_gdn_gating.__module__.startswith("sglang_radixflow")
        assert fng.rms_norm_gated.__module__.startswith("sglang_radixflow")
        assert lng.layernorm_fn.__module__.startswith("sglang_radixflow")
        assert q2.fused_gate_sigmoid_mul_add is norm.fused_gate_sigmoid_mul_add
        assert q3.Qwen3GatedDeltaNet.__init__.__module__.startswith("sglang_radixflow")
        assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
        print("patched:", len(boot.status()["patched"]))
        """
    )
    proc = run_in_cpu_engine(code)
    assert proc.returncode == 0, failure_text(proc)
