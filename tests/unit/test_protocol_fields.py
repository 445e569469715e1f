"""The shared field definitions: strict types, bounds, stop strings, top_p's "off", and
how a validation failure becomes one RequestError naming the field."""

from __future__ import annotations

import pytest

from mistral_serving.errors import RequestError
from mistral_serving.protocols.fields import (
    MAX_STOP_STRINGS,
    MaxTokens,
    Stop,
    StrictModel,
    Temperature,
    top_p_or_off,
    validate,
)


class Probe(StrictModel):
    max_tokens: MaxTokens = 1
    temperature: Temperature = 1.0
    stop: Stop = None
    flag: bool = False


def refusal(body: dict) -> RequestError:
    with pytest.raises(RequestError) as err:
        validate(Probe, body)
    assert err.value.status == 400
    return err.value


@pytest.mark.parametrize(
    ("top_p", "expected"), [(0.0, 1.0), (1.0, 1.0), (0.25, 0.25), (1e-9, 1e-9), (0.999, 0.999)]
)
def test_top_p_zero_and_one_are_off(top_p: float, expected: float) -> None:
    assert top_p_or_off(top_p) == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": "2"}, "max_tokens"),  # "2" is not an int
        ({"max_tokens": 2.0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),  # true is not 1
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": (1 << 20) + 1}, "max_tokens"),
        ({"temperature": True}, "temperature"),  # true is not a number
        ({"temperature": "1"}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"flag": 1}, "flag"),
        ({"flag": "true"}, "flag"),
        ({"stop": [""]}, "stop.0"),
        ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
        ({"stop": {"a": 1}}, "stop"),
        ({"other": 1}, "other"),
    ],
)
def test_strict_fields_refuse_by_name(body: dict, param: str) -> None:
    err = refusal(body)
    assert err.param == param
    assert err.message.startswith(f"{param}: ")


def test_ints_are_numbers_and_one_stop_string_is_a_list() -> None:
    probe = validate(Probe, {"temperature": 1, "stop": "END", "max_tokens": 1 << 20})
    assert isinstance(probe, Probe)
    assert (probe.temperature, probe.stop, probe.max_tokens) == (1, ["END"], 1 << 20)


def test_unknown_field_reads_unknown_field() -> None:
    assert refusal({"temprature": 0.5}).message == "temprature: unknown field"


def test_many_problems_are_bounded() -> None:
    err = refusal({f"x{i}": i for i in range(20)})
    assert len(err.message.split("; ")) == 8  # the first eight
    assert err.param == "x0"
    long = refusal({"k" * 1000: 1})
    assert len(long.message) <= 300
