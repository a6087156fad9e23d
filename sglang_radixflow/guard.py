"""Requests a radixflow server refuses before they reach the scheduler (SGLang's tokenizer manager, main process).

- Token ids outside [0, vocab_size): SGLang 0.5.23 checks `token_ids_logprob` against the vocabulary but not
  `input_ids`, and one such id ends the whole server (an IndexError in the embedding, raised in the scheduler's
  forward; every later request is refused). Refused here with a ValueError, which SGLang answers with a 400.
- rids in the prefix-request namespace: the scheduler's prefix requests carry rids starting with PREFIX_RID_MARK, and
  SGLang aborts every request whose rid starts with an aborted one, so a client rid that starts with the mark, or that
  the mark starts with ("radix"), could reach another client's prefix requests through `/abort_request`.
Both checks run only on servers started with the radixflow backend: native SGLang stays untouched.
"""
from __future__ import annotations

import array
from typing import Any, Optional, Sequence

from sglang_radixflow.schedule.prefix_request import PREFIX_RID_MARK


def check_token_ids(input_ids: Optional[Sequence[Any]], vocab_size: int) -> None:
    """ValueError naming the first id outside [0, vocab_size) and its position (or a non-integer entry)."""
    if not input_ids:
        return
    try:  # C loops only: about 40 ns per id on a 2-core CPU (0.3 ms for 8000 ids), no Python loop per request
        array.array("q", input_ids)  # TypeError for any non-integer entry
        if 0 <= min(input_ids) and max(input_ids) < vocab_size:
            return
    except (TypeError, OverflowError):
        pass
    for position, token in enumerate(input_ids):
        if not isinstance(token, int):
            raise ValueError(f"input_ids[{position}] = {token!r} is not an integer token id; "
                             f"valid ids are integers in [0, {vocab_size})")
        if not 0 <= token < vocab_size:
            raise ValueError(f"input_ids[{position}] = {token} is outside the vocabulary; "
                             f"valid range is [0, {vocab_size})")
    raise AssertionError("unreachable: the range check failed but every id is in range")


def reaches_prefix_requests(rid: str) -> bool:
    """Whether SGLang's prefix-match abort of `rid` could match a prefix request's rid."""
    return rid.startswith(PREFIX_RID_MARK) or PREFIX_RID_MARK.startswith(rid)


def check_rid(rid: Any) -> None:
    """ValueError for a client rid in (or above) the prefix-request namespace."""
    if isinstance(rid, str) and rid and reaches_prefix_requests(rid):
        raise ValueError(f"rid {rid!r} is reserved: rids that start with {PREFIX_RID_MARK!r}, or that it starts "
                         f"with, could abort radixflow's prefix requests; choose another rid")


def check_request(obj: Any, input_ids: Optional[Sequence[Any]], vocab_size: int) -> None:
    """One request as TokenizerManager._validate_one_request sees it (a single request, batches come split)."""
    check_rid(getattr(obj, "rid", None))
    check_token_ids(input_ids, vocab_size)
