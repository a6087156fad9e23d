"""The in-process prefill-pass harness lives in the package (sglang_radixflow/bench/passes.py, also used by
`radixflow bench replay`); re-exported here for the scheduling tests."""
from sglang_radixflow.bench.passes import (  # noqa: F401
    SAMPLED_TOKEN, VOCAB_SIZE, Fragment, PassHarness, RoundRecord, make_request,
)
