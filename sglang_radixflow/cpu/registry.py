"""What each op family provides, gathered from the families' light `__init__` tables (strings, resolved lazily)."""
from __future__ import annotations

import importlib
from typing import Callable

# Families in resolution order; each package's __init__ defines SGL_KERNEL and POST_IMPORT (see cpu/kv/__init__.py).
FAMILIES: tuple[str, ...] = (
    "sglang_radixflow.cpu.kv",
    "sglang_radixflow.cpu.mamba2",
    "sglang_radixflow.cpu.gdn",
    "sglang_radixflow.cpu.qwen3_5",
    "sglang_radixflow.cpu.attention",
    "sglang_radixflow.cpu.dist",
)


def sgl_kernel_symbols() -> dict[str, dict[str, str]]:
    """{submodule ('' = top level, 'mamba' = sgl_kernel.mamba): {name: 'module:attr'}}."""
    merged: dict[str, dict[str, str]] = {}
    for family in FAMILIES:
        table: dict[str, dict[str, str]] = importlib.import_module(family).SGL_KERNEL
        for sub, names in table.items():
            clash = set(merged.get(sub, {})) & set(names)
            assert not clash, f"{family} redefines sgl_kernel symbols {sorted(clash)}"
            merged.setdefault(sub, {}).update(names)
    return merged


def unsupported_symbols() -> dict[str, str]:
    """{top-level sgl_kernel name: feature} for names exported only so that SGLang's module imports succeed."""
    merged: dict[str, str] = {}
    for family in FAMILIES:
        merged.update(getattr(importlib.import_module(family), "UNSUPPORTED", {}))
    return merged


def post_import_patches() -> dict[str, list[str]]:
    """{SGLang module name: ['module:function', ...]} run right after that module is first imported."""
    return _hooks("POST_IMPORT")


def pre_import_hooks() -> dict[str, list[str]]:
    """{SGLang module name: ['module:function', ...]} run just before that module's body executes (for ops its body
    reads from torch.ops at import time). Families without a PRE_IMPORT table have none."""
    return _hooks("PRE_IMPORT")


def _hooks(table_name: str) -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    for family in FAMILIES:
        table: dict[str, str | list[str]] = getattr(importlib.import_module(family), table_name, {})
        for target, patch in table.items():
            merged.setdefault(target, []).extend([patch] if isinstance(patch, str) else patch)
    return merged


def resolve(ref: str) -> Callable:
    import pkgutil

    return pkgutil.resolve_name(ref)
