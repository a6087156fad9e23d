"""Integration fixtures: tiny models made once per session, real SGLang servers started per module."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from sglang_radixflow.models import ensure_model

# Models are made once per machine under this directory (or SGLANG_RADIXFLOW_TEST_MODELS) and reused across runs.
MODELS_ROOT = Path(os.environ.get("SGLANG_RADIXFLOW_TEST_MODELS", Path.home() / ".cache" / "sglang-radixflow" / "models"))


@pytest.fixture(scope="session")
def model_dirs() -> dict[str, Path]:
    return {arch: ensure_model(arch, MODELS_ROOT) for arch in ("nemotron_h", "qwen3", "qwen3_next", "qwen3_5")}


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_servers() -> Iterator[None]:
    yield
    from sglang_radixflow.bench import server

    assert not server.live_servers(), f"servers left running: {server.live_servers()}"
