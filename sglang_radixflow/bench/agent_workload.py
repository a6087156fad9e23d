"""Agent workload for `radixflow bench agent`: N multi-turn trajectories, deterministic from a seed.

Each agent: a shared system prompt + a private first message, then every turn appends new user/tool tokens to its
history (prompt_t = prompt_{t-1} + output_{t-1} + new_t) and generates a few tokens. At most n_a agents run a turn at
any moment; the rest are idle ("tool / think" time), so the idle fraction is s = 1 - n_a/n. Who runs next is a fixed
seeded schedule (the same for every policy); an agent never re-enters within n_a dispatches of its last turn. Two
return orders (`return_order`):
- `idle-time` (default): after each turn the agent is busy for n_a dispatch slots and then idle for a drawn time of
  mean n - n_a slots with coefficient of variation `idle_cv` (gamma); the next dispatch goes to the agent whose idle
  time ends first. Agents whose tool / think times are alike come back in about the order they left, so the
  longest-idle agent is usually the next one back: the case the paper describes for LRU. idle_cv = 0 is a strict
  cycle; a large idle_cv approaches `random`;
- `random` (the first version): a random agent among those not dispatched in the last n_a slots. Returns are then
  memoryless, so the longest-idle agent is no likelier to come back than any other.
Cache capacity is sized in trajectories: m of them at their final length (n_a < m < n). Histories grow every turn,
so the capacity in trajectories m(t) = C / L(t) falls over the run; sizing at the final length keeps m(t) >= m, the
regime the analysis states (sizing at the mean length, as before, ended the run at m(t) ~ 0.68 m: most eviction
happened well below the stated m).
Timing (`mean_gap_ms`): 0 (default) is a closed loop, n_a clients sending the schedule back to back, so the turns in
flight start and finish together and every return shares its prefill round with n_a - 1 others; > 0 is open loop,
the schedule's k-th turn sent at a seeded Poisson instant (mean gap `mean_gap_ms`, and never before the agent's
previous turn finished), so returns arrive spread out as tool / think times of real agents make them. The order, and
with it the cache regime, is the same either way.
Token ids are generated locally (no tokenizer, no data set).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any


RETURN_ORDERS = ("idle-time", "random")


@dataclass(frozen=True)
class AgentParams:
    agents: int = 20  # n
    active: int = 4  # n_a: turns in flight at once
    capacity: float = 17.0  # m: cache capacity, in trajectories of final length
    turns: int = 8  # per agent
    system_tokens: int = 200  # shared by every agent
    first_tokens: int = 600  # private first user message
    new_tokens: int = 40  # user/tool tokens appended per turn (mean; +/- 25%)
    gen_tokens: int = 8  # generated per turn
    seed: int = 0
    vocab: tuple[int, int] = (3, 2000)  # token ids drawn from [lo, hi): valid for every tiny model
    return_order: str = "idle-time"  # see RETURN_ORDERS
    idle_cv: float = 0.5  # coefficient of variation of the idle time (idle-time order only)
    mean_gap_ms: float = 0.0  # 0: closed loop; > 0: open-loop dispatch, Poisson with this mean gap (dispatch_times)

    def __post_init__(self) -> None:
        errors = []
        if not 0 < self.active < self.capacity < self.agents:
            errors.append(f"need 0 < active (n_a={self.active}) < capacity (m={self.capacity}) < agents (n={self.agents})")
        for name in ("turns", "system_tokens", "first_tokens", "new_tokens", "gen_tokens"):
            if getattr(self, name) < 1:
                errors.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.return_order not in RETURN_ORDERS:
            errors.append(f"return_order={self.return_order!r}: allowed {', '.join(RETURN_ORDERS)}")
        if not self.idle_cv >= 0:
            errors.append(f"idle_cv={self.idle_cv} must be >= 0")
        if not self.mean_gap_ms >= 0:
            errors.append(f"mean_gap_ms={self.mean_gap_ms} must be >= 0 (0: closed loop)")
        if errors:
            raise ValueError("invalid agent workload: " + "; ".join(errors))

    @property
    def idle_fraction(self) -> float:  # s
        return 1.0 - self.active / self.agents

    @property
    def ideal_retained(self) -> float:  # h = (m - n_a) / (n s)
        return (self.capacity - self.active) / (self.agents * self.idle_fraction)

    def mean_trajectory_tokens(self) -> float:
        """Mean private history length over all turns (what `capacity` trajectories are measured in)."""
        per_turn = self.new_tokens + self.gen_tokens
        return self.first_tokens + per_turn * (self.turns - 1) / 2

    def final_trajectory_tokens(self) -> int:
        """Private history length after the last turn (first message + every turn's new and generated tokens)."""
        return self.first_tokens + self.gen_tokens + (self.new_tokens + self.gen_tokens) * (self.turns - 1)

    @property
    def new_jitter(self) -> int:  # a turn's new tokens are new_tokens +/- this
        return max(1, self.new_tokens // 4)

    def max_prompt_tokens(self) -> int:
        """Upper bound on any prompt: system + first message + every earlier turn's output and new tokens at most."""
        return (self.system_tokens + self.first_tokens
                + (self.new_tokens + self.new_jitter + self.gen_tokens) * (self.turns - 1))

    def kv_tokens(self) -> int:
        """One shared system prompt + m private histories of final length (so m(t) >= m all run long)."""
        return int(self.system_tokens + self.capacity * self.final_trajectory_tokens())


@dataclass
class Agent:
    aid: int
    first: list[int]  # system + first message
    new: list[list[int]] = field(default_factory=list)  # new tokens of turns 1..T-1


@dataclass(frozen=True)
class AgentWorkload:
    params: AgentParams
    agents: list[Agent]
    schedule: list[tuple[int, int]]  # dispatch order: (agent, turn)

    def describe(self) -> dict[str, Any]:
        p = self.params
        return {
            **{k: v for k, v in asdict(p).items() if k != "vocab"}, "vocab": list(p.vocab),
            "idle_fraction_s": p.idle_fraction, "ideal_retained_h": p.ideal_retained,
            "ideal_missed_fraction_q": 1.0 - p.ideal_retained, "kv_tokens": p.kv_tokens(),
            "mean_trajectory_tokens": p.mean_trajectory_tokens(),
            "final_trajectory_tokens": p.final_trajectory_tokens(), "max_prompt_tokens": p.max_prompt_tokens(),
            "requests": len(self.schedule),
            # every agent's own history is reusable on every return turn; only the new tokens must be computed
            "ideal_reuse_ratio": ideal_reuse_ratio(self),
        }


def make_agent_workload(params: AgentParams) -> AgentWorkload:
    rng = random.Random(params.seed)
    lo, hi = params.vocab
    system = [rng.randrange(lo, hi) for _ in range(params.system_tokens)]
    agents = []
    for a in range(params.agents):
        first = system + [rng.randrange(lo, hi) for _ in range(params.first_tokens)]
        jitter = params.new_jitter
        new = [[rng.randrange(lo, hi) for _ in range(max(1, params.new_tokens + rng.randint(-jitter, jitter)))]
               for _ in range(params.turns - 1)]
        agents.append(Agent(a, first, new))
    return AgentWorkload(params, agents, make_schedule(params, rng))


def idle_slots(params: AgentParams, rng: random.Random) -> float:
    """One idle ("tool / think") time in dispatch slots: gamma with mean n - n_a and CV idle_cv (0: exactly the mean)."""
    mean_idle = params.agents - params.active
    if params.idle_cv == 0:
        return float(mean_idle)
    shape = 1.0 / params.idle_cv ** 2
    return rng.gammavariate(shape, mean_idle / shape)


def make_schedule(params: AgentParams, rng: random.Random) -> list[tuple[int, int]]:
    """Seeded dispatch order. Every agent starts once (in a shuffled order); then, among agents with turns left that
    were not among the last n_a dispatches, the one whose idle time ends first (idle-time order) or a random one
    (random order) goes next."""
    next_turn = [0] * params.agents
    back_at = [0.0] * params.agents  # idle-time order: the slot at which each agent's idle time ends
    order: list[tuple[int, int]] = []
    first = list(range(params.agents))
    rng.shuffle(first)
    recent: list[int] = []

    def dispatch(a: int) -> None:
        nonlocal recent
        if params.return_order == "idle-time":  # the random order draws nothing here (its seeds keep their schedules)
            back_at[a] = len(order) + params.active + idle_slots(params, rng)
        order.append((a, next_turn[a]))
        next_turn[a] += 1
        recent = (recent + [a])[-params.active:]

    for a in first:
        dispatch(a)
    while True:
        ready = [a for a in range(params.agents) if next_turn[a] < params.turns and a not in recent]
        if not ready:
            ready = [a for a in range(params.agents) if next_turn[a] < params.turns]
            if not ready:
                return order
            # the tail end: fewer agents than n_a + 1 still have turns
        if params.return_order == "random":
            dispatch(rng.choice(ready))
        else:
            dispatch(min(ready, key=lambda a: (back_at[a], a)))


def dispatch_times(params: AgentParams, count: int) -> list[float]:
    """Open loop: the instants (s from the start) at which the schedule's turns are sent, Poisson with mean gap
    mean_gap_ms; the same for every policy (its own seeded stream: the schedule's draws are untouched). Empty for
    the closed loop."""
    if params.mean_gap_ms == 0:
        return []
    rng = random.Random(params.seed * 1_000_003 + 7)
    gap_s = params.mean_gap_ms / 1000.0
    at, out = 0.0, []
    for _ in range(count):
        out.append(at)
        at += rng.expovariate(1.0 / gap_s)
    return out


def live_counts(w: AgentWorkload) -> list[int]:
    """Per dispatch: agents whose last turn has not been dispatched before it (the trajectories still live)."""
    finished = 0
    out = []
    for _, t in w.schedule:
        out.append(w.params.agents - finished)
        if t == w.params.turns - 1:
            finished += 1
    return out


def ideal_reuse_ratio(w: AgentWorkload) -> float:
    """Σ reusable / Σ prompt tokens if nothing were ever evicted (the system prompt counted once, on its first use)."""
    p = w.params
    total = reusable = 0
    for agent in w.agents:
        length = len(agent.first)
        total += length
        for t in range(1, p.turns):
            reusable += length + p.gen_tokens - 1  # the last generated token never has KV
            length += p.gen_tokens + len(agent.new[t - 1])
            total += length
    reusable += p.system_tokens * (p.agents - 1)
    return reusable / total
