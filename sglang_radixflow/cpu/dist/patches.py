"""See __init__.py."""
from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any


def no_nccl_on_cpu(module: ModuleType) -> None:
    original = module.init_model_parallel_group
    # SGLang internals relied on: the keyword this patch pins, and the module's own CPU flag.
    assert "use_pynccl" in inspect.signature(original).parameters, "init_model_parallel_group(use_pynccl=...)"
    assert isinstance(module._is_cpu, bool)

    @functools.wraps(original)
    def init_model_parallel_group(*args: Any, **kwargs: Any) -> Any:
        kwargs["use_pynccl"] = False
        return original(*args, **kwargs)

    module.init_model_parallel_group = init_model_parallel_group
