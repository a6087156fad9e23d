"""Starting a real SGLang server when its HTTP port was taken after it was picked: uvicorn logs the bind error and
the process hangs without exiting, so waiting for health would take the whole start-up timeout and fail. The
server starts again on another port instead; a port the caller asked for fails at once, naming it."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

from sglang_radixflow.bench import server as server_module
from sglang_radixflow.bench.server import BIND_FAILED, SGLangServer, ServerError


@pytest.fixture()
def taken_port() -> Iterator[int]:
    """A port held by a listening socket, as the stray socket that took the picked port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_taken_port_starts_the_server_again_on_another(model_dirs: dict[str, Path], taken_port: int,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    picks = iter([taken_port])
    real_free_port = server_module.free_port
    monkeypatch.setattr(server_module, "free_port", lambda: next(picks, None) or real_free_port())
    logs: list[str] = []
    real_launch = SGLangServer._launch

    def launch(self: SGLangServer) -> None:
        try:
            real_launch(self)
        finally:
            logs.append(self.log_text())

    monkeypatch.setattr(SGLangServer, "_launch", launch)
    srv = SGLangServer(str(model_dirs["qwen3"]), log_path=tmp_path / "server.log", startup_timeout_s=120)
    with srv:
        assert srv.port != taken_port
        assert len(srv.generate([5, 6, 7, 8], 2)["output_ids"]) == 2
    assert len(logs) == 2 and BIND_FAILED in logs[0] and BIND_FAILED not in logs[1]
    assert not server_module.live_servers()


def test_a_port_the_caller_gave_fails_at_once_when_taken(model_dirs: dict[str, Path], taken_port: int,
                                                          tmp_path: Path) -> None:
    srv = SGLangServer(str(model_dirs["qwen3"]), port=taken_port, log_path=tmp_path / "server.log",
                       startup_timeout_s=120)
    with pytest.raises(ServerError, match=f"port {taken_port} is taken"):
        srv.start()
    assert srv.proc is None and not server_module.live_servers()
