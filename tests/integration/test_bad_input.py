"""Bad input fails at start-up with an error that names what was wrong and what is allowed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_radixflow.bench.server import SGLangServer, ServerError


def test_unknown_backend_name_is_rejected_listing_radixflow(model_dirs: dict[str, Path]) -> None:
    server = SGLangServer(str(model_dirs["qwen3"]), radix_cache="radixflw")
    with pytest.raises(ServerError):
        server.start()
    log = server.log_text()
    assert "--radix-cache-backend='radixflw' is not registered" in log
    assert "'radixflow'" in log.split("Registered backends:")[1].splitlines()[0]


def test_invalid_radixflow_variable_names_the_variable_and_the_allowed_values(model_dirs: dict[str, Path]) -> None:
    server = SGLangServer(str(model_dirs["nemotron_h"]), env={"RADIXFLOW_TRAVERSAL": "sideways"})
    with pytest.raises(ServerError):
        server.start()
    assert "RADIXFLOW_TRAVERSAL='sideways' is invalid; allowed: skip, stop, native" in server.log_text()


def test_missing_model_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        SGLangServer(str(missing)).start()


def test_make_model_rejects_unknown_arch(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_radixflow.cli", "make-model", "--arch", "mamba9", "--out", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "invalid choice: 'mamba9'" in proc.stderr and "nemotron_h" in proc.stderr
