"""Prefix requests: how a no_buffer hybrid producer publishes a state at a branch point.

With `no_buffer` a state exists only at the end of an extend. A producer's extend can end at b by chunking, but SGLang
tracks ONE chunked request per pass: natively at most one producer per round could publish, and a producer holding
the slot leaves none for the request that should fill the rest of the token budget. A prefix request is an ordinary
SGLang request for the producer's first b tokens with max_new_tokens = 0: it finishes in its round and its final
cache insert stores the KV and the state at b. The producer itself waits one round (Blocked on the prefix request's
promise, like its siblings) and then starts from b, exactly as after a chunk cut; the prefix is computed once either
way, in as many rows. Any number of prefix requests fit in one round, and the chunk slot stays SGLang's.

Nobody waits for a prefix request's output: `finished_output` is set from the start, the flag SGLang's output
streamer uses to skip a finished request it already reported, so no output ever leaves the scheduler for it. Its rid
derives from the producer's rid and b, so every tensor-parallel rank builds the same request; it does not START with
the producer's rid, because SGLang aborts every request whose rid starts with the one aborted: a client that cancels
the producer must not take its siblings' prefix away (nor make SGLang report an abort for a rid no client knows).
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # light at import: the bench's replay reads rids without SGLang
    from sglang.srt.managers.schedule_batch import Req

PREFIX_RID_MARK = "radixflow-prefix-"  # a prefix request's rid: PREFIX_RID_MARK + b + "#" + the producer's rid

# SGLang internal relied on: its output streamer skips `req.finished() and req.finished_output` (asserted where the
# flag is set, in make_prefix_request).


def can_split(req: Any) -> bool:
    """Requests whose first b tokens can be computed on their own: plain token prompts (no images, input embeddings,
    positional overrides, sessions or LoRA adapters, whose state a copy would not carry)."""
    return (
        req.multimodal_inputs is None
        and req.input_embeds is None
        and req.positional_embed_overrides is None
        and req.session is None
        and req.lora_id is None
        and not req.output_ids
    )


def make_prefix_request(req: Any, boundary: int) -> "Req":
    from sglang.srt.managers.schedule_batch import Req

    assert 0 < boundary < len(req.origin_input_ids), (boundary, len(req.origin_input_ids))
    params = copy.copy(req.sampling_params)
    params.max_new_tokens = 0
    prefix = Req(
        rid=prefix_rid(str(req.rid), boundary),
        origin_input_text="",
        origin_input_ids=req.origin_input_ids[:boundary],
        sampling_params=params,
        eos_token_ids=req.eos_token_ids,
        vocab_size=req.vocab_size,
        priority=req.priority,
        routing_key=req.routing_key,
    )
    # The cache namespace must be the producer's (SGLang may rewrite extra_key after construction).
    prefix.extra_key, prefix.cache_salt = req.extra_key, req.cache_salt
    prefix.tokenizer = req.tokenizer
    assert prefix.finished_output is None, "SGLang's Req.finished_output is the streamer's already-reported flag"
    prefix.finished_output = True  # the streamer never reports it: no client waits for this request
    prefix.time_stats.set_wait_queue_entry_time()
    return prefix


def prefix_rid(producer_rid: str, boundary: int) -> str:
    """The rid of the prefix request publishing the producer's first `boundary` tokens."""
    return f"{PREFIX_RID_MARK}{boundary}#{producer_rid}"


def is_prefix_request(req: Any) -> bool:
    return str(req.rid).startswith(PREFIX_RID_MARK)


def split_prefix_rid(rid: str) -> Optional[tuple[str, int]]:
    """(producer rid, b) of a prefix request's rid; None for any other rid."""
    rid = str(rid)
    if not rid.startswith(PREFIX_RID_MARK):
        return None
    boundary, sep, producer = rid[len(PREFIX_RID_MARK):].partition("#")
    return (producer, int(boundary)) if sep and boundary.isdigit() else None
