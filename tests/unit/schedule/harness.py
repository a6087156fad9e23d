"""The in-process prefill-pass harness lives in the package (sglang_radixflow/bench/passes.py, also used by
`radixflow bench replay`); re-exported here for the scheduling tests."""
from sglang_radixflow.bench.passes import (  # noqa: F401
    SAMPLED_TOKEN, VOCAB_SIZE, Fragment, PassHarness, RoundRecord, make_request,
)

import contextlib
from typing import Any, Iterator
from unittest import mock

from sglang.srt.managers.schedule_batch import Req


@contextlib.contextmanager
def recording_matches() -> Iterator[list[str]]:
    """The rids of the requests SGLang matches (Req.init_next_round_input: it runs for every request its scan
    examines), in order, while the block runs."""
    matched: list[str] = []
    match = Req.init_next_round_input

    def recording(self: Req, *args: Any, **kwargs: Any) -> Any:
        matched.append(str(self.rid))
        return match(self, *args, **kwargs)

    with mock.patch.object(Req, "init_next_round_input", recording):
        yield matched
