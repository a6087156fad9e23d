"""`radixflow demo`: serve the tiny hybrid (and the full-attention control) with radixflow and show ĥ vs h.

Requests share a document: a token hit ĥ is not a usable (state-ready) hit h on the hybrid, because the state at the
branch point was never stored; the control reuses the same prefix. Numbers come from the server's own trace
(RADIXFLOW_TRACE) and SGLang's meta_info.cached_tokens.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from sglang_radixflow.bench.server import SGLangServer
from sglang_radixflow.models import ensure_model
from sglang_radixflow.observe.trace import read_trace


@dataclass(frozen=True)
class DemoRow:
    model: str
    request: str
    prompt_len: int
    token_hit: int
    state_hit: int
    cached_tokens: int


def _scenario(seed: int, doc_len: int = 320) -> list[tuple[str, list[int]]]:
    rng = random.Random(seed)
    doc = [rng.randrange(3, 2000) for _ in range(doc_len)]
    ask = lambda n: [rng.randrange(3, 2000) for _ in range(n)]  # noqa: E731
    return [
        ("doc + question 1 (cold)", doc + ask(24)),
        ("doc + question 2 (shares doc)", doc + ask(24)),
        ("doc + question 3 (shares doc)", doc + ask(24)),
    ]


def run_model(arch: str, models_root: Path, out: Path, seed: int = 0) -> list[DemoRow]:
    model = ensure_model(arch, models_root)
    trace = (out / f"{arch}.trace.jsonl").resolve()  # the server runs in another directory
    trace.unlink(missing_ok=True)
    rows: list[DemoRow] = []
    with SGLangServer(str(model), env={"RADIXFLOW_TRACE": str(trace)}, log_path=out / f"{arch}.server.log") as server:
        names = []
        for name, prompt in _scenario(seed):
            server.generate(prompt, max_new_tokens=8, rid=f"{arch}-{len(names)}")
            names.append(name)
        first_prompt = _scenario(seed)[0][1]
        first = server.generate(first_prompt, max_new_tokens=8)
        follow = first_prompt + first["output_ids"] + [5, 6, 7, 8]
        server.generate(follow, max_new_tokens=8, rid=f"{arch}-{len(names) + 1}")
        names += ["", "turn 2 of question 1 (multi-turn)"]
        time.sleep(0.5)  # records are written when requests are released
    records = {r["rid"]: r for r in read_trace(str(trace), "request")}
    for i, name in enumerate(names):
        rec = records.get(f"{arch}-{i}")
        if not name or rec is None:
            continue
        rows.append(DemoRow(arch, name, rec["prompt_len"], rec["token_hit"], rec["state_hit"], rec["cached_tokens"]))
    return rows


def format_table(rows: Sequence[DemoRow]) -> str:
    head = f"{'model':<11} {'request':<34} {'prompt':>6} {'ĥ (token hit)':>13} {'h (state-ready)':>15} {'cached':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.model:<11} {r.request:<34} {r.prompt_len:>6} {r.token_hit:>13} {r.state_hit:>15} {r.cached_tokens:>6}"
        )
    return "\n".join(lines)


def run_demo(out: Optional[str] = None, models_root: Optional[str] = None, archs: Sequence[str] = ("nemotron_h", "qwen3")) -> str:
    out_dir = Path(out or "runs/demo")
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(models_root) if models_root else out_dir.parent / "models"
    rows: list[DemoRow] = []
    for arch in archs:
        rows += run_model(arch, root, out_dir)
    table = format_table(rows)
    (out_dir / "demo.txt").write_text(table + "\n")
    return table
