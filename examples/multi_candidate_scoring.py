"""Score candidate answers for questions over shared documents with SGLang's frontend language, on a radixflow server.

    python examples/multi_candidate_scoring.py                       # starts a tiny NemotronH server (CPU is fine)
    python examples/multi_candidate_scoring.py --model qwen3          # the full-attention control
    python examples/multi_candidate_scoring.py --url http://HOST:PORT # an already running server

Two programs per question (document + question, 4 candidate answers):
- `select`: sgl.select picks the candidate with the best normalised prompt logprob. SGLang sends the shared context
  first as a cache-only request (max_new_tokens=0), then the 4 choices together;
- `fork`: the context is committed once, then 4 forks each append a candidate and generate one token.
For every question it prints the choice, the program's wall time and the cached tokens SGLang reports
(meta_info.cached_tokens) for the warm-up and each choice request: on a hybrid, a choice reuses the document only
where a state was stored for it.
A third section scores the same questions through SGLang's scoring endpoint, `POST /v1/score` (query = document +
question, items = the candidates, label tokens " yes" / " no"): SGLang sends one request per candidate, and under
radixflow one of them computes the shared query while the others start from its state (natively a hybrid computes it
once per candidate). The endpoint reports no cached tokens; it prints P(" yes") per candidate and the call's time.
The tiny models are random-initialised, so the choices themselves mean nothing.
"""
from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import sglang as sgl

from sglang_radixflow.bench.frontend import metered_endpoint
from sglang_radixflow.bench.server import SGLangServer, stop_servers_on_sigterm
from sglang_radixflow.models import ensure_model

DOCUMENTS = {
    "mill": "The old mill stood by the river for two hundred years. Every spring the water rose and turned the "
            "wheel faster, and the miller ground grain for the whole valley. " * 6,
    "comet": "A comet is a small icy body that heats up near the Sun and grows a bright tail of gas and dust. "
             "Some return every few years, others only once in many centuries. " * 6,
}
QUESTIONS = [
    ("mill", " Question: what turned the wheel? Answer:", [" the water", " the miller", " the wind", " a horse"]),
    ("mill", " Question: how long did the mill stand? Answer:", [" two hundred years", " ten years", " a week",
                                                                   " forever"]),
    ("comet", " Question: what is a comet made of? Answer:", [" ice and dust", " iron", " fire", " glass"]),
    ("comet", " Question: when does a comet grow a tail? Answer:", [" near the Sun", " in winter", " never",
                                                                     " at night"]),
]


@sgl.function
def score_select(s, context: str, candidates: list[str]):
    s += context
    s += sgl.select("answer", choices=candidates)


@sgl.function
def score_fork(s, context: str, candidates: list[str]):
    s += context
    s.sync()  # let the context land before fork, so fork commits (caches) it once for all branches
    forks = s.fork(len(candidates))
    for f, c in zip(forks, candidates):
        f += c + sgl.gen("next", max_tokens=1, temperature=0.0)
    forks.join()


def score_all(url: str) -> None:
    endpoint = metered_endpoint(url)  # sgl.RuntimeEndpoint that also keeps each response's meta_info
    for name, program in (("select", score_select), ("fork", score_fork)):
        print(f"\n== {name} ==")
        for doc, question, candidates in QUESTIONS:
            t0 = time.perf_counter()
            state = program.run(context=DOCUMENTS[doc] + question, candidates=candidates, backend=endpoint)
            state.sync()
            elapsed = time.perf_counter() - t0
            if state.error() is not None:
                raise RuntimeError(f"program failed: {state.error()}")
            seen = endpoint.take(state.stream_executor.arguments)
            warm = [m.get("cached_tokens") for role, m in seen if role == "warmup" and m]
            choices = [(m["prompt_tokens"], m["cached_tokens"]) for role, m in seen if role == "choice"]
            picked = state["answer"] if name == "select" else "(generates one token per candidate)"
            print(f"[{doc}]{question!r} -> {picked!r}  {elapsed * 1000:.0f} ms; warm-up cached {warm or '—'}; "
                  f"choices (prompt, cached): {choices}")


def _post(url: str, route: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url + route, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def score_endpoint(url: str) -> None:
    """One /v1/score call per question: the probability of " yes" (against " no") after each candidate."""
    labels = [_post(url, "/tokenize", {"prompt": word})["tokens"][-1] for word in (" yes", " no")]
    print("\n== score ==")
    for doc, question, candidates in QUESTIONS:
        t0 = time.perf_counter()
        body = {"query": DOCUMENTS[doc] + question, "items": candidates, "label_token_ids": labels,
                "apply_softmax": True}
        p_yes = [row[0] for row in _post(url, "/v1/score", body)["scores"]]
        elapsed = time.perf_counter() - t0
        best = candidates[max(range(len(candidates)), key=p_yes.__getitem__)]
        print(f"[{doc}]{question!r} -> {best!r}  {elapsed * 1000:.0f} ms; P(' yes') per candidate: "
              f"{[round(p, 4) for p in p_yes]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="use this running server instead of starting one")
    parser.add_argument("--model", default="nemotron_h", help="tiny model arch to make and serve (default nemotron_h)")
    parser.add_argument("--models-root", default="runs/models", help="where tiny models are made / reused")
    parser.add_argument("--arm", default="radixflow", help="RADIXFLOW_ARM of the started server")
    args = parser.parse_args()
    stop_servers_on_sigterm()
    if args.url:
        score_all(args.url)
        score_endpoint(args.url)
        return
    model = ensure_model(args.model, Path(args.models_root))
    server: Any = SGLangServer(str(model), env={"RADIXFLOW_ARM": args.arm})
    print(f"starting {args.model} with --radix-cache radixflow (RADIXFLOW_ARM={args.arm}) ...")
    with server:
        print(f"server up on {server.url}")
        score_all(server.url)
        score_endpoint(server.url)


if __name__ == "__main__":
    main()
