"""Define `torch.ops.<namespace>.<name>` ops that SGLang reads at import time, from plain torch functions."""
from __future__ import annotations

from typing import Callable

import torch

_LIBRARIES: list[torch.library.Library] = []  # registrations live as long as their Library object


def register_missing(namespace: str, ops: dict[str, tuple[str, Callable[..., object]]]) -> list[str]:
    """Define each {name: (schema, fn)} missing from torch.ops.<namespace> (CompositeImplicitAutograd: plain torch
    code, no autograd formula needed); idempotent. Returns the names registered now."""
    missing = [name for name in ops if not hasattr(getattr(torch.ops, namespace), name)]
    if not missing:
        return []
    lib = torch.library.Library(namespace, "FRAGMENT")
    for name in missing:
        schema, fn = ops[name]
        lib.define(schema)
        lib.impl(name, fn, "CompositeImplicitAutograd")
    _LIBRARIES.append(lib)
    return missing
