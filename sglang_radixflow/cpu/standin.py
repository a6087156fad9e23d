"""The `sgl_kernel` stand-in: a package whose names resolve lazily to the families' torch implementations.

Only names some family declares exist; any other `from sgl_kernel import X` fails with Python's usual ImportError
naming X, so an unsupported code path is reported where it starts, not deep inside a forward.
"""
from __future__ import annotations

import sys
import types
from typing import Callable

from sglang_radixflow.cpu import registry

STANDIN_MARKER = "__radixflow_cpu_standin__"


def _unsupported(name: str, feature: str) -> Callable[..., object]:
    def op(*_args: object, **_kwargs: object) -> object:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by the sglang-radixflow CPU runtime ({feature} is not supported on CPU)"
        )

    op.__name__ = name
    return op


def _lazy_getattr(
    module_name: str, table: dict[str, str], unsupported: dict[str, str] | None = None
) -> Callable[[str], object]:
    unsupported = unsupported or {}

    def __getattr__(name: str) -> object:
        ref = table.get(name)
        if ref is None and name in unsupported:
            return _unsupported(name, unsupported[name])
        if ref is None:
            raise AttributeError(
                f"module {module_name!r} (sglang-radixflow CPU stand-in) has no attribute {name!r}; "
                f"provided: {sorted(table)}"
            )
        value = registry.resolve(ref)
        setattr(sys.modules[module_name], name, value)
        return value

    return __getattr__


def _submodule(parent: types.ModuleType, sub: str, table: dict[str, str]) -> types.ModuleType:
    full = f"{parent.__name__}.{sub}"
    mod = types.ModuleType(full, f"sglang-radixflow CPU stand-in for {full}")
    mod.__path__ = []  # type: ignore[attr-defined]
    mod.__getattr__ = _lazy_getattr(full, table)
    setattr(mod, STANDIN_MARKER, True)
    sys.modules[full] = mod
    setattr(parent, sub, mod)
    return mod


def become_standin(module: types.ModuleType) -> None:
    """Turn a (failed) real `sgl_kernel` module object into the stand-in package, in place."""
    keep = {"__name__", "__spec__", "__loader__"}
    for key in [k for k in vars(module) if k not in keep]:
        delattr(module, key)
    module.__doc__ = "sglang-radixflow CPU stand-in for sgl_kernel (torch implementations)"
    module.__path__ = []  # type: ignore[attr-defined]
    module.__file__ = __file__
    setattr(module, STANDIN_MARKER, True)
    symbols = registry.sgl_kernel_symbols()
    module.__getattr__ = _lazy_getattr(  # type: ignore[attr-defined]
        module.__name__, symbols.get("", {}), registry.unsupported_symbols()
    )
    for sub, table in symbols.items():
        if sub:
            _submodule(module, sub, table)


def fill_missing(module: types.ModuleType) -> None:
    """Add the stand-in's names to a real `sgl_kernel` that imported but has no CPU ops."""
    for sub, table in registry.sgl_kernel_symbols().items():
        target = module
        if sub:
            existing = sys.modules.get(f"{module.__name__}.{sub}")
            target = existing if existing is not None else _submodule(module, sub, {})
        for name, ref in table.items():
            if not hasattr(target, name):
                setattr(target, name, registry.resolve(ref))
