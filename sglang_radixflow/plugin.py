"""The only place that touches SGLang's extension doors (entry point group `sglang.srt.plugins`).

`register()` runs in every SGLang process (main, scheduler, detokenizer, DP controller) and may run several times in
one; it is idempotent and imports nothing heavy. SGLang only *logs* plugin exceptions, so when our set-up fails we
still register the backend, with a factory that re-raises the real cause: a server started with
`--radix-cache-backend radixflow` then dies with that cause instead of a later "not registered".
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext

logger = logging.getLogger("sglang_radixflow")

BACKEND_NAME = "radixflow"
RR_POLICY = "rr"  # == sglang_radixflow.evict.strategy.POLICY_NAME (asserted in tests)
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_STREAMER = "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"
_TOKENIZER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


class _PluginState:
    hooks_registered = False
    policy_check_registered = False
    setup_error: Optional[BaseException] = None


def register() -> None:
    """Entry point: register the radix-cache backend and the scheduler hooks (idempotent)."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    try:
        _register_hooks()
        register_eviction_policy()
    except Exception as exc:  # keep the cause for the factory; SGLang would only log it
        _PluginState.setup_error = exc
        logger.exception("sglang-radixflow: plugin set-up failed; the radixflow backend will refuse to start")
    existing = get_radix_cache_factory(BACKEND_NAME)
    if existing is None:
        register_radix_cache_backend(BACKEND_NAME, create_radixflow_cache)
    elif existing is not create_radixflow_cache:
        raise RuntimeError(f"radix-cache backend {BACKEND_NAME!r} is already registered by {existing!r}")


def create_radixflow_cache(ctx: "TreeCacheBuildContext") -> "BasePrefixCache":
    """SGLang radix-cache factory for `--radix-cache-backend radixflow` (runs in the scheduler process)."""
    if _PluginState.setup_error is not None:
        raise RuntimeError(
            f"sglang-radixflow plugin failed to set up: {_PluginState.setup_error!r}"
        ) from _PluginState.setup_error
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    from sglang_radixflow.cache.tree import RadixFlowCache
    from sglang_radixflow.config import load_config

    config = load_config()  # ConfigError names the variable and the allowed values
    cache_class = RadixFlowCache
    if str(ctx.params.eviction_policy).lower() == RR_POLICY:
        from sglang_radixflow.evict.round_robin import RadixFlowRRCache

        cache_class = RadixFlowRRCache
    cache = create_unified_radix_cache(ctx, cache_class=cache_class)
    assert isinstance(cache, RadixFlowCache)
    cache.configure(config, tp_rank=ctx.tp_rank)
    logger.info(
        "sglang-radixflow: cache ready (arm=%s, traversal=%s, admission=%s, producer_rows=%d, hybrid_ssm=%s)",
        config.arm, config.traversal, config.admission, config.producer_rows, ctx.is_hybrid_ssm,
    )
    return cache


def register_eviction_policy() -> None:
    """`--radix-eviction-policy rr` (idempotent): the CLI choice (SGLang's public add_radix_eviction_policy_choices,
    read when the parser is built, after plugins load), the strategy name the tree core resolves (SGLang's private
    factory table; asserted), and a start-up check that `rr` comes with the radixflow backend."""
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES, add_radix_eviction_policy_choices
    from sglang.srt.mem_cache import utils as mem_utils

    from sglang_radixflow.evict.strategy import RoundRobinStrategy

    if RR_POLICY not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices([RR_POLICY])
    table = getattr(mem_utils, "_EVICTION_POLICY_FACTORIES", None)
    assert isinstance(table, dict) and "lru" in table, "SGLang moved its eviction-policy table"
    assert table.get(RR_POLICY, RoundRobinStrategy) is RoundRobinStrategy, f"another plugin owns policy {RR_POLICY!r}"
    table[RR_POLICY] = RoundRobinStrategy
    if not _PluginState.policy_check_registered:
        from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

        register_resolution_hook("handle_cache_compatibility")(_check_rr_backend)
        _PluginState.policy_check_registered = True


def _check_rr_backend(server_args: Any, previous: Any) -> None:
    previous(server_args)
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    if str(cfg.radix_eviction_policy).lower() != RR_POLICY:
        return
    if cfg.radix_cache_backend != BACKEND_NAME:
        raise ValueError(
            f"--radix-eviction-policy {RR_POLICY} (RR-Evict) requires --radix-cache-backend {BACKEND_NAME}, "
            f"got --radix-cache-backend={cfg.radix_cache_backend!r}; with another backend use one of: "
            + ", ".join(p for p in _sglang_policies() if p != RR_POLICY)
        )
    if cfg.enable_hierarchical_cache or cfg.enable_session_radix_cache:
        raise ValueError(
            f"--radix-eviction-policy {RR_POLICY} does not support --enable-hierarchical-cache or "
            "--enable-session-radix-cache; drop those flags or choose another policy"
        )
    from sglang_radixflow.evict.strategy import check_policy_config

    # in the launching process, before any scheduler starts: a bad key ends `launch_server` with this message
    check_policy_config(cfg.radix_eviction_policy_config, int(cfg.page_size or 1))


def _sglang_policies() -> list[str]:
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES

    return list(RADIX_EVICTION_POLICY_CHOICES)


def _register_hooks() -> None:
    if _PluginState.hooks_registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{_SCHEDULER}.get_next_batch_to_run", _before_next_batch, HookType.BEFORE)
    HookRegistry.register(f"{_SCHEDULER}.get_prefill_adder_class", _prefill_adder_class, HookType.AROUND)
    HookRegistry.register(f"{_SCHEDULER}._get_new_batch_prefill_raw", _around_prefill_pass, HookType.AROUND)
    HookRegistry.register(f"{_SCHEDULER}.run_batch", _around_run_batch, HookType.AROUND)
    HookRegistry.register(f"{_STREAMER}.is_request_level_customized_info_key", _request_level_key, HookType.AROUND)
    HookRegistry.register(f"{_TOKENIZER}._validate_one_request", _around_validate_request, HookType.AROUND)
    HookRegistry.register(f"{_TOKENIZER}.abort_request", _around_client_abort, HookType.AROUND)
    _PluginState.hooks_registered = True


def _before_next_batch(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """Start of a scheduling step: tie the cache to this scheduler (first time only)."""
    clock = getattr(scheduler.tree_cache, "rf_clock", None)
    if clock is not None and not clock.bound:
        from sglang_radixflow.schedule.binding import bind_scheduler

        bind_scheduler(scheduler)
    return None


def _prefill_adder_class(orig: Any, scheduler: Any) -> Any:
    sched = getattr(scheduler.tree_cache, "rf_sched", None)
    if sched is None or sched.traversal == "native":
        return orig(scheduler)
    from sglang_radixflow.schedule.adder import RadixFlowPrefillAdder

    native = orig(scheduler)
    assert issubclass(RadixFlowPrefillAdder, native), f"another plugin replaced the prefill adder: {native}"
    return RadixFlowPrefillAdder


def _around_prefill_pass(orig: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    sched = getattr(scheduler.tree_cache, "rf_sched", None)
    if sched is None:
        return orig(scheduler, *args, **kwargs)
    from sglang_radixflow.schedule.binding import run_prefill_pass

    return run_prefill_pass(orig, scheduler, sched, *args, **kwargs)


def _around_run_batch(orig: Any, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    if getattr(scheduler.tree_cache, "rf_sched", None) is None:
        return orig(scheduler, batch, *args, **kwargs)
    from sglang_radixflow.observe.rounds import run_batch

    return run_batch(orig, scheduler, batch, *args, **kwargs)


def _guarded(tokenizer_manager: Any) -> bool:
    """Whether this tokenizer manager serves the radixflow backend (decided once, then kept on it)."""
    on = getattr(tokenizer_manager, "_radixflow_guard", None)
    if on is None:
        backend = getattr(tokenizer_manager.server_args, "radix_cache_backend", None)
        on = tokenizer_manager._radixflow_guard = backend == BACKEND_NAME
    return on


def _around_validate_request(orig: Any, tokenizer_manager: Any, obj: Any, input_ids: Any) -> Any:
    if _guarded(tokenizer_manager):
        from sglang_radixflow.guard import check_request

        check_request(obj, input_ids, tokenizer_manager.model_config.vocab_size)
    return orig(tokenizer_manager, obj, input_ids)


def _around_client_abort(orig: Any, tokenizer_manager: Any, rid: str = "", abort_all: bool = False) -> Any:
    """With several tokenizer workers SGLang forwards an abort for a rid it does not know: one that could reach the
    prefix requests (whose rids a client cannot send, see guard.py) is dropped, as SGLang drops an empty rid."""
    if _guarded(tokenizer_manager) and not abort_all and rid:
        from sglang_radixflow.guard import reaches_prefix_requests

        if reaches_prefix_requests(str(rid)):
            logger.warning("sglang-radixflow: ignored abort_request(rid=%r): it would reach prefix requests", rid)
            return None
    return orig(tokenizer_manager, rid, abort_all)


def _request_level_key(orig: Any, streamer: Any, key: str) -> bool:
    from sglang_radixflow.observe.meta import META_KEYS

    return key in META_KEYS or orig(streamer, key)
