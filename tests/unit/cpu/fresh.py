"""Run code in a fresh interpreter with SGLang's CPU engine on: the .pth start-up hook installs the CPU runtime there
exactly as in a server process (this test process installed it by hand, after SGLang modules may have loaded)."""
from __future__ import annotations

import os
import subprocess
import sys


def run_in_cpu_engine(code: str, timeout_s: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    env.pop("RADIXFLOW_CPU_RUNTIME", None)  # the runtime's off switch must not leak in from the caller
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s)


def failure_text(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-3000:] + proc.stderr[-6000:]
