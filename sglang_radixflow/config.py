"""RADIXFLOW_* environment variables -> one validated, frozen config. Arm presets live here.

Plugins get no CLI passthrough in SGLang, so configuration is environment-based; spawned SGLang processes inherit it,
so every process and every tensor-parallel rank reads the same values. Any RADIXFLOW_* variable that is unknown or
has an invalid value raises ConfigError naming the variable and what is allowed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional

PREFIX = "RADIXFLOW_"

TRAVERSALS = ("skip", "stop", "native")  # skip: RadixFlow; stop: prefix-stop (vLLM); native: SGLang unchanged
ADMISSIONS = ("native", "flex", "timer")  # flex: hold with early release; timer: fixed hold, no early release


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class RadixFlowConfig:
    arm: str = "radixflow"
    traversal: str = "skip"
    admission: str = "flex"
    hold_ms: float = 5.0
    fragmentation: bool = False
    max_defer_rounds: int = 8  # a Blocked request runs from h after this many deferrals
    # A consumer waits a round (and a producer publishes) only for at least this many tokens past h: fewer cost less
    # to compute than a round's wait. 64 is also extra_buffer's snapshot grid, where no smaller gain can exist.
    min_gain_tokens: int = 64
    promise_max_age_rounds: int = 64
    producer_slot_wait: bool = False  # hybrid no_buffer: a would-be producer waits for SGLang's one chunk slot
    prefix_requests: bool = True  # hybrid no_buffer: with the chunk slot taken, publish b through a prefix request
    # Rows of a pass that Ready non-producers leave to producers behind them (skip traversal only; 0: the paper's FCFS
    # scan). Fills the token-bound producer rounds that FCFS alternates with row-bound consumer rounds.
    producer_rows: int = 2
    # Skip traversal: a request the rest of the pass's token budget would cut into a chunk is offered again after the
    # scan looked S requests further, so that whole requests behind it (consumers, short prompts) take their tokens
    # first and the cut request gets what is left, in the same pass (SGLang's chunk otherwise ends the scan).
    chunk_last: bool = True
    trace_path: Optional[str] = None
    cpu_runtime: str = "auto"  # read by the start-up hook; listed so that it validates
    rr_block_tokens: Optional[int] = None  # RR-Evict tail unit on full-attention paths; None: 16 tokens in whole pages
    rr_order: str = "share"  # RR-Evict: next idle trajectory = largest retained share | plain cursor (ablation)

    def __post_init__(self) -> None:
        # from_env names the variable; this catches a config built in code (adoption reads token need - 1 >= 0)
        if self.min_gain_tokens < 1:
            raise ConfigError(f"min_gain_tokens={self.min_gain_tokens!r} is invalid; allowed: an int >= 1")


ARMS: dict[str, RadixFlowConfig] = {
    "sglang": RadixFlowConfig(arm="sglang", traversal="native", admission="native"),
    "prefix-stop": RadixFlowConfig(arm="prefix-stop", traversal="stop", admission="native"),
    "prefix-stop+flex": RadixFlowConfig(arm="prefix-stop+flex", traversal="stop", admission="flex"),
    "radixflow": RadixFlowConfig(arm="radixflow", traversal="skip", admission="flex"),
    "radixflow+frag": RadixFlowConfig(arm="radixflow+frag", traversal="skip", admission="flex", fragmentation=True),
    "timer5": RadixFlowConfig(arm="timer5", traversal="stop", admission="timer", hold_ms=5.0),
    "timer10": RadixFlowConfig(arm="timer10", traversal="stop", admission="timer", hold_ms=10.0),
}


def _choice(allowed: tuple[str, ...]) -> Callable[[str, str], object]:
    def parse(name: str, raw: str) -> object:
        if raw not in allowed:
            raise ConfigError(f"{name}={raw!r} is invalid; allowed: {', '.join(allowed)}")
        return raw

    return parse


def _bool(name: str, raw: str) -> object:
    table = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}
    if raw.lower() not in table:
        raise ConfigError(f"{name}={raw!r} is invalid; allowed: 1/0, true/false, on/off")
    return table[raw.lower()]


def _number(kind: type, minimum: float) -> Callable[[str, str], object]:
    allowed = f"{'an integer' if kind is int else 'a number'} >= {minimum}"

    def parse(name: str, raw: str) -> object:
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is invalid; allowed: {allowed}") from None
        if value < minimum or value != value:
            raise ConfigError(f"{name}={raw!r} is invalid; allowed: {allowed}")
        return value

    return parse


def _path(name: str, raw: str) -> object:
    if not raw.strip():
        raise ConfigError(f"{name} is empty; allowed: a file path")
    return raw


# variable suffix -> (field, parser); RADIXFLOW_ARM is applied first, the others override the preset.
_FIELDS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "TRAVERSAL": ("traversal", _choice(TRAVERSALS)),
    "ADMISSION": ("admission", _choice(ADMISSIONS)),
    "HOLD_MS": ("hold_ms", _number(float, 0.0)),
    "FRAGMENTATION": ("fragmentation", _bool),
    "MAX_DEFER_ROUNDS": ("max_defer_rounds", _number(int, 0)),
    "MIN_GAIN_TOKENS": ("min_gain_tokens", _number(int, 1)),
    "PROMISE_MAX_AGE_ROUNDS": ("promise_max_age_rounds", _number(int, 1)),
    "PRODUCER_SLOT_WAIT": ("producer_slot_wait", _bool),
    "PREFIX_REQUESTS": ("prefix_requests", _bool),
    "PRODUCER_ROWS": ("producer_rows", _number(int, 0)),
    "CHUNK_LAST": ("chunk_last", _bool),
    "TRACE": ("trace_path", _path),
    "CPU_RUNTIME": ("cpu_runtime", _choice(("auto", "off"))),
    "RR_BLOCK": ("rr_block_tokens", _number(int, 1)),
    "RR_ORDER": ("rr_order", _choice(("share", "cursor"))),
}
KNOWN_VARIABLES: tuple[str, ...] = (PREFIX + "ARM", *(PREFIX + k for k in _FIELDS))
PATH_VARIABLES: tuple[str, ...] = tuple(PREFIX + k for k, (_, parse) in _FIELDS.items() if parse is _path)


def load_config(environ: Optional[Mapping[str, str]] = None) -> RadixFlowConfig:
    env = os.environ if environ is None else environ
    ours = {k: v for k, v in env.items() if k.startswith(PREFIX)}
    unknown = sorted(set(ours) - set(KNOWN_VARIABLES))
    if unknown:
        raise ConfigError(f"unknown variable(s) {', '.join(unknown)}; known: {', '.join(KNOWN_VARIABLES)}")
    arm = ours.get(PREFIX + "ARM", "radixflow")
    if arm not in ARMS:
        raise ConfigError(f"{PREFIX}ARM={arm!r} is invalid; allowed: {', '.join(ARMS)}")
    config = ARMS[arm]
    for suffix, (field, parse) in _FIELDS.items():
        name = PREFIX + suffix
        if name in ours:
            config = replace(config, **{field: parse(name, ours[name])})
    return config
