"""`radixflow bench replay`: fixed-batch replay of prefill scheduling on SGLang's real prefill pass, in-process.

Every request of an instance is waiting at round 1 (no arrivals, FCFS queue, one output token each); each arm
schedules the queue round by round with SGLang's own `_get_new_batch_prefill_raw`, `prepare_for_extend` and result
processing on real CPU pools (bench/passes.py) until it drains. No model runs: this measures packing, not time.
Per arm: rounds K, the fragments it executed (one fragment = one request's extend in one round) and their lower bound
max(⌈W/T⌉, ⌈V/S⌉, D) (W tokens, V row visits, D dependency depth of those fragments), empty row slots Σ(S − rows).

Admission is native for every arm (everything has arrived, so a hold could only delay): `prefix-stop+flex` and the
timer arms schedule like `prefix-stop` here, and are left out by default. The `sglang` arm is SGLang's own
PrefillAdder and traversal on the radixflow tree (op-for-op equal to UnifiedRadixCache, see tests/unit/cache).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_radixflow.bench.progress import Log
from sglang_radixflow.bench.fragments import RoundRecord, read_rounds, write_rounds
from sglang_radixflow.bench.optimum import fewest_rounds
from sglang_radixflow.bench.workloads import STREAMS, WorkloadParams, make_workload, shared_prefixes
from sglang_radixflow.config import ARMS
from sglang_radixflow.bench.bounds import empty_row_slots, first_round_bound, round_lower_bound
from sglang_radixflow.schedule.prefix_request import split_prefix_rid

REPLAY_ARMS: tuple[str, ...] = ("sglang", "prefix-stop", "radixflow", "radixflow+frag")
DEFAULT_INSTANCES: tuple[str, ...] = ("figure1", "mc-mixed", "mc-cold")
TARGET_RATIO = 1.05  # radixflow rounds <= 1.05 x lower bound: the replay's target
DEFAULT_QUESTIONS = 48  # per generated instance: the live bench's 48-question burst



@dataclass(frozen=True)
class Instance:
    """A fixed queue: prompts in FCFS order, the budgets, and whether the model is a hybrid (has mamba states)."""

    name: str
    description: str
    prompts: dict[str, tuple[int, ...]]  # rid -> prompt, in queue order
    S: int  # noqa: N815
    T: int  # noqa: N815
    hybrid: bool = True
    params: dict[str, Any] = field(default_factory=dict, compare=False)  # make_instance(**params) rebuilds it

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError(f"instance {self.name!r} has no requests")
        if self.S < 1 or self.T < 1:
            raise ValueError(f"instance {self.name!r}: budgets must be positive (S={self.S}, T={self.T})")

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts.values())

    def min_tokens(self) -> int:
        """Tokens left if every shared prefix were computed once (each request computes >= 1 token)."""
        return self.prompt_tokens - sum(shared_prefixes(list(self.prompts.values())))

    def floor(self) -> int:
        """A lower bound on rounds for ANY arm: max(⌈min tokens / T⌉, ⌈requests / S⌉)."""
        return max(math.ceil(self.min_tokens() / self.T), math.ceil(len(self.prompts) / self.S))


# ---------------------------------------------------------------- instances

# The paper's Figure 1 (its note gives only the totals; the construction is explained in tests/unit/schedule/
# test_figure1.py): two 4-branch groups and 5 unrelated requests, S = 4, T = 4096, W = 12,970, V = 15, D = 2.
FIG1_S, FIG1_T = 4, 4096
FIG1_DOCS = {"a": 1200, "b": 1000}
FIG1_BRANCH = 900
FIG1_UNRELATED = {"u1": 800, "u2": 700, "u3": 900, "u4": 650, "u5": 520}
FIG1_ORDER = ("a0", "a1", "a2", "a3", "u1", "u2", "u3", "u4", "b0", "b1", "b2", "b3", "u5")


def figure1_instance() -> Instance:
    next_id = [100]

    def fresh(n: int) -> tuple[int, ...]:  # token ids never reused: only the documents are shared
        out = tuple(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return out

    tokens: dict[str, tuple[int, ...]] = {}
    for group, doc_len in FIG1_DOCS.items():
        doc = fresh(doc_len)
        for i in range(4):
            tokens[f"{group}{i}"] = doc + fresh(FIG1_BRANCH)
    for rid, n in FIG1_UNRELATED.items():
        tokens[rid] = fresh(n)
    return Instance(
        "figure1", "the paper's Figure-1 instance: 2 groups of 4 branches (1200/1000-token documents + 900 each) "
        "and 5 unrelated requests, FCFS a0..a3 u1..u4 b0..b3 u5",
        {rid: tokens[rid] for rid in FIG1_ORDER}, FIG1_S, FIG1_T, params={"name": "figure1"},
    )


def multi_candidate_instance(stream: str, questions: int = DEFAULT_QUESTIONS, seed: int = 0, S: int = 8,  # noqa: N803
                             T: int = 2048) -> Instance:
    """The bench's multi-candidate workload (bench/workloads.py), every question already waiting."""
    if stream not in STREAMS:
        raise ValueError(f"stream={stream!r}; allowed: {', '.join(STREAMS)}")
    w = make_workload(WorkloadParams(questions=questions, stream=stream, seed=seed))
    prompts = {r.rid: r.input_ids for r in w.requests()}
    return Instance(
        f"mc-{stream}", f"multi-candidate workload, {questions} questions x 4 candidates, stream `{stream}`, seed "
        f"{seed}, {len({q.doc_id for q in w.questions})} documents", prompts, S, T,
        params={"name": f"mc-{stream}", "questions": questions, "seed": seed, "budgets": [S, T]},
    )


def make_instance(name: str, questions: int = DEFAULT_QUESTIONS, seed: int = 0,
                  budgets: Optional[Sequence[int]] = None) -> Instance:
    """"figure1" or "mc-<stream>" (generated); budgets (S, T) apply to generated instances only."""
    if name == "figure1":
        return figure1_instance()
    if name.startswith("mc-"):
        S, T = budgets or (8, 2048)  # noqa: N806
        return multi_candidate_instance(name[3:], questions, seed, S, T)
    raise ValueError(f"unknown instance {name!r}; allowed: figure1, " + ", ".join(f"mc-{s}" for s in STREAMS))


# ---------------------------------------------------------------- one arm

@dataclass(frozen=True)
class ArmResult:
    arm: str
    rounds: tuple[RoundRecord, ...]
    tokens: int  # W
    row_visits: int  # V
    depth: int  # D
    lower_bound: int
    first_round_bound: int  # tighter: round 1 runs only fragments that start at 0 (nothing cached yet)
    empty_slots: int
    cached_tokens: int  # prompt tokens not computed: Σ prompt − W
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def K(self) -> int:  # noqa: N802
        return len(self.rounds)

    def to_dict(self, S: int) -> dict[str, Any]:  # noqa: N803
        return {
            "rounds": self.K, "lower_bound": self.lower_bound, "rounds_over_bound": self.K / self.lower_bound,
            "first_round_bound": self.first_round_bound,
            "tokens_computed": self.tokens, "row_visits": self.row_visits, "depth": self.depth,
            "empty_slots": self.empty_slots, "cached_tokens": self.cached_tokens,
            "rows_per_round": [r.rows for r in self.rounds], "tokens_per_round": [r.tokens for r in self.rounds],
            "mean_rows_per_round": self.row_visits / self.K if self.K else None, **self.extra,
        }


def prompt_of(prompts: dict[str, Sequence[int]], rid: str) -> Sequence[int]:
    """A queued request's prompt, or for a prefix request (hybrid producer publishing b) its producer's first b."""
    split = split_prefix_rid(rid)
    return prompts[rid] if split is None else prompts[split[0]][: split[1]]


def fragment_graph(rounds: Sequence[RoundRecord], prompts: dict[str, Sequence[int]]
                   ) -> tuple[list[int], list[Optional[int]], list[int]]:
    """Each executed fragment's tokens, parent and depth, in execution order.

    A fragment [p, p + n) of request r depends on a fragment of an earlier round that covered position p of the same
    tokens (its extend ran over p with prompt[:p] equal to r's). When several did (natively, siblings recompute a
    document), the shallowest is the parent: depths must be lower bounds for these fragments, whatever produced the
    prefix. Parent: an index into the same lists, None for a fragment starting at 0.
    """
    tokens: list[int] = []
    parent: list[Optional[int]] = []
    depth: list[int] = []
    done: list[tuple[int, str, int, int]] = []  # (index, rid, start, end) of fragments of earlier rounds
    for r in rounds:
        for f in r.fragments:
            p = f.prefix_len
            prompt = prompt_of(prompts, f.rid)
            parents = [
                (depth[i], i) for i, rid, start, end in done
                if start < p <= end and tuple(prompt_of(prompts, rid)[:p]) == tuple(prompt[:p])
            ]
            if p > 0 and not parents:
                raise AssertionError(f"{f.rid} starts at {p}, which no fragment of an earlier round computed")
            shallowest = min(parents) if parents else None
            tokens.append(f.extend_len)
            parent.append(None if shallowest is None else shallowest[1])
            depth.append(1 if shallowest is None else shallowest[0] + 1)
        first = len(tokens) - len(r.fragments)
        done.extend((first + k, f.rid, f.prefix_len, f.prefix_len + f.extend_len) for k, f in enumerate(r.fragments))
    return tokens, parent, depth


def dependency_depth(rounds: Sequence[RoundRecord], prompts: dict[str, Sequence[int]]) -> int:
    """Longest chain of fragments, each starting from a prefix an earlier-round fragment computed (fragment_graph)."""
    return max(fragment_graph(rounds, prompts)[2], default=0)


def replay(instance: Instance, arm: str, slot_wait: bool = False, max_rounds: int = 512,
           producer_rows: Optional[int] = None, chunk_last: Optional[bool] = None, optimum_s: float = 0.0
           ) -> ArmResult:
    """Schedule the instance's queue with `arm` on SGLang's real prefill pass until it drains (producer_rows:
    RADIXFLOW_PRODUCER_ROWS, chunk_last: RADIXFLOW_CHUNK_LAST, which only the skip traversal uses; None: the arm's
    default; both recorded for skip arms). optimum_s > 0: also the fewest rounds these fragments could take
    (bench/optimum.py), with that many seconds per solver step."""
    from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request  # torch + SGLang: lazy

    longest = max(len(p) for p in instance.prompts.values())
    h = PassHarness(
        HYBRID if instance.hybrid else FULL, arm=arm, token_budget=instance.T, rows=instance.S, slot_wait=slot_wait,
        producer_rows=producer_rows, chunk_last=chunk_last,
        # Pools big enough that nothing is evicted: the replay measures packing, not eviction.
        kv_size=instance.prompt_tokens + 2 * instance.T, mamba_cache_size=2 * len(instance.prompts) + 2 * instance.S,
        max_num_reqs=max(16, 2 * instance.S), max_context_len=longest + 64,
        # Few layers: the pass never looks at layer contents, only at slots.
        num_layers=4, full_attention_layer_ids=(3,),
    )
    h.submit(*(make_request(rid, p) for rid, p in instance.prompts.items()))
    rounds = tuple(h.run_rounds(max_rounds=max_rounds))
    h.assert_idle_invariants()  # every slot back in the allocator or the tree: the schedule was real
    extra: dict[str, Any] = {"slot_wait": True} if slot_wait else {}
    config = h.cache.rf_sched.config
    if config.traversal == "skip":  # the only traversal that reads it
        extra["producer_rows"] = config.producer_rows
        extra["chunk_last"] = config.chunk_last
    return measure(arm, rounds, instance, extra, optimum_s=optimum_s)


def measure(arm: str, rounds: Sequence[RoundRecord], instance: Instance, extra: Optional[dict[str, Any]] = None,
            optimum_s: float = 0.0) -> ArmResult:
    """K, W, V, D, the lower bound and empty slots of an executed schedule (live or loaded from rounds.jsonl);
    optimum_s > 0: also the fewest rounds its fragments could take (`fragment_optimum`)."""
    W = sum(r.tokens for r in rounds)  # noqa: N806
    V = sum(r.rows for r in rounds)  # noqa: N806
    tokens, parent, depth = fragment_graph(rounds, instance.prompts)
    D = max(depth, default=0)  # noqa: N806
    bound = round_lower_bound(W, V, D, S=instance.S, T=instance.T)
    fragments = [(f.prefix_len, f.extend_len) for r in rounds for f in r.fragments]
    extra = dict(extra or {})
    if optimum_s > 0 and rounds:
        best = fewest_rounds(tokens, parent, instance.S, instance.T, rounds=len(rounds), lower_bound=bound,
                             time_limit_s=optimum_s)
        extra["fragment_optimum"] = {"rounds": best.rounds, "proven": best.proven}
    return ArmResult(
        arm=arm, rounds=tuple(rounds), tokens=W, row_visits=V, depth=D, lower_bound=bound,
        first_round_bound=max(bound, first_round_bound(fragments, instance.S, instance.T)),
        empty_slots=empty_row_slots([r.rows for r in rounds], instance.S),
        cached_tokens=instance.prompt_tokens - W, extra=extra,
    )


# ---------------------------------------------------------------- the command

def instance_entry(inst: Instance) -> dict[str, Any]:
    return {
        "description": inst.description, "params": inst.params, "S": inst.S, "T": inst.T, "hybrid": inst.hybrid,
        "requests": len(inst.prompts), "prompt_tokens": inst.prompt_tokens, "min_tokens": inst.min_tokens(),
        "floor": inst.floor(), "arms": {},
    }


def run_replay(out: Path, instances: Sequence[Instance], arms: Sequence[str], slot_wait: bool = False,
               log: Log = print, producer_rows: Optional[int] = None, chunk_last: Optional[bool] = None,
               optimum_s: float = 0.0) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"kind": "replay", "target_ratio": TARGET_RATIO, "instances": {}}
    for inst in instances:
        entry = instance_entry(inst)
        inst_dir = out / inst.name
        inst_dir.mkdir(exist_ok=True)
        for arm in arms:
            skip = ARMS[arm].traversal == "skip"  # the only traversal that reads producer rows and chunk-last
            res = replay(inst, arm, slot_wait=slot_wait and arm != "sglang",
                         producer_rows=producer_rows if skip else None, chunk_last=chunk_last if skip else None,
                         optimum_s=optimum_s)
            entry["arms"][arm] = res.to_dict(inst.S)
            write_rounds(inst_dir / f"{arm}.rounds.jsonl", res.rounds)
            log(f"[{inst.name}] {arm}: {res.K} rounds, lower bound {res.lower_bound} (W={res.tokens}, "
                f"V={res.row_visits}, D={res.depth}), {res.empty_slots} empty slots")
        summary["instances"][inst.name] = entry
    return write_outputs(out, summary)


def rebuild(out: Path) -> dict[str, Any]:
    """summary.json, report.md and the figure again from the saved rounds (instances regenerated from their
    parameters: the workload generator is deterministic), not from the old summary's numbers."""
    old = json.loads((out / "summary.json").read_text())
    if old.get("kind") != "replay":
        raise ValueError(f"{out}/summary.json is not a replay summary (kind={old.get('kind')!r})")
    summary: dict[str, Any] = {"kind": "replay", "target_ratio": TARGET_RATIO, "instances": {}}
    for name, saved in old["instances"].items():
        inst = make_instance(**saved.get("params") or {"name": name})
        entry = instance_entry(inst)
        for arm in saved["arms"]:
            extra = {k: saved["arms"][arm][k] for k in ("slot_wait", "producer_rows", "chunk_last", "fragment_optimum")
                     if k in saved["arms"][arm]}
            entry["arms"][arm] = measure(arm, read_rounds(out / name / f"{arm}.rounds.jsonl"), inst, extra).to_dict(
                inst.S)
        summary["instances"][name] = entry
    return write_outputs(out, summary)


def write_outputs(out: Path, summary: dict[str, Any]) -> dict[str, Any]:
    from sglang_radixflow.bench.figures import replay_figure

    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    fig = replay_figure(summary, out / "replay_rounds.png")
    (out / "report.md").write_text(format_report(summary, [fig.name]))
    return summary


def format_report(summary: dict[str, Any], figures: Sequence[str] = ()) -> str:
    lines = [
        "# Fixed-batch replay (SGLang's real prefill pass, in-process)", "",
        "Every request waits at round 1; each arm drains the queue round by round. Lower bound = max(⌈W/T⌉, ⌈V/S⌉, D) "
        "over the fragments the arm itself executed; first-round bound: also max(1 + ⌈(V − a₁)/S⌉, 1 + ⌈(W − w₁)/T⌉), "
        "since round 1 can only run fragments starting at 0 (nothing is cached yet), at most a₁ rows (the most of the "
        "shortest such fragments that fit T) and w₁ = min(T, their tokens); floor = max(⌈min tokens/T⌉, "
        "⌈requests/S⌉), a bound for any arm (min tokens: every shared prefix computed once). Fewest possible "
        "(`--optimum`): the fewest rounds in which the arm's own fragments can run with all three constraints held "
        "together (an integer program; ≤ k: the solver's time ran out before it proved k − 1 impossible). Target: "
        f"radixflow rounds ≤ {summary['target_ratio']} × lower bound.", "",
    ]
    for name, inst in summary["instances"].items():
        lines += [
            f"## {name}", "",
            f"{inst['description']}. S = {inst['S']}, T = {inst['T']}, {inst['requests']} requests, "
            f"{inst['prompt_tokens']} prompt tokens, min tokens {inst['min_tokens']}, floor {inst['floor']} rounds.", "",
            "| arm | rounds | lower bound | rounds / bound | first-round bound | fewest possible | W (tokens computed) "
            "| V (rows) | D | empty slots | rows per round |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for arm, a in inst["arms"].items():
            lines.append(
                f"| {arm} | {a['rounds']} | {a['lower_bound']} | {a['rounds_over_bound']:.3f} | "
                f"{a.get('first_round_bound', '—')} | {fewest_cell(a.get('fragment_optimum'))} | "
                f"{a['tokens_computed']} | {a['row_visits']} | {a['depth']} | {a['empty_slots']} | "
                f"{' '.join(str(x) for x in a['rows_per_round'])} |"
            )
        lines.append("")
    lines += [f"![{name}]({name})" for name in figures]
    lines += ["", "Per-round fragments: `<instance>/<arm>.rounds.jsonl` (`radixflow report DIR` rebuilds this report "
              "from them).", ""]
    return "\n".join(lines)


def fewest_cell(optimum: Optional[dict[str, Any]]) -> str:
    if not optimum:
        return "—"
    return str(optimum["rounds"]) if optimum["proven"] else f"≤ {optimum['rounds']}"


def add_arguments(parser: Any) -> None:
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--instances", default=",".join(DEFAULT_INSTANCES),
                        help="comma list of figure1, " + ", ".join(f"mc-{s}" for s in STREAMS) + " (default: %(default)s)")
    parser.add_argument("--arms", default=",".join(REPLAY_ARMS), help="comma list of arms (default: %(default)s)")
    parser.add_argument("--questions", type=int, default=DEFAULT_QUESTIONS,
                        help=f"questions per generated instance (x4 requests); default {DEFAULT_QUESTIONS}, the live "
                             "bench's burst")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: %(default)s)")
    parser.add_argument("--budgets", default="8,2048", help="S,T of the generated instances (default: %(default)s; figure1: 4,4096)")
    parser.add_argument("--slot-wait", action="store_true",
                        help="RADIXFLOW_PRODUCER_SLOT_WAIT=1 for the radixflow-cache arms")
    parser.add_argument("--producer-rows", type=int, default=None, metavar="R",
                        help="RADIXFLOW_PRODUCER_ROWS=R for the skip arms (radixflow, radixflow+frag); default: the "
                             f"arms' own ({ARMS['radixflow'].producer_rows}); 0 = the paper's FCFS scan")
    parser.add_argument("--optimum", type=float, default=0.0, metavar="SECONDS",
                        help="also solve for the fewest rounds each arm's fragments could take (an exact lower bound; "
                             "SciPy's MILP solver, at most SECONDS per step); default 0: off")
    parser.add_argument("--chunk-last", choices=("on", "off"), default=None,
                        help="RADIXFLOW_CHUNK_LAST for the skip arms; default: the arms' own "
                             f"({'on' if ARMS['radixflow'].chunk_last else 'off'})")


def main(args: Any) -> int:
    split = lambda v: [x.strip() for x in v.split(",") if x.strip()]  # noqa: E731
    arms = split(args.arms)
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise SystemExit(f"unknown or no arm(s) {unknown}; allowed: {', '.join(ARMS)}")
    try:
        s, t = (int(x) for x in args.budgets.split(","))
    except ValueError:
        raise SystemExit(f"--budgets {args.budgets!r}: expected S,T, e.g. 8,2048") from None
    try:
        instances = [make_instance(n, args.questions, args.seed, (s, t)) for n in split(args.instances)]
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if args.producer_rows is not None and args.producer_rows < 0:
        raise SystemExit(f"--producer-rows {args.producer_rows}: allowed: an integer >= 0")
    out = Path(args.out)
    chunk_last = None if args.chunk_last is None else args.chunk_last == "on"
    if args.optimum < 0:
        raise SystemExit(f"--optimum {args.optimum}: allowed: seconds >= 0 (0: off)")
    run_replay(out, instances, arms, slot_wait=args.slot_wait, producer_rows=args.producer_rows, chunk_last=chunk_last,
               optimum_s=args.optimum)
    print((out / "report.md").read_text())
    print(f"wrote {out}/summary.json and {out}/report.md")
    return 0
