"""RADIXFLOW_* parsing: presets, overrides, and errors that name the variable and the allowed values."""
from __future__ import annotations

import pytest

from sglang_radixflow.config import ARMS, ConfigError, RadixFlowConfig, load_config


def test_default_is_the_radixflow_arm() -> None:
    config = load_config({})
    assert (config.arm, config.traversal, config.admission, config.hold_ms) == ("radixflow", "skip", "flex", 5.0)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_every_arm_preset_loads(arm: str) -> None:
    assert load_config({"RADIXFLOW_ARM": arm}) == ARMS[arm]


def test_variables_override_the_preset() -> None:
    config = load_config({"RADIXFLOW_ARM": "prefix-stop", "RADIXFLOW_HOLD_MS": "2.5", "RADIXFLOW_FRAGMENTATION": "on"})
    assert (config.traversal, config.hold_ms, config.fragmentation) == ("stop", 2.5, True)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RADIXFLOW_ARM": "fast"}, "RADIXFLOW_ARM='fast' is invalid; allowed: sglang, prefix-stop"),
        ({"RADIXFLOW_TRAVERSAL": "x"}, "RADIXFLOW_TRAVERSAL='x' is invalid; allowed: skip, stop, native"),
        ({"RADIXFLOW_HOLD_MS": "-1"}, "RADIXFLOW_HOLD_MS='-1' is invalid; allowed: a number >= 0.0"),
        ({"RADIXFLOW_HOLD_MS": "soon"}, "RADIXFLOW_HOLD_MS='soon' is invalid"),
        ({"RADIXFLOW_MAX_DEFER_ROUNDS": "2.5"}, "RADIXFLOW_MAX_DEFER_ROUNDS='2.5' is invalid; allowed: an integer >= 0"),
        ({"RADIXFLOW_FRAGMENTATION": "maybe"}, "RADIXFLOW_FRAGMENTATION='maybe' is invalid; allowed: 1/0"),
        ({"RADIXFLOW_MIN_GAIN_TOKENS": "0"}, "RADIXFLOW_MIN_GAIN_TOKENS='0' is invalid; allowed: an integer >= 1"),
        ({"RADIXFLOW_TRAVERSE": "skip"}, "unknown variable(s) RADIXFLOW_TRAVERSE; known: RADIXFLOW_ARM"),
    ],
)
def test_invalid_values_name_the_variable_and_what_is_allowed(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert message in str(info.value)


def test_a_config_built_in_code_refuses_a_min_gain_below_one() -> None:
    # adoption reads the token at hit + min_gain - 1: with a gain of 0 and no hit, index -1 (the last token)
    with pytest.raises(ConfigError, match="min_gain_tokens=0 is invalid; allowed: an int >= 1"):
        RadixFlowConfig(min_gain_tokens=0)
