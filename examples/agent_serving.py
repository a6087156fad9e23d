"""Agent trajectories against a radixflow server with RR-Evict (`--radix-eviction-policy rr`).

    python examples/agent_serving.py                        # starts a tiny NemotronH server with rr (CPU is fine)
    python examples/agent_serving.py --model qwen3           # the full-attention control
    python examples/agent_serving.py --policy lru            # the same run under SGLang's LRU, for comparison
    python examples/agent_serving.py --url http://HOST:PORT  # a server already started with rr
    python examples/agent_serving.py --api chat              # the turns as chat messages (/v1/chat/completions)

Each agent has a shared system prompt and a private history; every turn appends new user/tool tokens to the
history and generates a few tokens, and the next turn's prompt is the previous prompt + output + new tokens. Agents
take turns a few at a time (the others are idle: tool calls, thinking), and the KV pool holds only part of all
histories, so the cache has to evict. Every request carries `session_id=agent-<i>`: that is the trajectory RR-Evict
rotates over. For each turn it prints the tokens SGLang reused (meta_info.cached_tokens) and the missed tokens: tokens
of the agent's own earlier turns that had to be recomputed. Under rr an idle agent loses only the tail of its history;
under lru the longest-idle agent loses it all. The tiny models are random-initialised: the outputs mean nothing.
With `--api chat` each agent is one conversation through SGLang's OpenAI chat API, as agent frameworks send it
(random words for text; cached tokens from `usage.prompt_tokens_details`, which needs the server's
`--enable-cache-report`; the trajectory is named by the `X-SMG-Routing-Key` header).
"""
from __future__ import annotations

import argparse
import random
from contextlib import nullcontext
from pathlib import Path

from sglang_radixflow.bench.agent import stream_generate
from sglang_radixflow.bench.agent_chat import CHAT_SERVER_FLAGS, chat_turn
from sglang_radixflow.bench.server import SGLangServer, stop_servers_on_sigterm
from sglang_radixflow.models import ensure_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="nemotron_h", choices=("nemotron_h", "qwen3", "qwen3_next"))
    ap.add_argument("--policy", default="rr", choices=("rr", "lru", "tlru"))
    ap.add_argument("--url", help="an already running server (started with --radix-cache-backend radixflow)")
    ap.add_argument("--models", default="runs/models", help="where tiny models are made/reused")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--active", type=int, default=2, help="agents taking a turn at the same time")
    ap.add_argument("--turns", type=int, default=4)
    # 8 histories grow to ~360 private tokens each after the 128-token system prompt (~3000 in all): a 2400-token
    # pool holds about 6 of them at the end, so 2 active < 6 kept < 8 agents, RR-Evict's regime.
    ap.add_argument("--kv-tokens", type=int, default=2400, help="KV pool of the started server")
    ap.add_argument("--api", choices=("generate", "chat"), default="generate",
                    help="generate: /generate with token ids; chat: /v1/chat/completions with text")
    args = ap.parse_args()
    stop_servers_on_sigterm()

    rng = random.Random(0)
    system = [rng.randrange(3, 2000) for _ in range(128)]
    history = {a: system + [rng.randrange(3, 2000) for _ in range(200)] for a in range(args.agents)}
    if args.url:
        server_ctx = nullcontext(None)
    else:
        extra = ["--radix-eviction-policy", args.policy, "--max-total-tokens", str(args.kv_tokens),
                 *(CHAT_SERVER_FLAGS if args.api == "chat" else ())]
        if args.policy == "tlru":
            extra += ["--radix-eviction-policy-config", '{"threshold": 256, "next_prompt_estimate": 48}']
        server_ctx = SGLangServer(str(ensure_model(args.model, Path(args.models))), extra_args=extra)
    with server_ctx as server:
        url = args.url or server.url
        print(f"{'turn':>4} {'agent':>5} {'prompt':>6} {'cached':>6} {'missed':>6} {'TTFT s':>7}")
        totals = {"missed": 0, "reusable": 0}
        conversations: dict[int, list[dict[str, str]]] = {}  # --api chat: each agent's messages so far
        prompt_tokens: dict[int, int] = {}
        for turn in range(args.turns):
            order = rng.sample(range(args.agents), args.agents)
            for i in range(0, len(order), args.active):
                group = order[i:i + args.active]
                results = {}
                for a in group:  # sequential here for readable output; the bench runs them concurrently
                    if args.api == "chat":
                        turn_row = chat_turn_row(url, conversations, prompt_tokens, a, turn, rng)
                        totals["missed"] += turn_row[2]
                        totals["reusable"] += turn_row[3]
                        print(f"{turn:>4} {a:>5} {turn_row[0]:>6} {turn_row[1]:>6} {turn_row[2]:>6} {turn_row[4]:>7.3f}")
                        continue
                    prompt = history[a] + [rng.randrange(3, 2000) for _ in range(32)]
                    reusable = len(history[a]) - 1 if turn else 0  # the last generated token never has KV
                    ttft, _, last = stream_generate(url, prompt, 8, f"agent-{a}", f"ex-{a}-{turn}", 300)
                    cached = int(last["meta_info"]["cached_tokens"])
                    missed = max(0, reusable - cached) if turn else 0
                    totals["missed"] += missed
                    totals["reusable"] += reusable
                    results[a] = prompt + [int(x) for x in last.get("output_ids") or []]
                    print(f"{turn:>4} {a:>5} {len(prompt):>6} {cached:>6} {missed:>6} {ttft:>7.3f}")
                history.update(results)
        share = totals["missed"] / max(1, totals["reusable"])
        print(f"\n{args.policy}: {totals['missed']} of {totals['reusable']} reusable history tokens recomputed "
              f"({share:.1%})")


WORDS = ("plan", "tool", "read", "file", "test", "patch", "run", "error", "line", "fix", "check", "result", "value",
         "call", "step", "note", "list", "open", "save", "diff")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat_turn_row(url: str, conversations: dict, prompt_tokens: dict, a: int, turn: int,
                  rng: random.Random) -> tuple[int, int, int, int, float]:
    """One agent turn as a chat message: (prompt tokens, cached, missed, reusable, TTFT). The previous turn's prompt
    is a prefix of this one's (the template renders the messages in order): reusable = its tokens - 1."""
    if turn == 0:  # a shared system prompt, then the agent's own first message
        conversations[a] = [{"role": "system", "content": words(random.Random(0), 32)}]
    # sized like the token-id agents above (the tiny tokenizer spends ~4 tokens on a word)
    messages = conversations[a] + [{"role": "user", "content": words(rng, 50 if turn == 0 else 8)}]
    ttft, _, reply, usage = chat_turn(url, messages, 8, f"agent-{a}", 300)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    reusable = prompt_tokens[a] - 1 if turn else 0
    prompt_tokens[a] = int(usage["prompt_tokens"])
    conversations[a] = messages + [{"role": "assistant", "content": reply}]
    return prompt_tokens[a], cached, max(0, reusable - cached) if turn else 0, reusable, ttft


if __name__ == "__main__":
    main()
