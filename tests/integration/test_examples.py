"""The README's examples, run as a user runs them (their own processes, `--url` of a real server): they finish and
print what they promise. One tiny NemotronH server with RR-Evict and a KV pool smaller than the agents' histories
serves both (the scoring example fits in it)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from sglang_radixflow.bench.server import SGLangServer

ROOT = Path(__file__).resolve().parents[2]
KV_TOKENS = 2400  # examples/agent_serving.py's own default for the server it starts


@pytest.fixture(scope="module")
def server(model_dirs: dict[str, Path]) -> Iterator[SGLangServer]:
    with SGLangServer(str(model_dirs["nemotron_h"]),
                      extra_args=["--radix-eviction-policy", "rr", "--max-total-tokens", str(KV_TOKENS),
                                  "--enable-cache-report"]) as srv:  # cached tokens in the chat API's usage
        yield srv


def _example_questions() -> list:
    """The example's QUESTIONS, read from its source (importing it would import its dependencies here too)."""
    tree = ast.parse((ROOT / "examples" / "multi_candidate_scoring.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["QUESTIONS"]:
            return ast.literal_eval(node.value)
    raise AssertionError("examples/multi_candidate_scoring.py defines no QUESTIONS list")


def _run_example(name: str, url: str, *extra: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name), "--url", url, *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_multi_candidate_scoring_example_reuses_the_documents_on_the_hybrid(server: SGLangServer) -> None:
    out = _run_example("multi_candidate_scoring.py", server.url)
    _, rest = out.split("== select ==")
    sections = re.split(r"== (?:fork|score) ==", rest)
    assert len(sections) == 3 and out.index("== fork ==") < out.index("== score ==")
    for section in sections[:2]:
        lines = [line for line in section.splitlines() if line.startswith("[")]
        assert len(lines) == 4, section  # one line per question
        for line in lines:
            choices = ast.literal_eval(line.split("choices (prompt, cached): ")[1])
            assert len(choices) == 4, line  # the 4 candidates, each its own request
            # every candidate reuses at least the shared document + question from a stored state (natively a hybrid
            # `select` reuses nothing: the warm-up's only state sits past the choices' match cap)
            assert all(cached >= prompt // 2 for prompt, cached in choices), line
    picked = [ast.literal_eval(line.split(" -> ")[1].split("  ")[0])
              for line in sections[0].splitlines() if line.startswith("[")]
    assert [p in candidates for p, (_, _, candidates) in zip(picked, _example_questions())] == [True] * 4
    scored = [line for line in sections[2].splitlines() if line.startswith("[")]
    assert len(scored) == 4, sections[2]
    for line, (_, _, candidates) in zip(scored, _example_questions()):
        best = ast.literal_eval(line.split(" -> ")[1].split("  ")[0])
        p_yes = ast.literal_eval(line.split("per candidate: ")[1])
        assert len(p_yes) == 4 and all(0.0 < p < 1.0 for p in p_yes), line  # softmax over the two labels
        assert best in candidates and p_yes[candidates.index(best)] == max(p_yes), line


def test_agent_serving_example_keeps_idle_histories_under_eviction(server: SGLangServer) -> None:
    server.get("/flush_cache?timeout=30")  # the agents alone must outgrow the pool, whatever ran before here
    out = _run_example("agent_serving.py", server.url)
    rows = [line.split() for line in out.splitlines() if re.fullmatch(r"\s*\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+[\d.]+", line)]
    assert len(rows) == 8 * 4  # 8 agents x 4 turns (the example's defaults)
    returns = [(int(prompt), int(cached), int(missed)) for turn, _, prompt, cached, missed, _ in rows if turn != "0"]
    assert all(cached > 0 for _, cached, _ in returns)  # every return reused part of its own history
    summary = re.search(r"rr: (\d+) of (\d+) reusable history tokens recomputed", out)
    assert summary is not None, out[-1000:]
    missed, reusable = int(summary.group(1)), int(summary.group(2))
    assert missed == sum(m for _, _, m in returns)
    # the histories outgrow the pool (~3000 tokens > KV_TOKENS): some history is recomputed, most is not
    assert 0 < missed < reusable // 2, (missed, reusable)


def test_agent_serving_example_through_the_chat_api(server: SGLangServer) -> None:
    """`--api chat`: each agent is one conversation through /v1/chat/completions (the tiny model's chat template);
    every return finds its own earlier conversation cached (cached tokens from the usage SGLang reports)."""
    server.get("/flush_cache?timeout=30")
    out = _run_example("agent_serving.py", server.url, "--api", "chat")
    rows = [line.split() for line in out.splitlines() if re.fullmatch(r"\s*\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+[\d.]+", line)]
    assert len(rows) == 8 * 4
    returns = [(int(prompt), int(cached), int(missed)) for turn, _, prompt, cached, missed, _ in rows if turn != "0"]
    assert all(cached > 0 for _, cached, _ in returns)
    assert all(prompt > cached for prompt, cached, _ in returns)
    summary = re.search(r"rr: (\d+) of (\d+) reusable history tokens recomputed", out)
    assert summary is not None, out[-1000:]
    assert int(summary.group(1)) == sum(m for _, _, m in returns) < int(summary.group(2))
