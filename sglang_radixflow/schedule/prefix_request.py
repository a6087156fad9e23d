"""Prefix requests: a no_buffer hybrid producer publishes its state at b through an ordinary SGLang request for its
first b tokens with max_new_tokens = 0 (SGLang tracks one chunked request per pass, so cuts alone would publish one
state a round). Nobody waits for its output. Its rid derives from the producer's and b, so every TP rank builds the
same request, and does not start with the producer's rid (SGLang aborts by rid prefix). See docs/design.md.
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # light at import: the bench's replay reads rids without SGLang
    from sglang.srt.managers.schedule_batch import Req

PREFIX_RID_MARK = "radixflow-prefix-"  # a prefix request's rid: PREFIX_RID_MARK + b + "#" + the producer's rid


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
    prefix.finished_output = True  # SGLang's streamer skips finished requests with this flag: no output leaves
    prefix.time_stats.set_wait_queue_entry_time()
    return prefix


def prefix_rid(producer_rid: str, boundary: int) -> str:
    """The rid of the prefix request publishing the producer's first `boundary` tokens."""
    return f"{PREFIX_RID_MARK}{boundary}#{producer_rid}"


def split_prefix_rid(rid: str) -> Optional[tuple[str, int]]:
    """(producer rid, b) of a prefix request's rid; None for any other rid."""
    rid = str(rid)
    if not rid.startswith(PREFIX_RID_MARK):
        return None
    boundary, sep, producer = rid[len(PREFIX_RID_MARK):].partition("#")
    return (producer, int(boundary)) if sep and boundary.isdigit() else None
