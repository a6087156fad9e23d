"""`--radix-eviction-policy rr` registration against SGLang's real parser, strategy table and resolution hooks."""
from __future__ import annotations

import pytest
from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
from sglang.srt.mem_cache.utils import get_eviction_strategy
from sglang.srt.server_args import prepare_server_args

from sglang_radixflow import plugin
from sglang_radixflow.evict.strategy import POLICY_NAME, RoundRobinStrategy


def test_rr_is_a_cli_choice_and_a_strategy_idempotently() -> None:
    assert plugin.RR_POLICY == POLICY_NAME
    plugin.register()
    plugin.register()
    assert RADIX_EVICTION_POLICY_CHOICES.count("rr") == 1
    assert isinstance(get_eviction_strategy("rr"), RoundRobinStrategy)
    for other in ("lru", "lfu", "slru", "priority", "tlru"):  # SGLang's own policies are untouched
        assert other in RADIX_EVICTION_POLICY_CHOICES


def test_rr_without_the_radixflow_backend_is_refused_naming_both_flags() -> None:
    plugin.register()
    args = prepare_server_args(["--model-path", "dummy", "--radix-eviction-policy", "rr"])
    with pytest.raises(ValueError, match=r"--radix-eviction-policy rr \(RR-Evict\) requires --radix-cache-backend "
                                         r"radixflow, got --radix-cache-backend=None; with another backend use one "
                                         r"of: lru, lfu"):
        plugin._check_rr_backend(args, lambda s: None)
    ok = prepare_server_args(["--model-path", "dummy", "--radix-eviction-policy", "rr",
                              "--radix-cache-backend", "radixflow"])
    plugin._check_rr_backend(ok, lambda s: None)
    lru = prepare_server_args(["--model-path", "dummy", "--radix-cache-backend", "radixflow"])
    plugin._check_rr_backend(lru, lambda s: None)


def test_rr_with_hicache_is_refused() -> None:
    plugin.register()
    args = prepare_server_args(["--model-path", "dummy", "--radix-eviction-policy", "rr",
                                "--radix-cache-backend", "radixflow", "--enable-hierarchical-cache"])
    with pytest.raises(ValueError, match="does not support --enable-hierarchical-cache"):
        plugin._check_rr_backend(args, lambda s: None)


def test_rr_policy_config_is_checked_when_the_server_args_resolve() -> None:
    """A bad --radix-eviction-policy-config ends launch_server before any scheduler starts, naming the key."""
    plugin.register()
    base = ["--model-path", "dummy", "--radix-eviction-policy", "rr", "--radix-cache-backend", "radixflow"]
    bad = prepare_server_args([*base, "--radix-eviction-policy-config", '{"nonsense": 1}'])
    with pytest.raises(ValueError, match="unknown key\\(s\\) 'nonsense' for --radix-eviction-policy rr; allowed keys: "
                                         "block: .*; order: share \\| cursor"):
        plugin._check_rr_backend(bad, lambda s: None)
    good = prepare_server_args([*base, "--radix-eviction-policy-config", '{"block": 32, "order": "cursor"}'])
    plugin._check_rr_backend(good, lambda s: None)
    assert get_eviction_strategy("rr", {"block": 32, "order": "cursor"}).config == {"block": 32, "order": "cursor"}
