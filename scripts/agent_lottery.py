"""Agent-level model of `radixflow bench agent`: LRU vs RR-Evict (share order) on the bench's own seeded schedules.

No server: one turn at a time, the n_a most recent agents locked, LRU evicting whole private histories by last
dispatch, RR cutting `block`-token tails from the idle history that keeps the largest share of its peak. It
reproduces the servers' seed-0 numbers closely and shows that LRU's mean missed tokens swing with the schedule while
rr's do not (their pooled means agree), which is why the bench pools several seeds.

    python scripts/agent_lottery.py [--seeds 6] [--capacity 17] [--block 16] [--return-order idle-time|random]
        [--idle-cv 0.5] [--first-tokens 600] [--new-tokens 40]
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from sglang_radixflow.bench.agent_workload import RETURN_ORDERS, AgentParams, make_agent_workload


def missed_per_return(policy: str, params: AgentParams, block: int) -> list[int]:
    w = make_agent_workload(params)
    capacity = params.kv_tokens() - params.system_tokens
    full: dict[int, int] = {}  # private tokens with KV after the agent's last turn
    have: dict[int, int] = {}  # of those, still cached
    peak: dict[int, int] = {}
    last: dict[int, int] = {}
    recent: list[int] = []
    missed: list[int] = []
    for i, (a, t) in enumerate(w.schedule):
        agent = w.agents[a]
        if t == 0:
            prompt = len(agent.first) - params.system_tokens
        else:
            missed.append(max(0, full[a] - have[a]))
            prompt = full[a] + 1 + len(agent.new[t - 1])
        full[a] = have[a] = prompt + params.gen_tokens - 1  # the last generated token never has KV
        peak[a] = max(peak.get(a, 0), full[a])
        last[a] = i
        recent = (recent + [a])[-params.active:]
        over = sum(have.values()) - capacity
        while over > 0:
            idle = [x for x in have if x not in recent and have[x] > 0]
            if not idle:
                break
            if policy == "lru":
                victim = min(idle, key=lambda x: last[x])
                cut = have[victim]
            else:
                victim = max(idle, key=lambda x: (have[x] / peak[x], -last[x]))
                cut = min(block, have[victim])
            have[victim] -= cut
            over -= cut
    return missed


def p99(values: list[int]) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--capacity", type=float, default=AgentParams().capacity)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--return-order", choices=RETURN_ORDERS, default=AgentParams().return_order)
    ap.add_argument("--idle-cv", type=float, default=AgentParams().idle_cv)
    ap.add_argument("--first-tokens", type=int, default=AgentParams().first_tokens)
    ap.add_argument("--new-tokens", type=int, default=AgentParams().new_tokens)
    args = ap.parse_args()
    pooled: dict[str, list[int]] = {"lru": [], "rr": []}
    for seed in range(args.seeds):
        params = replace(AgentParams(), seed=seed, capacity=args.capacity, return_order=args.return_order,
                         idle_cv=args.idle_cv, first_tokens=args.first_tokens, new_tokens=args.new_tokens)
        row = []
        for policy in pooled:
            m = missed_per_return(policy, params, args.block)
            pooled[policy] += m
            row.append(f"{policy} {statistics.mean(m):.0f} / {p99(m)}")
        print(f"seed {seed}: missed mean / P99  " + ",  ".join(row))
    print("pooled: " + ",  ".join(f"{k} {statistics.mean(v):.0f} / {p99(v)}" for k, v in pooled.items()))


if __name__ == "__main__":
    main()
