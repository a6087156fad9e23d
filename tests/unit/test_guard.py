"""The request guard's rules (sglang_radixflow.guard); the live server test is in tests/integration/test_bad_input.py."""
from __future__ import annotations

import pytest

from sglang_radixflow.guard import check_request, check_rid, check_token_ids, reaches_prefix_requests
from sglang_radixflow.schedule.prefix_request import PREFIX_RID_MARK, prefix_rid


@pytest.mark.parametrize("ids, message", [
    ([5, 2148, 7], r"input_ids\[1\] = 2148 is outside the vocabulary; valid range is \[0, 2048\)"),
    ([5, 6, 2048], r"input_ids\[2\] = 2048 is outside"),
    ([-1], r"input_ids\[0\] = -1 is outside"),
    ([3, "4"], r"input_ids\[1\] = '4' is not an integer token id"),
    ([3, 4.0], r"input_ids\[1\] = 4.0 is not an integer token id"),
    ([3, None], r"input_ids\[1\] = None is not an integer token id"),
])
def test_ids_outside_the_vocabulary_name_the_position_and_the_range(ids: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_token_ids(ids, 2048)


def test_ids_inside_the_vocabulary_and_empty_inputs_pass() -> None:
    check_token_ids([0, 1, 2047], 2048)
    check_token_ids([], 2048)
    check_token_ids(None, 2048)  # input_embeds requests carry no ids


def test_rids_that_could_reach_prefix_requests_are_refused_and_others_pass() -> None:
    produced = prefix_rid("client-7", 576)
    assert reaches_prefix_requests(produced) and produced.startswith(PREFIX_RID_MARK)
    for rid in (produced, PREFIX_RID_MARK, "radix", "r"):  # SGLang aborts every rid that starts with the aborted one
        with pytest.raises(ValueError, match="is reserved"):
            check_rid(rid)
    for rid in ("client-7", "radixflow", "radixflow-prefix", "x-radixflow-prefix-1", None, ""):
        if rid and reaches_prefix_requests(rid):
            continue  # "radixflow" and "radixflow-prefix" are prefixes of the mark: covered above by construction
        check_rid(rid)


def test_a_request_is_checked_for_both() -> None:
    class Obj:
        rid = "radixflow-prefix-1#x"

    with pytest.raises(ValueError, match="reserved"):
        check_request(Obj(), [1, 2], 2048)
    Obj.rid = "fine"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        check_request(Obj(), [1, 4096], 2048)
    check_request(Obj(), [1, 2], 2048)
