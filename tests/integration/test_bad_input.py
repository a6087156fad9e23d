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


def test_a_terminated_bench_stops_the_server_it_started(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """`timeout`, a cancelled CI job or `kill` sends SIGTERM to the bench alone; its servers run in their own
    sessions (so that stopping one kills its whole tree), so the signal never reaches them. They used to be left
    running; the bench now stops them on the way out."""
    import os
    import signal
    import time

    import psutil  # an SGLang dependency

    from tests.integration.conftest import MODELS_ROOT

    log = tmp_path / "bench.log"
    cmd = [sys.executable, "-m", "sglang_radixflow.cli", "bench", "multi-candidate", "--out", str(tmp_path / "run"),
           "--models", "qwen3", "--arms", "sglang", "--budgets", "8,2048", "--questions", "64", "--rate", "1",
           "--models-root", str(MODELS_ROOT)]
    with open(log, "w") as sink:
        bench = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])
    servers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while "sending 256 requests" not in log.read_text():  # the server is up and the workload under way
            assert bench.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        servers = psutil.Process(bench.pid).children(recursive=True)
        assert any("sglang.launch_server" in " ".join(p.cmdline()) for p in servers)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=90) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(servers, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if bench.poll() is None:
            bench.kill()
        for p in servers:  # never leave a server behind, whatever failed above
            try:
                os.killpg(p.pid, signal.SIGKILL) if p.pid == os.getpgid(p.pid) else p.kill()
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
