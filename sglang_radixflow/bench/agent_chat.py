"""Agent turns through SGLang's OpenAI chat API (`radixflow bench agent --api chat`), what agent frameworks call.

Each agent is one conversation: its first prompt is the first user message, each later turn appends the model's
reply (as the assistant message) and the next user / tool message; the server applies the model's chat template.
The texts are the workload's token ids decoded with the model's tokenizer (or the workload file's own text).

Counts come from the response's `usage` (streamed with `stream_options.include_usage`): prompt and completion tokens,
and `prompt_tokens_details.cached_tokens`, which SGLang reports with `--enable-cache-report` (the bench adds it).
Reusable = the previous turn's prompt tokens - 1: the previous prompt is a prefix of this one by the template, but
the reply is re-tokenized from its text, so unlike /generate its tokens are not counted reusable. The agent's
trajectory is named by the `X-SMG-Routing-Key` header (SGLang's gateway routes by it).
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

from sglang_radixflow.bench.agent_workload import AgentWorkload
from sglang_radixflow.bench.client import sse_json

CHAT_SERVER_FLAGS = ("--enable-cache-report",)


def chat_turn(url: str, messages: list[dict[str, str]], max_tokens: int, routing_key: str,
              timeout_s: float) -> tuple[float, float, str, dict[str, Any]]:
    """(ttft_s, latency_s, reply text, usage) of one streamed /v1/chat/completions."""
    payload = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
               "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json", "X-SMG-Routing-Key": routing_key})
    start = time.perf_counter()
    ttft: Optional[float] = None
    reply: list[str] = []
    usage: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for chunk in sse_json(resp):
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    reply.append(text)
            usage = chunk.get("usage") or usage
    latency = time.perf_counter() - start
    if ttft is None or not usage:
        raise RuntimeError("the chat stream carried no content or no usage")
    return ttft, latency, "".join(reply), usage


class ChatTurns:
    """drive()'s turn sender for the chat API (see the module docstring)."""

    def __init__(self, w: AgentWorkload, decode: Callable[[list[int]], str]) -> None:
        self.w = w
        self.first = {a.aid: decode(a.first) for a in w.agents}
        self.new = {a.aid: [decode(n) for n in a.new] for a in w.agents}
        self.messages: dict[int, list[dict[str, str]]] = {}  # agent -> its conversation so far
        self.prev_prompt: dict[int, int] = {}

    def send(self, url: str, a: int, t: int, timeout_s: float) -> dict[str, Any]:
        p = self.w.params
        text = self.first[a] if t == 0 else self.new[a][t - 1]
        messages = self.messages.get(a, []) + [{"role": "user", "content": text}]
        reusable = 0 if t == 0 else max(0, self.prev_prompt[a] - 1)
        rec: dict[str, Any] = {"reusable": reusable}
        reply = ""
        try:
            ttft, latency, reply, usage = chat_turn(url, messages, p.gen_tokens, f"s{p.seed}-agent-{a}", timeout_s)
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            rec.update(prompt_len=int(usage["prompt_tokens"]), ttft_s=ttft, latency_s=latency, cached_tokens=cached,
                       output_len=int(usage["completion_tokens"]),
                       missed_tokens=max(0, reusable - cached) if t > 0 else 0, error=None)
            self.prev_prompt[a] = rec["prompt_len"]
            if rec["output_len"] != p.gen_tokens:
                rec["error"] = f"{rec['output_len']} output tokens, expected {p.gen_tokens}"
        except (urllib.error.URLError, OSError, RuntimeError, ValueError, KeyError) as err:
            rec.update(prompt_len=0, error=f"{type(err).__name__}: {err}"[:300])
            self.prev_prompt[a] = self.prev_prompt.get(a, 1)
        self.messages[a] = messages + [{"role": "assistant", "content": reply}]
        return rec
