#!/usr/bin/env python
"""Prefill throughput of the CPU Mamba-2 mixer ops (causal conv1d + SSD scan), chunked vs a per-token loop.

Shapes are those of the tiny NemotronH that `radixflow make-model --arch nemotron_h` writes (8 heads x 32,
2 groups, state 16, conv width 4, chunk 64). "chunked" is what the CPU runtime binds into SGLang
(sglang_radixflow.cpu.mamba2: one depthwise conv1d call + the chunked SSD scan); "per-token" is the recurrent
reference a naive fallback would use (one conv window and one state update per token). Both are run on the same
random inputs as one varlen batch (the total split over `--seqs` sequences, half of them with initial states),
and their outputs are compared before timing is reported (rel dy / rel dstate: max abs difference over max abs
value; in bfloat16 the outputs are rounded to bf16, so ~1e-2 there is one rounding step).

    python scripts/bench_cpu_prefill.py [--tokens 2048 8192] [--seqs 1] [--repeats 5] [--dtype bfloat16] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Callable

import torch
import torch.nn.functional as F

from sglang_radixflow.cpu.mamba2 import conv, ssd

# tiny NemotronH mixer shape
HEADS, HEAD_DIM, GROUPS, STATE, WIDTH, CHUNK = 8, 32, 2, 16, 4, 64
CONV_DIM = HEADS * HEAD_DIM + 2 * GROUPS * STATE


def make_inputs(total: int, seqs: int, dtype: torch.dtype, seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    base = total // seqs
    lens = [base] * (seqs - 1) + [total - base * (seqs - 1)]
    return dict(
        lens=lens,
        xBC=torch.randn(total, CONV_DIM, generator=g).to(dtype),
        dt=(torch.randn(total, HEADS, generator=g) - 1).to(dtype),
        w=(torch.randn(CONV_DIM, WIDTH, generator=g) * 0.5).to(dtype),
        wb=torch.randn(CONV_DIM, generator=g).to(dtype),
        A=-torch.rand(HEADS, generator=g) - 0.1,
        D=torch.randn(HEADS, generator=g),
        dt_bias=torch.randn(HEADS, generator=g) * 0.3,
        has_init=torch.arange(seqs) % 2 == 1,
        conv0=torch.randn(seqs, CONV_DIM, WIDTH - 1, generator=g).to(dtype),
        ssm0=torch.randn(seqs, HEADS, HEAD_DIM, STATE, generator=g),
    )


def run_chunked(inp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    lens = inp["lens"]
    n = sum(lens)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    conv_pool = inp["conv0"].clone()
    ssm_pool = inp["ssm0"].clone()
    slots = torch.arange(len(lens), dtype=torch.int32)
    xc = conv.causal_conv1d_fn(
        inp["xBC"].t(), inp["w"], inp["wb"], activation="silu", conv_states=conv_pool,
        has_initial_state=inp["has_init"], cache_indices=slots, query_start_loc=qsl, seq_lens_cpu=lens,
    ).t()
    x, B, C = torch.split(xc, [HEADS * HEAD_DIM, GROUPS * STATE, GROUPS * STATE], dim=-1)
    out = torch.empty(1, n, HEADS, HEAD_DIM, dtype=xc.dtype)
    init = torch.where(inp["has_init"][:, None, None, None], ssm_pool[slots.long()], 0)
    _, varlen, _ = ssd.mamba_chunk_scan_combined(
        x.reshape(1, n, HEADS, HEAD_DIM), inp["dt"][None], inp["A"], B.reshape(1, n, GROUPS, STATE),
        C.reshape(1, n, GROUPS, STATE), CHUNK, D=inp["D"], dt_bias=inp["dt_bias"], cu_seqlens=qsl,
        initial_states=init, dt_softplus=True, return_varlen_states=True, return_track_states=True, out=out,
        seq_idx=torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), torch.tensor(lens))[None],
        state_dtype=torch.float32,
    )
    return out[0], varlen


def run_per_token(inp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One window and one recurrent state update per token (float32), sequence by sequence."""
    lens = inp["lens"]
    w = inp["w"].float()
    wb = inp["wb"].float()
    A = inp["A"]
    R = HEADS // GROUPS
    outs, finals = [], []
    start = 0
    for i, n in enumerate(lens):
        window = inp["conv0"][i].float().clone() if inp["has_init"][i] else torch.zeros(CONV_DIM, WIDTH - 1)
        state = inp["ssm0"][i].clone() if inp["has_init"][i] else torch.zeros(HEADS, HEAD_DIM, STATE)
        for t in range(start, start + n):
            xt = inp["xBC"][t].float()
            full = torch.cat([window, xt[:, None]], dim=1)
            window = full[:, 1:]
            xc = F.silu((full * w).sum(1) + wb).to(inp["xBC"].dtype).float()
            x, B, C = torch.split(xc, [HEADS * HEAD_DIM, GROUPS * STATE, GROUPS * STATE])
            x = x.view(HEADS, HEAD_DIM)
            d = F.softplus(inp["dt"][t].float() + inp["dt_bias"], threshold=20.0)
            Bh = B.view(GROUPS, STATE).repeat_interleave(R, 0)
            Ch = C.view(GROUPS, STATE).repeat_interleave(R, 0)
            state = state * torch.exp(d * A)[:, None, None] + (d[:, None] * x)[:, :, None] * Bh[:, None, :]
            outs.append(((state * Ch[:, None, :]).sum(-1) + x * inp["D"][:, None]).to(inp["xBC"].dtype))
        finals.append(state)
        start += n
    return torch.stack(outs), torch.stack(finals)


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Best of `repeats` wall times (the least disturbed by other load on a shared 2-core machine)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--seqs", type=int, default=1, help="sequences the tokens are split into (varlen batch)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of the chunked ops (best is reported)")
    ap.add_argument("--ref-repeats", type=int, default=2, help="timed runs of the per-token reference")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads (default 1: the per-token loop is effectively serial, and on a shared 2-core "
        "machine multi-threaded ops swing by 10x with other load; 0 = torch's default)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; times are best of N wall times")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, dtype {args.dtype}, "
          f"mixer: heads {HEADS}x{HEAD_DIM}, groups {GROUPS}, state {STATE}, conv {WIDTH}, chunk {CHUNK}")
    print(f"{'tokens':>7} {'seqs':>4} {'chunked ms':>11} {'tok/s':>10} {'per-token ms':>13} {'tok/s':>9} "
          f"{'speedup':>8} {'rel dy':>9} {'rel dstate':>11}")
    for total in args.tokens:
        inp = make_inputs(total, args.seqs, dtype)
        run_chunked(inp)  # warm-up
        y_c, s_c = run_chunked(inp)
        y_r, s_r = run_per_token(inp)
        dy = ((y_c.float() - y_r.float()).abs().max() / y_r.float().abs().max()).item()
        ds = ((s_c - s_r).abs().max() / s_r.abs().max()).item()
        t_c = timed(lambda: run_chunked(inp), args.repeats)
        t_r = timed(lambda: run_per_token(inp), args.ref_repeats)
        print(f"{total:>7} {args.seqs:>4} {t_c * 1e3:>11.1f} {total / t_c:>10.0f} {t_r * 1e3:>13.1f} "
              f"{total / t_r:>9.0f} {t_r / t_c:>7.1f}x {dy:>9.2e} {ds:>11.2e}")


if __name__ == "__main__":
    main()
