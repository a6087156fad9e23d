"""Interpreter start-up hook of sglang-radixflow (imported by sglang_radixflow.pth).

Must stay tiny: it runs in every Python process of the environment. It does nothing unless SGLANG_USE_CPU_ENGINE=1;
then it installs the CPU runtime's import hooks (no torch or SGLang import happens here).
"""
import os

if os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1" and os.environ.get("RADIXFLOW_CPU_RUNTIME", "auto") != "off":
    try:
        from sglang_radixflow.cpu import boot as _boot

        _boot.install()
    except Exception as _exc:  # never break interpreter start-up; say why
        import sys

        sys.stderr.write(f"sglang_radixflow: CPU runtime not installed: {_exc!r}\n")
