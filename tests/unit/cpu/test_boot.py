"""The CPU runtime's start-up hook, in fresh interpreters (as SGLang's spawned processes see it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, sys
finder = any(type(f).__name__ == "_RadixflowCpuFinder" for f in sys.meta_path)
out = {"finder": finder}
if finder:
    import sgl_kernel
    from sglang_radixflow.cpu import boot
    out["status"] = boot.status()
    out["standin"] = bool(getattr(sgl_kernel, "__radixflow_cpu_standin__", False))
    from sgl_kernel import copy_all_layer_kv_cache_cpu
    out["kv_op_module"] = copy_all_layer_kv_cache_cpu.__module__
    try:
        from sgl_kernel import no_such_op  # noqa: F401
    except ImportError as exc:
        out["unknown"] = str(exc)
    from sgl_kernel import verify_tree_greedy_cpu
    try:
        verify_tree_greedy_cpu()
    except NotImplementedError as exc:
        out["unsupported"] = str(exc)
print(json.dumps(out))
"""


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("SGLANG_USE_CPU_ENGINE", "RADIXFLOW_CPU_RUNTIME")}
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                          cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_inactive_without_the_cpu_engine_flag() -> None:
    """A GPU install (no SGLANG_USE_CPU_ENGINE) never sees the runtime."""
    assert _probe() == {"finder": False}


def test_opt_out_variable_disables_it() -> None:
    assert _probe(SGLANG_USE_CPU_ENGINE="1", RADIXFLOW_CPU_RUNTIME="off") == {"finder": False}


def test_standin_replaces_a_cuda_only_sgl_kernel() -> None:
    out = _probe(SGLANG_USE_CPU_ENGINE="1")
    assert out["finder"] and out["standin"]
    assert out["status"]["standin_active"] is True
    assert "real sgl_kernel failed to import" in out["status"]["reason"]
    assert out["kv_op_module"] == "sglang_radixflow.cpu.kv.ops"
    assert "no_such_op" in out["unknown"]
    assert "speculative decoding is not supported on CPU" in out["unsupported"]
