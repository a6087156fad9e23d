"""Build hook: ship `sglang_radixflow.pth` at the site-packages root.

The .pth line imports the tiny `_sglang_radixflow_boot` module at interpreter start-up. It activates the CPU runtime
only when SGLANG_USE_CPU_ENGINE=1, so every SGLang process (spawned ones included) gets it without PYTHONPATH edits.
Everything else lives in setup.cfg.
"""
from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "sglang_radixflow.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(PTH_NAME, os.path.join(self.build_lib, PTH_NAME))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH_NAME)]


class EditableWheelWithPth(editable_wheel):
    """`pip install -e .` too: put the .pth at the editable wheel's root (setuptools' namespace-file step)."""

    def _install_namespaces(self, installation_dir: str, pth_prefix: str) -> None:
        super()._install_namespaces(installation_dir, pth_prefix)
        self.copy_file(PTH_NAME, os.path.join(installation_dir, PTH_NAME))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
