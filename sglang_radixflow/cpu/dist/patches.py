"""See __init__.py."""
from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any


def no_nccl_on_cpu(module: ModuleType) -> None:
    original = module.init_model_parallel_group
    # The SGLang internal relied on: the keyword this patch pins (the runtime is active on CPU only).
    assert "use_pynccl" in inspect.signature(original).parameters, "init_model_parallel_group(use_pynccl=...)"

    @functools.wraps(original)
    def init_model_parallel_group(*args: Any, **kwargs: Any) -> Any:
        kwargs["use_pynccl"] = False
        return original(*args, **kwargs)

    module.init_model_parallel_group = init_model_parallel_group
