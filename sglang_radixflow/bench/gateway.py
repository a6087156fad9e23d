"""SGLang's model gateway (`smg`, PyPI `smg`) in front of several SGLang workers, for the benches' --workers runs.

The gateway is started the way a deployment starts it (`smg launch --worker-urls A B --policy P`), in its own process
group like the servers (bench/server.py), and stopped with them. Tested with smg 1.13.0 against SGLang 0.5.23
workers; `pip install -e ".[scale]"` installs that version. The older `sglang-router` 0.3.x does not drive 0.5.23
workers (it polls `/get_load`, which 0.5.23 no longer serves).

What the benches rely on, checked at start or per response:
- `GET /workers` lists every worker once it is registered (its `/health` answers OK before that, with no worker);
- each response names the worker that served it in the `x-smg-routed-worker-id` header (the per-worker split);
- `manual` and `sticky_round_robin` route by the `X-SMG-Routing-Key` header (the benches key a document or a
  trajectory with it).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence

from sglang_radixflow.bench.server import SERVER_CWD, ServerError, free_port, register_group, stop_group

TESTED_SMG_VERSION = "1.13.0"
# smg's routing policies the benches offer (smg has more; these are the ones measured here), and one setting of its
# own: `sticky_round_robin` deals each new routing key to the next worker in turn and pins it there.
ROUTERS: tuple[str, ...] = ("cache_aware", "round_robin", "power_of_two", "manual", "sticky_round_robin")
# What each is launched with: (smg's --policy, flags the benches add). `manual` pins a new key to the worker holding
# the fewest keys (smg's default, `random`, left one worker of two with 29 of 48 agent trajectories; min_group still
# split 24 keys sent one by one 13 / 11); sticky sessions over round robin split them 12 / 12.
POLICY_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "manual": ("manual", ("--assignment-mode", "min_group")),
    "sticky_round_robin": ("round_robin", ("--sticky-sessions",)),
}
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"
ROUTING_KEY_HEADER = "X-SMG-Routing-Key"


def check_router(router: str) -> None:
    if router not in ROUTERS:
        raise ValueError(f"--router {router}; allowed: {', '.join(ROUTERS)}")


def smg_executable() -> str:
    """The `smg` next to this Python (the project's environment), else on PATH; a clear error when neither."""
    local = Path(sys.executable).parent / "smg"
    found = str(local) if local.is_file() else shutil.which("smg")
    if found is None:
        raise ValueError("--workers needs SGLang's model gateway `smg`: pip install -e \".[scale]\" "
                         f"(installs smg=={TESTED_SMG_VERSION})")
    return found


def smg_version() -> Optional[str]:
    try:
        return metadata.version("smg")
    except metadata.PackageNotFoundError:
        return None


class Gateway:
    """One `smg launch` process group routing to `worker_urls` with `policy`. Use as a context manager."""

    def __init__(self, worker_urls: Sequence[str], policy: str, log_path: Path, extra_args: Sequence[str] = (),
                 startup_timeout_s: float = 120.0) -> None:
        check_router(policy)
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.smg_policy, flags = POLICY_FLAGS.get(policy, (policy, ()))
        self.extra_args = [*flags, *extra_args]  # later flags win (argparse)
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self.proc: Optional[subprocess.Popen] = None
        self.launched: list[str] = []  # the command line it was started with

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # Its metrics port too: smg's default (29000) would clash between two gateways and with SGLang's own ports.
        return [smg_executable(), "launch", "--worker-urls", *self.worker_urls, "--policy", self.smg_policy,
                "--host", "127.0.0.1", "--port", str(self.port), "--prometheus-port", str(free_port()),
                *self.extra_args]

    def start(self) -> "Gateway":
        assert self.proc is None, "already started"
        self.port = free_port()
        self.launched = self.command()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.launched, stdout=log, stderr=subprocess.STDOUT, cwd=SERVER_CWD,
                                         start_new_session=True, env={**os.environ, "NO_COLOR": "1"})
        register_group(self.proc.pid)
        try:
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_workers(self) -> None:
        """Until `/workers` lists all of them: requests sent before that get 404 model_not_found."""
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        listed: set[str] = set()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"smg exited with code {self.proc.returncode}; log tail:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/workers", timeout=10) as resp:
                    listed = {w.get("url") for w in json.loads(resp.read()).get("workers", [])}
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
                pass
            if listed >= set(self.worker_urls):
                return
            time.sleep(0.5)
        raise ServerError(f"smg lists {sorted(listed)} of {self.worker_urls} after {self.startup_timeout_s:.0f}s; "
                          f"log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout_s=10.0)
            self.proc = None

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
