"""Plugin registration against SGLang's real registries."""
from __future__ import annotations

from sglang.srt.mem_cache import registry

from sglang_radixflow import plugin


def test_register_is_idempotent_and_registers_the_backend() -> None:
    plugin.register()
    plugin.register()  # SGLang loads plugins in several places per process
    assert registry.get_radix_cache_factory("radixflow") is plugin.create_radixflow_cache
    assert "radixflow" in registry.registered_radix_cache_backends()


def test_entry_point_is_installed() -> None:
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "radixflow"]
    assert ep.load() is plugin.register


def test_setup_failure_surfaces_in_the_factory(monkeypatch) -> None:  # noqa: ANN001
    """SGLang only logs plugin exceptions; the factory must re-raise the real cause at cache creation."""
    import pytest

    cause = ImportError("hook target moved")
    monkeypatch.setattr(plugin._PluginState, "setup_error", cause)
    with pytest.raises(RuntimeError, match="hook target moved") as info:
        plugin.create_radixflow_cache(ctx=None)  # type: ignore[arg-type]
    assert info.value.__cause__ is cause
