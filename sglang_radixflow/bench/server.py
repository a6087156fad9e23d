"""Start and stop real SGLang servers (tests, demo, bench): free localhost port, CPU flags, health wait, log capture.

A server is stopped by the PID of the process group we started (never by name), and its whole process tree
(scheduler, detokenizer) goes with it.
"""
from __future__ import annotations

import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from sglang_radixflow.config import PATH_VARIABLES
from sglang_radixflow.models import is_hybrid_model

# What SGLang 0.5.23 needs on a CPU-only machine (shared/notes/sglang-cpu.md): the CPU engine, torch-native
# attention, no CUDA graphs, a sleeping idle loop (a spinning one starves torch on 2 cores), small fixed pools.
CPU_FLAGS: tuple[str, ...] = (
    "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--sleep-on-idle",
    "--mem-fraction-static", "0.05",
)
# Hybrids on CPU: a bounded state pool (else sized from RAM), and SGLang's mamba radix-cache strategy:
# - no_buffer: a state only where an extend ends; SGLang requires overlap scheduling off for it;
# - extra_buffer (SGLang's GPU default): a state snapshot on the checkpoint grid inside an extend, overlap scheduling
#   on; the CPU runtime supports it for Mamba-2 and gated-delta-net hybrids (cpu/mamba2/patches.py).
HYBRID_STRATEGY_FLAGS: dict[str, tuple[str, ...]] = {
    "no_buffer": ("--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"),
    "extra_buffer": ("--mamba-radix-cache-strategy", "extra_buffer"),
}
HYBRID_STRATEGY_HELP = (
    "hybrid models' --mamba-radix-cache-strategy on CPU: no_buffer (SGLang requires overlap off), or "
    "extra_buffer (SGLang's GPU default, which runs the overlap scheduler where --overlap-schedule keeps it)"
)
HYBRID_CPU_FLAGS: tuple[str, ...] = ("--max-mamba-cache-size", "256")


def check_hybrid_strategy(strategy: str) -> None:
    """A bench's --hybrid-strategy, before any server starts. Every tiny hybrid runs both strategies on CPU too: the
    Mamba-2 SSD scan and the gated-delta-net chunk op both return the states extra_buffer snapshots."""
    if strategy not in HYBRID_STRATEGY_FLAGS:
        raise ValueError(f"--hybrid-strategy {strategy}; allowed: {', '.join(HYBRID_STRATEGY_FLAGS)}")


# SGLang's overlap scheduler, per bench (--overlap-schedule): auto turns it off on a CPU (overlap_off); on, off.
OVERLAP_CHOICES: tuple[str, ...] = ("auto", "on", "off")


def check_overlap_schedule(setting: str) -> None:
    if setting not in OVERLAP_CHOICES:
        raise ValueError(f"--overlap-schedule {setting!r}; allowed: {', '.join(OVERLAP_CHOICES)}")


def overlap_off(setting: str) -> bool:
    """Whether a bench's servers run with --disable-overlap-schedule. `auto` turns it off on a CPU: SGLang's overlap
    loop hides the host's scheduling behind device compute, and a CPU has no device to overlap with (its forward runs
    synchronously in the scheduler's thread), so the loop only processes each round's results one round late.
    No_buffer hybrids run without it anyway (SGLang requires that); `on` keeps SGLang's default."""
    return setting == "off" or (setting == "auto" and on_cpu())


def overlap_flags(setting: str) -> list[str]:
    """The server flags for a bench's setting (a store_true flag: harmless where the hybrid flags add it too)."""
    return ["--disable-overlap-schedule"] if overlap_off(setting) else []


def add_overlap_argument(parser: Any) -> None:
    parser.add_argument("--overlap-schedule", choices=OVERLAP_CHOICES, default="auto",
                        help="SGLang's overlap scheduler on every server: auto (default) turns it off on a CPU, where "
                             "the forward runs in the scheduler's thread and overlap only delays each round's results "
                             "by a round; on: SGLang's default (no_buffer hybrids still run without it); off")


def parse_server_args(text: str, owned: Sequence[str]) -> tuple[str, ...]:
    """A bench's --server-args: extra SGLang server flags (shell-quoted) for every server it starts. The flags in
    `owned` are the bench's own (budgets, cache, overlap loop, ...): refused, since each has its own option and a
    repeated flag silently wins (argparse keeps the last)."""
    try:
        args = tuple(shlex.split(text))
    except ValueError as err:
        raise ValueError(f"--server-args {text!r}: {err}") from None
    clash = sorted({a.split("=", 1)[0] for a in args} & set(owned))
    if clash:
        raise ValueError(f"--server-args {text!r}: {', '.join(clash)} set by the bench itself (its own options); "
                         f"any other SGLang server flag is allowed")
    return args


def attach_option_values(argv: Sequence[str], options: Sequence[str] = ("--server-args",)) -> list[str]:
    """argv with `--server-args --enable-mixed-chunk` written as `--server-args=--enable-mixed-chunk`: argparse takes
    a value that starts with '-' and holds no space for the next option ("expected one argument"), so a single SGLang
    flag could not be passed the way the help shows it."""
    out: list[str] = []
    pending = False
    for arg in argv:
        if pending and arg.startswith("-"):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
        pending = arg in options and not pending
    return out


def cpu_server_flags(hybrid: bool, max_total_tokens: int = 8192, mamba_strategy: str = "no_buffer") -> list[str]:
    flags = [*CPU_FLAGS, "--max-total-tokens", str(max_total_tokens)]
    if hybrid:
        if mamba_strategy not in HYBRID_STRATEGY_FLAGS:
            raise ValueError(f"mamba_strategy={mamba_strategy!r}; allowed: {', '.join(HYBRID_STRATEGY_FLAGS)}")
        flags += [*HYBRID_STRATEGY_FLAGS[mamba_strategy], *HYBRID_CPU_FLAGS]
    return flags


# HTTP ports of the servers started here. Not from the kernel's ephemeral range: bind(0) and every outgoing
# connection (health polls, clients, SGLang's own processes) take ports from there, and one took a port picked that
# way in the seconds before SGLang bound it (uvicorn then logs the bind error and hangs without exiting). Below
# SGLang's own pick for its torch.distributed port (22000-29999, `get_free_port_below_ephemeral`), so the two never
# meet either.
PORT_RANGE = (10000, 21999)
PORT_ATTEMPTS = 64
BIND_FAILED = "error while attempting to bind on address"  # uvicorn's log line when the port is taken
START_ATTEMPTS = 3  # a port taken between the pick and SGLang's bind: start again on another one
SERVER_CWD = tempfile.gettempdir()  # a package-named folder in our cwd would shadow the installed package
_handed_out: set[int] = set()  # ports this process gave to a server: never handed out twice
_port_rng = random.SystemRandom()  # independent of any seed a caller sets on the random module


def free_port() -> int:
    low, high = PORT_RANGE
    for port in _port_rng.sample(range(low, high + 1), PORT_ATTEMPTS):
        if port in _handed_out:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        _handed_out.add(port)
        return port
    raise ServerError(f"no free port among {PORT_ATTEMPTS} tried in {low}-{high}")


def on_cpu() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch comes with sglang
        return True


class _PortTaken(Exception):
    """SGLang could not bind its HTTP port (another socket took it after it was picked)."""


class ServerError(RuntimeError):
    pass


_LIVE: set[int] = set()  # process-group ids this process started and has not stopped


def live_servers() -> list[int]:
    return sorted(pgid for pgid in _LIVE if _group_alive(pgid))


def stop_servers_on_sigterm() -> None:
    """Let SIGTERM (`timeout`, a cancelled CI job, `kill`) end this program the way Ctrl-C does: as an exception
    through every `finally` / `with`, so the servers it started are stopped. Each server runs in its own session
    (so that stopping one kills its whole tree), out of reach of signals sent to our process group: without this a
    terminated bench left them running. A second SIGTERM during the cleanup is ignored. Call from the main thread."""

    def _exit(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


@dataclass
class SGLangServer:
    """One `python -m sglang.launch_server` process group. Use as a context manager or call start()/stop()."""

    model_path: str
    radix_cache: Optional[str] = "radixflow"  # None: SGLang's default cache
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Optional[Path] = None
    port: int = 0
    startup_timeout_s: float = 300.0
    cpu: Optional[bool] = None  # None: CPU flags when no GPU is visible
    mamba_strategy: str = "no_buffer"  # hybrids on CPU: no_buffer, or extra_buffer (Mamba-2 only)
    proc: Optional[subprocess.Popen] = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if not Path(self.model_path).is_dir():
            raise FileNotFoundError(f"model path {self.model_path!r} does not exist (make one: radixflow make-model)")
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(Path(self.model_path).resolve()),
               "--host", "127.0.0.1", "--port", str(self.port)]
        use_cpu = on_cpu() if self.cpu is None else self.cpu
        if use_cpu:
            cmd += cpu_server_flags(is_hybrid_model(self.model_path), mamba_strategy=self.mamba_strategy)
        if self.radix_cache:
            cmd += ["--radix-cache-backend", self.radix_cache]
        return cmd + list(self.extra_args)

    def process_env(self) -> dict[str, str]:
        """The server process's environment: ours, then `env`. Paths it is given relative to our directory are made
        absolute, since it runs in SERVER_CWD (a relative RADIXFLOW_TRACE once went to the temp folder unseen)."""
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **os.environ, **self.env}
        if self.cpu is not False and on_cpu():
            env["SGLANG_USE_CPU_ENGINE"] = "1"
        for name in PATH_VARIABLES:  # RADIXFLOW_* variables read as file paths
            if env.get(name):
                env[name] = os.path.abspath(env[name])
        return env

    def start(self) -> "SGLangServer":
        assert self.proc is None, "already started"
        chosen = not self.port  # a port we picked may be picked again; one the caller gave may not
        for attempt in range(1, START_ATTEMPTS + 1):
            if chosen:
                self.port = free_port()
            try:
                self._launch()
                return self
            except _PortTaken:
                self.stop()
                if not chosen or attempt == START_ATTEMPTS:
                    raise ServerError(f"port {self.port} is taken; log tail:\n{self.log_tail()}") from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix="sglang-server-", suffix=".log")[1])
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.process_env(), start_new_session=True,
            cwd=SERVER_CWD,
        )
        log.close()
        register_group(self.proc.pid)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"SGLang server exited with code {self.proc.returncode}; log tail:\n{self.log_tail()}")
            if BIND_FAILED in self.log_text():
                raise _PortTaken(self.port)
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=30) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise ServerError(f"SGLang server not healthy after {self.startup_timeout_s:.0f}s; log tail:\n{self.log_tail()}")

    def log_text(self) -> str:
        return Path(self.log_path).read_text(errors="replace") if self.log_path else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None:
            return
        stop_group(self.proc, timeout_s)
        self.proc = None

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- tiny HTTP client helpers (requests-free so the core package needs nothing extra) ----
    def post(self, path: str, payload: Mapping[str, Any], timeout: float = 300.0) -> Any:
        data = json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as err:
            raise ServerError(f"POST {path} -> HTTP {err.code}: {err.read().decode(errors='replace')}") from err
        return json.loads(body) if body.strip() else None

    def get(self, path: str, timeout: float = 60.0) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
            body = resp.read()
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body.decode(errors="replace")

    def generate(self, input_ids: Sequence[int], max_new_tokens: int = 8, **extra: Any) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": {
                "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True, **extra.pop("sampling", {})
            },
            **extra,
        }
        return self.post("/generate", payload)


def register_group(pgid: int) -> None:
    """A process group this process started (bench/gateway.py's too): live_servers() lists it until it is stopped."""
    _LIVE.add(pgid)


def stop_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM the process group `proc` leads (started with start_new_session), then SIGKILL it if it lingers."""
    pgid = proc.pid  # start_new_session: the group id is the leader's pid
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(pgid):
            break
    _LIVE.discard(pgid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
