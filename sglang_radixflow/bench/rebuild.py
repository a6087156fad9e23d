"""`radixflow report DIR`: rebuild a bench directory's summary.json, report.md and figures from its saved records.

Which bench wrote DIR is read from what it saved: a replay's summary.json says kind "replay" (rebuilt from its
per-round fragment files); an agent run's workload.json lists "policies" (rebuilt by bench/agent.py from its
<model>/<policy>/ records); a multi-candidate run has workload.json and <model>/<arm>.run.json (rebuilt from server
logs, traces and client records). Nothing is re-measured.
"""
from __future__ import annotations

import json
from pathlib import Path


class NotABenchDir(ValueError):
    pass


def bench_kind(out: Path) -> str:
    if not out.is_dir():
        raise NotABenchDir(f"{out}: no such directory")
    summary = out / "summary.json"
    if summary.is_file():
        try:
            kind = json.loads(summary.read_text()).get("kind")
        except (json.JSONDecodeError, AttributeError):
            kind = None
        if kind == "replay":
            return "replay"
    workload = out / "workload.json"
    if workload.is_file() and "policies" in json.loads(workload.read_text()):
        return "agent"
    if workload.is_file() and any(out.glob("*/*.run.json")):
        return "multi-candidate"
    raise NotABenchDir(
        f"{out}: not a bench output directory (expected a replay summary.json, or workload.json from "
        "`radixflow bench multi-candidate` (with <model>/<arm>.run.json) or `radixflow bench agent`)"
    )


def rebuild_report(out: str | Path) -> str:
    """Rebuild everything derived in DIR; returns the new report.md text."""
    out = Path(out)
    kind = bench_kind(out)
    if kind == "replay":
        from sglang_radixflow.bench import replay

        replay.rebuild(out)
    elif kind == "agent":
        from sglang_radixflow.bench import agent

        agent.write_report(out)
    else:
        from sglang_radixflow.bench import report

        report.write_report(out)
    return (out / "report.md").read_text()
