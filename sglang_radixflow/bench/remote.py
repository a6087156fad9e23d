"""Servers the bench did not start (`radixflow bench multi-candidate --url URL[,URL...]`): one already running SGLang
server per arm, e.g. a native and a radixflow deployment side by side.

What the bench reads from such a server, besides the client's own records (latency, cached tokens, errors):
- `/server_info`: its cache backend, its budgets S (`--prefill-max-requests`, else the running-request cap) and T
  (`--chunked-prefill-size`), and whether it exports metrics; `/model_info`: the model it serves;
- `/metrics` before and after the workload: the radixflow backend's own counters (`radixflow_rounds_total` by kind,
  `radixflow_prefill_rows_total`, `radixflow_prefill_tokens_total`; exported with `--enable-metrics`) give the prefill
  rounds, rows and computed tokens of the workload window. SGLang's own metrics count no prefill rounds, and the
  server's log is not the bench's to read, so for a native server these are reported missing, never as zeros.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any, Optional

from sglang_radixflow.plugin import BACKEND_NAME

TIMEOUT_S = 30.0
# name{labels} value, as prometheus_client's text format writes it
_SAMPLE = re.compile(r'^(radixflow_[a-z_]+?)(?:\{([^}]*)\})?\s+([-+0-9.eE]+|NaN|[+-]Inf)\s*$')
# what a summary needs from a server's log or metrics, and says is missing when neither has it
COUNTED = ("prefill_rounds", "rows", "tokens")


def get_json(url: str, path: str) -> Any:
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=TIMEOUT_S) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ConnectionError(f"{url}{path}: {err}") from None


def server_facts(url: str) -> dict[str, Any]:
    """What the bench records about an already running server (its arm's run.json) and reads its budgets from."""
    info = get_json(url, "/server_info")
    model = get_json(url, "/model_info")
    # S: --prefill-max-requests, else the running-request cap the scheduler resolved (no flag: sized from memory)
    states = info.get("internal_states") or [{}]
    S = info.get("prefill_max_requests") or info.get("max_running_requests") or states[0].get(
        "effective_max_running_requests_per_dp")
    return {
        "url": url,
        "model_path": model.get("model_path"),
        "radix_cache_backend": info.get("radix_cache_backend"),
        "radix_eviction_policy": info.get("radix_eviction_policy"),
        "mamba_radix_cache_strategy": info.get("mamba_radix_cache_strategy"),
        "enable_metrics": bool(info.get("enable_metrics")),
        "S": int(S) if S else None,
        # T: the chunk size; with chunked prefill off (-1), the prefill cap
        "T": next((int(v) for v in (info.get("chunked_prefill_size"), info.get("max_prefill_tokens"))
                   if isinstance(v, int) and v > 0), None),
        "sglang_version": info.get("version"),
    }


def flush_cache(url: str) -> None:
    """SGLang's /flush_cache (it refuses while requests run): the bench's workload starts from an empty tree, so a
    second run against the same server does not find the first one's documents."""
    req = urllib.request.Request(url.rstrip("/") + "/flush_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S):
            return
    except urllib.error.HTTPError as err:
        raise ConnectionError(f"{url}/flush_cache: HTTP {err.code} {err.read().decode(errors='replace').strip()} "
                              "(SGLang flushes only an idle server: let its running requests finish)") from None
    except (urllib.error.URLError, OSError) as err:
        raise ConnectionError(f"{url}/flush_cache: {err}") from None


def is_radixflow(facts: dict[str, Any]) -> bool:
    return facts.get("radix_cache_backend") == BACKEND_NAME


def scrape(url: str) -> Optional[dict[str, float]]:
    """The radixflow counters of a server's /metrics (`name` or `name{kind=...}` -> value, summed over its other
    labels); None when the server exports no metrics."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=TIMEOUT_S) as resp:
            text = resp.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return None
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> the radixflow counters (see `scrape`)."""
    counters: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group(1).endswith("_created"):
            continue
        kind = re.search(r'kind="([^"]*)"', m.group(2) or "")
        key = f"{m.group(1)}{{kind={kind.group(1)}}}" if kind else m.group(1)
        counters[key] = counters.get(key, 0.0) + float(m.group(3))
    return counters


def counted(start: Optional[dict[str, float]], end: Optional[dict[str, float]]) -> Optional[dict[str, int]]:
    """Prefill rounds, rows and computed tokens between two scrapes (a mixed round is a prefill round too); None when
    either scrape lacks the radixflow counters."""
    if not start or not end or "radixflow_prefill_rows_total" not in end:
        return None

    def delta(key: str) -> int:
        return int(round(end.get(key, 0.0) - start.get(key, 0.0)))

    return {
        "prefill_rounds": delta("radixflow_rounds_total{kind=prefill}") + delta("radixflow_rounds_total{kind=mixed}"),
        "rows": delta("radixflow_prefill_rows_total"),
        "tokens": delta("radixflow_prefill_tokens_total"),
    }


def missing_note(facts: dict[str, Any]) -> str:
    """Why a server the bench did not start lacks its round counts."""
    if not is_radixflow(facts):
        return ("SGLang's own metrics count no prefill rounds and the bench does not read this server's log: prefill "
                "rounds, rows, computed tokens and computed reuse are not measured")
    return ("the server exports no metrics (start it with --enable-metrics): prefill rounds, rows, computed tokens "
            "and computed reuse are not measured")
