"""Shared test set-up: the package's tests run on CPU with real SGLang 0.5.23 classes."""
from __future__ import annotations

import os

# Real SGLang classes are imported in-process. On a machine without a GPU they need SGLang's CPU engine and our CPU
# runtime, exactly as a server process gets them from the .pth start-up hook (which ran before this file could set
# the variable, hence the explicit install).
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
if os.environ["SGLANG_USE_CPU_ENGINE"] == "1":
    from sglang_radixflow.cpu import boot

    boot.install()
